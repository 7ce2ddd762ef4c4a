"""``sample_drafts``: the functional entry point (SPEC.md sections 1-5)."""

from __future__ import annotations

import torch

from .. import registry
from ..validate import LOGIT_DTYPES, check_head, check_tensor
from .sampler import DraftOutput, MarkovSampler


def sample_drafts(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, *, draft_tokens=None,
                  logits_cache=None, method: str = "gumbel", impl: str = registry.DEFAULT_IMPL, cache_dtype=None,
                  fp64: bool = False, check_values: bool | None = None, d2t=None, draft_top_k=None,
                  markov_embeds=None) -> DraftOutput:
    """Draw N Markov draft tokens per row, one step at a time, and cache the biased logits.

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` (W1 ``[V_t, R_k]``, W2 ``[V, R_k]``, scale).
    base_logits : ``[R, N, V]`` bf16 or fp32, last stride 1.
    anchor : ``[R]`` int32/int64, the previous token of step 0.
    idx_mapping : ``[R*N]`` int32/int64 request-state slot per (row, step); -1 marks padding. Two
        live samples may not share a ``(slot, step)`` cache row (``ValueError`` with ``check_values``).
    positions : ``[R*N]`` int32/int64, the position ``P`` each sample predicts.
    temperature : ``[S]`` fp32 per slot (0 = greedy). seeds : ``[S]`` int64 per slot.
    draft_tokens : optional ``[R, N]`` int64 output. logits_cache : optional ``[S, N, V]`` output
        (bf16 or fp32); rows of padding samples are never written.
    method : ``"gumbel"`` or ``"inverse_cdf"``. impl : see :class:`MarkovSampler`.
    cache_dtype : dtype of an allocated cache (default bf16; ignored when ``logits_cache`` is given).
    fp64 : fp64 Gumbel noise (reference only).
    check_values : read the inputs back to range-check them (default: unless capturing a graph).
    d2t : optional ``[V_d]`` reduced-vocabulary table (or on ``head``): base logits ``[R, N, V_d]``,
        cache ``[S, N, target vocabulary]``, tokens in target ids (README "Id spaces").
    draft_top_k : optional int, top-k candidate drafting (README "Top-k drafting").
    markov_embeds : optional ``[R, N, R_k]`` output (weight dtype): each step's ``W1[prev]``, the
        confidence head's input.

    Returns
    -------
    ``DraftOutput(draft_tokens, logits_cache)``. Builds a :class:`MarkovSampler` per call; engines
    should keep one sampler and call :meth:`MarkovSampler.sample`.
    """
    check_head(head)
    if isinstance(logits_cache, torch.Tensor):
        # The given cache's dtype wins (as documented); name it, not cache_dtype, when it is wrong.
        if logits_cache.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"logits_cache: expected dtype bfloat16 or float32, got {logits_cache.dtype}")
        cache_dtype = logits_cache.dtype
    elif cache_dtype is None:
        cache_dtype = torch.bfloat16
    # base_logits defines N and R of the sampler built below: check it here, so that a bad shape
    # names base_logits, not the num_steps / max_rows the caller never passed.
    check_tensor("base_logits", base_logits, dim=3, dtypes=LOGIT_DTYPES)
    rows, steps, _ = base_logits.shape
    if steps < 1:
        raise ValueError(f"base_logits: expected N >= 1 draft steps, got shape {tuple(base_logits.shape)}")
    sampler = MarkovSampler(head, steps, max(rows, 1), cache_dtype=cache_dtype, method=method, impl=impl, fp64=fp64,
                            d2t=d2t, draft_top_k=draft_top_k)
    return sampler.sample(base_logits, anchor, idx_mapping, positions, temperature, seeds,
                          draft_tokens=draft_tokens, logits_cache=logits_cache, check_values=check_values,
                          markov_embeds=markov_embeds)
