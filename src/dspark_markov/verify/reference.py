"""The executable form of SPEC.md section 6: lossless verification of Markov drafts, in torch.

Vectorised over requests and vocabulary; loops over the K draft positions only; CPU and CUDA.

Notation per request ``b`` with ``n = num_drafts[b]`` drafts ``x_0 .. x_{n-1}``:

- ``p_i = softmax(target_logits[b, i])`` (fp32, temperature already applied), rows ``0 .. n``;
- ``q_i = softmax(logits_cache[slot, i] / T)`` with the fp32 division of SPEC.md section 4 (the
  distribution the draft ``x_i`` was drawn from); ``T == 0`` means the draft was the argmax, so
  ``q_i`` is one-hot at ``argmax_first(logits_cache[slot, i])``.

Conventions that the public docstring repeats: a draft with ``q_i(x_i) == 0`` (which a sampler
never draws) gets ratio 0, i.e. it is rejected; a residual that is numerically all zero is
replaced by ``p_i``; NaNs never produce a token outside ``[0, V)`` (``argmax_first``).
"""

from __future__ import annotations

import torch

from ..draft.reference import argmax_first, padding_and_slot, scaled_logits
from . import keys


def draft_distribution(cache_rows: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """``q = softmax(cache / T)`` in fp32, one-hot at the argmax where ``T == 0``.

    cache_rows ``[B, K, V]`` bf16/fp32 (as cached, before temperature); temp ``[B]`` fp32.
    Returns ``[B, K, V]`` fp32.
    """
    logits = cache_rows.float()
    greedy = temp == 0
    q = torch.softmax(scaled_logits(logits, temp), dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(q).scatter_(-1, argmax_first(logits)[..., None], 1.0)
        q = torch.where(greedy[:, None, None], one_hot, q)
    return q


def scale_target(target_logits: torch.Tensor, target_temperature: torch.Tensor, idx_mapping: torch.Tensor):
    """Raw target logits ``[B, K+1, V]`` fp32 divided by their slot's temperature (``[S]`` fp32).

    ``reference.scaled_logits``: one IEEE ``z / T`` per element, ``T == 0`` unscaled; padding
    requests (a slot outside ``[0, S)``) are left unscaled. The kernels' raw-logit mode divides the
    same way, so it is bit-identical to passing this tensor pre-divided.
    """
    if target_temperature.numel() == 0:
        return target_logits
    padding, slot = padding_and_slot(idx_mapping, target_temperature.numel())
    temp = torch.where(padding, torch.zeros_like(target_temperature[slot]), target_temperature[slot])
    return scaled_logits(target_logits, temp)


def _gather_row(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b]]`` for ``x`` ``[B, L, V]`` and ``index`` ``[B]``; returns ``[B, V]``."""
    return x.gather(1, index[:, None, None].expand(-1, 1, x.shape[-1]))[:, 0]


def _sample_keyed(log_weights: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Gumbel-max draw ``argmax(log_weights + g)`` with verification noise; ``[B, V]`` -> ``[B]``."""
    vocab = log_weights.shape[-1]
    tokens = torch.arange(vocab, device=log_weights.device)
    noise = keys.resample_noise(seed[:, None], position[:, None], tokens)
    return argmax_first(log_weights + noise)


def _acceptance_ratio(p_rows, q_rows, drafts):
    """``p_i(x_i) / q_i(x_i)`` ``[B, K]`` fp32; 0 where ``q_i(x_i) == 0`` (or NaN)."""
    p_x = p_rows.gather(-1, drafts[..., None])[..., 0]
    q_x = q_rows.gather(-1, drafts[..., None])[..., 0]
    ratio = p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    return torch.where(q_x > 0, ratio, torch.zeros_like(ratio))


def _standard_index(ratio, u, valid):
    """Accepted count: leading run of ``u_i < ratio_i`` among the valid drafts; ``[B]`` int64."""
    accept = (u < ratio) & valid
    return torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)


def _block_index(ratio, u, p, q, num_drafts):
    """Block verification (Sun et al. 2024, Algorithm 2): accepted count and prefix weights.

    ``w_0 = 1``, ``w_i = min(w_{i-1} ratio_{i-1}, 1)``. For ``i < n``:
    ``h_i = r_i / (r_i + 1 - w_i)`` with ``r_i = sum_v max(w_i p_i(v) - q_i(v), 0)`` (``h_i = 0``
    where ``r_i = 0``, so a chosen prefix always has residual mass); ``h_n = w_n``. The accepted
    count is the largest ``i`` in ``1..n`` with ``u_i < h_i`` (0 if none). Returns
    (``[B]`` int64 count, ``[B, K+1]`` fp32 weights ``w``).
    """
    batch, k = ratio.shape
    weights = torch.ones(batch, k + 1, dtype=torch.float32, device=ratio.device)
    count = torch.zeros(batch, dtype=torch.int64, device=ratio.device)
    for i in range(1, k + 1):
        w = torch.clamp_max(weights[:, i - 1] * ratio[:, i - 1], 1.0)
        weights[:, i] = w
        if i < k:
            residual_mass = torch.clamp_min(w[:, None] * p[:, i] - q[:, i], 0.0).sum(dim=-1)
            denominator = residual_mass + (1.0 - w)
            safe = torch.where(residual_mass > 0, denominator, torch.ones_like(denominator))
            h_inner = torch.where(residual_mass > 0, residual_mass / safe, torch.zeros_like(residual_mass))
        else:
            h_inner = torch.zeros_like(w)
        h = torch.where(num_drafts == i, w, torch.where(num_drafts > i, h_inner, torch.zeros_like(w)))
        count = torch.where(u[:, i - 1] < h, torch.full_like(count, i), count)
    return count, weights


