"""``impl="chain"``: all N draft steps of a small batch in one persistent launch (Gumbel-max).

``P`` programs, all on the GPU at once (3 per SM by default), run the whole chain. Program ``p`` owns
the vocabulary tiles ``p, p + P, p + 2P, ...`` of ``BLOCK_V`` tokens. At every step it computes the
bias of its tiles on tensor cores (``codes @ W2_tile^T``, fp32 accumulation rounded once to the
weight dtype, as ``impl="fused"``), adds the base logits, writes the cache, and reduces its tiles
to one exact Gumbel key maximum per row (ranked first by approximate noise, :mod:`.gumbel_filter`),
packed with its index into one int64 word ordered by (key, then lower index; every NaN above
``+inf``, ``-0.0`` equal to ``+0.0``), which it merges into the step's word with ``atomic_max``:
the merged word is the ``torch.argmax`` of the whole row. A grid-wide barrier (one arrival counter
per step in global memory) makes the winner known to every program, which gathers ``W1[token]``
and goes on to the next step. The last program to finish writes ``draft_tokens`` and resets the
words and counters for the next call, so a call is one launch and replays in a CUDA graph.

Where W2 lives: with ``RESIDENT`` > 0 the first tiles of each program are loaded once, before the
step loop, and stay in registers for all N steps; the others are streamed at every step, with an
L2 ``evict_last`` hint (base logits and the cache use ``evict_first``) and in alternating
directions (forward at even steps, backward at odd ones), so that the tiles read last at one step,
still in the 60 MB L2, are the first read at the next. Triton gives no shared memory that outlives
a loop iteration, so registers and L2 are what a Triton kernel can keep W2 in. Measured on the
H200, the register-resident tiles cost more occupancy than they save (default ``RESIDENT = 0``, 3
programs per SM), and the later steps take ~28 us against ~40 us for the first (W2 only partly
hit in L2): far from the ~10 us a kernel holding W2 in shared memory and registers would need.

Waits are bounded: a program that has spun ``SPIN_LIMIT`` times at a barrier (a co-resident program
never arrived: more programs than fit on the GPU at once, or a fault) stops waiting, sets
``status`` and carries on, so the launch always ends; the tokens of such a call are in ``[0, V)``
but meaningless, and :meth:`ChainBackend.check` raises. Triton's interpreter runs programs one
after another, so there the chain runs with one program (``P = 1``: no waits).

Bytes per call: ``V * R_k * w`` of W2 from HBM at the first step, and at each later step the
streamed part again from L2 or HBM (``(V - P * RESIDENT * BLOCK_V) * R_k * w``); ``R * N * V * u``
of base logits read; ``R * N * V * c`` of cache written; ``R * N * (R_k * w + 24)`` of codes,
words and tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import rng_triton
from .gumbel_filter import FILTER_MARGIN, INT64_MIN
from .triton_common import INTERPRET, round_to, to_float32
from .triton_fused import _gumbel_tile_argmax

# A barrier gives up after this many polls of its counter (each an L2 round trip, ~1 us): about a
# second, far beyond any step (tens of microseconds) and short enough to end a faulty launch.
SPIN_LIMIT = 1 << 20
# Largest batch: the tensor-core tile has BLOCK_R rows (the codes of the batch, padded).
MAX_ROWS = 16


@triton.jit
def _pack_word(value, index):
    """int64 word ordered like ``torch.argmax``'s choice: (fp32 key, then lower index first).

    Every NaN maps above ``+inf`` (the first NaN wins, as in ``argmax``) and ``-0.0`` onto ``+0.0``.
    """
    bits = value.to(tl.int32, bitcast=True)
    bits = tl.where(value != value, 0x7FFFFFFF, bits)
    bits = tl.where(value == 0.0, 0, bits)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _word_token(word, vocab):
    """The token of a :func:`_pack_word` word, clamped into ``[0, V)``."""
    token = 0x7FFFFFFF - (word & 0x7FFFFFFF)
    return tl.minimum(tl.maximum(token, 0), vocab - 1)


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
def _tile_word(w_tile, codes, tile, base_ptr, cache_ptr, rows, row_ok, live, safe_slot, temp, prefix, step,
               vocab, stride_br, stride_bn, stride_cs, scale, filter_margin,
               BLOCK_V: tl.constexpr, SCALED: tl.constexpr, UPCAST: tl.constexpr, IEEE_DOT: tl.constexpr,
               HARDWARE_LOG2: tl.constexpr):
    """One tile of one step: bias, cache write, and the rows' packed best words ``[BLOCK_R]``."""
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
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
    w_dtype = w_tile.dtype
    bias = to_float32(round_to(acc, w_dtype))
    if SCALED:
        bias = to_float32(round_to(bias * scale, w_dtype))
    mask = row_ok[:, None] & col_ok[None, :]
    base = tl.load(base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn + cols[None, :],
                   mask=mask, other=0.0, eviction_policy="evict_first")
    z = round_to(to_float32(base) + bias, cache_ptr.dtype.element_ty)  # one rounding (SPEC.md 3)
    tl.store(cache_ptr + safe_slot[:, None] * stride_cs + step * vocab + cols[None, :], z,
             mask=live[:, None] & col_ok[None, :], eviction_policy="evict_first")
    value, index = _gumbel_tile_argmax(to_float32(z), temp == 0.0, temp, prefix, mask, row_ok, cols[None, :],
                                       filter_margin, HARDWARE_LOG2)
    return _pack_word(value, index)


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
    words_ptr,  # [N, BLOCK_R] int64 scratch: each step's packed best word per row (INT64_MIN between calls)
    sync_ptr,  # [N + 1] int32 scratch: arrival counter per step, then the exit counter (0 between calls)
    status_ptr,  # [1] int32: bit 0 set when a barrier gave up waiting
    num_rows, vocab, embed_rows, num_slots, num_steps, num_tiles, num_programs,
    stride_br, stride_bn, stride_cs, stride_tr, scale, filter_margin,
    RK: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, RESIDENT: tl.constexpr,
    NUM_STAGES: tl.constexpr, SCALED: tl.constexpr, UPCAST: tl.constexpr, IEEE_DOT: tl.constexpr,
    HARDWARE_LOG2: tl.constexpr, SPIN: tl.constexpr,
):
    program = tl.program_id(0)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    ks = tl.arange(0, RK)
    floor = tl.full([BLOCK_R], INT64_MIN, tl.int64)  # below every word
    # This program's tiles: program + i * num_programs for i < owned.
    owned = (num_tiles - program + num_programs - 1) // num_programs
    streamed = tl.maximum(owned - RESIDENT, 0)
    # The resident tiles (i = 0 and 1) stay in registers for all the steps.
    tile0 = program
    tile1 = program + num_programs
    if RESIDENT >= 1:
        cols0 = tile0 * BLOCK_V + tl.arange(0, BLOCK_V)
        w_res0 = tl.load(head_ptr + cols0[:, None].to(tl.int64) * RK + ks[None, :],
                         mask=(cols0 < vocab)[:, None], other=0.0)
    if RESIDENT >= 2:
        cols1 = tile1 * BLOCK_V + tl.arange(0, BLOCK_V)
        w_res1 = tl.load(head_ptr + cols1[:, None].to(tl.int64) * RK + ks[None, :],
                         mask=(cols1 < vocab)[:, None], other=0.0)
    for step in range(num_steps):
        if step == 0:
            prev = tl.load(anchor_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        else:
            word = tl.atomic_max(words_ptr + (step - 1) * BLOCK_R + rows, floor, mask=row_ok)  # an ordered read
            prev = _word_token(word, vocab).to(tl.int64)
        prev = tl.minimum(tl.maximum(prev, 0), embed_rows - 1)
        codes = tl.load(embed_ptr + prev[:, None] * RK + ks[None, :], mask=row_ok[:, None], other=0.0)
        # Per-row keys: padding and out-of-range slots are greedy (T = 0, seed 0) and write nothing.
        sample = rows * num_steps + step
        slot = tl.load(idx_ptr + sample, mask=row_ok, other=-1).to(tl.int64)
        live = row_ok & (slot >= 0) & (slot < num_slots)
        safe_slot = tl.where(live, slot, 0)
        temp = tl.where(live, tl.load(temp_ptr + safe_slot, mask=live, other=0.0), 0.0)
        seed = tl.where(live, tl.load(seed_ptr + safe_slot, mask=live, other=0), 0)
        position = tl.load(pos_ptr + sample, mask=row_ok, other=0).to(tl.int64)
        prefix = rng_triton.draft_prefix(seed, step, position)
        best = floor
        if RESIDENT >= 1:
            if tile0 < num_tiles:
                best = tl.maximum(best, _tile_word(
                    w_res0, codes, tile0, base_ptr, cache_ptr, rows, row_ok, live, safe_slot, temp, prefix,
                    step, vocab, stride_br, stride_bn, stride_cs, scale, filter_margin,
                    BLOCK_V, SCALED, UPCAST, IEEE_DOT, HARDWARE_LOG2))
        if RESIDENT >= 2:
            if tile1 < num_tiles:
                best = tl.maximum(best, _tile_word(
                    w_res1, codes, tile1, base_ptr, cache_ptr, rows, row_ok, live, safe_slot, temp, prefix,
                    step, vocab, stride_br, stride_bn, stride_cs, scale, filter_margin,
                    BLOCK_V, SCALED, UPCAST, IEEE_DOT, HARDWARE_LOG2))
        forward = step % 2 == 0
        for i in tl.range(0, streamed, num_stages=NUM_STAGES):
            j = tl.where(forward, i, streamed - 1 - i) + RESIDENT
            tile = program + j * num_programs
            cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
            w_tile = tl.load(head_ptr + cols[:, None].to(tl.int64) * RK + ks[None, :],
                             mask=(cols < vocab)[:, None], other=0.0, eviction_policy="evict_last")
            best = tl.maximum(best, _tile_word(
                w_tile, codes, tile, base_ptr, cache_ptr, rows, row_ok, live, safe_slot, temp, prefix,
                step, vocab, stride_br, stride_bn, stride_cs, scale, filter_margin,
                BLOCK_V, SCALED, UPCAST, IEEE_DOT, HARDWARE_LOG2))
        tl.atomic_max(words_ptr + step * BLOCK_R + rows, best, mask=row_ok)
        _grid_barrier(sync_ptr + step, num_programs, status_ptr, SPIN)
    # Exit: the last program to arrive has every step's word; it writes the tokens and resets.
    tl.debug_barrier()
    done = tl.atomic_add(sync_ptr + num_steps, 1)
    if done == num_programs - 1:
        for step in range(num_steps):
            word = tl.atomic_xchg(words_ptr + step * BLOCK_R + rows, floor, mask=row_ok)
            tl.store(tokens_ptr + rows * stride_tr + step, _word_token(word, vocab).to(tl.int64), mask=row_ok)
            tl.atomic_xchg(sync_ptr + step, 0)
        tl.atomic_xchg(sync_ptr + num_steps, 0)


def default_programs(device, programs_per_sm: int) -> int:
    """``programs_per_sm`` programs per SM on the GPU (capped at what fits at once); one in the interpreter."""
    device = torch.device(device)
    if INTERPRET or device.type != "cuda":
        return 1
    return programs_per_sm * torch.cuda.get_device_properties(device).multi_processor_count


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


class ChainBackend:
    """The whole N-step chain in one persistent launch, for batches of up to 16 rows (Gumbel only).

    Scratch (allocated once): ``words`` ``[N, 16]`` int64, ``sync`` ``[N + 1]`` int32 and ``status``
    ``[1]`` int32. ``run`` allocates nothing, makes one launch and is CUDA-graph safe. The launch
    needs all its programs on the GPU at once: the first call compiles the kernel and caps the
    programs at what fits (registers, shared memory) on every SM together. Work running
    concurrently on other streams that holds SMs until this launch ends (another persistent kernel)
    would make a barrier give up; :meth:`check` reports it.
    """

    METHODS = ("gumbel",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = MAX_ROWS

    def __init__(self, head, num_steps, max_rows, method, cache_dtype, device, *, block_v=None, resident=None,
                 num_warps=None, num_stages=None, programs_per_sm=None, programs=None, spin_limit=SPIN_LIMIT,
                 filter_margin=FILTER_MARGIN):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'chain' needs a power-of-two rank >= 16, got {head.rank}")
        if max_rows > MAX_ROWS:
            raise ValueError(f"max_rows: impl 'chain' takes at most {MAX_ROWS} rows, got {max_rows}")
        device = torch.device(device)
        self.head = head
        self.device = device
        self.interpret = INTERPRET or device.type == "cpu"
        self.upcast = self.interpret or head.dtype == torch.float32
        # GPU defaults, measured on the H200 (tools/sweep_chain.py, N = 5, T = 1, us at 1 / 4 / 16 rows):
        # tiles of 64 tokens, none register-resident, 4 warps, a 2-stage pipeline and 3 programs per SM
        # (168 registers, 44 KB of shared memory each): 151 / 171 / 170. One program per SM with two
        # resident tiles (8 warps, 3 stages) took 234 / 272 / 254, with tiles of 128 and one resident
        # 190 / 220 / 223: occupancy (latency hiding) matters more than the few registers' worth of W2.
        # fp32 W2 tiles are twice as large: 32 tokens.
        wide = head.dtype == torch.float32
        self.block_v = block_v or (32 if self.interpret or wide else 64)
        self.resident = 0 if resident is None else resident
        if self.resident not in (0, 1, 2):
            raise ValueError(f"resident: expected 0, 1 or 2 register-resident tiles, got {self.resident}")
        self.num_warps = num_warps or 4
        self.num_stages = num_stages or 2
        self.num_tiles = triton.cdiv(head.vocab_size, self.block_v)
        self.programs = min(int(programs or default_programs(device, programs_per_sm or 3)), self.num_tiles)
        if self.interpret and self.programs != 1:
            raise ValueError(f"programs: the interpreter runs programs one after another, so the chain's "
                             f"barriers need programs=1 there, got {self.programs}")
        self.fitted = self.interpret or device.type != "cuda"  # CUDA caps programs at the first call, once compiled
        self.spin_limit = int(spin_limit)
        self.filter_margin = float(filter_margin)
        self.block_r = MAX_ROWS
        self.words = torch.full((num_steps, self.block_r), -(2**63), dtype=torch.int64, device=device)
        self.sync = torch.zeros(num_steps + 1, dtype=torch.int32, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)

    def check(self) -> None:
        """Raise ``RuntimeError`` if a launch's barrier gave up waiting (host sync; not in a capture)."""
        if int(self.status.item()) != 0:
            raise RuntimeError("impl 'chain': a grid barrier timed out (not all programs were resident); "
                               "the tokens of that call are meaningless. Use fewer programs or impl='fused'.")

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        head = self.head
        rows, steps, vocab = base_logits.shape
        args = (base_logits, anchor, head.embed_weight, head.head_weight, logits_cache, idx_mapping, positions,
                temperature, seeds, draft_tokens, self.words, self.sync, self.status,
                rows, vocab, head.embed_vocab_size, temperature.shape[0], steps, self.num_tiles, self.programs,
                base_logits.stride(0), base_logits.stride(1), logits_cache.stride(0), draft_tokens.stride(0),
                head.scale, self.filter_margin)
        options = dict(RK=head.rank, BLOCK_V=self.block_v, BLOCK_R=self.block_r, RESIDENT=self.resident,
                       NUM_STAGES=self.num_stages, SCALED=head.scale != 1.0, UPCAST=self.upcast,
                       IEEE_DOT=head.dtype == torch.float32, HARDWARE_LOG2=not self.interpret,
                       SPIN=self.spin_limit, num_warps=self.num_warps, enable_fp_fusion=False)
        if not self.fitted:
            kernel = _chain_kernel.warmup(*args, grid=(1,), **options)
            fits = resident_programs_per_sm(kernel, self.device)
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            if fits == 0:
                raise ValueError(f"block_v: impl 'chain' with block_v={self.block_v}, num_warps={self.num_warps}, "
                                 f"num_stages={self.num_stages} does not fit on one SM")
            self.programs = min(self.programs, fits * sms)
            self.fitted = True
            args = args[:19] + (self.programs,) + args[20:]
        _chain_kernel[(self.programs,)](*args, **options)
