"""Triton kernels of :func:`dspark_markov.verify.filtering.top_k_top_p`: a radix select, then a sort
of the few candidates.

Kept in its own module so that importing the package never imports Triton. Semantics, weights
and the fixed-point mass are those of ``filtering.py`` (bit-identical device functions here).

Algorithm, per row (both layouts)
---------------------------------
1. **Scan + radix select.** Keys are the ordered int32 view of the floats, read as unsigned
   ``u = key + 2^31``. A radix select over ``u`` (64-bin histograms, ``RADIX_BITS = 6`` bits per
   level from the top, levels of shift 26, 20, 14, 8, 2, 0) finds the threshold ``t`` whose count
   ``count(key >= t) >= ks``, where ``ks = k`` for top-k rows and ``ks = CANDIDATES`` for top-p-only
   rows. The first level's pass also yields the NaN flag, the maximal key and its first index.
   The select stops early, after any level, as soon as ``count(key >= t) <= SORT_LARGE``: every
   token that can survive is then among those ``count`` candidates.
2. **Fast path (candidates fit).** One pass gathers the candidates as packed int64
   ``key << 32 | (2^31 - 1 - index)`` (order: key descending, index ascending) into a per-row
   scratch; one program sorts them (``tl.sort``: 256 or ``SORT_LARGE`` entries), keeps the first
   ``k`` (top-k, ties resolved in index order by the packing), and resolves top-p with an exact
   int64 cumsum of ``q`` over the sorted survivors. The kept set is then a prefix of the ranking,
   i.e. ``packed >= cut`` for one int64 ``cut``; the apply pass is one compare per element. For a
   top-p-only row the candidates are the ``CANDIDATES`` best (plus ties); the row's total mass
   comes from the gather pass, and the cut is known iff it falls inside the candidates.
3. **Fallback (rare).** A top-k row whose ``count(key >= t_k)`` exceeds ``SORT_LARGE`` (``k`` above
   it or huge ties: the select then runs all 6 levels, so ``t_k`` is exact and the ties at it are
   ranked by prefix counts when applying), and a top-p row whose cut lies below its candidates,
   use the 16-way integer-mass search over the keys (``FANOUT`` thresholds per pass, 9 passes).

Cost model (per element of the row, H200 warp instructions / 32 lanes)
----------------------------------------------------------------------
Triton lowers a 64-bin ``tl.histogram`` to, per 32 elements: 6 ballots (3 instructions each), a
5-step lane mask (10), the input-mask ballot (2) and, for each of the 2 bins a lane owns, 5 more:
~40 warp instructions, 1.25 per element, plus ~0.4 for the load, key, digit and prefix match
(64 bins is the cheapest width per resolved bit: 32 bins cost 30, 256 bins ~108). The gather
(compare, block scan, scatter) and the apply (pack, one int64 compare, store) cost ~0.6 and ~0.4. The common engine case
(k = 20..1000, p = 0.9) stops after 2 levels on real and Gaussian logits (the 12-bit prefix
already isolates <= 4096 candidates), so a row is read 4 times (stats+level 0, level 1, gather,
apply) and written once: ~5 instructions per element. At 1518 x 129,280 elements that is
~1e9 warp instructions (~1 ms over 132 SMs at 1.98 GHz) against ~0.9 ms of HBM traffic (4 reads
and 1 write of 785 MB at ~4.4 TB/s), versus ~82 ms for the previous 16-way int64 search.

Bytes: ``(passes + 1) * B * V * 4`` with 3 to 7 read passes (4 in the common case) plus the
candidates (``<= SORT_LARGE * 8`` bytes per row, written and read once).

Layouts and launches (both fixed per call, no host synchronisation: CUDA-graph capturable)
-------------------------------------------------------------------------------------------
- **Row path** (``chunks == 1``; many rows): ``_rows_select_kernel`` (grid ``B``: stats, every radix
  level, the gather; ~80 registers), the sort (``_split_update_kernel`` phase ``_GATHER``, grid
  ``B``), ``_rows_search_kernel`` (grid ``B``, only when ``p`` is given: the whole fallback search
  of a fallback row, idle otherwise), then the two apply phases (grid ``B``: rows with a cut, 30
  registers; every other row). 4 or 5 launches. The phases are separate kernels so that the
  streaming passes keep a low register count (the sort needs ~164 at 8 warps) and several
  programs per SM.
- **Split path** (``chunks > 1``; small batch, large V): every pass runs on grid ``(B, chunks)``
  and writes per-program partials (radix histograms, stats, masses), and a grid-``B`` update
  kernel combines them: 6 radix levels x 2, gather + sort, 9 x 2 fallback-search launches when
  ``p`` is given, the ties and the two applies (13 to 34 launches; idle ones return at once). The
  gather claims scratch slots with one atomic per block (the order is restored by the sort).

Measured on the H200 (``dspark-markov bench --verify``: k = 50, p = 0.9, V = 129,280, out of
place, CUDA graph, cold L2; ``benchmarks/results/NVIDIA-H200_2026-11-29_bf16_verify.*``), row /
split layout: 6 rows 278 / 71 us (split x32); 96 rows 372 / 310; 384 rows 646 / 692; 1518 rows
2271 / 2420 us, i.e. 6-16% of the HBM bandwidth (the count above predicted ~1.5 ms at 1518 rows).
The previous 16-way search took 291 / 3982 / 8909 / 30171 us at those sizes. At 6 rows the
launches dominate (~35, of which ~26 idle); fusing each update into its pass would halve them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..rng import LN2_HIGH, LN2_LOW
from ..validate import check_power_of_two
from .filtering_reference import EXP_COEFFS, EXP_FLOOR, KEY_FLOOR, LOG2E, MASS_ONE

_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (tl.constexpr(c) for c in EXP_COEFFS)
_LN2_HIGH = tl.constexpr(LN2_HIGH)
_LN2_LOW = tl.constexpr(LN2_LOW)
_LOG2E = tl.constexpr(LOG2E)
_MASS_ONE = tl.constexpr(MASS_ONE)
_EXP_FLOOR = tl.constexpr(EXP_FLOOR)
_KEY_FLOOR = tl.constexpr(KEY_FLOOR)
_SIGN = tl.constexpr(-(2**31))  # flips the top bit: ordered int32 key <-> unsigned order
_BIG_INDEX = tl.constexpr(2**31 - 1)
_PACK_FLOOR = tl.constexpr(-(2**63))  # below every packed candidate
_PACK_CEIL = tl.constexpr(2**63 - 1)

# Radix select: 64 bins (6 bits) per level, the cheapest bits per instruction of tl.histogram on
# the GPU (it costs one ballot per bit plus 3 instructions per bin a lane owns). Levels: shifts
# 26, 20, 14, 8, 2, 0 (the last one 2 bits wide).
RADIX_BITS = 6
_RADIX_BITS = tl.constexpr(RADIX_BITS)
_BINS = tl.constexpr(1 << RADIX_BITS)
RADIX_SHIFTS = (26, 20, 14, 8, 2, 0)

# Candidates sorted by one program: a small tier (the common top-k case) and a large one. The
# interpreter's tl.sort is slow (~10 s for 4096 entries), so CPU launches default to a small bound.
SORT_SMALL = 256
SORT_LARGE = 4096
CPU_SORT_SIZE = 128

# Fallback top-p search: 16-way over the keys (16 thresholds per pass, an integer mass each),
# cutting the interval width w to at most ceil(w / 16) - 1: 2^32 + 1 keys need 9 passes.
FANOUT = 16
_FANOUT = tl.constexpr(FANOUT)
SEARCH_STEPS = 9

# Filter state per row (int64 fields; 20 used of STATE_FIELDS), shared by both layouts.
(_USE_K, _USE_P, _KMAX, _AMAX, _LO, _HI, _ABOVE, _TK, _NEED, _QTK, _LIMIT, _PREFIX, _RABOVE, _COUNT, _DONE,
 _SLOW_K, _PFAST, _CUT, _CURSOR, _KS) = (tl.constexpr(i) for i in range(20))
STATE_FIELDS = 24
_STATE_FIELDS = tl.constexpr(STATE_FIELDS)
# Per-program partials (int64 fields x chunks).
_P_COUNT, _P_KEY, _P_INDEX, _P_TIES_TK, _P_QTK, _P_TIES_U = (tl.constexpr(i) for i in range(6))
PARTIAL_FIELDS = 6

# Pass phases of the split path (update phases: _SCAN0, _SCAN, _GATHER = resolve, _COUNT_P).
_SCAN0, _SCAN, _GATHER, _COUNT_P, _TIES_U, _APPLY, _APPLY_SLOW = range(7)

GPU_BLOCK = 2048
CPU_BLOCK = 1024
# The fallback search's block: [SEARCH_BLOCK, FANOUT] values stay in registers.
GPU_SEARCH_BLOCK = 256
CPU_SEARCH_BLOCK = 1024


# --------------------------------------------------------------------------- device functions
@triton.jit
def _key32(x):
    """int32 keys ordered like fp32 ``x`` (``-0.0`` maps to ``+0.0``'s key 0)."""
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return tl.where((bits & 0x7FFFFFFF) == 0, 0, key)


@triton.jit
def _key_value(key):
    """The fp32 value of an ordered key (the map is an involution on the int32 bits)."""
    bits = key.to(tl.int32)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pack(key, index):
    """int64 ``key << 32 | (2^31 - 1 - index)``: larger means better ranked (key desc, index asc)."""
    return (key.to(tl.int64) << 32) | (_BIG_INDEX - index.to(tl.int64))


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
def _range_scan(src, start, end, prefix, shift, width, STATS: tl.constexpr, BLOCK: tl.constexpr):
    """One radix level over columns ``[start, end)``.

    Returns ``(hist, nans, max key, its first index)``: ``hist`` int32 ``[_BINS]`` counts the
    digit ``(u >> shift) & (2^width - 1)`` of the columns whose unsigned key ``u`` agrees with
    ``prefix`` above bit ``shift + width``; the stats are computed only when ``STATS``.
    """
    hist = tl.zeros([_BINS], tl.int32)
    nans = tl.zeros([BLOCK], tl.int32)
    best_key = tl.zeros([], tl.int32) + _SIGN
    best_index = tl.zeros([], tl.int32)
    top = prefix.to(tl.uint32)
    ushift = shift.to(tl.uint32)
    span = (tl.zeros([], tl.uint32) + 1) << width.to(tl.uint32)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _key32(x)
        u = (key ^ _SIGN).to(tl.uint32, bitcast=True)
        match = valid & (((u ^ top) >> ushift) < span)
        hist += tl.histogram(((u >> ushift) & (span - 1)).to(tl.int32), _BINS, mask=match)
        if STATS:
            nans += (valid & (x != x)).to(tl.int32)
            key = tl.where(valid, key, _SIGN)
            block_key = tl.max(key, axis=0)
            block_index = tl.min(tl.where(valid & (key == block_key), index, _BIG_INDEX), axis=0)
            best_index = tl.where(block_key > best_key, block_index, best_index)  # blocks in order: first wins
            best_key = tl.maximum(best_key, block_key)
    return hist, tl.sum(nans, axis=0), best_key.to(tl.int64), best_index.to(tl.int64)


@triton.jit
def _radix_step(hist, prefix, above, ks, shift, CAP: tl.constexpr):
    """Choose the digit at ``shift``: the largest ``d`` with ``above + count(digit >= d) >= ks``.

    ``hist`` int32 ``[_BINS]``; ``prefix`` (unsigned key bits fixed so far), ``above`` (how many
    keys have a larger prefix) and ``ks`` int64. Returns ``(prefix, above, count, done)`` with
    ``count`` the number of keys whose prefix is at least the new one, and ``done`` once that
    count is ``<= CAP`` or the last level is resolved.
    """
    bins = tl.arange(0, _BINS)
    h = hist.to(tl.int64)
    total = tl.sum(h, axis=0)
    at_least = total - tl.cumsum(h, axis=0) + h
    digit = tl.maximum(tl.max(tl.where(above + at_least >= ks, bins, -1), axis=0), 0)
    count = above + tl.sum(tl.where(bins == digit, at_least, 0), axis=0)
    above = count - tl.sum(tl.where(bins == digit, h, 0), axis=0)
    prefix = prefix + (digit.to(tl.int64) << shift)
    done = (count <= CAP) | (shift == 0)
    return prefix, above, count, done


@triton.jit
def _next_level(shift):
    """``(next shift, its width)`` after the level at ``shift`` (26, 20, 14, 8, 2, 0)."""
    next_shift = tl.maximum(shift - _RADIX_BITS, 0)
    return next_shift, shift - next_shift


@triton.jit
def _range_gather(src, start, end, lower, scratch, cursor, ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    """Append the packed candidates (key ``>= lower``) of ``[start, end)`` to ``scratch``.

    ``ATOMIC``: slots are claimed per block from the int64 counter at ``cursor`` (split path; the
    order is arbitrary, the sort restores it); else ``cursor`` is the first slot (a scalar).
    """
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        key = _key32(tl.load(src + index, mask=valid, other=0.0))
        hit = valid & (key >= lower)
        hits = hit.to(tl.int32)
        found = tl.sum(hits, axis=0)
        if ATOMIC:
            base = tl.atomic_add(cursor, found.to(tl.int64))
        else:
            base = cursor
            cursor += found.to(tl.int64)
        slot = base + (tl.cumsum(hits, axis=0) - hits).to(tl.int64)
        tl.store(scratch + slot, _pack(key, index), mask=hit)


@triton.jit
def _resolve(scratch, count, ks, use_k, use_p, p, row_mass, vocab, SIZE: tl.constexpr):
    """Sort the ``count <= SIZE`` candidates; return ``(resolved, cut)``.

    Top-k keeps the first ``ks`` (``use_k``); top-p keeps a sorted survivor iff the exact mass
    before it is ``< p * S`` (``S``: the survivors' mass, or ``row_mass`` for a top-p-only row),
    and the first always. ``cut`` is the packed key of the last kept candidate; ``resolved`` is
    false when a top-p-only row's cut may lie below the candidates.
    """
    rank = tl.arange(0, SIZE)
    packed = tl.load(scratch + rank, mask=rank < count, other=_PACK_FLOOR)
    packed = tl.sort(packed, descending=True)
    key = packed >> 32
    value = _key_value(key)
    row_max = _key_value(tl.max(key, axis=0))
    chosen = rank < tl.where(use_k, ks, count)
    q = tl.where(chosen, _weight_fixed_point(value, row_max), 0)
    mass = tl.where(use_k, tl.sum(q, axis=0), row_mass)
    limit = p.to(tl.float64) * mass.to(tl.float64)
    before = tl.cumsum(q, axis=0) - q
    keep = chosen & ((before.to(tl.float64) < limit) | (rank == 0) | (use_p == 0))
    kept = tl.sum(keep.to(tl.int64), axis=0)
    cut = tl.min(tl.where(keep, packed, _PACK_CEIL), axis=0)
    resolved = use_k | (use_p == 0) | (kept < count) | (count >= vocab)
    return resolved, cut


@triton.jit
def _candidates(lo, hi):
    """``FANOUT`` increasing thresholds in ``(lo, hi]`` (the last is ``hi``), int64 ``[FANOUT]``."""
    step = tl.arange(0, _FANOUT).to(tl.int64) + 1
    return lo + ((hi - lo) * step + _FANOUT - 1) // _FANOUT


@triton.jit
def _range_mass_multi(src, start, end, lowers, row_max, BLOCK: tl.constexpr):
    """``[FANOUT]`` int64: the sum of ``q`` over columns of ``[start, end)`` with key ``>= lowers[c]``.

    ``lowers`` (int64, all ``>= -2^31``) are compared as int32; the ``[BLOCK, FANOUT]`` partial sums
    stay in registers and are reduced across threads once, after the loop.
    """
    mass = tl.zeros([BLOCK, _FANOUT], tl.int64)
    lowers = lowers.to(tl.int32)
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _key32(x)
        q = _weight_fixed_point(x, row_max)
        hit = valid[:, None] & (key[:, None] >= lowers[None, :])
        mass += tl.where(hit, q[:, None], 0)
    return tl.sum(mass, axis=0)


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
        key = _key32(x)
        q = _weight_fixed_point(x, row_max)
        mass += tl.where(valid & (key >= lower), q, 0)
        at_level = valid & (key == level)
        level_q = tl.maximum(level_q, tl.where(at_level, q, 0))
        level_count += at_level.to(tl.int32)
    return tl.sum(mass, axis=0), tl.max(level_q, axis=0), tl.sum(level_count, axis=0).to(tl.int64)


@triton.jit
def _range_apply_cut(src, dst, start, end, cut, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr):
    """Fast-path apply over ``[start, end)``: keep iff the packed key is ``>= cut``."""
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        keep = _pack(_key32(x), index) >= cut
        if IN_PLACE:
            tl.store(dst + index, tl.full([BLOCK], float("-inf"), tl.float32), mask=valid & (keep == 0))
        else:
            tl.store(dst + index, tl.where(keep, x, float("-inf")), mask=valid)


@triton.jit
def _range_apply(src, dst, start, end, use_k, use_p, tk, need, u, mass_above, limit, first_best, row_max,
                 ties_tk, ties_u, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr):
    """Fallback apply over ``[start, end)``; ``ties_tk``/``ties_u``: ties at ``tk``/``u`` before ``start``."""
    for offset in range(start, end, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        valid = index < end
        x = tl.load(src + index, mask=valid, other=0.0)
        key = _key32(x)
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
def _rows_select_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    state_ptr,  # [B, STATE_FIELDS] int64
    partial_ptr,  # [B, PARTIAL_FIELDS, 1] int64
    scratch_ptr,  # [B, SORT_LARGE] int64 candidates
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab,
    K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr, BLOCK: tl.constexpr, SORT_LARGE: tl.constexpr,
    CANDIDATES: tl.constexpr,
):
    """Row path, steps 1-2 of the module doc up to the sort: stats, every radix level, the gather.

    Bytes: ``B * V * 4`` per radix level run (2 typically) + ``B * V * 4`` for the gather of fast
    rows (or the mass of fallback rows) + the candidates written (``<= SORT_LARGE * 8`` per row).
    """
    row = tl.program_id(0).to(tl.int64)
    src = logits_ptr + row * logits_stride
    state = state_ptr + row * _STATE_FIELDS
    partial = partial_ptr + row * 6
    zero = tl.zeros([], tl.int64)
    shift = tl.zeros([], tl.int32) + 26
    hist, nans, kmax, first_best = _range_scan(src, 0, vocab, zero, shift, shift * 0 + _RADIX_BITS, True, BLOCK)
    k = _row_k(k_ptr, k_value, row, K_PER_ROW)
    p = _row_p(p_ptr, p_value, row, P_PER_ROW)
    use_k = (nans == 0) & (k > 0) & (k < vocab)
    use_p = (nans == 0) & (p < 1.0)
    select = use_k | use_p
    ks = tl.where(use_k, k, tl.minimum(zero + CANDIDATES, vocab))
    prefix, above, count, done = _radix_step(hist, zero, zero, ks, shift, SORT_LARGE)
    if select:
        while done == 0:
            shift, width = _next_level(shift)
            hist, _, _, _ = _range_scan(src, 0, vocab, prefix, shift, width, False, BLOCK)
            prefix, above, count, done = _radix_step(hist, prefix, above, ks, shift, SORT_LARGE)
    fast = select & (count <= SORT_LARGE)
    slow_k = use_k & (fast == 0)
    if fast:
        _range_gather(src, 0, vocab, (prefix + _SIGN).to(tl.int32), scratch_ptr + row * SORT_LARGE, zero, False,
                      BLOCK)
    if slow_k | (use_p & (use_k == 0)):  # the survivors' mass where the sort does not give it
        tk = tl.where(slow_k, prefix + _SIGN, _KEY_FLOOR)
        mass, q_level, ties = _range_mass(src, 0, vocab, tk + 1, tk, _key_value(kmax), BLOCK)
        tl.store(partial + _P_COUNT, mass)
        tl.store(partial + _P_QTK, q_level)
    tl.store(state + _USE_K, use_k.to(tl.int64))
    tl.store(state + _USE_P, use_p.to(tl.int64))
    tl.store(state + _KS, ks)
    tl.store(state + _KMAX, kmax)
    tl.store(state + _AMAX, first_best)
    tl.store(state + _PREFIX, prefix)
    tl.store(state + _RABOVE, above)
    tl.store(state + _COUNT, count)


@triton.jit
def _rows_search_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    state_ptr,  # [B, STATE_FIELDS] int64
    vocab,
    SEARCH_BLOCK: tl.constexpr,
):
    """Row path, step 3 of the module doc: the whole 16-way top-p search of a fallback row (idle otherwise).

    Bytes: ``V * 4`` per search pass (<= 9) of each fallback row; 48 bytes of state for the others.
    """
    row = tl.program_id(0).to(tl.int64)
    src = logits_ptr + row * logits_stride
    state = state_ptr + row * _STATE_FIELDS
    lo = tl.load(state + _LO)
    hi = tl.load(state + _HI)
    if lo < hi:
        row_max = _key_value(tl.load(state + _KMAX))
        tk = lo
        tie_mass = tl.load(state + _NEED) * tl.load(state + _QTK)
        limit = tl.load(state + _LIMIT).to(tl.float64, bitcast=True)
        above = tl.zeros([], tl.int64)
        while lo < hi:
            thresholds = _candidates(lo, hi)
            masses = _range_mass_multi(src, 0, vocab, tl.maximum(thresholds, tk + 1), row_max, SEARCH_BLOCK)
            masses += tl.where(thresholds <= tk, tie_mass, 0)
            lo, hi, above = _search_step(lo, hi, above, thresholds, masses, masses.to(tl.float64) >= limit)
        tl.store(state + _ABOVE, above)
        tl.store(state + _HI, hi)
        tl.store(state + _LO, lo)


# --------------------------------------------------------------------------- split-row path
@triton.jit
def _split_pass_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    out_ptr, out_stride,  # [B, V] fp32 (may alias logits)
    state_ptr,  # [B, STATE_FIELDS] int64
    partial_ptr,  # [B, PARTIAL_FIELDS, chunks] int64
    hist_ptr,  # [B, chunks, 64] int32 per-program radix histograms
    search_ptr,  # [B, chunks, FANOUT] int64 per-program fallback search partials
    scratch_ptr,  # [B, SORT_LARGE] int64 candidates
    vocab, chunk_len, num_chunks, write_all,
    PHASE: tl.constexpr, SHIFT: tl.constexpr, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr, CHUNKS: tl.constexpr, SORT_LARGE: tl.constexpr,
):
    """One pass of a split-row phase over a ``chunk_len`` range of one row.

    Bytes: ``B * V * 4`` read per phase that runs (idle programs read ~16 bytes of state), plus
    ``B * V * 4`` written by the out-of-place applies; partials ``B * chunks * (256 + 48)``.
    """
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * chunk_len
    end = tl.minimum(start + chunk_len, vocab)
    src = logits_ptr + row * logits_stride
    state = state_ptr + row * _STATE_FIELDS
    partial = partial_ptr + row * (6 * num_chunks) + chunk
    hist_out = hist_ptr + (row * num_chunks + chunk) * _BINS + tl.arange(0, _BINS)
    if PHASE == 0:  # _SCAN0: stats and the first radix level
        shift = tl.zeros([], tl.int32) + 26
        hist, nans, best_key, best_index = _range_scan(src, start, end, tl.zeros([], tl.int64), shift, shift * 0 + 6,
                                                       True, BLOCK)
        tl.store(hist_out, hist)
        tl.store(partial + _P_COUNT * num_chunks, nans.to(tl.int64))
        tl.store(partial + _P_KEY * num_chunks, best_key)
        tl.store(partial + _P_INDEX * num_chunks, best_index)
    elif PHASE == 1:  # _SCAN: one more radix level, unless the select is done
        if tl.load(state + _DONE) == 0:
            shift = tl.zeros([], tl.int32) + SHIFT
            hist, _, _, _ = _range_scan(src, start, end, tl.load(state + _PREFIX), shift,
                                        tl.where(shift == 0, 2, _RADIX_BITS), False, BLOCK)
            tl.store(hist_out, hist)
    else:
        kmax = tl.load(state + _KMAX)
        row_max = _key_value(kmax)
        use_k = tl.load(state + _USE_K) != 0
        use_p = tl.load(state + _USE_P) != 0
        lo = tl.load(state + _LO)
        hi = tl.load(state + _HI)
        tk = tl.load(state + _TK)  # set by the _GATHER update
        search = search_ptr + (row * num_chunks + chunk) * _FANOUT + tl.arange(0, _FANOUT)
        if PHASE == 2:  # _GATHER: candidates (fast rows) and the survivors' mass where the sort lacks it
            fast = (use_k | use_p) & (tl.load(state + _COUNT) <= SORT_LARGE)
            slow_k = use_k & (fast == 0)
            tk = tl.where(slow_k, tl.load(state + _PREFIX) + _SIGN, _KEY_FLOOR)
            if fast:
                lower = (tl.load(state + _PREFIX) + _SIGN).to(tl.int32)
                _range_gather(src, start, end, lower, scratch_ptr + row * SORT_LARGE, state + _CURSOR, True, BLOCK)
            if slow_k | (use_p & (use_k == 0)):
                mass, q_level, ties = _range_mass(src, start, end, tk + 1, tk, row_max, BLOCK)
                tl.store(partial + _P_COUNT * num_chunks, mass)
                tl.store(partial + _P_QTK * num_chunks, q_level)
                tl.store(partial + _P_TIES_TK * num_chunks, ties)
        elif PHASE == 3:  # _COUNT_P: one step of the fallback top-p search
            if lo < hi:
                lowers = tl.maximum(_candidates(lo, hi), tk + 1)
                tl.store(search, _range_mass_multi(src, start, end, lowers, row_max, SEARCH_BLOCK))
        elif PHASE == 4:  # _TIES_U (after the fallback search: lo is u)
            if use_p & (tl.load(state + _PFAST) == 0):
                _, _, ties = _range_mass(src, start, end, lo, lo, row_max, BLOCK)
                tl.store(partial + _P_TIES_U * num_chunks, ties)
        elif PHASE == 5:  # _APPLY: rows with a cut (the common case; a lean kernel)
            if tl.load(state + _PFAST) != 0:
                _range_apply_cut(src, out_ptr + row * out_stride, start, end, tl.load(state + _CUT), IN_PLACE, BLOCK)
        else:  # _APPLY_SLOW: every other row (fallback top-k/top-p, disabled or NaN rows out of place)
            dst = out_ptr + row * out_stride
            if tl.load(state + _PFAST) == 0:
                slow_k = tl.load(state + _SLOW_K).to(tl.int32)
                slow_p = use_p.to(tl.int32)
                if (slow_k | slow_p | write_all) != 0:
                    earlier = tl.arange(0, CHUNKS)
                    earlier_mask = earlier < chunk
                    base = partial_ptr + row * (6 * num_chunks)
                    ties_tk = tl.sum(tl.load(base + _P_TIES_TK * num_chunks + earlier, mask=earlier_mask, other=0), axis=0)
                    ties_u = tl.sum(tl.load(base + _P_TIES_U * num_chunks + earlier, mask=earlier_mask, other=0), axis=0)
                    ties_tk = tl.where(slow_k != 0, ties_tk, 0)  # partials written only for the fallback
                    ties_u = tl.where(slow_p != 0, ties_u, 0)
                    limit = tl.load(state + _LIMIT).to(tl.float64, bitcast=True)
                    _range_apply(src, dst, start, end, slow_k, slow_p, tk, tl.load(state + _NEED), lo,
                                 tl.load(state + _ABOVE), limit, tl.load(state + _AMAX), row_max,
                                 ties_tk.to(tl.int64), ties_u.to(tl.int64), IN_PLACE, BLOCK)


