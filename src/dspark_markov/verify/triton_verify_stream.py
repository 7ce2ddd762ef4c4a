"""Verification in one launch that streams every target and cache row once (SPEC.md section 6).

:class:`StreamVerifier` is the design behind ``verify_drafts(impl="triton")``: one kernel whose
programs are *items*, numbered by program id, that combine per-request results through
last-arriver counters (``atomic_add``; the last of a request's items to arrive sees the others'
stores and does the request's epilogue):

1. **stream** items ``(request, row j <= n, chunk)``: a chunk of target row ``j`` and of cache row
   ``j`` (``j < n``), read once (``unroll`` tiles in flight per program), reduced to per-lane
   running softmax statistics (max and sum of ``exp(x - max)``; the cache rows in their own
   values' space, ``sum 2^((c - max c) log2(e) / T)``, so no division per element) or, for greedy
   rows, to per-lane first argmaxes.
   The last stream item of a request to arrive combines the chunks into each row's max and
   normaliser, computes ``p_j(x_j)``, ``q_j(x_j)``, the ratios, the acceptance uniforms, the
   standard (or greedy) accepted count and the block-verification weights, and marks the request
   ready;
2. **mass** items (``method="block"`` only) ``(request, row 1 <= i < n, chunk)``: the residual
   masses ``sum_v max(w_i p_i(v) - q_i(v), 0)``; their last arriver computes the block count;
3. **emit** items ``(request, chunk)`` over the one emitted row ``j*``: the Gumbel keys of the
   residual ``log(max(w p - q, 0)) + g`` (after a rejection) or of the bonus ``x + g``, ranked by
   cheap noise with the exact key computed for the chunk's cheap winner (``emit_winner``; or for each
   lane's best) and an exact rescan of the chunk on a near-tie, so the drawn token is the exact
   keys' argmax; their last arriver combines the chunks
   and writes the request's output row (after a rejection whose residual is all zero in fp32 it
   draws the bonus keys of that row instead, in one program).

Items are numbered so that a request's mass and emit items come ``lag`` requests after its stream
items. A waiting item (bounded spin on the request's ready flag) only waits for items with smaller
program ids, which the GPU dispatches first (blocks start in increasing id order, the order CUB's
decoupled look-back relies on too), so it waits for running or finished programs; the bound
turns a broken assumption into a status flag (:meth:`StreamVerifier.check`), never a hang. The
lag lets a request's stream items finish before its emit items start, which then re-read the
emitted row while it is still in L2. Each request's counters are reset by its last emit item (a
greedy or padding request's, with ``greedy_direct``, by its last stream item):
:meth:`StreamVerifier.run` only launches, so it can be captured in a CUDA graph and replayed.

Bytes per live request: ``(n+1) V 4`` target + ``n V c`` cache streamed once from HBM, plus one
target row (and one cache row after a rejection) re-read, normally from L2; ``O((K+1) chunks)``
partials; ``(K+2) 8`` written.

**Double-buffered stream loops** (``dbuf``; the standard method's GPU default for raw logits, and for pre-divided
ones up to :data:`DBUF_PREDIVIDED_TO` requests, at 128 registers): each
stream loop (a pair of rows, a bonus row alone, a greedy row's argmax) loads its next group of tiles before it
reduces the current one, so a group is always in flight; the same groups in the same order, so the partials are
bit-identical. Two 8-warp programs per SM instead of three (at 80 registers the buffers spill); see
:data:`DBUF_STANDARD` for the measurements.

**Claimed chunks** (``claim``, standard method; opt-in, exact on an H100 and slower there): a request's stream
programs take their chunks one at a time from a per-request counter instead of one fixed chunk each, so they end
within about one chunk of each other; the partials, the epilogue and the emit items are unchanged.

**Spanned items** (``span``, standard method, one launch; opt-in, exact on the H200 and slower there below 253
requests, see :data:`SPAN_FROM`): a request's rows laid end to end and cut into stream items of ``t1`` tiles that
may end one row and start the next (a piece per row it covers); item ``e`` stores its piece of row ``j`` at
partial ``(j, e)``, and the epilogue combines, for row ``j``, the items ``(j TPR) // t1 .. ((j + 1) TPR - 1) // t1``
(``TPR`` tiles per row).

**Emit scans** (``emit_dbuf``, ``emit_reverse``; the standard method's GPU default): the next emit tile's values are
loaded before the current tile's keys are computed, and each emit chunk is scanned from its end (the emitted row's
most recently streamed lines first); the same per-lane results (``>=`` keeps the first maximum in the reversed scan).

**Phased launches** (``phases``, standard method; opt-in, measured on the H200, see :data:`PHASES_FROM`):
a call becomes one launch per range of rows (``phases=1``: row 0, then rows 1..K). Draft ``j``'s
acceptance needs only row ``j``'s statistics, so a launch's epilogue decides every request whose
first rejection (or bonus row) lies in the launch's rows and emits its token exactly as above; a
request whose drafts in those rows were all accepted stores the launch's end row as its accepted
count, and only such requests have items in the next launch (the others' items exit at once). The
rows after a request's first rejection are never read (the issue-18 benchmark's random drafts are
mostly rejected at row 0 or 1), and a launch still streams its rows in parallel; what it costs is a
launch boundary per phase when drafts are accepted. Decisions cross launches only through the
kernel boundary (no program waits on another launch), so the interpreter runs every branch. H200
(2026-12-05, ``benchmarks/results/NVIDIA-H200_2026-12-05_verify_phased_sweep.txt``, mixed T): ``phases=1``
pays only at large batches with low acceptance: 253 requests of random drafts 323 -> 272 us (raw logits
378 -> 316), but 310 -> 345 us with nearly every draft accepted, and slower at 64 requests or fewer
(110 -> 118, 48 -> 67, 12.6 -> 15.5 us) whatever the drafts; more boundaries are slower still.

Raw target logits: with ``target_temperature`` (``[S]`` fp32) the target logits are taken before
temperature and each element is divided in the kernel by its slot's temperature with the IEEE
division ``tl.math.div_rn`` (``T == 0``: unscaled), the same correctly rounded division as
``reference.scaled_logits`` (``z / T`` in torch). Every later step sees the same fp32 values as in
the pre-divided mode, so the two modes give bit-identical results (tested).

Agreement with :func:`~dspark_markov.verify.reference.verify_reference` on the same keys (the
acceptance uniforms and resampling noise of ``ops.noise``; greedy targets accept and emit by
``argmax_first``; the all-zero-residual fallback draws the bonus keys of that row). Bit-identical: the keys, greedy decisions, the one-hot ``q`` of greedy drafts, the bonus
draw (``x + g`` with the exact noise) and the output layout. Within fp32 rounding: ``p`` and ``q``
(``exp2`` approximations, per-lane summation order; the normaliser of ``q`` summed in the cache
values' space, the ratio ``p(x)/q(x)`` with the correctly rounded ``c / T``; the residual with the
normalisers' reciprocals, the hardware ``ex2``/``lg2`` and values below 2^-126 as 0), so an
acceptance or residual decision can differ from the reference's only at last-bit near-ties
(about 1e-6 per decision): an acceptance test ``u < p(x)/q(x)`` (or ``u < h`` of block
verification) with ``u`` within a few ulps of its threshold, two largest residual keys within a
few ulps, or a residual entry whose sign depends on rounding (``p(v) ~ q(v)`` to the last bit:
``O(ulp)`` mass). The tests check exact equality on random inputs and the target distribution
statistically; both paths are within fp32 rounding of the exact rejection sampler. (This design
replaced the earlier four-kernel verifier, 2-2.3x slower on the H200, benchmarks/NOTES.md.) Every launch
passes ``enable_fp_fusion=False``. Importing this module
imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import noise as rng_triton  # the device noise (ops.noise)
from ..ops.filter import FILTER_MARGIN, key_slack
from ..ops.noise import approx_gumbel, fast_log2
from ..ops.numerics import FLOAT32_MAX, block_argmax, to_float32
from ..validate import DeviceStatusError, check_int, check_power_of_two
from . import keys
from .run_start import cached_instance, run_fresh, start_run

GPU_BLOCK = 2048  # elements per tile (8 warps, 8 fp32 per thread)
GPU_WARPS = 8
CPU_BLOCK = 128
MAX_REGISTERS = 80  # three 8-warp programs per SM (128: two); the few spills are outside the streamed loops
GPU_EMIT_BLOCK = 1024  # emit tiles on the GPU (the stream tiles stay GPU_BLOCK)
SPIN = 1 << 18  # bound on the polls of a waiting item (about 50 ms on the H200)
COMPACT_ORDER = False  # standard method: the program order without the lag's padding (StreamVerifier's compact)
FAST_DIVIDE = 1  # raw logits: 1 = _divide with per-lane fallback flags, 2 = _divide_poisoned (a NaN sum redoes); 0: div_rn
# Raw launches from RAW_WIDE_FROM requests on: (fast_divide, div_unroll) = the poisoned division with 4 tiles at once
# where values are divided (H200, verify4 u2, mixed T: 129.8 / 398.7 us at 64 / 253 against 135.1 / 410.0 for (1, 0);
# at 1 / 16 requests 20.3 / 60.0 against 20.0 / 59.4, so smaller batches keep (1, 0))
RAW_WIDE_FROM = 64
RAW_WIDE = (2, 4)
GREEDY_DIRECT = True  # greedy / padding requests written by their last stream item (StreamVerifier's greedy_direct)
EMIT_PREFETCH = 0  # L2 prefetch of the emitted row by the request's last stream item (1; 2: evict_last; 0: none)
DIV_UNROLL = 0  # raw logits: tiles at once where values are divided (0: the whole raw launch at 2; StreamVerifier's div_unroll)
# Phased launches (StreamVerifier's phases, standard method): off by default. On the H200 phases=1 wins only at large
# batches of mostly rejected drafts (253 requests: 323 -> 272 us on random drafts, 310 -> 345 us on nearly all accepted
# ones) and loses at <= 64 requests: a default cannot know the acceptance, an engine that does can pass phases=1.
# PHASES_FROM: the batch from which phases=None takes PHASES (None: never); PHASES: the row boundaries.
PHASES = (1,)
PHASES_FROM = None
# Double-buffered stream loops (StreamVerifier's dbuf) at DBUF_REGISTERS registers for the standard-method launches
# of a GPU verifier given neither dbuf nor max_registers: raw logits at every batch, pre-divided logits up to
# DBUF_PREDIVIDED_TO requests (above: the single-buffered loops at MAX_REGISTERS, three programs per SM). The next
# group of tiles is in flight while one is reduced (pairs, bonus rows, greedy argmaxes), two 8-warp programs per SM
# instead of three (at 80 registers the double buffers spill). H200, one call (2026-12-05, stop 34,
# benchmarks/results/NVIDIA-H200_2026-12-05_verify_defaults_stop34.txt; mixed T, with the emit options below), us at
# 1 / 16 / 32 / 64 / 128 / 253 requests, double- against single-buffered: pre-divided 12.7 / 46.0 / 71.1 / 111.6 /
# 189.9 / 328.5 against 12.7 / 46.8 / 71.1 / 108.7 / 183.2 / 321.2; raw 12.6 / 50.6 / 80.0 / 123.9 / 212.7 / 361.4
# against 12.8 / 55.3 / 83.8 / 125.1 / 212.6 / 366.8. (On an H100 the double buffers were no slower at 64 / 253
# pre-divided, stop 33: three programs of the single-buffered loops keep more bytes in flight than two, which the
# H200's bandwidth needs.) The block method keeps the single-buffered loops at MAX_REGISTERS.
DBUF_STANDARD = True
DBUF_REGISTERS = 128
DBUF_PREDIVIDED_TO = 16
# Emit scans double-buffered (StreamVerifier's emit_dbuf): the next emit tile's target and cache values loaded before
# the current tile's keys are computed. Emit scans in decreasing token order (StreamVerifier's emit_reverse): a stream
# item reads its chunk front to back, so a forward emit scan reaches the emitted row's most recently streamed (likelier
# cached) lines last (at 253 requests ncu counted ~0.13 GB of the 1.13 GB read as the emitted row re-read from DRAM).
# Both on by default for the standard method's GPU launches: H200 (stop 34, same call) 46.3 -> 46.0 us at 16 requests,
# 112.3 -> 111.6 at 64, 339.4 -> 328.5 at 253 (double-buffered loops), 109.2 -> 108.7 / 323.6 -> 321.2 (single); raw
# 50.8 -> 50.6, 127.0 -> 123.9, 379.8 -> 361.4. Off for the block method (emit_reverse: 140.6 -> 143.0 at 64,
# 444.0 -> 454.0 at 253; emit_dbuf slower there on an H100).
EMIT_DBUF = True
EMIT_REVERSE = True
# Emit items with fewer dependent round trips (StreamVerifier's emit_eager): the ready flag acquired once when it is
# already up (the wait's second acquire only after polling), and the last emit item's epilogue loads (partials, the
# positive-residual flags, the target argmax, the drafts) issued together. Written in stop 34 for the 16-request tail
# (the emit chain of the last request ready, ~9 us). H200, same call (stop 34,
# benchmarks/results/NVIDIA-H200_2026-12-05_verify_eager_stop34.txt; mixed T, us at 1 / 16 / 64 / 253 requests):
# standard 12.8 / 46.4 / 109.2 / 318.0 -> 12.8 / 45.3 / 107.7 / 316.5, raw 12.6 / 50.7 / 123.5 / 361.0 -> 12.6 / 50.3 /
# 123.1 / 359.1, block 24.4 / 69.8 / 139.3 / 439.7 -> 23.8 / 68.4 / 139.6 / 437.2; its GPU tests pass. On by default.
EMIT_EAGER = True
# Emit items load every row's statistics ([8, KP1] words) together with the accepted count and pick row js from them
# (StreamVerifier's emit_gather): one round trip instead of two before the scan. (Stop 32's `gather` on an H100, the
# same idea before the emit options and emit_eager: no gain, not landed.) Written in stop 34; timed in stop 38 on an
# H100 (..._verify_gather_stop38.txt): exact (its GPU tests at 16 / 253), within 1% of the default either way (16 / 64 /
# 253 requests 51.4 / 128.1 / 408.4 us against 52.0 / 129.1 / 408.8; raw 55.4 / 140.2 / 420.8 against 55.8 / 139.2 /
# 419.2): off (opt-in).
EMIT_GATHER = False
# Emit items compute the exact key of their cheap keys' winner only (StreamVerifier's emit_winner), not one per lane:
# Nsight Compute at 16 requests (stop 39, H100, benchmarks/results/NVIDIA-H100-80GB-HBM3_2026-12-06_verify_winner_stop39.txt)
# counted ~2,100 instructions per warp and emit item, ~640 of them the exact keys of its 1,024 lane bests (and ~140
# their argmax), ~1,200 the scan of its four tiles; with emit_winner the emit items' instructions fell 12% (6.9 ->
# 6.1 M). H100, same calls (mixed T, us at 16 / 64 / 253 requests): pre-divided 52.5 -> 50.6, 131.7 -> 132.9 (and
# 129.4 -> 130.3 in another call), 422.8 -> 420.0; raw 56.3 -> 54.7, 141.9 -> 138.5, 433.5 -> 422.3; block 78.4 ->
# 75.1, 174.3 -> 171.4, 582.3 -> 572.2; 1 request within 0.3 us. On by default except for the pre-divided standard
# launches of EMIT_WINNER_OFF requests (single-buffered loops at 80 registers, where it spills 2 bytes: 64 requests
# ~1% slower).
EMIT_WINNER = True
EMIT_WINNER_OFF = (DBUF_PREDIVIDED_TO + 1, 128)
# Claimed chunks (StreamVerifier's claim, standard method): 0 = off (every stream item has its fixed chunk); written in
# stop 32 for the 16-request tail (trace: equal stream items ending 17.6-41.3 us on an H100). H100 (2026-12-05,
# benchmarks/results/NVIDIA-H100-80GB-HBM3_2026-12-05_verify_dbuf_stop33.txt): exact, and slower at every batch and G
# (claim=2: 16.8 / 59.8 / 139.0 / 442.9 us against 13.0 / 56.2 / 133.1 / 424.8 at 1 / 16 / 64 / 253 requests): a
# request's ends move closer (spread 14.8 -> 7.7 us at 16) but later (each claim is an atomic round trip and a barrier).
CLAIM = 0
# Rows laid end to end (StreamVerifier's span): written in stop 34 for the 16-request tail (the double-buffered
# default's 384 stream items of 16 tiles need two waves of 264 slots there; span cuts each request's 6 rows into 16
# items of 24 tiles, one wave). H200 (stop 34, benchmarks/results/NVIDIA-H200_2026-12-05_verify_span_stop34.txt):
# exact, slower at 4 / 16 / 32 / 64 requests (29.5 / 51.9 / 74.6 / 114.0 us against 28.1 / 45.9 / 72.3 / 111.9: the
# one wave ends no sooner, its items stream at the same aggregate rate), 330.5 against 338.9 at 253 (one whole row
# per item), raw slower everywhere. Off: SPAN_FROM None (never); SPAN_FROM..SPAN_TO requests otherwise.
SPAN_FROM = None
SPAN_TO = 32

_ACCEPT_DOMAIN = tl.constexpr(keys.ACCEPT_DOMAIN)
_RESAMPLE_DOMAIN = tl.constexpr(keys.RESAMPLE_DOMAIN)
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)
_TINY = tl.constexpr(1.1754943508222875e-38)  # smallest normal fp32: the hardware log2 flushes below it
_BIG = tl.constexpr(2147483647)
_SPIN = tl.constexpr(SPIN)
_FILTER_MARGIN = tl.constexpr(FILTER_MARGIN)


# --------------------------------------------------------------------------- device functions
@triton.jit
def _request(idx_ptr, nd_ptr, pos_ptr, temp_ptr, seeds_ptr, greedy_ptr, tt_ptr, b, num_slots,
             K: tl.constexpr, HAS_GREEDY: tl.constexpr, RAW: tl.constexpr):
    """``(live, slot, T, seed, n, position, greedy, target T)`` of request ``b`` (contiguous vectors).

    Slots outside ``[0, num_slots)`` are padding (slot 0, T = 0, seed 0, n = 0); ``n`` is clamped
    into ``[0, K]`` so no row outside the inputs is read. The target T is 0 unless ``RAW``.
    """
    slot = tl.load(idx_ptr + b).to(tl.int64)
    live = (slot >= 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0)
    temp = tl.load(temp_ptr + slot, mask=live, other=0.0)
    seed = tl.load(seeds_ptr + slot, mask=live, other=0)
    n = tl.load(nd_ptr + b).to(tl.int64)  # clamped before narrowing (an int64 n of 2^40 is K, not its low word)
    n = tl.where(live, tl.minimum(tl.maximum(n, 0), K), 0).to(tl.int32)
    position = tl.load(pos_ptr + b).to(tl.int64)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b) != 0
    else:
        greedy = temp == 0.0
    if RAW:
        target_temp = tl.load(tt_ptr + slot, mask=live, other=0.0)
    else:
        target_temp = temp * 0.0
    return live, slot, temp, seed, n, position, greedy, target_temp


@triton.jit
def _exp2(x, HARDWARE: tl.constexpr):
    """``2^x``: one ``ex2.approx.ftz`` (MUFU) on the GPU (results below 2^-126 flush to 0), ``tl.exp2``
    in the interpreter. Used in sums and in the residual, never for a single decisive value."""
    if HARDWARE:
        out = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                        is_pure=True, pack=1)
    else:
        out = tl.exp2(x)
    return out


@triton.jit
def _prefetch_l2(ptrs, HARDWARE: tl.constexpr, EVICT_LAST: tl.constexpr = False):
    """``prefetch.global.L2`` (``::evict_last`` when ``EVICT_LAST``) of every address in ``ptrs`` (a hint;
    nothing on the interpreter)."""
    if HARDWARE:
        if EVICT_LAST:
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                      dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                      is_pure=False, pack=1)


@triton.jit
def _prefetch_row(ptr, vocab, BLOCK: tl.constexpr, HARDWARE: tl.constexpr, EVICT_LAST: tl.constexpr):
    """An L2 prefetch of ``ptr[0:vocab]``, one address per 8 values (32 bytes of fp32)."""
    for first in tl.range(0, vocab, BLOCK * 8):
        _prefetch_l2(ptr + tl.minimum(first + tl.arange(0, BLOCK) * 8, vocab - 1), HARDWARE, EVICT_LAST)


@triton.jit
def _clock(anchor, HARDWARE: tl.constexpr):
    """``(%globaltimer ns, %smid)`` for the launch trace (``TRACE``; zeros on the interpreter)."""
    if HARDWARE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64,
                                        is_pure=False, pack=1)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [anchor], dtype=tl.int32, is_pure=False,
                                       pack=1)
    else:
        now = anchor.to(tl.int64) * 0
        sm = anchor * 0
    return now, sm


@triton.jit
def _scaled(x, temp):
    """``x / T`` with the IEEE division (``T == 0``: ``x``), as ``reference.scaled_logits``."""
    return tl.where(temp == 0.0, x, tl.math.div_rn(x, tl.where(temp == 0.0, 1.0, temp)))


@triton.jit
def _divide_by(x, temp):
    """``x / T`` with the IEEE division where ``T`` is not 0 or 1 (``x / 1 = x`` exactly; ``T == 0``: unscaled):
    a uniform branch, so those slots cost what pre-divided logits cost. ``x``: fp32, any shape."""
    if (temp != 0.0) & (temp != 1.0):
        x = tl.math.div_rn(x, temp)  # (-inf / T = -inf: a masked lane stays itself)
    return x


@triton.jit
def _load_row(ptr, token, valid, temp, DIVIDE: tl.constexpr, other):
    """fp32 values of one row's tile (bf16 widened exactly), divided by ``temp`` when ``DIVIDE``.

    The division is skipped (a uniform branch) where ``T`` is 0 (unscaled) or 1 (``x / 1 = x``
    exactly, NaN, infinities, signed zeros and subnormals included), so those slots cost what the
    pre-divided mode costs.
    """
    if valid is None:
        x = to_float32(tl.load(ptr + token))
    else:
        x = to_float32(tl.load(ptr + token, mask=valid, other=other))
    if DIVIDE:
        x = _divide_by(x, temp)  # other = -inf or 0 stays itself (T > 0)
    return x


@triton.jit
def _divisor(temp):
    """``(t, r, s, tiny)`` of the exact division by ``T`` without a divide per element (:func:`_divide`).

    ``T = t 2^k`` with ``t`` in ``[1, 2)``, ``r = RN(1/t)``, ``s = 2^-k`` (exact); ``tiny`` the bits
    of the magnitude below which a value takes the exact fallback (``max(2^-100, 2^-125 T)``, where
    a residual or the result could leave the normal range; every finite nonzero value when ``T`` is
    outside ``[2^-126, 2^126]``).
    """
    bits = temp.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    t = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    s = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
    r = tl.math.div_rn(1.0, t)
    lo = tl.maximum(7.888609052210118e-31, temp * 2.350988701644575e-38)  # 2^-100, 2^-125
    lo = tl.where((exponent >= 1) & (exponent <= 253), lo, float("inf"))
    return t, r, s, lo.to(tl.int32, bitcast=True)


@triton.jit
def _divide(x, t, r, s, tiny):
    """``(x / T, risky)``: the correctly rounded quotient from :func:`_divisor`'s constants, and where it
    may not be (``0 < |x| < tiny``: the caller recomputes those exactly with ``div_rn``).

    Two Markstein corrections with exact FMA residuals: ``q1`` is within one ulp of ``x / t``, so
    ``q2 = RN(q1 + (x - q1 t) r) = RN(x / t)`` (Markstein's theorem: ``r`` within half an ulp of
    ``1/t``, the residual exact, everything normal); ``q2 s`` is then exact, or overflows exactly
    as ``x / T`` does. Infinities make the residuals NaN: they take ``q0 = x r`` (``+-inf``);
    NaN stays NaN; zeros keep their sign.
    """
    q0 = x * r
    q1 = tl.fma(-tl.fma(q0, t, -x), r, q0)  # residual q0 t - x (exact): a zero keeps its sign
    q2 = tl.fma(-tl.fma(q1, t, -x), r, q1)
    y = tl.where(q2 == q2, q2, q0) * s
    magnitude = (x.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) - 1  # 0 -> 2^32 - 1: never risky; NaN: above inf
    return y, magnitude < (tiny - 1).to(tl.uint32)


@triton.jit
def _divide_poisoned(x, t, r, s, tiny):
    """:func:`_divide`'s quotient, NaN where it may not be correctly rounded (``FAST`` 2: a NaN makes the
    row's sum NaN, and the caller recomputes a NaN sum exactly; no per-lane flag registers)."""
    y, risky = _divide(x, t, r, s, tiny)
    return tl.where(risky, float("nan"), y)


