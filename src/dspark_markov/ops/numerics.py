"""Numerics every kernel shares: rounding, widening, the NaN-aware first-argmax, key packing.

Triton's interpreter truncates fp32 -> bf16 casts (its "rtne" mode rounds ties up and can overflow
the mantissa) and mis-widens subnormal bf16, so every rounding and widening that must match torch
goes through :func:`round_to` and :func:`to_float32` (integer arithmetic on the bits, exact on both
the GPU and the interpreter).

Argmax semantics (SPEC.md section 4, ``draft.reference.argmax_first``): the first NaN wins, else
the first maximum; an all ``-inf`` row gives its first token; the result is always a valid token.
"""

from __future__ import annotations

import triton
import triton.language as tl

# (constexpr: Triton 3.6 jit code reads only constexpr module globals)
BIG_INDEX = tl.constexpr(2147483647)  # larger than any token id; loses every "first index" minimum
INT64_MAX = tl.constexpr(9223372036854775807)  # packed word above every key (a NaN: decided exactly)
INT64_MIN = tl.constexpr(-9223372036854775807 - 1)  # packed word below every key (a masked lane)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)  # running maxima start at -FLT_MAX (below no finite value)


@triton.jit
def round_to_bf16(x):
    """fp32 -> bf16, round to nearest even, in integer arithmetic.

    NaN -> 0x7FC0, the canonical quiet NaN (torch's CPU cast may store other NaN bits, e.g. 0xFFFF: a NaN all the same).
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def to_float32(x):
    """Exact widening of bf16/fp16/fp32 values to fp32 (bf16 by a bit shift)."""
    if x.dtype == tl.bfloat16:
        out = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        out = x.to(tl.float32)
    return out


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (bf16, fp16 or fp32) to nearest even, as torch rounds."""
    if dtype == tl.bfloat16:
        out = round_to_bf16(x)
    else:
        out = x.to(dtype)
    return out


@triton.jit
def _across(x, AXIS: tl.constexpr):
    """Per-row values ``x`` broadcastable against a tile reduced along ``AXIS`` (0: as they are)."""
    if AXIS == 1:
        out = tl.expand_dims(x, 1)
    else:
        out = x
    return out


@triton.jit
def block_argmax(key, token, valid, AXIS: tl.constexpr = 0):
    """``(max, first index)`` of fp32 ``key`` along ``AXIS`` over the lanes where ``valid`` (at least one).

    ``torch.argmax`` semantics: if a valid lane is NaN, the result is (NaN, first NaN token);
    otherwise the maximum and the first token reaching it (an all ``-inf`` block gives its first
    valid token). ``token`` holds the lanes' token ids (increasing along ``AXIS``, broadcast against
    ``key``); returns (fp32, int32). ``AXIS = 1`` reduces each row of a 2-D tile.
    """
    is_nan = (key != key) & valid
    clean = tl.where(valid & (key == key), key, float("-inf"))
    best = tl.max(clean, axis=AXIS)
    best_token = tl.min(tl.where(valid & ~is_nan & (clean == tl.expand_dims(best, AXIS)), token, BIG_INDEX),
                        axis=AXIS)
    nan_token = tl.min(tl.where(is_nan, token, BIG_INDEX), axis=AXIS)
    has_nan = nan_token != BIG_INDEX
    return tl.where(has_nan, float("nan"), best), tl.where(has_nan, nan_token, best_token)


@triton.jit
def row_token(best, token):
    """The drawn token of a row whose best key is ``best`` at ``token``: 0 where ``best`` is -inf.

    A best key of -inf means every key of the row is -inf, whose ``torch.argmax`` is 0; partials over a reduced
    vocabulary (d2t) carry mapped target ids only, the lowest of which need not be 0.
    """
    return tl.where(best == float("-inf"), 0, token)


@triton.jit
def combine_blocks(block_max, block_token, valid, vocab):
    """The row's token from per-block ``(max, first index)`` partials (blocks in vocabulary order).

    First NaN block wins, else the first block reaching the maximum (its first index is then the
    row's first maximum), and an all ``-inf`` row gives block 0's first index, 0. The result is
    clamped into ``[0, vocab)`` so no later gather can leave the embedding table. int32 scalar.
    """
    _, token = block_argmax(block_max, block_token, valid)
    return tl.minimum(tl.maximum(token, 0), vocab - 1)


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
def weight_bias(bias, scale, w_dtype: tl.constexpr, SCALED: tl.constexpr):
    """fp32 value of a weight-dtype bias as SPEC.md section 3 forms it: times ``scale``, rounded again.

    ``bias`` holds weight-dtype values (a loaded bias, or an fp32 accumulator already rounded with
    :func:`round_to`); with ``SCALED`` the fp32 product is rounded to ``w_dtype`` once more.
    """
    bias = to_float32(bias)
    if SCALED:
        bias = to_float32(round_to(bias * scale, w_dtype))
    return bias


@triton.jit
def biased_logits(base, bias, cache_dtype: tl.constexpr):
    """``z = round_cache(float(U) + bias)``: one rounding of the fp32 sum (SPEC.md section 3)."""
    return round_to(to_float32(base) + bias, cache_dtype)


@triton.jit
def pack_word(value, index):
    """int64 word ordered like ``torch.argmax``'s choice: (fp32 key, then lower index first).

    :func:`pack_key` after canonicalising the key as ``sharded.keys.pack_keys``
    does: every NaN becomes the largest code (above ``+inf``: the first NaN wins, as in
    ``argmax``) and ``-0.0`` becomes ``+0.0``.
    """
    bits = tl.where(value == 0.0, 0, value.to(tl.int32, bitcast=True))
    bits = tl.where(value != value, 0x7FFFFFFF, bits)
    return pack_key(bits.to(tl.float32, bitcast=True), index)


@triton.jit
def word_token(word, vocab):
    """The token of a :func:`pack_word` word, clamped into ``[0, V)`` (:func:`row_token`: 0 where its key is -inf)."""
    key, token = unpack_key(word)
    return row_token(key, tl.minimum(tl.maximum(token, 0), vocab - 1))