@triton.jit
def _sum_histograms(hist_ptr, row, num_chunks):
    """The row's radix histogram: the sum of its programs' ``[_BINS]`` int32 partials."""
    bins = tl.arange(0, _BINS)
    hist = tl.zeros([_BINS], tl.int32)
    for chunk in range(0, num_chunks):
        hist += tl.load(hist_ptr + (row * num_chunks + chunk) * _BINS + bins)
    return hist


@triton.jit(do_not_specialize=["k_value", "p_value"])
def _split_update_kernel(
    state_ptr,  # [B, STATE_FIELDS] int64
    partial_ptr,  # [B, PARTIAL_FIELDS, chunks] int64
    hist_ptr,  # [B, chunks, 64] int32
    search_ptr,  # [B, chunks, FANOUT] int64
    scratch_ptr,  # [B, SORT_LARGE] int64
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab, num_chunks,
    PHASE: tl.constexpr, SHIFT: tl.constexpr, K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr,
    CHUNKS: tl.constexpr, SORT_SMALL: tl.constexpr, SORT_LARGE: tl.constexpr, CANDIDATES: tl.constexpr,
):
    """Per-row combine of a phase's partials (and the candidate sort in phase ``_GATHER``).

    Bytes: ``B * chunks * 256`` (histograms) or ``B * chunks * 128`` (search partials) read, the
    sort ``<= B * SORT_LARGE * 8``; ~200 bytes of state per row.
    """
    row = tl.program_id(0).to(tl.int64)
    state = state_ptr + row * _STATE_FIELDS
    base = partial_ptr + row * (6 * num_chunks)
    chunk = tl.arange(0, CHUNKS)
    valid = chunk < num_chunks
    zero = tl.zeros([], tl.int64)
    if PHASE == 0:  # _SCAN0: combine the stats (first maximum across chunks in order), the first radix level
        nans = tl.sum(tl.load(base + _P_COUNT * num_chunks + chunk, mask=valid, other=0), axis=0)
        keys = tl.load(base + _P_KEY * num_chunks + chunk, mask=valid, other=_KEY_FLOOR)
        kmax = tl.max(keys, axis=0)
        first = tl.min(tl.where(valid & (keys == kmax), chunk, CHUNKS), axis=0)
        k = _row_k(k_ptr, k_value, row, K_PER_ROW)
        p = _row_p(p_ptr, p_value, row, P_PER_ROW)
        use_k = (nans == 0) & (k > 0) & (k < vocab)
        use_p = (nans == 0) & (p < 1.0)
        ks = tl.where(use_k, k, tl.minimum(zero + CANDIDATES, vocab))
        prefix, above, count, done = _radix_step(_sum_histograms(hist_ptr, row, num_chunks), zero, zero, ks,
                                                 tl.zeros([], tl.int32) + 26, SORT_LARGE)
        tl.store(state + _USE_K, use_k.to(tl.int64))
        tl.store(state + _USE_P, use_p.to(tl.int64))
        tl.store(state + _KS, ks)
        tl.store(state + _KMAX, kmax)
        tl.store(state + _AMAX, tl.load(base + _P_INDEX * num_chunks + first))
        tl.store(state + _PREFIX, prefix)
        tl.store(state + _RABOVE, above)
        tl.store(state + _COUNT, count)
        tl.store(state + _DONE, (done | ((use_k | use_p) == 0)).to(tl.int64))
        tl.store(state + _CURSOR, zero)
    elif PHASE == 1:  # _SCAN: the next radix level
        if tl.load(state + _DONE) == 0:
            prefix, above, count, done = _radix_step(_sum_histograms(hist_ptr, row, num_chunks),
                                                     tl.load(state + _PREFIX), tl.load(state + _RABOVE),
                                                     tl.load(state + _KS), tl.zeros([], tl.int32) + SHIFT, SORT_LARGE)
            tl.store(state + _PREFIX, prefix)
            tl.store(state + _RABOVE, above)
            tl.store(state + _COUNT, count)
            tl.store(state + _DONE, done.to(tl.int64))
    elif PHASE == 2:  # _GATHER done: sort the candidates, or start the fallback top-p search
        use_k = tl.load(state + _USE_K) != 0
        use_p = tl.load(state + _USE_P) != 0
        ks = tl.load(state + _KS)
        count = tl.load(state + _COUNT)
        kmax = tl.load(state + _KMAX)
        p = _row_p(p_ptr, p_value, row, P_PER_ROW)
        fast = (use_k | use_p) & (count <= SORT_LARGE)
        slow_k = use_k & (fast == 0)
        tk = tl.where(slow_k, tl.load(state + _PREFIX) + _SIGN, _KEY_FLOOR)
        need = tl.where(slow_k, ks - tl.load(state + _RABOVE), 0)
        mass_needed = slow_k | (use_p & (use_k == 0))
        mass_gt = tl.where(mass_needed, tl.sum(tl.load(base + _P_COUNT * num_chunks + chunk, mask=valid, other=0),
                                               axis=0), 0)
        q_tk = tl.where(mass_needed, tl.max(tl.load(base + _P_QTK * num_chunks + chunk, mask=valid, other=0),
                                            axis=0), 0)
        p_fast = fast & False
        cut = zero + _PACK_FLOOR
        scratch = scratch_ptr + row * SORT_LARGE
        if fast:
            if count <= SORT_SMALL:
                p_fast, cut = _resolve(scratch, count, ks, use_k, use_p, p, mass_gt, vocab, SORT_SMALL)
            else:
                p_fast, cut = _resolve(scratch, count, ks, use_k, use_p, p, mass_gt, vocab, SORT_LARGE)
        slow_p = use_p & (p_fast == 0)
        limit = p.to(tl.float64) * (mass_gt + need * q_tk).to(tl.float64)
        tl.store(state + _USE_P, slow_p.to(tl.int64))  # from here on: "the fallback top-p runs"
        tl.store(state + _SLOW_K, slow_k.to(tl.int64))
        tl.store(state + _PFAST, p_fast.to(tl.int64))
        tl.store(state + _CUT, cut)
        tl.store(state + _TK, tk)
        tl.store(state + _NEED, need)
        tl.store(state + _QTK, q_tk)
        tl.store(state + _LIMIT, limit.to(tl.int64, bitcast=True))
        tl.store(state + _LO, tk)
        tl.store(state + _HI, tl.where(slow_p, kmax, tk))
        tl.store(state + _ABOVE, zero)
    else:  # _COUNT_P: one step of the fallback top-p search
        lo = tl.load(state + _LO)
        hi = tl.load(state + _HI)
        if lo < hi:
            above = tl.load(state + _ABOVE)
            thresholds = _candidates(lo, hi)
            search = search_ptr + (row * num_chunks + chunk[:, None]) * _FANOUT + tl.arange(0, _FANOUT)[None, :]
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


