"""Triton device functions for keys, uniforms and Gumbel noise (SPEC.md section 4).

Each function reproduces its torch twin in :mod:`dspark_markov.rng` bit for bit, provided the
calling kernel is launched with ``enable_fp_fusion=False`` (no multiply-add contraction) — every
launcher in this package passes it. Hash values are ``tl.uint32`` (wrapping arithmetic).

Importing this module imports Triton; it is never imported by ``dspark_markov/__init__``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .rng import ATANH_COEFFS, LN2, LOG1M_COEFFS, SQRT2

# Constants as fp32-exact Python floats (see rng.py), bound as module globals for the JIT.
_A0, _A1, _A2, _A3, _A4 = ATANH_COEFFS
_L0, _L1, _L2, _L3, _L4, _L5, _L6 = LOG1M_COEFFS
_LN2 = tl.constexpr(LN2)
_SQRT2 = tl.constexpr(SQRT2)
A0 = tl.constexpr(_A0)
A1 = tl.constexpr(_A1)
A2 = tl.constexpr(_A2)
A3 = tl.constexpr(_A3)
A4 = tl.constexpr(_A4)
L0 = tl.constexpr(_L0)
L1 = tl.constexpr(_L1)
L2 = tl.constexpr(_L2)
L3 = tl.constexpr(_L3)
L4 = tl.constexpr(_L4)
L5 = tl.constexpr(_L5)
L6 = tl.constexpr(_L6)


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
    """fp32 uniform in (0, 1] from a uint32 hash (SPEC.md section 4)."""
    high = (h >> 16).to(tl.float32) * 1.52587890625e-05  # 2^-16
    low = ((h & 0xFFFF).to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 2^-32
    return high + low


@triton.jit
def log_f32(x):
    """Natural log of positive normal fp32 values, bit-identical to ``rng.log_f32``."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    mantissa = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    high = mantissa > _SQRT2
    mantissa = tl.where(high, mantissa * 0.5, mantissa)
    exponent = exponent + high.to(tl.int32)
    f = mantissa - 1.0
    s = tl.math.div_rn(f, f + 2.0)
    s2 = s * s
    p = s2 * A0 + A1
    p = s2 * p + A2
    p = s2 * p + A3
    p = s2 * p + A4
    log1p_f = s * (s2 * p) + (s + s)
    return exponent.to(tl.float32) * _LN2 + log1p_f


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
    key_seed = seed ^ (step.to(tl.int64) << 32)
    key_pos = position - 1 + 1073741824  # + 2^30, the drafting salt
    return hash_prefix(key_seed, key_pos, 0)


@triton.jit
def draft_noise(prefix, token):
    """fp32 Gumbel noise of token ids ``token`` under a :func:`draft_prefix` state."""
    return gumbel32(uniform32(hash_finish(prefix, token)))