def verify_reference(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
                     seeds, target_greedy, *, method: str = "standard"):
    """Reference verification; see :func:`dspark_markov.verify_drafts` for the contract.

    target_logits ``[B, K+1, V]`` fp32; draft_tokens ``[B, K]`` int; logits_cache ``[S, N>=K, V]``;
    num_drafts/idx_mapping/positions ``[B]`` int; temperature ``[S]`` fp32; seeds ``[S]`` int64;
    target_greedy ``[B]`` bool. Inputs are assumed validated. Returns (tokens ``[B, K+1]`` int64
    padded with -1, num_emitted ``[B]`` int64; padding requests: all -1 and 0).
    """
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    device = target_logits.device
    padding, slot = padding_and_slot(idx_mapping, temperature.numel())  # (a slot outside [0, S): padding)
    tokens = torch.full((batch, k_plus_1), -1, dtype=torch.int64, device=device)
    num_emitted = torch.zeros(batch, dtype=torch.int64, device=device)
    if batch == 0 or temperature.numel() == 0:  # no slots: every request is padding
        return tokens, num_emitted

    temp = temperature[slot]
    seed = torch.where(padding, torch.zeros_like(seeds[slot]), seeds[slot])
    # clamped into [0, K] as the kernels clamp it (check_values=False may pass any value)
    n = torch.where(padding, torch.zeros_like(num_drafts), num_drafts).long().clamp(0, k)
    base_pos = positions.long()
    offsets = torch.arange(k_plus_1, device=device)
    position = base_pos[:, None] + offsets  # [B, K+1]: the position each row's token takes
    drafts = draft_tokens.long()
    valid = offsets[None, :k] < n[:, None]  # [B, K]
    drafts = torch.where(valid, drafts, torch.zeros_like(drafts)).clamp(0, vocab - 1)

    logits = target_logits.float()
    p = torch.softmax(logits, dim=-1)  # [B, K+1, V]
    q = draft_distribution(logits_cache[slot, :k], temp)  # [B, K, V]
    ratio = _acceptance_ratio(p[:, :k], q, drafts)  # [B, K]
    u = keys.accept_uniforms(seed[:, None], base_pos[:, None], k)  # [B, K]

    if method == "block":
        accepted, weights = _block_index(ratio, u, p, q, n)
    else:
        accepted = _standard_index(ratio, u, valid)
        weights = torch.ones(batch, k_plus_1, dtype=torch.float32, device=device)

    # Greedy targets: accept while the draft is the target's argmax, then emit the argmax.
    target_argmax = argmax_first(logits)  # [B, K+1]
    greedy_accept = (drafts == target_argmax[:, :k]) & valid
    greedy_count = torch.cumprod(greedy_accept.to(torch.int64), dim=1).sum(dim=1)
    accepted = torch.where(target_greedy, greedy_count, accepted)

    # The emitted token at row j = accepted: residual after a rejection, bonus after n acceptances.
    rejected = accepted < n
    p_row = _gather_row(p, accepted)
    if k > 0:
        q_row = _gather_row(q, accepted.clamp_max(k - 1))
        w_row = weights.gather(1, accepted[:, None])
        residual = torch.clamp_min(w_row * p_row - q_row, 0.0)
        residual = torch.where(torch.isnan(residual), torch.zeros_like(residual), residual)
        use_residual = rejected & (residual.sum(dim=-1) > 0)
    else:
        residual = torch.zeros_like(p_row)
        use_residual = torch.zeros_like(rejected)
    # Sampling from p uses the logits themselves (same argmax as log p, no underflow).
    log_weights = torch.where(use_residual[:, None], torch.log(residual), _gather_row(logits, accepted))
    row_position = position.gather(1, accepted[:, None])[:, 0]
    sampled = _sample_keyed(log_weights, seed, row_position)
    emitted = torch.where(target_greedy, target_argmax.gather(1, accepted[:, None])[:, 0], sampled)

    prefix = offsets[None, :k] < accepted[:, None]
    tokens[:, :k] = torch.where(prefix, drafts, tokens[:, :k])
    tokens.scatter_(1, accepted[:, None], emitted[:, None])
    num_emitted = accepted + 1
    tokens = torch.where(padding[:, None], torch.full_like(tokens, -1), tokens)
    num_emitted = torch.where(padding, torch.zeros_like(num_emitted), num_emitted)
    return tokens, num_emitted
