"""Reference of the drafting modes of vLLM's DSpark speculator: reduced vocabulary and top-k drafting.

The executable form of README "Id spaces" and "Top-k drafting" (issue 17), used by
:func:`dspark_markov.draft.reference.sample_drafts_reference`; every design of these modes is tested
against it, and it against vLLM 0.33.0's own ``_sample_sequential`` / ``_sample_sequential_topk``
(``tests/integrations/test_vllm.py``, ``tools/check_vllm.sh``).

Reduced draft vocabulary (``head.d2t_index``: target id of each draft id): the base logits, W2 and
the step's logits ``z`` are in draft space ``[V_d]``; the step's row is ``z`` scattered into a
target-width row that is ``-inf`` at every target id no draft id maps to (vLLM's ``index_copy_``
into its ``-inf`` scratch). That row is what is cached and sampled: the Gumbel keys are keyed by
target ids, the argmax runs in target-id order (first maximum = lowest target id), and the drawn
token -- the next step's previous token, which indexes the target-indexed W1 -- is a target id.

Top-k drafting (``draft_top_k = k``, vLLM's ``dspark_draft_topk``): the candidates are
``torch.topk(base_logits, k)`` of every position at once (values and draft ids; ties at the k-th
value are torch.topk's choice, the same call vLLM makes). Per step only the candidates get the
bias, as vLLM's ``apply_bias_gathered`` computes it: one fused multiply-add per candidate,
``values + scale * (W2[index] @ W1[prev])`` accumulated in fp32 (``baddbmm``) and rounded once --
the bias is *not* rounded to the weight dtype first, unlike the dense mode. The candidates are
scattered into a row that is ``-inf`` elsewhere (target width with ``d2t``) and the normal
sampler draws from it.
"""

from __future__ import annotations

import torch


def scatter_row(z: torch.Tensor, ids: torch.Tensor, width: int) -> torch.Tensor:
    """``[R, width]`` row of ``z``'s dtype: ``z`` ``[R, C]`` at columns ``ids`` (``[C]`` or ``[R, C]``
    int64, distinct per row), ``-inf`` elsewhere."""
    row = torch.full((z.shape[0], width), float("-inf"), dtype=z.dtype, device=z.device)
    if ids.dim() == 1:
        ids = ids.expand(z.shape[0], -1)
    return row.scatter_(1, ids, z)


def top_k_candidates(base_logits: torch.Tensor, k: int):
    """``(values, draft ids)`` ``[R, N, k]`` of the top-k base logits of every position (vLLM's call)."""
    return base_logits.topk(k, dim=-1)


def candidate_logits(head, values: torch.Tensor, index: torch.Tensor, prev: torch.Tensor, cache_dtype) -> torch.Tensor:
    """Corrected candidates ``round_cache(values + scale * W2[index] @ W1[prev])`` ``[R, k]``.

    values ``[R, k]`` base logits of the candidates; index ``[R, k]`` int64 draft ids; prev ``[R]``
    int64 target ids. fp32 accumulation, ``scale`` times the fp32 sum, plus the fp32 value, one
    rounding. Where the values, the weights and the cache share one dtype this is vLLM's own op
    (``values.clone().baddbmm_(W2[index], W1[prev], alpha=scale)``), so the rounding and the CPU's
    summation order are vLLM's exactly; otherwise the same op on the exact fp32 widenings, rounded
    once to the cache dtype.
    """
    weight = head.head_weight[index]  # [R, k, R_k]
    code = head.embed_weight.index_select(0, prev.long()).unsqueeze(-1)  # [R, R_k, 1]
    if values.dtype == head.dtype == cache_dtype:
        corrected = values.unsqueeze(-1).clone()
        corrected.baddbmm_(weight, code, beta=1.0, alpha=head.scale)
        return corrected.squeeze(-1)
    corrected = torch.baddbmm(values.float().unsqueeze(-1), weight.float(), code.float(), beta=1.0, alpha=head.scale)
    return corrected.squeeze(-1).to(cache_dtype)


def target_ids(head, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target ids of draft ids (identity without ``d2t``), int64."""
    if head.d2t_index is None:
        return draft_ids.long()
    return head.d2t_index[draft_ids.long()]
