"""The executable form of SPEC.md sections 1-5: the reference Markov draft sampler.

Loops over the N steps; vectorised over rows and vocabulary; runs on CPU and CUDA tensors.
Every Triton sampler is tested against the draw functions here, applied to that sampler's own
cached logits (SPEC.md section 3: the bias may differ in its last bit, the draw may not).
"""

from __future__ import annotations

import torch

from .. import rng
from .modes_reference import candidate_logits, scatter_row, target_ids, top_k_candidates


def argmax_first(key: torch.Tensor) -> torch.Tensor:
    """``torch.argmax`` semantics made explicit, over the last dimension.

    The first NaN wins if the row has one; otherwise the first maximum; an all ``-inf`` row gives
    0. Returns int64 indices. Independent of the torch version's NaN handling.
    """
    isnan = torch.isnan(key)
    first_nan = isnan.to(torch.int8).argmax(dim=-1)
    row_max = torch.where(isnan, torch.full_like(key, float("-inf")), key).amax(dim=-1, keepdim=True)
    first_max = (key == row_max).to(torch.int8).argmax(dim=-1)
    return torch.where(isnan.any(dim=-1), first_nan, first_max)


def padding_and_slot(idx_mapping, num_slots: int):
    """``(padding, slot)`` of each entry of ``idx_mapping``: padding where it is negative or outside
    ``[0, num_slots)`` (as the kernels read it, ``ops.rows.sample_slot``: without value checks an
    id out of range is never followed), slot 0 there; slot int64."""
    padding = (idx_mapping < 0) | (idx_mapping >= num_slots)
    return padding, torch.where(padding, torch.zeros_like(idx_mapping), idx_mapping).long()


def row_keys(idx_mapping_step, positions_step, temperature, seeds):
    """Per-row temperature, seed and position of one step; padding rows (a slot outside
    ``[0, S)``) get T = 0 and seed 0."""
    padding, slot = padding_and_slot(idx_mapping_step, temperature.numel())
    if temperature.numel() == 0:  # every row is padding
        zeros = torch.zeros_like(slot)
        return padding, zeros.float(), zeros, positions_step.long()
    temp = torch.where(padding, torch.zeros((), device=slot.device), temperature[slot])
    seed = torch.where(padding, torch.zeros((), dtype=torch.int64, device=slot.device), seeds[slot])
    return padding, temp, seed, positions_step.long()


