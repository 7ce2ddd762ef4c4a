"""``impl="chain"``: all N draft steps of a small batch in one persistent launch (Gumbel-max).

``P`` programs, all on the GPU at once (2 to 4 per SM, by batch size: :data:`GPU_LAYOUTS`), run
the whole chain. Program ``p`` owns the vocabulary tiles ``p, p + P, p + 2P, ...`` of ``BLOCK_V``
tokens. At every step it computes the bias of its tiles on tensor cores (``codes @ W2_tile^T``,
fp32 accumulation rounded once to the weight dtype, as ``impl="fused"``), adds the base logits and
writes the cache. It ranks its tokens by approximate Gumbel keys (:mod:`dspark_markov.ops.filter`), keeping
per row the three best over all its tiles, and computes two exact keys per row and step (the first
two, from their logits read back from the cache: the exact winner is one of them unless the third
is within the filter's slack of the first). Where that cannot be sure (a near-tie of three, a NaN,
an infinite or zero best) it recomputes its tiles with exact keys. The result, packed with its
index into one int64 word ordered by (key, then lower index; every NaN above ``+inf``, ``-0.0``
equal to ``+0.0``), is merged into the step's word with ``atomic_max``: the merged word is the
``torch.argmax`` of the whole row. A grid-wide barrier (one arrival counter per step in global
memory) makes the winner known to every program, which gathers ``W1[token]`` and goes on to the
next step. The last program to finish writes ``draft_tokens`` and resets the words and counters
for the next call, so a call is one launch and replays in a CUDA graph.

Where W2 lives: it is streamed at every step with an L2 ``evict_last`` hint (base logits and the
cache use ``evict_first``) and in alternating directions (forward at even steps, backward at odd
ones), so that the tiles read last at one step, still in the 60 MB L2, are the first read at the
next. Triton gives no shared memory that outlives a loop iteration, so L2 (and registers) is what
a Triton kernel can keep W2 in; register-resident tiles were measured on the H200 and cost more
occupancy than they saved (one program per SM with two resident tiles: 234 us at 1 row against 151
with 3 programs per SM and none). Measured (H200, 1 row): ~37 us for a one-step call, ~24 us for
each later step, 134 us for five: far from the ~10 us per step that a kernel holding W2 in shared
memory would need.

Waits are bounded: a program that has spun ``SPIN_LIMIT`` times at a barrier (a co-resident program
never arrived: more programs than fit on the GPU at once, or a fault) stops waiting, sets
``status`` and carries on, so the launch always ends; the tokens of such a call are in ``[0, V)``
but meaningless, and :meth:`ChainBackend.check` raises :class:`~dspark_markov.DeviceStatusError`
(called by an eager ``MarkovSampler.sample``, ``MarkovSampler.check`` and ``DSparkStep.check``:
the device-status protocol of :mod:`dspark_markov.registry`). Triton's interpreter runs programs one
after another, so there the chain runs with one program (``P = 1``: no waits).

Reduced vocabulary (``head.d2t``): the tiles run over the draft vocabulary; the cache columns, the
keys' ids and the packed words' indices are target ids, and each program also writes ``-inf`` at its
share of the unmapped target ids of the step's live rows (``R N (V_t - V) c`` bytes).

Bytes per call: ``V * R_k * w`` of W2 per step (from HBM at the first, partly from L2 after), twice
for a program that falls back to exact keys; ``R * N * V * u`` of base logits read;
``R * N * V * c`` of cache written; ``R * N * (R_k * w + 24)`` of codes, words and tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.filter import FILTER_MARGIN, approx_words, exact_keys, key_slack
from ..ops.noise import INTERPRET, draft_noise, draft_prefix
from ..ops.numerics import (INT64_MAX, INT64_MIN, biased_logits, block_argmax, round_to, to_float32, unpack_key,
                            weight_bias)
from ..ops.numerics import pack_word as _pack_word, word_token as _word_token
from ..ops.rows import draft_rows
from ..validate import DeviceStatusError, check_power_of_two

# A barrier gives up after this many polls of its counter (each an L2 round trip, ~1 us): about a
# second, far beyond any step (tens of microseconds) and short enough to end a faulty launch.
SPIN_LIMIT = 1 << 20
# Largest batch: the tensor-core tile has BLOCK_R rows (the codes of the batch, padded).
MAX_ROWS = 16


@triton.jit
def _grid_barrier(counter_ptr, num_programs, status_ptr, SPIN: tl.constexpr):
    """Arrive at ``counter_ptr`` and wait (bounded) until all ``num_programs`` have arrived."""
    tl.debug_barrier()  # every thread's atomic_max of this step is issued before the arrival
    seen = tl.atomic_add(counter_ptr, 1) + 1  # acq_rel, gpu scope
    spins = 0
    while (seen < num_programs) & (spins < SPIN):
        seen = tl.load(counter_ptr, volatile=True)  # polls from L2 (no L1), no read-modify-write traffic
        spins += 1
    if seen < num_programs:
        tl.atomic_or(status_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _read_words(step_words, rows, row_ok, counter_ptr, floor, SLOTS: tl.constexpr, BLOCK_R: tl.constexpr):
    """A finished step's merged word per row ``[BLOCK_R]``, read after its barrier.

    One slot: an atomic read (ordered after the barrier by itself). ``SLOTS`` slots (programs merge
    into slot ``program % SLOTS`` to spread the same-line atomics): one acquire on the step's counter,
    then plain L2 reads (``volatile``: no stale L1 line) of every slot, reduced here.
    """
    if SLOTS == 1:
        word = tl.atomic_max(step_words + rows, floor, mask=row_ok)
    else:
        tl.atomic_add(counter_ptr, 0, sem="acquire")
        tl.debug_barrier()
        slots = tl.arange(0, SLOTS)
        words = tl.load(step_words + slots[:, None] * BLOCK_R + rows[None, :], mask=row_ok[None, :],
                        other=INT64_MIN, volatile=True)
        word = tl.max(words, axis=0)
    return word


@triton.jit
def _tile_logits(head_ptr, codes, tile, base_ptr, rows, row_ok, step, vocab, stride_br, stride_bn, scale, d2t_ptr,
                 cache_dtype: tl.constexpr, RK: tl.constexpr, BLOCK_V: tl.constexpr, SCALED: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE_DOT: tl.constexpr, EVICT: tl.constexpr, D2T: tl.constexpr):
    """One tile of one step: ``(z in the cache dtype, z as fp32, token ids, mask)``, ``[BLOCK_R, BLOCK_V]``.

    The bias ``codes @ W2_tile^T`` is accumulated in fp32 on tensor cores and rounded once to the
    weight dtype (again after ``scale``); ``z = round(base + bias)`` to the cache dtype. The token
    ids (the cache columns and the keys' ids) are the tile's columns, or with ``D2T`` their target
    ids (README "Id spaces").
    """
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
    w_tile = tl.load(head_ptr + cols[:, None].to(tl.int64) * RK + tl.arange(0, RK)[None, :],
                     mask=col_ok[:, None], other=0.0, eviction_policy=EVICT)
    if UPCAST:
        a = codes.to(tl.float32)
        b = w_tile.to(tl.float32)
    else:
        a = codes
        b = w_tile
    if IEEE_DOT:
        acc = tl.dot(a, tl.trans(b), input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(b))
    w_dtype = head_ptr.dtype.element_ty
    bias = weight_bias(round_to(acc, w_dtype), scale, w_dtype, SCALED)  # rounded once, again after scale
    mask = row_ok[:, None] & col_ok[None, :]
    base = tl.load(base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn + cols[None, :],
                   mask=mask, other=0.0, eviction_policy="evict_first")
    z = biased_logits(base, bias, cache_dtype)  # one rounding (SPEC.md 3)
    if D2T:
        tokens = tl.load(d2t_ptr + cols, mask=col_ok, other=0)
    else:
        tokens = cols
    return z, to_float32(z), tokens, mask


@triton.jit
def _chain_kernel(
    base_ptr,  # [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
    anchor_ptr,  # [R] int32/int64, previous token of step 0
    embed_ptr,  # [V_t, R_k] weight dtype (W1)
    head_ptr,  # [V, R_k] weight dtype (W2)
    cache_ptr,  # [S, N, V] cache dtype
    idx_ptr,  # [R * N] slot per (row, step), -1 = padding
    pos_ptr,  # [R * N] position each sample predicts
    temp_ptr,  # [S] fp32
    seed_ptr,  # [S] int64
    tokens_ptr,  # [R, N] int64 output, row stride stride_tr
    words_ptr,  # [N, SLOTS, BLOCK_R] int64 scratch: each step's packed best words (INT64_MIN between calls)
    sync_ptr,  # [N + 1] int32 scratch: arrival counter per step, then the exit counter (0 between calls)
    status_ptr,  # [1] int32: bit 0 set when a barrier gave up waiting
    d2t_ptr,  # [V] int32 target id of each draft id (D2T only)
    fill_ptr,  # [V_t - V] int32 target ids no draft id maps to (D2T only)
    num_rows, vocab, embed_rows, num_slots, num_steps, num_tiles, num_programs,
    stride_br, stride_bn, stride_cs, stride_tr, scale, filter_margin, cache_vocab, num_fill,
    RK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
    NUM_STAGES: tl.constexpr, SCALED: tl.constexpr, UPCAST: tl.constexpr, IEEE_DOT: tl.constexpr,
    HARDWARE_LOG2: tl.constexpr, SPIN: tl.constexpr, SLOTS: tl.constexpr, D2T: tl.constexpr,
    BLOCK_FILL: tl.constexpr,
):
    program = tl.program_id(0)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    ks = tl.arange(0, RK)
    floor = tl.full([BLOCK_R], INT64_MIN, tl.int64)  # below every word
    cache_dtype = cache_ptr.dtype.element_ty
    # This program's tiles: program + j * num_programs for j < owned.
    owned = (num_tiles - program + num_programs - 1) // num_programs
    for step in range(num_steps):
        if step == 0:
            prev = tl.load(anchor_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        else:
            prev = _word_token(_read_words(words_ptr + (step - 1) * SLOTS * BLOCK_R, rows, row_ok, sync_ptr + step - 1,
                                           floor, SLOTS, BLOCK_R), cache_vocab).to(tl.int64)
        prev = tl.minimum(tl.maximum(prev, 0), embed_rows - 1)
        codes = tl.load(embed_ptr + prev[:, None] * RK + ks[None, :], mask=row_ok[:, None], other=0.0)
        # Per-row keys: padding and out-of-range slots are greedy (T = 0, seed 0) and write nothing.
        sample = rows * num_steps + step
        live, safe_slot, temp, seed, position = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample,
                                                            row_ok, num_slots)
        prefix = draft_prefix(seed, step, position)
        greedy = temp == 0.0
        inv_temp = 1.0 / tl.where(greedy, 1.0, temp)
        # Rank every tile by approximate keys (ops.filter) and keep, per row over all of this
        # program's tiles, the three best packed approximate keys. The exact winner is then one of
        # the first two unless the third is within the filter's slack of the first; only those two
        # exact keys are computed per row and step, from their logits read back from the cache.
        top1 = floor
        top2 = floor
        top3 = floor
        forward = step % 2 == 0
        for i in tl.range(0, owned, num_stages=NUM_STAGES):
            tile = program + tl.where(forward, i, owned - 1 - i) * num_programs
            z, logits, cols, mask = _tile_logits(head_ptr, codes, tile, base_ptr, rows, row_ok, step, vocab,
                                                 stride_br, stride_bn, scale, d2t_ptr, cache_dtype, RK, BLOCK_V,
                                                 SCALED, UPCAST, IEEE_DOT, "evict_last", D2T)
            tl.store(cache_ptr + safe_slot[:, None] * stride_cs + step * cache_vocab + cols[None, :], z,
                     mask=live[:, None] & mask, eviction_policy="evict_first")
            packed = approx_words(logits, greedy, inv_temp, prefix, cols[None, :], mask, 1, HARDWARE_LOG2)
            b1 = tl.max(packed, axis=1)
            packed = tl.where(packed == b1[:, None], INT64_MIN, packed)
            b2 = tl.max(packed, axis=1)
            b3 = tl.max(tl.where(packed == b2[:, None], INT64_MIN, packed), axis=1)
            # Merge two sorted triples (words are distinct): the k-th largest of the union is the
            # max over i + j = k of min(a_i, b_j), with a_0 = b_0 = +inf.
            c2 = tl.maximum(tl.maximum(top2, b2), tl.minimum(top1, b1))
            top3 = tl.maximum(tl.maximum(top3, b3), tl.maximum(tl.minimum(top1, b2), tl.minimum(top2, b1)))
            top1 = tl.maximum(top1, b1)
            top2 = c2
        value, index = unpack_key(top1)
        runner_value, runner_index = unpack_key(top2)
        third, _ = unpack_key(top3)
        clear_best = (top1 != INT64_MAX) & (value != 0.0)
        finite_best = clear_best & (tl.abs(value) < float("inf")) & (top2 != INT64_MAX) & (top2 != INT64_MIN)
        decided = (row_ok == 0) | tl.where(greedy, clear_best,
                                           finite_best & (value - third > key_slack(value, filter_margin)))
        if tl.min(decided.to(tl.int32), axis=0) == 1:
            # The sampled rows are live: their two candidates' logits are in the cache, written by
            # this program (visible to all its threads after the barrier).
            tl.debug_barrier()
            sampled = live & (greedy == 0)
            cache_row = cache_ptr + safe_slot * stride_cs + step * cache_vocab
            z1 = to_float32(tl.load(cache_row + tl.minimum(tl.maximum(index, 0), cache_vocab - 1), mask=sampled,
                                    other=0.0))
            z2 = to_float32(tl.load(cache_row + tl.minimum(tl.maximum(runner_index, 0), cache_vocab - 1), mask=sampled,
                                    other=0.0))
            divisor = tl.where(greedy, 1.0, temp)
            exact1 = tl.math.div_rn(z1, divisor) + draft_noise(prefix, index)
            exact2 = tl.math.div_rn(z2, divisor) + draft_noise(prefix, runner_index)
            best = tl.where(greedy, _pack_word(value, index),
                            tl.maximum(_pack_word(exact1, index), _pack_word(exact2, runner_index)))
        else:
            # A near-tie of three, a NaN, a non-finite or zero best: recompute this program's tiles
            # with exact keys (rare; W2 is read again, the cache is not rewritten).
            best = floor
            for i in tl.range(0, owned, num_stages=1):
                tile = program + i * num_programs
                z, logits, cols, mask = _tile_logits(head_ptr, codes, tile, base_ptr, rows, row_ok, step, vocab,
                                                     stride_br, stride_bn, scale, d2t_ptr, cache_dtype, RK, BLOCK_V,
                                                     SCALED, UPCAST, IEEE_DOT, "evict_last", D2T)
                keys = exact_keys(logits, greedy, temp, prefix, cols[None, :], 1)
                tile_value, tile_index = block_argmax(keys, cols[None, :], mask, 1)
                best = tl.maximum(best, _pack_word(tile_value, tile_index))
        tl.atomic_max(words_ptr + (step * SLOTS + program % SLOTS) * BLOCK_R + rows, best, mask=row_ok)
        if D2T:  # -inf at this program's share of the unmapped target ids of the step's live rows
            for start in range(program * BLOCK_FILL, num_fill, num_programs * BLOCK_FILL):
                j = start + tl.arange(0, BLOCK_FILL)
                fill_cols = tl.load(fill_ptr + j, mask=j < num_fill, other=0)
                tl.store(cache_ptr + safe_slot[:, None] * stride_cs + step * cache_vocab + fill_cols[None, :],
                         round_to(tl.full([BLOCK_R, BLOCK_FILL], float("-inf"), tl.float32), cache_dtype),
                         mask=live[:, None] & (j < num_fill)[None, :], eviction_policy="evict_first")
        _grid_barrier(sync_ptr + step, num_programs, status_ptr, SPIN)
    # Exit: the last program to arrive has every step's word; it writes the tokens and resets.
    tl.debug_barrier()
    done = tl.atomic_add(sync_ptr + num_steps, 1)
    if done == num_programs - 1:
        for step in range(num_steps):
            step_words = words_ptr + step * SLOTS * BLOCK_R
            if SLOTS == 1:
                word = tl.atomic_xchg(step_words + rows, floor, mask=row_ok)
            else:
                word = _read_words(step_words, rows, row_ok, sync_ptr + num_steps, floor, SLOTS, BLOCK_R)
                slots = tl.arange(0, SLOTS)
                tl.store(step_words + slots[:, None] * BLOCK_R + rows[None, :],
                         tl.full([SLOTS, BLOCK_R], INT64_MIN, tl.int64))
            tl.store(tokens_ptr + rows * stride_tr + step, _word_token(word, cache_vocab).to(tl.int64), mask=row_ok)
            tl.atomic_xchg(sync_ptr + step, 0)
        tl.atomic_xchg(sync_ptr + num_steps, 0)


def resident_programs_per_sm(kernel, device) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, shared memory, warps)."""
    props = torch.cuda.get_device_properties(device)
    kernel._init_handles()
    warps = kernel.metadata.num_warps
    regs_per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = (getattr(props, "regs_per_multiprocessor", 65536) // regs_per_warp) // warps
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // (kernel.metadata.shared + 1024)  # 1 KB reserved per block
    by_warps = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return max(0, min(by_regs, by_smem, by_warps, 32))


class Layout:
    """One launch shape of the chain: vocabulary tile, warps, pipeline stages, programs per SM.

    ``programs`` is the grid: ``programs_per_sm`` times the SMs, capped at the first launch by what
    fits on the GPU at once (:func:`resident_programs_per_sm`); one in the interpreter.
    """

    def __init__(self, block_v, num_warps, num_stages, programs_per_sm, vocab, device, interpret, programs=None):
        self.block_v, self.num_warps, self.num_stages = int(block_v), int(num_warps), int(num_stages)
        self.num_tiles = triton.cdiv(vocab, self.block_v)
        if interpret or device.type != "cuda":
            default = 1
        else:
            default = int(programs_per_sm) * torch.cuda.get_device_properties(device).multi_processor_count
        self.programs = min(int(programs or default), self.num_tiles)
        if interpret and self.programs != 1:
            raise ValueError(f"programs: the interpreter runs programs one after another, so the chain's "
                             f"barriers need programs=1 there, got {self.programs}")
        self.fitted = interpret or device.type != "cuda"

    def fit(self, kernel, device) -> None:
        """Cap :attr:`programs` at what fits on the GPU at once, from the compiled ``kernel``."""
        fits = resident_programs_per_sm(kernel, device)
        if fits == 0:
            raise ValueError(f"block_v: impl 'chain' with block_v={self.block_v}, num_warps={self.num_warps}, "
                             f"num_stages={self.num_stages} does not fit on one SM")
        self.programs = min(self.programs, fits * torch.cuda.get_device_properties(device).multi_processor_count)
        self.fitted = True


# GPU layouts by batch size, measured on the H200 (tools/sweep_chain.py, N = 5, T = 1, bf16):
# (largest batch, (block_v, num_warps, num_stages, programs per SM)). 32/2/3/4: 134 us at 1 row in
# the benchmark (sweeps: 64/4/3/2 ~135-156, 128/4/2/2 ~145, one program per SM 178-216);
# 32/4/3/4: 176-180 us at 2-16 rows (64/4/3/2 183-187, 128/8/2/1 233-238).
GPU_LAYOUTS = ((1, (32, 2, 3, 4)), (MAX_ROWS, (32, 4, 3, 4)))
# fp32 W2 tiles are twice as large (not swept; the GPU test with fp32 weights checks exactness).
GPU_LAYOUTS_FP32_WEIGHTS = ((MAX_ROWS, (32, 4, 2, 3)),)


class ChainBackend:
    """The whole N-step chain in one persistent launch, for batches of up to 16 rows (Gumbel only).

    Scratch (allocated once): ``words`` ``[N, word_slots, 16]`` int64, ``sync`` ``[N + 1]`` int32 and ``status``
    ``[1]`` int32. ``run`` allocates nothing, makes one launch and is CUDA-graph safe (capture one
    graph per batch size: the launch shape depends on it, :data:`GPU_LAYOUTS`). The launch needs
    all its programs on the GPU at once: the first call of each shape compiles the kernel and caps
    the programs at what fits (registers, shared memory) on every SM together. Work running
    concurrently on other streams that holds SMs until this launch ends (another persistent kernel)
    would make a barrier give up; :meth:`check` reports it. ``block_v``, ``num_warps``,
    ``num_stages``, ``programs_per_sm`` or ``programs`` fix one shape for every batch.
    ``word_slots`` > 1 spreads the per-row ``atomic_max`` over that many slots (an experiment
    against same-line atomic contention, not yet measured on a GPU; the default 1 is what the
    benchmarks and GPU tests ran).
    """

    METHODS = ("gumbel",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = MAX_ROWS
    D2T = True  # a reduced draft vocabulary: target ids in the cache, the keys and the words

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block_v=None,
                 num_warps=None, num_stages=None, programs_per_sm=None, programs=None, spin_limit=SPIN_LIMIT,
                 filter_margin=FILTER_MARGIN, word_slots=1):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'chain' needs a power-of-two rank >= 16, got {head.rank}")
        if max_rows > MAX_ROWS:
            raise ValueError(f"max_rows: impl 'chain' takes at most {MAX_ROWS} rows, got {max_rows}")
        device = torch.device(device)
        self.head = head
        self.device = device
        self.interpret = INTERPRET or device.type == "cpu"
        self.upcast = self.interpret or head.dtype == torch.float32
        vocab = head.vocab_size
        if self.interpret:
            table = ((MAX_ROWS, (32, 4, 2, 1)),)
        elif head.dtype == torch.float32:
            table = GPU_LAYOUTS_FP32_WEIGHTS
        else:
            table = GPU_LAYOUTS
        fixed = (block_v, num_warps, num_stages, programs_per_sm, programs)
        if any(value is not None for value in fixed):
            shape = table[-1][1]
            table = ((MAX_ROWS, (block_v or shape[0], num_warps or shape[1], num_stages or shape[2],
                                 programs_per_sm or shape[3])),)
        self.layouts = [(limit, Layout(*shape, vocab, device, self.interpret, programs)) for limit, shape in table]
        self.spin_limit = int(spin_limit)
        self.filter_margin = float(filter_margin)
        self.block_r = MAX_ROWS
        check_power_of_two("word_slots", word_slots, 1)
        self.word_slots = int(word_slots)
        self.words = torch.full((num_steps, self.word_slots, self.block_r), -(2**63), dtype=torch.int64,
                                device=device)
        self.sync = torch.zeros(num_steps + 1, dtype=torch.int32, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self.reduced = head.d2t_index is not None
        # README "Id spaces": the tiles' target ids [V_d], and the ids no draft id maps to [V_t - V_d] (-inf)
        self.d2t, self.fill = head.id_tables(device)

    def layout(self, rows: int) -> Layout:
        """The launch shape used for a batch of ``rows`` rows."""
        for limit, layout in self.layouts:
            if rows <= limit:
                return layout
        return self.layouts[-1][1]

    def check(self) -> None:
        """Raise :class:`~dspark_markov.DeviceStatusError` if a launch's barrier gave up waiting.

        Reads :attr:`status` (a host sync: call it outside a capture, e.g. after the engine's own
        device-to-host copy of a step's results) and clears it, so each failure is reported once.
        """
        if int(self.status.item()) != 0:
            self.status.zero_()
            raise DeviceStatusError("impl 'chain': a grid barrier timed out (not all programs were resident) in a "
                                    "launch since the last check; the draft tokens of that call are meaningless "
                                    "(in [0, V) but not the reference's). Use fewer programs or impl='fused'.")

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        head = self.head
        rows, steps, vocab = base_logits.shape
        status = self.status  # read at every launch: a dispatcher may point it at a shared flag
        layout = self.layout(rows)

        def arguments():
            return (base_logits, anchor, head.embed_weight, head.head_weight, logits_cache, idx_mapping, positions,
                    temperature, seeds, draft_tokens, self.words, self.sync, status, self.d2t, self.fill,
                    rows, vocab, head.embed_vocab_size, temperature.shape[0], steps, layout.num_tiles,
                    layout.programs, base_logits.stride(0), base_logits.stride(1), logits_cache.stride(0),
                    draft_tokens.stride(0), head.scale, self.filter_margin, head.cache_vocab_size,
                    self.fill.numel() if self.reduced else 0)
        options = dict(RK=head.rank, BLOCK_V=layout.block_v, BLOCK_R=self.block_r, NUM_STAGES=layout.num_stages,
                       SCALED=head.scale != 1.0, UPCAST=self.upcast, IEEE_DOT=head.dtype == torch.float32,
                       HARDWARE_LOG2=not self.interpret, SPIN=self.spin_limit, SLOTS=self.word_slots,
                       D2T=self.reduced, BLOCK_FILL=256, num_warps=layout.num_warps,
                       enable_fp_fusion=False)
        if not layout.fitted:
            layout.fit(_chain_kernel.warmup(*arguments(), grid=(1,), **options), self.device)
        _chain_kernel[(layout.programs,)](*arguments(), **options)
