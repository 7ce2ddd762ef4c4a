"""``impl="fused"``: one sampling launch per step with the bias computed on tensor cores.

Per step, :func:`_fused_step_kernel` runs one program per (chunk of ``BLOCK_R`` request rows,
tile of ``BLOCK_V`` vocabulary entries), row chunks varying fastest so that the programs sharing a
W2 tile run together and read it from L2 after the first. Each computes
``bias = codes @ W2_tile^T`` with ``tl.dot`` over a pipelined K loop (fp32 accumulation, rounded
once to the weight dtype), adds the base logits, writes the cache and reduces its tile to one
partial per row: the Gumbel key maximum and its first index (``method="gumbel"``, ranked first by
approximate noise, :mod:`.gumbel_filter`), or the argmax, the max and the exp-sum of ``z / T``
(``method="inverse_cdf"``). A small combine kernel (one program per row) then picks the row's token
from the partials with torch.argmax semantics (or by inverse CDF over tile masses, then inside the
chosen tile), writes ``draft_tokens[:, step]`` and gathers the next step's code row ``W1[token]``.
The bias never goes to memory.

Bytes per step: ``V * R_k * w`` of W2 from HBM (plus ``ceil(R / BLOCK_R) - 1`` re-reads from L2),
``R * V * u`` of base logits read, ``R * V * c`` of cache written, ``R * ceil(V / BLOCK_V) * 8`` of
partials written and read back; the codes (``R * R_k * w``) are re-read from L2 by every tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import rng_triton
from ..validate import check_power_of_two
from .gumbel_filter import FILTER_MARGIN, INT64_MAX, INT64_MIN, approx_noise, key_slack, pack_key, unpack_key
from .triton_common import INTERPRET, block_argmax, draft_rows, round_to, to_float32

_INT_MAX = tl.constexpr(2147483647)  # jitted code reads only constexpr globals


@triton.jit
def _gather_codes_kernel(
    anchor_ptr,  # [R] int32/int64, previous token of step 0
    embed_ptr,  # [V_t, R_k] weight dtype
    codes_ptr,  # [max_rows, R_k] weight dtype, output
    embed_rows,
    RK: tl.constexpr,
):
    """codes[r] = W1[clamp(anchor[r], 0, V_t - 1)]. Moves ``R * R_k * w * 2`` bytes."""
    row = tl.program_id(0)
    token = tl.load(anchor_ptr + row).to(tl.int64)
    token = tl.minimum(tl.maximum(token, 0), embed_rows - 1)
    cols = tl.arange(0, RK)
    tl.store(codes_ptr + row * RK + cols, tl.load(embed_ptr + token * RK + cols))


@triton.jit
def _gumbel_tile_argmax(logits, greedy, temp, prefix, mask, row_ok, cols, filter_margin,
                        HARDWARE_LOG2: tl.constexpr):
    """Exact per-row ``(max key, first index)`` of a tile of Gumbel keys, at a fraction of the cost.

    Exact keys ``div_rn(z, T) + g`` cost ~100 instructions per token (hash, two bit-exact logs, a
    correctly rounded division). The tile is first ranked by approximate keys ``z * (1/T) + g~``
    (``|g~ - g| <= gumbel_filter.NOISE_BOUND``), packed with their index so that one integer max gives the best
    and a second one the runner-up. Where a row's best beats its runner-up by more than
    ``filter_margin`` (twice the worst error of an approximate key, plus rounding slack scaled by
    the key's size), the exact argmax is the same token, so only that token's exact key is
    computed. Greedy rows (T = 0) rank ``z`` itself, exactly. If any row of the chunk is left
    undecided (a near-tie, a NaN, a non-finite or zero best), the whole chunk is recomputed exactly
    with :func:`.triton_common.block_argmax`.
    """
    inv_temp = 1.0 / tl.where(greedy, 1.0, temp)
    noise = approx_noise(prefix[:, None], cols, HARDWARE_LOG2)
    approx = tl.where(greedy[:, None], logits, logits * inv_temp[:, None] + noise)
    packed = pack_key(approx, cols)
    packed = tl.where(approx != approx, INT64_MAX, packed)  # a NaN wins, then goes exact
    packed = tl.where(mask, packed, INT64_MIN)
    best = tl.max(packed, axis=1)
    runner = tl.max(tl.where(packed == best[:, None], INT64_MIN, packed), axis=1)
    value, index = unpack_key(best)
    second, _ = unpack_key(runner)
    slack = key_slack(value, filter_margin)
    clear_best = (best != INT64_MAX) & (value != 0.0)
    finite_best = clear_best & (tl.abs(value) < float("inf"))
    decided = (row_ok == 0) | tl.where(greedy, clear_best, finite_best & (value - second > slack))
    if tl.max((decided == 0).to(tl.int32), axis=0) > 0:
        exact = tl.where(greedy[:, None], logits,
                         tl.math.div_rn(logits, tl.where(greedy, 1.0, temp)[:, None])
                         + rng_triton.draft_noise(prefix[:, None], cols))
        value, index = block_argmax(exact, cols, mask, 1)
    else:
        winner = tl.max(tl.where(cols == index[:, None], logits, float("-inf")), axis=1)
        exact_winner = tl.math.div_rn(winner, tl.where(greedy, 1.0, temp)) + rng_triton.draft_noise(prefix, index)
        value = tl.where(greedy, value, exact_winner)
    return value, index


@triton.jit(do_not_specialize=["step"])
def _fused_step_kernel(
    base_ptr,  # [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
    codes_ptr,  # [max_rows, R_k] weight dtype, this step's codes W1[prev]
    head_ptr,  # [V, R_k] weight dtype (W2)
    cache_ptr,  # [S, N, V] cache dtype
    idx_ptr,  # [R * N] slot per (row, step), -1 = padding
    pos_ptr,  # [R * N] position each sample predicts
    temp_ptr,  # [S] fp32
    seed_ptr,  # [S] int64
    part_val_ptr,  # [max_rows, num_tiles] fp32: Gumbel key max, or argmax value of z
    part_idx_ptr,  # [max_rows, num_tiles] int32: its first index
    part_max_ptr,  # [max_rows, num_tiles] fp32: max of z / T (inverse CDF only)
    part_sum_ptr,  # [max_rows, num_tiles] fp32: sum exp(z / T - max) (inverse CDF only)
    num_rows,
    vocab,
    num_slots,
    step,
    num_steps,
    num_tiles,
    stride_br,
    stride_bn,
    stride_cs,
    scale,
    filter_margin,
    RK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SCALED: tl.constexpr,
    INVERSE_CDF: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    HARDWARE_LOG2: tl.constexpr,
):
    # Row chunks vary fastest in launch order, so the programs sharing a W2 tile run together and
    # all but the first read it from L2: W2 comes from HBM about once per step at any batch size.
    chunk = tl.program_id(0)
    tile = tl.program_id(1)
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
    rows = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    acc = tl.zeros((BLOCK_R, BLOCK_V), dtype=tl.float32)
    for k in tl.range(0, RK, BLOCK_K, num_stages=NUM_STAGES):
        ks = k + tl.arange(0, BLOCK_K)
        codes = tl.load(codes_ptr + rows[:, None] * RK + ks[None, :], mask=row_ok[:, None], other=0.0)
        w_tile = tl.load(head_ptr + cols[:, None].to(tl.int64) * RK + ks[None, :], mask=col_ok[:, None],
                         other=0.0)
        if UPCAST:
            codes = codes.to(tl.float32)
            w_tile = w_tile.to(tl.float32)
        if IEEE_DOT:
            acc = tl.dot(codes, tl.trans(w_tile), acc, input_precision="ieee")
        else:
            acc = tl.dot(codes, tl.trans(w_tile), acc)
    w_dtype = head_ptr.dtype.element_ty
    bias = to_float32(round_to(acc, w_dtype))
    if SCALED:
        bias = to_float32(round_to(bias * scale, w_dtype))
    # Per-row keys: padding and out-of-range slots are greedy (T = 0, seed 0) and write nothing.
    sample = rows * num_steps + step
    live, safe_slot, temp, seed, position = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample,
                                                        row_ok, num_slots)
    mask = row_ok[:, None] & col_ok[None, :]
    base = tl.load(base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn + cols[None, :],
                   mask=mask, other=0.0)
    z = round_to(to_float32(base) + bias, cache_ptr.dtype.element_ty)  # one rounding (SPEC.md 3)
    cache_rows = cache_ptr + safe_slot * stride_cs + step * vocab
    tl.store(cache_rows[:, None] + cols[None, :], z, mask=live[:, None] & col_ok[None, :])
    logits = to_float32(z)
    greedy = temp == 0.0
    part = rows * num_tiles + tile
    if INVERSE_CDF:
        scaled = tl.math.div_rn(logits, tl.where(greedy, 1.0, temp)[:, None])
        value, index = block_argmax(logits, cols[None, :], mask, 1)
        clean = tl.where(mask & (scaled == scaled), scaled, float("-inf"))
        tile_max = tl.max(clean, axis=1)
        shift = tl.where(tile_max == float("-inf"), 0.0, tile_max)
        tile_sum = tl.sum(tl.exp(clean - shift[:, None]), axis=1)
        tl.store(part_max_ptr + part, tile_max, mask=row_ok)
        tl.store(part_sum_ptr + part, tile_sum, mask=row_ok)
    else:
        prefix = rng_triton.draft_prefix(seed, step, position)
        value, index = _gumbel_tile_argmax(logits, greedy, temp, prefix, mask, row_ok, cols[None, :],
                                           filter_margin, HARDWARE_LOG2)
    tl.store(part_val_ptr + part, value, mask=row_ok)
    tl.store(part_idx_ptr + part, index, mask=row_ok)


@triton.jit
def _combine_argmax(part_val_ptr, part_idx_ptr, row, num_tiles, BLOCK_T: tl.constexpr):
    """torch.argmax over a row's tile partials: ``(token, has NaN, best key)``."""
    tiles = tl.arange(0, BLOCK_T)
    ok = tiles < num_tiles
    value = tl.load(part_val_ptr + row * num_tiles + tiles, mask=ok, other=float("-inf"))
    index = tl.load(part_idx_ptr + row * num_tiles + tiles, mask=ok, other=0)
    # Tile partials are in vocabulary order, so the first index among ties is the first tile's.
    best, token = block_argmax(value, index, ok)
    has_nan = best != best
    return token, has_nan, best


@triton.jit(do_not_specialize=["step"])
def _combine_kernel(
    part_val_ptr,  # [max_rows, num_tiles] fp32
    part_idx_ptr,  # [max_rows, num_tiles] int32
    part_max_ptr,  # [max_rows, num_tiles] fp32 (inverse CDF)
    part_sum_ptr,  # [max_rows, num_tiles] fp32 (inverse CDF)
    cache_ptr,  # [S, N, V] cache dtype (inverse CDF re-reads the chosen tile)
    idx_ptr,  # [R * N]
    pos_ptr,  # [R * N]
    temp_ptr,  # [S] fp32
    seed_ptr,  # [S] int64
    embed_ptr,  # [V_t, R_k] weight dtype
    codes_ptr,  # [max_rows, R_k] weight dtype, output: next step's codes
    tokens_ptr,  # [R, N] int64 output, row stride stride_tr
    vocab,
    embed_rows,
    num_slots,
    step,
    num_steps,
    num_tiles,
    stride_tr,
    stride_cs,
    RK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    INVERSE_CDF: tl.constexpr,
):
    """Token of one row from its tile partials; writes it and the next codes row.

    Moves ``num_tiles * 8`` (+ ``num_tiles * 8 + BLOCK_V * c`` for inverse CDF) ``+ 2 R_k w``
    bytes per row.
    """
    row = tl.program_id(0)
    token, has_nan, best = _combine_argmax(part_val_ptr, part_idx_ptr, row, num_tiles, BLOCK_T)
    if INVERSE_CDF:
        sample = row * num_steps + step
        slot = tl.load(idx_ptr + sample).to(tl.int64)
        live = (slot >= 0) & (slot < num_slots)
        safe_slot = tl.where(live, slot, 0)
        temp = tl.where(live, tl.load(temp_ptr + safe_slot), 0.0)
        sampled = (temp > 0.0) & (has_nan == 0) & (best < float("inf")) & (best > float("-inf"))
        if sampled:
            seed = tl.load(seed_ptr + safe_slot)
            position = tl.load(pos_ptr + sample).to(tl.int64)
            prefix = rng_triton.draft_prefix(seed, step, position)
            u = rng_triton.uniform32(rng_triton.hash_finish(prefix, tl.full([], 0xFFFFFFFF, tl.uint32)))
            tiles = tl.arange(0, BLOCK_T)
            ok = tiles < num_tiles
            tile_max = tl.load(part_max_ptr + row * num_tiles + tiles, mask=ok, other=float("-inf"))
            tile_sum = tl.load(part_sum_ptr + row * num_tiles + tiles, mask=ok, other=0.0)
            row_max = tl.max(tile_max, axis=0)
            mass = tl.where(tile_sum > 0.0, tile_sum * tl.exp(tile_max - row_max), 0.0)
            cumulative = tl.cumsum(mass, axis=0)
            target = u * tl.sum(mass, axis=0)
            beyond = (cumulative > target) & ok
            last_positive = tl.max(tl.where(mass > 0.0, tiles, -1), axis=0)
            chosen = tl.where(tl.max(beyond.to(tl.int32), axis=0) > 0,
                              tl.min(tl.where(beyond, tiles, _INT_MAX), axis=0), last_positive)
            before = tl.sum(tl.where(tiles < chosen, mass, 0.0), axis=0)
            remaining = target - before
            cols = chosen * BLOCK_V + tl.arange(0, BLOCK_V)
            col_ok = cols < vocab
            z = tl.load(cache_ptr + safe_slot * stride_cs + step * vocab + cols, mask=col_ok, other=0.0)
            scaled = tl.math.div_rn(z.to(tl.float32), temp)
            weight = tl.where(col_ok & (scaled == scaled), tl.exp(scaled - row_max), 0.0)
            inner = tl.cumsum(weight, axis=0)
            hit = (inner > remaining) & col_ok
            last_col = tl.max(tl.where(weight > 0.0, cols, -1), axis=0)
            picked = tl.where(tl.max(hit.to(tl.int32), axis=0) > 0, tl.min(tl.where(hit, cols, _INT_MAX), axis=0),
                              last_col)
            token = tl.where(picked >= 0, picked, token)
    token = tl.minimum(tl.maximum(token, 0), vocab - 1).to(tl.int64)
    tl.store(tokens_ptr + row * stride_tr + step, token)
    ks = tl.arange(0, RK)
    safe = tl.minimum(token, embed_rows - 1)
    tl.store(codes_ptr + row * RK + ks, tl.load(embed_ptr + safe * RK + ks))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class FusedBackend:
    """One fused sampling launch + one combine launch per step (both methods).

    Scratch (allocated once): codes ``[max_rows, R_k]`` and four partial buffers
    ``[max_rows, ceil(V / BLOCK_V)]``. ``run`` allocates nothing and is CUDA-graph safe.
    """

    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, method, cache_dtype, device, *, block_v=None, block_r=None,
                 num_warps=None, num_stages=None, filter_margin=FILTER_MARGIN):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'fused' needs a power-of-two rank >= 16, got {head.rank}")
        self.head = head
        self.method = method
        self.filter_margin = float(filter_margin)  # a huge margin forces the exact path (tests)
        interpret = INTERPRET or torch.device(device).type == "cpu"
        self.interpret = interpret
        self.upcast = interpret or head.dtype == torch.float32
        # Launch shapes measured on the H200 (tools/sweep_fused.py): small batches want wide vocabulary
        # tiles and few rows per program; large ones more rows per program so that W2 is re-read
        # from L2 fewer times. (A CUDA-core GEMV path for 1-2 rows, which skips the 16-row tensor-core
        # tile, measured slower: 227 vs ~175 us at 1 row, 379 us at 2; so every batch uses tl.dot.)
        if interpret:
            default = (64, 16, 4)
        elif max_rows <= 16:
            default = (128, 16, 4)
        elif max_rows <= 64:
            default = (64, 32, 4)
        else:
            default = (64, 64, 8)
        self.block_v = block_v or default[0]
        self.block_r = block_r or default[1]
        self.num_warps = num_warps or default[2]
        self.num_stages = num_stages or 3
        check_power_of_two("block_r", self.block_r, 16)  # a tl.dot tile
        self.block_k = min(64, head.rank)
        vocab = head.vocab_size
        self.num_tiles = triton.cdiv(vocab, self.block_v)
        self.block_t = max(16, _next_pow2(self.num_tiles))
        if self.block_t > 8192:
            raise ValueError(f"head_weight: V = {vocab} needs {self.num_tiles} tiles of {self.block_v}; "
                             "pass a larger block_v")
        shape = (max_rows, self.num_tiles)
        self.codes = torch.empty(max_rows, head.rank, dtype=head.dtype, device=device)
        self.part_val = torch.empty(shape, dtype=torch.float32, device=device)
        self.part_idx = torch.empty(shape, dtype=torch.int32, device=device)
        inverse = method == "inverse_cdf"
        self.part_max = torch.empty(shape if inverse else (1, 1), dtype=torch.float32, device=device)
        self.part_sum = torch.empty(shape if inverse else (1, 1), dtype=torch.float32, device=device)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        head = self.head
        rows, steps, vocab = base_logits.shape
        inverse = self.method == "inverse_cdf"
        common = dict(enable_fp_fusion=False)
        _gather_codes_kernel[(rows,)](anchor, head.embed_weight, self.codes, head.embed_vocab_size, RK=head.rank,
                                      **common)
        for step in range(steps):
            _fused_step_kernel[(triton.cdiv(rows, self.block_r), self.num_tiles)](
                base_logits, self.codes, head.head_weight, logits_cache, idx_mapping, positions, temperature, seeds,
                self.part_val, self.part_idx, self.part_max, self.part_sum,
                rows, vocab, temperature.shape[0], step, steps, self.num_tiles,
                base_logits.stride(0), base_logits.stride(1), logits_cache.stride(0), head.scale, self.filter_margin,
                RK=head.rank, BLOCK_V=self.block_v, BLOCK_R=self.block_r, BLOCK_K=self.block_k,
                NUM_STAGES=self.num_stages, SCALED=head.scale != 1.0,
                INVERSE_CDF=inverse, UPCAST=self.upcast, IEEE_DOT=head.dtype == torch.float32,
                HARDWARE_LOG2=not self.interpret,
                num_warps=self.num_warps, **common)
            _combine_kernel[(rows,)](
                self.part_val, self.part_idx, self.part_max, self.part_sum, logits_cache, idx_mapping, positions,
                temperature, seeds, head.embed_weight, self.codes, draft_tokens,
                vocab, head.embed_vocab_size, temperature.shape[0], step, steps, self.num_tiles,
                draft_tokens.stride(0), logits_cache.stride(0),
                RK=head.rank, BLOCK_T=self.block_t, BLOCK_V=self.block_v, INVERSE_CDF=inverse,
                num_warps=4, **common)