@triton.jit
def _row_softmax(ptr, start, end, tiles, temp, scale, DIVIDE: tl.constexpr, BLOCK: tl.constexpr,
                 UNROLL: tl.constexpr, HARDWARE: tl.constexpr, PIPE: tl.constexpr):
    """``(max x, sum 2^((x - max) scale))`` of ``x = row[start:end]`` (``/ T`` when ``DIVIDE``).

    With ``scale = log2(e)`` this is the softmax max and normaliser of ``x``; the cache rows pass
    their raw values with ``scale = log2(e) / T`` (the max and sum of ``softmax(c / T)`` in the
    values' own space: no division per element; the max of ``c / T`` is ``max(c) / T`` exactly).

    ``UNROLL`` tiles of ``BLOCK`` are loaded at once (a ``[UNROLL, BLOCK]`` tile whose column a
    thread holds whole, so more bytes are in flight per program and the per-column reductions stay
    in registers); per-lane running statistics (``UNROLL + 1`` exps per ``UNROLL`` values),
    combined across lanes once. Masked lanes add nothing; an all ``-inf`` range gives
    ``(-FLT_MAX, 0)``; a NaN makes the sum NaN.
    """
    lane = start + tl.arange(0, BLOCK)
    step = tl.arange(0, UNROLL)[:, None] * BLOCK
    m = tl.full([BLOCK], -FLOAT32_MAX, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for t in tl.range(0, tiles, UNROLL, num_stages=PIPE):
        token = lane[None, :] + (t * BLOCK + step)
        x = _load_row(ptr, token, token < end, temp, DIVIDE, float("-inf"))
        m, s = _softmax_step(x, m, s, scale, HARDWARE)
    return _softmax_combine(m, s, scale)


@triton.jit
def _softmax_step(x, m, s, scale, HARDWARE: tl.constexpr):
    """One ``[UNROLL, BLOCK]`` tile ``x`` into the per-lane running ``(max, sum 2^((x - max) scale))``."""
    new_m = tl.maximum(m, tl.max(x, axis=0))
    terms = _exp2((x - new_m[None, :]) * scale, HARDWARE)
    s = s * _exp2((m - new_m) * scale, HARDWARE) + tl.sum(terms, axis=0)
    return new_m, s


@triton.jit
def _pair_step(xb, cb, m, s, cm, cs, risky, ttemp, c_scale, RAW: tl.constexpr, FAST: tl.constexpr, dt, dr, ds, dtiny,
               HARDWARE: tl.constexpr):
    """One loaded group of a target tile ``xb`` (raw when ``RAW``) and a cache tile ``cb`` into both rows'
    running statistics, as the loop of :func:`_pair_softmax` does it (``FAST``: :func:`_divide`)."""
    m, s, risky = _target_step(xb, m, s, risky, ttemp, RAW, FAST, dt, dr, ds, dtiny, HARDWARE)
    cm, cs = _softmax_step(to_float32(cb), cm, cs, c_scale, HARDWARE)
    return m, s, cm, cs, risky


@triton.jit
def _target_step(xb, m, s, risky, ttemp, RAW: tl.constexpr, FAST: tl.constexpr, dt, dr, ds, dtiny,
                 HARDWARE: tl.constexpr):
    """The target half of :func:`_pair_step` (a bonus row's group: no cache row): ``xb`` ``[UNROLL, BLOCK]``
    fp32 (raw when ``RAW``) into the per-lane ``m, s`` ``[BLOCK]`` fp32 (``risky`` ``[BLOCK]`` int32: ``FAST``
    1's flags)."""
    x = to_float32(xb)
    if FAST == 2:
        x = _divide_poisoned(x, dt, dr, ds, dtiny)
    elif FAST:
        x, tiny = _divide(x, dt, dr, ds, dtiny)
        risky = risky | tl.max(tiny.to(tl.int32), axis=0)
    elif RAW:
        x = _divide_by(x, ttemp)
    m, s = _softmax_step(x, m, s, _LOG2E, HARDWARE)
    return m, s, risky


@triton.jit
def _softmax_combine(m, s, scale):
    """The row's ``(max, sum)`` from per-lane running statistics."""
    row_max = tl.max(m, axis=0)
    return row_max, tl.sum(s * tl.exp2((m - row_max) * scale), axis=0)


@triton.jit
def _pair_softmax(t_ptr, c_ptr, start, end, c_end, tiles, ttemp, c_scale, RAW: tl.constexpr, BLOCK: tl.constexpr,
                  UNROLL: tl.constexpr, HARDWARE: tl.constexpr, PIPE: tl.constexpr, FAST: tl.constexpr = False,
                  dt=1.0, dr=1.0, ds=1.0, dtiny=0, INTERIOR: tl.constexpr = False, DBUF: tl.constexpr = False):
    """:func:`_row_softmax` of a target row over ``[start, end)`` (``/ T`` when ``RAW``) and of its cache
    row over ``[start, c_end)`` (scale ``c_scale``; ``c_end = start``: none) in one loop.

    Both rows' tiles are loaded in the same iteration (one memory round trip per iteration, not two
    loops in turn); each row's per-lane statistics are updated exactly as :func:`_row_softmax` does,
    so the results are bit-identical to two calls of it.

    ``FAST`` (with ``RAW``, ``T`` not 0 or 1): the target values are divided by :func:`_divide` with
    the slot's :func:`_divisor` constants ``dt, dr, ds, dtiny``; the fifth result says a value needed
    the exact fallback (``FAST`` 1: per-lane flags; 2: :func:`_divide_poisoned`, a NaN sum), and then
    the caller recomputes without ``FAST``.

    ``DBUF`` (with ``INTERIOR``): the interior groups are double-buffered in registers (group ``g + 1``
    is loaded before group ``g`` is reduced, so a load is always in flight), a bonus row's
    (``c_end = start``) target groups too; the same groups in the same order, so the statistics are
    bit-identical (a bonus row's cache statistics stay ``(-FLT_MAX, 0)`` either way and are not used).
    """
    lane = start + tl.arange(0, BLOCK)
    step = tl.arange(0, UNROLL)[:, None] * BLOCK
    m = tl.full([BLOCK], -FLOAT32_MAX, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    cm = tl.full([BLOCK], -FLOAT32_MAX, tl.float32)
    cs = tl.zeros([BLOCK], tl.float32)
    risky = tl.zeros([BLOCK], tl.int32)
    first = 0
    if INTERIOR:  # whole [UNROLL, BLOCK] groups of both rows without masks (no "other" per value)
        full = tl.where(c_end == end, (end - start) // (UNROLL * BLOCK), 0)
        if DBUF:
            if full > 0:
                xb = tl.load(t_ptr + lane[None, :] + step)
                cb = tl.load(c_ptr + lane[None, :] + step)
                for g in tl.range(1, full):
                    token = lane[None, :] + (g * UNROLL * BLOCK + step)
                    xn = tl.load(t_ptr + token)  # in flight while group g - 1 is reduced
                    cn = tl.load(c_ptr + token)
                    m, s, cm, cs, risky = _pair_step(xb, cb, m, s, cm, cs, risky, ttemp, c_scale, RAW, FAST, dt, dr,
                                                     ds, dtiny, HARDWARE)
                    xb = xn
                    cb = cn
                m, s, cm, cs, risky = _pair_step(xb, cb, m, s, cm, cs, risky, ttemp, c_scale, RAW, FAST, dt, dr, ds,
                                                 dtiny, HARDWARE)
            # a bonus row (no cache row: c_end = start): its target groups double-buffered alone
            alone = tl.where((c_end == start) & (end > start), (end - start) // (UNROLL * BLOCK), 0)
            if alone > 0:
                xb = tl.load(t_ptr + lane[None, :] + step)
                for g in tl.range(1, alone):
                    xn = tl.load(t_ptr + lane[None, :] + (g * UNROLL * BLOCK + step))  # in flight during group g - 1
                    m, s, risky = _target_step(xb, m, s, risky, ttemp, RAW, FAST, dt, dr, ds, dtiny, HARDWARE)
                    xb = xn
                m, s, risky = _target_step(xb, m, s, risky, ttemp, RAW, FAST, dt, dr, ds, dtiny, HARDWARE)
            full = full + alone  # (one of the two is 0)
        else:
            for g in tl.range(0, full, num_stages=PIPE):
                token = lane[None, :] + (g * UNROLL * BLOCK + step)
                if FAST == 2:
                    x = _divide_poisoned(to_float32(tl.load(t_ptr + token)), dt, dr, ds, dtiny)
                elif FAST:
                    x, tiny = _divide(to_float32(tl.load(t_ptr + token)), dt, dr, ds, dtiny)
                    risky = risky | tl.max(tiny.to(tl.int32), axis=0)
                else:
                    x = _load_row(t_ptr, token, None, ttemp, RAW, None)
                c = to_float32(tl.load(c_ptr + token))
                m, s = _softmax_step(x, m, s, _LOG2E, HARDWARE)
                cm, cs = _softmax_step(c, cm, cs, c_scale, HARDWARE)
        first = full * UNROLL
    for t in tl.range(first, tiles, UNROLL, num_stages=PIPE):
        token = lane[None, :] + (t * BLOCK + step)
        if FAST == 2:
            x = _divide_poisoned(_load_row(t_ptr, token, token < end, ttemp, False, float("-inf")), dt, dr, ds, dtiny)
        elif FAST:
            x, tiny = _divide(_load_row(t_ptr, token, token < end, ttemp, False, float("-inf")), dt, dr, ds, dtiny)
            risky = risky | tl.max(tiny.to(tl.int32), axis=0)
        else:
            x = _load_row(t_ptr, token, token < end, ttemp, RAW, float("-inf"))
        c = _load_row(c_ptr, token, token < c_end, ttemp, False, float("-inf"))
        m, s = _softmax_step(x, m, s, _LOG2E, HARDWARE)
        cm, cs = _softmax_step(c, cm, cs, c_scale, HARDWARE)
    t_max, t_sum = _softmax_combine(m, s, _LOG2E)
    c_max, c_sum = _softmax_combine(cm, cs, c_scale)
    if FAST == 2:  # a poisoned value (or a NaN or +inf of the input: the exact path gives the same then)
        redo = t_sum != t_sum
    else:
        redo = tl.max(risky, axis=0) != 0
    return t_max, t_sum, c_max, c_sum, redo


@triton.jit
def _scan_tile(x, token, best, index):
    """One tile ``x`` (``[BLOCK]`` fp32, tokens ``token`` int32) into the per-lane first maxima ``best`` / ``index``
    (a strict ``>`` keeps the first; a NaN wins over numbers)."""
    better = (x > best) | ((x != x) & (best == best))
    return tl.where(better, x, best), tl.where(better, token, index)


@triton.jit
def _load_group(ptr, token, temp, DIVIDE: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """Tiles ``token + i BLOCK`` (``token`` ``[BLOCK]`` int32, whole: no mask) of a double-buffered argmax group, ``i <
    4`` (``WIDE``) or ``i < 2`` (then the last two are the first two again, unused): four ``[BLOCK]`` fp32."""
    x0 = _load_row(ptr, token, None, temp, DIVIDE, None)
    x1 = _load_row(ptr, token + BLOCK, None, temp, DIVIDE, None)
    if WIDE:
        x2 = _load_row(ptr, token + 2 * BLOCK, None, temp, DIVIDE, None)
        x3 = _load_row(ptr, token + 3 * BLOCK, None, temp, DIVIDE, None)
    else:
        x2 = x0
        x3 = x1
    return x0, x1, x2, x3


@triton.jit
def _scan_group(x0, x1, x2, x3, token, best, index, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """A group from :func:`_load_group` at ``token`` into the per-lane first maxima, its tiles in token order."""
    best, index = _scan_tile(x0, token, best, index)
    best, index = _scan_tile(x1, token + BLOCK, best, index)
    if WIDE:
        best, index = _scan_tile(x2, token + 2 * BLOCK, best, index)
        best, index = _scan_tile(x3, token + 3 * BLOCK, best, index)
    return best, index


@triton.jit
def _row_argmax(ptr, start, end, tiles, temp, DIVIDE: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                PIPE: tl.constexpr, SCAN: tl.constexpr = False, DBUF: tl.constexpr = False):
    """``argmax_first`` of ``row[start:end]`` (``/ T`` when ``DIVIDE``): ``(value, token)``.

    Per-lane first maxima over ``[UNROLL, BLOCK]`` tiles (a NaN wins over numbers), combined
    across lanes once with :func:`block_argmax`; an all ``-inf`` range gives its first token.
    ``DBUF`` (with ``SCAN``): the whole groups of 4 tiles (2 when ``UNROLL < 4``) are double-buffered
    in registers (group ``g + 1`` loaded before group ``g`` is scanned, so a group stays in flight);
    the tiles are scanned in the same order, so the result is bit-identical.
    """
    lane = start + tl.arange(0, BLOCK)
    step = tl.arange(0, UNROLL)[:, None] * BLOCK
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    index = lane
    first = 0
    if SCAN & DBUF:  # groups of 4 tiles (2 when UNROLL < 4)
        WIDE: tl.constexpr = UNROLL >= 4
        span = (4 if WIDE else 2) * BLOCK
        full = (end - start) // span
        if full > 0:
            x0, x1, x2, x3 = _load_group(ptr, lane, temp, DIVIDE, BLOCK, WIDE)
            for g in tl.range(1, full):
                token = lane + g * span
                n0, n1, n2, n3 = _load_group(ptr, token, temp, DIVIDE, BLOCK, WIDE)  # in flight during group g - 1
                best, index = _scan_group(x0, x1, x2, x3, token - span, best, index, BLOCK, WIDE)
                x0, x1, x2, x3 = n0, n1, n2, n3
            best, index = _scan_group(x0, x1, x2, x3, lane + (full - 1) * span, best, index, BLOCK, WIDE)
        first = full * (span // BLOCK)
    if SCAN:  # one tile at a time, in token order per lane: a strict > keeps the first maximum
        for t in tl.range(first, tiles, num_stages=PIPE):
            token = lane + t * BLOCK
            x = _load_row(ptr, token, token < end, temp, DIVIDE, float("-inf"))
            best, index = _scan_tile(x, token, best, index)
    else:
        for t in tl.range(0, tiles, UNROLL, num_stages=PIPE):
            token = lane[None, :] + (t * BLOCK + step)
            ok = token < end
            x = _load_row(ptr, token, ok, temp, DIVIDE, float("-inf"))
            val, tok = block_argmax(x, token, ok | (step == 0), 0)  # earlier tiles first within a column
            better = (val > best) | ((val != val) & (best == best))
            best = tl.where(better, val, best)
            index = tl.where(better, tok, index)
    return block_argmax(best, index, lane < end)


@triton.jit
def _prob(x, row_max, row_sum):
    """Softmax entry ``exp(x - max) / sum`` (IEEE division)."""
    return tl.math.div_rn(tl.exp2((x - row_max) * _LOG2E), row_sum)


@triton.jit
def _draft_prob(c, token, temp, q_max, q_sum, q_arg):
    """``q(v)`` of cached logits ``c`` (fp32): softmax of ``c / T``, or one-hot at the argmax if T == 0."""
    soft = _prob(_scaled(c, temp), q_max, q_sum)
    return tl.where(temp == 0.0, tl.where(token == q_arg, 1.0, 0.0), soft)


@triton.jit
def _block_count(mass, weights, u, n, ii):
    """Block verification's count (Sun et al. 2024): the largest ``i`` in ``1..n`` with ``u_{i-1} < h_i``.

    Vectors over ``ii`` (``[KP1]``): ``mass`` the residual masses ``r_i`` (0 outside ``1 <= i < K``),
    ``weights`` ``w_i``, ``u`` the uniform ``u_{i-1}`` of index ``i``. ``h_i = r_i / (r_i + 1 - w_i)``
    (0 where ``r_i = 0``) for ``i < n``, ``h_n = w_n``, 0 after ``n``.
    """
    h_inner = tl.where(mass > 0.0, tl.math.div_rn(mass, mass + (1.0 - weights)), 0.0)
    h = tl.where(ii == n, weights, tl.where(ii < n, h_inner, 0.0))
    return tl.max(tl.where((ii >= 1) & (ii <= n) & (u < h), ii, 0), axis=0)


@triton.jit
def _fast_prob(x, row_max, scale, inv_sum, HARDWARE: tl.constexpr):
    """``2^((x - max) scale) / sum`` with the normaliser's reciprocal (residuals and masses)."""
    return _exp2((x - row_max) * scale, HARDWARE) * inv_sum


@triton.jit
def _cache_scale(temp):
    """``log2(e) / T`` for a cache row's softmax in the cache values' space (T == 0: 1), at most FLT_MAX.

    Below T ~ 4e-39 the quotient overflows and ``(c - max) * inf`` would be NaN at the row's maximum, where
    ``softmax(c / T)`` (the reference's) is one-hot at the maximum: FLT_MAX keeps the maximum at 1 and every
    smaller value at 0.
    """
    return tl.minimum(tl.math.div_rn(_LOG2E, tl.where(temp == 0.0, 1.0, temp)), FLOAT32_MAX)


@triton.jit
def _fast_draft_prob(c, token, temp, c_max, scale, inv_sum, q_arg, HARDWARE: tl.constexpr):
    """``q(v)`` in the cache values' space (``scale = log2(e) / T``), one-hot at the argmax if T == 0."""
    soft = _fast_prob(c, c_max, scale, inv_sum, HARDWARE)
    return tl.where(temp == 0.0, tl.where(token == q_arg, 1.0, 0.0), soft)


@triton.jit
def _emit_keys(t_row, c_row, prefix, token, ok, ttemp, temp, w, t_max, t_inv, q_cmax, q_scale, q_inv, q_arg,
               residual_mode, RAW: tl.constexpr, EXACT: tl.constexpr, HARDWARE: tl.constexpr, X=None, C=None):
    """Gumbel-max keys of the emitted row at ``token`` and whether its residual is positive.

    After a rejection (``residual_mode``): ``log(max(w p - q, 0)) + g`` (residuals below the
    smallest normal count as 0, NaN as 0: key -inf); otherwise the bonus ``x + g`` (one fp32
    addition, as the reference). ``g`` is the exact keyed noise, or (``EXACT=False``) the cheap
    noise of :func:`dspark_markov.ops.noise.approx_gumbel` (within ``NOISE_BOUND``) used only to rank.
    ``X`` / ``C``: the tile's target and cache values (``[BLOCK]`` fp32, as :func:`_emit_load` gives them:
    the target not yet divided, the cache 0 without a rejection) instead of loading them here.
    """
    u = rng_triton.uniform32(rng_triton.hash_finish(prefix, token))
    if EXACT:
        g = rng_triton.gumbel32(u)
    else:
        g = approx_gumbel(u, HARDWARE)
    if X is None:
        x = _load_row(t_row, token, ok, ttemp, RAW, float("-inf"))
    else:
        x = X
        if RAW:
            x = _divide_by(x, ttemp)  # as _load_row divides
    if residual_mode:
        if C is None:
            c = _load_row(c_row, token, ok, temp, False, 0.0)
        else:
            c = C
        d = w * _fast_prob(x, t_max, _LOG2E, t_inv, HARDWARE) - _fast_draft_prob(
            c, token, temp, q_cmax, q_scale, q_inv, q_arg, HARDWARE)
        residual = tl.where(ok & (d >= _TINY), d, 0.0)
        key = fast_log2(residual, HARDWARE) * _LN2 + g
        positive = residual > 0.0
    else:
        key = x + g
        positive = token < 0  # all False (an int1 tensor like the other branch's)
    return tl.where(ok, key, float("-inf")), positive


@triton.jit
def _emit_load(t_row, c_row, token, start, end, residual_mode, REVERSE: tl.constexpr):
    """One emit tile's values at ``token`` (``[BLOCK]`` int32) as :func:`_emit_keys` loads them (the target
    undivided; the cache only after a rejection, else 0): ``(x, c)``, ``[BLOCK]`` fp32 each. Lanes at or past
    ``end`` (``REVERSE``: outside ``[start, end)``, the prefetch after the first tile) load nothing."""
    ok = token < end
    c_ok = token < tl.where(residual_mode, end, 0)
    if REVERSE:
        ok = ok & (token >= start)
        c_ok = c_ok & (token >= start)
    return (_load_row(t_row, token, ok, 1.0, False, float("-inf")), _load_row(c_row, token, c_ok, 1.0, False, 0.0))


@triton.jit
def _lane_exact(t_row, c_row, prefix, best, best_tok, runner, lane_ok, ttemp, temp, w, t_max, t_inv, q_cmax, q_scale,
                q_inv, q_arg, residual_mode, RAW: tl.constexpr, HARDWARE: tl.constexpr):
    """:func:`_emit_scan`'s answer from every lane's exact best key: ``(value, token, close)``, ``close`` when a lane's
    cheap runner-up is within the slack of its best and of that answer (the caller then rescans exactly)."""
    exact, exact_pos = _emit_keys(t_row, c_row, prefix, best_tok, lane_ok, ttemp, temp, w, t_max, t_inv, q_cmax,
                                  q_scale, q_inv, q_arg, residual_mode, RAW, True, HARDWARE)
    value, token = block_argmax(exact, best_tok, lane_ok)
    slack = key_slack(value, _FILTER_MARGIN)
    # (no finite key: the answer is the first token whatever the noise; +inf stands in so none is close)
    reach = tl.where(value > float("-inf"), value, float("inf"))
    close = lane_ok & (runner >= best - slack) & (runner + slack >= reach)
    return value, token, tl.max(close.to(tl.int32), axis=0) > 0


@triton.jit
def _emit_scan(t_row, c_row, prefix, start, end, tiles, ttemp, temp, w, t_max, t_inv, q_cmax, q_scale, q_inv,
               q_arg, residual_mode, RAW: tl.constexpr, EXACT: tl.constexpr, HARDWARE: tl.constexpr,
               BLOCK: tl.constexpr, PIPE: tl.constexpr = 1, DBUF: tl.constexpr = False,
               REVERSE: tl.constexpr = False, WINNER: tl.constexpr = False):
    """``(best key, first token, any positive residual, risky)`` of the emitted row over ``[start, end)``.

    ``EXACT``: the argmax of the exact keys (``torch.argmax`` semantics: a NaN wins). Otherwise the
    lanes are ranked by the cheap noise (best and runner-up per lane), the exact key of each lane's
    best is computed, and ``risky`` is set when that cannot be the exact answer: a NaN key, or a
    lane whose runner-up is within the noise bound's slack of its best and of the winner (then the
    caller rescans exactly; rare, since both keys must also be the chunk's best to within the slack).

    ``DBUF``: tile ``t + 1`` is loaded before tile ``t``'s keys are computed (:func:`_emit_load`), so a
    load is in flight during the noise and key arithmetic; the same keys in the same order per lane.
    ``REVERSE``: the tiles in decreasing token order (the row's most recently streamed lines, those most
    likely still in L2, first), the first maximum kept by ``>=`` (and, exact, the first NaN by replacing
    on any NaN): the same best key, token, runner-up and flags per lane as the forward scan.
    ``WINNER`` (not ``EXACT``): the exact key of the cheap keys' winner only (one scalar key per program instead of
    one per lane), unless another candidate (another lane's best or the winner lane's runner-up) comes within the
    bound's slack of that exact key: then every lane's best gets its exact key as without ``WINNER``, so ``risky``
    (a rescan) comes as rarely as before.
    """
    lane = start + tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    runner = tl.full([BLOCK], float("-inf"), tl.float32)
    best_tok = lane
    positive = tl.zeros([BLOCK], tl.int32)
    nan = tl.zeros([BLOCK], tl.int32)
    if REVERSE:
        first, step = lane + (tiles - 1) * BLOCK, -BLOCK
    else:
        first, step = lane, BLOCK
    if DBUF:
        nx, nc = _emit_load(t_row, c_row, first, start, end, residual_mode, REVERSE)
    for t in tl.range(0, tiles, num_stages=PIPE):
        token = first + t * step
        x = None  # (None: _emit_keys loads the tile itself)
        c = None
        if DBUF:
            x = nx
            c = nc
            nx, nc = _emit_load(t_row, c_row, token + step, start, end, residual_mode, REVERSE)  # (outside: nothing)
        key, pos = _emit_keys(t_row, c_row, prefix, token, token < end, ttemp, temp, w, t_max, t_inv, q_cmax,
                              q_scale, q_inv, q_arg, residual_mode, RAW, EXACT, HARDWARE, x, c)
        positive = positive | pos.to(tl.int32)
        if EXACT:
            if REVERSE:  # (a NaN of a smaller token replaces any best; an equal key too)
                better = (key >= best) | (key != key)
            else:
                better = (key > best) | ((key != key) & (best == best))
        else:
            nan = nan | (key != key).to(tl.int32)
            if REVERSE:
                better = key >= best
            else:
                better = key > best
            runner = tl.where(better, best, tl.maximum(runner, key))
        best = tl.where(better, key, best)
        best_tok = tl.where(better, token, best_tok)
    lane_ok = lane < end
    if EXACT:
        value, token = block_argmax(best, best_tok, lane_ok)
        risky = start < 0  # False: the exact path is the answer
    else:
        risky = tl.max(nan, axis=0) != 0
        if WINNER:
            # Every value other than the cheap winner's is at most its lane's best (another lane) or the winner lane's
            # runner-up, and a cheap key is within the slack of its exact key: below ``value - slack`` it cannot
            # reach ``value`` (a tie included). All keys -inf: the first token, as the exact keys would give. A
            # candidate within the slack (~1.7e-4 per chunk) falls back to every lane's exact key, which rescans
            # only on a near-tie inside a lane, as without WINNER.
            _, token = block_argmax(best, best_tok, lane_ok)
            value, winner_pos = _emit_keys(t_row, c_row, prefix, token, token < end, ttemp, temp, w, t_max, t_inv,
                                           q_cmax, q_scale, q_inv, q_arg, residual_mode, RAW, True, HARDWARE)
            second = tl.max(tl.where(lane_ok, tl.where(best_tok == token, runner, best), float("-inf")), axis=0)
            if (value > float("-inf")) & (second + key_slack(value, _FILTER_MARGIN) >= value):
                value, token, close = _lane_exact(t_row, c_row, prefix, best, best_tok, runner, lane_ok, ttemp, temp, w,
                                                  t_max, t_inv, q_cmax, q_scale, q_inv, q_arg, residual_mode, RAW,
                                                  HARDWARE)
                risky = risky | close
        else:
            value, token, close = _lane_exact(t_row, c_row, prefix, best, best_tok, runner, lane_ok, ttemp, temp, w,
                                              t_max, t_inv, q_cmax, q_scale, q_inv, q_arg, residual_mode, RAW, HARDWARE)
            risky = risky | close
    return value, token, tl.max(positive, axis=0), risky


@triton.jit
def _stream_chunk(t_base, c_base, t_row_stride, c_step_stride, drafts_ptr, d_req_stride, d_step_stride, xv_ptr,
                  pa_ptr, pb_ptr, pi_ptr, b, j, chunk, start, end, live, n, greedy, temp, ttemp, vocab, T1,
                  K: tl.constexpr, KP1: tl.constexpr, R2: tl.constexpr, C1P: tl.constexpr, BLOCK: tl.constexpr,
                  UNROLL: tl.constexpr, UR: tl.constexpr, HARDWARE: tl.constexpr, PIPE: tl.constexpr,
                  FAST_DIVIDE: tl.constexpr, RAW: tl.constexpr, INTERIOR: tl.constexpr, DBUF: tl.constexpr,
                  FUSED: tl.constexpr, EARLY: tl.constexpr, SCAN_ARGMAX: tl.constexpr):
    """One stream item's work: tokens ``[start, end)`` (``T1`` tiles at most) of target row ``j`` and cache row ``j``
    of request ``b`` reduced to its partial statistics (``pa`` / ``pb`` / ``pi`` at ``(b, j, chunk)`` and
    ``(b, K + 1 + j, chunk)``), and with ``EARLY`` the logits at draft ``j`` when the range holds it. Nothing for a
    row past ``n`` or a padding request. Bytes: ``end - start`` target values (fp32) and as many cache values
    (bf16 / fp32), read once."""
    if live & (j <= n):
        part = (b * R2 + j) * C1P + chunk
        qpart = (b * R2 + K + 1 + j) * C1P + chunk
        if EARLY:  # p_j's and q_j's logits at draft j, for the epilogue (no dependent loads there)
            if j < n:
                xj = tl.load(drafts_ptr + b * d_req_stride + j * d_step_stride).to(tl.int64)
                xj = tl.minimum(tl.maximum(xj, 0), vocab - 1)
                if (xj >= start) & (xj < end):
                    tl.store(xv_ptr + b * 2 * KP1 + j, tl.load(t_base + j * t_row_stride + xj))
                    tl.store(xv_ptr + (b * 2 + 1) * KP1 + j, to_float32(tl.load(c_base + j * c_step_stride + xj)))
        if greedy:
            val, tok = _row_argmax(t_base + j * t_row_stride, start, end, T1, ttemp, RAW, BLOCK, UNROLL, PIPE,
                                   SCAN_ARGMAX, DBUF)
            tl.store(pa_ptr + part, val)
            tl.store(pi_ptr + part, tok)
        elif FUSED & (temp != 0.0):  # target row j and cache row j (none for j = n) in one loop
            c_end = tl.where(j < n, end, start)
            c_scale = _cache_scale(temp)
            if (FAST_DIVIDE > 0) & RAW & (ttemp != 0.0) & (ttemp != 1.0):
                dt, dr, ds, dtiny = _divisor(ttemp)
                mx, sm, cmx, csm, risky = _pair_softmax(t_base + j * t_row_stride, c_base + j * c_step_stride,
                                                        start, end, c_end, T1, ttemp, c_scale, RAW, BLOCK,
                                                        UR, HARDWARE, PIPE, FAST_DIVIDE, dt, dr, ds, dtiny,
                                                        INTERIOR, DBUF)
                if risky:  # a value of magnitude below 2^-100 (or an extreme T): divide exactly
                    mx, sm, cmx, csm, no_risk = _pair_softmax(t_base + j * t_row_stride, c_base + j * c_step_stride,
                                                              start, end, c_end, T1, ttemp, c_scale, RAW, BLOCK,
                                                              UR, HARDWARE, 1)
            elif RAW & (ttemp != 0.0) & (ttemp != 1.0):  # every target value divided (div_rn)
                mx, sm, cmx, csm, no_risk = _pair_softmax(t_base + j * t_row_stride, c_base + j * c_step_stride,
                                                          start, end, c_end, T1, ttemp, c_scale, RAW, BLOCK,
                                                          UR, HARDWARE, PIPE, INTERIOR=INTERIOR)
            else:  # pre-divided, or raw at T = 0 / 1 (x / 1 = x exactly): the standard loop
                mx, sm, cmx, csm, no_risk = _pair_softmax(t_base + j * t_row_stride, c_base + j * c_step_stride,
                                                          start, end, c_end, T1, ttemp, c_scale, False, BLOCK,
                                                          UNROLL, HARDWARE, PIPE, INTERIOR=INTERIOR, DBUF=DBUF)
            tl.store(pa_ptr + part, mx)
            tl.store(pb_ptr + part, sm)
            if j < n:
                tl.store(pa_ptr + qpart, cmx)
                tl.store(pb_ptr + qpart, csm)
        else:
            mx, sm = _row_softmax(t_base + j * t_row_stride, start, end, T1, ttemp, _LOG2E, RAW, BLOCK, UR,
                                  HARDWARE, PIPE)
            tl.store(pa_ptr + part, mx)
            tl.store(pb_ptr + part, sm)
            if j < n:  # the cache row draft j was drawn from
                if temp == 0.0:
                    val, tok = _row_argmax(c_base + j * c_step_stride, start, end, T1, temp, False, BLOCK, UNROLL,
                                           PIPE, SCAN_ARGMAX)
                    tl.store(pa_ptr + qpart, val)
                    tl.store(pi_ptr + qpart, tok)
                else:
                    mx, sm = _row_softmax(c_base + j * c_step_stride, start, end, T1, temp,
                                          _cache_scale(temp), False, BLOCK, UNROLL, HARDWARE, PIPE)
                    tl.store(pa_ptr + qpart, mx)
                    tl.store(pb_ptr + qpart, sm)


@triton.jit
def _arrive(counter_ptr, expected):
    """Count this item in; True for the last of ``expected`` items (which then sees their stores)."""
    tl.debug_barrier()  # every thread's stores of this item are issued before the arrival
    last = tl.atomic_add(counter_ptr, 1) == expected - 1  # acq_rel, gpu scope
    tl.debug_barrier()
    return last


@triton.jit
def _accepted_drafts(drafts, d_step_stride, jj, js, K: tl.constexpr):
    """A request's draft tokens before its emitted position ``js`` (``jj`` ``[KP1]``; 0 elsewhere), as stored."""
    return tl.load(drafts + jj * d_step_stride, mask=(jj < js) & (jj < K), other=0)


@triton.jit
def _field(picked, fields, f: tl.constexpr):
    """Field ``f`` of a request's row statistics (``picked``: ``[8]`` int32 bits, one per field) as fp32."""
    return tl.sum(tl.where(fields == f, picked, 0), axis=0).to(tl.float32, bitcast=True)


@triton.jit
def _poll(flag_ptr, level, status_ptr, seen):
    """:func:`_wait`'s bounded spin from a first reading ``seen``, then an acquire (the producer's stores are
    visible to what follows); ``status`` bit 1 on a timeout."""
    spins = 0
    while (seen < level) & (spins < _SPIN):
        seen = tl.load(flag_ptr, volatile=True)
        spins += 1
    if seen < level:
        tl.atomic_or(status_ptr, 1)
    tl.atomic_add(flag_ptr, 0)  # acquire


@triton.jit
def _wait(flag_ptr, level, status_ptr, FAST: tl.constexpr = False):
    """Bounded spin until ``*flag_ptr >= level``; sets ``status`` bit 1 on a timeout. ``FAST``: when the first
    (acquiring) read already sees the level, no second acquire (one round trip instead of two)."""
    seen = tl.atomic_add(flag_ptr, 0)  # acquire
    if FAST:
        if seen < level:
            _poll(flag_ptr, level, status_ptr, seen)
    else:
        _poll(flag_ptr, level, status_ptr, seen)
    tl.debug_barrier()


@triton.jit
def _item(requests, LAG, S1, SM, S2, C1, STAGES: tl.constexpr):
    """``(stage, request, row, chunk, valid)`` of this program; see the module docstring.

    Super-step ``r`` holds ``S1`` stream items of request ``r``, then (block) ``SM`` mass items of
    request ``r - lag``, then ``S2`` emit items of request ``r - (STAGES-1) lag``: an item's
    dependencies always have smaller program ids, for any ``lag >= 0``.
    """
    t = tl.program_id(0).to(tl.int64)
    step_size = S1 + SM + S2
    r = t // step_size
    o = t % step_size
    stage = tl.where(o < S1, 0, tl.where(o < S1 + SM, 1, 2))
    e = tl.where(stage == 0, o, tl.where(stage == 1, o - S1, o - S1 - SM))
    b = tl.where(stage == 2, r - (STAGES - 1) * LAG, tl.where(stage == 1, r - LAG, r))
    row = tl.where(stage == 2, 0, tl.where(stage == 1, e // C1 + 1, e // C1))
    chunk = tl.where(stage == 2, e, e % C1)
    valid = (b >= 0) & (b < requests)
    return stage, tl.where(valid, b, 0), row.to(tl.int32), chunk.to(tl.int32), valid


@triton.jit
def _item_compact(requests, LAG, S1, S2, C1):
    """``(stage, request, row, chunk, valid)`` of this program in the compact order (standard method).

    The order of :func:`_item` without its padding: the stream items of requests ``0 .. lag-1``, then
    super-steps ``r = lag .. B-1`` of ``S1`` stream items of request ``r`` and ``S2`` emit items of
    request ``r - lag``, then the emit items of the last ``lag`` requests. An emit item still comes
    after every stream item of its request (smaller program ids), and no program is left without an
    item, so none is dispatched only to exit (at 16 requests the padded order held 1,408 of 2,816).
    """
    t = tl.program_id(0).to(tl.int64)
    lag = tl.minimum(LAG, requests).to(tl.int64)
    head = lag * S1
    middle = (requests - lag) * (S1 + S2)
    u = t - head
    o = u % (S1 + S2)
    r = u // (S1 + S2) + lag
    in_head = t < head
    in_tail = u >= middle
    w = u - middle
    stage = tl.where(in_head, 0, tl.where(in_tail, 2, tl.where(o < S1, 0, 2)))
    b = tl.where(in_head, t // S1, tl.where(in_tail, requests - lag + w // S2, tl.where(o < S1, r, r - lag)))
    e = tl.where(in_head, t % S1, tl.where(in_tail, w % S2, tl.where(o < S1, o, o - S1)))
    row = tl.where(stage == 2, 0, e // C1)
    chunk = tl.where(stage == 2, e, e % C1)
    valid = (b >= 0) & (b < requests)
    return stage, tl.where(valid, b, 0), row.to(tl.int32), chunk.to(tl.int32), valid


# --------------------------------------------------------------------------- the kernel
@triton.jit(do_not_specialize=["num_slots", "requests", "LAG", "C1", "C2", "T1", "T2", "TAIL", "C2T", "T2T"])
def _stream_verify_kernel(
    target_ptr, t_req_stride, t_row_stride,  # [B, K+1, V] fp32 (raw when RAW)
    drafts_ptr, d_req_stride, d_step_stride,  # [B, K] int32/int64
    cache_ptr, c_slot_stride, c_step_stride,  # [S, N, V] bf16/fp32
    idx_ptr, nd_ptr, pos_ptr,  # [B] int32/int64, contiguous
    temp_ptr, seeds_ptr, tt_ptr, num_slots,  # [S] fp32, [S] int64, [S] fp32 target T (RAW)
    greedy_ptr,  # [B] uint8 (read when HAS_GREEDY)
    pa_ptr, pb_ptr, pi_ptr,  # [maxB, 2K+1, C1P] fp32, fp32, int32 stream partials (rows, then cache rows)
    mass_ptr,  # [maxB, KQ, C1P] fp32 partial residual masses (block)
    ea_ptr, ei_ptr, eany_ptr,  # [maxB, C2P] fp32, int32, int32 emit partials: best key, its token, residual > 0
    row_ptr,  # [maxB, 8, KP1] fp32: target max, sum, cache max, sum, weights, argmax t, argmax q (bits)
    acc_ptr,  # [maxB] int32 accepted count
    xv_ptr,  # [maxB, 2, KP1] fp32: target and cache logits at each draft (EARLY)
    counters_ptr,  # [maxB, 4] int32: stream, mass (block) or claimed chunks (CLAIM), emit arrivals, ready level
    status_ptr,  # [1] int32
    tokens_ptr, tokens_stride, num_emitted_ptr,  # [B, K+1] int64, [B] int64
    requests, vocab, LAG, C1, C2, T1, T2,
    K: tl.constexpr, KP1: tl.constexpr, C1P: tl.constexpr, C2P: tl.constexpr, BLOCK: tl.constexpr,
    UNROLL: tl.constexpr, HARDWARE: tl.constexpr, EMIT_SCAN: tl.constexpr, NOISE_FILTER: tl.constexpr,
    HAS_GREEDY: tl.constexpr, RAW: tl.constexpr, BLOCK_METHOD: tl.constexpr, PIPE: tl.constexpr = 1,
    EMIT_PIPE: tl.constexpr = 1, FUSED: tl.constexpr = False, EMIT_BLOCK: tl.constexpr = 2048,
    EMIT_DBUF: tl.constexpr = False, EMIT_REVERSE: tl.constexpr = False,
    FAST_DIVIDE: tl.constexpr = 0, INTERIOR: tl.constexpr = False, SCAN_ARGMAX: tl.constexpr = False,
    EARLY: tl.constexpr = False, PREFETCH: tl.constexpr = False, DIV_UNROLL: tl.constexpr = 0, DBUF: tl.constexpr = False,
    trace_ptr=None, TRACE: tl.constexpr = False, COMPACT: tl.constexpr = False, EMIT_PREFETCH: tl.constexpr = 0,
    GREEDY_DIRECT: tl.constexpr = False, ROW_LO: tl.constexpr = 0, ROW_HI: tl.constexpr = 0,
    CLAIM: tl.constexpr = 0, SPAN: tl.constexpr = False, EMIT_EAGER: tl.constexpr = False,
    EMIT_GATHER: tl.constexpr = False, EMIT_WINNER: tl.constexpr = False,
    TAIL=0, C2T=0, T2T=0, TAILED: tl.constexpr = False,
):
    STAGES: tl.constexpr = 3 if BLOCK_METHOD else 2
    MASS_ROWS: tl.constexpr = K - 1 if (BLOCK_METHOD and K >= 2) else 0
    # A phased launch (standard method, StreamVerifier's phases) streams rows [ROW_LO, HI) of the requests whose
    # drafts 0 .. ROW_LO-1 an earlier launch accepted; ROW_HI = 0: up to row K. Not phased: ROWS = K + 1.
    PHASED: tl.constexpr = (ROW_LO > 0) or (ROW_HI > 0)
    HI: tl.constexpr = ROW_HI if ROW_HI > 0 else K + 1
    ROWS: tl.constexpr = HI - ROW_LO
    R2: tl.constexpr = 2 * K + 1  # partial rows: targets 0..K, caches K+1..2K
    # CLAIM > 0 (standard method): a request's chunks are claimed one at a time by its cdiv(ROWS * C1, CLAIM) stream
    # programs from a counter (counters word 1, the block method's mass arrivals), so they end together
    CLAIMED: tl.constexpr = (CLAIM > 0) and not BLOCK_METHOD
    # SPAN (standard method, one launch): a request's rows laid end to end, TPR tiles each (the last one ragged),
    # cut into C1 items of T1 consecutive tiles, so an item may end a row and start the next; item e's partials of
    # row j sit at chunk e, and row j's are those of items (j TPR) // T1 .. ((j + 1) TPR - 1) // T1
    SPANNED: tl.constexpr = SPAN and not CLAIMED and not BLOCK_METHOD and not PHASED
    TPR = tl.cdiv(vocab, BLOCK)
    if CLAIMED:
        S1 = tl.cdiv(ROWS * C1, CLAIM)  # stream programs per request
    elif SPANNED:
        S1 = C1
    else:
        S1 = ROWS * C1
    # tiles loaded at once where target values are divided (RAW, T not 0 or 1): DIV_UNROLL when given
    UR: tl.constexpr = (DIV_UNROLL if DIV_UNROLL > 0 else UNROLL) if RAW else UNROLL
    if TRACE:  # [programs, 4] int64: start, after-wait, end ns; stage + 4 valid + 8 smid + 2^16 direct + 2^17 row + 2^24 b
        t_start, smid = _clock(tl.program_id(0), HARDWARE)
    if COMPACT and not BLOCK_METHOD:  # the padded order without its padding
        stage, b, j, chunk, valid = _item_compact(requests, LAG, S1, C2, C1)
    else:
        stage, b, j, chunk, valid = _item(requests, LAG, S1, MASS_ROWS * C1, C2, C1, STAGES)
    if TAILED:  # the tail's extra emit items (chunks C2 .. C2T-1 of the last TAIL requests) after every other program
        past = tl.program_id(0).to(tl.int64) - (requests + (STAGES - 1) * LAG) * (S1 + MASS_ROWS * C1 + C2)
        b_extra = requests - TAIL + past // (C2T - C2)
        extra = past >= 0
        stage = tl.where(extra, 2, stage)
        chunk = tl.where(extra, C2 + past % (C2T - C2), chunk).to(tl.int32)
        valid = tl.where(extra, (b_extra >= 0) & (b_extra < requests), valid)
        b = tl.where(extra, tl.where(valid, b_extra, 0), b)
        in_tail = b >= requests - TAIL  # (this request's emit chunks: C2T of T2T tiles)
        EC = tl.where(in_tail, C2T, C2)
        ET = tl.where(in_tail, T2T, T2)
    else:
        EC = C2
        ET = T2
    if PHASED:
        j = j + ROW_LO  # (a stream item's row; emit items ignore it)
        if ROW_LO > 0:  # only requests that the earlier launches left undecided (accepted count = ROW_LO)
            valid = valid & (tl.load(acc_ptr + b) >= ROW_LO)
    if TRACE:
        t_waited = t_start
    if PREFETCH and not CLAIMED:  # the first tiles of a stream item's target row, before its request's loads come back
        if valid & (stage == 0):
            if SPANNED:  # the item's first row and tile
                pf_row = (chunk * T1) // TPR
                sector = (chunk * T1 - pf_row * TPR) * BLOCK + tl.arange(0, UNROLL * BLOCK // 8) * 8
            else:
                pf_row = j
                sector = chunk * T1 * BLOCK + tl.arange(0, UNROLL * BLOCK // 8) * 8  # one address per 32 bytes
            _prefetch_l2(target_ptr + b * t_req_stride + pf_row * t_row_stride + tl.minimum(sector, vocab - 1),
                         HARDWARE)
    live, slot, temp, seed, n, position, greedy, ttemp = _request(
        idx_ptr, nd_ptr, pos_ptr, temp_ptr, seeds_ptr, greedy_ptr, tt_ptr, b, num_slots, K, HAS_GREEDY, RAW)
    t_base = target_ptr + b * t_req_stride
    c_base = cache_ptr + slot * c_slot_stride
    rows = row_ptr + b * 8 * KP1
    jj = tl.arange(0, KP1)
    counters = counters_ptr + b * 4
    ready_level = 2 if MASS_ROWS > 0 else 1
    if GREEDY_DIRECT and MASS_ROWS == 0:  # greedy and padding requests: output by the stream epilogue, no emit work
        direct = greedy | ~live
    else:
        direct = live & ~live
    if valid & (stage == 0):
        # ---------------------------------------------------------------- stream item
        if CLAIMED:  # this request's chunks of rows ROW_LO..min(n, HI - 1), taken one at a time from its counter
            claim = counters + 1
            rows_left = tl.maximum(tl.minimum(n + 1, HI) - ROW_LO, 0)  # (<= ROWS: n <= K)
            total = tl.where(live, rows_left, 0) * C1  # chunks to hand out (none for a padding request)
            if total > 0:
                c = tl.atomic_add(claim, 1, sem="relaxed")  # (one thread's atomic, then a barrier: not overlapped)
                while c < total:
                    c_start = (c % C1) * T1 * BLOCK
                    _stream_chunk(t_base, c_base, t_row_stride, c_step_stride, drafts_ptr, d_req_stride, d_step_stride,
                                  xv_ptr, pa_ptr, pb_ptr, pi_ptr, b, ROW_LO + c // C1, c % C1, c_start,
                                  tl.minimum(c_start + T1 * BLOCK, vocab), live, n, greedy, temp, ttemp, vocab, T1,
                                  K, KP1, R2, C1P, BLOCK, UNROLL, UR, HARDWARE, PIPE, FAST_DIVIDE,
                                  RAW, INTERIOR, DBUF, FUSED, EARLY, SCAN_ARGMAX)
                    c = tl.atomic_add(claim, 1, sem="relaxed")  # after the chunk: programs end <= one chunk apart
        elif SPANNED:  # tiles [chunk T1, chunk T1 + T1) of the request's rows laid end to end: a piece per row
            g0 = chunk * T1
            g1 = tl.minimum(g0 + T1, ROWS * TPR)
            for row in tl.range(g0 // TPR, (g1 - 1) // TPR + 1):  # (two rows at most while T1 <= TPR + 1)
                lo = tl.maximum(g0 - row * TPR, 0)
                hi = tl.minimum(g1 - row * TPR, TPR)
                if hi > lo:
                    _stream_chunk(t_base, c_base, t_row_stride, c_step_stride, drafts_ptr, d_req_stride,
                                  d_step_stride, xv_ptr, pa_ptr, pb_ptr, pi_ptr, b, row, chunk, lo * BLOCK,
                                  tl.minimum(hi * BLOCK, vocab), live, n, greedy, temp, ttemp, vocab, hi - lo, K,
                                  KP1, R2, C1P, BLOCK, UNROLL, UR, HARDWARE, PIPE, FAST_DIVIDE, RAW, INTERIOR, DBUF,
                                  FUSED, EARLY, SCAN_ARGMAX)
        else:
            c_start = chunk * T1 * BLOCK
            _stream_chunk(t_base, c_base, t_row_stride, c_step_stride, drafts_ptr, d_req_stride, d_step_stride,
                          xv_ptr, pa_ptr, pb_ptr, pi_ptr, b, j, chunk, c_start, tl.minimum(c_start + T1 * BLOCK, vocab),
                          live, n, greedy, temp, ttemp, vocab, T1, K, KP1, R2, C1P, BLOCK, UNROLL, UR, HARDWARE, PIPE,
                          FAST_DIVIDE, RAW, INTERIOR, DBUF, FUSED, EARLY, SCAN_ARGMAX)
        if _arrive(counters + 0, S1):
            # Last stream item of request b: row statistics, acceptance, weights.
            cc = tl.arange(0, C1P)
            last_row = tl.where(live, n, -1)  # (the interpreter widens vector & scalar-bool to int32)
            if SPANNED:  # row j's partials: chunks (j TPR) // T1 .. ((j + 1) TPR - 1) // T1
                first_c = (jj * TPR) // T1
                c_first = cc[None, :] == first_c[:, None]  # (a row's first partial: an all -inf row's first token)
                c_in = ((cc[None, :] >= first_c[:, None]) & (cc[None, :] <= ((jj + 1) * TPR - 1)[:, None] // T1)
                        & (cc < C1)[None, :])
                t_ok = (jj <= last_row)[:, None] & c_in
                q_ok = (jj < n)[:, None] & c_in
            else:
                t_ok = (jj <= last_row)[:, None] & (cc < C1)[None, :]
                q_ok = (jj < n)[:, None] & (cc < C1)[None, :]  # n = 0 for padding
            if PHASED:  # this launch's rows only (earlier ones were accepted before, later ones are not read yet)
                in_phase = (jj >= ROW_LO) & (jj < HI)
                t_ok = t_ok & in_phase[:, None]
                q_ok = q_ok & in_phase[:, None]
            t_off = (b * R2 + jj[:, None]) * C1P + cc[None, :]
            q_off = (b * R2 + K + 1 + jj[:, None]) * C1P + cc[None, :]
            tm = tl.load(pa_ptr + t_off, mask=t_ok, other=-FLOAT32_MAX, volatile=True)
            ts = tl.load(pb_ptr + t_off, mask=t_ok, other=0.0, volatile=True)
            ti = tl.load(pi_ptr + t_off, mask=t_ok, other=0, volatile=True)
            qm = tl.load(pa_ptr + q_off, mask=q_ok, other=-FLOAT32_MAX, volatile=True)
            qs = tl.load(pb_ptr + q_off, mask=q_ok, other=0.0, volatile=True)
            qi = tl.load(pi_ptr + q_off, mask=q_ok, other=0, volatile=True)
            t_max = tl.max(tm, axis=1)
            t_sum = tl.sum(ts * tl.exp2((tm - t_max[:, None]) * _LOG2E), axis=1)
            if SPANNED:
                t_valid = t_ok | c_first
            else:
                t_valid = t_ok | (cc == 0)[None, :]
            _, t_arg = block_argmax(tl.where(t_ok, tm, float("-inf")), ti, t_valid, 1)
            q_cmax = tl.max(qm, axis=1)  # max of the raw cache values (T > 0 rows)
            q_scale = _cache_scale(temp)
            q_sum = tl.sum(qs * tl.exp2((qm - q_cmax[:, None]) * q_scale), axis=1)
            q_max = _scaled(q_cmax, temp)  # max(c) / T = max(c / T): division is monotone
            # max(c) / T infinite (c / T overflowing, or a +inf / all -inf row): softmax(c / T) is NaN everywhere, as
            # in the reference; a NaN normaliser makes the residuals' q (in the cache values' space, finite) NaN too,
            # so a rejected draft's row falls back to p as the reference's does
            # (nested selects: the interpreter cannot `&` a vector with a scalar bool)
            q_sum = tl.where(temp == 0.0, q_sum, tl.where((jj < n) & (tl.abs(q_max) == float("inf")), float("nan"), q_sum))
            if SPANNED:
                q_valid = q_ok | c_first
            else:
                q_valid = q_ok | (cc == 0)[None, :]
            _, q_arg = block_argmax(tl.where(q_ok, qm, float("-inf")), qi, q_valid, 1)
            t_arg = tl.minimum(tl.maximum(t_arg, 0), vocab - 1)
            q_arg = tl.minimum(tl.maximum(q_arg, 0), vocab - 1)
            # p_j(x_j), q_j(x_j), ratio and uniform of each draft j < n.
            d_ok = jj < n
            x = tl.load(drafts_ptr + b * d_req_stride + jj * d_step_stride, mask=d_ok, other=0).to(tl.int64)
            x = tl.minimum(tl.maximum(x, 0), vocab - 1)
            if EARLY:
                zx = tl.load(xv_ptr + b * 2 * KP1 + jj, mask=d_ok, other=0.0, volatile=True)
            else:
                zx = tl.load(t_base + jj * t_row_stride + x, mask=d_ok, other=0.0)
            if RAW:
                zx = _scaled(zx, ttemp)
            p_x = _prob(zx, t_max, t_sum)
            if EARLY:
                c_x = tl.load(xv_ptr + (b * 2 + 1) * KP1 + jj, mask=d_ok, other=0.0, volatile=True)
            else:
                c_x = to_float32(tl.load(c_base + jj * c_step_stride + x, mask=d_ok, other=0.0))
            q_x = _draft_prob(c_x, x, temp, q_max, q_sum, q_arg.to(tl.int64))
            ratio = tl.where(q_x > 0.0, tl.math.div_rn(p_x, tl.where(q_x > 0.0, q_x, 1.0)), 0.0)
            prefix = rng_triton.hash_prefix(seed, position - 1, _ACCEPT_DOMAIN)
            u = rng_triton.uniform32(rng_triton.hash_finish(prefix, jj))
            accept = d_ok & (u < ratio)
            g_accept = d_ok & (x == t_arg.to(tl.int64))
            if PHASED:  # drafts before ROW_LO: accepted by an earlier launch; from HI on: not decided yet
                accept = (d_ok & (jj < ROW_LO)) | (accept & (jj < HI))
                g_accept = (d_ok & (jj < ROW_LO)) | (g_accept & (jj < HI))
            count = tl.min(tl.where(accept, KP1, jj), axis=0)  # the first failing index (n if none)
            g_count = tl.min(tl.where(g_accept, KP1, jj), axis=0)
            count = tl.where(greedy, g_count, count)
            weights = tl.where(jj == 0, 1.0, 0.0)
            if BLOCK_METHOD:  # w_0 = 1, w_{i+1} = min(w_i ratio_i, 1) (torch.clamp_max: NaN stays NaN)
                w = 1.0
                for i in tl.static_range(K):
                    product = w * tl.sum(tl.where(jj == i, ratio, 0.0), axis=0)
                    w = tl.where(product > 1.0, 1.0, product)
                    weights = tl.where(jj == i + 1, w, weights)
            row_ok = jj <= K
            if PHASED:
                row_ok = row_ok & in_phase
            tl.store(rows + 0 * KP1 + jj, t_max, mask=row_ok)
            tl.store(rows + 1 * KP1 + jj, t_sum, mask=row_ok)
            tl.store(rows + 2 * KP1 + jj, q_cmax, mask=row_ok)  # raw max (the q of the residuals is in c space)
            tl.store(rows + 3 * KP1 + jj, q_sum, mask=row_ok)
            tl.store(rows + 4 * KP1 + jj, weights, mask=row_ok)
            tl.store(rows + 5 * KP1 + jj, t_arg.to(tl.float32, bitcast=True), mask=row_ok)
            tl.store(rows + 6 * KP1 + jj, q_arg.to(tl.float32, bitcast=True), mask=row_ok)
            tl.store(rows + 7 * KP1 + jj, u, mask=row_ok)
            if BLOCK_METHOD and MASS_ROWS == 0:  # K <= 1: no residual masses, count here
                u_prev = tl.where(jj >= 1, rng_triton.uniform32(rng_triton.hash_finish(prefix, jj - 1)), 1.0)
                block = _block_count(tl.zeros([KP1], tl.float32), weights, u_prev, n, jj)
                count = tl.where(greedy, count, block)
            tl.store(acc_ptr + b, count)  # (phased: HI when drafts up to HI - 1 are accepted and n >= HI)
            if PHASED:
                decided = count < HI  # else a later launch streams the next rows of this request
            else:
                decided = True
            if direct:  # the emit items of this request do nothing: write its output row here (as their last would)
                if decided:
                    js = tl.minimum(tl.maximum(count, 0), n)
                    emitted = tl.sum(tl.where(jj == js, t_arg, 0), axis=0).to(tl.int64)  # (t_arg clamped above)
                    out = tl.where(jj < js, x, tl.where(jj == js, emitted, -1))
                    tl.store(tokens_ptr + b * tokens_stride + jj, tl.where(live, out, -1), mask=jj <= K)
                    tl.store(num_emitted_ptr + b, tl.where(live, js + 1, 0).to(tl.int64))
                tl.store(counters + tl.arange(0, 4), tl.zeros([4], tl.int32))
            else:
                tl.debug_barrier()
                tl.atomic_xchg(counters + 3, 1)  # release: ready for the mass / emit items
                if EMIT_PREFETCH > 0:  # the emitted row (and its cache row after a rejection) into L2 for the emit items
                    if MASS_ROWS == 0:
                        if live & ~greedy & decided:  # (phased: an undecided request has no emitted row yet)
                            js = tl.minimum(tl.maximum(count, 0), n)
                            _prefetch_row(t_base + js * t_row_stride, vocab, BLOCK, HARDWARE, EMIT_PREFETCH == 2)
                            if js < n:
                                _prefetch_row(c_base + js * c_step_stride, vocab, BLOCK, HARDWARE, EMIT_PREFETCH == 2)
    if valid & (stage == 1):
        # ---------------------------------------------------------------- mass item (block)
        _wait(counters + 3, 1, status_ptr)
        if TRACE:
            t_waited, trace_sm = _clock(chunk, HARDWARE)
        i = j
        if live & ~greedy & (i < n):
            start = chunk * T1 * BLOCK
            end = tl.minimum(start + T1 * BLOCK, vocab)
            lane = start + tl.arange(0, BLOCK)
            step = tl.arange(0, UR)[:, None] * BLOCK
            w = tl.load(rows + 4 * KP1 + i, volatile=True)
            t_max = tl.load(rows + 0 * KP1 + i, volatile=True)
            t_inv = tl.math.div_rn(1.0, tl.load(rows + 1 * KP1 + i, volatile=True))
            q_cmax = tl.load(rows + 2 * KP1 + i, volatile=True)
            q_inv = tl.math.div_rn(1.0, tl.load(rows + 3 * KP1 + i, volatile=True))
            q_arg = tl.load(rows + 6 * KP1 + i, volatile=True).to(tl.int32, bitcast=True)
            q_scale = _cache_scale(temp)
            acc = tl.zeros([BLOCK], tl.float32)
            for t in tl.range(0, T1, UR, num_stages=PIPE):
                token = lane[None, :] + (t * BLOCK + step)
                ok = token < end
                xt = _load_row(t_base + i * t_row_stride, token, ok, ttemp, RAW, float("-inf"))
                ct = _load_row(c_base + i * c_step_stride, token, ok, temp, False, 0.0)
                d = w * _fast_prob(xt, t_max, _LOG2E, t_inv, HARDWARE) - _fast_draft_prob(
                    ct, token, temp, q_cmax, q_scale, q_inv, q_arg, HARDWARE)
                acc += tl.sum(tl.where(ok & (d > 0.0), d, 0.0), axis=0)
            tl.store(mass_ptr + (b * K + i) * C1P + chunk, tl.sum(acc, axis=0))
        if _arrive(counters + 1, MASS_ROWS * C1):
            if live & ~greedy:
                ii = tl.arange(0, KP1)
                cc = tl.arange(0, C1P)
                m_ok = ((ii >= 1) & (ii < n) & (ii < K))[:, None] & (cc < C1)[None, :]
                mass = tl.sum(tl.load(mass_ptr + (b * K + ii[:, None]) * C1P + cc[None, :], mask=m_ok, other=0.0,
                                      volatile=True), axis=1)
                weights = tl.load(rows + 4 * KP1 + ii, mask=ii <= K, other=0.0, volatile=True)
                u = tl.load(rows + 7 * KP1 + ii - 1, mask=(ii >= 1) & (ii <= K), other=1.0, volatile=True)
                tl.store(acc_ptr + b, _block_count(mass, weights, u, n, ii))
            tl.debug_barrier()
            tl.atomic_xchg(counters + 3, 2)
    if valid & (stage == 2) & ~direct:
        # ---------------------------------------------------------------- emit item
        _wait(counters + 3, ready_level, status_ptr, EMIT_EAGER)
        if TRACE:
            t_waited, trace_sm = _clock(chunk, HARDWARE)
        count = tl.load(acc_ptr + b, volatile=True)
        if EMIT_GATHER:  # every row's statistics loaded with the count (one round trip, not two), row js picked
            fields = tl.arange(0, 8)
            stats = tl.load(rows + fields[:, None] * KP1 + jj[None, :], volatile=True).to(tl.int32, bitcast=True)
        js = tl.minimum(tl.maximum(count, 0), n)
        if PHASED:
            decided = count < HI  # else rows HI.. come in a later launch: this one only resets the counters
        else:
            decided = True
        part = b * C2P + chunk
        if EMIT_GATHER:  # (picked as bits: no float arithmetic touches them)
            picked = tl.sum(tl.where(jj[None, :] == js, stats, 0), axis=1)  # [8] int32: field f of row js
            t_max = _field(picked, fields, 0)
            t_inv = tl.math.div_rn(1.0, _field(picked, fields, 1))
            q_cmax = _field(picked, fields, 2)
            q_inv = tl.math.div_rn(1.0, _field(picked, fields, 3))
            w = _field(picked, fields, 4)
            q_arg = _field(picked, fields, 6).to(tl.int32, bitcast=True)
        else:
            t_max = tl.load(rows + 0 * KP1 + js, volatile=True)
            t_inv = tl.math.div_rn(1.0, tl.load(rows + 1 * KP1 + js, volatile=True))
            q_cmax = tl.load(rows + 2 * KP1 + js, volatile=True)
            q_inv = tl.math.div_rn(1.0, tl.load(rows + 3 * KP1 + js, volatile=True))
            w = tl.load(rows + 4 * KP1 + js, volatile=True)
            q_arg = tl.load(rows + 6 * KP1 + js, volatile=True).to(tl.int32, bitcast=True)
        q_scale = _cache_scale(temp)
        if not BLOCK_METHOD:
            w = 1.0
        prefix = rng_triton.hash_prefix(seed, position + js - 1, _RESAMPLE_DOMAIN)
        t_row = t_base + js * t_row_stride
        c_row = c_base + js * c_step_stride  # read only after a rejection (js < n <= K)
        rejected = js < n
        scan = live & ~greedy & EMIT_SCAN
        if PHASED:
            scan = scan & decided
        if scan:
            start = chunk * ET * EMIT_BLOCK
            end = tl.minimum(start + ET * EMIT_BLOCK, vocab)
            val, tok, pos, risky = _emit_scan(t_row, c_row, prefix, start, end, ET, ttemp, temp, w, t_max, t_inv,
                                              q_cmax, q_scale, q_inv, q_arg, rejected, RAW, not NOISE_FILTER,
                                              HARDWARE, EMIT_BLOCK, EMIT_PIPE, EMIT_DBUF, EMIT_REVERSE, EMIT_WINNER)
            if NOISE_FILTER:
                if risky:  # a near-tie of the cheap noise (rare): the exact keys of the chunk
                    val, tok, pos, no_risk = _emit_scan(t_row, c_row, prefix, start, end, ET, ttemp, temp, w, t_max,
                                                  t_inv, q_cmax, q_scale, q_inv, q_arg, rejected, RAW, True,
                                                  HARDWARE, EMIT_BLOCK)
            tl.store(ea_ptr + part, val)
            tl.store(ei_ptr + part, tok)
            tl.store(eany_ptr + part, pos)
        if _arrive(counters + 2, EC):
            if decided:  # (phased: an undecided request's output row comes from a later launch)
                cc = tl.arange(0, C2P)
                in_row = cc < EC
                off = b * C2P + cc
                val = tl.load(ea_ptr + off, mask=in_row, other=float("-inf"), volatile=True)
                tok = tl.load(ei_ptr + off, mask=in_row, other=0, volatile=True)
                if EMIT_EAGER:  # every load of this epilogue in flight at once (one round trip, not four)
                    e_any = tl.load(eany_ptr + off, mask=in_row, other=0, volatile=True)
                    t_bits = tl.load(rows + 5 * KP1 + js, volatile=True)
                    x = _accepted_drafts(drafts_ptr + b * d_req_stride, d_step_stride, jj, js, K)
                _, sampled = block_argmax(val, tok, in_row)
                if live & ~greedy & rejected:
                    if not EMIT_EAGER:
                        e_any = tl.load(eany_ptr + off, mask=in_row, other=0, volatile=True)
                    if tl.max(e_any, axis=0) == 0:
                        # The residual is all zero in fp32: draw from p_j instead (the bonus keys of row j),
                        # here in one program over the whole row (p == q to the last bit: rare).
                        bonus_key, bonus_tok, no_pos, no_risk = _emit_scan(
                            t_row, c_row, prefix, 0, vocab, tl.cdiv(vocab, BLOCK), ttemp, temp, w, t_max, t_inv, q_cmax,
                            q_scale, q_inv, q_arg, False, RAW, True, HARDWARE, BLOCK)
                        sampled = bonus_tok
                sampled = tl.minimum(tl.maximum(sampled, 0), vocab - 1)
                if not EMIT_EAGER:
                    t_bits = tl.load(rows + 5 * KP1 + js, volatile=True)
                t_arg = t_bits.to(tl.int32, bitcast=True)
                emitted = tl.where(greedy, tl.minimum(tl.maximum(t_arg, 0), vocab - 1), sampled).to(tl.int64)
                if not EMIT_EAGER:
                    x = _accepted_drafts(drafts_ptr + b * d_req_stride, d_step_stride, jj, js, K)
                x = tl.minimum(tl.maximum(x.to(tl.int64), 0), vocab - 1)
                out = tl.where(jj < js, x, tl.where(jj == js, emitted, -1))
                tl.store(tokens_ptr + b * tokens_stride + jj, tl.where(live, out, -1), mask=jj <= K)
                tl.store(num_emitted_ptr + b, tl.where(live, js + 1, 0).to(tl.int64))
            # Every item of request b has arrived: reset its counters for the next call.
            tl.store(counters + tl.arange(0, 4), tl.zeros([4], tl.int32))
    if TRACE:
        t_end, trace_sm = _clock(chunk, HARDWARE)
        pid = tl.program_id(0).to(tl.int64)
        tl.store(trace_ptr + pid * 4 + 0, t_start)
        tl.store(trace_ptr + pid * 4 + 1, t_waited)
        tl.store(trace_ptr + pid * 4 + 2, t_end)
        # (direct: a greedy or padding request, whose emit items do no work: the trace reader tells them apart;
        # row: a stream item's row, capped at 15; then the request)
        tl.store(trace_ptr + pid * 4 + 3, (stage + 4 * valid.to(tl.int64) + 8 * smid.to(tl.int64)
                                           + 65536 * direct.to(tl.int64)
                                           + 131072 * tl.minimum(j, 15).to(tl.int64)
                                           + 16777216 * b.to(tl.int64)).to(tl.int64))


# --------------------------------------------------------------------------- the verifier
def default_block(device) -> int:
    """Tile of the GPU (``meta``: compile checks at GPU shapes) or of the interpreter."""
    return GPU_BLOCK if torch.device(device).type in ("cuda", "meta") else CPU_BLOCK


RESIDENT_PER_SM = 2  # Layout's default: 8-warp programs per SM at 128 registers (StreamVerifier passes its own)
MAX_T1 = 16  # tiles per stream item at most (32K values: 128 KB of target, 64 KB of bf16 cache)


def _phase_bounds(value) -> tuple:
    """``phases`` as a tuple of row boundaries (an int is one), strictly increasing, each >= 1; ``()``: off."""
    bounds = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        bounds = tuple(bounds)
    except TypeError:
        bounds = None
    if bounds is None or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in bounds) or any(
            b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"phases: expected row boundaries >= 1 in increasing order (an int or a tuple of ints), "
                         f"got {value!r}")
    return bounds


def _option(name, value, allowed) -> int:
    """``value`` as one of the ints ``allowed`` (a mode switch); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    return int(value)


class Layout:
    """Chunking of one launch: tiles per stream item ``t1`` (``c1`` chunks per row, loaded
    ``unroll`` tiles at a time), tiles per emit item ``t2`` (``c2`` chunks), and the ``lag`` in
    requests between a request's stream items and its mass / emit items.

    GPU defaults: the stream items fill about one wave of resident programs (``t1`` up to
    :data:`MAX_T1` tiles); the lag is the number of requests whose stream items are resident at
    once, so a request's emit items start about when its stream items end (re-reading its rows
    while they are in L2) instead of waiting.
    """

    def __init__(self, batch: int, k: int, vocab: int, block: int, cuda: bool, sms: int, *, t1=None, t2=None,
                 lag=None, unroll=None, emit_block=None, resident_per_sm=RESIDENT_PER_SM, method="standard", rows=None,
                 claim=0, span=False, tail=None, tail_t2=None):
        rows = k + 1 if rows is None else int(rows)  # rows streamed per request (a phased launch: fewer)
        tiles = triton.cdiv(vocab, block)
        self.emit_block = int(emit_block or block)
        emit_tiles = triton.cdiv(vocab, self.emit_block)
        per_stream_tile = max(1, block // self.emit_block)  # emit tiles per stream tile
        resident = resident_per_sm * sms
        if cuda:
            default_t1 = min(MAX_T1 if batch < 64 else 2 * MAX_T1,
                             max(2, triton.cdiv(batch * rows * tiles, resident)))  # 1-tile items: slower
            # (H200, verify4 u3, mixed T: 4-tile emit items at 16 requests 46.5 us against 51.1 for 2, 48.7 for 8;
            # 8 at 64 (108.7 against 111.6 for 4, 110.4 for 16); 16 at 253 (320.3 against 325.8 for 8))
            if batch <= 4:
                default_t2 = 1
            elif method == "block":  # (as measured before: 2 tiles up to 16 requests, 8 above)
                default_t2 = per_stream_tile if batch <= 16 else 4 * per_stream_tile
            elif batch <= 16:
                default_t2 = 2 * per_stream_tile
            elif batch <= 128:
                default_t2 = 4 * per_stream_tile
            else:
                default_t2 = 8 * per_stream_tile
        else:
            default_t1, default_t2 = 2, 2
        # claim (standard method): chunks of t1 tiles claimed by cdiv(rows * c1, claim) programs per request: as many
        # programs as without it where the default t1 >= 4 claim (chunks of t1 // claim tiles), fewer below (chunks
        # of at least min(default t1, 4) tiles: smaller ones stream fewer tiles at once)
        self.claim = int(claim) if method == "standard" else 0
        if self.claim and not t1:
            default_t1 = max(min(default_t1, 4), default_t1 // self.claim)
        self.t1 = max(1, min(int(t1 or default_t1), tiles))
        self.t2 = max(1, min(int(t2 or default_t2), emit_tiles))
        # 4 tiles in flight at every batch size (one compiled variant; the raw mode takes 2, see run)
        self.unroll = int(unroll) if unroll else 4
        self.c1 = triton.cdiv(tiles, self.t1)
        self.c2 = triton.cdiv(emit_tiles, self.t2)
        # stream programs per request (the kernel's S1)
        self.s1 = triton.cdiv(rows * self.c1, self.claim) if self.claim else rows * self.c1
        # span (standard method, one launch over every row): the request's rows end to end, cut into items of t1
        # tiles that may cross a row's end. Default t1: about one wave of resident items over the batch (the fewest
        # waves that give each request at least `rows` items), at most `tiles` items per request (the partials'
        # room per row)
        self.span = bool(span) and method == "standard" and not self.claim and rows == k + 1
        if self.span:
            total = rows * tiles
            if t1:
                per_item = int(t1)
            else:
                waves = triton.cdiv(batch * rows, resident)
                per_item = triton.cdiv(total, min(tiles, max(rows, waves * resident // batch)))
            self.t1 = max(per_item, triton.cdiv(total, tiles))
            self.c1 = triton.cdiv(total, self.t1)
            self.s1 = self.c1
        if lag is None:
            lag = max(1, resident // self.s1) if cuda else 1
        self.lag = int(lag)
        # tail (standard method, one launch of every row, padded order): the last `tail` requests' emit items scan
        # tail_t2 <= t2 tiles each (c2t >= c2 of them; the c2t - c2 extra items after every other program)
        self.tail = min(int(tail or 0), batch) if method == "standard" and rows == k + 1 and not self.span else 0
        self.t2t = max(1, min(int(tail_t2 or self.t2), self.t2)) if self.tail else self.t2
        self.c2t = triton.cdiv(emit_tiles, self.t2t)
        if self.c2t == self.c2:
            self.tail = 0


class StreamVerifier:
    """One-launch verification with persistent scratch: :meth:`run` only launches (CUDA-graph safe).

    Parameters
    ----------
    max_batch : int >= 1, the largest number of requests ``B`` a call may carry.
    num_drafts : int >= 0, ``K`` (``target_logits`` has ``K + 1`` rows per request).
    vocab_size : int >= 1, ``V``. (Sizes are ints, never truncated or parsed: ``ValueError`` naming them.)
    device : CUDA, or CPU with ``TRITON_INTERPRET=1``.
    block : elements per tile (default 2048 on the GPU, 128 on the CPU).
    t1, t2, lag, unroll : override the :class:`Layout` (tiles per stream / emit item, lag in
        requests, tiles loaded at once): ints >= 0 (None: the default; 0 too, except ``lag = 0``: no lag),
        ``unroll`` a power of two.
    warps : warps per program (default 8 on the GPU).
    noise_filter : rank the emitted row by cheap noise and compute exact keys only for the candidates it leaves
        (each lane's best, or the winner with ``emit_winner``; default 1); 0: exact noise for every value. The
        tokens are the same.
    emit : 0 only to profile: the emit items skip their scan (the tokens are then wrong, and the
        all-zero-residual fallback scans whole rows in one program: not a timing of the stream part).
    fused : target row ``j`` and cache row ``j`` in one loop (default on; bit-identical statistics).
    interior : whole ``[unroll, block]`` groups of the fused loop loaded without masks (default on).
    scan_argmax : greedy rows' argmax one tile at a time (default on; the same first maximum).
    early : stream items store the logits at each draft for the epilogue (default on).
    prefetch : an L2 prefetch of each stream item's first target tiles (default on, GPU only).
    fast_divide : raw logits divided by :func:`_divide` (no divide per value; exact, with a
        ``div_rn`` rescan of a chunk holding a value below ``max(2^-100, 2^-125 T)``; default
        :data:`FAST_DIVIDE` = 1: per-lane flags; 2: such values made NaN (:func:`_divide_poisoned`), and a
        chunk whose sum is NaN is rescanned, which frees the flags' registers; 0: ``div_rn`` per value).
    div_unroll : raw logits only: tiles loaded at once where the target values are divided (T not 0
        or 1); the T = 0 / 1 slots then run the standard loop with ``unroll`` tiles (default
        :data:`DIV_UNROLL` = 0: the whole raw launch loads 2 tiles at once). H200 (verify3 u3): 2 is
        no faster (20.4 / 63.5 / 139.0 / 424.7 us against 20.5 / 63.1 / 139.2 / 424.9 at 1 / 16 / 64
        / 253 requests, mixed T). When neither ``fast_divide`` nor ``div_unroll`` is given, raw launches of
        :data:`RAW_WIDE_FROM` requests or more use :data:`RAW_WIDE` (``fast_divide=2, div_unroll=4``; standard method).
    greedy_direct : greedy and padding requests (standard method; block with ``K <= 1``) get their output row
        from their last stream item, and their emit items neither wait nor scan (default
        :data:`GREEDY_DIRECT` = on; the same tokens). H200 (verify4 u3, mixed T, where a third of the
        slots are greedy): 12.8 / 51.1 / 108.7 / 325.8 us at 1 / 16 / 64 / 253 requests against
        18.5 / 55.3 / 111.5 / 341.6 without; raw 13.4 / 59.2 / 126.2 / 385.7 against 20.3 / 59.6 / 129.0 / 399.5.
    emit_prefetch : the last stream item of a request prefetches the emitted row (and its cache row after
        a rejection) into L2 for the emit items (1; 2: ``evict_last``; default :data:`EMIT_PREFETCH` = 0).
        H200 (verify4 u3, mixed T, ``evict_last``): no gain (12.8 / 52.2 / 109.8 / 327.5 us against
        12.8 / 51.1 / 108.7 / 325.8): it moves the emitted row's DRAM read earlier, it does not remove it.

    Tried on the H200 and removed (verify4 u1-u2): persistent programs taking their items by
    fetch-and-add (request-major stream tickets of 8 tiles, emit tickets of published requests, so that
    a request's emitted row would be re-read from L2). Correct (every launch equal to the reference) but
    slower at every batch: 62.7 / 151.4 / 489.8 us at 16 / 64 / 253 requests against 54.7 / 112.7 /
    342.8 (mixed T). The per-item cost of small items (claim, request loads, arrival: ~4-5 us) halved
    the per-program bandwidth, and items of one request finished up to 16 us apart under the saturated
    memory system, so the emitted row was re-read from DRAM anyway (ncu at 253: 1.18 GB read, 34% L2
    hits).
    dbuf : the stream loops double-buffered in registers (the fused loop's interior groups, a bonus row's,
        a greedy row's argmax; raw logits with ``fast_divide=0``: the greedy argmax only; bit-identical). Default
        (with ``max_registers`` not given either): on for the standard method's GPU launches of raw logits and of
        pre-divided ones up to :data:`DBUF_PREDIVIDED_TO` requests, at :data:`DBUF_REGISTERS` registers
        (:data:`DBUF_STANDARD`), off for the block method and on the CPU; ``dbuf=1`` without ``max_registers``: at
        :data:`DBUF_REGISTERS` (:meth:`buffering` says what a launch uses).
    compact : standard method: the program order without the lag's padding (default
        :data:`COMPACT_ORDER` = off). H200 (verify3 u3): slower than the padded order at every batch
        (19.3 / 57.3 / 114.6 / 344.6 us against 18.4 / 54.5 / 111.9 / 339.3, mixed T).
    max_registers : the launch's register cap (default 80: three 8-warp programs per SM; 128 for the
        standard method's double-buffered default, see ``dbuf``).
    claim : standard method: each request's stream work is cut into chunks of ``t1`` tiles (default: the
        Layout's ``t1 // claim``, at least ``min(t1, 4)``) that its ``cdiv(rows * c1, claim)`` stream programs
        take one at a time from a counter (a claim after each chunk: one atomic round trip per chunk), instead
        of one fixed chunk per program; only the chunks of rows up to the request's last are handed out. A
        program that runs fast takes more, so a request's programs end within about one chunk of each other
        (stop 32's trace: equal fixed items ended 17.6-41.3 us apart at 16 requests on an H100, and a request is
        ready only when its slowest item ends). ``prefetch`` does not apply (a chunk is known only when claimed).
        Tokens: the reference's, as every layout (a different ``t1`` groups the partial sums differently).
        Default :data:`CLAIM` = 0 (off); allowed 1, 2, 3, 4, 6, 8 (chunks per program on average). Exact on an
        H100, and slower there at every batch and ``G`` (see :data:`CLAIM`).
    phases : standard method: row boundaries that split a call into launches (``1``: row 0 of every
        request, then rows 1..K of the requests whose draft 0 was accepted; ``(1, 2)``: three launches). A
        draft's acceptance needs only its own row, so a launch decides every request whose first rejection
        (or bonus row) falls in its rows, emits its token as the one-launch kernel does, and leaves the
        others to the next launch, whose items of decided requests exit at once: rows after a request's
        first rejection are never read (with a launch per row only rows 0..j*: about a third of the target
        bytes on the bench's random drafts; with every draft accepted, all of them and a boundary per launch). Rows inside a launch are
        streamed in parallel as without phases, and decisions cross launches only at kernel boundaries, so
        no program waits on another launch's. The same tokens as one launch (the same statistics, ratios and
        keys for every row up to the emitted one). Default ``None``: :data:`PHASES` from :data:`PHASES_FROM`
        requests on (``None``: never); ``()``: never. Pass ``1`` only for large batches whose draft 0 is often
        rejected: on the H200 it took 272 instead of 323 us at 253 requests of random drafts, 345 instead of 310
        with nearly every draft accepted, and more time at <= 64 requests (the module docstring).
    emit_block : values per emit-scan tile (default 1024 on the GPU, ``block`` on the CPU).
    stages, emit_stages : Triton pipelining of the streamed / emitted tiles (default 1 = none:
        measured slower on the H200).
    emit_dbuf : the emit scan double-buffered in registers (tile ``t + 1`` loaded before tile ``t``'s
        keys; the same keys). Default :data:`EMIT_DBUF`: on for the standard method's GPU launches, off for the
        block method and on the CPU (:meth:`emit_options`).
    emit_reverse : the emit scan in decreasing token order (the same result). Default :data:`EMIT_REVERSE`, as
        ``emit_dbuf``.
    emit_eager : emit items with fewer dependent round trips (one acquire of an already-set ready flag; the last
        item's epilogue loads issued together); the same tokens. Default :data:`EMIT_EAGER` (on, every method and
        device).
    emit_gather : emit items load every row's statistics with the accepted count (one round trip, not two); the
        same tokens. Default :data:`EMIT_GATHER` (off: within 1% of the default on an H100).
    emit_winner : emit items compute the exact key of the cheap noise's winner only, not of every lane's best
        (another candidate within the noise bound's slack: every lane's best, as without it); the same tokens.
        Default (None): :data:`EMIT_WINNER` except the pre-divided standard launches of :data:`EMIT_WINNER_OFF`
        requests (:meth:`winner`).
    tail, tail_t2 : standard method, one launch in the padded order: the emit items of the last ``tail`` requests
        (those decided last) scan ``tail_t2`` tiles each instead of ``t2``, the extra items placed after every other
        program, so more of the machine works on the last rows; the same tokens. Default: off.
    span : standard method, one launch: the request's rows laid end to end and cut into stream items of ``t1``
        tiles that may end one row and start the next (default ``t1``: about one wave of resident items, see
        :class:`Layout`); row ``j``'s statistics combine the partials of the items that cover it. The tokens are the
        reference's as with any layout. Default: off (:data:`SPAN_FROM`); on the H200 slower at 4-64 requests
        (16: 51.9 against 45.9 us: one wave of 24-tile items ends no sooner than two waves of 16-tile items, the
        stream phase being bound by the memory system) and 2.5% faster at 253, where its items are whole rows.

    Measured on the H200 (issue 18, ``verify2`` rounds 1-2): the fused loop, 80 registers and
    1024-value emit tiles gave 352 / 342 us at 253 requests (T = 1 / mixed) against 457 / 404 for
    the separate loops at 128 registers; pipelining (``stages`` 2-3) was 2-5% slower.

    Scratch (allocated once, ``O(max_batch K V / block)`` words): partials, per-request row
    statistics and counters, and a status word. The counters are zero between calls (the
    kernel resets them); :meth:`check` raises if a waiting item ever timed out.
    """

    def __init__(self, max_batch: int, num_drafts: int, vocab_size: int, device, *, block: int | None = None,
                 t1=None, t2=None, lag=None, unroll=None, warps: int | None = None, emit=1,
                 noise_filter=1, stages=None, emit_stages=None, fused=None, emit_block=None, fast_divide=None,
                 max_registers=None, interior=None, scan_argmax=None, early=None, prefetch=None, div_unroll=None,
                 dbuf=None, compact=None, emit_prefetch=None, greedy_direct=None, phases=None, claim=None,
                 emit_dbuf=None, emit_reverse=None, span=None, emit_eager=None, emit_gather=None,
                 emit_winner=None, tail=None, tail_t2=None):
        # (sizes are ints, never truncated or parsed: 2.7, "3", True and None raise ValueError naming them)
        max_batch, num_drafts = check_int("max_batch", max_batch, 1), check_int("num_drafts", num_drafts, 0)
        vocab_size = check_int("vocab_size", vocab_size, 1)
        device = torch.device(device)
        self.device = device
        self.max_batch, self.k, self.vocab = max_batch, num_drafts, vocab_size
        self.block = int(block) if block is not None else default_block(device)
        check_power_of_two("block", self.block, 16)
        self.cuda = device.type in ("cuda", "meta")  # meta: tools/compile_verify.py at GPU shapes
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else (
            132 if self.cuda else 1)
        # Layout overrides: ints >= 0 (None: the default, and 0 too except for lag, where 0 is no lag; a negative lag
        # left the grid short of the items that emit items wait on), unroll a power of two (tl.arange of it)
        self.overrides = {name: None if value is None else check_int(name, value, 0)
                          for name, value in (("t1", t1), ("t2", t2), ("lag", lag), ("unroll", unroll),
                                              ("tail", tail), ("tail_t2", tail_t2))}
        if self.overrides["unroll"]:
            check_power_of_two("unroll", self.overrides["unroll"], 1)  # (tl.arange of it)
        # Emit tiles (values per emit-scan iteration; t2 counts them): narrower than the stream tiles
        # spreads one request's emitted row over more programs at small batches.
        self.emit_block = int(emit_block) if emit_block else (min(GPU_EMIT_BLOCK, self.block) if device.type in (
            "cuda", "meta") else self.block)
        check_power_of_two("emit_block", self.emit_block, 16)
        self.noise_filter = bool(noise_filter)
        # Software pipelining of the streamed tiles (Triton's pipeliner: cp.async into shared memory,
        # ``stages - 1`` tiles ahead); 1 = none. The interpreter ignores it.
        self.stages = int(stages) if stages else 1
        self.emit_stages = int(emit_stages) if emit_stages else 1
        # Emit scans with the next tile's loads in flight during a tile's key arithmetic (EMIT_DBUF), in decreasing
        # token order (EMIT_REVERSE): None = the default of the launch's method (:meth:`emit_options`).
        self.emit_dbuf = None if emit_dbuf is None else bool(emit_dbuf)
        self.emit_reverse = None if emit_reverse is None else bool(emit_reverse)
        # Emit items: one acquire when the ready flag is already up; the request's output row from loads in flight
        # together (EMIT_EAGER).
        self.emit_eager = EMIT_EAGER if emit_eager is None else bool(emit_eager)
        # Emit items: every row's statistics loaded with the accepted count (EMIT_GATHER).
        self.emit_gather = EMIT_GATHER if emit_gather is None else bool(emit_gather)
        # Emit items: the exact key of the cheap keys' winner only (None: EMIT_WINNER, see winner()).
        self.emit_winner = None if emit_winner is None else bool(emit_winner)
        # Target row j and cache row j streamed in one loop (one round trip per tile, not two loops).
        self.fused = True if fused is None else bool(fused)
        # Raw logits (fused loop): the target values divided without a divide per element (_divide).
        self.fast_divide = FAST_DIVIDE if fast_divide is None else _option("fast_divide", fast_divide, (0, 1, 2))
        # Raw launches of RAW_WIDE_FROM requests or more take (fast_divide, div_unroll) = RAW_WIDE unless either is given.
        self._raw_wide = fast_divide is None and div_unroll is None
        # Fused loop: whole groups of tiles loaded without masks; greedy rows: argmax one tile at a time.
        self.interior = True if interior is None else bool(interior)
        self.scan_argmax = True if scan_argmax is None else bool(scan_argmax)
        # Stream items store the logits at each draft for the epilogue (early); prefetch each stream
        # item's first target tiles into L2 before its request's scalars arrive (prefetch, GPU only).
        self.early = True if early is None else bool(early)
        self.prefetch = (True if prefetch is None else bool(prefetch)) and self.cuda
        # Raw logits: tiles loaded at once where target values are divided (T not 0 or 1); the T = 0 / 1
        # slots then run the standard loop at the full unroll. None: the whole raw launch at 2 tiles.
        self.div_unroll = int(div_unroll) if div_unroll is not None else DIV_UNROLL
        # Fused interior loop double-buffered in registers (the next group's loads in flight during a reduction).
        self.dbuf = bool(dbuf) if dbuf is not None else False
        # (what each launch uses follows from these arguments: buffering)
        self._dbuf_given, self._registers_given = dbuf is not None, bool(max_registers)
        # Standard method: the program order without the lag's padding (no program launched only to exit).
        self.compact = bool(compact) if compact is not None else COMPACT_ORDER
        # The last stream item of a request prefetches its emitted row into L2 (1; 2: evict_last), GPU only.
        self.emit_prefetch = _option("emit_prefetch", emit_prefetch, (0, 1, 2)) if emit_prefetch is not None else EMIT_PREFETCH
        # Greedy and padding requests (standard method): the last stream item writes the output; no emit work.
        self.greedy_direct = bool(greedy_direct) if greedy_direct is not None else GREEDY_DIRECT
        # Standard method: launches over row ranges (rows after a request's first rejection are never read).
        self.phases = None if phases is None else _phase_bounds(phases)
        # Standard method: a request's chunks claimed from a counter by fewer programs (they end together).
        self.claim = CLAIM if claim is None else _option("claim", claim, (0, 1, 2, 3, 4, 6, 8))
        # Standard method, one launch: the request's rows end to end in items that may cross a row's end.
        self.span = None if span is None else bool(span)
        self._emit_scan = bool(emit)  # emit=0: a profiling aid (the emit items skip their scan: wrong tokens)
        self.warps = int(warps) if warps else (GPU_WARPS if self.cuda else 4)
        # At most 128 registers (two programs of 8 warps per SM): a variant that needs more spills a
        # little rather than halving the programs in flight.
        self.max_registers = int(max_registers) if max_registers else MAX_REGISTERS
        self._maxnreg = self.cuda and self.warps == GPU_WARPS  # (off after a Triton without the option)
        tiles = triton.cdiv(self.vocab, self.block)
        self.kp1 = max(2, triton.next_power_of_2(self.k + 1))
        self.c1p = triton.next_power_of_2(tiles)  # enough for any layout (c1 <= tiles)
        self.c2p = triton.next_power_of_2(triton.cdiv(self.vocab, self.emit_block))
        mb, k, kq = self.max_batch, self.k, max(self.k, 1)

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.pa, self.pb = zeros(mb, 2 * k + 1, self.c1p), zeros(mb, 2 * k + 1, self.c1p)
        self.pi = zeros(mb, 2 * k + 1, self.c1p, dtype=torch.int32)
        self.mass = zeros(mb, kq, self.c1p)
        self.ea = zeros(mb, self.c2p)
        self.ei, self.eany = zeros(mb, self.c2p, dtype=torch.int32), zeros(mb, self.c2p, dtype=torch.int32)
        self.rows = zeros(mb, 8, self.kp1)
        self.accepted = zeros(mb, dtype=torch.int32)
        self.draft_values = zeros(mb, 2, self.kp1)
        self.counters = zeros(mb, 4, dtype=torch.int32)
        self.status = zeros(1, dtype=torch.int32)
        self._no_greedy = zeros(1, dtype=torch.uint8)
        self._no_temp = zeros(1)
        self.tokens = torch.full((mb, k + 1), -1, dtype=torch.int64, device=device)
        self.num_emitted = zeros(mb, dtype=torch.int64)

    def _resident(self, registers: int) -> int:
        """8-warp programs per SM at ``registers`` per thread (65536 in the register file; 1 on the CPU)."""
        return max(1, 65536 // (registers * 32 * self.warps)) if self.cuda else 1

    def _span(self, batch: int) -> bool:
        """Whether a standard one-launch call of ``batch`` requests lays its rows end to end (``span``; default
        :data:`SPAN_FROM` / :data:`SPAN_TO`, GPU only)."""
        if self.span is not None:
            return self.span
        return self.cuda and SPAN_FROM is not None and SPAN_FROM <= batch <= SPAN_TO

    def buffering(self, method: str = "standard", batch: int | None = None, raw: bool = False) -> tuple[bool, int]:
        """``(dbuf, max_registers)`` of this verifier's ``method`` launches of ``batch`` requests (raw logits or not),
        what its launches use (``self.dbuf`` / ``self.max_registers`` are the arguments): by default on for the
        standard method's GPU launches of raw logits, and of pre-divided ones up to :data:`DBUF_PREDIVIDED_TO`
        requests, at :data:`DBUF_REGISTERS`; ``dbuf`` given without ``max_registers``: at :data:`DBUF_REGISTERS`.
        ``batch`` None: the answer for a batch of at most :data:`DBUF_PREDIVIDED_TO` requests (every launch passes
        its batch)."""
        dbuf = self.dbuf if self._dbuf_given else (
            DBUF_STANDARD and self.cuda and method == "standard" and not self._registers_given
            and (raw or batch is None or batch <= DBUF_PREDIVIDED_TO))
        if self._registers_given:
            return dbuf, self.max_registers
        return dbuf, DBUF_REGISTERS if dbuf else MAX_REGISTERS

    def emit_options(self, method: str = "standard") -> tuple[bool, bool]:
        """``(emit_dbuf, emit_reverse)`` of this verifier's ``method`` launches: as given, else :data:`EMIT_DBUF` /
        :data:`EMIT_REVERSE` for the standard method on the GPU, off for the block method and on the CPU."""
        default = self.cuda and method == "standard"
        return (default and EMIT_DBUF if self.emit_dbuf is None else self.emit_dbuf,
                default and EMIT_REVERSE if self.emit_reverse is None else self.emit_reverse)

    def winner(self, method: str, batch: int, raw: bool) -> bool:
        """Whether this verifier's ``method`` launches of ``batch`` requests (raw logits or not) take ``emit_winner``:
        as given, else :data:`EMIT_WINNER` except the pre-divided standard launches of :data:`EMIT_WINNER_OFF`
        requests."""
        if self.emit_winner is not None:
            return self.emit_winner
        off = method == "standard" and not raw and EMIT_WINNER_OFF[0] <= batch <= EMIT_WINNER_OFF[1]
        return EMIT_WINNER and not off

    def layout(self, batch: int, method: str = "standard", rows: int | None = None, raw: bool = False) -> Layout:
        """The :class:`Layout` of a launch streaming ``rows`` rows per request (default ``K + 1``: all)."""
        return Layout(batch, self.k, self.vocab, self.block, self.cuda, self.sms, emit_block=self.emit_block,
                      resident_per_sm=self._resident(self.buffering(method, batch, raw)[1]), method=method, rows=rows,
                      claim=self.claim, span=self._span(batch),
                      **dict(self.overrides, tail=0 if self.compact else self.overrides["tail"]))

    def launches(self, batch: int, method: str = "standard") -> list:
        """``[(row_lo, row_hi)]`` of one call, the kernel's ``ROW_LO`` / ``ROW_HI``: ``[(0, 0)]`` is one launch over
        every row; with ``phases`` (standard method, boundaries up to ``K``) one launch per row range, the last
        one's ``row_hi`` 0 (up to row ``K``)."""
        bounds = self.phases
        if bounds is None:
            bounds = PHASES if PHASES_FROM is not None and batch >= PHASES_FROM else ()
        cuts = [c for c in bounds if c <= self.k]
        if method == "block" or not cuts:  # block verification needs every row's residual mass
            return [(0, 0)]
        return list(zip([0] + cuts, cuts + [0]))

    def programs(self, batch: int, method: str = "standard", rows: int | None = None, raw: bool = False) -> int:
        """Programs of one launch for ``batch`` requests streaming ``rows`` rows each (default ``K + 1``; stream,
        mass and emit items, with the lag's padding), of raw logits or not."""
        rows = self.k + 1 if rows is None else int(rows)
        return self._grid(self.layout(batch, method, rows, raw), batch, method, rows)

    def _grid(self, lay: Layout, batch: int, method: str, rows: int) -> int:
        """:meth:`programs` of a launch whose :class:`Layout` is ``lay``."""
        if self.compact and method != "block":  # one program per item
            return batch * (lay.s1 + lay.c2)
        stages = 3 if method == "block" else 2
        mass_rows = self.k - 1 if (method == "block" and self.k >= 2) else 0
        tail = lay.tail * (lay.c2t - lay.c2)  # (the tail's extra emit items; Layout keeps tail <= batch)
        return (batch + (stages - 1) * lay.lag) * (lay.s1 + mass_rows * lay.c1 + lay.c2) + tail

    def check(self) -> None:
        """Raise if a waiting item of an earlier launch timed out (synchronises); then reset."""
        if int(self.status.item()) != 0:
            self.status.zero_()
            self.counters.zero_()
            raise DeviceStatusError("StreamVerifier: a waiting item timed out; the outputs of that launch are invalid")

    def run(self, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
            target_greedy=None, *, method: str = "standard", target_temperature=None, tokens=None,
            num_emitted=None, trace=None):
        """Verify a batch (inputs as :func:`~dspark_markov.verify_drafts`, assumed validated).

        target_logits ``[B, K+1, V]`` fp32 (last stride 1), with temperature applied, or raw when
        ``target_temperature`` (``[S]`` fp32, contiguous) is given: then divided in the kernel by
        ``target_temperature[slot]`` (``T == 0``: unscaled), bit-identical to passing
        ``reference.scaled_logits`` of them. draft_tokens ``[B, K]``; logits_cache ``[S, N >= K, V]``
        bf16/fp32; num_drafts, idx_mapping, positions ``[B]`` int32/int64 contiguous; temperature
        ``[S]`` fp32, seeds ``[S]`` int64; target_greedy ``[B]`` bool or None.

        Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)`` (default: views of
        :attr:`tokens` / :attr:`num_emitted`). Allocates nothing, never synchronises.

        trace : a profiling aid, ``[programs(batch), 4]`` int64 (a separately compiled variant): each
        program writes its start, after-wait and end ``%globaltimer`` (ns) and ``stage + 4 valid +
        8 smid + 2^16 direct + 2^17 row + 2^24 request`` (direct: a greedy or padding request with ``greedy_direct``,
        whose emit items do no work; row: a stream item's row, at most 15; 0 with ``span``, whose items cross rows).
        ``tools/trace_verify.py`` summarises it.
        """
        batch, tokens, num_emitted, finished = start_run(self, target_logits, method, temperature, tokens,
                                                         num_emitted)
        if finished:
            return tokens, num_emitted
        vocab = self.vocab
        k = self.k
        block_method = method == "block"
        raw = target_temperature is not None
        launches = [(lo, hi, (hi or k + 1) - lo) for lo, hi in self.launches(batch, method)]  # (ROW_LO, ROW_HI, rows)
        layouts = [self.layout(batch, method, rows, raw) for _, _, rows in launches]
        lay = layouts[0]  # (unroll: the same for every launch)
        # The raw mode divides every loaded value: 2 tiles at a time keep it at ~117 registers
        # (4 tiles: ~170, one program per SM instead of two).
        fast_divide, div_unroll = self.fast_divide, self.div_unroll
        if raw and self._raw_wide and batch >= RAW_WIDE_FROM and not block_method:  # (block: measured without it)
            fast_divide, div_unroll = RAW_WIDE
        unroll = min(lay.unroll, 2) if raw and self.overrides["unroll"] is None and not div_unroll else lay.unroll
        dbuf, registers = self.buffering(method, batch, raw)
        emit_dbuf, emit_reverse = self.emit_options(method)
        has_greedy = target_greedy is not None
        greedy = target_greedy.view(torch.uint8) if has_greedy else self._no_greedy
        d_step = draft_tokens.stride(1) if draft_tokens.dim() == 2 and k > 0 else 1
        # Bytes: B*((n+1)*V*4 + n*V*c) streamed + B*V*(4 + c) re-read (L2), O(B*K*C1) partials, B*(K+2)*8 written
        # (phases: only the rows up to each request's emitted one, plus those a launch reads before it rejects).
        args = (target_logits, target_logits.stride(0), target_logits.stride(1),
                draft_tokens, draft_tokens.stride(0), d_step,
                logits_cache, logits_cache.stride(0), logits_cache.stride(1),
                idx_mapping, num_drafts, positions,
                temperature, seeds, target_temperature if raw else self._no_temp, temperature.shape[0],
                greedy,
                self.pa, self.pb, self.pi, self.mass, self.ea, self.ei, self.eany,
                self.rows, self.accepted, self.draft_values, self.counters, self.status,
                tokens, tokens.stride(0), num_emitted,
                batch, vocab)
        meta = dict(K=k, KP1=self.kp1, C1P=self.c1p, C2P=self.c2p, BLOCK=self.block, UNROLL=unroll,
                    HARDWARE=self.cuda, EMIT_SCAN=self._emit_scan, NOISE_FILTER=self.noise_filter, HAS_GREEDY=has_greedy, RAW=raw, BLOCK_METHOD=block_method,
                    PIPE=self.stages, EMIT_PIPE=self.emit_stages, FUSED=self.fused, EMIT_BLOCK=self.emit_block,
                    EMIT_DBUF=emit_dbuf, EMIT_REVERSE=emit_reverse, EMIT_EAGER=self.emit_eager,
                    EMIT_GATHER=self.emit_gather, EMIT_WINNER=self.winner(method, batch, raw),
                    FAST_DIVIDE=fast_divide, INTERIOR=self.interior, SCAN_ARGMAX=self.scan_argmax,
                    EARLY=self.early, PREFETCH=self.prefetch, DIV_UNROLL=div_unroll if raw else 0, DBUF=dbuf,
                    COMPACT=self.compact and not block_method, EMIT_PREFETCH=self.emit_prefetch if self.cuda else 0,
                    GREEDY_DIRECT=self.greedy_direct, CLAIM=lay.claim,
                    num_warps=self.warps,
                    enable_fp_fusion=False)
        if trace is not None:
            if len(launches) > 1:
                raise ValueError("trace: a phased call makes several launches; trace one with phases=()")
            programs = self._grid(lay, batch, method, k + 1)
            if trace.shape != (programs, 4) or trace.dtype != torch.int64:
                raise ValueError(f"trace: expected [{programs}, 4] int64, got {tuple(trace.shape)} {trace.dtype}")
            meta.update(trace_ptr=trace, TRACE=True)
        for (row_lo, row_hi, rows), lay in zip(launches, layouts):  # in order: each reads the counts the last stored
            grid = (self._grid(lay, batch, method, rows),)
            shape = (lay.lag, lay.c1, lay.c2, lay.t1, lay.t2)
            tailed = dict(TAIL=lay.tail, C2T=lay.c2t, T2T=lay.t2t, TAILED=True) if lay.tail else {}
            try:
                _stream_verify_kernel[grid](*args, *shape, **meta, ROW_LO=row_lo, ROW_HI=row_hi, SPAN=lay.span,
                                            **tailed, **({"maxnreg": registers} if self._maxnreg else {}))
            except KeyError:  # a Triton without the maxnreg option: the compiler's own register count
                if not self._maxnreg:
                    raise
                self._maxnreg = False
                _stream_verify_kernel[grid](*args, *shape, **meta, ROW_LO=row_lo, ROW_HI=row_hi, SPAN=lay.span,
                                            **tailed)
        return tokens, num_emitted


# --------------------------------------------------------------------------- functional form
_VERIFIERS: dict = {}  # (device, K, V) -> StreamVerifier, grown to the largest batch seen


def cached_verifier(batch: int, k: int, vocab: int, device) -> StreamVerifier:
    """The persistent :class:`StreamVerifier` of ``(device, K, V)`` for ``batch`` requests.

    Created on first use with room for the next power of two of ``batch`` (at least 16) and
    replaced by a larger one when a bigger batch comes; otherwise reused, so repeated calls
    allocate no scratch. One per device for the calling stream: calls on several streams at once
    must use their own :class:`StreamVerifier` (the counters are shared).
    """
    return cached_instance(_VERIFIERS, StreamVerifier, batch, k, vocab, device)


def verify_stream(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
                  target_greedy=None, *, method: str = "standard", target_temperature=None):
    """``verify_drafts(impl="triton")``: the cached :class:`StreamVerifier`, fresh outputs.

    Shapes as :func:`~dspark_markov.verify_drafts` (validated by the caller). Only the two output
    tensors (``[B, K+1]`` and ``[B]`` int64) are allocated per call, from the caching allocator;
    for CUDA graphs capture :meth:`StreamVerifier.run` with your own outputs instead.
    """
    return run_fresh(cached_verifier, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions,
                     temperature, seeds, target_greedy, method, target_temperature)
