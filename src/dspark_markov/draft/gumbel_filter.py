"""Exact Gumbel-max over a block at a fraction of the cost: rank by approximate noise first.

Exact keys ``div_rn(z, T) + g`` (SPEC.md section 4) cost ~100-200 instructions per token: the
MurmurHash3 finalisation, two bit-exact software logs and a correctly rounded division. The argmax
only needs the exact key of the winner, so a block is first ranked by approximate keys
``z * (1/T) + g~`` whose noise ``g~`` uses the hardware ``log2`` and is within :data:`NOISE_BOUND`
of the exact noise (checked over all 2^32 hashes by ``tests/gpu/test_noise_bound_gpu.py``). When
the approximate best beats the runner-up by more than :func:`key_slack` (twice the noise bound
with margin, plus the rounding of ``z * (1/T)`` against ``z / T`` and of the sum, relative to the
key's size), the exact argmax is the same token and only its exact key is computed. Otherwise
(near-ties, NaN, non-finite or zero keys) the block falls back to exact keys for every token.
Either way the result is bit-identical to the exact computation.

Keys and indices are packed into one int64 (:func:`pack_key`) so one integer max finds the best
key and its first index together, and a second one the runner-up.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import rng_triton

# Bound on |approximate - exact| Gumbel noise; measured worst case on the H200: 3.34e-6.
NOISE_BOUND = 2.5e-5
FILTER_MARGIN = 4 * NOISE_BOUND
INT64_MAX = tl.constexpr(9223372036854775807)
INT64_MIN = tl.constexpr(-9223372036854775807 - 1)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def fast_log2(x, HARDWARE: tl.constexpr):
    """log2 of positive normal fp32: one ``lg2.approx`` (MUFU) instruction on the GPU.

    ``tl.log2`` compiles to an accurate ~25-instruction library routine, which is what the filter
    is there to avoid. The interpreter (``HARDWARE=False``) uses ``tl.log2``; the bound of the
    filter is checked against the hardware instruction over all 2^32 hashes.
    """
    if HARDWARE:
        out = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                        is_pure=True, pack=1)
    else:
        out = tl.log2(x)
    return out


@triton.jit
def approx_noise(prefix, token, HARDWARE: tl.constexpr):
    """Cheap Gumbel noise within ``NOISE_BOUND`` of ``rng_triton.draft_noise`` (hardware log2).

    Used only to rank a tile's candidates; the winner's key is recomputed exactly.
    """
    return approx_gumbel(rng_triton.uniform32(rng_triton.hash_finish(prefix, token)), HARDWARE)


@triton.jit
def approx_gumbel(u, HARDWARE: tl.constexpr):
    """``-log(-log(1 - u))`` of fp32 uniforms through :func:`fast_log2`; see :func:`approx_noise`."""
    series = u * (u * (u * (u * 0.25 + 0.33333334) + 0.5) + 1.0)  # -log(1 - u), u < 1/16
    one_minus = tl.maximum(1.0 - u, 5.960464477539063e-08)
    minus_log1m = tl.where(u < 0.0625, series, -fast_log2(one_minus, HARDWARE) * _LN2)
    return -fast_log2(minus_log1m, HARDWARE) * _LN2


@triton.jit
def pack_key(key, index):
    """int64 word whose order is (fp32 key, then lower index first); for non-NaN keys.

    The fp32 bits are mapped to an int32 of the same order (negative floats flip their magnitude
    bits), so one integer max finds the best key and its first index together. -0.0 orders
    below +0.0, unlike the float comparison: a best key of zero is left to the exact path.
    """
    bits = key.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def unpack_key(word):
    """The ``(fp32 key, int32 index)`` of a :func:`pack_key` word."""
    ordered = (word >> 32).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), (0x7FFFFFFF - (word & 0x7FFFFFFF)).to(tl.int32)


@triton.jit
def key_slack(value, filter_margin):
    """Gap above which an approximate best key is certainly the exact best (``2^-20`` relative)."""
    return filter_margin + (tl.abs(value) + 64.0) * 9.5367431640625e-07


@triton.jit
def filtered_block_argmax(z, temp, prefix, token, valid, filter_margin, exact_argmax: tl.constexpr,
                          HARDWARE: tl.constexpr):
    """Exact ``(max key, first token)`` of ``div_rn(z, T) + g`` over one block of one row (T > 0).

    ``z`` fp32 ``[BLOCK]``; ``temp`` the row's scalar temperature (> 0); ``prefix`` its
    ``rng_triton.draft_prefix``; ``token`` the block's token ids; ``valid`` which lanes are in the
    vocabulary; ``exact_argmax`` the NaN-aware first-argmax used on the exact fallback path;
    ``HARDWARE`` selects the hardware log2 (GPU) or ``tl.log2`` (interpreter).
    """
    approx = z * (1.0 / temp) + approx_noise(prefix, token, HARDWARE)
    packed = pack_key(approx, token)
    packed = tl.where(approx != approx, INT64_MAX, packed)
    packed = tl.where(valid, packed, INT64_MIN)
    best = tl.max(packed, axis=0)
    runner = tl.max(tl.where(packed == best, INT64_MIN, packed), axis=0)
    value, index = unpack_key(best)
    second, _ = unpack_key(runner)
    decided = (best != INT64_MAX) & (value != 0.0) & (tl.abs(value) < float("inf")) & \
        (value - second > key_slack(value, filter_margin))
    if decided:
        winner = tl.max(tl.where(token == index, z, float("-inf")), axis=0)
        best_key = tl.math.div_rn(winner, temp) + rng_triton.draft_noise(prefix, index)
        best_token = index
    else:
        key = tl.math.div_rn(z, temp) + rng_triton.draft_noise(prefix, token)
        best_key, best_token = exact_argmax(key, token, valid)
    return best_key, best_token
