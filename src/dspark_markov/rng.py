"""Counter-based keys, uniforms and Gumbel noise (SPEC.md section 4), in plain torch.

Everything here is vectorised, runs on CPU and CUDA tensors alike and is the reference that the
Triton device functions in :mod:`dspark_markov.ops.noise` reproduce bit for bit.

Hash values are carried as int64 tensors holding uint32 values (``0 <= h < 2**32``): torch has no
full uint32 arithmetic, and every product below is split so that no intermediate leaves int64.

Bit-exact logarithm
-------------------
SPEC.md writes the noise as ``g = -log(-L(u))``. A library ``log`` is not bit-reproducible across
devices (glibc/Sleef on the CPU, libdevice or ``lg2.approx`` on the GPU, NumPy in Triton's
interpreter differ in the last bit), so the fp32 noise uses :func:`log_f32`: a fixed sequence of
IEEE fp32 additions and multiplications, accurate to 0.7 ulp, which every backend evaluates
identically. That is what lets every sampler reproduce the reference bit
for bit on any device. Kernels must compile with ``enable_fp_fusion=False`` so that no multiply-add
is contracted into an FMA.
"""

from __future__ import annotations

import math

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
GOLDEN_DOMAIN = 0x9E3779B9  # second hash domain (fp64 uniforms, verification streams)
DRAFT_POS_SALT = 1 << 30  # keeps draft noise apart from the target's (seed, P - 1) stream
INVERSE_CDF_TOKEN = 0xFFFFFFFF  # token word of the one uniform per (row, step) of inverse CDF

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_F1 = 0x85EBCA6B
_F2 = 0xC2B2AE35


def f32(x: float) -> float:
    """The fp32 value nearest to ``x``, as a Python float (exactly representable in fp32)."""
    return float(np.float32(x))


# Horner coefficients of L(u) = log(1 - u) for u < 1/4, innermost (1/8) first.
LOG1M_COEFFS = tuple(f32(1.0 / k) for k in range(8, 1, -1))  # 1/8, 1/7, ..., 1/2
# log(1 + f) = f - f^2/2 + f^3 P(f) on [sqrt(1/2) - 1, sqrt(2) - 1]: the classical minimax P
# (Cephes logf), highest degree first.
LOG_COEFFS = tuple(f32(c) for c in (
    7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
    -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))
LN2_HIGH = 0.693359375  # ln 2 = LN2_HIGH + LN2_LOW; e * LN2_HIGH is exact for |e| < 2^15
LN2_LOW = f32(-2.12194440e-4)
SQRT_HALF = f32(math.sqrt(0.5))
TWO_POW_M16 = 2.0**-16
TWO_POW_M24 = 2.0**-24
TWO_POW_M32 = 2.0**-32
TWO_POW_M53 = 2.0**-53


