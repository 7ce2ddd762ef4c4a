"""Verification of Markov drafts as four Triton kernels (SPEC.md section 6), with persistent scratch.

The earlier design: ``verify_drafts(..., impl="triton")`` now runs the one-launch
:mod:`.triton_verify_stream` (2-2.3x faster on the H200, README); this one stays for comparison
(``tools/sweep_verify.py``) and for ``DSparkStep``, which still builds a :class:`Verifier`.

:class:`Verifier` owns every buffer (allocated once for a maximum batch, ``K`` and ``V``) and its
:meth:`Verifier.run` only launches kernels, so a verification step can be captured in a CUDA
graph and replayed with new inputs.

Kernels, in launch order, over a chunk of at most ``chunk`` requests (so the scratch stays
bounded whatever the batch):

1. ``_stats_kernel`` — grid ``(chunk * (K+1), cdiv(V, BLOCK))``: per (request, row, vocabulary
   block) the block's max and sum of ``exp(x - max)`` and its ``(max, first index)`` argmax, for the
   target row ``j <= n`` and for the draft row ``cache[slot, j] / T`` (``j < n``);
2. ``_accept_kernel`` — one program per request: combines the partials into each row's max and
   normaliser, computes ``p_j(x_j)``, ``q_j(x_j)``, the ratios, the acceptance uniforms, the
   standard (or greedy) accepted count and the block-verification weights ``w``;
3. ``_mass_kernel`` and ``_block_count_kernel`` (``method="block"`` only) — the residual masses
   ``sum_v max(w_i p_i(v) - q_i(v), 0)`` per block, then the block-verification count;
4. ``_resample_kernel`` — grid ``(chunk, cdiv(V, BLOCK))``: the Gumbel keys of the emitted row,
   ``log(max(w p - q, 0)) + g`` (residual) and ``logits + g`` (bonus), and their block argmaxes;
5. ``_emit_kernel`` — one program per request: the emitted token and the output row.

Agreement with :func:`~dspark_markov.verify.reference.verify_reference` on the same keys
-----------------------------------------------------------------------------------------
Bit-identical by construction: the keys (acceptance uniforms, resampling noise, through
``ops.noise``), greedy targets (accept/emit by ``argmax_first`` of the logits), the ``q`` of greedy
drafts (one-hot at the cache's ``argmax_first``), the bonus draw and the all-zero-residual fallback
(Gumbel-max over the logits themselves: ``logits + g`` is one fp32 addition in both), the output
layout, padding and ``K = 0``. The bonus token is therefore always the reference's once the accepted
count agrees.

Equal except at last-bit near-ties: the reference forms ``p = softmax(logits)`` and
``q = softmax(cache / T)`` with torch's ``exp`` and summation order; these kernels use ``tl.exp``
(an approximation on the GPU) and a blockwise summation, so ``p``, ``q``, the ratio
``p(x)/q(x)``, the residual ``max(w p - q, 0)``, its ``log`` and the block masses can differ from the
reference in the last bits. A decision then differs only when

- an acceptance test ``u_i < p_i(x_i)/q_i(x_i)`` (or ``u_i < h_i`` of block verification) has
  ``u_i`` within a few ulps of the threshold (probability about ``1e-6`` per test), or
- the two largest residual keys ``log r(v) + g(v)`` are within a few ulps of each other, or a
  residual entry is so close to zero that its sign depends on rounding (``p(v) ~ q(v)`` to the
  last bit, e.g. when target and draft distributions coincide; such entries hold ``O(ulp)`` mass,
  so they are drawn with probability of order ``1e-7``).

The tests therefore check exact equality on random inputs (where such ties have negligible
probability) and the target distribution statistically. Neither path is more correct than the
other: both are within fp32 rounding of the exact rejection sampler.

Every launch passes ``enable_fp_fusion=False`` (the noise is bit-exact only without FMA
contraction). Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import noise
from ..ops.numerics import block_argmax, combine_blocks, to_float32
from ..validate import check_power_of_two
from . import keys
from .run_start import start_run

GPU_BLOCK = 2048  # 64 blocks per row at V = 129,280 (8 warps, 8 values per thread)
CPU_BLOCK = 256  # the interpreter: several blocks per row at test sizes
GPU_CHUNK = 512  # requests per launch on the GPU (scratch O(chunk * K * V / BLOCK))
CPU_CHUNK = 16

_ACCEPT_DOMAIN = tl.constexpr(keys.ACCEPT_DOMAIN)
_RESAMPLE_DOMAIN = tl.constexpr(keys.RESAMPLE_DOMAIN)


def default_block(device) -> int:
    """The vocabulary block size of the verification kernels on ``device``."""
    return GPU_BLOCK if torch.device(device).type == "cuda" else CPU_BLOCK


# --------------------------------------------------------------------------- device functions
@triton.jit
def _request(idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
             greedy_stride, b, num_slots, K: tl.constexpr, HAS_GREEDY: tl.constexpr):
    """``(live, slot, T, seed, n, position, greedy)`` of request ``b``.

    Slots outside ``[0, num_slots)`` are padding: slot 0, T = 0, seed 0, n = 0. ``n`` is clamped
    into ``[0, K]`` so no row outside the inputs is ever read.
    """
    slot = tl.load(idx_ptr + b * idx_stride).to(tl.int64)
    live = (slot >= 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0)
    temp = tl.load(temp_ptr + slot, mask=live, other=0.0)
    seed = tl.load(seeds_ptr + slot, mask=live, other=0)
    n = tl.load(nd_ptr + b * nd_stride).to(tl.int32)
    n = tl.where(live, tl.minimum(tl.maximum(n, 0), K), 0)
    position = tl.load(pos_ptr + b * pos_stride).to(tl.int64)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b * greedy_stride) != 0
    else:
        greedy = temp == 0.0
    return live, slot, temp, seed, n, position, greedy


@triton.jit
def _softmax_block(x, valid):
    """``(max, sum exp(x - max))`` of fp32 ``x`` over ``valid`` lanes (an all ``-inf`` block: -inf, 0)."""
    x = tl.where(valid, x, float("-inf"))
    m = tl.max(x, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(tl.where(valid, tl.exp(x - shift), 0.0), axis=0)


@triton.jit
def _combine_softmax(block_max, block_sum):
    """Row ``(max, normaliser)`` from per-block ``(max, sum exp(x - block max))`` partials."""
    m = tl.max(block_max, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(block_sum * tl.exp(block_max - shift), axis=0)


@triton.jit
def _prob(x, row_max, row_sum):
    """``exp(x - max) / sum`` in fp32 (IEEE division), the softmax entry of logit ``x``."""
    return tl.math.div_rn(tl.exp(x - row_max), row_sum)


@triton.jit
def _draft_prob(c, token, temp, q_max, q_sum, q_argmax):
    """``q(v)`` of cached logits ``c`` (fp32): softmax of ``c / T``, or one-hot at the argmax if T == 0."""
    safe_temp = tl.where(temp == 0.0, 1.0, temp)
    soft = _prob(tl.math.div_rn(c, safe_temp), q_max, q_sum)
    return tl.where(temp == 0.0, tl.where(token == q_argmax, 1.0, 0.0), soft)


# --------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["first", "num_slots"])
def _stats_kernel(
    target_ptr, t_req_stride, t_row_stride,  # [B, K+1, V] fp32
    cache_ptr, c_slot_stride, c_step_stride,  # [S, N, V] bf16/fp32
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8 (read when HAS_GREEDY)
    t_max_ptr, t_sum_ptr, t_val_ptr, t_tok_ptr,  # [chunk, K+1, NB] fp32, fp32, fp32, int32
    q_max_ptr, q_sum_ptr, q_val_ptr, q_tok_ptr,  # [chunk, KQ, NB] fp32, fp32, fp32, int32
    first, vocab, num_blocks,
    K: tl.constexpr, KQ: tl.constexpr, BLOCK: tl.constexpr, HAS_GREEDY: tl.constexpr,
):
    pid = tl.program_id(0)
    block = tl.program_id(1)
    local = pid // (K + 1)
    j = pid % (K + 1)
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    if live & (j <= n):
        token = block * BLOCK + tl.arange(0, BLOCK)
        valid = token < vocab
        x = tl.load(target_ptr + b * t_req_stride + j * t_row_stride + token, mask=valid, other=float("-inf"))
        m, s = _softmax_block(x, valid)
        val, tok = block_argmax(x, token, valid)
        out = (local * (K + 1) + j) * num_blocks + block
        tl.store(t_max_ptr + out, m)
        tl.store(t_sum_ptr + out, s)
        tl.store(t_val_ptr + out, val)
        tl.store(t_tok_ptr + out, tok)
        if j < n:  # the draft row of draft j (n <= K, so j < K)
            c = to_float32(tl.load(cache_ptr + slot * c_slot_stride + j * c_step_stride + token, mask=valid,
                                   other=0.0))
            val, tok = block_argmax(c, token, valid)
            safe_temp = tl.where(temp == 0.0, 1.0, temp)
            m, s = _softmax_block(tl.math.div_rn(c, safe_temp), valid)
            out = (local * KQ + j) * num_blocks + block
            tl.store(q_max_ptr + out, m)
            tl.store(q_sum_ptr + out, s)
            tl.store(q_val_ptr + out, val)
            tl.store(q_tok_ptr + out, tok)


@triton.jit(do_not_specialize=["first", "num_slots"])
def _accept_kernel(
    target_ptr, t_req_stride, t_row_stride,  # [B, K+1, V] fp32
    drafts_ptr, d_req_stride, d_step_stride,  # [B, K] int32/int64
    cache_ptr, c_slot_stride, c_step_stride,  # [S, N, V] bf16/fp32
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8
    t_max_ptr, t_sum_ptr, t_val_ptr, t_tok_ptr,  # [chunk, K+1, NB] partials
    q_max_ptr, q_sum_ptr, q_val_ptr, q_tok_ptr,  # [chunk, KQ, NB] partials
    row_t_ptr, row_q_ptr,  # [chunk, K+1, 2] / [chunk, KQ, 2] fp32: each row's (max, normaliser)
    arg_t_ptr, arg_q_ptr,  # [chunk, K+1] / [chunk, KQ] int32: argmax_first of each target / cache row
    weights_ptr,  # [chunk, K+1] fp32 block-verification weights w
    accepted_ptr,  # [chunk] int32
    first, vocab, num_blocks,
    K: tl.constexpr, KQ: tl.constexpr, PARTIALS: tl.constexpr, HAS_GREEDY: tl.constexpr,
):
    local = tl.program_id(0)
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    index = tl.arange(0, PARTIALS)
    in_row = index < num_blocks
    prefix = noise.hash_prefix(seed, position - 1, _ACCEPT_DOMAIN)
    run_std = live
    run_greedy = live
    count_std = 0
    count_greedy = 0
    w = 1.0
    tl.store(weights_ptr + local * (K + 1), w)
    for j in tl.static_range(K + 1):
        row_ok = index < tl.where(live & (n >= j), num_blocks, 0)  # vector & scalar-bool masks
        part = (local * (K + 1) + j) * num_blocks + index
        t_max, t_sum = _combine_softmax(tl.load(t_max_ptr + part, mask=row_ok, other=float("-inf")),
                                        tl.load(t_sum_ptr + part, mask=row_ok, other=0.0))
        t_arg = combine_blocks(tl.load(t_val_ptr + part, mask=row_ok, other=float("-inf")),
                               tl.load(t_tok_ptr + part, mask=row_ok, other=0), in_row, vocab)
        row = (local * (K + 1) + j) * 2
        tl.store(row_t_ptr + row, t_max)
        tl.store(row_t_ptr + row + 1, t_sum)
        tl.store(arg_t_ptr + local * (K + 1) + j, t_arg)
        if j < K:
            draft_ok = live & (n > j)
            q_ok = index < tl.where(draft_ok, num_blocks, 0)
            qpart = (local * KQ + j) * num_blocks + index
            q_max, q_sum = _combine_softmax(
                tl.load(q_max_ptr + qpart, mask=q_ok, other=float("-inf")),
                tl.load(q_sum_ptr + qpart, mask=q_ok, other=0.0))
            q_arg = combine_blocks(tl.load(q_val_ptr + qpart, mask=q_ok, other=float("-inf")),
                                   tl.load(q_tok_ptr + qpart, mask=q_ok, other=0), in_row, vocab)
            qrow = (local * KQ + j) * 2
            tl.store(row_q_ptr + qrow, q_max)
            tl.store(row_q_ptr + qrow + 1, q_sum)
            tl.store(arg_q_ptr + local * KQ + j, q_arg)
            x = tl.load(drafts_ptr + b * d_req_stride + j * d_step_stride, mask=draft_ok, other=0).to(tl.int64)
            x = tl.minimum(tl.maximum(x, 0), vocab - 1)
            p_x = _prob(tl.load(target_ptr + b * t_req_stride + j * t_row_stride + x), t_max, t_sum)
            c_x = to_float32(tl.load(cache_ptr + slot * c_slot_stride + j * c_step_stride + x))
            q_x = _draft_prob(c_x, x, temp, q_max, q_sum, q_arg.to(tl.int64))
            ratio = tl.where(q_x > 0.0, tl.math.div_rn(p_x, tl.where(q_x > 0.0, q_x, 1.0)), 0.0)
            u = noise.uniform32(noise.hash_finish(prefix, tl.full([], j, tl.int32)))
            run_std = run_std & draft_ok & (u < ratio)
            count_std += run_std.to(tl.int32)
            run_greedy = run_greedy & draft_ok & (x == t_arg.to(tl.int64))
            count_greedy += run_greedy.to(tl.int32)
            product = w * ratio
            w = tl.where(product < 1.0, product, 1.0)  # clamp_max(., 1) (a NaN product stays NaN)
            tl.store(weights_ptr + local * (K + 1) + j + 1, w)
    tl.store(accepted_ptr + local, tl.where(greedy, count_greedy, count_std))


@triton.jit(do_not_specialize=["first", "num_slots"])
def _mass_kernel(
    target_ptr, t_req_stride, t_row_stride,  # [B, K+1, V] fp32
    cache_ptr, c_slot_stride, c_step_stride,  # [S, N, V] bf16/fp32
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8
    row_t_ptr, row_q_ptr, arg_q_ptr,  # [chunk, K+1, 2] fp32, [chunk, KQ, 2] fp32, [chunk, KQ] int32
    weights_ptr,  # [chunk, K+1] fp32
    mass_ptr,  # [chunk, KQ, NB] fp32 partial residual masses (rows 1..K-1)
    first, vocab, num_blocks,
    K: tl.constexpr, KQ: tl.constexpr, BLOCK: tl.constexpr, HAS_GREEDY: tl.constexpr,
):
    pid = tl.program_id(0)  # local * (K - 1) + (i - 1)
    block = tl.program_id(1)
    local = pid // (K - 1)
    i = pid % (K - 1) + 1
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    if live & (i < n) & ~greedy:
        token = block * BLOCK + tl.arange(0, BLOCK)
        valid = token < vocab
        row = (local * (K + 1) + i) * 2
        qrow = (local * KQ + i) * 2
        w = tl.load(weights_ptr + local * (K + 1) + i)
        x = tl.load(target_ptr + b * t_req_stride + i * t_row_stride + token, mask=valid, other=float("-inf"))
        p = _prob(x, tl.load(row_t_ptr + row), tl.load(row_t_ptr + row + 1))
        c = to_float32(tl.load(cache_ptr + slot * c_slot_stride + i * c_step_stride + token, mask=valid, other=0.0))
        q_arg = tl.load(arg_q_ptr + local * KQ + i)
        q = _draft_prob(c, token, temp, tl.load(row_q_ptr + qrow), tl.load(row_q_ptr + qrow + 1), q_arg)
        d = w * p - q
        tl.store(mass_ptr + (local * KQ + i) * num_blocks + block,
                 tl.sum(tl.where(valid & (d > 0.0), d, 0.0), axis=0))


@triton.jit(do_not_specialize=["first", "num_slots"])
def _block_count_kernel(
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8
    weights_ptr, mass_ptr, accepted_ptr,  # [chunk, K+1] fp32, [chunk, KQ, NB] fp32, [chunk] int32
    first, num_blocks,
    K: tl.constexpr, KQ: tl.constexpr, PARTIALS: tl.constexpr, HAS_GREEDY: tl.constexpr,
):
    local = tl.program_id(0)
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    if live & ~greedy:
        prefix = noise.hash_prefix(seed, position - 1, _ACCEPT_DOMAIN)
        index = tl.arange(0, PARTIALS)
        count = 0
        for i in tl.static_range(1, K + 1):
            w = tl.load(weights_ptr + local * (K + 1) + i)
            if i < K:
                mass = tl.sum(tl.load(mass_ptr + (local * KQ + i) * num_blocks + index,
                                      mask=index < tl.where(n > i, num_blocks, 0), other=0.0), axis=0)
                h_inner = tl.where(mass > 0.0, tl.math.div_rn(mass, mass + (1.0 - w)), 0.0)
            else:
                h_inner = 0.0
            h = tl.where(n == i, w, tl.where(n > i, h_inner, 0.0))
            u = noise.uniform32(noise.hash_finish(prefix, tl.full([], i - 1, tl.int32)))
            count = tl.where(u < h, i, count)
        tl.store(accepted_ptr + local, count)


@triton.jit(do_not_specialize=["first", "num_slots"])
def _resample_kernel(
    target_ptr, t_req_stride, t_row_stride,  # [B, K+1, V] fp32
    cache_ptr, c_slot_stride, c_step_stride,  # [S, N, V] bf16/fp32
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8
    row_t_ptr, row_q_ptr, arg_q_ptr,  # [chunk, K+1, 2] fp32, [chunk, KQ, 2] fp32, [chunk, KQ] int32
    weights_ptr, accepted_ptr,  # [chunk, K+1] fp32, [chunk] int32
    res_any_ptr, res_val_ptr, res_tok_ptr,  # [chunk, NB] int32, fp32, int32
    bonus_val_ptr, bonus_tok_ptr,  # [chunk, NB] fp32, int32
    first, vocab, num_blocks,
    K: tl.constexpr, KQ: tl.constexpr, BLOCK: tl.constexpr, HAS_GREEDY: tl.constexpr, BLOCK_METHOD: tl.constexpr,
):
    local = tl.program_id(0)
    block = tl.program_id(1)
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    if live & ~greedy:
        j = tl.minimum(tl.maximum(tl.load(accepted_ptr + local), 0), n)
        token = block * BLOCK + tl.arange(0, BLOCK)
        valid = token < vocab
        x = tl.load(target_ptr + b * t_req_stride + j * t_row_stride + token, mask=valid, other=float("-inf"))
        prefix = noise.hash_prefix(seed, position + j - 1, _RESAMPLE_DOMAIN)
        g = noise.gumbel32(noise.uniform32(noise.hash_finish(prefix, token)))
        val, tok = block_argmax(x + g, token, valid)
        out = local * num_blocks + block
        tl.store(bonus_val_ptr + out, val)
        tl.store(bonus_tok_ptr + out, tok)
        any_positive = tl.full([], 0, tl.int32)
        val = tl.full([], float("-inf"), tl.float32)
        tok = tl.full([], 0, tl.int32)
        if K > 0:
            if j < n:  # rejected at draft j (< K): the residual of row j
                row = (local * (K + 1) + j) * 2
                qrow = (local * KQ + j) * 2
                p = _prob(x, tl.load(row_t_ptr + row), tl.load(row_t_ptr + row + 1))
                c = to_float32(tl.load(cache_ptr + slot * c_slot_stride + j * c_step_stride + token, mask=valid,
                                       other=0.0))
                q_arg = tl.load(arg_q_ptr + local * KQ + j)
                q = _draft_prob(c, token, temp, tl.load(row_q_ptr + qrow), tl.load(row_q_ptr + qrow + 1), q_arg)
                if BLOCK_METHOD:  # block verification's residual max(w_j p_j - q_j, 0)
                    d = tl.load(weights_ptr + local * (K + 1) + j) * p - q
                else:
                    d = p - q
                residual = tl.where(valid & (d > 0.0), d, 0.0)  # clamp_min(., 0) with NaN -> 0
                any_positive = tl.max((residual > 0.0).to(tl.int32), axis=0)
                val, tok = block_argmax(tl.log(residual) + g, token, valid)
        tl.store(res_any_ptr + out, any_positive)
        tl.store(res_val_ptr + out, val)
        tl.store(res_tok_ptr + out, tok)


@triton.jit(do_not_specialize=["first", "num_slots"])
def _emit_kernel(
    drafts_ptr, d_req_stride, d_step_stride,  # [B, K] int32/int64
    idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride,  # [B] int
    temp_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    greedy_ptr, greedy_stride,  # [B] uint8
    arg_t_ptr, accepted_ptr,  # [chunk, K+1] int32, [chunk] int32
    res_any_ptr, res_val_ptr, res_tok_ptr, bonus_val_ptr, bonus_tok_ptr,  # [chunk, NB]
    tokens_ptr, tokens_stride, num_emitted_ptr,  # [B, K+1] int64, [B] int64
    first, vocab, num_blocks,
    K: tl.constexpr, PARTIALS: tl.constexpr, HAS_GREEDY: tl.constexpr,
):
    local = tl.program_id(0)
    b = (first + local).to(tl.int64)
    live, slot, temp, seed, n, position, greedy = _request(
        idx_ptr, idx_stride, nd_ptr, nd_stride, pos_ptr, pos_stride, temp_ptr, seeds_ptr, greedy_ptr,
        greedy_stride, b, num_slots, K, HAS_GREEDY)
    j = tl.minimum(tl.maximum(tl.load(accepted_ptr + local), 0), n)
    index = tl.arange(0, PARTIALS)
    part = local * num_blocks + index
    in_row = index < num_blocks
    use_residual = (j < n) & (tl.max(tl.load(res_any_ptr + part, mask=in_row, other=0), axis=0) > 0)
    val = tl.where(use_residual, tl.load(res_val_ptr + part, mask=in_row, other=float("-inf")),
                   tl.load(bonus_val_ptr + part, mask=in_row, other=float("-inf")))
    tok = tl.where(use_residual, tl.load(res_tok_ptr + part, mask=in_row, other=0),
                   tl.load(bonus_tok_ptr + part, mask=in_row, other=0))
    sampled = combine_blocks(val, tok, in_row, vocab)
    target_arg = tl.load(arg_t_ptr + local * (K + 1) + j)
    emitted = tl.where(greedy, tl.minimum(tl.maximum(target_arg, 0), vocab - 1), sampled).to(tl.int64)
    for c in tl.static_range(K + 1):
        if c < K:
            x = tl.load(drafts_ptr + b * d_req_stride + c * d_step_stride, mask=j > c, other=0).to(tl.int64)
            x = tl.minimum(tl.maximum(x, 0), vocab - 1)
        else:
            x = tl.full([], 0, tl.int64)
        out = tl.where(j > c, x, tl.where(j == c, emitted, -1))
        tl.store(tokens_ptr + b * tokens_stride + c, tl.where(live, out, -1))
    tl.store(num_emitted_ptr + b, tl.where(live, j + 1, 0).to(tl.int64))


# --------------------------------------------------------------------------- the verifier
class Verifier:
    """Verification with persistent scratch: :meth:`run` launches kernels only (CUDA-graph safe).

    Parameters
    ----------
    max_batch : the largest number of requests ``B`` a call may carry.
    num_drafts : ``K``, the drafts per request (``target_logits`` has ``K + 1`` rows).
    vocab_size : ``V``.
    device : where the buffers live (CUDA, or CPU with ``TRITON_INTERPRET=1``).
    block : vocabulary block of the kernels (default :func:`default_block`).
    chunk : requests per launch (default 512 on the GPU, 16 on the CPU); the scratch is
        ``O(chunk * (K + 1) * cdiv(V, block))`` words, independent of ``max_batch``.

    Attributes
    ----------
    tokens : ``[max_batch, K+1]`` int64, num_emitted : ``[max_batch]`` int64, the default outputs.
    """

    def __init__(self, max_batch: int, num_drafts: int, vocab_size: int, device, *, block: int | None = None,
                 chunk: int | None = None):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch: expected >= 1, got {max_batch}")
        if int(num_drafts) < 0:
            raise ValueError(f"num_drafts: expected K >= 0, got {num_drafts}")
        if int(vocab_size) < 1:
            raise ValueError(f"vocab_size: expected >= 1, got {vocab_size}")
        device = torch.device(device)
        self.device = device
        self.max_batch = int(max_batch)
        self.k = int(num_drafts)
        self.vocab = int(vocab_size)
        self.block = int(block) if block is not None else default_block(device)
        check_power_of_two("block", self.block, 16)
        default_chunk = GPU_CHUNK if device.type == "cuda" else CPU_CHUNK
        self.chunk = min(int(chunk) if chunk is not None else default_chunk, self.max_batch)
        if self.chunk < 1:
            raise ValueError(f"chunk: expected >= 1, got {chunk}")
        self.num_blocks = triton.cdiv(self.vocab, self.block)
        k1, kq, nb, c = self.k + 1, max(self.k, 1), self.num_blocks, self.chunk

        def f32(*shape):
            return torch.zeros(*shape, dtype=torch.float32, device=device)

        def i32(*shape):
            return torch.zeros(*shape, dtype=torch.int32, device=device)

        self.t_max, self.t_sum, self.t_val, self.t_tok = f32(c, k1, nb), f32(c, k1, nb), f32(c, k1, nb), i32(c, k1, nb)
        self.q_max, self.q_sum, self.q_val, self.q_tok = f32(c, kq, nb), f32(c, kq, nb), f32(c, kq, nb), i32(c, kq, nb)
        self.row_t, self.row_q = f32(c, k1, 2), f32(c, kq, 2)
        self.arg_t, self.arg_q = i32(c, k1), i32(c, kq)
        self.weights, self.accepted = f32(c, k1), i32(c)
        self.mass = f32(c, kq, nb)
        self.res_any, self.res_val, self.res_tok = i32(c, nb), f32(c, nb), i32(c, nb)
        self.bonus_val, self.bonus_tok = f32(c, nb), i32(c, nb)
        self._no_greedy = torch.zeros(1, dtype=torch.uint8, device=device)
        self.tokens = torch.full((self.max_batch, k1), -1, dtype=torch.int64, device=device)
        self.num_emitted = torch.zeros(self.max_batch, dtype=torch.int64, device=device)

    def run(self, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
            target_greedy=None, *, method: str = "standard", tokens=None, num_emitted=None):
        """Verify a batch (inputs as :func:`~dspark_markov.verify_drafts`, assumed validated).

        Parameters
        ----------
        target_logits : ``[B, K+1, V]`` fp32, last stride 1. draft_tokens : ``[B, K]`` int32/int64.
        logits_cache : ``[S, N >= K, V]`` bf16/fp32, last stride 1.
        num_drafts, idx_mapping, positions : ``[B]`` int32/int64. temperature ``[S]`` fp32,
        seeds ``[S]`` int64. target_greedy : ``[B]`` bool or None (greedy iff the slot's T == 0).
        method : ``"standard"`` or ``"block"``.
        tokens, num_emitted : outputs ``[B, K+1]`` int64 / ``[B]`` int64 (default: views of
            :attr:`tokens` / :attr:`num_emitted`).

        Returns ``(tokens, num_emitted)``. Allocates nothing and never synchronises: capture it in
        a CUDA graph and refill the inputs to replay. Out-of-range slots are padding, draft
        counts are clamped into ``[0, K]`` and draft tokens into ``[0, V)`` inside the kernels.

        Bytes per request: ``(n+1) V 4`` target + ``n V c`` cache read by the statistics, the same
        again by the residual pass (plus ``(K-1)`` rows by the block masses), ``O(K V / block)``
        scratch and ``(K+2) 8`` written, with ``c`` the cache element size.
        """
        batch, tokens, num_emitted, finished = start_run(self, target_logits, method, temperature, tokens,
                                                         num_emitted)
        if finished:
            return tokens, num_emitted
        vocab = self.vocab
        has_greedy = target_greedy is not None
        greedy = target_greedy.view(torch.uint8) if has_greedy else self._no_greedy
        greedy_stride = greedy.stride(0) if has_greedy else 0
        k, kq, nb = self.k, max(self.k, 1), self.num_blocks
        partials = triton.next_power_of_2(nb)
        warps = 8 if self.block >= 2048 else 4
        slots = temperature.shape[0]
        common = (idx_mapping, idx_mapping.stride(0), num_drafts, num_drafts.stride(0), positions, positions.stride(0),
                  temperature, seeds, slots, greedy, greedy_stride)
        target = (target_logits, target_logits.stride(0), target_logits.stride(1))
        cache = (logits_cache, logits_cache.stride(0), logits_cache.stride(1))
        drafts = (draft_tokens, draft_tokens.stride(0), draft_tokens.stride(1) if draft_tokens.dim() == 2 else 1)
        for first in range(0, batch, self.chunk):
            rows = min(self.chunk, batch - first)
            # Bytes: rows*((n+1)*V*4 + n*V*c) read, rows*(K+1)*NB*16 (+ K*NB*16) written.
            _stats_kernel[(rows * (k + 1), nb)](
                *target, *cache, *common,
                self.t_max, self.t_sum, self.t_val, self.t_tok, self.q_max, self.q_sum, self.q_val, self.q_tok,
                first, vocab, nb,
                K=k, KQ=kq, BLOCK=self.block, HAS_GREEDY=has_greedy, num_warps=warps, enable_fp_fusion=False)
            # Bytes: rows*(2K+1)*NB*16 partials + 3K scalar gathers read, rows*(2K+2)*16 written.
            _accept_kernel[(rows,)](
                *target, *drafts, *cache, *common,
                self.t_max, self.t_sum, self.t_val, self.t_tok, self.q_max, self.q_sum, self.q_val, self.q_tok,
                self.row_t, self.row_q, self.arg_t, self.arg_q, self.weights, self.accepted,
                first, vocab, nb,
                K=k, KQ=kq, PARTIALS=partials, HAS_GREEDY=has_greedy, num_warps=1 if partials <= 128 else 4,
                enable_fp_fusion=False)
            if method == "block" and k >= 2:
                # Bytes: rows*(K-1)*V*(4 + c) read, rows*(K-1)*NB*4 written.
                _mass_kernel[(rows * (k - 1), nb)](
                    *target, *cache, *common, self.row_t, self.row_q, self.arg_q, self.weights, self.mass,
                    first, vocab, nb,
                    K=k, KQ=kq, BLOCK=self.block, HAS_GREEDY=has_greedy, num_warps=warps, enable_fp_fusion=False)
            if method == "block":
                # Bytes: rows*(K*NB*4 + (K+1)*4) read, rows*4 written.
                _block_count_kernel[(rows,)](
                    *common, self.weights, self.mass, self.accepted, first, nb,
                    K=k, KQ=kq, PARTIALS=partials, HAS_GREEDY=has_greedy, num_warps=1, enable_fp_fusion=False)
            # Bytes: rows*V*(4 [+ c after a rejection]) read, rows*NB*20 written.
            _resample_kernel[(rows, nb)](
                *target, *cache, *common, self.row_t, self.row_q, self.arg_q, self.weights, self.accepted,
                self.res_any, self.res_val, self.res_tok, self.bonus_val, self.bonus_tok,
                first, vocab, nb,
                K=k, KQ=kq, BLOCK=self.block, HAS_GREEDY=has_greedy, BLOCK_METHOD=method == "block",
                num_warps=warps, enable_fp_fusion=False)
            # Bytes: rows*(NB*20 + K*8) read, rows*(K+2)*8 written.
            _emit_kernel[(rows,)](
                *drafts, *common, self.arg_t, self.accepted,
                self.res_any, self.res_val, self.res_tok, self.bonus_val, self.bonus_tok,
                tokens, tokens.stride(0), num_emitted,
                first, vocab, nb,
                K=k, PARTIALS=partials, HAS_GREEDY=has_greedy, num_warps=1 if partials <= 128 else 4,
                enable_fp_fusion=False)
        return tokens, num_emitted


def verify_triton(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
                  target_greedy=None, *, method: str = "standard"):
    """Functional form: a one-off :class:`Verifier` sized to the call; returns fresh outputs.

    Shapes and dtypes as :func:`~dspark_markov.verify_drafts` (inputs validated by the caller).
    Allocates (not CUDA-graph safe; capture :meth:`Verifier.run` instead).
    """
    batch, k1, vocab = target_logits.shape
    if batch == 0:
        return (torch.full((0, k1), -1, dtype=torch.int64, device=target_logits.device),
                torch.zeros(0, dtype=torch.int64, device=target_logits.device))
    verifier = Verifier(batch, k1 - 1, vocab, target_logits.device)  # its outputs are this call's
    return verifier.run(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
                        seeds, target_greedy, method=method)
