"""Noise as Triton device functions: hash, uniforms, exact and approximate Gumbel noise (SPEC.md 4-5).

Exact: each function reproduces its torch twin in :mod:`dspark_markov.rng` bit for bit, provided
the calling kernel is launched with ``enable_fp_fusion=False`` (no multiply-add contraction) —
every launcher in this package passes it. Hash values are ``tl.uint32`` (wrapping arithmetic).
Draft noise comes from :func:`draft_prefix` (once per row) and :func:`draft_noise` (per token);
:func:`gumbel_key` forms the key ``z / T + g``; :func:`inverse_cdf_uniform` is the one uniform per
(row, step) of inverse-CDF drafting.

Approximate: :func:`approx_noise` uses the hardware ``log2`` and is within :data:`NOISE_BOUND` of
:func:`draft_noise` (checked over all 2^32 hashes by ``tests/gpu/test_noise_bound_gpu.py``); it
only ranks candidates (:mod:`.filter`), the winner's key is always recomputed exactly.

Importing this module imports Triton; it is never imported by ``dspark_markov/__init__``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..rng import INVERSE_CDF_TOKEN, LN2_HIGH, LN2_LOW, LOG1M_COEFFS, LOG_COEFFS, SQRT_HALF

from .constants import INTERPRET, NOISE_BOUND  # noqa: F401  (re-exported)

# Constants as fp32-exact Python floats (see rng.py), bound as module globals for the JIT.
P0, P1, P2, P3, P4, P5, P6, P7, P8 = (tl.constexpr(c) for c in LOG_COEFFS)
L0, L1, L2, L3, L4, L5, L6 = (tl.constexpr(c) for c in LOG1M_COEFFS)
_LN2_HIGH = tl.constexpr(LN2_HIGH)
_LN2_LOW = tl.constexpr(LN2_LOW)
_SQRT_HALF = tl.constexpr(SQRT_HALF)
_INVERSE_CDF_TOKEN = tl.constexpr(INVERSE_CDF_TOKEN)
_LN2 = tl.constexpr(0.6931471805599453)


def hardware_log2(device) -> bool:
    """Whether kernels on ``device`` use the hardware ``lg2.approx`` (a GPU, not the interpreter)."""
    return getattr(device, "type", str(device)) == "cuda" and not INTERPRET


@triton.jit
def _rotl32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix_word(h, k):
    k = k * 0xCC9E2D51
    k = _rotl32(k, 15)
    k = k * 0x1B873593
    h = h ^ k
    h = _rotl32(h, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def hash_prefix(seed, pos, DOMAIN: tl.constexpr):
    """State after ``[seed_lo, seed_hi, pos_lo]``; ``seed``/``pos`` int64 (scalars or tensors)."""
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    pos_lo = (pos & 0xFFFFFFFF).to(tl.uint32)
    h = seed_lo * 0 + DOMAIN
    h = _mix_word(h, seed_lo)
    h = _mix_word(h, seed_hi)
    return _mix_word(h, pos_lo)


@triton.jit
def hash_finish(prefix, token):
    """Add the token word (int32/int64/uint32 ids) and finalise; returns uint32."""
    h = _mix_word(prefix, token.to(tl.uint32))
    h = h ^ 16
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def uniform32(h):
    """fp32 uniform in (0, 1] from a uint32 hash (SPEC.md section 4).

    A 16-bit integer k converts exactly as ``bits(2^23 + k) - 2^23`` (OR into the mantissa of
    2^23, then one exact subtraction): the same values as an int-to-float conversion, without the
    quarter-rate conversion instruction.
    """
    high = ((h >> 16) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    low = ((h & 0xFFFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return high * 1.52587890625e-05 + (low + 0.5) * 2.3283064365386963e-10  # 2^-16, 2^-32


@triton.jit
def log_f32(x):
    """Natural log of positive normal fp32 values, bit-identical to ``rng.log_f32`` (no division)."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 126
    mantissa = ((bits & 0x7FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)  # in [1/2, 1)
    low = mantissa < _SQRT_HALF
    exponent = exponent - low.to(tl.int32)
    f = tl.where(low, mantissa + mantissa, mantissa) - 1.0
    f2 = f * f
    p = f * P0 + P1
    p = p * f + P2
    p = p * f + P3
    p = p * f + P4
    p = p * f + P5
    p = p * f + P6
    p = p * f + P7
    p = p * f + P8
    e = exponent.to(tl.float32)
    y = (f * f2) * p
    y = y + e * _LN2_LOW
    y = y - f2 * 0.5
    return (f + y) + e * _LN2_HIGH


@triton.jit
def gumbel32(u):
    """fp32 Gumbel noise ``-log(-L(u))``, bit-identical to ``rng.gumbel32``."""
    p = u * L0 + L1
    p = u * p + L2
    p = u * p + L3
    p = u * p + L4
    p = u * p + L5
    p = u * p + L6
    series = -(u * (u * p + 1.0))
    one_minus = tl.maximum(1.0 - u, 5.960464477539063e-08)  # 2^-24
    log1m = tl.where(u < 0.25, series, log_f32(one_minus))
    return -log_f32(-log1m)


@triton.jit
def draft_prefix(seed, step, position):
    """Hash prefix of draft step ``step`` predicting ``position`` (int64 scalars or tensors)."""
    key_seed = seed ^ ((tl.zeros([], tl.int64) + step) << 32)  # step may be a constexpr
    key_pos = position - 1 + 1073741824  # + 2^30, the drafting salt
    return hash_prefix(key_seed, key_pos, 0)


@triton.jit
def draft_noise(prefix, token):
    """fp32 Gumbel noise of token ids ``token`` under a :func:`draft_prefix` state."""
    return gumbel32(uniform32(hash_finish(prefix, token)))


@triton.jit
def inverse_cdf_uniform(prefix):
    """The inverse-CDF uniform of a :func:`draft_prefix` state (token word ``0xFFFFFFFF``, SPEC.md 5)."""
    return uniform32(hash_finish(prefix, prefix * 0 + _INVERSE_CDF_TOKEN))


@triton.jit
def gumbel_key(z, temp, prefix, token):
    """Keys of fp32 logits ``z`` at token ids ``token``: ``div_rn(z, T) + g``, or ``z`` if T == 0.

    ``prefix`` is :func:`draft_prefix` of the row, ``temp`` its scalar temperature. Greedy rows
    skip the noise entirely (a runtime branch on the row's scalar temperature).
    """
    if temp == 0.0:
        key = z
    else:
        key = tl.math.div_rn(z, temp) + draft_noise(prefix, token)
    return key


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
def approx_gumbel(u, HARDWARE: tl.constexpr):
    """``-log(-log(1 - u))`` of fp32 uniforms through :func:`fast_log2`; see :func:`approx_noise`."""
    series = u * (u * (u * (u * 0.25 + 0.33333334) + 0.5) + 1.0)  # -log(1 - u), u < 1/16
    one_minus = tl.maximum(1.0 - u, 5.960464477539063e-08)
    minus_log1m = tl.where(u < 0.0625, series, -fast_log2(one_minus, HARDWARE) * _LN2)
    return -fast_log2(minus_log1m, HARDWARE) * _LN2


@triton.jit
def approx_noise(prefix, token, HARDWARE: tl.constexpr):
    """Cheap Gumbel noise within ``NOISE_BOUND`` of :func:`draft_noise` (hardware log2).

    Used only to rank a tile's candidates; the winner's key is recomputed exactly.
    """
    return approx_gumbel(uniform32(hash_finish(prefix, token)), HARDWARE)