def launch_top_k_top_p(logits, k, p, out, *, block=None, chunks=None, sort_size=None):
    """Launch the filter; ``k``/``p`` are None, Python scalars or validated ``[B]`` tensors.

    Parameters
    ----------
    logits : torch.Tensor
        ``[B, V]`` fp32, last stride 1.
    out : torch.Tensor
        ``[B, V]`` fp32, last stride 1; may be ``logits`` (then only masked entries are written).
    block, chunks : int, optional
        The vocabulary block and the programs per row (``chunks > 1``: split path); defaults from
        :func:`default_layout`.
    sort_size : int, optional
        The most candidates one program sorts (a power of two >= 16; the fast path's bound, module
        doc): ``SORT_LARGE`` on CUDA, ``CPU_SORT_SIZE`` on the CPU by default. Smaller values only
        move rows to the fallback (the tests use it to force the fallback).

    Notes
    -----
    Launch sequences: module doc (row path 4-5 launches, split path 13-34); the sequence depends
    only on the shapes and on which of ``k``/``p`` are given, never on values (idle launches exit
    at once), there is no host synchronisation, and the scratch (``B * sort_size * 8`` bytes of
    candidates plus a few per-row fields) comes from the caching allocator: CUDA-graph capturable.
    Bytes: ``(read passes + 1) * B * V * 4`` (the apply reads and writes) with 3 read passes in the
    common case (stats + level 0, level 1, gather), up to 7 + 10 on fallback rows.
    """
    rows, vocab = logits.shape
    if rows == 0 or vocab == 0:
        return
    if sort_size is None:
        sort_size = SORT_LARGE if logits.device.type == "cuda" else CPU_SORT_SIZE
    check_power_of_two("sort_size", sort_size, 16)
    if block is None or chunks is None:
        default_block, default_chunks = default_layout(logits)
        block = block or default_block
        chunks = chunks or default_chunks
    chunks = max(1, min(chunks, triton.cdiv(vocab, block)))
    sort_small = min(SORT_SMALL, sort_size // 2)
    candidates = sort_size // 2
    k_per_row, p_per_row = isinstance(k, torch.Tensor), isinstance(p, torch.Tensor)
    k_ptr = k if k_per_row else logits  # unused pointer when the value is a scalar
    p_ptr = p if p_per_row else logits
    k_value = 0 if k_per_row or k is None else max(min(int(k), 2**62), -(2**62))
    p_value = 1.0 if p_per_row or p is None else float(p)
    in_place = out.data_ptr() == logits.data_ptr() and out.stride() == logits.stride()
    write_all = 0 if in_place else 1
    warps = 8 if block >= 2048 else 4
    search_block = min(block, CPU_SEARCH_BLOCK if logits.device.type == "cpu" else GPU_SEARCH_BLOCK)
    device = logits.device
    scratch = torch.empty(rows, sort_size, dtype=torch.int64, device=device)  # [B, sort_size] candidates
    if chunks > 1:
        chunk_len = triton.cdiv(triton.cdiv(vocab, chunks), block) * block
        chunks = triton.cdiv(vocab, chunk_len)
    else:
        chunk_len = vocab
    state = torch.empty(rows, STATE_FIELDS, dtype=torch.int64, device=device)  # [B, STATE_FIELDS]
    partial = torch.empty(rows, PARTIAL_FIELDS, chunks, dtype=torch.int64, device=device)  # [B, 6, chunks]
    hist = torch.empty(rows, chunks, 1 << RADIX_BITS, dtype=torch.int32, device=device)  # [B, chunks, 64]
    search = torch.empty(rows, chunks, FANOUT, dtype=torch.int64, device=device)  # [B, chunks, FANOUT]
    chunks_p2 = triton.next_power_of_2(chunks)

    def run_pass(phase, shift=0):
        _split_pass_kernel[(rows, chunks)](
            logits, logits.stride(0), out, out.stride(0), state, partial, hist, search, scratch,
            vocab, chunk_len, chunks, write_all,
            PHASE=phase, SHIFT=shift, IN_PLACE=in_place, BLOCK=block, SEARCH_BLOCK=search_block, CHUNKS=chunks_p2,
            SORT_LARGE=sort_size, num_warps=warps, enable_fp_fusion=False,
        )

    def run_update(phase, shift=0):
        _split_update_kernel[(rows,)](
            state, partial, hist, search, scratch, k_ptr, k_value, p_ptr, p_value, vocab, chunks,
            PHASE=phase, SHIFT=shift, K_PER_ROW=k_per_row, P_PER_ROW=p_per_row, CHUNKS=chunks_p2,
            SORT_SMALL=sort_small, SORT_LARGE=sort_size, CANDIDATES=candidates,
            num_warps=8 if phase == _GATHER else 1, enable_fp_fusion=False,
        )

    if chunks == 1:  # row path: select (all levels + gather), sort, fallback search, apply
        _rows_select_kernel[(rows,)](
            logits, logits.stride(0), state, partial, scratch, k_ptr, k_value, p_ptr, p_value, vocab,
            K_PER_ROW=k_per_row, P_PER_ROW=p_per_row, BLOCK=block, SORT_LARGE=sort_size, CANDIDATES=candidates,
            num_warps=warps, enable_fp_fusion=False,
        )
        run_update(_GATHER)
        if p is not None:
            _rows_search_kernel[(rows,)](logits, logits.stride(0), state, vocab, SEARCH_BLOCK=search_block,
                                         num_warps=warps, enable_fp_fusion=False)
    else:
        run_pass(_SCAN0)
        run_update(_SCAN0)
        for shift in RADIX_SHIFTS[1:]:
            run_pass(_SCAN, shift)
            run_update(_SCAN, shift)
        run_pass(_GATHER)
        run_update(_GATHER)
        if p is not None:
            for _ in range(SEARCH_STEPS):
                run_pass(_COUNT_P)
                run_update(_COUNT_P)
            run_pass(_TIES_U)
    run_pass(_APPLY)
    run_pass(_APPLY_SLOW)
