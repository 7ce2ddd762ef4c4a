"""The Triton top-k / top-p filter (issue 16): an early gather in the statistics pass, a
two-threshold top-p sweep, narrowing of wide brackets, 4 launches per call, and a bounded
threshold search for the rows whose first bracket misses.

Validated on the H200 (2026-12-04, the final code of filter4: 25 passed; ``tests/gpu/test_filtering_gpu.py``:
every bench input kind and case, both layouts, in place and out of place, capacity 16, CUDA-graph
replay without allocation; filter5's additions left the default kernels' SASS identical to that build,
``tools/filter_sass.py``; its opt-in options have not run on a GPU, see "Options for top-p alone");
equals the sort reference in the CPU interpreter (``tests/verify/test_triton_filtering.py``,
``tests/verify/test_filtering.py``). ``tools/compile_filter.py`` compiles it for sm_90 and prints
registers; ``tools/time_filter.py`` times it in the bench's filter cases (``--phases``: per launch).

Kept in its own module so that importing the package never imports Triton. Semantics, weights
and the fixed-point mass are those of ``filtering.py`` (bit-identical device functions here).

The kept set of a row is always a prefix of its ranking (key descending, index ascending), so
the whole answer is one **packed cut**: ``packed = key << 32 | (2^31 - 1 - index)`` is unique per
token and larger for better-ranked tokens, and a token survives iff ``packed >= cut``. Finding the
cut is a search over packed thresholds ``T`` with the exact ``count(packed >= T)`` and integer
``mass(packed >= T)`` (sum of ``q``) of each:

- **top-k** (target ``COUNT``): the k-th best token ``C_k`` lies in ``[D, U)`` iff
  ``count(>= D) >= k > count(>= U)``;
- **top-p** (target ``MASS``, ``limit = p * S`` in fp64): the last kept token lies in ``[D, U)``
  iff ``mass(>= D) >= limit > mass(>= U)`` (the token just below ``U`` is kept iff the mass
  strictly above it, ``mass(>= U)``, is below the limit).

Passes (4 launches per call; each full-row pass reads the row once)
-------------------------------------------------------------------
1. ``_stats_kernel`` (grid ``rows x chunks``): the first maximum (as a packed key), NaNs, the
   finite count, mean, standard deviation and minimum, and the **early gather**: every token at
   or above a threshold fitted to the row's first ``SAMPLE`` columns (one atomic per token taken):
   ``~4 k`` tokens for top-k rows with ``k <= capacity / 4`` (into ``scratch``: usually the whole
   answer), ``~64`` for top-p-only rows (into ``outliers``: the head of the mass).
2. ``_pass_kernel`` (``FIRST``, grid ``rows x chunks``): every program derives the row's plan from
   the stats partials (the split-layout combine is recomputed per program: no extra launch).
   A top-k row whose early gather holds at least ``k`` and at most ``capacity`` tokens sweeps
   nothing. A top-p-only row sweeps once with two thresholds (:func:`_sweep_pair`: its total
   mass ``S``, exact counts and masses at ``hi`` and ``lo``, the gather of ``[lo, hi)``). The
   bracket is placed by a mass model: the early head ``H = sum exp(x - max)`` above ``T_e`` plus
   a Gaussian bulk below it (``exp`` tilts N(mu, s^2) to N(mu + s^2, s^2)); the predicted cut
   leaves ``p (H + bulk)`` above it; ``[lo, hi)`` holds ~``capacity / 2`` fitted tokens around it
   (the whole top when the cut lies in the head). Other rows (a failed early gather, ``k >
   capacity / 4``) run the general sweep: 8 exact thresholds (Gaussian quantiles of ``k/4 ..
   640 k`` tokens) and the gather of the predicted bracket.
3. ``_finish_kernel`` (one program per row): the resolve: if the gathered bracket
   holds the cut and at most ``capacity`` candidates, the cut comes from them: more than 256 are
   first narrowed (up to twice) 16-fold, by exact part masses for top-p (:func:`_narrow_mass`),
   by counts for top-k (:func:`_narrow_count`), then one sort of at most 256 candidates gives the
   cut (more: :func:`_rank_cut`, ranks by ``n^2`` compares, no sorting network: large ``tl.sort``
   tiers took tens of seconds to compile). A row still open (a missed prediction, adversarial
   rows) continues in the same program with bounded search rounds (``MAX_ROUNDS``;
   each evaluates 8 thresholds inside the bracket that holds the cut: value space, key space
   across octaves, index space inside a run of ties; a gather once it fits). ``searched``
   counts such rows (a status: zero on the benchmark inputs).
4. ``_apply_kernel``: ``-inf`` where ``packed < cut`` (one compare per element); a row whose kept
   set lies among its first ``<= 256`` candidates (top-k from the early gather) is written
   without being read (kept values loaded by index, the chunk set to ``-inf``, the values
   stored back).

Instruction budget (issue 16, filter4; H200 profiles in ``NVIDIA-H200_2026-12-04_filter4_*``): at 1518
rows one memory pass over the 785 MB of logits takes ~180 us, so the passes must issue few instructions
per logit. The defaults of :class:`TopKTopPFilter`, each measured against the previous kernels
(``tools/time_filter.py --compare``; us per launch at 1518 rows, top-p alone, before -> after):

- statistics (``stats_fast``, 441 -> 293): full iterations unmasked, the fp32 sums tested for
  finiteness once per chunk (a chunk with a NaN, an infinity or a huge value is read again exactly),
  the early gather stored raw (fp32 bits, index) and packed by the first pass: 28 SASS instructions
  per logit instead of 42 (the old pass was bound by the half-rate ALU pipe);
- top-p sweep (``lean``, 1840 -> 695): thresholds compared as fp32 values, one slot claim per lane
  and iteration instead of one per element, int32 slots: 80 instructions per logit instead of 108
  (the software ``exp`` alone is ~32), 58 registers instead of 124;
- finish (524 -> 95): narrowing parts by an fp32 product instead of a 64-bit division (a called
  ~100-instruction routine per candidate), the first narrowing bounded by the bracket's keys, at most
  128 registers above ``WIDE_ROWS`` rows (4 programs per SM instead of 2);
- apply (``full_apply``, 617 -> 409): in place, whole rows written (a kept token's bits written back)
  instead of masked ``-inf`` stores at scattered positions.

Options for top-p alone (issue 16, filter5, 2026-12-04; **not run on a GPU**: the device service stopped
lending machines before the session's first round; CPU interpreter tests equal the reference, Triton 3.6
compiles them for sm_90; ``tools/gpu_plans/issue16_filter5.sh`` is the plan that measures them)
------------------------------------------------------------------------------------------------------
``sweep_raw`` (exact): the first sweep (:func:`_sweep_bracket`) counts and sums exactly only above its
bracket and the total, gathers raw, runs unmasked full iterations (64 SASS instructions per logit in
its loop instead of 80; predicted ~695 -> ~560 us at 1518 rows), and the finish completes the bracket's
lower end from the candidates' exact masses (:func:`_complete_bracket`).

``approx`` (**Approximate masses**): the sweep sums ``w'`` (:func:`_weight_approx`: the software
``exp``'s reduction and polynomial by fused multiply-adds) in fp32 per lane and iteration, then fp64:
no 64-bit integer arithmetic or conversion per logit, 47-48 instructions per logit. Bound: with
``u = 2^-24``, both the IEEE (no FMA) and the FMA evaluation are within ``E_soft = 3.94 u`` and
``E_approx = 3.23 u`` of ``exp(d)`` (Horner rounding recurrences over ``|r| <= 0.3467``, the degree-8
remainder 0.17 u, the reduction 0.37 u), so ``|w - w'| <= 7.17 u w'`` (``APPROX_WEIGHT_REL`` = 8 u;
2.0 u is the largest seen over 3e7 values with the FMA emulated exactly on the CPU); the pairwise fp32
sums of four add 2 u, the fp64 sums < 2^-29: ``APPROX_REL`` = 12 u. As ``q = trunc(w 2^32)`` lies in
``(w 2^32 - 1, w 2^32]``, a set of ``n`` tokens with ``sum w' = W`` has mass in
``[max(0, (1 - 12 u) W 2^32 - n), (1 + 12 u) W 2^32]``. :func:`_approx_resolve` decides a row with
these bounds for the masses above (``A``) and below (``L``) the bracket and the exact mass ``M`` of its
candidates: candidate ``t`` survives iff ``P_t < mu = p M + p L - (1 - p) A`` (+ the product's
rounding), monotone in ``mu``, so the kept set is certain unless a ``P_t`` falls in ``[mu_lo, mu_hi)``,
a band of width ``p (2 e L + n_L) + (1 - p) (2 e A + n_A)``; uncertain rows are swept again exactly
(:func:`_redo_kernel`, split 8 ways) and resolved by the exact finish. The truncation term ``n_L`` (one
unit per token below the bracket) dominates: on the bench inputs (p = 0.9, +-1024-token brackets,
emulated on the CPU) the band leaves 10% of the Gaussian and bf16 rows and 56% of the peaked ones
uncertain (those hold ~1e5 tokens of ``q`` in 0..4 below the bracket). Predicted at 1518 rows: sweep
~410 + redo ~80 + second finish ~50 us (Gaussian: ~-145 us against the exact sweep, about what
``sweep_raw`` saves with no redo and no extra launch; peaked: ~+175 us). Exact masses for the few
straddling buckets cannot shrink that band: it is the sum of ~1e5 per-token truncation and rounding
bounds, and bounding each token's truncation exactly costs as many instructions as the exact weight.

Launches: 4 per call (``approx`` with top-p alone: 6), fixed by which of ``k``/``p`` are given (the
mass sweeps compiled in only with ``p``) and the options, never by values; no host synchronisation; all scratch lives in a
:class:`TopKTopPFilter` (allocated once, sized for its largest batch): CUDA-graph safe.
Bytes: top-k rows answered early: ``B V 4`` read (stats) + ``B V 4`` written; top-p rows: ``2 B V
4`` read (stats, pair sweep) + the apply (``B V 4`` read + the masked entries written in place,
``B V 4`` out of place); candidates ``<= capacity * 8`` bytes per row.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ..rng import LN2_HIGH, LN2_LOW
from ..validate import check_int, check_power_of_two
from .filter_checks import check_arguments
from .filtering_reference import EXP_COEFFS, EXP_FLOOR, LOG2E, MASS_ONE

_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (tl.constexpr(c) for c in EXP_COEFFS)
_LN2_HIGH = tl.constexpr(LN2_HIGH)
_LN2_LOW = tl.constexpr(LN2_LOW)
_LOG2E = tl.constexpr(LOG2E)
_MASS_ONE = tl.constexpr(MASS_ONE)
_EXP_FLOOR = tl.constexpr(EXP_FLOOR)
_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: adding it rounds a small fp32 to an integer
_BIG_INDEX = tl.constexpr(2**31 - 1)
PACK_FLOOR = -(2**63)  # below every packed token
PACK_CEIL = 2**63 - 1  # above every packed token
_PACK_FLOOR = tl.constexpr(PACK_FLOOR)
_PACK_CEIL = tl.constexpr(PACK_CEIL)

# Row phases (FilterState.phase).
PHASE_COPY = 0  # nothing to filter (NaN row, neither k nor p active, all -inf): the row is kept
PHASE_CUT = 1  # resolved: keep packed >= cut
PHASE_OPEN = 2  # searching: the next pass gathers and/or evaluates thresholds
PHASE_REDO = 3  # APPROX: the approximate masses left the cut uncertain; the exact sweep runs again
_PHASE_COPY = tl.constexpr(PHASE_COPY)
_PHASE_REDO = tl.constexpr(PHASE_REDO)
_PHASE_CUT = tl.constexpr(PHASE_CUT)
_PHASE_OPEN = tl.constexpr(PHASE_OPEN)
# Search targets (FilterState.target).
TARGET_COUNT = 0  # top-k: the k-th best token (then top-p among the k, from the sorted candidates)
TARGET_MASS = 1  # top-p: the last token whose better-ranked mass is below the limit
_TARGET_COUNT = tl.constexpr(TARGET_COUNT)
_TARGET_MASS = tl.constexpr(TARGET_MASS)
# Pass kinds of _pass_kernel.
PASS_FIRST = 0  # derives the plan from the stats, then sweeps
PASS_REFINE = 1  # sweeps open rows with the plan the resolve left
_PASS_FIRST = tl.constexpr(PASS_FIRST)

# Points of a row's search (FilterState.points and its counts/masses), in descending packed order:
# slot 0 = PACK_CEIL (count 0, mass 0), slot 1 = the upper end of the searched bracket, slots
# 2..9 = the thresholds a sweep evaluates, slot 10 = the lower end, slots 11..15 = copies of it.
THRESHOLDS = 8
POINTS = 16
SLOT_CEIL, SLOT_UPPER, SLOT_FIRST, SLOT_LOWER = 0, 1, 2, 10
_THRESHOLDS = tl.constexpr(THRESHOLDS)
PARTS = 16  # _narrow_mass: key intervals a wide top-p bracket is split into
NARROWINGS = 2  # at most this many 16-fold narrowings before the sort (more candidates: _rank_cut)
_NARROWINGS = tl.constexpr(NARROWINGS)
_PARTS = tl.constexpr(PARTS)
_NARROW_TILE = tl.constexpr(128)
_RANK_I = tl.constexpr(32)  # _rank_cut tiles: [RANK_I, RANK_J] compares at a time
_RANK_J = tl.constexpr(64)
_POINTS = tl.constexpr(POINTS)
_SLOT_UPPER = tl.constexpr(SLOT_UPPER)
_SLOT_FIRST = tl.constexpr(SLOT_FIRST)
_SLOT_LOWER = tl.constexpr(SLOT_LOWER)

# Threshold placement of the first pass (module doc): rows of FilterState.placement [3, 8] fp32.
MASS_OFFSETS = (0.6, 0.14, 0.07, 0.03, -0.03, -0.07, -0.14, -0.6)  # c + s * offset; gather slots 5, 6
PEAK_DEPTHS = (0.25, 0.7, 1.5, 2.5, 4.0, 6.0, 9.0, 14.0)  # max - depth (logits)
COUNT_FACTORS = (0.25, 0.6, 1.3, 3.0, 10.0, 40.0, 160.0, 640.0)  # Gaussian quantile of k * factor tokens
PEAKED_SIGMAS = 6.0  # a maximum this many standard deviations above the mean: a peaked row
_PEAKED_SIGMAS = tl.constexpr(PEAKED_SIGMAS)
MAX_ROUNDS = 48  # _finish_kernel's bound: 9-fold per round over a 64-bit space needs < 21
_MAX_ROUNDS = tl.constexpr(MAX_ROUNDS)

# Approximate masses (APPROX, module doc): |w - w'| <= 6.1 u w' for the FMA polynomial (u = 2^-24; bound
# 8 u), the per-lane fp32 pairwise sums of four weights within 2 u, the fp64 sums within 2^-29: 12 u in all.
APPROX_WEIGHT_REL = 8.0 * 2.0**-24
APPROX_REL = 12.0 * 2.0**-24
_APPROX_REL = tl.constexpr(APPROX_REL)
APPROX_MARGIN = 8.0  # absolute (integer mass units), plus 2^-45 of the total: the fp64 bound arithmetic
_APPROX_MARGIN = tl.constexpr(APPROX_MARGIN)

# Candidates one program resolves (<= SORT_SMALL: one tl.sort; more: _rank_cut, n^2 compares; wide top-p
# ones narrowed first). A first top-p bracket holds ~capacity / 2 fitted tokens. On the H200 (2026-12-02
# u2, p = 0.9, 1518 rows) ~1024 tokens missed the cut in 5 Gaussian and 10 bf16 rows, all within ~120
# tokens of an end; a missed row costs its batch ~1.4 ms (whole-row search rounds in one program),
# so filters for more than WIDE_ROWS rows take twice the capacity (a missed row per batch then
# becomes rare), smaller ones keep the cheaper narrowing. CPU filters default to a small capacity.
GPU_CAPACITY = 2048
GPU_CAPACITY_WIDE = 4096
WIDE_ROWS = 128
CPU_CAPACITY = 128
SORT_SMALL = 256  # the most candidates the write-only apply restores (and the narrowing's goal)
_SORT_SMALL = tl.constexpr(SORT_SMALL)
GPU_BLOCK = 2048
CPU_BLOCK = 1024
# Sweep tiles (4 loaded per iteration): [COUNT_BLOCK, 8] int32 counts and [MASS_BLOCK, 8] int64
# masses stay in registers (~100 registers at 8 warps, measured with tools/compile_filter.py).
COUNT_BLOCK = 512
MASS_BLOCK = 256
STATS_BLOCK = 256  # one element per thread at 8 warps, 4 tiles per iteration
PAIR_BLOCK = 1024  # _sweep_pair: [PAIR_BLOCK] accumulators, 2 tiles per iteration
SAMPLE = 1024  # columns of the row's start that place the early gather
OUTLIERS = 256  # stored tokens of a top-p row's early gather (~64 wanted)
WARPS = 8
APPLY_CHUNKS = 8  # most parts per row of the apply's own split
APPLY_MIN_BLOCKS = 8  # and at least this many blocks per part
REDO_CHUNKS = 8  # most parts per row of APPROX's exact redo sweep
RESOLVE_WARPS = 4  # _finish_kernel (first resolve + search rounds, one program per row, ~255 registers)
FINISH_MAX_REGISTERS = 128  # the finish's cap above WIDE_ROWS rows (see TopKTopPFilter.__init__)


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
    # n = floor(y) and its int32 without conversion instructions (1/8 of the FP32 rate on sm_90):
    # y + 1.5 2^23 rounds y to the nearest integer f (|y| <= 64), whose bits are 0x4B400000 + f
    y = d * _LOG2E + 0.5
    shifted = y + _MAGIC
    f = shifted - _MAGIC
    down = f > y
    n = tl.where(down, f - 1.0, f)
    n_int = shifted.to(tl.int32, bitcast=True) - (0x4B400000 + down.to(tl.int32))
    r = (d - n * _LN2_HIGH) - n * _LN2_LOW
    poly = tl.zeros_like(r) + _C0  # (r is finite wherever w is used: x == row_max overrides NaN)
    poly = poly * r + _C1
    poly = poly * r + _C2
    poly = poly * r + _C3
    poly = poly * r + _C4
    poly = poly * r + _C5
    poly = poly * r + _C6
    poly = poly * r + _C7
    # 2^(n + 32) (n >= -63): poly 2^n 2^32 in one exact product (no subnormals); garbage only where
    # d is NaN (x == max)
    scale = ((n_int + 159) << 23).to(tl.float32, bitcast=True)
    return tl.where(x == row_max, _MASS_ONE, poly * scale).to(tl.int64)


@triton.jit
def _weight_approx(x, row_max):
    """fp32 ``w'`` with ``|w - w'| <= APPROX_WEIGHT_REL w'`` for the exact weight ``w`` before its
    truncation (:func:`_weight_fixed_point`, ``q = trunc(w 2^32)``; finite ``row_max``): the same
    reduction with ``n`` rounded to nearest (ties to even) and ``r`` by fused multiply-adds, the same
    polynomial by fused multiply-adds: 16 instructions instead of ~30 (module doc, "Approximate
    masses", for the bound). No conversion: the sweeps add ``w'`` in fp32 / fp64."""
    d = tl.maximum(x - row_max, _EXP_FLOOR)
    shifted = d * _LOG2E + _MAGIC  # (two roundings: fp fusion is off) the nearest integer n of d log2(e)
    n = shifted - _MAGIC
    r = tl.fma(n, -_LN2_LOW, d - n * _LN2_HIGH)  # d - n LN2_HIGH is exact
    poly = tl.fma(tl.zeros_like(r) + _C0, r, _C1)
    poly = tl.fma(poly, r, _C2)
    poly = tl.fma(poly, r, _C3)
    poly = tl.fma(poly, r, _C4)
    poly = tl.fma(poly, r, _C5)
    poly = tl.fma(poly, r, _C6)
    poly = tl.fma(poly, r, _C7)
    # 2^n from the bits of shifted (0x4B400000 + n)
    return poly * ((shifted.to(tl.int32, bitcast=True) - (0x4B400000 - 127)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _normal_quantile(u):
    """Approximate inverse normal CDF (Abramowitz-Stegun 26.2.23, |error| < 5e-4) of ``u`` in (0, 1).

    Only places thresholds: a wrong guess costs a pass, never a wrong result.
    """
    u = tl.minimum(tl.maximum(u, 1e-12), 1.0 - 1e-7)
    tail = tl.minimum(u, 1.0 - u)
    t = tl.sqrt(-2.0 * tl.log(tail))
    z = t - (2.515517 + 0.802853 * t + 0.010328 * t * t) / (1.0 + 1.432788 * t + 0.189269 * t * t
                                                              + 0.001308 * t * t * t)
    return tl.where(u < 0.5, -z, z)


@triton.jit
def _normal_cdf(z):
    """Approximate normal CDF (a logistic of a cubic, |error| < 1.5e-4); only places thresholds."""
    return 1.0 / (1.0 + tl.exp(-1.5976 * z - 0.07056 * z * z * z))


@triton.jit
def _value_threshold(value):
    """The packed threshold ``key >= key(value)`` (all indices of that key and above)."""
    return _key32(value).to(tl.int64) << 32


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


@triton.jit
def _claim(cursor, take):
    """Slots in a row's candidate list for the ``take`` lanes: one relaxed atomic per element
    register, aggregated per warp by the compiler (no block-wide prefix sum, no memory fence:
    a block scan + acq_rel atomic per tile made the gathering sweeps latency-bound on the H200)."""
    on = take != 0
    return tl.atomic_add(cursor + tl.zeros_like(take.to(tl.int64)), tl.full(take.shape, 1, tl.int64), mask=on,
                         sem="relaxed")


@triton.jit
def _put(scratch, capacity, slot, packed, take):
    """Store claimed candidates (``take`` int32; beyond ``capacity`` only counted by the cursor)."""
    tl.store(scratch + slot, packed, mask=(take != 0) & (slot < capacity))


@triton.jit
def _gather_block(key, index, take, scratch, cursor, capacity):
    """Append the packed keys of ``take`` to ``scratch`` (rare paths; the hot sweeps pipeline
    :func:`_claim` / :func:`_put` so that the atomic's round trip overlaps the next loads)."""
    _put(scratch, capacity, _claim(cursor, take), _pack(key, index), take)


@triton.jit
def _gather_sparse(key, index, take, scratch, cursor, capacity):
    """:func:`_gather_block` (one name kept for the statistics pass)."""
    _put(scratch, capacity, _claim(cursor, take), _pack(key, index), take)


@triton.jit
def _sweep_tile(x, index, valid, bounds, lo_bound, hi_bound, counts, masses, total, row_max, scratch, cursor,
                capacity, GATHER, KEYS: tl.constexpr, EVALUATE: tl.constexpr, MASS: tl.constexpr,
                TOTAL: tl.constexpr):
    """One tile of :func:`_sweep`: accumulate its thresholds' counts/masses, gather its bracket."""
    key = _key32(x)
    if KEYS:
        order = key
    else:
        order = _pack(key, index)
    if EVALUATE:
        hit = valid[:, None] & (order[:, None] >= bounds[None, :])
        counts += hit.to(tl.int32)
        if MASS:
            q = _weight_fixed_point(x, row_max)
            masses += tl.where(hit, q[:, None], 0)
            if TOTAL:
                total += tl.where(valid, q, 0)
    if GATHER:
        _gather_block(key, index, valid & (order >= lo_bound) & (order < hi_bound), scratch, cursor, capacity)
    return counts, masses, total


@triton.jit
def _sweep(src, start, end, row_max, thresholds, lo, hi, scratch, cursor, capacity, GATHER,
           KEYS: tl.constexpr, EVALUATE: tl.constexpr, MASS: tl.constexpr, TOTAL: tl.constexpr,
           BLOCK: tl.constexpr):
    """One pass over columns ``[start, end)`` of a row, 4 tiles of ``BLOCK`` loaded per iteration.

    ``EVALUATE``: exact counts (and integer masses, ``MASS``) at the 8 packed ``thresholds``;
    ``TOTAL``: the mass of every column; ``GATHER`` (runtime): append the packed keys in
    ``[lo, hi)`` to ``scratch`` (beyond ``capacity`` only counted by ``cursor``). ``KEYS``: the
    thresholds and ``lo``/``hi`` are key-aligned (the first pass), so int32 keys are compared
    instead of packed int64 values. The ``[BLOCK, 8]`` accumulators stay in registers, so
    ``BLOCK`` is small; the 4 loads issued together keep enough bytes in flight.
    Returns ``(counts [8] int64, masses [8] int64, total int64)``.
    """
    counts = tl.zeros([BLOCK, _THRESHOLDS], tl.int32)
    masses = tl.zeros([BLOCK, _THRESHOLDS], tl.int64)
    total = tl.zeros([BLOCK], tl.int64)
    if KEYS:
        bounds = (thresholds >> 32).to(tl.int32)
        lo_bound = (lo >> 32).to(tl.int32)
        hi_bound = (hi >> 32).to(tl.int32)  # PACK_CEIL: 2^31 - 1, above every non-NaN key
    else:
        bounds = thresholds
        lo_bound = lo
        hi_bound = hi
    for offset in range(start, end, 4 * BLOCK):
        index0 = offset + tl.arange(0, BLOCK)
        index1 = index0 + BLOCK
        index2 = index1 + BLOCK
        index3 = index2 + BLOCK
        x0 = tl.load(src + index0, mask=index0 < end, other=float("-inf"))
        x1 = tl.load(src + index1, mask=index1 < end, other=float("-inf"))
        x2 = tl.load(src + index2, mask=index2 < end, other=float("-inf"))
        x3 = tl.load(src + index3, mask=index3 < end, other=float("-inf"))
        counts, masses, total = _sweep_tile(x0, index0, index0 < end, bounds, lo_bound, hi_bound, counts, masses,
                                            total, row_max, scratch, cursor, capacity, GATHER, KEYS, EVALUATE,
                                            MASS, TOTAL)
        counts, masses, total = _sweep_tile(x1, index1, index1 < end, bounds, lo_bound, hi_bound, counts, masses,
                                            total, row_max, scratch, cursor, capacity, GATHER, KEYS, EVALUATE,
                                            MASS, TOTAL)
        counts, masses, total = _sweep_tile(x2, index2, index2 < end, bounds, lo_bound, hi_bound, counts, masses,
                                            total, row_max, scratch, cursor, capacity, GATHER, KEYS, EVALUATE,
                                            MASS, TOTAL)
        counts, masses, total = _sweep_tile(x3, index3, index3 < end, bounds, lo_bound, hi_bound, counts, masses,
                                            total, row_max, scratch, cursor, capacity, GATHER, KEYS, EVALUATE,
                                            MASS, TOTAL)
    return tl.sum(counts, axis=0).to(tl.int64), tl.sum(masses, axis=0), tl.sum(total, axis=0)


@triton.jit
def _pair_tile(x, index, valid, hi_key, lo_key, c_hi, c_lo, m_hi, m_lo, total, row_max, cursor, GATHER):
    """One tile of :func:`_sweep_pair`; returns the accumulators and the tile's claimed candidates
    ``(slot, packed, take)`` (stored by the caller one iteration later)."""
    key = _key32(x)
    q = tl.where(valid, _weight_fixed_point(x, row_max), 0)
    above_hi = valid & (key >= hi_key)
    above_lo = valid & (key >= lo_key)
    c_hi += above_hi.to(tl.int32)
    c_lo += above_lo.to(tl.int32)
    m_hi += tl.where(above_hi, q, 0)
    m_lo += tl.where(above_lo, q, 0)
    total += q
    take = (above_lo & (key < hi_key) & (GATHER != 0)).to(tl.int32)
    return c_hi, c_lo, m_hi, m_lo, total, _claim(cursor, take), _pack(key, index), take


@triton.jit
def _sweep_pair(src, start, end, row_max, hi_key, lo_key, scratch, cursor, capacity, GATHER, BLOCK: tl.constexpr):
    """The first sweep of a top-p row: one pass over columns ``[start, end)`` (2 tiles per iteration).

    Exact counts and integer masses at the two key thresholds ``hi_key >= lo_key``, the total
    mass ``S``, and (``GATHER``) the gather of the keys in ``[lo_key, hi_key)``: per token one
    weight, two compares and three 64-bit adds, the least a top-p cut can be found with. The
    candidates of an iteration are stored in the next one (after its loads are issued), so the
    slot atomics' round trip never stalls the sweep.
    Returns ``(counts [8], masses [8], total)`` int64: slots 0..3 at ``hi``, 4..7 at ``lo``.
    """
    c_hi = tl.zeros([BLOCK], tl.int32)
    c_lo = tl.zeros([BLOCK], tl.int32)
    m_hi = tl.zeros([BLOCK], tl.int64)
    m_lo = tl.zeros([BLOCK], tl.int64)
    total = tl.zeros([BLOCK], tl.int64)
    slot0 = tl.zeros([BLOCK], tl.int64)
    slot1 = tl.zeros([BLOCK], tl.int64)
    packed0 = tl.zeros([BLOCK], tl.int64)
    packed1 = tl.zeros([BLOCK], tl.int64)
    take0 = tl.zeros([BLOCK], tl.int32)
    take1 = tl.zeros([BLOCK], tl.int32)
    for offset in range(start, end, 2 * BLOCK):
        index0 = offset + tl.arange(0, BLOCK)
        index1 = index0 + BLOCK
        x0 = tl.load(src + index0, mask=index0 < end, other=float("-inf"))
        x1 = tl.load(src + index1, mask=index1 < end, other=float("-inf"))
        _put(scratch, capacity, slot0, packed0, take0)  # the previous iteration's candidates
        _put(scratch, capacity, slot1, packed1, take1)
        c_hi, c_lo, m_hi, m_lo, total, slot0, packed0, take0 = _pair_tile(x0, index0, index0 < end, hi_key, lo_key,
                                                                          c_hi, c_lo, m_hi, m_lo, total, row_max,
                                                                          cursor, GATHER)
        c_hi, c_lo, m_hi, m_lo, total, slot1, packed1, take1 = _pair_tile(x1, index1, index1 < end, hi_key, lo_key,
                                                                          c_hi, c_lo, m_hi, m_lo, total, row_max,
                                                                          cursor, GATHER)
    _put(scratch, capacity, slot0, packed0, take0)
    _put(scratch, capacity, slot1, packed1, take1)
    upper = tl.arange(0, _THRESHOLDS) < 4
    counts = tl.where(upper, tl.sum(c_hi, axis=0).to(tl.int64), tl.sum(c_lo, axis=0).to(tl.int64))
    masses = tl.where(upper, tl.sum(m_hi, axis=0), tl.sum(m_lo, axis=0))
    return counts, masses, tl.sum(total, axis=0)


_KEY_POS_INF = tl.constexpr(0x7F800000)  # _key32(+inf)
_KEY_NEG_INF = tl.constexpr(-0x7F800001)  # _key32(-inf)


@triton.jit
def _key_floor_value(key):
    """The fp32 ``v`` with ``x >= v`` iff ``_key32(x) >= key`` for every non-NaN ``x`` (NaN: none)."""
    return tl.where(key <= _KEY_NEG_INF, float("-inf"), _key_value(key))


@triton.jit
def _pack32(key, index):
    """:func:`_pack` for int32 ``key`` and ``0 <= index < 2^31`` (the low word computed in 32 bits)."""
    return (key.to(tl.int64) << 32) | (index * -1 + _BIG_INDEX).to(tl.int64)


@triton.jit
def _raw32(x, index):
    """The early gather's raw form (``STATS_FAST``): fp32 bits << 32 | (2^31 - 1 - index), no key
    computation per value; :func:`_raw_to_packed` turns it into :func:`_pack`'s form."""
    return (x.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (index * -1 + _BIG_INDEX).to(tl.int64)


@triton.jit
def _raw_to_packed(raw):
    """:func:`_pack` of a :func:`_raw32` candidate."""
    key = _key32((raw >> 32).to(tl.int32).to(tl.float32, bitcast=True))
    return (key.to(tl.int64) << 32) | (raw & 0xFFFFFFFF)


@triton.jit
def _put32(scratch, capacity, slot, packed, take):
    """:func:`_put` with an int32 ``slot`` (32-bit address and bound arithmetic)."""
    tl.store(scratch + slot, packed, mask=(take != 0) & (slot < capacity))


@triton.jit
def _claim_many(cursor, n):
    """``n`` (int32, >= 0) consecutive slots per lane from a row's cursor: one relaxed atomic per
    lane and iteration instead of one per element (the lean sweeps)."""
    return tl.atomic_add(cursor + tl.zeros_like(n.to(tl.int64)), n.to(tl.int64), mask=n > 0,
                         sem="relaxed").to(tl.int32)


@triton.jit
def _lean_pair_tile(x, index, valid, lo_v, hi_v, hi_open, c_hi, c_lo, m_hi, m_lo, total, row_max):
    """One tile of :func:`_sweep_pair_lean`: fp32 compares instead of keys (same sets), no atomics."""
    q = _weight_fixed_point(x, row_max)  # masked lanes hold -inf: q = 0
    above_lo = valid & (x >= lo_v)
    above_hi = valid & (x >= hi_v) & (hi_open == 0)
    c_hi += above_hi.to(tl.int32)
    c_lo += above_lo.to(tl.int32)
    m_hi += tl.where(above_hi, q, 0)
    m_lo += tl.where(above_lo, q, 0)
    total += q
    take = (above_lo & (above_hi == 0)).to(tl.int32)
    return c_hi, c_lo, m_hi, m_lo, total, take, _pack32(_key32(x), index)


@triton.jit
def _sweep_pair_lean(src, start, end, row_max, hi_key, lo_key, scratch, cursor, capacity, GATHER,
                     BLOCK: tl.constexpr, GATHERS: tl.constexpr = True):
    """:func:`_sweep_pair` with fewer instructions per logit: one element per thread per tile, 4
    tiles per iteration, key thresholds compared as fp32 values, one slot claim per lane and
    iteration (stored in the next iteration). Same results."""
    lo_v = _key_floor_value(lo_key)
    hi_open = hi_key > _KEY_POS_INF
    hi_v = _key_floor_value(tl.minimum(hi_key, _KEY_POS_INF))
    gathering = (GATHER != 0).to(tl.int32)
    capacity32 = capacity.to(tl.int32)
    c_hi = tl.zeros([BLOCK], tl.int32)
    c_lo = tl.zeros([BLOCK], tl.int32)
    m_hi = tl.zeros([BLOCK], tl.int64)
    m_lo = tl.zeros([BLOCK], tl.int64)
    total = tl.zeros([BLOCK], tl.int64)
    s0 = tl.zeros([BLOCK], tl.int32)
    s1 = tl.zeros([BLOCK], tl.int32)
    s2 = tl.zeros([BLOCK], tl.int32)
    s3 = tl.zeros([BLOCK], tl.int32)
    p0 = tl.zeros([BLOCK], tl.int64)
    p1 = tl.zeros([BLOCK], tl.int64)
    p2 = tl.zeros([BLOCK], tl.int64)
    p3 = tl.zeros([BLOCK], tl.int64)
    t0 = tl.zeros([BLOCK], tl.int32)
    t1 = tl.zeros([BLOCK], tl.int32)
    t2 = tl.zeros([BLOCK], tl.int32)
    t3 = tl.zeros([BLOCK], tl.int32)
    for offset in range(start, end, 4 * BLOCK):
        i0 = offset + tl.arange(0, BLOCK)
        i1 = i0 + BLOCK
        i2 = i1 + BLOCK
        i3 = i2 + BLOCK
        x0 = tl.load(src + i0, mask=i0 < end, other=float("-inf"))
        x1 = tl.load(src + i1, mask=i1 < end, other=float("-inf"))
        x2 = tl.load(src + i2, mask=i2 < end, other=float("-inf"))
        x3 = tl.load(src + i3, mask=i3 < end, other=float("-inf"))
        if GATHERS:  # (without: the apply gathers the bracket, _apply_kernel LATE)
            _put32(scratch, capacity32, s0, p0, t0)  # the previous iteration's candidates
            _put32(scratch, capacity32, s1, p1, t1)
            _put32(scratch, capacity32, s2, p2, t2)
            _put32(scratch, capacity32, s3, p3, t3)
        c_hi, c_lo, m_hi, m_lo, total, t0, p0 = _lean_pair_tile(x0, i0, i0 < end, lo_v, hi_v, hi_open, c_hi, c_lo,
                                                                m_hi, m_lo, total, row_max)
        c_hi, c_lo, m_hi, m_lo, total, t1, p1 = _lean_pair_tile(x1, i1, i1 < end, lo_v, hi_v, hi_open, c_hi, c_lo,
                                                                m_hi, m_lo, total, row_max)
        c_hi, c_lo, m_hi, m_lo, total, t2, p2 = _lean_pair_tile(x2, i2, i2 < end, lo_v, hi_v, hi_open, c_hi, c_lo,
                                                                m_hi, m_lo, total, row_max)
        c_hi, c_lo, m_hi, m_lo, total, t3, p3 = _lean_pair_tile(x3, i3, i3 < end, lo_v, hi_v, hi_open, c_hi, c_lo,
                                                                m_hi, m_lo, total, row_max)
        if GATHERS:
            t0 = t0 * gathering
            t1 = t1 * gathering
            t2 = t2 * gathering
            t3 = t3 * gathering
            s0 = _claim_many(cursor, t0 + t1 + t2 + t3)
            s1 = s0 + t0
            s2 = s1 + t1
            s3 = s2 + t2
    if GATHERS:
        _put32(scratch, capacity32, s0, p0, t0)
        _put32(scratch, capacity32, s1, p1, t1)
        _put32(scratch, capacity32, s2, p2, t2)
        _put32(scratch, capacity32, s3, p3, t3)
    upper = tl.arange(0, _THRESHOLDS) < 4
    counts = tl.where(upper, tl.sum(c_hi, axis=0).to(tl.int64), tl.sum(c_lo, axis=0).to(tl.int64))
    masses = tl.where(upper, tl.sum(m_hi, axis=0), tl.sum(m_lo, axis=0))
    return counts, masses, tl.sum(total, axis=0)


@triton.jit
def _bracket_tile(x, index, lo_v, hi_v, hi_open, row_max, APPROX: tl.constexpr):
    """One tile of :func:`_sweep_bracket` (masked lanes hold ``-inf``: below every ``lo``, ``q = 0``):
    ``(above hi, first sum's term, second sum's term, take, raw)``: ``APPROX``: ``w'`` above ``hi``
    and ``w'`` below ``lo`` (fp32); else ``q`` above ``hi`` and ``q`` (int64)."""
    above_lo = x >= lo_v
    above_hi = (x >= hi_v) & (hi_open == 0)
    take = (above_lo & (above_hi == 0)).to(tl.int32)
    if APPROX:
        w = _weight_approx(x, row_max)
        first = tl.where(above_hi, w, 0.0)
        second = tl.where(above_lo, 0.0, w)
    else:
        second = _weight_fixed_point(x, row_max)
        first = tl.where(above_hi, second, 0)
    return above_hi.to(tl.int32), first, second, take, _raw32(x, index)


@triton.jit
def _bracket_iteration(src, i0, end, lo_v, hi_v, hi_open, row_max, c_hi, first, second, BLOCK: tl.constexpr,
                       MASKED: tl.constexpr, APPROX: tl.constexpr):
    """Four tiles of :func:`_sweep_bracket` from column ``i0`` (``MASKED``: the row's last iteration);
    a lane adds its four terms pairwise (fp32, then fp64, when ``APPROX``)."""
    ptr = src + i0
    if MASKED:
        x0 = tl.load(ptr, mask=i0 < end, other=float("-inf"))
        x1 = tl.load(ptr + BLOCK, mask=i0 + BLOCK < end, other=float("-inf"))
        x2 = tl.load(ptr + 2 * BLOCK, mask=i0 + 2 * BLOCK < end, other=float("-inf"))
        x3 = tl.load(ptr + 3 * BLOCK, mask=i0 + 3 * BLOCK < end, other=float("-inf"))
    else:
        x0 = tl.load(ptr)
        x1 = tl.load(ptr + BLOCK)
        x2 = tl.load(ptr + 2 * BLOCK)
        x3 = tl.load(ptr + 3 * BLOCK)
    h0, a0, b0, t0, p0 = _bracket_tile(x0, i0, lo_v, hi_v, hi_open, row_max, APPROX)
    h1, a1, b1, t1, p1 = _bracket_tile(x1, i0 + BLOCK, lo_v, hi_v, hi_open, row_max, APPROX)
    h2, a2, b2, t2, p2 = _bracket_tile(x2, i0 + 2 * BLOCK, lo_v, hi_v, hi_open, row_max, APPROX)
    h3, a3, b3, t3, p3 = _bracket_tile(x3, i0 + 3 * BLOCK, lo_v, hi_v, hi_open, row_max, APPROX)
    c_hi += (h0 + h1) + (h2 + h3)
    first += ((a0 + a1) + (a2 + a3)).to(first.dtype)
    second += ((b0 + b1) + (b2 + b3)).to(second.dtype)
    return c_hi, first, second, t0, t1, t2, t3, p0, p1, p2, p3


@triton.jit
def _sweep_bracket(src, start, end, row_max, hi_key, lo_key, scratch, cursor, capacity, GATHER,
                   BLOCK: tl.constexpr, APPROX: tl.constexpr):
    """The first top-p sweep of the options (top-p alone; filter5, not run on a GPU): the exact count
    above ``hi`` and the gather of ``[lo, hi)`` (raw, :func:`_raw32`; the count at ``lo`` is the count
    at ``hi`` plus the gathered ones), unmasked full iterations with one masked tail, and two sums:

    - ``SWEEP_RAW`` (``APPROX`` false): the exact mass above ``hi`` and the total (int64); the mass at
      ``lo`` is left to the finish (:func:`_complete_bracket`): 64 SASS instructions per logit in the
      loop instead of :func:`_sweep_pair_lean`'s 80;
    - ``APPROX``: the fp64 sums of :func:`_weight_approx` above ``hi`` and below ``lo`` (no 64-bit
      integer arithmetic or conversion per logit: 47 instructions per logit), for
      :func:`_approx_resolve`.

    Returns ``(count above hi, first sum, second sum)``."""
    lo_v = _key_floor_value(lo_key)
    hi_open = hi_key > _KEY_POS_INF
    hi_v = _key_floor_value(tl.minimum(hi_key, _KEY_POS_INF))
    gathering = (GATHER != 0).to(tl.int32)
    capacity32 = capacity.to(tl.int32)
    c_hi = tl.zeros([BLOCK], tl.int32)
    if APPROX:
        first = tl.zeros([BLOCK], tl.float64)
        second = tl.zeros([BLOCK], tl.float64)
    else:
        first = tl.zeros([BLOCK], tl.int64)
        second = tl.zeros([BLOCK], tl.int64)
    s0 = tl.zeros([BLOCK], tl.int32)
    s1 = tl.zeros([BLOCK], tl.int32)
    s2 = tl.zeros([BLOCK], tl.int32)
    s3 = tl.zeros([BLOCK], tl.int32)
    p0 = tl.zeros([BLOCK], tl.int64)
    p1 = tl.zeros([BLOCK], tl.int64)
    p2 = tl.zeros([BLOCK], tl.int64)
    p3 = tl.zeros([BLOCK], tl.int64)
    t0 = tl.zeros([BLOCK], tl.int32)
    t1 = tl.zeros([BLOCK], tl.int32)
    t2 = tl.zeros([BLOCK], tl.int32)
    t3 = tl.zeros([BLOCK], tl.int32)
    lane = tl.arange(0, BLOCK)
    full_end = start + (end - start) // (4 * BLOCK) * (4 * BLOCK)
    for offset in range(start, full_end + 4 * BLOCK, 4 * BLOCK):  # the last iteration masked (maybe empty)
        if offset < end:
            _put32(scratch, capacity32, s0, p0, t0)  # the previous iteration's candidates
            _put32(scratch, capacity32, s1, p1, t1)
            _put32(scratch, capacity32, s2, p2, t2)
            _put32(scratch, capacity32, s3, p3, t3)
            if offset < full_end:
                c_hi, first, second, t0, t1, t2, t3, p0, p1, p2, p3 = _bracket_iteration(
                    src, offset + lane, end, lo_v, hi_v, hi_open, row_max, c_hi, first, second, BLOCK, False, APPROX)
            else:
                c_hi, first, second, t0, t1, t2, t3, p0, p1, p2, p3 = _bracket_iteration(
                    src, offset + lane, end, lo_v, hi_v, hi_open, row_max, c_hi, first, second, BLOCK, True, APPROX)
            t0 = t0 * gathering
            t1 = t1 * gathering
            t2 = t2 * gathering
            t3 = t3 * gathering
            s0 = _claim_many(cursor, t0 + t1 + t2 + t3)
            s1 = s0 + t0
            s2 = s1 + t1
            s3 = s2 + t2
    _put32(scratch, capacity32, s0, p0, t0)
    _put32(scratch, capacity32, s1, p1, t1)
    _put32(scratch, capacity32, s2, p2, t2)
    _put32(scratch, capacity32, s3, p3, t3)
    return tl.sum(c_hi, axis=0).to(tl.int64), tl.sum(first, axis=0), tl.sum(second, axis=0)


@triton.jit
def _complete_bracket(row, st_flags, st_best, st_min, st_cursor, points, counts, masses, scratch, part_sums, vocab,
                      capacity):
    """``SWEEP_RAW``: the count and exact mass at the first bracket's lower end (slots 6..9) from the
    count/mass at its upper end plus its gathered candidates (turned into pack form here), and the exact
    masses of the ``PARTS`` key intervals the first (bounded) narrowing splits them into (``part_sums``,
    so that :func:`_narrow_mass` skips its pass over them); when they were not all gathered (beyond the
    capacity), that point becomes the row's bottom (count ``V``, mass ``S``): a valid point either way
    for the resolve and the search rounds."""
    flags = tl.load(st_flags + row)
    base = row * _POINTS
    lo_slot = (flags >> 8) & 15
    hi_slot = (flags >> 12) & 15
    n_in = tl.load(st_cursor + row)
    c_lo = tl.load(counts + base + hi_slot)
    m_lo = tl.load(masses + base + hi_slot)
    lo = tl.load(points + base + lo_slot)
    if (flags & 1) != 0:
        if n_in <= capacity:
            best_key = (tl.load(st_best + row) >> 32).to(tl.int32)
            row_max = _key_value(best_key)
            rows_scratch = scratch + row * capacity
            # the parts of _resolve_row's first narrowing (the same bounds: _narrow_mass, bounded)
            k_low = tl.maximum(lo >> 32, tl.load(st_min + row)).to(tl.int32)
            k_high = tl.minimum((tl.load(points + base + hi_slot) - 1) >> 32, best_key.to(tl.int64)).to(tl.int32)
            span = _key_span(k_low, k_high)
            t = tl.arange(0, _NARROW_TILE)
            parts = tl.arange(0, _PARTS)
            lanes = tl.zeros([_NARROW_TILE, _PARTS], tl.int64)  # per lane and part; reduced once at the end
            for offset in range(0, n_in, _NARROW_TILE):
                inside = offset + t < n_in
                packed = _raw_to_packed(tl.load(rows_scratch + offset + t, mask=inside, other=0))
                key = (packed >> 32).to(tl.int32)
                part = tl.where(inside, _part_of(key, k_low, span), -1)
                q = _weight_fixed_point(_key_value(key), row_max)
                lanes += tl.where(part[:, None] == parts[None, :], q[:, None], 0)
                tl.store(rows_scratch + offset + t, packed, mask=inside)
            sums = tl.sum(lanes, axis=0)
            tl.store(part_sums + row * _PARTS + parts, sums)
            c_lo += n_in
            m_lo += tl.sum(sums, axis=0)
        else:
            c_lo = c_lo * 0 + vocab
            m_lo = tl.load(masses + base + _SLOT_LOWER)
            lo = lo * 0 + _PACK_FLOOR
        slots = tl.arange(0, _THRESHOLDS)
        lower = slots >= 4
        tl.store(points + base + _SLOT_FIRST + slots, tl.zeros([_THRESHOLDS], tl.int64) + lo, mask=lower)
        tl.store(counts + base + _SLOT_FIRST + slots, tl.zeros([_THRESHOLDS], tl.int64) + c_lo, mask=lower)
        tl.store(masses + base + _SLOT_FIRST + slots, tl.zeros([_THRESHOLDS], tl.int64) + m_lo, mask=lower)
    tl.debug_barrier()  # the resolve reads them back


@triton.jit
def _sort_cut(scratch, n_in, target, k, p, limit, best, row_max, count_hi, mass_hi, hi_is_ceil, SIZE: tl.constexpr):
    """Sort the ``n_in <= SIZE`` gathered candidates of a bracket that holds the cut.

    Returns ``(resolved, cut, limit)``: for a top-k row, the k-th best is at rank
    ``k - count_hi``; with top-p too, ``S_k`` is the mass of the kept top-k (``mass_hi`` above the
    bracket plus the sorted ones) and the cut the last survivor with mass before it
    ``< p S_k``. ``resolved`` is false only when that top-p cut lies above the bracket (top-k
    rows with ``k`` beyond the capacity): the search then goes on for the returned mass target.
    A top-p-only row keeps the candidates whose mass before them is below ``limit``.
    """
    rank = tl.arange(0, SIZE)
    packed = tl.load(scratch + rank, mask=rank < n_in, other=_PACK_FLOOR)
    packed = tl.sort(packed, descending=True)
    q = _weight_fixed_point(_key_value(packed >> 32), row_max)
    inside = rank < n_in
    if target == _TARGET_COUNT:
        chosen = rank < (k - count_hi)
        q = tl.where(chosen, q, 0)
        use_p = p < 1.0
        limit = p.to(tl.float64) * (mass_hi + tl.sum(q, axis=0)).to(tl.float64)
        before = mass_hi + tl.cumsum(q, axis=0) - q
        keep = chosen & ((before.to(tl.float64) < limit) | (use_p == 0) | (packed == best))
        resolved = (use_p == 0) | hi_is_ceil | (mass_hi.to(tl.float64) < limit)
    else:
        before = mass_hi + tl.cumsum(q, axis=0) - q
        keep = inside & ((before.to(tl.float64) < limit) | (packed == best))
        resolved = n_in >= 0
    cut = tl.min(tl.where(keep, packed, _PACK_CEIL), axis=0)
    return resolved, cut, limit


@triton.jit
def _better_than(scratch, n_in, packed, row_max):
    """For packed candidates ``packed [RANK_I]``: how many of the ``n_in`` candidates in ``scratch`` rank
    strictly better, and their exact integer mass (``[RANK_I]`` int32, int64)."""
    tj = tl.arange(0, _RANK_J)
    better = tl.zeros([_RANK_I], tl.int32)
    mass = tl.zeros([_RANK_I], tl.int64)
    for offset in range(0, n_in, _RANK_J):
        inside = offset + tj < n_in
        other = tl.load(scratch + offset + tj, mask=inside, other=_PACK_FLOOR)
        q = tl.where(inside, _weight_fixed_point(_key_value(other >> 32), row_max), 0)
        gt = inside[None, :] & (other[None, :] > packed[:, None])
        better += tl.sum(gt.to(tl.int32), axis=1)
        mass += tl.sum(tl.where(gt, q[None, :], 0), axis=1)
    return better, mass


@triton.jit
def _rank_cut(scratch, n_in, target, k, p, limit, best, row_max, count_hi, mass_hi, hi_is_ceil):
    """:func:`_sort_cut` by ranks instead of a sort, for more than ``SORT_SMALL`` candidates: every candidate's count and mass of strictly
    better candidates (``n_in^2`` compares in ``[RANK_I, RANK_J]`` tiles; packed values are unique,
    so the count is the rank). No sorting network: compiles in a fraction of a ``tl.sort``'s time,
    and the common ``n_in <= 256`` costs ~``65K`` compares.

    Returns ``(resolved, cut, limit)``: for a top-k row the k-th best is at rank ``k - count_hi``;
    with top-p too, ``S_k`` is the mass of the kept top-k (``mass_hi`` above the bracket plus the
    chosen candidates) and the cut the last survivor with mass before it ``< p S_k``. ``resolved``
    is false only when that top-p cut lies above the bracket (top-k rows with ``k`` beyond the
    capacity): the search then goes on for the returned mass target. A top-p-only row keeps the
    candidates whose mass before them is below ``limit``.
    """
    ti = tl.arange(0, _RANK_I)
    use_p = p < 1.0
    cut = tl.zeros([], tl.int64) + _PACK_CEIL
    floor = tl.zeros([], tl.int64) + _PACK_FLOOR  # the k-th best (count target): the lowest chosen
    if target == _TARGET_COUNT:
        rank_k = k - count_hi - 1
        for offset in range(0, n_in, _RANK_I):
            inside = offset + ti < n_in
            packed = tl.load(scratch + offset + ti, mask=inside, other=_PACK_FLOOR)
            better, _ = _better_than(scratch, n_in, packed, row_max)
            floor = tl.maximum(floor, tl.max(tl.where(inside & (better == rank_k), packed, _PACK_FLOOR), axis=0))
        total = mass_hi
        for offset in range(0, n_in, _RANK_I):
            inside = offset + ti < n_in
            packed = tl.load(scratch + offset + ti, mask=inside, other=_PACK_FLOOR)
            q = _weight_fixed_point(_key_value(packed >> 32), row_max)
            total += tl.sum(tl.where(inside & (packed >= floor), q, 0), axis=0)
        limit = p.to(tl.float64) * total.to(tl.float64)
        cut = floor
    if (target == _TARGET_MASS) | use_p:
        cut = tl.zeros([], tl.int64) + _PACK_CEIL
        for offset in range(0, n_in, _RANK_I):
            inside = offset + ti < n_in
            packed = tl.load(scratch + offset + ti, mask=inside, other=_PACK_FLOOR)
            _, above = _better_than(scratch, n_in, packed, row_max)
            keep = inside & (packed >= floor) & (((mass_hi + above).to(tl.float64) < limit) | (packed == best))
            cut = tl.minimum(cut, tl.min(tl.where(keep, packed, _PACK_CEIL), axis=0))
    resolved = (target == _TARGET_MASS) | (use_p == 0) | hi_is_ceil | (mass_hi.to(tl.float64) < limit)
    return resolved, cut, limit


@triton.jit
def _key_span(k_low, k_high):
    """The number of ordered int32 keys in ``[k_low, k_high]``, in int64 (an int32 difference wraps once the keys
    span more than 2^31: candidates from ~+2 to ~-2, or an infinity among them)."""
    return k_high.to(tl.int64) - k_low.to(tl.int64) + 1


@triton.jit
def _key_range(scratch, n_in):
    """``(k_min, span)`` of the int32 keys of ``n_in`` packed candidates (``span = k_max - k_min + 1``)."""
    t = tl.arange(0, _NARROW_TILE)
    k_max = tl.zeros([_NARROW_TILE], tl.int32) - _BIG_INDEX - 1  # per lane; reduced once at the end
    k_min = tl.zeros([_NARROW_TILE], tl.int32) + _BIG_INDEX
    for offset in range(0, n_in, _NARROW_TILE):
        inside = offset + t < n_in
        key = (tl.load(scratch + offset + t, mask=inside, other=0) >> 32).to(tl.int32)
        k_max = tl.maximum(k_max, tl.where(inside, key, -_BIG_INDEX - 1))
        k_min = tl.minimum(k_min, tl.where(inside, key, _BIG_INDEX))
    low = tl.min(k_min, axis=0)
    return low, _key_span(low, tl.max(k_max, axis=0))


@triton.jit
def _part_of(key, k_min, span):
    """The part (0 .. PARTS - 1, larger = better keys) of int32 ``key`` in ``[k_min, k_min + span)``:
    about equal key intervals, by an fp32 product instead of a 64-bit division (a ~100-instruction
    routine per candidate). Monotone in ``key`` (every rounding is), so each part is a run of keys,
    and every pass of a narrowing computes the same parts."""
    scale = _PARTS / span.to(tl.float32)
    part = ((key.to(tl.float32) - k_min.to(tl.float32)) * scale).to(tl.int32)
    return tl.minimum(part, _PARTS - 1)


@triton.jit
def _compact(scratch, n_in, k_min, span, lowest, highest, dst, scatter):
    """Move the candidates whose part lies in ``[lowest, highest]`` to the front (order kept); their number.
    ``scatter`` (a LATE row): ``-inf`` at the columns (``dst``) of the candidates below ``lowest``."""
    t = tl.arange(0, _NARROW_TILE)
    kept = tl.zeros([], tl.int32)
    for offset in range(0, n_in, _NARROW_TILE):
        inside = offset + t < n_in
        packed = tl.load(scratch + offset + t, mask=inside, other=0)
        part = _part_of((packed >> 32).to(tl.int32), k_min, span)
        dropped = part < tl.where(scatter, lowest, 0)  # (parts are >= 0; a bound, not a scalar mask: interpreter)
        index = (packed & 0xFFFFFFFF).to(tl.int32) * -1 + _BIG_INDEX
        tl.store(dst + index, tl.full([_NARROW_TILE], float("-inf"), tl.float32), mask=inside & dropped)
        take = inside & (part >= lowest) & (part <= highest)
        takes = take.to(tl.int32)
        slot = kept + tl.cumsum(takes, axis=0) - takes
        tl.debug_barrier()  # this tile is in registers everywhere before a slot at or below it is written
        tl.store(scratch + slot, packed, mask=take)
        kept += tl.sum(takes, axis=0)
    tl.debug_barrier()
    return kept.to(tl.int64)


@triton.jit
def _narrow_mass(scratch, n_in, limit, mass_hi, row_max, dst, scatter, k_low, k_high, bounded, part_sums=None,
                 GIVEN: tl.constexpr = False):
    """Narrow a top-p bracket of ``n_in`` gathered candidates that holds the cut: split their key
    range into ``PARTS = 16`` equal key intervals, find (from exact integer masses) the one that
    holds the cut and move its candidates to the front of ``scratch``.

    Returns ``(n, mass_above)``: the candidates kept (all of one key stay together, so ties keep
    their index order for the sort) and the exact mass above them. Three passes over the
    candidates in tiles of ``NARROW_TILE`` (few registers) instead of sorting all ``n_in``; two
    when ``bounded``: every candidate's key lies in ``[k_low, k_high]`` (the bracket's own bounds); one
    when ``GIVEN`` (``SWEEP_RAW``): the bounded parts' masses in ``part_sums`` (:func:`_complete_bracket`).
    """
    t = tl.arange(0, _NARROW_TILE)
    parts = tl.arange(0, _PARTS)
    if GIVEN:
        k_min = k_low
        span = _key_span(k_low, k_high)
        sums = tl.load(part_sums + parts)
    else:
        if bounded:
            k_min = k_low
            span = _key_span(k_low, k_high)
        else:
            k_min, span = _key_range(scratch, n_in)
        lanes = tl.zeros([_NARROW_TILE, _PARTS], tl.int64)  # per lane and part; reduced once at the end
        for offset in range(0, n_in, _NARROW_TILE):
            inside = offset + t < n_in
            key = (tl.load(scratch + offset + t, mask=inside, other=0) >> 32).to(tl.int32)
            part = tl.where(inside, _part_of(key, k_min, span), -1)
            q = _weight_fixed_point(_key_value(key), row_max)
            lanes += tl.where(part[:, None] == parts[None, :], q[:, None], 0)
        sums = tl.sum(lanes, axis=0)  # exact mass of each part
    # mass at or above each part's lower end (larger part = better ranked)
    at_or_above = mass_hi + tl.sum(tl.where(parts[None, :] >= parts[:, None], sums[None, :], 0), axis=1)
    chosen = tl.max(tl.where(at_or_above.to(tl.float64) >= limit, parts, -1), axis=0)
    chosen_above = tl.sum(tl.where(parts == chosen, at_or_above - sums, 0), axis=0)
    return _compact(scratch, n_in, k_min, span, chosen, chosen, dst, scatter), chosen_above


@triton.jit
def _late_bracket(row, phase, flags, points, counts, masses, st_p, capacity):
    """``(late, lo, hi)``: a top-p-only row whose first sweep's bracket ``[lo, hi)`` (key-aligned)
    holds the cut with at most ``capacity`` tokens, so that the apply writes the row outside the
    bracket and gathers the bracket (LATE), and the finish resolves the cut from those candidates
    and writes the bracket's dropped ones. The same test as :func:`_resolve_row`'s first resolve
    (``S`` in the lower slot, ``limit = p S``); the apply and the finish compute it alike."""
    base = row * _POINTS
    lo_slot = (flags >> 8) & 15
    hi_slot = (flags >> 12) & 15
    lo = tl.load(points + base + lo_slot)
    hi = tl.load(points + base + hi_slot)
    lo_count = tl.load(counts + base + lo_slot)
    hi_count = tl.load(counts + base + hi_slot)
    lo_mass = tl.load(masses + base + lo_slot)
    hi_mass = tl.load(masses + base + hi_slot)
    limit = tl.load(st_p + row).to(tl.float64) * tl.load(masses + base + _SLOT_LOWER).to(tl.float64)
    late = (phase == _PHASE_OPEN) & ((flags & 9) == 9) & (lo_mass.to(tl.float64) >= limit)
    late = late & (hi_mass.to(tl.float64) < limit) & (lo_count - hi_count <= capacity)
    return late, lo, hi


@triton.jit
def _drop_candidates(scratch, n_in, cut, dst, TILE: tl.constexpr):
    """``-inf`` at the columns of the first ``n_in`` candidates below ``cut`` (LATE rows)."""
    t = tl.arange(0, TILE)
    for offset in range(0, n_in, TILE):
        inside = offset + t < n_in
        packed = tl.load(scratch + offset + t, mask=inside, other=_PACK_CEIL)
        index = (packed & 0xFFFFFFFF).to(tl.int32) * -1 + _BIG_INDEX
        tl.store(dst + index, tl.full([TILE], float("-inf"), tl.float32), mask=inside & (packed < cut))


@triton.jit
def _narrow_mass_wide(scratch, n_in, limit, mass_hi, row_max, k_min, k_max, dst, scatter, TILE: tl.constexpr):
    """:func:`_narrow_mass` in two passes of ``TILE``-wide tiles instead of three of 128: the key
    range ``[k_min, k_max]`` comes from the caller (the bracket's bounds, then the chosen part's
    own range, tracked while compacting), the part masses are reduced per tile (``[PARTS]``
    accumulators, no per-lane copies). Few serial round trips to the candidates (L2) in a program
    that runs alone on its SM share.

    ``scatter`` (a LATE row): the candidates of the parts below the chosen one are dropped, so
    ``-inf`` is written at their columns of ``dst`` while compacting.

    Returns ``(n, mass_above, k_min, k_max)`` of the kept candidates (their exact key range).
    """
    t = tl.arange(0, TILE)
    parts = tl.arange(0, _PARTS)
    span = _key_span(k_min, k_max)
    sums = tl.zeros([_PARTS], tl.int64)
    for offset in range(0, n_in, TILE):
        inside = offset + t < n_in
        key = (tl.load(scratch + offset + t, mask=inside, other=0) >> 32).to(tl.int32)
        part = tl.where(inside, _part_of(key, k_min, span), -1)
        q = _weight_fixed_point(_key_value(key), row_max)
        sums += tl.sum(tl.where(part[:, None] == parts[None, :], q[:, None], 0), axis=0)
    at_or_above = mass_hi + tl.sum(tl.where(parts[None, :] >= parts[:, None], sums[None, :], 0), axis=1)
    chosen = tl.max(tl.where(at_or_above.to(tl.float64) >= limit, parts, -1), axis=0)
    chosen_above = tl.sum(tl.where(parts == chosen, at_or_above - sums, 0), axis=0)
    kept = tl.zeros([], tl.int32)
    low = tl.zeros([], tl.int32) + _BIG_INDEX
    high = tl.zeros([], tl.int32) - _BIG_INDEX - 1
    for offset in range(0, n_in, TILE):
        inside = offset + t < n_in
        packed = tl.load(scratch + offset + t, mask=inside, other=0)
        key = (packed >> 32).to(tl.int32)
        part = _part_of(key, k_min, span)
        take = inside & (part == chosen)
        index = (packed & 0xFFFFFFFF).to(tl.int32) * -1 + _BIG_INDEX
        dropped = part < tl.where(scatter, chosen, 0)  # (parts are >= 0; a bound, not a scalar mask: interpreter)
        tl.store(dst + index, tl.full([TILE], float("-inf"), tl.float32), mask=inside & dropped)
        takes = take.to(tl.int32)
        slot = kept + tl.cumsum(takes, axis=0) - takes
        low = tl.minimum(low, tl.min(tl.where(take, key, _BIG_INDEX), axis=0))
        high = tl.maximum(high, tl.max(tl.where(take, key, -_BIG_INDEX - 1), axis=0))
        tl.debug_barrier()  # this tile is in registers everywhere before a slot at or below it is written
        tl.store(scratch + slot, packed, mask=take)
        kept += tl.sum(takes, axis=0)
    tl.debug_barrier()
    return kept.to(tl.int64), chosen_above, low, high


@triton.jit
def _narrow_count(scratch, n_in, wanted, dst):
    """Narrow ``n_in`` top-k candidates (every token above them is counted elsewhere) to those at or
    above the part (of ``PARTS`` equal key intervals) that holds the ``wanted``-th best: they hold
    the whole top ``wanted``, are moved to the front of ``scratch``, and their number is returned.
    (An early gather of ~4 k tokens holds more than ``SORT_SMALL`` in ~20% of the bench rows.)
    """
    t = tl.arange(0, _NARROW_TILE)
    parts = tl.arange(0, _PARTS)
    k_min, span = _key_range(scratch, n_in)
    lanes = tl.zeros([_NARROW_TILE, _PARTS], tl.int32)  # per lane and part; reduced once at the end
    for offset in range(0, n_in, _NARROW_TILE):
        inside = offset + t < n_in
        key = (tl.load(scratch + offset + t, mask=inside, other=0) >> 32).to(tl.int32)
        part = tl.where(inside, _part_of(key, k_min, span), -1)
        lanes += (part[:, None] == parts[None, :]).to(tl.int32)
    sums = tl.sum(lanes, axis=0).to(tl.int64)  # candidates in each part
    at_or_above = tl.sum(tl.where(parts[None, :] >= parts[:, None], sums[None, :], 0), axis=1)
    chosen = tl.max(tl.where(at_or_above >= wanted, parts, -1), axis=0)
    return _compact(scratch, n_in, k_min, span, chosen, _PARTS, dst, n_in < 0)


@triton.jit
def _between(lower, upper, slot, best_key, min_key):
    """The ``slot``-th (0..7, descending) of 8 packed thresholds inside ``(lower, upper)``.

    The ends are first clamped to the row's keys (``min_key .. best_key``). Index space when they
    lie within one key (a run of ties), value space within an octave, key space across octaves
    (the middle threshold always in key space, so every round makes progress). Thresholds may
    repeat or touch an end (empty pairs are skipped).
    """
    step = (slot * -1 + _THRESHOLDS).to(tl.int64)  # 8 .. 1: descending
    top = (best_key.to(tl.int64) + 1) << 32  # above every token of the row
    upper = tl.minimum(upper, top)
    low = tl.maximum(lower, min_key.to(tl.int64) << 32)
    upper_key = upper >> 32
    lower_key = low >> 32
    narrow = upper_key - lower_key <= 1
    in_ties = low + ((upper - low) // (_THRESHOLDS + 1)) * step  # upper - low < 2^33 here
    upper_value = _key_value(tl.minimum(upper_key, best_key.to(tl.int64)))
    lower_value = _key_value(lower_key)
    finite = (tl.abs(upper_value) < float("inf")) & (tl.abs(lower_value) < float("inf"))
    same_octave = finite & (tl.abs(upper_value - lower_value) <= 0.5 * tl.maximum(tl.abs(upper_value),
                                                                                    tl.abs(lower_value)))
    fraction = step.to(tl.float32) / (_THRESHOLDS + 1)
    by_value = _value_threshold(lower_value + (upper_value - lower_value) * fraction)
    by_key = (lower_key + ((upper_key - lower_key) * step) // (_THRESHOLDS + 1)) << 32
    off_middle = step != 4
    inside = tl.where(same_octave, by_value, by_key)
    inside = tl.where(off_middle, inside, by_key)
    inside = tl.minimum(tl.maximum(inside, lower), upper)
    return tl.where(narrow, in_ties, inside)


@triton.jit
def _plan_points(points, counts, masses, row, best_key, min_key, capacity, target, k, limit):
    """Choose the next round of an open row from its points (module doc) and write it.

    Finds the pair of adjacent points ``[D, U)`` that holds the target; with at most ``capacity``
    tokens it becomes the next gather (slots ``UPPER`` / ``LOWER``, no thresholds; a top-k row
    within the capacity gathers ``[D, PACK_CEIL)``), else the next sweep evaluates 8 thresholds
    inside it. Returns ``(gather, evaluate)``.
    """
    slots = tl.arange(0, _POINTS)
    base = row * _POINTS
    value = tl.load(points + base + slots, volatile=True)
    count = tl.load(counts + base + slots, volatile=True)
    mass = tl.load(masses + base + slots, volatile=True)
    nxt = tl.minimum(slots + 1, _POINTS - 1)
    value_next = tl.load(points + base + nxt, volatile=True)
    count_next = tl.load(counts + base + nxt, volatile=True)
    mass_next = tl.load(masses + base + nxt, volatile=True)
    nonempty = (value > value_next) & (slots < _POINTS - 1)
    if target == _TARGET_COUNT:
        holds = nonempty & (count_next >= k) & (count < k)
    else:
        holds = nonempty & (mass_next.to(tl.float64) >= limit) & (mass.to(tl.float64) < limit)
    chosen = tl.min(tl.where(holds, slots, _POINTS), axis=0)
    pick = slots == chosen
    upper = tl.sum(tl.where(pick, value, 0), axis=0)
    lower = tl.sum(tl.where(pick, value_next, 0), axis=0)
    count_upper = tl.sum(tl.where(pick, count, 0), axis=0)
    count_lower = tl.sum(tl.where(pick, count_next, 0), axis=0)
    mass_upper = tl.sum(tl.where(pick, mass, 0), axis=0)
    mass_lower = tl.sum(tl.where(pick, mass_next, 0), axis=0)
    # A top-k row within the capacity gathers its whole top (U = PACK_CEIL): S_k comes from the sort.
    whole_top = (target == _TARGET_COUNT) & (k <= capacity)
    gather = tl.where(whole_top, count_lower, count_lower - count_upper) <= capacity
    top = gather & whole_top
    upper = tl.where(top, _PACK_CEIL, upper)
    count_upper = tl.where(top, 0, count_upper)
    mass_upper = tl.where(top, 0, mass_upper)
    fill = tl.where(slots == 0, _PACK_CEIL, tl.where(slots == _SLOT_UPPER, upper, lower))
    fill_count = tl.where(slots == 0, 0, tl.where(slots == _SLOT_UPPER, count_upper, count_lower))
    fill_mass = tl.where(slots == 0, 0, tl.where(slots == _SLOT_UPPER, mass_upper, mass_lower))
    thresholds = slots >= _SLOT_FIRST
    thresholds = thresholds & (slots < _SLOT_LOWER)
    if gather:
        fill = tl.where(thresholds, upper, fill)
        fill_count = tl.where(thresholds, count_upper, fill_count)
        fill_mass = tl.where(thresholds, mass_upper, fill_mass)
    else:
        fill = tl.where(thresholds, _between(lower, upper, slots - _SLOT_FIRST, best_key, min_key), fill)
        fill_count = tl.where(thresholds, 0, fill_count)
        fill_mass = tl.where(thresholds, 0, fill_mass)
    tl.store(points + base + slots, fill)
    tl.store(counts + base + slots, fill_count)
    tl.store(masses + base + slots, fill_mass)
    return gather, gather == 0


@triton.jit
def _resolve_row(row, st_phase, st_target, st_k, st_p, st_limit, st_best, st_min, st_cut, st_flags, st_cursor,
                 points, counts, masses, scratch, capacity, dst, late_row, NARROW_TILE: tl.constexpr = 0,
                 part_sums=None, RAW_PARTS: tl.constexpr = False):
    """Decide an open row after a sweep: the cut from its candidates, or the next round.

    Flags (``st_flags``, int32 bits): 1 gather, 2 evaluate, 4 need masses, 8 first pass (total
    mass in the lower slot). Accumulators are read here and reset for the next sweep.
    """
    flags = tl.load(st_flags + row, volatile=True)
    gather = (flags & 1) != 0
    target = tl.load(st_target + row)
    k = tl.load(st_k + row)
    p = tl.load(st_p + row)
    best = tl.load(st_best + row)
    best_key = (best >> 32).to(tl.int32)
    row_max = _key_value(best_key)
    min_key = tl.load(st_min + row).to(tl.int32)
    base = row * _POINTS
    limit = tl.load(st_limit + row, volatile=True)
    if (flags & 8) != 0:
        if target == _TARGET_MASS:  # first pass of a top-p-only row: S is now known
            total = tl.load(masses + base + _SLOT_LOWER, volatile=True)
            for slot in range(_SLOT_LOWER + 1, _POINTS):
                tl.store(masses + base + slot, total)
            # used from registers: reading a just-stored value back races with the storing thread
            limit = p.to(tl.float64) * total.to(tl.float64)
            tl.store(st_limit + row, limit)
            tl.debug_barrier()  # _plan_points reads the copies of the lower point back
    n_in = tl.load(st_cursor + row, volatile=True)
    lo_count = tl.load(counts + base + _SLOT_LOWER, volatile=True)
    hi_count = tl.load(counts + base + _SLOT_UPPER, volatile=True)
    lo_mass = tl.load(masses + base + _SLOT_LOWER, volatile=True)
    hi_mass = tl.load(masses + base + _SLOT_UPPER, volatile=True)
    hi = tl.load(points + base + _SLOT_UPPER, volatile=True)
    # The first pass gathers a bracket whose ends are evaluated thresholds (gather_slots).
    gather_slots = tl.load(st_flags + row, volatile=True) >> 8
    lo_slot = gather_slots & 15
    hi_slot = (gather_slots >> 4) & 15
    if gather:
        if (flags & 8) != 0:
            lo_count = tl.load(counts + base + lo_slot, volatile=True)
            hi_count = tl.load(counts + base + hi_slot, volatile=True)
            lo_mass = tl.load(masses + base + lo_slot, volatile=True)
            hi_mass = tl.load(masses + base + hi_slot, volatile=True)
            hi = tl.load(points + base + hi_slot, volatile=True)
    if target == _TARGET_COUNT:
        holds = (lo_count >= k) & (hi_count < k)
    else:
        holds = (lo_mass.to(tl.float64) >= limit) & (hi_mass.to(tl.float64) < limit)
    phase = tl.zeros([], tl.int32) + _PHASE_OPEN
    cut = tl.zeros([], tl.int64) + _PACK_FLOOR
    kept_n = tl.zeros([], tl.int64)  # > 0: the kept set is the first kept_n candidates (for _apply_kernel)
    if gather & holds & (n_in <= capacity):
        rows_scratch = scratch + row * capacity
        n_sort = n_in
        mass_sort = hi_mass
        complete = n_in >= 0  # the first n_sort candidates hold every kept token below the bracket's top
        # the candidates' key range: the bracket's bounds (packed in [lo, hi)), within the row's keys
        k_low = tl.maximum(tl.load(points + base + tl.where(gather & ((flags & 8) != 0), lo_slot, _SLOT_LOWER),
                                   volatile=True) >> 32, min_key.to(tl.int64)).to(tl.int32)
        k_high = tl.minimum((hi - 1) >> 32, best_key.to(tl.int64)).to(tl.int32)
        bounded = n_sort >= 0  # the first narrowing takes the bracket's bounds (no pass for the key range)
        for _ in range(0, _NARROWINGS):  # a loop, not unrolled: one copy of each narrowing (compile time)
            if (target == _TARGET_MASS) & (n_sort > _SORT_SMALL):  # a wide top-p bracket: narrow it 16-fold
                if NARROW_TILE > 0:
                    n_new, mass_sort, k_low, k_high = _narrow_mass_wide(rows_scratch, n_sort, limit, mass_sort,
                                                                         row_max, k_low, k_high, dst, late_row,
                                                                         NARROW_TILE)
                elif RAW_PARTS:  # (constexpr) a SWEEP_RAW row's first narrowing takes its parts from the finish
                    if bounded & (((flags >> 16) & 1) != 0) & ((flags & 8) != 0):
                        n_new, mass_sort = _narrow_mass(rows_scratch, n_sort, limit, mass_sort, row_max, dst,
                                                        late_row, k_low, k_high, bounded, part_sums + row * _PARTS,
                                                        True)
                    else:
                        n_new, mass_sort = _narrow_mass(rows_scratch, n_sort, limit, mass_sort, row_max, dst,
                                                        late_row, k_low, k_high, bounded)
                    bounded = n_sort < 0
                else:
                    n_new, mass_sort = _narrow_mass(rows_scratch, n_sort, limit, mass_sort, row_max, dst, late_row,
                                                    k_low, k_high, bounded)
                    bounded = n_sort < 0
                complete = complete & (n_new == n_sort)
                n_sort = n_new
            if (target == _TARGET_COUNT) & (n_sort > _SORT_SMALL):  # many top-k candidates: keep the top parts
                n_sort = _narrow_count(rows_scratch, n_sort, k - hi_count, dst)
        if n_sort <= _SORT_SMALL:  # the common case: one 256-entry sort (compiles in a few seconds)
            resolved, cut, new_limit = _sort_cut(rows_scratch, n_sort, target, k, p, limit, best, row_max, hi_count,
                                                 mass_sort, hi == _PACK_CEIL, _SORT_SMALL)
        else:  # rare (k > 64, ties the narrowing cannot split, the search rounds): ranks, no sorting network
            resolved, cut, new_limit = _rank_cut(rows_scratch, n_sort, target, k, p, limit, best, row_max, hi_count,
                                                 mass_sort, hi == _PACK_CEIL)
        if resolved:
            phase = phase * 0 + _PHASE_CUT
            kept_n = tl.where((hi == _PACK_CEIL) & complete & (n_sort <= _SORT_SMALL), n_sort, 0)
            if late_row:  # the bracket's candidates left after the narrowing: -inf below the cut
                _drop_candidates(rows_scratch, n_sort, cut, dst, _NARROW_TILE)
        else:  # top-k beyond the capacity with the top-p cut above the bracket: search the mass above it
            target = target * 0 + _TARGET_MASS
            tl.store(st_target + row, target)
            tl.store(st_limit + row, new_limit)
            limit = new_limit
            slots = tl.arange(0, _POINTS)
            above = slots >= _SLOT_UPPER
            tl.store(points + base + slots, tl.where(above, hi, _PACK_CEIL))
            tl.store(counts + base + slots, tl.where(above, hi_count, 0))
            tl.store(masses + base + slots, tl.where(above, hi_mass, 0))
            tl.debug_barrier()  # _plan_points reads them back
    if phase == _PHASE_OPEN:
        next_gather, next_evaluate = _plan_points(points, counts, masses, row, best_key, min_key, capacity, target,
                                                  k, limit)
        need_mass = (target == _TARGET_MASS) | ((k > capacity) & (p < 1.0))
        tl.store(st_flags + row, next_gather.to(tl.int32) | (next_evaluate.to(tl.int32) << 1)
                 | (need_mass.to(tl.int32) << 2))
    tl.store(st_cursor + row, kept_n)  # 0 for the next sweep of an open row
    tl.store(st_phase + row, phase)
    tl.store(st_cut + row, cut)
    return phase


@triton.jit
def _approx_resolve(row, st_p, st_best, st_min, st_cut, st_flags, st_cursor, points, counts, masses, scratch, dst,
                    approx_mass, vocab, capacity, slack):
    """Resolve a top-p-only row from its approximate first sweep (:func:`_sweep_bracket`), or
    send it to the exact sweep (``PHASE_REDO``). Module doc, "Approximate masses".

    With ``A`` (mass above the bracket), ``M`` (the bracket's, exact from its candidates) and ``L``
    (below it), candidate ``t`` survives iff ``A + P_t < fl(p S)``, ``P_t`` the exact mass of the
    better candidates, i.e. iff ``P_t < mu = p M + p L - (1 - p) A + delta`` (``|delta| <= 2^-53 S``,
    the product's rounding). The sums bound ``A`` and ``L``, hence ``mu`` in ``[mu_lo, mu_hi]``;
    the kept set (monotone in ``mu``) is certain when the bracket holds the cut for both ends and
    no candidate's ``P_t`` falls in ``[mu_lo, mu_hi)``; the narrowing and the sort are those of the
    exact resolve (relative to ``A``, at ``mu_lo``), plus that check. Returns the new phase.
    """
    flags = tl.load(st_flags + row)
    p = tl.load(st_p + row).to(tl.float64)
    best = tl.load(st_best + row)
    best_key = (best >> 32).to(tl.int32)
    row_max = _key_value(best_key)
    base = row * _POINTS
    lo_slot = (flags >> 8) & 15
    hi_slot = (flags >> 12) & 15
    c_hi = tl.load(counts + base + hi_slot)
    lo = tl.load(points + base + lo_slot)
    hi = tl.load(points + base + hi_slot)
    n_in = tl.load(st_cursor + row)
    c_lo = c_hi + n_in  # (the approximate sweep counts above hi; every token of [lo, hi) claimed a slot)
    above = tl.load(approx_mass + 2 * row)
    below = tl.load(approx_mass + 2 * row + 1)
    rows_scratch = scratch + row * capacity
    phase = tl.zeros([], tl.int32) + _PHASE_REDO
    cut = tl.zeros([], tl.int64) + _PACK_FLOOR
    kept_n = tl.zeros([], tl.int64)
    if ((flags & 1) != 0) & (n_in > 0) & (n_in <= capacity) & (row_max < float("inf")):
        # the candidates in pack form (for the narrowing, the sort and the apply) and their exact mass M
        t = tl.arange(0, _NARROW_TILE)
        bracket = tl.zeros([_NARROW_TILE], tl.int64)
        for offset in range(0, n_in, _NARROW_TILE):
            inside = offset + t < n_in
            raw = tl.load(rows_scratch + offset + t, mask=inside, other=0)
            x = (raw >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            bracket += tl.where(inside, _weight_fixed_point(x, row_max), 0)
            tl.store(rows_scratch + offset + t, _raw_to_packed(raw), mask=inside)
        tl.debug_barrier()  # the narrowing reads the packed candidates back
        m = tl.sum(bracket, axis=0).to(tl.float64)
        # A in [a_lo, a_hi], L in [l_lo, l_hi]: q = trunc(w 2^32) lies in (w 2^32 - 1, w 2^32]
        rel = (tl.zeros([], tl.float64) + slack) * _APPROX_REL
        a_hi = above * _MASS_ONE * (1.0 + rel)
        a_lo = tl.maximum(above * _MASS_ONE * (1.0 - rel) - c_hi.to(tl.float64), 0.0)
        l_hi = below * _MASS_ONE * (1.0 + rel)
        l_lo = tl.maximum(below * _MASS_ONE * (1.0 - rel) - (vocab - c_lo).to(tl.float64), 0.0)
        margin = _APPROX_MARGIN + (a_hi + m + l_hi) * 2.0**-45
        mu_lo = p * (m + l_lo) - (1.0 - p) * a_hi - margin
        mu_hi = p * (m + l_hi) - (1.0 - p) * a_lo + margin
        # the bracket holds the cut for every mu: its first candidate survives, the token below it does not
        if (mu_lo > 0.0) & (m >= mu_hi):
            n_sort = n_in
            mass_sort = tl.zeros([], tl.int64)  # exact mass above the candidates left, relative to A
            complete = n_in >= 0
            k_low = tl.maximum(lo >> 32, tl.load(st_min + row)).to(tl.int32)
            k_high = tl.minimum((hi - 1) >> 32, best_key.to(tl.int64)).to(tl.int32)
            bounded = n_sort >= 0
            for _ in range(0, _NARROWINGS):
                if n_sort > _SORT_SMALL:
                    n_new, mass_sort = _narrow_mass(rows_scratch, n_sort, mu_lo, mass_sort, row_max, dst, n_sort < 0,
                                                    k_low, k_high, bounded)
                    bounded = n_sort < 0
                    complete = complete & (n_new == n_sort)
                    n_sort = n_new
            if n_sort <= _SORT_SMALL:
                rank = tl.arange(0, _SORT_SMALL)
                inside = rank < n_sort
                packed = tl.sort(tl.load(rows_scratch + rank, mask=inside, other=_PACK_FLOOR), descending=True)
                q = tl.where(inside, _weight_fixed_point(_key_value(packed >> 32), row_max), 0)
                before = (mass_sort + tl.cumsum(q, axis=0) - q).to(tl.float64)
                top = packed == best
                keep_lo = inside & ((before < mu_lo) | top)
                keep_hi = inside & ((before < mu_hi) | top)
                # ... and the token after the sorted ones (the narrowed part's end) is dropped for every mu
                end_mass = (mass_sort + tl.sum(q, axis=0)).to(tl.float64)
                if (tl.sum((keep_lo != keep_hi).to(tl.int32), axis=0) == 0) & (end_mass >= mu_hi):
                    phase = phase * 0 + _PHASE_CUT
                    cut = tl.min(tl.where(keep_lo, packed, _PACK_CEIL), axis=0)
                    kept_n = tl.where((hi == _PACK_CEIL) & complete, n_sort, 0)
    if phase == _PHASE_REDO:  # the exact sweep accumulates into these again and gathers from slot 0
        slots = tl.arange(0, _THRESHOLDS)
        tl.store(counts + base + _SLOT_FIRST + slots, tl.zeros([_THRESHOLDS], tl.int64))
        tl.store(masses + base + _SLOT_FIRST + slots, tl.zeros([_THRESHOLDS], tl.int64))
        tl.store(masses + base + _SLOT_LOWER, tl.zeros([], tl.int64))
    tl.store(approx_mass + 2 * row + tl.arange(0, 2), tl.zeros([2], tl.float64))  # zero for the next call
    tl.store(st_cursor + row, kept_n)
    tl.store(st_cut + row, cut)
    return phase


# --------------------------------------------------------------------------- kernels
@triton.jit
def _top_threshold(src, wanted, vocab, SAMPLE: tl.constexpr):
    """The key of an early gather: the Gaussian quantile of ``wanted`` tokens from the top, fitted
    to the row's first ``SAMPLE`` columns (int32; above every key when the sample has no spread or
    no finite value, so that nothing is gathered)."""

    column = tl.arange(0, SAMPLE)
    x = tl.load(src + column, mask=column < vocab, other=0.0)
    finite = (column < vocab) & (tl.abs(x) < float("inf"))
    n = tl.sum(finite.to(tl.float32), axis=0)
    xf = tl.where(finite, x, 0.0)
    mean = tl.sum(xf, axis=0) / tl.maximum(n, 1.0)
    sigma = tl.sqrt(tl.maximum(tl.sum(xf * xf, axis=0) / tl.maximum(n, 1.0) - mean * mean, 0.0))
    value = mean + sigma * _normal_quantile(1.0 - wanted / vocab.to(tl.float32))
    fit = (n >= 2.0) & (sigma > 0.0) & (value == value)
    return tl.where(fit, _key32(value), _BIG_INDEX)


@triton.jit
def _stats_tile(x, index, valid, key_t, cursor, best, nans, finite, total, squares, low):
    """One tile of :func:`_stats_kernel`: its statistics and its early-gather claims."""
    key = _key32(x)
    packed = _pack(key, index)
    best = tl.maximum(best, tl.where(valid, packed, _PACK_FLOOR))
    nans += (x != x).to(tl.int32)
    is_finite = tl.abs(x) < float("inf")
    finite += is_finite.to(tl.int32)
    xf = tl.where(is_finite, x, 0.0)
    total += xf
    squares += xf * xf
    low = tl.minimum(low, tl.where(valid & (x == x), x, float("inf")))
    take = (valid & (key >= key_t)).to(tl.int32)
    return best, nans, finite, total, squares, low, _claim(cursor, take), packed, take


@triton.jit
def _stats_lean_tile(x, index, valid, value_t, m, mi, nans, finite, total, squares, low, RAW: tl.constexpr = False):
    """One tile of the lean statistics loop: the fp32 maximum and its first index per lane (packed
    once at the end), and the early gather by an fp32 compare (``value_t``: ``x >= value_t`` iff
    ``key >= key_t``)."""
    gt = x > m
    m = tl.where(gt, x, m)
    mi = tl.where(gt, index, mi)
    nans += (x != x).to(tl.int32)
    is_finite = tl.abs(x) < float("inf")
    finite += is_finite.to(tl.int32)
    xf = tl.where(is_finite, x, 0.0)
    total += xf
    squares += xf * xf
    low = tl.minimum(low, tl.where(valid & (x == x), x, float("inf")))
    take = (x >= value_t).to(tl.int32)  # masked lanes hold -inf, below every finite threshold
    if RAW:
        packed = _raw32(x, index)
    else:
        packed = _pack32(_key32(x), index)
    return m, mi, nans, finite, total, squares, low, take, packed


@triton.jit
def _stats_fast_tile(x, index, value_t, m, mi, s1, s2, low, take_t):
    """One unmasked tile of the fast statistics loop (``STATS_FAST``): fp32 sums without finiteness
    tests (a NaN or an infinity makes them non-finite, and the chunk is then read again exactly),
    the maximum and its first index per lane, the minimum (NaN ignored), the early gather."""
    gt = x > m
    m = tl.where(gt, x, m)
    mi = tl.where(gt, index, mi)
    s1 += x
    s2 += x * x
    low = tl.minimum(low, x)
    take = (x >= value_t).to(tl.int32) * take_t
    return m, mi, s1, s2, low, take, _raw32(x, index)


@triton.jit(do_not_specialize=["k_value", "chunk_len", "num_chunks"])
def _stats_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    best_part, nan_part, finite_part, sum_part, sumsq_part, min_part,  # [B, chunks] each
    counts, masses, cursor,  # [B, POINTS] int64 x2, [B] int64: zeroed here for the first sweep
    scratch, outliers, first_count, first_key,  # [B, capacity], [B, OUTLIERS], [B] x2 int64: the early gather
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab, chunk_len, num_chunks, capacity,
    K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr, SAMPLE: tl.constexpr, OUTLIERS: tl.constexpr,
    BLOCK: tl.constexpr, LEAN: tl.constexpr = False, FAST: tl.constexpr = False,
):
    """Per program: the first maximum (packed), NaNs, the finite count/sum/sum of squares, the minimum;
    and the **early gather** of every token at or above :func:`_top_threshold` (``first_count``
    counts them all): rows with ``0 < k <= capacity / 4`` gather ``~4 k`` tokens into ``scratch``
    (usually the whole top-k answer), top-p-only rows ``~64`` into ``outliers`` (the head that
    places the first top-p bracket; at most ``OUTLIERS`` stored).

    Bytes: ``B V 4`` read, ``B chunks 32`` written, the gathered candidates (``~4 k * 8`` per row).
    """
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * chunk_len
    end = tl.minimum(start + chunk_len, vocab)
    src = logits_ptr + row * logits_stride
    k = _row_k(k_ptr, k_value, row, K_PER_ROW)
    p = _row_p(p_ptr, p_value, row, P_PER_ROW)
    use_k = (k > 0) & (k < vocab)
    top_k = use_k & (k <= capacity // 4)
    early = top_k | ((use_k == 0) & (p < 1.0))
    key_t = tl.zeros([], tl.int32) + _BIG_INDEX
    if early:
        wanted = tl.where(top_k, tl.minimum(tl.maximum(4 * k, 32), capacity // 4), tl.minimum(64, capacity // 4))
        key_t = _top_threshold(src, wanted.to(tl.float32), vocab, SAMPLE)
    if top_k:
        dest = scratch + row * capacity
        room = capacity
    else:
        dest = outliers + row * OUTLIERS
        room = capacity * 0 + OUTLIERS
    best = tl.zeros([BLOCK], tl.int64) + _PACK_FLOOR
    nans = tl.zeros([BLOCK], tl.int32)
    finite = tl.zeros([BLOCK], tl.int32)
    total = tl.zeros([BLOCK], tl.float32)
    squares = tl.zeros([BLOCK], tl.float32)
    low = tl.zeros([BLOCK], tl.float32) + float("inf")
    claims = first_count + row  # the early gather's cursor (the `cursor` argument is the sweeps')
    slot0 = tl.zeros([BLOCK], tl.int64)
    slot1 = tl.zeros([BLOCK], tl.int64)
    slot2 = tl.zeros([BLOCK], tl.int64)
    slot3 = tl.zeros([BLOCK], tl.int64)
    packed0 = tl.zeros([BLOCK], tl.int64)
    packed1 = tl.zeros([BLOCK], tl.int64)
    packed2 = tl.zeros([BLOCK], tl.int64)
    packed3 = tl.zeros([BLOCK], tl.int64)
    take0 = tl.zeros([BLOCK], tl.int32)
    take1 = tl.zeros([BLOCK], tl.int32)
    take2 = tl.zeros([BLOCK], tl.int32)
    take3 = tl.zeros([BLOCK], tl.int32)
    # 4 tiles per iteration (BLOCK = one element per thread: the claims need no layout change); an
    # iteration's early-gather candidates are stored in the next one, after its loads are issued.
    if LEAN:
        value_t = _key_floor_value(key_t)
        room32 = room.to(tl.int32)
        slot0 = tl.zeros([BLOCK], tl.int32)
        slot1 = tl.zeros([BLOCK], tl.int32)
        slot2 = tl.zeros([BLOCK], tl.int32)
        slot3 = tl.zeros([BLOCK], tl.int32)
        m = tl.zeros([BLOCK], tl.float32) + float("-inf")
        mi = tl.zeros([BLOCK], tl.int32) + _BIG_INDEX
        if FAST:  # full iterations unmasked and without finiteness tests; the masked tail below
            full_end = start + ((end - start) // (4 * BLOCK)) * (4 * BLOCK)
            s1 = tl.zeros([BLOCK], tl.float32)
            s2 = tl.zeros([BLOCK], tl.float32)
            low_f = tl.zeros([BLOCK], tl.float32) + float("inf")
            for offset in range(start, full_end, 4 * BLOCK):
                i0 = offset + tl.arange(0, BLOCK)
                i1 = i0 + BLOCK
                i2 = i1 + BLOCK
                i3 = i2 + BLOCK
                x0 = tl.load(src + i0)
                x1 = tl.load(src + i1)
                x2 = tl.load(src + i2)
                x3 = tl.load(src + i3)
                _put32(dest, room32, slot0, packed0, take0)
                _put32(dest, room32, slot1, packed1, take1)
                _put32(dest, room32, slot2, packed2, take2)
                _put32(dest, room32, slot3, packed3, take3)
                m, mi, s1, s2, low_f, take0, packed0 = _stats_fast_tile(x0, i0, value_t, m, mi, s1, s2,
                                                                           low_f, 1)
                m, mi, s1, s2, low_f, take1, packed1 = _stats_fast_tile(x1, i1, value_t, m, mi, s1, s2,
                                                                           low_f, 1)
                m, mi, s1, s2, low_f, take2, packed2 = _stats_fast_tile(x2, i2, value_t, m, mi, s1, s2,
                                                                           low_f, 1)
                m, mi, s1, s2, low_f, take3, packed3 = _stats_fast_tile(x3, i3, value_t, m, mi, s1, s2,
                                                                           low_f, 1)
                slot0 = _claim_many(claims, take0 + take1 + take2 + take3)
                slot1 = slot0 + take0
                slot2 = slot1 + take1
                slot3 = slot2 + take2
            tail = full_end
        else:
            tail = start
        for offset in range(tail, end, 4 * BLOCK):
            i0 = offset + tl.arange(0, BLOCK)
            i1 = i0 + BLOCK
            i2 = i1 + BLOCK
            i3 = i2 + BLOCK
            x0 = tl.load(src + i0, mask=i0 < end, other=float("-inf"))
            x1 = tl.load(src + i1, mask=i1 < end, other=float("-inf"))
            x2 = tl.load(src + i2, mask=i2 < end, other=float("-inf"))
            x3 = tl.load(src + i3, mask=i3 < end, other=float("-inf"))
            _put32(dest, room32, slot0, packed0, take0)
            _put32(dest, room32, slot1, packed1, take1)
            _put32(dest, room32, slot2, packed2, take2)
            _put32(dest, room32, slot3, packed3, take3)
            m, mi, nans, finite, total, squares, low, take0, packed0 = _stats_lean_tile(
                x0, i0, i0 < end, value_t, m, mi, nans, finite, total, squares, low, FAST)
            m, mi, nans, finite, total, squares, low, take1, packed1 = _stats_lean_tile(
                x1, i1, i1 < end, value_t, m, mi, nans, finite, total, squares, low, FAST)
            m, mi, nans, finite, total, squares, low, take2, packed2 = _stats_lean_tile(
                x2, i2, i2 < end, value_t, m, mi, nans, finite, total, squares, low, FAST)
            m, mi, nans, finite, total, squares, low, take3, packed3 = _stats_lean_tile(
                x3, i3, i3 < end, value_t, m, mi, nans, finite, total, squares, low, FAST)
            slot0 = _claim_many(claims, take0 + take1 + take2 + take3)
            slot1 = slot0 + take0
            slot2 = slot1 + take1
            slot3 = slot2 + take2
        _put32(dest, room32, slot0, packed0, take0)
        _put32(dest, room32, slot1, packed1, take1)
        _put32(dest, room32, slot2, packed2, take2)
        _put32(dest, room32, slot3, packed3, take3)
        if FAST:
            bad = tl.sum(((tl.abs(s1) < float("inf")) & (tl.abs(s2) < float("inf")) == 0).to(tl.int32), axis=0)
            if bad == 0:  # every value of the full iterations finite
                finite += (full_end - start) // BLOCK
                total += s1
                squares += s2
                low = tl.minimum(low, low_f)
            else:  # a NaN, an infinity or a huge value: the full iterations read again, exactly (no gather)
                no_take = value_t * float("nan")
                for offset in range(start, full_end, 4 * BLOCK):
                    i0 = offset + tl.arange(0, BLOCK)
                    i1 = i0 + BLOCK
                    i2 = i1 + BLOCK
                    i3 = i2 + BLOCK
                    x0 = tl.load(src + i0)
                    x1 = tl.load(src + i1)
                    x2 = tl.load(src + i2)
                    x3 = tl.load(src + i3)
                    m, mi, nans, finite, total, squares, low, _, _ = _stats_lean_tile(
                        x0, i0, i0 < end, no_take, m, mi, nans, finite, total, squares, low)
                    m, mi, nans, finite, total, squares, low, _, _ = _stats_lean_tile(
                        x1, i1, i1 < end, no_take, m, mi, nans, finite, total, squares, low)
                    m, mi, nans, finite, total, squares, low, _, _ = _stats_lean_tile(
                        x2, i2, i2 < end, no_take, m, mi, nans, finite, total, squares, low)
                    m, mi, nans, finite, total, squares, low, _, _ = _stats_lean_tile(
                        x3, i3, i3 < end, no_take, m, mi, nans, finite, total, squares, low)
        m_all = tl.max(m, axis=0)
        first = tl.min(tl.where(m == m_all, mi, _BIG_INDEX), axis=0)
        best = tl.zeros([BLOCK], tl.int64) + _pack(_key32(m_all), first)
    else:
        for offset in range(start, end, 4 * BLOCK):
            index0 = offset + tl.arange(0, BLOCK)
            index1 = index0 + BLOCK
            index2 = index1 + BLOCK
            index3 = index2 + BLOCK
            x0 = tl.load(src + index0, mask=index0 < end, other=float("-inf"))
            x1 = tl.load(src + index1, mask=index1 < end, other=float("-inf"))
            x2 = tl.load(src + index2, mask=index2 < end, other=float("-inf"))
            x3 = tl.load(src + index3, mask=index3 < end, other=float("-inf"))
            _put(dest, room, slot0, packed0, take0)
            _put(dest, room, slot1, packed1, take1)
            _put(dest, room, slot2, packed2, take2)
            _put(dest, room, slot3, packed3, take3)
            best, nans, finite, total, squares, low, slot0, packed0, take0 = _stats_tile(
                x0, index0, index0 < end, key_t, claims, best, nans, finite, total, squares, low)
            best, nans, finite, total, squares, low, slot1, packed1, take1 = _stats_tile(
                x1, index1, index1 < end, key_t, claims, best, nans, finite, total, squares, low)
            best, nans, finite, total, squares, low, slot2, packed2, take2 = _stats_tile(
                x2, index2, index2 < end, key_t, claims, best, nans, finite, total, squares, low)
            best, nans, finite, total, squares, low, slot3, packed3, take3 = _stats_tile(
                x3, index3, index3 < end, key_t, claims, best, nans, finite, total, squares, low)
        _put(dest, room, slot0, packed0, take0)
        _put(dest, room, slot1, packed1, take1)
        _put(dest, room, slot2, packed2, take2)
        _put(dest, room, slot3, packed3, take3)
    out = row * num_chunks + chunk
    tl.store(best_part + out, tl.max(best, axis=0))
    tl.store(nan_part + out, tl.sum(nans, axis=0))
    tl.store(finite_part + out, tl.sum(finite, axis=0))
    tl.store(sum_part + out, tl.sum(total, axis=0))
    tl.store(sumsq_part + out, tl.sum(squares, axis=0))
    tl.store(min_part + out, tl.min(low, axis=0))
    if chunk == 0:
        slots = tl.arange(0, _POINTS)
        tl.store(counts + row * _POINTS + slots, tl.zeros([_POINTS], tl.int64))
        tl.store(masses + row * _POINTS + slots, tl.zeros([_POINTS], tl.int64))
        tl.store(cursor + row, tl.zeros([], tl.int64))
        tl.store(first_key + row, tl.where(early, key_t, _BIG_INDEX).to(tl.int64))


@triton.jit
def _first_plan(row, best_part, nan_part, finite_part, sum_part, sumsq_part, min_part, placement, k_ptr, k_value,
                p_ptr, p_value, st_first_count, st_first_key, outliers, vocab, num_chunks, capacity,
                K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr, CHUNKS: tl.constexpr, OUTLIERS: tl.constexpr,
                RAW: tl.constexpr = False):
    """The row's plan from the stats partials (every program of the row computes the same one).
    ``RAW``: the early gather holds :func:`_raw32` candidates (``STATS_FAST``)."""
    chunk = tl.arange(0, CHUNKS)
    valid = chunk < num_chunks
    part = row * num_chunks + chunk
    best = tl.max(tl.load(best_part + part, mask=valid, other=_PACK_FLOOR), axis=0)
    nans = tl.sum(tl.load(nan_part + part, mask=valid, other=0), axis=0)
    n = tl.sum(tl.load(finite_part + part, mask=valid, other=0), axis=0).to(tl.float32)
    total = tl.sum(tl.load(sum_part + part, mask=valid, other=0.0), axis=0)
    squares = tl.sum(tl.load(sumsq_part + part, mask=valid, other=0.0), axis=0)
    low = tl.min(tl.load(min_part + part, mask=valid, other=float("inf")), axis=0)
    low = tl.where(low < float("inf"), low, float("-inf"))  # a row of +inf: the search bound is -inf
    best_key = (best >> 32).to(tl.int32)
    row_max = _key_value(best_key)
    k = _row_k(k_ptr, k_value, row, K_PER_ROW)
    p = _row_p(p_ptr, p_value, row, P_PER_ROW)
    use_k = (k > 0) & (k < vocab)
    use_p = p < 1.0
    active = (nans == 0) & (use_k | use_p) & (row_max > float("-inf"))
    target = tl.where(use_k, _TARGET_COUNT, _TARGET_MASS)
    # Gaussian fit of the finite logits (fp32; only the thresholds depend on it)
    mean = total / tl.maximum(n, 1.0)
    sigma = tl.sqrt(tl.maximum(squares / tl.maximum(n, 1.0) - mean * mean, 0.0))
    fit = (n >= 2.0) & (sigma > 0.0) & (sigma < float("inf")) & (tl.abs(row_max) < float("inf"))
    sigma = tl.where(fit, sigma, 1.0)
    peaked = (row_max - mean) > _PEAKED_SIGMAS * sigma
    slot = tl.arange(0, _THRESHOLDS)
    if target == _TARGET_COUNT:
        factors = tl.load(placement + 2 * _THRESHOLDS + slot)
        wanted = tl.minimum(k.to(tl.float32) * factors, n)
        # the first gather (slot 3): ~3k tokens, at most half the capacity, above the 1.3k of slot 2
        wanted = tl.where(slot == 3, tl.maximum(tl.minimum(wanted, (capacity // 2).to(tl.float32)),
                                                1.3 * k.to(tl.float32)), wanted)
        values = mean + sigma * _normal_quantile(1.0 - wanted / tl.maximum(n, 1.0))
        values = tl.minimum(values, row_max)
        gather_lo = tl.zeros([], tl.int32) + (_SLOT_FIRST + 3)
        gather_hi = tl.zeros([], tl.int32)  # slot 0: PACK_CEIL, all of the top
        first_gather = k <= capacity // 2
    else:
        # Mass model: the tokens of the early gather (at or above T_e, at most OUTLIERS, exact
        # values: the head H = sum exp(x - max)) plus a Gaussian bulk below T_e, whose mass is
        # G Phi((T_e - m') / s) with G = n exp(mean + s^2 / 2 - max) and m' = mean + s^2 (exp tilts
        # N(mean, s^2) to N(m', s^2)). The cut c leaves the mass p (H + bulk) above it.
        column = tl.arange(0, OUTLIERS)
        n_e = tl.load(st_first_count + row)
        key_e = tl.load(st_first_key + row)
        have = (key_e != _BIG_INDEX) & (n_e <= OUTLIERS)
        stored = tl.where(have, n_e, 0)
        if RAW:
            head_raw = tl.load(outliers + row * OUTLIERS + column, mask=column < stored, other=0)
            head_values = (head_raw >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            head = tl.sum(tl.where(column < stored, tl.exp(head_values - row_max), 0.0), axis=0)
        else:
            head_keys = tl.load(outliers + row * OUTLIERS + column, mask=column < stored, other=_PACK_FLOOR) >> 32
            head = tl.sum(tl.where(head_keys > _PACK_FLOOR >> 32, tl.exp(_key_value(head_keys) - row_max), 0.0),
                          axis=0)
        t_e = tl.where(have, _key_value(tl.minimum(key_e, best_key.to(tl.int64))), row_max)
        head = tl.where(have, head, 0.0)
        mean_mass = mean + sigma * sigma
        bulk = n * tl.exp(tl.minimum(mean + 0.5 * sigma * sigma - row_max, 60.0))
        u_e = _normal_cdf((t_e - mean_mass) / sigma)
        u_c = (1.0 - p) * (u_e + head / tl.maximum(bulk, 1e-30))  # mass fraction of the bulk below c
        in_head = u_c >= u_e
        cut = mean_mass + sigma * _normal_quantile(tl.minimum(u_c, u_e))
        cut = tl.minimum(tl.where(in_head, t_e, cut), row_max)
        # One bracket [lo, hi) around c holding ~capacity / 2 tokens of the fitted bulk (slots 2..5 =
        # hi, 6..9 = lo; _sweep_pair evaluates just these two thresholds); the whole top when few
        # tokens lie above it or the cut lies in the head.
        # ~capacity / 4 fitted tokens on either side of c (fractions of the count CDF)
        share = (capacity * 0.25) / tl.maximum(n, 1.0)
        u_count = _normal_cdf((cut - mean) / sigma)
        hi_value = mean + sigma * _normal_quantile(tl.minimum(u_count + share, 1.0))
        lo_value = tl.minimum(mean + sigma * _normal_quantile(tl.maximum(u_count - share, 0.0)), row_max)
        whole_top = in_head | (u_count + 2.0 * share >= 1.0) | (hi_value >= row_max)
        values = tl.where(slot < 4, hi_value, lo_value)
        gather_lo = tl.zeros([], tl.int32) + (_SLOT_FIRST + 4)
        gather_hi = tl.where(whole_top, 0, tl.zeros([], tl.int32) + _SLOT_FIRST)
        first_gather = n >= 0.0
    thresholds = _value_threshold(values)
    # thresholds strictly below the top and descending; without a fit, none (all PACK_CEIL)
    thresholds = tl.where(fit, thresholds, _PACK_CEIL)
    thresholds = tl.where(thresholds > best, _PACK_CEIL, thresholds)
    if target == _TARGET_MASS:
        thresholds = tl.where((slot < 4) & (gather_hi == 0), _PACK_CEIL, thresholds)
    first_gather = first_gather & fit
    # The early top-k gather of _stats_kernel holds the k-th best within the capacity: no sweep,
    # the resolve sorts it (slot 2 = its threshold, count = every gathered token).
    first_count = tl.load(st_first_count + row)
    first_key = tl.load(st_first_key + row)
    early = (target == _TARGET_COUNT) & (first_key != _BIG_INDEX) & (first_count >= k) & (first_count <= capacity)
    thresholds = tl.where(early, first_key << 32, thresholds)
    gather_lo = tl.where(early, _SLOT_FIRST, gather_lo)
    gather_hi = tl.where(early, 0, gather_hi)
    first_gather = first_gather | early
    need_mass = (target == _TARGET_MASS) | (use_k & use_p & (k > capacity))
    # p <= 0 (or a negative per-row p) keeps the first maximum only; so does k == 1
    only_best = (use_p & (p <= 0.0)) | (use_k & (k == 1))
    phase = tl.where(active, tl.where(only_best, _PHASE_CUT, _PHASE_OPEN), _PHASE_COPY)
    early = early & (phase == _PHASE_OPEN)  # a row the plan resolves keeps no candidate list (cursor 0)
    return (phase, target, k, p, best, low, thresholds, first_gather, gather_lo, gather_hi, need_mass,
            use_k, use_p, early, first_count)


@triton.jit(do_not_specialize=["k_value", "p_value", "chunk_len", "num_chunks"])
def _pass_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    best_part, nan_part, finite_part, sum_part, sumsq_part, min_part,  # [B, chunks] stats
    placement,  # [3, THRESHOLDS] fp32 (MASS_OFFSETS, PEAK_DEPTHS, COUNT_FACTORS)
    st_phase, st_target, st_k, st_p, st_limit, st_best, st_min, st_cut, st_flags, st_cursor,  # [B] state
    points, counts, masses,  # [B, POINTS] int64
    scratch,  # [B, capacity] int64 packed candidates
    st_first_count, st_first_key, outliers,  # [B] int64 x2, [B, OUTLIERS] int64: the early gather of _stats_kernel
    k_ptr, k_value, p_ptr, p_value,  # [B] int32/int64 or a scalar; [B] fp32 or a scalar
    vocab, chunk_len, num_chunks, capacity,
    PASS: tl.constexpr, MASS: tl.constexpr, K_PER_ROW: tl.constexpr, P_PER_ROW: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr, MASS_BLOCK: tl.constexpr,
    PAIR_BLOCK: tl.constexpr, OUTLIERS: tl.constexpr, K_GIVEN: tl.constexpr, LEAN: tl.constexpr = False,
    LATE: tl.constexpr = False, RAW: tl.constexpr = False,
    approx_mass=None,  # [B, 2] fp64: APPROX, the sums of w' above hi and below lo (zeroed by the finish)
    APPROX: tl.constexpr = False, SWEEP_RAW: tl.constexpr = False,
):
    """One sweep of a row's columns ``[chunk * chunk_len, ...)``: thresholds and/or the gather.

    Launched twice per pass: ``MASS`` serves the rows whose thresholds need integer masses, the
    other launch the rest (counts only, or a gather only), so the cheap sweeps keep their low
    register count. In the first pass both launches derive the same plan and store it.

    Bytes: ``B V 4`` read for the rows that sweep (16 bytes of state for the others), the
    candidates written, ``B chunks 16 * 16`` bytes of atomics.
    """
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * chunk_len
    end = tl.minimum(start + chunk_len, vocab)
    src = logits_ptr + row * logits_stride
    base = row * _POINTS
    slot = tl.arange(0, _THRESHOLDS)
    if PASS == _PASS_FIRST:
        (phase, target, k, p, best, low, thresholds, gather, lo_slot, hi_slot, need_mass, use_k,
         use_p, early, first_count) = _first_plan(row, best_part, nan_part, finite_part, sum_part, sumsq_part,
                                                  min_part, placement, k_ptr, k_value, p_ptr, p_value,
                                                  st_first_count, st_first_key, outliers, vocab, num_chunks,
                                                  capacity, K_PER_ROW, P_PER_ROW, CHUNKS, OUTLIERS, RAW)
        if chunk == 0:
            tl.store(st_phase + row, phase)
            tl.store(st_target + row, target)
            tl.store(st_k + row, tl.where(use_k, k, 0))
            tl.store(st_p + row, tl.where(use_p, p, 1.0))
            tl.store(st_limit + row, tl.zeros([], tl.float64) - 1.0)
            tl.store(st_best + row, best)
            tl.store(st_min + row, _key32(low).to(tl.int64))
            tl.store(st_cut + row, best)  # the cut of rows resolved by the plan (first maximum only)
            flags = (gather.to(tl.int32) | 2 | (need_mass.to(tl.int32) << 2) | 8) | ((lo_slot | (hi_slot << 4)) << 8)
            if SWEEP_RAW:  # (constexpr: the default pass compiles no such bit)
                flags = flags | ((target == _TARGET_MASS).to(tl.int32) << 16)
            tl.store(st_flags + row, flags)
            tl.store(points + base + slot + _SLOT_FIRST, thresholds)
            tl.store(points + base, tl.zeros([], tl.int64) + _PACK_CEIL)
            tl.store(points + base + _SLOT_UPPER, tl.zeros([], tl.int64) + _PACK_CEIL)
            lows = tl.arange(0, _POINTS)
            is_low = lows >= _SLOT_LOWER
            tl.store(points + base + lows, tl.zeros([_POINTS], tl.int64) + _PACK_FLOOR, mask=is_low)
            tl.store(counts + base + lows, tl.zeros([_POINTS], tl.int64) + vocab, mask=is_low)
            if early:  # nothing to sweep: the early gather is the bracket (nobody else touches these)
                tl.store(counts + base + slot + _SLOT_FIRST, tl.zeros([_THRESHOLDS], tl.int64) + first_count)
                tl.store(st_cursor + row, first_count)
                if RAW:  # the raw candidates in pack form, for the finish and the apply
                    held = tl.arange(0, PAIR_BLOCK)
                    for offset in range(0, first_count, PAIR_BLOCK):
                        inside = offset + held < first_count
                        raw = tl.load(scratch + row * capacity + offset + held, mask=inside, other=0)
                        tl.store(scratch + row * capacity + offset + held, _raw_to_packed(raw), mask=inside)
        lo = tl.sum(tl.where(slot + _SLOT_FIRST == lo_slot, thresholds, 0), axis=0)
        hi = tl.where(hi_slot == 0, _PACK_CEIL, tl.sum(tl.where(slot + _SLOT_FIRST == hi_slot, thresholds, 0),
                                                           axis=0))
    else:
        phase = tl.load(st_phase + row)
        flags = tl.load(st_flags + row)
        gather = (flags & 1) != 0
        evaluate = (flags & 2) != 0
        need_mass = (flags & 4) != 0
        best = tl.load(st_best + row)
        thresholds = tl.load(points + base + slot + _SLOT_FIRST)
        lo = tl.load(points + base + _SLOT_LOWER)
        hi = tl.load(points + base + _SLOT_UPPER)
    if PASS == _PASS_FIRST:
        evaluate = early == 0  # an early row has nothing to sweep
    # One launch serves every row; MASS (top-p given) compiles the mass sweeps in.
    if (phase == _PHASE_OPEN) & (evaluate | (PASS != _PASS_FIRST)):
        row_max = _key_value((best >> 32).to(tl.int32))
        rows_scratch = scratch + row * capacity
        cursor = st_cursor + row
        swept = evaluate == 0  # (always false here: a row that evaluates)
        if MASS:
            if evaluate & need_mass:
                if PASS == _PASS_FIRST:  # key-aligned thresholds; S for top-p-only rows
                    if K_GIVEN:  # rows with k beyond the capacity and p: 8 thresholds with masses
                        if target == _TARGET_MASS:  # two thresholds (hi in slots 2..5, lo in 6..9) and the gather
                            if LEAN:
                                found, mass, total = _sweep_pair_lean(src, start, end, row_max,
                                                                      (hi >> 32).to(tl.int32), (lo >> 32).to(tl.int32),
                                                                      rows_scratch, cursor, capacity, gather,
                                                                      PAIR_BLOCK)
                            else:
                                found, mass, total = _sweep_pair(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                                 (lo >> 32).to(tl.int32), rows_scratch, cursor,
                                                                 capacity, gather, PAIR_BLOCK)
                        else:
                            found, mass, total = _sweep(src, start, end, row_max, thresholds, lo, hi, rows_scratch,
                                                        cursor, capacity, gather, True, True, True, True, MASS_BLOCK)
                    elif APPROX:  # top-p alone, approximate masses (the finish resolves or redoes the row)
                        c_hi, above, below = _sweep_bracket(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                            (lo >> 32).to(tl.int32), rows_scratch, cursor, capacity,
                                                            gather, PAIR_BLOCK, True)
                        tl.atomic_add(approx_mass + 2 * row, above, sem="relaxed")
                        tl.atomic_add(approx_mass + 2 * row + 1, below, sem="relaxed")
                        found = tl.where(slot < 4, c_hi, 0)  # (the count at lo: the finish adds the gathered)
                        mass = tl.zeros([_THRESHOLDS], tl.int64)
                        total = tl.zeros([], tl.int64)
                    elif SWEEP_RAW:  # top-p alone: the lower end's count and mass completed by the finish
                        c_hi, m_hi, total = _sweep_bracket(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                           (lo >> 32).to(tl.int32), rows_scratch, cursor, capacity,
                                                           gather, PAIR_BLOCK, False)
                        found = tl.where(slot < 4, c_hi, 0)
                        mass = tl.where(slot < 4, m_hi, 0)
                    elif LATE:  # top-p alone, the bracket gathered by the apply
                        found, mass, total = _sweep_pair_lean(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                              (lo >> 32).to(tl.int32), rows_scratch, cursor, capacity,
                                                              gather, PAIR_BLOCK, False)
                    elif LEAN:  # top-p alone: every row's target is its mass
                        found, mass, total = _sweep_pair_lean(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                              (lo >> 32).to(tl.int32), rows_scratch, cursor, capacity,
                                                              gather, PAIR_BLOCK)
                    else:
                        found, mass, total = _sweep_pair(src, start, end, row_max, (hi >> 32).to(tl.int32),
                                                         (lo >> 32).to(tl.int32), rows_scratch, cursor, capacity,
                                                         gather, PAIR_BLOCK)
                    tl.atomic_add(masses + base + _SLOT_LOWER, total, sem="relaxed")
                else:
                    found, mass, _ = _sweep(src, start, end, row_max, thresholds, lo, hi, rows_scratch, cursor,
                                            capacity, gather, False, True, True, False, MASS_BLOCK)
                tl.atomic_add(masses + base + _SLOT_FIRST + slot, mass, sem="relaxed")
                tl.atomic_add(counts + base + _SLOT_FIRST + slot, found, sem="relaxed")
                swept = evaluate
        if K_GIVEN & (swept == 0):  # (without k every row that evaluates has swept its masses)
            if PASS == _PASS_FIRST:
                found, _, _ = _sweep(src, start, end, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity,
                                     gather, True, True, False, False, COUNT_BLOCK)
                tl.atomic_add(counts + base + _SLOT_FIRST + slot, found, sem="relaxed")
            elif evaluate:
                found, _, _ = _sweep(src, start, end, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity,
                                     gather, False, True, False, False, COUNT_BLOCK)
                tl.atomic_add(counts + base + _SLOT_FIRST + slot, found, sem="relaxed")
            else:  # gather only
                _sweep(src, start, end, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity, gather, False,
                       False, False, False, BLOCK)


@triton.jit(do_not_specialize=["chunk_len"])
def _redo_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    st_phase, st_flags, st_best, st_cursor,  # [B] state
    points, counts, masses,  # [B, POINTS] int64
    scratch,  # [B, capacity] int64 packed candidates
    vocab, chunk_len, capacity,
    PAIR_BLOCK: tl.constexpr,
):
    """APPROX: the exact first sweep (:func:`_sweep_pair_lean`, the same bracket) of the rows whose
    approximate masses left the cut uncertain (``PHASE_REDO``); the others return at once.

    Bytes: ``V 4`` read per redone row, its candidates written; ~8 per other row.
    """
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if tl.load(st_phase + row) == _PHASE_REDO:
        start = chunk * chunk_len
        end = tl.minimum(start + chunk_len, vocab)
        flags = tl.load(st_flags + row)
        base = row * _POINTS
        lo = tl.load(points + base + ((flags >> 8) & 15))
        hi = tl.load(points + base + ((flags >> 12) & 15))
        row_max = _key_value((tl.load(st_best + row) >> 32).to(tl.int32))
        found, mass, total = _sweep_pair_lean(logits_ptr + row * logits_stride, start, end, row_max,
                                              (hi >> 32).to(tl.int32), (lo >> 32).to(tl.int32),
                                              scratch + row * capacity, st_cursor + row, capacity, flags & 1,
                                              PAIR_BLOCK)
        slot = tl.arange(0, _THRESHOLDS)
        tl.atomic_add(masses + base + _SLOT_LOWER, total, sem="relaxed")
        tl.atomic_add(masses + base + _SLOT_FIRST + slot, mass, sem="relaxed")
        tl.atomic_add(counts + base + _SLOT_FIRST + slot, found, sem="relaxed")


@triton.jit
def _search_round(row, src, base, slot, st_flags, st_best, st_cursor, points, counts, masses, scratch, vocab, capacity,
                  BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr, MASS_BLOCK: tl.constexpr):
    """One whole-row sweep of an open row's planned round (thresholds and/or the gather)."""
    flags = tl.load(st_flags + row, volatile=True)
    gather = (flags & 1) != 0
    evaluate = (flags & 2) != 0
    need_mass = (flags & 4) != 0
    best = tl.load(st_best + row, volatile=True)
    thresholds = tl.load(points + base + slot + _SLOT_FIRST, volatile=True)
    lo = tl.load(points + base + _SLOT_LOWER, volatile=True)
    hi = tl.load(points + base + _SLOT_UPPER, volatile=True)
    row_max = _key_value((best >> 32).to(tl.int32))
    rows_scratch = scratch + row * capacity
    cursor = st_cursor + row
    if evaluate:
        if need_mass:
            found, mass, _ = _sweep(src, 0, vocab, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity,
                                    gather, False, True, True, False, MASS_BLOCK)
            tl.atomic_add(masses + base + _SLOT_FIRST + slot, mass)
        else:
            found, _, _ = _sweep(src, 0, vocab, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity,
                                 gather, False, True, False, False, COUNT_BLOCK)
        tl.atomic_add(counts + base + _SLOT_FIRST + slot, found)
    else:
        _sweep(src, 0, vocab, row_max, thresholds, lo, hi, rows_scratch, cursor, capacity, gather, False, False,
               False, False, BLOCK)


@triton.jit(do_not_specialize=["logits_stride"])  # its rare search sweeps need no alignment: one compile (~17 s)
def _finish_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    st_phase, st_target, st_k, st_p, st_limit, st_best, st_min, st_cut, st_flags, st_cursor,  # [B] state
    points, counts, masses,  # [B, POINTS] int64
    scratch,  # [B, capacity] int64
    unresolved,  # [1] int32: rows left open after MAX_ROUNDS (never, by the bound)
    searched,  # [1] int32: rows the first resolve left open (a running total: the slow path's use)
    vocab, capacity,
    BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr, MASS_BLOCK: tl.constexpr, NARROW_TILE: tl.constexpr = 0,
    out_ptr=None, out_stride=0,  # [B, V] fp32 (LATE: the finish writes what the apply left)
    LATE: tl.constexpr = False, IN_PLACE: tl.constexpr = True,
    approx_mass=None, redone=None, slack=1.0,  # [B, 2] fp64, [1] int32, the band's factor (>= 1)
    part_sums=None,  # [B, PARTS] int64: SWEEP_RAW, the first narrowing's part masses (_complete_bracket)
    APPROX: tl.constexpr = False, REDONE: tl.constexpr = False, SWEEP_RAW: tl.constexpr = False,
):
    """One program per row still open: sweep + resolve rounds over the whole row, bounded.

    Bytes: ``V 4`` per round of an open row (a few rounds at most on real inputs); idle rows ~4.
    """
    row = tl.program_id(0).to(tl.int64)
    src = logits_ptr + row * logits_stride
    base = row * _POINTS
    slot = tl.arange(0, _THRESHOLDS)
    phase = tl.load(st_phase + row)
    if LATE:  # after the apply (LATE): it wrote the rows outside their brackets, or nothing (open rows)
        dst = out_ptr + row * out_stride
        late_row, _, _ = _late_bracket(row, phase, tl.load(st_flags + row), points, counts, masses, st_p, capacity)
        whole_row = (phase == _PHASE_OPEN) & (late_row == 0)
        if whole_row:  # its first bracket was not gathered (the sweep gathers nothing in LATE mode): a miss
            tl.store(st_flags + row, tl.load(st_flags + row) & -2)
            tl.debug_barrier()
    else:
        dst = logits_ptr + row * logits_stride  # (unused)
        late_row = phase < 0
        whole_row = phase < 0
    if APPROX:  # after the approximate sweep: every open row is resolved or sent to the exact sweep
        if phase == _PHASE_OPEN:
            phase = _approx_resolve(row, st_p, st_best, st_min, st_cut, st_flags, st_cursor, points, counts, masses,
                                    scratch, src, approx_mass, vocab, capacity, slack)
            tl.store(st_phase + row, phase)
            if phase == _PHASE_REDO:
                tl.atomic_add(redone, 1)
        else:
            tl.store(approx_mass + 2 * row + tl.arange(0, 2), tl.zeros([2], tl.float64))
    else:  # (constexpr options: the default finish compiles neither)
        if REDONE:  # after the exact sweep of _redo_kernel: its first resolve
            if phase == _PHASE_REDO:
                phase = phase * 0 + _PHASE_OPEN
                tl.store(st_phase + row, phase)
        if SWEEP_RAW:  # the bracket's lower end from its candidates
            if (phase == _PHASE_OPEN) & (((tl.load(st_flags + row) >> 16) & 1) != 0):
                _complete_bracket(row, st_flags, st_best, st_min, st_cursor, points, counts, masses, scratch,
                                  part_sums, vocab, capacity)
    # Round 0 resolves the first pass; rounds 1 .. MAX_ROUNDS sweep first. One call site of
    # _resolve_row (it is inlined: two sites doubled the kernel's size and compile time).
    rounds = 0
    if not APPROX:  # (the approximate finish compiles no search round)
        while (phase == _PHASE_OPEN) & (rounds <= _MAX_ROUNDS):
            if rounds > 0:
                _search_round(row, src, base, slot, st_flags, st_best, st_cursor, points, counts, masses, scratch,
                              vocab, capacity, BLOCK, COUNT_BLOCK, MASS_BLOCK)
                tl.debug_barrier()
            phase = _resolve_row(row, st_phase, st_target, st_k, st_p, st_limit, st_best, st_min, st_cut, st_flags,
                                 st_cursor, points, counts, masses, scratch, capacity, dst, late_row,
                                 NARROW_TILE, part_sums, SWEEP_RAW)
            tl.debug_barrier()
            if (rounds == 0) & (phase == _PHASE_OPEN):
                tl.atomic_add(searched, 1)
            rounds += 1
        if phase == _PHASE_OPEN:
            tl.atomic_add(unresolved, 1)
    if LATE:
        # an open row the apply left alone, or (never seen) a LATE row that needed search rounds: the whole row
        if (whole_row | (late_row & (rounds > 1))) & (phase == _PHASE_CUT):
            cut = tl.load(st_cut + row, volatile=True)
            for offset in range(0, vocab, BLOCK):
                index = offset + tl.arange(0, BLOCK)
                valid = index < vocab
                x = tl.load(src + index, mask=valid, other=0.0)
                keep = _pack(_key32(x), index) >= cut
                if IN_PLACE:
                    tl.store(dst + index, tl.full([BLOCK], float("-inf"), tl.float32), mask=valid & (keep == 0))
                else:
                    tl.store(dst + index, tl.where(keep, x, float("-inf")), mask=valid)


@triton.jit
def _late_tile(x, index, valid, lo_v, hi_v, hi_open, dst, IN_PLACE: tl.constexpr, FULL: tl.constexpr):
    """One tile of a LATE row's apply: ``-inf`` below the bracket (the rest written back as read, or
    out of place copied), and the bracket's candidates ``(take, packed)`` to gather."""
    below = x < lo_v
    if IN_PLACE and not FULL:
        tl.store(dst + index, tl.full(x.shape, float("-inf"), tl.float32), mask=valid & below)
    else:
        tl.store(dst + index, tl.where(below, float("-inf"), x), mask=valid)
    take = valid & (below == 0) & ((x < hi_v) | hi_open)
    return take.to(tl.int32), _pack32(_key32(x), index)


@triton.jit
def _apply_kernel(
    logits_ptr, logits_stride,  # [B, V] fp32
    out_ptr, out_stride,  # [B, V] fp32 (may alias logits)
    st_phase, st_cut,  # [B] state
    first_count,  # [B] int64: reset to 0 for the next call's early gather
    st_kept, scratch,  # [B] int64 (the cursor), [B, capacity] int64: a kept set held by the first st_kept candidates
    vocab, chunk_len, capacity,
    IN_PLACE: tl.constexpr, BLOCK: tl.constexpr, FULL: tl.constexpr = False,
    st_flags=None, points=None, counts=None, masses=None, st_p=None,  # LATE: the first sweep's bracket
    LATE: tl.constexpr = False, GATHER_BLOCK: tl.constexpr = 256,
):
    """``-inf`` where ``packed < cut`` (resolved rows); copy the rest out of place.

    A row whose whole kept set lies among its first ``st_kept <= SORT_SMALL`` candidates (top-k
    answered by the early gather) is written without reading it: its kept values are loaded by
    index, the chunk is set to ``-inf``, the kept values are stored back.

    Bytes: ``B V 4`` read + the masked entries written (in place) or ``B V 4`` written; rows
    answered from their candidates: ``V 4`` written and ``~k 40`` read.
    """
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * chunk_len
    end = tl.minimum(start + chunk_len, vocab)
    src = logits_ptr + row * logits_stride
    dst = out_ptr + row * out_stride
    phase = tl.load(st_phase + row)
    cut = tl.load(st_cut + row)
    cut_key = cut >> 32
    cut_index = ((cut_key << 32) - cut + _BIG_INDEX).to(tl.int32)
    cut_key = cut_key.to(tl.int32)
    filtered = phase == _PHASE_CUT
    if chunk == 0:
        tl.store(first_count + row, tl.zeros([], tl.int64))
    kept_n = tl.load(st_kept + row)
    todo = filtered
    if not IN_PLACE:
        todo = phase >= 0  # out of place every row is written
    late = phase < 0
    if LATE:  # before the finish: rows still open are left to it, but for a top-p bracket that holds the cut
        late, lo, hi = _late_bracket(row, phase, tl.load(st_flags + row), points, counts, masses, st_p, capacity)
        kept_n = kept_n * 0  # (the cursor counts this launch's gather)
        todo = todo & (phase != _PHASE_OPEN)
        if late:
            # -inf below the bracket, the bracket gathered (the finish drops its part below the cut), the rest kept;
            # 4 one-element-per-thread tiles per iteration, one slot claim per lane, stored one iteration later
            lo_v = _key_floor_value((lo >> 32).to(tl.int32))
            hi_key = (hi >> 32).to(tl.int32)
            hi_open = hi_key > _KEY_POS_INF
            hi_v = _key_floor_value(tl.minimum(hi_key, _KEY_POS_INF))
            cursor = st_kept + row
            rows_scratch = scratch + row * capacity
            room = capacity.to(tl.int32)
            s0 = tl.zeros([GATHER_BLOCK], tl.int32)
            s1 = tl.zeros([GATHER_BLOCK], tl.int32)
            s2 = tl.zeros([GATHER_BLOCK], tl.int32)
            s3 = tl.zeros([GATHER_BLOCK], tl.int32)
            p0 = tl.zeros([GATHER_BLOCK], tl.int64)
            p1 = tl.zeros([GATHER_BLOCK], tl.int64)
            p2 = tl.zeros([GATHER_BLOCK], tl.int64)
            p3 = tl.zeros([GATHER_BLOCK], tl.int64)
            t0 = tl.zeros([GATHER_BLOCK], tl.int32)
            t1 = tl.zeros([GATHER_BLOCK], tl.int32)
            t2 = tl.zeros([GATHER_BLOCK], tl.int32)
            t3 = tl.zeros([GATHER_BLOCK], tl.int32)
            for offset in range(start, end, 4 * GATHER_BLOCK):
                i0 = offset + tl.arange(0, GATHER_BLOCK)
                i1 = i0 + GATHER_BLOCK
                i2 = i1 + GATHER_BLOCK
                i3 = i2 + GATHER_BLOCK
                x0 = tl.load(src + i0, mask=i0 < end, other=float("-inf"))
                x1 = tl.load(src + i1, mask=i1 < end, other=float("-inf"))
                x2 = tl.load(src + i2, mask=i2 < end, other=float("-inf"))
                x3 = tl.load(src + i3, mask=i3 < end, other=float("-inf"))
                _put32(rows_scratch, room, s0, p0, t0)
                _put32(rows_scratch, room, s1, p1, t1)
                _put32(rows_scratch, room, s2, p2, t2)
                _put32(rows_scratch, room, s3, p3, t3)
                t0, p0 = _late_tile(x0, i0, i0 < end, lo_v, hi_v, hi_open, dst, IN_PLACE, FULL)
                t1, p1 = _late_tile(x1, i1, i1 < end, lo_v, hi_v, hi_open, dst, IN_PLACE, FULL)
                t2, p2 = _late_tile(x2, i2, i2 < end, lo_v, hi_v, hi_open, dst, IN_PLACE, FULL)
                t3, p3 = _late_tile(x3, i3, i3 < end, lo_v, hi_v, hi_open, dst, IN_PLACE, FULL)
                s0 = _claim_many(cursor, t0 + t1 + t2 + t3)
                s1 = s0 + t0
                s2 = s1 + t1
                s3 = s2 + t2
            _put32(rows_scratch, room, s0, p0, t0)
            _put32(rows_scratch, room, s1, p1, t1)
            _put32(rows_scratch, room, s2, p2, t2)
            _put32(rows_scratch, room, s3, p3, t3)
    if filtered & (kept_n > 0):
        slot = tl.arange(0, _SORT_SMALL)
        packed = tl.load(scratch + row * capacity + slot, mask=slot < kept_n, other=_PACK_FLOOR)
        index = (2147483647 - (packed & 0xFFFFFFFF)).to(tl.int32)
        mine = (slot < kept_n) & (packed >= cut) & (index >= start) & (index < end)
        value = tl.load(src + index, mask=mine, other=0.0)  # the original bits (-0.0 stays -0.0)
        tl.debug_barrier()  # every kept value is read before the chunk is overwritten (in place)
        for offset in range(start, end, BLOCK):
            column = offset + tl.arange(0, BLOCK)
            tl.store(dst + column, tl.full([BLOCK], float("-inf"), tl.float32), mask=column < end)
        tl.debug_barrier()
        tl.store(dst + index, value, mask=mine)
    elif todo:
        for offset in range(start, end, BLOCK):
            index = offset + tl.arange(0, BLOCK)
            valid = index < end
            x = tl.load(src + index, mask=valid, other=0.0)
            key = _key32(x)
            keep = (key > cut_key) | ((key == cut_key) & (index <= cut_index)) | (filtered == 0)
            if IN_PLACE and not FULL:
                tl.store(dst + index, tl.full([BLOCK], float("-inf"), tl.float32), mask=valid & (keep == 0))
            else:
                tl.store(dst + index, tl.where(keep, x, float("-inf")), mask=valid)


# --------------------------------------------------------------------------- the filter object
@dataclasses.dataclass
class FilterState:
    """Per-row search state of a :class:`TopKTopPFilter` (``[max_rows]`` unless noted)."""

    phase: torch.Tensor  # int32: PHASE_COPY / PHASE_CUT / PHASE_OPEN
    target: torch.Tensor  # int32: TARGET_COUNT / TARGET_MASS
    k: torch.Tensor  # int64: the active k (0: no top-k)
    p: torch.Tensor  # fp32: the active p (1: no top-p)
    limit: torch.Tensor  # fp64: p * S of a mass target (-1 until S is known)
    best: torch.Tensor  # int64: the packed first maximum
    min_key: torch.Tensor  # int64: the key of the smallest logit (search bound)
    cut: torch.Tensor  # int64: the packed cut of a resolved row
    flags: torch.Tensor  # int32: the next sweep's work (see _resolve_row) and the first gather's slots
    cursor: torch.Tensor  # int64: candidates gathered by the current sweep
    points: torch.Tensor  # [max_rows, POINTS] int64: the search points (module doc)
    counts: torch.Tensor  # [max_rows, POINTS] int64: count(packed >= point)
    masses: torch.Tensor  # [max_rows, POINTS] int64: mass(packed >= point)
    scratch: torch.Tensor  # [max_rows, capacity] int64: packed candidates
    unresolved: torch.Tensor  # [1] int32: rows _finish_kernel left open (a status; always 0)
    searched: torch.Tensor  # [1] int32: rows that needed search rounds after the first pass (running total)
    approx_mass: torch.Tensor  # [max_rows, 2] fp64: APPROX sums of w' above / below the bracket (zero between calls)
    redone: torch.Tensor  # [1] int32: APPROX rows that took the exact sweep (running total)
    part_sums: torch.Tensor  # [max_rows, PARTS] int64: SWEEP_RAW, the first narrowing's part masses
    first_count: torch.Tensor  # int64: tokens of the early gather (reset to 0 by _apply_kernel)
    first_key: torch.Tensor  # int64: its key threshold (2^31 - 1: no early gather)
    outliers: torch.Tensor  # [max_rows, OUTLIERS] int64: a top-p row's early gather (packed)
    # Stats partials of _stats_kernel, [max_rows, chunks]
    best_part: torch.Tensor
    nan_part: torch.Tensor
    finite_part: torch.Tensor
    sum_part: torch.Tensor
    sumsq_part: torch.Tensor
    min_part: torch.Tensor
    placement: torch.Tensor  # [3, THRESHOLDS] fp32: MASS_OFFSETS, PEAK_DEPTHS, COUNT_FACTORS

    @classmethod
    def allocate(cls, max_rows, chunks, capacity, device):
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(*shape, dtype=dtype, device=device)

        rows = max_rows
        return cls(
            phase=zeros(rows, dtype=torch.int32), target=zeros(rows, dtype=torch.int32), k=zeros(rows),
            p=zeros(rows, dtype=torch.float32), limit=zeros(rows, dtype=torch.float64), best=zeros(rows),
            min_key=zeros(rows), cut=zeros(rows), flags=zeros(rows, dtype=torch.int32), cursor=zeros(rows),
            points=zeros(rows, POINTS), counts=zeros(rows, POINTS), masses=zeros(rows, POINTS),
            scratch=zeros(rows, capacity), unresolved=zeros(1, dtype=torch.int32), searched=zeros(1, dtype=torch.int32),
            approx_mass=zeros(rows, 2, dtype=torch.float64), redone=zeros(1, dtype=torch.int32),
            part_sums=zeros(rows, PARTS),
            first_count=zeros(rows), first_key=zeros(rows), outliers=zeros(rows, OUTLIERS),
            best_part=zeros(rows, chunks), nan_part=zeros(rows, chunks, dtype=torch.int32),
            finite_part=zeros(rows, chunks, dtype=torch.int32), sum_part=zeros(rows, chunks, dtype=torch.float32),
            sumsq_part=zeros(rows, chunks, dtype=torch.float32), min_part=zeros(rows, chunks, dtype=torch.float32),
            placement=torch.tensor([MASS_OFFSETS, PEAK_DEPTHS, COUNT_FACTORS], dtype=torch.float32, device=device))

    def row_fields(self):
        return (self.phase, self.target, self.k, self.p, self.limit, self.best, self.min_key, self.cut, self.flags,
                self.cursor)

    def stats(self):
        return (self.best_part, self.nan_part, self.finite_part, self.sum_part, self.sumsq_part, self.min_part)


def default_layout(rows: int, vocab: int, device) -> tuple[int, int]:
    """``(block, chunks)``: programs per row so that small batches still fill the GPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BLOCK, 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = triton.cdiv(vocab, GPU_BLOCK)
    if rows >= sms or blocks < 4:
        return GPU_BLOCK, 1
    # About four programs per SM (bytes in flight for the memory-bound passes), each over at least two blocks.
    return GPU_BLOCK, max(1, min(blocks // 2, (4 * sms) // max(rows, 1)))


class TopKTopPFilter:
    """Top-k / top-p filter with persistent scratch for batches of up to ``max_rows`` rows of ``vocab``.

    ``filter(logits, k, p, out)`` launches 4 kernels with no allocation and no host
    synchronisation (CUDA-graph safe); ``k``/``p`` are None, Python scalars or ``[B]`` tensors
    (checked by ``filter_checks.check_arguments``, their values read on the device).
    ``max_rows``, ``vocab``: ints >= 1. ``block`` (a power of two) / ``chunks`` (an int >= 1) fix the layout
    (default: one program per row for large batches, several per row for small ones, :func:`default_layout` of
    ``max_rows``); ``capacity`` is the most candidates one program sorts (a power of two >= 16). A size that is not
    an int (2.5, "3", True) raises ``ValueError`` naming it.
    Scratch: ``max_rows * (capacity * 8 + ~2,750)`` bytes plus ``max_rows * chunks * 32``.
    """

    def __init__(self, max_rows: int, vocab: int, device, *, block=None, chunks=None, capacity=None):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        # (sizes are ints, never truncated or parsed: 2.5, "3", True and None raise ValueError naming them)
        max_rows, vocab = check_int("max_rows", max_rows, 1), check_int("vocab", vocab, 1)
        if block is not None:
            block = check_power_of_two("block", block, 1)  # (tl.arange of it: a power of two)
        if chunks is not None:
            chunks = check_int("chunks", chunks, 1)
        if capacity is None:
            capacity = (GPU_CAPACITY if max_rows <= WIDE_ROWS else GPU_CAPACITY_WIDE) if device.type == "cuda" \
                else CPU_CAPACITY
        check_power_of_two("capacity", capacity, 16)
        default_block, default_chunks = default_layout(max_rows, vocab, device)
        self.block = block or default_block
        self.count_block = min(self.block, COUNT_BLOCK)
        self.mass_block = min(self.block, MASS_BLOCK)
        self.stats_block = min(self.block, STATS_BLOCK)
        self.pair_block = min(self.block, PAIR_BLOCK)
        self.lean_block = min(self.block, STATS_BLOCK)  # one element per thread at 8 warps
        self.warps = WARPS if device.type == "cuda" else 4
        self.resolve_warps = RESOLVE_WARPS if device.type == "cuda" else 4
        chunks = chunks or default_chunks
        chunks = max(1, min(chunks, triton.cdiv(vocab, self.block)))
        self.chunk_len = triton.cdiv(triton.cdiv(vocab, chunks), self.block) * self.block
        self.chunks = triton.cdiv(vocab, self.chunk_len)
        # The apply has its own split: one program per row leaves most SMs idle in its last wave
        # (1518 rows = 1.4 waves of 8 programs per SM), so rows are split into up to APPLY_CHUNKS
        # parts of at least APPLY_MIN_BLOCKS blocks (each part of a write-only row re-reads its list).
        blocks = triton.cdiv(vocab, self.block)
        apply_chunks = max(self.chunks, min(APPLY_CHUNKS, blocks // APPLY_MIN_BLOCKS))
        self.apply_chunk_len = triton.cdiv(triton.cdiv(vocab, apply_chunks), self.block) * self.block
        self.apply_chunks = triton.cdiv(vocab, self.apply_chunk_len)
        # APPROX's exact redo sweeps few rows: split into up to REDO_CHUNKS parts (the other rows' programs
        # return at once), so that a redone row costs a fraction of a one-program row sweep
        redo_chunks = max(self.chunks, min(REDO_CHUNKS, blocks // 2))
        self.redo_chunk_len = triton.cdiv(triton.cdiv(vocab, redo_chunks), self.block) * self.block
        self.redo_chunks = triton.cdiv(vocab, self.redo_chunk_len)
        self.max_rows, self.vocab, self.device, self.capacity = max_rows, vocab, device, capacity
        self.state = FilterState.allocate(max_rows, self.chunks, capacity, device)
        # The design's options (issue 16, filter4; H200, 2026-12-04, tools/time_filter.py --compare): the
        # defaults are the measured best; the others stay selectable for comparisons.
        # lean: statistics and top-p sweeps with fp32 compares and one slot claim per lane (the top-p
        #   sweep 1.84 ms -> 0.70 ms at 1518 rows); False: the previous kernels.
        # stats_fast: unmasked statistics without per-value finiteness tests (non-finite chunks read
        #   again exactly), the early gather stored raw (statistics 441 -> 293 us at 1518 rows).
        # full_apply: in place, whole rows written (where(keep, x, -inf)) instead of masked stores of
        #   -inf at scattered positions (617 -> 409 us at 1518 rows, top-p alone).
        # finish_options: a 128-register cap on the one-program-per-row finish above WIDE_ROWS rows
        #   (4 programs per SM instead of 2: 143 -> 95-103 us at 1518 rows, top-p alone; slower at <= 96 rows).
        # narrow_tile > 0: two-pass narrowing in tiles of this many candidates (slower: 63 vs 50 us at 6 rows).
        # late_gather (top-p alone): the apply gathers the bracket, the finish resolves after it
        #   (the sweep 700 -> 583 us but the apply 409 -> 520 us at 1518 rows: no gain).
        cuda = device.type == "cuda"
        self.lean = True
        self.stats_fast = True
        self.full_apply = True
        self.finish_options = {"maxnreg": FINISH_MAX_REGISTERS} if cuda and max_rows > WIDE_ROWS else {}
        self.narrow_tile = 0
        self.late_gather = False
        # approx (top-p alone; filter5, NOT RUN ON A GPU, opt-in): approximate masses in the first sweep,
        #   rows left uncertain swept again exactly (_redo_kernel) before a second finish: 6 launches
        #   instead of 4 (module doc, "Approximate masses", for why it is not expected to pay).
        # approx_slack (>= 1): widens the approximate masses' bound (tests force the exact sweep with it).
        # sweep_raw (top-p alone, exact; filter5, NOT RUN ON A GPU, opt-in): the first sweep leaves the
        #   bracket's lower end to the finish (its count and mass from the candidates), gathers raw, runs
        #   unmasked full iterations: 64 SASS instructions per logit in its loop instead of 80.
        self.approx = False
        self.approx_slack = 1.0
        self.sweep_raw = False

    def filter(self, logits, k, p, out):
        """Filter ``logits [B <= max_rows, vocab]`` into ``out`` (may be ``logits``; None: in place); see the class
        doc. The arguments are checked first (``filter_checks.check_arguments``: host only, no synchronisation)."""
        k, p, _ = check_arguments(logits, k, p, out)
        return self._run(logits, k, p, logits if out is None else out)

    def _run(self, logits, k, p, out):
        """:meth:`filter` on arguments already checked (``top_k_top_p``)."""
        rows, vocab = logits.shape
        if rows > self.max_rows or vocab != self.vocab or logits.device != self.device:
            raise ValueError(f"logits: expected [<= {self.max_rows}, {self.vocab}] on {self.device}, got "
                             f"{list(logits.shape)} on {logits.device}")
        if rows == 0 or (k is None and p is None):
            if out.data_ptr() != logits.data_ptr():
                out.copy_(logits)
            return out
        st = self.state
        k_per_row, p_per_row = isinstance(k, torch.Tensor), isinstance(p, torch.Tensor)
        k_ptr = k if k_per_row else logits  # unused pointer when the value is a scalar
        p_ptr = p if p_per_row else logits
        k_value = 0 if k_per_row or k is None else max(min(int(k), 2**62), -(2**62))
        p_value = 1.0 if p_per_row or p is None else float(p)
        in_place = out.data_ptr() == logits.data_ptr() and out.stride() == logits.stride()
        warps = self.warps
        grid = (rows, self.chunks)
        common = dict(num_warps=warps, enable_fp_fusion=False)
        _stats_kernel[grid](logits, logits.stride(0), *st.stats(), st.counts, st.masses, st.cursor, st.scratch,
                            st.outliers, st.first_count, st.first_key, k_ptr, k_value, p_ptr, p_value, vocab,
                            self.chunk_len, self.chunks, self.capacity, K_PER_ROW=k_per_row, P_PER_ROW=p_per_row,
                            SAMPLE=SAMPLE, OUTLIERS=OUTLIERS, BLOCK=self.stats_block, LEAN=self.lean,
                            FAST=self.lean and self.stats_fast, **common)
        chunks_p2 = max(32, triton.next_power_of_2(self.chunks))  # one compile for every layout up to 32 chunks
        # LATE (top-p alone, lean sweeps, wide narrowing): the apply writes each row outside its first
        # bracket and gathers the bracket, the finish (after it) resolves the cut and writes the rest
        late = self.late_gather and self.lean and k is None
        approx = self.approx and self.lean and k is None and not late
        sweep_raw = self.sweep_raw and self.lean and k is None and not late and not approx
        if not self.approx_slack >= 1.0:
            raise ValueError(f"approx_slack: expected a float >= 1, got {self.approx_slack}")
        _pass_kernel[grid](logits, logits.stride(0), *st.stats(), st.placement, *st.row_fields(), st.points,
                           st.counts, st.masses, st.scratch, st.first_count, st.first_key, st.outliers,
                           k_ptr, k_value, p_ptr, p_value, vocab, self.chunk_len, self.chunks, self.capacity,
                           PASS=PASS_FIRST, MASS=p is not None, K_PER_ROW=k_per_row, P_PER_ROW=p_per_row,
                           CHUNKS=chunks_p2, BLOCK=self.block, COUNT_BLOCK=self.count_block,
                           MASS_BLOCK=self.mass_block, PAIR_BLOCK=self.lean_block if self.lean else self.pair_block,
                           OUTLIERS=OUTLIERS, K_GIVEN=k is not None, LEAN=self.lean, LATE=late,
                           RAW=self.lean and self.stats_fast, approx_mass=st.approx_mass, APPROX=approx,
                           SWEEP_RAW=sweep_raw,
                           **common)

        def finish(approximate=False):
            _finish_kernel[(rows,)](logits, logits.stride(0), *st.row_fields(), st.points, st.counts, st.masses,
                                    st.scratch, st.unresolved, st.searched, vocab, self.capacity,
                                    BLOCK=self.block, COUNT_BLOCK=self.count_block, MASS_BLOCK=self.mass_block,
                                    NARROW_TILE=self.narrow_tile, out_ptr=out, out_stride=out.stride(0), LATE=late,
                                    IN_PLACE=in_place or not late, approx_mass=st.approx_mass, redone=st.redone,
                                    slack=float(self.approx_slack), part_sums=st.part_sums, APPROX=approximate,
                                    REDONE=approx and not approximate, SWEEP_RAW=sweep_raw,
                                    num_warps=self.resolve_warps, enable_fp_fusion=False, **self.finish_options)

        if approx:  # resolve from the approximate masses; the uncertain rows swept exactly, resolved again
            finish(True)
            _redo_kernel[(rows, self.redo_chunks)](logits, logits.stride(0), st.phase, st.flags, st.best, st.cursor,
                                                   st.points, st.counts, st.masses, st.scratch, vocab,
                                                   self.redo_chunk_len, self.capacity, PAIR_BLOCK=self.lean_block,
                                                   **common)
            finish()
        elif not late:
            finish()
        _apply_kernel[(rows, self.apply_chunks)](logits, logits.stride(0), out, out.stride(0), st.phase, st.cut,
                                                 st.first_count, st.cursor, st.scratch, vocab, self.apply_chunk_len,
                                                 self.capacity, IN_PLACE=in_place, BLOCK=self.block,
                                                 FULL=self.full_apply, st_flags=st.flags, points=st.points,
                                                 counts=st.counts, masses=st.masses, st_p=st.p, LATE=late,
                                                 GATHER_BLOCK=self.lean_block, **common)
        if late:
            finish()
        return out


_FILTERS: dict = {}


def filter_for(rows, vocab, device, *, block=None, chunks=None, capacity=None) -> TopKTopPFilter:
    """A cached :class:`TopKTopPFilter` for ``rows`` rows of the layout ``rows`` asks for (allocated
    the first time a layout is seen, reallocated only when a batch of it is larger)."""
    default_block, default_chunks = default_layout(rows, vocab, device)
    block, chunks = block or default_block, chunks or default_chunks
    key = (device, vocab, block, chunks, capacity)
    filt = _FILTERS.get(key)
    if filt is None or filt.max_rows < rows:
        filt = TopKTopPFilter(rows, vocab, device, block=block, chunks=chunks, capacity=capacity)
        _FILTERS[key] = filt
    return filt


def launch_top_k_top_p(logits, k, p, out, *, block=None, chunks=None, sort_size=None):
    """Filter ``logits`` into ``out`` through the cached filter of this shape (see :class:`TopKTopPFilter`).

    ``sort_size``: the filter's ``capacity`` (tests shrink it to force the search rounds).
    Allocates only the first time a shape (or a larger batch) is seen.
    """
    rows, vocab = logits.shape
    if rows == 0 or vocab == 0:
        return out
    if sort_size is not None:
        check_power_of_two("sort_size", sort_size, 16)
    filt = filter_for(rows, vocab, logits.device, block=block, chunks=chunks, capacity=sort_size)
    return filt._run(logits, k, p, out)  # (checked by top_k_top_p)