# --------------------------------------------------------------------------- MurmurHash3 (x86_32)
def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for 0 <= a < 2**32 held in int64, without int64 overflow."""
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & MASK32) | (x >> (32 - r))


def _mix_word(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(k & MASK32, _C1)
    k = _rotl32(k, 15)
    k = _mul32(k, _C2)
    h = h ^ k
    h = _rotl32(h, 13)
    return (_mul32(h, 5) + 0xE6546B64) & MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ 16  # the length in bytes of the four-word key
    h = h ^ (h >> 16)
    h = _mul32(h, _F1)
    h = h ^ (h >> 13)
    h = _mul32(h, _F2)
    return h ^ (h >> 16)


def _as_int64(x, like: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(torch.int64)
    device = like.device if like is not None else None
    return torch.as_tensor(x, dtype=torch.int64, device=device)


def hash_prefix(seed, pos, domain: int = 0) -> torch.Tensor:
    """Hash state after the words ``[seed_lo, seed_hi, pos_lo]``; broadcast over inputs.

    The fourth word (the token id) is added by :func:`hash_finish`. Splitting the hash lets a
    kernel compute the per-row prefix once and only the token word per vocabulary entry.
    """
    seed = _as_int64(seed)
    pos = _as_int64(pos, seed)
    h = torch.full_like(torch.broadcast_tensors(seed, pos)[0], domain & MASK32)
    h = _mix_word(h, seed & MASK32)
    h = _mix_word(h, (seed >> 32) & MASK32)
    return _mix_word(h, pos & MASK32)


def hash_finish(prefix: torch.Tensor, token) -> torch.Tensor:
    """Add the token word to a :func:`hash_prefix` state and finalise (int64 of uint32 values)."""
    return _fmix32(_mix_word(prefix, _as_int64(token, prefix)))


def murmur3_hash32(seed, pos, token, domain: int = 0) -> torch.Tensor:
    """MurmurHash3_x86_32 of ``[seed_lo, seed_hi, pos_lo, token]`` with seed ``domain``.

    Parameters
    ----------
    seed, pos, token : int64 tensors (or Python ints), broadcast together. ``seed`` is read as
        int64 two's complement; only the low 32 bits of ``pos`` and ``token`` are used.
    domain : the hash's own seed (0, or :data:`GOLDEN_DOMAIN` for the second stream).

    Returns
    -------
    int64 tensor of uint32 values, on the inputs' device.
    """
    return hash_finish(hash_prefix(seed, pos, domain), token)


# --------------------------------------------------------------------------- keys of the drafts
def draft_step_seed(seed, step: int) -> torch.Tensor:
    """The key seed of draft step ``step``: ``seed XOR (step << 32)`` (int64)."""
    return _as_int64(seed) ^ (int(step) << 32)


def draft_key_pos(position) -> torch.Tensor:
    """The key position of a draft predicting token position ``P``: ``(P - 1) + 2**30`` (int64)."""
    return _as_int64(position) - 1 + DRAFT_POS_SALT


# --------------------------------------------------------------------------- uniforms
def uniform32(h: torch.Tensor) -> torch.Tensor:
    """fp32 uniform in (0, 1] from a uint32 hash: ``(h >> 16) 2^-16 + ((h & 0xFFFF) + 0.5) 2^-32``.

    Both parts are exact in fp32; their sum is rounded once and may round to 1.0.
    """
    high = (h >> 16).to(torch.float32) * TWO_POW_M16
    low = ((h & 0xFFFF).to(torch.float32) + 0.5) * TWO_POW_M32
    return high + low


def uniform64(h_hi: torch.Tensor, h_lo: torch.Tensor) -> torch.Tensor:
    """fp64 uniform in (0, 1) from the golden-domain (high) and domain-0 (low) hashes.

    The word order is vLLM 0.33's ``murmur3_uniform64`` (``hi`` = the golden-domain hash), so fp64
    draws are bit-compatible with its ``gumbel_sample(use_fp64=True)``.
    """
    bits53 = (h_hi << 21) | (h_lo >> 11)  # ((hi << 32) | lo) >> 11 without leaving int64
    u = (bits53.to(torch.float64) + 0.5) * TWO_POW_M53
    return torch.where(u == 1.0, u - TWO_POW_M53, u)


# --------------------------------------------------------------------------- bit-exact log and noise
def _f32_const(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def log_f32(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive, normal fp32 values, reproducible bit for bit on every backend.

    ``x = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))``; ``f = m - 1`` is exact (Sterbenz);
    ``log(1 + f) = f - f^2/2 + f^3 P(f)`` with the classical degree-8 minimax ``P`` (Cephes'
    ``logf`` coefficients); ``e ln2`` is added in two parts. Only IEEE fp32 additions and
    multiplications (no division, no library call), measured within 0.7 ulp of float64.
    Inputs that are zero, negative, subnormal or non-finite are outside the contract.
    """
    x = x.to(torch.float32)
    bits = x.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 126
    mantissa = ((bits & 0x7FFFFF) | 0x3F000000).view(torch.float32)  # in [1/2, 1)
    low = mantissa < SQRT_HALF
    exponent = exponent - low.to(torch.int32)
    f = torch.where(low, mantissa + mantissa, mantissa) - 1.0
    f2 = f * f
    p = _f32_const(LOG_COEFFS[0], x).expand_as(f)
    for c in LOG_COEFFS[1:]:
        p = p * f + c
    e = exponent.to(torch.float32)
    y = (f * f2) * p
    y = y + e * LN2_LOW
    y = y - f2 * 0.5
    return (f + y) + e * LN2_HIGH


def log1m_f32(u: torch.Tensor) -> torch.Tensor:
    """``L(u) = log(1 - u)`` of SPEC.md section 4: a Horner series below 1/4, else the log."""
    p = _f32_const(LOG1M_COEFFS[0], u).expand_as(u)
    for c in LOG1M_COEFFS[1:]:
        p = u * p + c
    series = -(u * (u * p + 1.0))
    one_minus = torch.clamp_min(1.0 - u, TWO_POW_M24)
    return torch.where(u < 0.25, series, log_f32(one_minus))


def gumbel32(u: torch.Tensor) -> torch.Tensor:
    """fp32 Gumbel noise ``g = -log(-L(u))`` from fp32 uniforms in (0, 1] (bit-exact everywhere)."""
    return -log_f32(-log1m_f32(u))


def gumbel64(u: torch.Tensor) -> torch.Tensor:
    """fp64 Gumbel noise ``g = -log(-log(u))`` from fp64 uniforms in (0, 1)."""
    return -torch.log(-torch.log(u))


def draft_noise(seed, step: int, position, token, *, fp64: bool = False) -> torch.Tensor:
    """Gumbel noise of draft step ``step`` (broadcast over seed/position and token ids).

    ``seed`` and ``position`` are per-row int64 tensors ``[R, 1]``; ``token`` is ``[V]`` or
    ``[R, V]``. Returns fp32 (or fp64 with ``fp64=True``) noise of the broadcast shape.
    """
    key_seed = draft_step_seed(seed, step)
    key_pos = draft_key_pos(position)
    if not fp64:
        return gumbel32(uniform32(murmur3_hash32(key_seed, key_pos, token)))
    h_hi = murmur3_hash32(key_seed, key_pos, token, domain=GOLDEN_DOMAIN)
    h_lo = murmur3_hash32(key_seed, key_pos, token)
    return gumbel64(uniform64(h_hi, h_lo))


def inverse_cdf_uniform(seed, step: int, position) -> torch.Tensor:
    """The one fp32 uniform per (row, step) of inverse-CDF drafting (SPEC.md section 5)."""
    h = murmur3_hash32(draft_step_seed(seed, step), draft_key_pos(position), INVERSE_CDF_TOKEN)
    return uniform32(h)
