"""Top-k / top-p reference: the fixed-point weights and the sorted selection (:mod:`.filtering` semantics).

Shared by the public function (:mod:`.filtering`) and the Triton kernels (:mod:`.triton_filtering`),
which reproduce :func:`weight_fixed_point` bit for bit.
"""

from __future__ import annotations

import math

import torch

from ..rng import LN2_HIGH, LN2_LOW, f32

# exp(d), d <= 0, Cody-Waite: n = floor(d log2(e) + 1/2), r = (d - n ln2_high) - n ln2_low in
# [-0.35, 0.35] (n ln2_high is exact), exp(r) by its Taylor polynomial of degree 7 (truncation
# error < 3e-9), times 2^n built from the exponent bits. Constants rounded to fp32 once, so torch
# and Triton compute the same bits (IEEE fp32 adds/multiplies only, no FMA contraction).
EXP_COEFFS = tuple(f32(1.0 / math.factorial(i)) for i in range(7, -1, -1))
LOG2E = f32(1.0 / math.log(2.0))
MASS_ONE = 4294967296.0  # 2^32: weight 1 in fixed point
EXP_FLOOR = -44.0  # exp(-44) < 2^-63 truncates to q = 0 anyway; keeps 2^n a normal number
KEY_FLOOR = -(2**31) - 1  # below every ordered key: "no top-k" / the bottom of a search


# --------------------------------------------------------------------------- torch side
def weight_fixed_point(x: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """``q = trunc(exp(x - row_max) 2^32)`` (int64) with the software fp32 ``exp`` of the module doc.

    ``x`` fp32 ``[..., V]``, ``row_max`` fp32 broadcastable (the row maximum, no NaN). Bit-identical
    to the Triton device function ``_weight_fixed_point``.
    """
    d = torch.clamp_min(x - row_max, EXP_FLOOR)
    n = torch.floor(d * LOG2E + 0.5)
    r = (d - n * LN2_HIGH) - n * LN2_LOW
    poly = torch.full_like(r, EXP_COEFFS[0])
    for c in EXP_COEFFS[1:]:
        poly = poly * r + c
    scale = ((torch.nan_to_num(n).to(torch.int32) + 127) << 23).view(torch.float32)
    w = torch.where(x == row_max, 1.0, poly * scale)
    return (w * MASS_ONE).to(torch.int64)


def top_k_top_p_reference(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The kept mask (bool ``[B, V]``) by a stable descending sort; ``k`` int64 ``[B]``, ``p`` fp32 ``[B]``."""
    rows, vocab = logits.shape
    values, order = torch.sort(logits, dim=1, descending=True, stable=True)
    rank = torch.arange(vocab, device=logits.device)
    use_k = (k > 0) & (k < vocab)
    keep_k = ~use_k[:, None] | (rank[None, :] < k[:, None])
    q = torch.where(keep_k, weight_fixed_point(values, values[:, :1]), 0)
    total = q.sum(dim=1, keepdim=True)
    before = torch.cumsum(q, dim=1) - q
    limit = p.double()[:, None] * total.double()
    keep_p = ~(p < 1.0)[:, None] | (before.double() < limit)
    keep_sorted = keep_k & keep_p
    keep_sorted[:, 0] = True  # the best-ranked token always survives
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    return keep | torch.isnan(logits).any(dim=1, keepdim=True)
