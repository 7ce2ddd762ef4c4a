"""Sort-free Triton kernels of :func:`dspark_markov.verify.filtering.top_k_top_p`.

Kept in its own module so that importing the package never imports Triton. Semantics, weights
and the fixed-point mass are those of ``filtering.py`` (bit-identical device functions here).

Per row: (1) stats: NaN flag, the maximal ordered key and its first index; (2) top-k: a 16-way
search (see ``FANOUT``) for the largest key ``t`` with ``count(key >= t) >= k`` (the k-th value) and the count above it;
(3) the survivors' integer mass ``S`` and the weight/count of the ties at the k-th value;
(4) top-p: a 16-way search for the largest key ``u`` with ``H(u) >= p S`` (``H(t)``: survivors' mass at
keys ``>= t``); every key above ``u`` survives, none below, and a tie at ``u`` of tie rank ``r``
survives iff ``H(u + 1) + r q_u < p S``; (5) apply, with prefix counts giving tie ranks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..rng import LN2_HIGH, LN2_LOW
from .filtering import EXP_COEFFS, EXP_FLOOR, KEY_FLOOR, LOG2E, MASS_ONE

_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (tl.constexpr(c) for c in EXP_COEFFS)
_LN2_HIGH = tl.constexpr(LN2_HIGH)
_LN2_LOW = tl.constexpr(LN2_LOW)
_LOG2E = tl.constexpr(LOG2E)
_MASS_ONE = tl.constexpr(MASS_ONE)
_EXP_FLOOR = tl.constexpr(EXP_FLOOR)
_KEY_FLOOR = tl.constexpr(KEY_FLOOR)
_KEY_MIN = tl.constexpr(-(2**31))  # the smallest int32 key: the bottom of the top-k search
_BIG_INDEX = tl.constexpr(2**31 - 1)

# Searches are 16-way: each pass evaluates 16 thresholds spread over the remaining key interval
# (a [SEARCH_BLOCK, 16] comparison per block), cutting its width w to at most ceil(w / 16) - 1.
# The widest interval (2^32 + 1 keys) is resolved in 9 passes; the split path launches that many
# (idle once converged) so that its launch sequence is fixed.
FANOUT = 16
_FANOUT = tl.constexpr(FANOUT)
SEARCH_STEPS = 9

# Split-path state per row (int64 fields) and per-program partials (int64 fields x chunks).
_USE_K, _USE_P, _KMAX, _AMAX, _LO, _HI, _ABOVE, _TK, _NEED, _QTK, _LIMIT = (tl.constexpr(i) for i in range(11))
STATE_FIELDS = 16
_P_COUNT, _P_KEY, _P_INDEX, _P_TIES_TK, _P_QTK, _P_TIES_U = (tl.constexpr(i) for i in range(6))
PARTIAL_FIELDS = 6  # plus a [B, chunks, FANOUT] int64 buffer of per-threshold search partials

# Pass / update phases of the split path.
_STATS, _COUNT_K, _MASS, _COUNT_P, _TIES_U, _APPLY = range(6)

GPU_BLOCK = 2048
CPU_BLOCK = 1024
# The search's block: [SEARCH_BLOCK, FANOUT] comparisons stay in registers (16 per thread at 8 warps).
GPU_SEARCH_BLOCK = 256
CPU_SEARCH_BLOCK = 1024


# --------------------------------------------------------------------------- device functions
@triton.jit
def _ordered_key(x):
    """int64 keys ordered like fp32 ``x`` (``-0.0`` maps to ``+0.0``'s key 0)."""
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where((bits & 0x7FFFFFFF) == 0, 0, key)
    return key.to(tl.int64)


@triton.jit
def _key_value(key):
    """The fp32 value of an ordered key (the map is an involution on the int32 bits)."""
    bits = key.to(tl.int32)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _weight_fixed_point(x, row_max):
    """``trunc(exp(x - row_max) 2^32)`` as int64, bit-identical to ``filtering.weight_fixed_point``."""
    d = tl.maximum(x - row_max, _EXP_FLOOR)
    n = tl.floor(d * _LOG2E + 0.5)
    r = (d - n * _LN2_HIGH) - n * _LN2_LOW
    poly = _C0 + r * 0.0
    poly = poly * r + _C1
    poly = poly * r + _C2
    poly = poly * r + _C3
    poly = poly * r + _C4
    poly = poly * r + _C5
    poly = poly * r + _C6
    poly = poly * r + _C7
    n = tl.where(n == n, n, 0.0)
    scale = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    w = tl.where(x == row_max, 1.0, poly * scale)
    return (w * _MASS_ONE).to(tl.int64)


@triton.jit
def _range_stats(src, start, end, BLOCK: tl.constexpr):
    """``(NaN count, max key, first index of it)`` over columns ``[start, end)`` (end > start)."""
    nans = tl.zeros([BLOCK], tl.int32)
    best_key = tl.zeros([], tl.int64) + _KEY_FLOOR
    best_index = tl.zeros([], tl.int64)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        nans += (valid & (x != x)).to(tl.int32)
        key = tl.where(valid, _ordered_key(x), _KEY_FLOOR)
        block_key = tl.max(key, axis=0)
        block_index = tl.min(tl.where(valid & (key == block_key), index, _BIG_INDEX), axis=0).to(tl.int64)
        best_index = tl.where(block_key > best_key, block_index, best_index)  # blocks in order: first wins
        best_key = tl.maximum(best_key, block_key)
    return tl.sum(nans, axis=0), best_key, best_index


@triton.jit
def _candidates(lo, hi):
    """``FANOUT`` increasing thresholds in ``(lo, hi]`` (the last is ``hi``), int64 ``[FANOUT]``."""
    step = tl.arange(0, _FANOUT).to(tl.int64) + 1
    return lo + ((hi - lo) * step + _FANOUT - 1) // _FANOUT


@triton.jit
def _range_count_multi(src, start, end, thresholds, BLOCK: tl.constexpr):
    """``[FANOUT]`` int64: how many columns of ``[start, end)`` have a key ``>= thresholds[c]``."""
    count = tl.zeros([_FANOUT], tl.int64)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        key = _ordered_key(tl.load(src + index, mask=valid, other=0.0))
        hit = valid[:, None] & (key[:, None] >= thresholds[None, :])
        count += tl.sum(hit.to(tl.int32), axis=0).to(tl.int64)
    return count


@triton.jit
def _range_mass_multi(src, start, end, lowers, row_max, BLOCK: tl.constexpr):
    """``[FANOUT]`` int64: the sum of ``q`` over columns of ``[start, end)`` with key ``>= lowers[c]``."""
    mass = tl.zeros([_FANOUT], tl.int64)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _ordered_key(x)
        q = _weight_fixed_point(x, row_max)
        hit = valid[:, None] & (key[:, None] >= lowers[None, :])
        mass += tl.sum(tl.where(hit, q[:, None], 0), axis=0)
    return mass


@triton.jit
def _search_step(lo, hi, above, thresholds, values, ok):
    """Narrow ``[lo, hi]`` from the predicate ``ok`` (a true prefix) at ``thresholds``.

    ``values`` are the searched quantity at the thresholds (nonincreasing); ``above`` tracks its
    value at ``hi + 1``, i.e. at the first threshold that fails. Returns ``(lo, hi, above)``.
    """
    failed = tl.max(tl.where(ok, 0, 1), axis=0) != 0
    new_lo = tl.maximum(tl.max(tl.where(ok, thresholds, lo), axis=0), lo)
    first_fail = tl.min(tl.where(ok, hi + 1, thresholds), axis=0)
    new_above = tl.max(tl.where(ok, -1, values), axis=0)
    return new_lo, tl.where(failed, first_fail - 1, hi), tl.where(failed, new_above, above)


@triton.jit
def _range_mass(src, start, end, lower, level, row_max, BLOCK: tl.constexpr):
    """Over ``[start, end)``: ``(sum of q at keys >= lower, max q at key == level, count at level)``."""
    mass = tl.zeros([BLOCK], tl.int64)
    level_q = tl.zeros([BLOCK], tl.int64)
    level_count = tl.zeros([BLOCK], tl.int32)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _ordered_key(x)
        q = _weight_fixed_point(x, row_max)
        mass += tl.where(valid & (key >= lower), q, 0)
        at_level = valid & (key == level)
        level_q = tl.maximum(level_q, tl.where(at_level, q, 0))
        level_count += at_level.to(tl.int32)
    return tl.sum(mass, axis=0), tl.max(level_q, axis=0), tl.sum(level_count, axis=0).to(tl.int64)


@triton.jit
def _range_apply(src, dst, start, end, use_k, use_p, tk, need, u, mass_above, limit, first_best, row_max,
                 ties_tk, ties_u, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr):
    """Mask ``[start, end)``; ``ties_tk``/``ties_u``: ties at ``tk``/``u`` before ``start``."""
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _ordered_key(x)
        at_tk = valid & (key == tk)
        at_u = valid & (key == u)
        rank_tk = ties_tk + tl.cumsum(at_tk.to(tl.int64), axis=0) - at_tk.to(tl.int64)
        rank_u = ties_u + tl.cumsum(at_u.to(tl.int64), axis=0) - at_u.to(tl.int64)
        keep_k = (key > tk) | (at_tk & (rank_tk < need)) | (use_k == 0)
        before = mass_above + rank_u * _weight_fixed_point(x, row_max)
        keep_p = (key > u) | (at_u & (before.to(tl.float64) < limit)) | (use_p == 0)
        keep = (keep_k & keep_p) | (index == first_best)
        if IN_PLACE:
            tl.store(dst + index, tl.full([BLOCK], float("-inf"), tl.float32), mask=valid & (keep == 0))
        else:
            tl.store(dst + index, tl.where(keep, x, float("-inf")), mask=valid)
        ties_tk += tl.sum(at_tk.to(tl.int64), axis=0)
        ties_u += tl.sum(at_u.to(tl.int64), axis=0)


@triton.jit
def _row_k(k_ptr, k_value, row, K_PER_ROW: tl.constexpr):
    if K_PER_ROW:
        k = tl.load(k_ptr + row).to(tl.int64)
    else:
        k = tl.zeros([], tl.int64) + k_value
    return k


@triton.jit
def _row_p(p_ptr, p_value, row, P_PER_ROW: tl.constexpr):
    if P_PER_ROW:
        p = tl.load(p_ptr + row)
    else:
        p = tl.zeros([], tl.float32) + p_value
    return p


# --------------------------------------------------------------------------- one program per row
@triton.jit(do_not_specialize=["k_value", "p_value"])
def _filter_rows_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    out_ptr, out_stride,  # [B, V] fp32 (may alias logits)
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab, write_all,  # write_all: 1 to write every entry (out of place), 0 for masked ones only
    K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    src = logits_ptr + row * logits_stride
    dst = out_ptr + row * out_stride
    nans, kmax, first_best = _range_stats(src, 0, vocab, BLOCK)
    row_max = _key_value(kmax)
    k = _row_k(k_ptr, k_value, row, K_PER_ROW)
    p = _row_p(p_ptr, p_value, row, P_PER_ROW)
    use_k = (nans == 0) & (k > 0) & (k < vocab)
    use_p = (nans == 0) & (p < 1.0)

    # Top-k: the largest key tk with count(key >= tk) >= k; `above` tracks count(key > hi).
    tk = tl.zeros([], tl.int64) + _KEY_FLOOR
    need = tl.zeros([], tl.int64)
    if use_k:
        lo = tl.zeros([], tl.int64) + _KEY_MIN
        hi = kmax
        above = tl.zeros([], tl.int64)
        while lo < hi:
            thresholds = _candidates(lo, hi)
            counts = _range_count_multi(src, 0, vocab, thresholds, SEARCH_BLOCK)
            lo, hi, above = _search_step(lo, hi, above, thresholds, counts, counts >= k)
        tk = lo
        need = k - above

    # Top-p: the largest key u with H(u) >= limit; `mass_above` tracks H(hi + 1).
    u = tl.zeros([], tl.int64) + _KEY_FLOOR
    mass_above = tl.zeros([], tl.int64)
    limit = tl.zeros([], tl.float64)
    ties_tk = tl.zeros([], tl.int64)
    if use_p:
        mass_gt, q_tk, _ = _range_mass(src, 0, vocab, tk + 1, tk, row_max, BLOCK)
        limit = p.to(tl.float64) * (mass_gt + need * q_tk).to(tl.float64)
        lo = tk
        hi = kmax
        while lo < hi:
            thresholds = _candidates(lo, hi)
            masses = _range_mass_multi(src, 0, vocab, tl.maximum(thresholds, tk + 1), row_max, SEARCH_BLOCK)
            masses += tl.where(thresholds <= tk, need * q_tk, 0)
            lo, hi, mass_above = _search_step(lo, hi, mass_above, thresholds, masses,
                                              masses.to(tl.float64) >= limit)
        u = lo
    if (use_k.to(tl.int32) | use_p.to(tl.int32) | write_all) != 0:
        _range_apply(src, dst, 0, vocab, use_k.to(tl.int32), use_p.to(tl.int32), tk, need, u, mass_above, limit,
                     first_best, row_max, ties_tk, ties_tk, IN_PLACE, BLOCK)


# --------------------------------------------------------------------------- split-row path
@triton.jit
def _split_pass_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    out_ptr, out_stride,  # [B, V] fp32 (may alias logits)
    state_ptr,  # [B, STATE_FIELDS] int64
    partial_ptr,  # [B, PARTIAL_FIELDS, chunks] int64
    search_ptr,  # [B, chunks, FANOUT] int64
    vocab, chunk_len, num_chunks, write_all,
    PHASE: tl.constexpr, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * chunk_len
    end = tl.minimum(start + chunk_len, vocab)
    src = logits_ptr + row * logits_stride
    state = state_ptr + row * 16
    partial = partial_ptr + row * (6 * num_chunks) + chunk
    if PHASE == 0:  # _STATS
        nans, best_key, best_index = _range_stats(src, start, end, BLOCK)
        tl.store(partial + _P_COUNT * num_chunks, nans.to(tl.int64))
        tl.store(partial + _P_KEY * num_chunks, best_key)
        tl.store(partial + _P_INDEX * num_chunks, best_index)
    else:
        kmax = tl.load(state + _KMAX)
        row_max = _key_value(kmax)
        lo = tl.load(state + _LO)
        hi = tl.load(state + _HI)
        tk = tl.load(state + _TK)
        search = search_ptr + (row * num_chunks + chunk) * _FANOUT + tl.arange(0, _FANOUT)
        if PHASE == 1:  # _COUNT_K
            if lo < hi:
                tl.store(search, _range_count_multi(src, start, end, _candidates(lo, hi), SEARCH_BLOCK))
        elif PHASE == 2:  # _MASS (after the top-k search: lo is the k-th key)
            mass, q_level, ties = _range_mass(src, start, end, lo + 1, lo, row_max, BLOCK)
            tl.store(partial + _P_COUNT * num_chunks, mass)
            tl.store(partial + _P_QTK * num_chunks, q_level)
            tl.store(partial + _P_TIES_TK * num_chunks, ties)
        elif PHASE == 3:  # _COUNT_P
            if lo < hi:
                lowers = tl.maximum(_candidates(lo, hi), tk + 1)
                tl.store(search, _range_mass_multi(src, start, end, lowers, row_max, SEARCH_BLOCK))
        elif PHASE == 4:  # _TIES_U (after the top-p search: lo is u)
            _, _, ties = _range_mass(src, start, end, lo, lo, row_max, BLOCK)
            tl.store(partial + _P_TIES_U * num_chunks, ties)
        else:  # _APPLY
            use_k = tl.load(state + _USE_K).to(tl.int32)
            use_p = tl.load(state + _USE_P).to(tl.int32)
            earlier = tl.arange(0, CHUNKS)
            earlier_mask = earlier < chunk
            base = partial_ptr + row * (6 * num_chunks)
            ties_tk = tl.sum(tl.load(base + _P_TIES_TK * num_chunks + earlier, mask=earlier_mask, other=0), axis=0)
            ties_u = tl.sum(tl.load(base + _P_TIES_U * num_chunks + earlier, mask=earlier_mask, other=0), axis=0)
            limit = tl.load(state + _LIMIT).to(tl.float64, bitcast=True)
            if (use_k | use_p | write_all) != 0:
                _range_apply(src, out_ptr + row * out_stride, start, end, use_k, use_p, tk, tl.load(state + _NEED),
                             lo, tl.load(state + _ABOVE), limit, tl.load(state + _AMAX), row_max,
                             ties_tk.to(tl.int64), ties_u.to(tl.int64), IN_PLACE, BLOCK)


@triton.jit(do_not_specialize=["k_value", "p_value"])
def _split_update_kernel(
    state_ptr,  # [B, STATE_FIELDS] int64
    partial_ptr,  # [B, PARTIAL_FIELDS, chunks] int64
    search_ptr,  # [B, chunks, FANOUT] int64
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab, num_chunks,
    PHASE: tl.constexpr, K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr, CHUNKS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    state = state_ptr + row * 16
    base = partial_ptr + row * (6 * num_chunks)
    chunk = tl.arange(0, CHUNKS)
    valid = chunk < num_chunks
    counts = tl.load(base + _P_COUNT * num_chunks + chunk, mask=valid, other=0)
    if PHASE == 0:  # _STATS: combine (first maximum across chunks in order), start the top-k search
        keys = tl.load(base + _P_KEY * num_chunks + chunk, mask=valid, other=_KEY_FLOOR)
        kmax = tl.max(keys, axis=0)
        first = tl.min(tl.where(valid & (keys == kmax), chunk, CHUNKS), axis=0)
        first_best = tl.load(base + _P_INDEX * num_chunks + first)
        k = _row_k(k_ptr, k_value, row, K_PER_ROW)
        p = _row_p(p_ptr, p_value, row, P_PER_ROW)
        clean = tl.sum(counts, axis=0) == 0
        use_k = clean & (k > 0) & (k < vocab)
        use_p = clean & (p < 1.0)
        tl.store(state + _USE_K, use_k.to(tl.int64))
        tl.store(state + _USE_P, use_p.to(tl.int64))
        tl.store(state + _KMAX, kmax)
        tl.store(state + _AMAX, first_best)
        tl.store(state + _LO, tl.where(use_k, _KEY_MIN, _KEY_FLOOR).to(tl.int64))
        tl.store(state + _HI, tl.where(use_k, kmax, _KEY_FLOOR).to(tl.int64))
        tl.store(state + _ABOVE, tl.zeros([], tl.int64))
        tl.store(state + _TK, tl.zeros([], tl.int64) + _KEY_FLOOR)
    else:
        lo = tl.load(state + _LO)
        hi = tl.load(state + _HI)
        above = tl.load(state + _ABOVE)
        total = tl.sum(counts, axis=0)
        thresholds = _candidates(lo, hi)
        search = search_ptr + (row * num_chunks + chunk[:, None]) * _FANOUT + tl.arange(0, _FANOUT)[None, :]
        if PHASE == 1:  # _COUNT_K
            k = _row_k(k_ptr, k_value, row, K_PER_ROW)
            if lo < hi:
                found = tl.sum(tl.load(search, mask=valid[:, None], other=0), axis=0)
                lo, hi, above = _search_step(lo, hi, above, thresholds, found, found >= k)
                tl.store(state + _ABOVE, above)
                tl.store(state + _HI, hi)
                tl.store(state + _LO, lo)
        elif PHASE == 2:  # _MASS: the k-th key, the survivors' mass, start the top-p search
            use_k = tl.load(state + _USE_K)
            use_p = tl.load(state + _USE_P)
            k = _row_k(k_ptr, k_value, row, K_PER_ROW)
            p = _row_p(p_ptr, p_value, row, P_PER_ROW)
            need = tl.where(use_k != 0, k - above, 0)
            q_tk = tl.max(tl.load(base + _P_QTK * num_chunks + chunk, mask=valid, other=0), axis=0)
            limit = p.to(tl.float64) * (total + need * q_tk).to(tl.float64)
            tl.store(state + _TK, lo)
            tl.store(state + _NEED, need)
            tl.store(state + _QTK, q_tk)
            tl.store(state + _LIMIT, limit.to(tl.int64, bitcast=True))
            tl.store(state + _HI, tl.where(use_p != 0, tl.load(state + _KMAX), lo))
            tl.store(state + _ABOVE, tl.zeros([], tl.int64))
        else:  # _COUNT_P
            if lo < hi:
                tk = tl.load(state + _TK)
                found = tl.sum(tl.load(search, mask=valid[:, None], other=0), axis=0)
                found += tl.where(thresholds <= tk, tl.load(state + _NEED) * tl.load(state + _QTK), 0)
                limit = tl.load(state + _LIMIT).to(tl.float64, bitcast=True)
                lo, hi, above = _search_step(lo, hi, above, thresholds, found, found.to(tl.float64) >= limit)
                tl.store(state + _ABOVE, above)
                tl.store(state + _HI, hi)
                tl.store(state + _LO, lo)


# --------------------------------------------------------------------------- launchers
def default_layout(logits: torch.Tensor) -> tuple[int, int]:
    """``(block, chunks)``: chunks > 1 selects the split-row path (small batch, large V)."""
    rows, vocab = logits.shape
    if logits.device.type != "cuda":
        return CPU_BLOCK, 1
    sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
    blocks = triton.cdiv(vocab, GPU_BLOCK)
    if rows >= sms // 2 or blocks < 8:
        return GPU_BLOCK, 1
    # About two programs per SM, each over at least two blocks.
    return GPU_BLOCK, max(1, min(blocks // 2, (2 * sms) // max(rows, 1)))


def launch_top_k_top_p(logits, k, p, out, *, block=None, chunks=None):
    """Launch the filter; ``k``/``p`` are None, Python scalars or validated ``[B]`` tensors.

    Parameters
    ----------
    logits : ``[B, V]`` fp32, last stride 1. out : ``[B, V]`` fp32, last stride 1 (may be
        ``logits``: then only masked entries are written).
    block, chunks : the vocabulary block and the programs per row (``chunks > 1``: split path);
        defaults from :func:`default_layout`.

    Row path: grid ``(B,)``, one launch. Split path: grid ``(B, chunks)`` passes interleaved with
    grid ``(B,)`` updates, ``4 + 2 * 9`` pass launches and ``2 + 2 * 9`` updates, fixed (graph safe).
    Bytes: about ``(4 + search passes, <= 22) * B * V * 4`` read (each pass re-reads the row, from L2
    when it fits) plus the masked entries written (all ``B * V * 4`` out of place).
    """
    rows, vocab = logits.shape
    if rows == 0 or vocab == 0:
        return
    if block is None or chunks is None:
        default_block, default_chunks = default_layout(logits)
        block = block or default_block
        chunks = chunks or default_chunks
    chunks = max(1, min(chunks, triton.cdiv(vocab, block)))
    use_k, use_p = k is not None, p is not None
    k_per_row, p_per_row = isinstance(k, torch.Tensor), isinstance(p, torch.Tensor)
    k_ptr = k if k_per_row else logits  # unused pointer when the value is a scalar
    p_ptr = p if p_per_row else logits
    k_value = 0 if k_per_row or k is None else max(min(int(k), 2**62), -(2**62))
    p_value = 1.0 if p_per_row or p is None else float(p)
    in_place = out.data_ptr() == logits.data_ptr() and out.stride() == logits.stride()
    write_all = 0 if in_place else 1
    warps = 8 if block >= 2048 else 4
    search_block = min(block, CPU_SEARCH_BLOCK if logits.device.type == "cpu" else GPU_SEARCH_BLOCK)
    if chunks == 1:
        _filter_rows_kernel[(rows,)](
            logits, logits.stride(0), out, out.stride(0), k_ptr, k_value, p_ptr, p_value, vocab, write_all,
            K_PER_ROW=k_per_row, P_PER_ROW=p_per_row, IN_PLACE=in_place, BLOCK=block, SEARCH_BLOCK=search_block,
            num_warps=warps, enable_fp_fusion=False,
        )
        return
    chunk_len = triton.cdiv(triton.cdiv(vocab, chunks), block) * block
    chunks = triton.cdiv(vocab, chunk_len)
    state = torch.empty(rows, STATE_FIELDS, dtype=torch.int64, device=logits.device)
    partial = torch.zeros(rows, PARTIAL_FIELDS, chunks, dtype=torch.int64, device=logits.device)
    search = torch.zeros(rows, chunks, FANOUT, dtype=torch.int64, device=logits.device)
    chunks_p2 = triton.next_power_of_2(chunks)

    def run_pass(phase):
        _split_pass_kernel[(rows, chunks)](
            logits, logits.stride(0), out, out.stride(0), state, partial, search, vocab, chunk_len, chunks, write_all,
            PHASE=phase, IN_PLACE=in_place, BLOCK=block, SEARCH_BLOCK=search_block, CHUNKS=chunks_p2,
            num_warps=warps, enable_fp_fusion=False,
        )

    def run_update(phase):
        _split_update_kernel[(rows,)](
            state, partial, search, k_ptr, k_value, p_ptr, p_value, vocab, chunks,
            PHASE=phase, K_PER_ROW=k_per_row, P_PER_ROW=p_per_row, CHUNKS=chunks_p2,
            num_warps=1, enable_fp_fusion=False,
        )

    run_pass(_STATS)
    run_update(_STATS)
    for _ in range(SEARCH_STEPS if use_k else 0):
        run_pass(_COUNT_K)
        run_update(_COUNT_K)
    run_pass(_MASS)
    run_update(_MASS)
    for _ in range(SEARCH_STEPS if use_p else 0):
        run_pass(_COUNT_P)
        run_update(_COUNT_P)
    run_pass(_TIES_U)
    run_pass(_APPLY)
