"""The inverse-CDF pick (SPEC.md section 5): the vocabulary block, then the token inside it.

A row is drawn from ``softmax(z / T)`` in two stages over per-block partials (``m_b = max z/T``
and ``s_b = sum exp(z/T - m_b)`` of each vocabulary block, blocks in vocabulary order):

1. :func:`pick_block` — the block masses ``s_b exp(m_b - M)`` (``M`` the row's max), their prefix
   sum, ``target = u * total`` (total = the last prefix sum, as the reference's
   ``cumulative[-1]``), the first block whose prefix sum exceeds the target, and what remains of
   the target inside it;
2. :func:`pick_token` — the prefix sum of the block's weights ``exp(z/T - m_b) * exp(m_b - M)``
   (the SPEC's ``exp(z/T - M)``, formed relative to the block's max so that a block far below the
   row's max keeps positive weights wherever it has positive mass) and the first token exceeding
   the remainder.

Both stages only stop on entries of positive weight and clamp to the last entry of positive
weight, so a zero-probability token (``z = -inf`` or ``exp`` underflow to 0) is never drawn.
Rows that are greedy (T = 0, padding) or whose maximum is not finite take the argmax instead
(:func:`draws`). The tokens follow ``softmax(cache / T)`` in distribution, fp32 rounding aside;
which token a rounding boundary falls to depends on the block size, so designs with different
blocks draw different tokens from the same uniform (never different greedy tokens).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def draws(live, temp, has_nan, row_max):
    """Whether a row is drawn by inverse CDF: live, T > 0, no NaN and a finite max of ``z / T``."""
    return live & (temp > 0.0) & ~has_nan & (row_max > float("-inf")) & (row_max < float("inf"))


@triton.jit
def pick_block(block_max, block_mass, valid, row_max, u, BLOCKS: tl.constexpr):
    """``(chosen block, remaining target, its scale exp(m_b - M), its max m_b)`` of one row.

    ``block_max``/``block_mass`` fp32 ``[BLOCKS]`` partials (``-inf``/0 where not ``valid``),
    ``row_max`` their maximum (finite), ``u`` the row's uniform in (0, 1].
    """
    blocks = tl.arange(0, BLOCKS)
    block_scale = tl.exp(block_max - row_max)  # 0 for an all -inf block
    mass = tl.where(valid, block_mass * block_scale, 0.0)
    cumulative = tl.cumsum(mass, axis=0)
    total = tl.max(cumulative, axis=0)
    target = u * total
    hit = (cumulative > target) & (mass > 0.0)
    chosen = tl.min(tl.where(hit, blocks, BLOCKS), axis=0)
    last_positive = tl.max(tl.where(mass > 0.0, blocks, -1), axis=0)
    chosen = tl.where(chosen < BLOCKS, chosen, last_positive)
    remaining = target - tl.sum(tl.where(blocks < chosen, mass, 0.0), axis=0)
    chosen_scale = tl.sum(tl.where(blocks == chosen, block_scale, 0.0), axis=0)
    chosen_max = tl.max(tl.where(blocks == chosen, block_max, float("-inf")), axis=0)
    return chosen, remaining, chosen_scale, chosen_max


@triton.jit
def pick_token(z, temp, cols, valid, chosen_scale, chosen_max, remaining, vocab):
    """The token of the chosen block: the first whose weight prefix sum exceeds ``remaining``.

    ``z`` the block's fp32 logits (exactly widened), ``cols`` its token ids, ``valid`` the lanes in
    the vocabulary; the rest from :func:`pick_block`. Returns an int32 token, or -1 if no weight
    of the block is positive.
    """
    scaled = tl.math.div_rn(z, tl.zeros_like(z) + temp)
    weight = tl.where(valid, tl.exp(scaled - chosen_max), 0.0)  # relative to the block max
    inside = tl.cumsum(weight, axis=0) * chosen_scale
    hit = (inside > remaining) & (weight > 0.0)
    picked = tl.min(tl.where(hit, cols, vocab), axis=0)
    last_token = tl.max(tl.where(weight > 0.0, cols, -1), axis=0)
    return tl.where(picked < vocab, picked, last_token)
