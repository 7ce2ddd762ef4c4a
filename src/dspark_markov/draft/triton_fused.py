"""``impl="fused"``: one sampling launch per step with the bias computed on tensor cores.

Per step, :func:`_fused_step_kernel` runs one program per (chunk of ``BLOCK_R`` request rows,
tile of ``BLOCK_V`` vocabulary entries), row chunks varying fastest so that the programs sharing a
W2 tile run together and read it from L2 after the first. Each computes
``bias = codes @ W2_tile^T`` with ``tl.dot`` over a pipelined K loop (fp32 accumulation, rounded
once to the weight dtype), adds the base logits, writes the cache and reduces its tile to one
partial per row: the Gumbel key maximum and its first index (``method="gumbel"``, ranked first by
approximate noise, :mod:`dspark_markov.ops.filter`), or the argmax, the max and the exp-sum of ``z / T``
(``method="inverse_cdf"``). A small combine kernel (one program per row) then picks the row's token
from the partials with torch.argmax semantics (or by inverse CDF over tile masses, then inside the
chosen tile), writes ``draft_tokens[:, step]`` and gathers the next step's code row ``W1[token]``.
The bias never goes to memory.

Reduced vocabulary (``head.d2t``, Gumbel): the tiles run over the draft vocabulary and scatter their
``z`` to the target ids in the cache, with target ids as keys and argmax indices; one extra launch
per call (:func:`_fill_unmapped_kernel`) writes ``-inf`` at the unmapped target ids of every live
cache row (``R N (V_t - V_d) c`` bytes).

Bytes per step: ``V * R_k * w`` of W2 from HBM (plus ``ceil(R / BLOCK_R) - 1`` re-reads from L2),
``R * V * u`` of base logits read, ``R * V * c`` of cache written, ``R * ceil(V / BLOCK_V) * 8`` of
partials written and read back; the codes (``R * R_k * w``) are re-read from L2 by every tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import pick
from ..ops.filter import FILTER_MARGIN, filtered_argmax
from ..ops.noise import INTERPRET, draft_prefix, inverse_cdf_uniform
from ..ops.numerics import biased_logits, block_argmax, round_to, row_token, to_float32, weight_bias
from ..ops.rows import draft_rows, gather_code, sample_slot, slot_seed, slot_temperature
from ..validate import check_power_of_two


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
    gather_code(embed_ptr, RK, tl.load(anchor_ptr + row), embed_rows, codes_ptr + row * RK, RK, RK)


@triton.jit
def _fill_unmapped_kernel(
    fill_ptr,  # [V_t - V_d] int32: the target ids no draft id maps to
    idx_ptr,  # [R * N]
    cache_ptr,  # [S, N, V_t] cache dtype
    num_fill,
    num_steps,
    num_slots,
    cache_vocab,
    stride_cs,
    BLOCK: tl.constexpr,
):
    """-inf at the unmapped target ids of one live sample's cache row (d2t). Writes ``BLOCK c`` bytes."""
    sample = tl.program_id(0).to(tl.int64)
    live, slot = sample_slot(idx_ptr, sample, num_slots)
    if live:
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = j < num_fill
        cols = tl.load(fill_ptr + j, mask=ok, other=0)
        row_ptr = cache_ptr + slot * stride_cs + (sample % num_steps) * cache_vocab
        tl.store(row_ptr + cols, round_to(tl.full([BLOCK], float("-inf"), tl.float32), cache_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["step"])
def _fused_step_kernel(
    base_ptr,  # [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
    codes_ptr,  # [max_rows, R_k] weight dtype, this step's codes W1[prev]
    head_ptr,  # [V, R_k] weight dtype (W2)
    cache_ptr,  # [S, N, V] cache dtype ([S, N, V_t] with D2T)
    d2t_ptr,  # [V] int32 target id of each draft id (D2T only)
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
    cache_vocab,
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
    D2T: tl.constexpr,
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
    bias = weight_bias(round_to(acc, w_dtype), scale, w_dtype, SCALED)  # rounded once, again after scale
    # Per-row keys: padding and out-of-range slots are greedy (T = 0, seed 0) and write nothing.
    sample = rows * num_steps + step
    live, safe_slot, temp, seed, position = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample,
                                                        row_ok, num_slots)
    mask = row_ok[:, None] & col_ok[None, :]
    base = tl.load(base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn + cols[None, :],
                   mask=mask, other=0.0)
    z = biased_logits(base, bias, cache_ptr.dtype.element_ty)  # one rounding (SPEC.md 3)
    # A reduced vocabulary (README "Id spaces"): the tile's columns are scattered to their target
    # ids in the cache, and the keys and the argmax's index are target ids.
    if D2T:
        token_ids = tl.load(d2t_ptr + cols, mask=col_ok, other=0)
    else:
        token_ids = cols
    cache_rows = cache_ptr + safe_slot * stride_cs + step * cache_vocab
    tl.store(cache_rows[:, None] + token_ids[None, :], z, mask=live[:, None] & col_ok[None, :])
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
        prefix = draft_prefix(seed, step, position)
        value, index = filtered_argmax(logits, temp, prefix, token_ids[None, :], mask, filter_margin, 1,
                                       HARDWARE_LOG2)
    tl.store(part_val_ptr + part, value, mask=row_ok)
    tl.store(part_idx_ptr + part, index, mask=row_ok)


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

    The inverse-CDF draw is :mod:`dspark_markov.ops.pick`, shared with ``impl="inverse_cdf"``. (Until
    the ``ops/`` restructuring this kernel had its own copy: token weights relative to the row max,
    bf16 widened by a plain cast, no positive-weight guard on the scans, and the draw test on the
    max of ``z`` instead of ``z / T``. Its T > 0 inverse-CDF tokens can therefore differ from
    earlier versions where a uniform falls on a rounding boundary, and a row whose ``z / T``
    overflows is now greedy, as the reference has it. Greedy and Gumbel tokens are unchanged.)

    Moves ``num_tiles * 8`` (+ ``num_tiles * 8 + BLOCK_V * c`` for inverse CDF) ``+ 2 R_k w``
    bytes per row.
    """
    row = tl.program_id(0)
    tiles = tl.arange(0, BLOCK_T)
    ok = tiles < num_tiles
    value = tl.load(part_val_ptr + row * num_tiles + tiles, mask=ok, other=float("-inf"))
    index = tl.load(part_idx_ptr + row * num_tiles + tiles, mask=ok, other=0)
    # block_argmax takes the lowest index among equal maxima: the row's first maximum (in target-id
    # order with a d2t table, whose tiles are not ordered by target id).
    best, token = block_argmax(value, index, ok)
    token = row_token(best, token)
    if INVERSE_CDF:
        sample = row * num_steps + step
        live, slot = sample_slot(idx_ptr, sample, num_slots)
        temp = slot_temperature(temp_ptr, slot, live)
        tile_max = tl.load(part_max_ptr + row * num_tiles + tiles, mask=ok, other=float("-inf"))
        tile_sum = tl.load(part_sum_ptr + row * num_tiles + tiles, mask=ok, other=0.0)
        row_max = tl.max(tile_max, axis=0)
        if pick.draws(live, temp, best != best, row_max):
            seed = slot_seed(seed_ptr, slot, live)
            position = tl.load(pos_ptr + sample).to(tl.int64)
            u = inverse_cdf_uniform(draft_prefix(seed, step, position))
            chosen, remaining, chosen_scale, chosen_max = pick.pick_block(tile_max, tile_sum, ok, row_max, u,
                                                                          BLOCK_T)
            cols = chosen * BLOCK_V + tl.arange(0, BLOCK_V)
            col_ok = cols < vocab
            z = to_float32(tl.load(cache_ptr + slot * stride_cs + step * vocab + cols, mask=col_ok, other=0.0))
            picked = pick.pick_token(z, temp, cols, col_ok, chosen_scale, chosen_max, remaining, vocab)
            token = tl.where(picked >= 0, picked, token)
    token = tl.minimum(tl.maximum(token, 0), vocab - 1).to(tl.int64)
    tl.store(tokens_ptr + row * stride_tr + step, token)
    gather_code(embed_ptr, RK, token, embed_rows, codes_ptr + row * RK, RK, RK)


class FusedBackend:
    """One fused sampling launch + one combine launch per step (both methods).

    Scratch (allocated once): codes ``[max_rows, R_k]`` and four partial buffers
    ``[max_rows, ceil(V / BLOCK_V)]``. ``run`` allocates nothing and is CUDA-graph safe.
    """

    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None
    D2T = True  # a reduced draft vocabulary (Gumbel): cache columns and keys by target id

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block_v=None, block_r=None,
                 num_warps=None, num_stages=None, filter_margin=FILTER_MARGIN):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'fused' needs a power-of-two rank >= 16, got {head.rank}")
        self.reduced = head.d2t_index is not None
        if self.reduced and method != "gumbel":
            raise ValueError(f"method: impl 'fused' with a reduced vocabulary (d2t) draws 'gumbel', got {method!r}; "
                             "use impl='reference'")
        # README "Id spaces": the tiles' target ids [V_d], and the ids no draft id maps to [V_t - V_d] (-inf)
        self.d2t, self.fill = head.id_tables(device)
        self.fill_block = 1024
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
        self.block_t = max(16, triton.next_power_of_2(self.num_tiles))
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
        cache_vocab = head.cache_vocab_size
        if self.reduced and self.fill.numel() > 0:  # [R * N, fill tiles]: -inf outside the mapped ids
            _fill_unmapped_kernel[(rows * steps, triton.cdiv(self.fill.numel(), self.fill_block))](
                self.fill, idx_mapping, logits_cache, self.fill.numel(), steps, temperature.shape[0], cache_vocab,
                logits_cache.stride(0), BLOCK=self.fill_block, **common)
        for step in range(steps):
            _fused_step_kernel[(triton.cdiv(rows, self.block_r), self.num_tiles)](
                base_logits, self.codes, head.head_weight, logits_cache, self.d2t, idx_mapping, positions, temperature,
                seeds,
                self.part_val, self.part_idx, self.part_max, self.part_sum,
                rows, vocab, temperature.shape[0], step, steps, self.num_tiles,
                base_logits.stride(0), base_logits.stride(1), logits_cache.stride(0), cache_vocab, head.scale,
                self.filter_margin,
                RK=head.rank, BLOCK_V=self.block_v, BLOCK_R=self.block_r, BLOCK_K=self.block_k,
                NUM_STAGES=self.num_stages, SCALED=head.scale != 1.0,
                INVERSE_CDF=inverse, UPCAST=self.upcast, IEEE_DOT=head.dtype == torch.float32,
                HARDWARE_LOG2=not self.interpret, D2T=self.reduced,
                num_warps=self.num_warps, **common)
            _combine_kernel[(rows,)](
                self.part_val, self.part_idx, self.part_max, self.part_sum, logits_cache, idx_mapping, positions,
                temperature, seeds, head.embed_weight, self.codes, draft_tokens,
                cache_vocab, head.embed_vocab_size, temperature.shape[0], step, steps, self.num_tiles,
                draft_tokens.stride(0), logits_cache.stride(0),
                RK=head.rank, BLOCK_T=self.block_t, BLOCK_V=self.block_v, INVERSE_CDF=inverse,
                num_warps=4, **common)
