"""Exact Gumbel-max at a fraction of the cost: rank by approximate noise first (1-D and 2-D).

Exact keys ``div_rn(z, T) + g`` (SPEC.md section 4) cost ~100-200 instructions per token: the
MurmurHash3 finalisation, two bit-exact software logs and a correctly rounded division. The argmax
only needs the exact key of the winner, so a block is first ranked by approximate keys
``z * (1/T) + g~`` whose noise ``g~`` (:func:`.noise.approx_noise`) is within
:data:`.noise.NOISE_BOUND` of the exact noise. When the approximate best beats the runner-up by
more than :func:`key_slack` (twice the noise bound with margin, plus the rounding of ``z * (1/T)``
against ``z / T`` and of the sum, relative to the key's size), the exact argmax is the same token
and only its exact key is computed. Otherwise (near-ties, NaN, non-finite or zero keys) the block
falls back to exact keys for every token. Either way the result is bit-identical to the exact
computation.

Keys and indices are packed into one int64 (:func:`.numerics.pack_key`) so one integer max finds
the best key and its first index together, and a second one the runner-up.

The same functions serve a 1-D block of one row (``AXIS = 0``: per-row values are scalars) and a
2-D tile ``[rows, BLOCK]`` (``AXIS = 1``: per-row values are ``[rows]`` vectors).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .constants import FILTER_MARGIN  # noqa: F401  (re-exported)
from .noise import approx_noise, draft_noise
from .numerics import INT64_MAX, INT64_MIN, _across, block_argmax, pack_key, unpack_key


@triton.jit
def key_slack(value, filter_margin):
    """Gap above which an approximate best key is certainly the exact best (``2^-20`` relative)."""
    return filter_margin + (tl.abs(value) + 64.0) * 9.5367431640625e-07


@triton.jit
def approx_words(z, greedy, inv_temp, prefix, token, valid, AXIS: tl.constexpr, HARDWARE: tl.constexpr):
    """Packed approximate keys of a block or tile, ready for integer maxima (``int64``, ``z``'s shape).

    ``z * (1/T) + g~`` on sampled rows, ``z`` itself on greedy rows (``greedy``, ``inv_temp`` and
    ``prefix`` are per-row values); a NaN becomes :data:`INT64_MAX` (it wins, then goes exact) and a
    lane outside ``valid`` :data:`INT64_MIN`.
    """
    noise = approx_noise(_across(prefix, AXIS), token, HARDWARE)
    approx = tl.where(_across(greedy, AXIS), z, z * _across(inv_temp, AXIS) + noise)
    packed = pack_key(approx, token)
    packed = tl.where(approx != approx, INT64_MAX, packed)
    return tl.where(valid, packed, INT64_MIN)


@triton.jit
def exact_keys(z, greedy, temp, prefix, token, AXIS: tl.constexpr):
    """Exact keys ``div_rn(z, T) + g`` on sampled rows, ``z`` on greedy rows (``z``'s shape)."""
    divisor = _across(tl.where(greedy, 1.0, temp), AXIS)
    return tl.where(_across(greedy, AXIS), z, tl.math.div_rn(z, divisor) + draft_noise(_across(prefix, AXIS), token))


@triton.jit
def _any_undecided(decided, AXIS: tl.constexpr):
    """Whether a row is undecided: the scalar itself (one row) or any row of a tile."""
    if AXIS == 1:
        out = tl.max((decided == 0).to(tl.int32), axis=0) > 0
    else:
        out = decided == 0
    return out


@triton.jit
def filtered_argmax(z, temp, prefix, token, valid, filter_margin, AXIS: tl.constexpr, HARDWARE: tl.constexpr):
    """Exact ``(max key, first token)`` of the Gumbel keys of a block (``AXIS = 0``) or tile (``AXIS = 1``).

    ``z`` fp32 logits; ``temp`` the rows' temperatures (T = 0: the key is ``z``, ranked exactly);
    ``prefix`` their :func:`.noise.draft_prefix`; ``token`` the lanes' token ids (broadcast against
    ``z``); ``valid`` the lanes in the vocabulary (and in the batch). Returns (fp32, int32) per row:
    ``block_argmax`` of :func:`exact_keys`, bit for bit. A row without a valid lane returns garbage
    (its result must not be stored). If any row of a tile is undecided (a near-tie, a NaN, a
    non-finite or zero best) the whole tile is recomputed with exact keys.
    """
    greedy = temp == 0.0
    inv_temp = 1.0 / tl.where(greedy, 1.0, temp)
    packed = approx_words(z, greedy, inv_temp, prefix, token, valid, AXIS, HARDWARE)
    best = tl.max(packed, axis=AXIS)
    runner = tl.max(tl.where(packed == _across(best, AXIS), INT64_MIN, packed), axis=AXIS)
    value, index = unpack_key(best)
    second, _ = unpack_key(runner)
    clear_best = (best != INT64_MAX) & (value != 0.0)
    finite_best = clear_best & (tl.abs(value) < float("inf"))
    # best == INT64_MIN: no valid lane (a row outside the batch), nothing to decide
    decided = (best == INT64_MIN) | tl.where(greedy, clear_best,
                                             finite_best & (value - second > key_slack(value, filter_margin)))
    if _any_undecided(decided, AXIS):
        value, index = block_argmax(exact_keys(z, greedy, temp, prefix, token, AXIS), token, valid, AXIS)
    else:
        # valid: lanes outside the vocabulary may carry any token id (e.g. a d2t load's `other`), never the winner's z
        winner = tl.max(tl.where(valid & (token == _across(index, AXIS)), z, float("-inf")), axis=AXIS)
        exact_winner = tl.math.div_rn(winner, tl.where(greedy, 1.0, temp)) + draft_noise(prefix, index)
        value = tl.where(greedy, value, exact_winner)
    return value, index