def scaled_logits(z: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """``z / T`` in fp32 (one IEEE division, SPEC.md sections 4-6); rows with ``T == 0`` unscaled.

    z : ``[R, ...]`` bf16/fp32; temp ``[R]`` fp32, broadcast over ``z``'s trailing dimensions.
    """
    logits = z.float()
    temp = temp.reshape(temp.shape[0], *([1] * (logits.dim() - 1)))
    return logits / torch.where(temp == 0, torch.ones_like(temp), temp)


def gumbel_keys(z, temp, seed, step: int, position, *, fp64: bool = False, tokens=None) -> torch.Tensor:
    """Keys ``z / T + g`` of SPEC.md section 4 (``z`` for T = 0 rows), fp32 (or fp64).

    z : ``[R, V]`` logits as cached (bf16 or fp32); temp ``[R]`` fp32; seed/position ``[R]`` int64.
    tokens : int64 ``[V]`` token ids of ``z``'s columns (they key the noise); default ``0..V-1``
        (a vocabulary shard passes its global ids).
    """
    logits = z.float()
    if tokens is None:
        tokens = torch.arange(logits.shape[-1], device=logits.device)
    noise = rng.draft_noise(seed[:, None], step, position[:, None], tokens, fp64=fp64)
    greedy = (temp == 0)[:, None]
    scaled = scaled_logits(logits, temp)
    if fp64:
        return torch.where(greedy, logits.double(), scaled.double() + noise)
    return torch.where(greedy, logits, scaled + noise)


def draw_gumbel(z, temp, seed, step: int, position, *, fp64: bool = False) -> torch.Tensor:
    """Gumbel-max draw ``argmax(z / T + g)`` of SPEC.md section 4; int64 ``[R]``."""
    return argmax_first(gumbel_keys(z, temp, seed, step, position, fp64=fp64))


def draw_inverse_cdf(z, temp, seed, step: int, position) -> torch.Tensor:
    """Inverse-CDF draw of SPEC.md section 5 from cached logits ``z`` ``[R, V]``; int64 ``[R]``.

    ``p = softmax(z / T)`` in fp32 with one uniform per row. T = 0 rows, and rows whose maximum is
    not finite (a NaN, a ``+inf``, or all ``-inf``), take :func:`argmax_first` of ``z``.
    """
    logits = z.float()
    greedy_token = argmax_first(logits)
    safe_temp = torch.where(temp == 0, torch.ones_like(temp), temp)
    scaled = logits / safe_temp[:, None]
    row_max = scaled.amax(dim=-1, keepdim=True)
    finite_row = torch.isfinite(row_max[:, 0]) & ~torch.isnan(logits).any(dim=-1)
    weights = torch.exp(scaled - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    weights = torch.where(torch.isnan(weights), torch.zeros_like(weights), weights)
    cumulative = torch.cumsum(weights, dim=-1)
    u = rng.inverse_cdf_uniform(seed, step, position)
    target = u * cumulative[:, -1]
    beyond = cumulative > target[:, None]
    vocab = logits.shape[-1]
    index = torch.arange(vocab, device=logits.device)
    last_positive = torch.where(weights > 0, index, torch.zeros_like(index)).amax(dim=-1)
    picked = torch.where(beyond.any(dim=-1), beyond.to(torch.int8).argmax(dim=-1), last_positive)
    return torch.where((temp == 0) | ~finite_row, greedy_token, picked)


def sample_drafts_reference(head, base_logits, anchor, idx_mapping, positions, temperature, seeds,
                            draft_tokens, logits_cache, *, method: str = "gumbel", fp64: bool = False,
                            draft_top_k: int | None = None, markov_embeds=None):
    """Reference sequential draft sampling into ``draft_tokens`` ``[R, N]`` and ``logits_cache``.

    base_logits ``[R, N, V]`` (``V_d`` with a ``d2t`` head); anchor ``[R]``; idx_mapping/positions
    ``[R*N]``; temperature/seeds ``[S]``; logits_cache ``[S, N, head.cache_vocab_size]``. Padding
    rows never write the cache. ``draft_top_k``: top-k candidate drafting; a head with ``d2t``:
    the reduced vocabulary (both in :mod:`.modes_reference`). ``markov_embeds``: optional
    ``[R, N, R_k]`` output, each step's ``W1[prev]`` (the confidence head's input).
    """
    rows, steps, _ = base_logits.shape
    prev = anchor.long().clamp(0, head.embed_vocab_size - 1)  # (clamped as the kernels do: check_values=False)
    slots = idx_mapping.view(rows, steps)
    pos = positions.view(rows, steps)
    width = head.cache_vocab_size
    reduced = head.d2t_index is not None
    if draft_top_k is not None:
        values, candidates = top_k_candidates(base_logits, draft_top_k)  # [R, N, k] each
    for step in range(steps):
        padding, temp, seed, position = row_keys(slots[:, step], pos[:, step], temperature, seeds)
        if markov_embeds is not None:
            markov_embeds[:, step] = head.embed_weight.index_select(0, prev)
        if draft_top_k is not None:
            corrected = candidate_logits(head, values[:, step], candidates[:, step], prev, logits_cache.dtype)
            z = scatter_row(corrected.to(logits_cache.dtype), target_ids(head, candidates[:, step]), width)
        else:
            bias = head.bias(prev)
            z = (base_logits[:, step].float() + bias.float()).to(logits_cache.dtype)
            if reduced:
                z = scatter_row(z, head.d2t_index, width)
        live = ~padding
        logits_cache[slots[live, step].long(), step] = z[live]
        if method == "gumbel":
            token = draw_gumbel(z, temp, seed, step, position, fp64=fp64)
        else:
            token = draw_inverse_cdf(z, temp, seed, step, position)
        draft_tokens[:, step] = token
        prev = token
    return draft_tokens, logits_cache
