"""``verify_drafts``: lossless verification of Markov drafts (SPEC.md section 6)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import registry
from ..draft.reference import padding_and_slot
from ..validate import (CACHE_DTYPES, INDEX_DTYPES, _same_device, check_choice, check_cpu_or_cuda, check_range,
                        check_tensor, check_triton_runs, check_vector)

METHODS = ("standard", "block")
IMPLS = registry.names("verify")


class VerifyOutput(NamedTuple):
    tokens: torch.Tensor  # [B, K+1] int64, the emitted tokens, -1 after the last one
    num_emitted: torch.Tensor  # [B] int64, accepted drafts + 1 (0 for padding requests)


def check_verify_inputs(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
                        seeds, target_greedy, *, check_values: bool = True, target_temperature=None):
    """Validate the arguments of :func:`verify_drafts`; return ``(B, K, V, S)``."""
    check_tensor("target_logits", target_logits, dim=3, dtypes=(torch.float32,), last_stride_one=True)
    device = target_logits.device
    check_cpu_or_cuda("target_logits", target_logits)  # (the value checks below read the tensors: meta has none)
    batch, k_plus_1, vocab = target_logits.shape
    if k_plus_1 < 1:
        raise ValueError(f"target_logits: expected K + 1 >= 1 rows per request, got shape {tuple(target_logits.shape)}")
    if vocab < 1:
        raise ValueError(f"target_logits: expected V >= 1, got shape {tuple(target_logits.shape)}")
    k = k_plus_1 - 1
    check_tensor("draft_tokens", draft_tokens, shape=(batch, k), dtypes=INDEX_DTYPES)
    check_tensor("logits_cache", logits_cache, dim=3, dtypes=CACHE_DTYPES, last_stride_one=True)
    slots, steps, cache_vocab = logits_cache.shape
    if cache_vocab != vocab:
        raise ValueError(f"logits_cache: expected V = {vocab} (target_logits.shape[2]), got shape {tuple(logits_cache.shape)}")
    if steps < k:
        raise ValueError(f"logits_cache: expected N >= K = {k} cached draft steps (target_logits.shape[1] - 1), "
                         f"got shape {tuple(logits_cache.shape)}")
    # Per-request and per-slot vectors must be contiguous (the package's stride rule, validate.py).
    for name, x in (("num_drafts", num_drafts), ("idx_mapping", idx_mapping), ("positions", positions)):
        check_vector(name, x, length=batch, dtypes=INDEX_DTYPES)
    check_vector("temperature", temperature, length=slots, dtypes=(torch.float32,))
    check_vector("seeds", seeds, length=slots, dtypes=(torch.int64,))
    if target_greedy is not None:
        check_vector("target_greedy", target_greedy, length=batch, dtypes=(torch.bool,))
    named = [("draft_tokens", draft_tokens), ("logits_cache", logits_cache), ("num_drafts", num_drafts),
             ("idx_mapping", idx_mapping), ("positions", positions), ("temperature", temperature), ("seeds", seeds)]
    if target_greedy is not None:
        named.append(("target_greedy", target_greedy))
    if target_temperature is not None:
        check_vector("target_temperature", target_temperature, length=slots, dtypes=(torch.float32,))
        named.append(("target_temperature", target_temperature))
    for name, x in named:
        if not _same_device(x.device, device):
            raise ValueError(f"{name}: expected a tensor on {device} (the device of target_logits), got one on {x.device}")
    if check_values:
        check_range("idx_mapping", idx_mapping, -1, slots)
        live = idx_mapping >= 0
        check_range("num_drafts", num_drafts[live], 0, k + 1)
        if k > 0 and batch > 0:
            used = live[:, None] & (torch.arange(k, device=device)[None, :] < num_drafts[:, None])
            check_range("draft_tokens", draft_tokens[used], 0, vocab)
        if slots > 0:
            if bool(torch.isnan(temperature).any()) or bool((temperature < 0).any()) or bool(torch.isinf(temperature).any()):
                raise ValueError("temperature: expected finite values >= 0 (0 means greedy drafts), got NaN, inf or a negative value")
            if target_temperature is not None and not bool(torch.isfinite(target_temperature).all()
                                                            & (target_temperature >= 0).all()):
                raise ValueError("target_temperature: expected finite values >= 0 (0: unscaled), got NaN, inf or a "
                                 "negative value")
    return batch, k, vocab, slots


def verify_drafts(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
                  *, target_greedy=None, method: str = "standard", impl: str = registry.DEFAULT_IMPL,
                  check_values: bool = True, target_temperature=None) -> VerifyOutput:
    """Verify Markov drafts against the target model by rejection sampling (lossless).

    Parameters
    ----------
    target_logits : ``[B, K+1, V]`` fp32 (last stride 1), the target's logits with its temperature
        already applied; row ``j`` is the distribution ``p_j`` of the token at ``positions[b] + j``
        given the prefix and drafts ``0 .. j-1``. Rows after ``num_drafts[b]`` are ignored.
    draft_tokens : ``[B, K]`` int32/int64, the drafts (entries at or after ``num_drafts[b]``, and
        all entries of padding requests, are ignored and may hold anything, e.g. -1).
    logits_cache : ``[S, N, V]`` bf16/fp32 with ``N >= K``, the draft cache written by
        :func:`~dspark_markov.sample_drafts`; row ``[slot, i]`` holds the logits draft ``i`` was
        drawn from, before temperature.
    num_drafts : ``[B]`` int32/int64, drafts to verify per request, in ``[0, K]`` (without value checks a value
        outside is clamped into it, by every implementation).
    idx_mapping : ``[B]`` int32/int64, the request-state slot of each request; ``-1`` marks a
        padding request, which emits nothing: its tokens are all -1 and its count is 0.
    positions : ``[B]`` int32/int64, the position ``P`` of the token the first draft predicts;
        draft ``j`` (and the row-``j`` resample or bonus) predicts ``P + j``.
    temperature : ``[S]`` fp32 per slot, the DRAFT temperature ``T``: ``q_i = softmax(cache / T)``
        with the fp32 division of SPEC.md section 4; ``T == 0`` means the drafts were greedy and
        ``q_i`` is one-hot at the cached row's ``argmax_first``.
    seeds : ``[S]`` int64 per slot, the key of the acceptance uniforms (hashed with the round's
        ``P - 1`` and the draft index) and of the resampling noise (hashed with the emitted token's
        position minus 1 and the column id), each in its own hash domain, apart from the draft
        noise (:mod:`dspark_markov.verify.keys`).
    target_greedy : optional ``[B]`` bool, requests whose target samples greedily. Default
        ``None``: a request is greedy iff its slot's temperature is 0 (engines use one temperature
        for drafting and target sampling). A greedy request accepts draft ``i`` iff it equals
        ``argmax_first(target_logits[b, i])`` and then emits that argmax (also as the bonus).
    method : ``"standard"`` (token by token: accept ``x_i`` iff ``u_i < p_i(x_i) / q_i(x_i)``; on
        the first rejection draw from ``normalize(max(p_i - q_i, 0))``; after ``n`` acceptances
        draw the bonus from ``p_n``) or ``"block"`` (block verification, Sun et al. 2024: the
        same guarantee, never fewer accepted tokens on average). Where a draft row's ``q`` is NaN
        (its ``cache / T`` overflows fp32, or holds NaN / +inf / only -inf), the standard method
        rejects that draft and draws the row from ``p`` (lossless); the block method's residual mass
        of that row is NaN, its test fails and fewer drafts are kept, which is not lossless there
        (both implementations alike): use the standard method for such rows.
    impl : ``"auto"`` (the default; :mod:`dspark_markov.registry`): ``"triton"`` on CUDA, the
        reference on the CPU. ``"reference"``: torch, CPU and CUDA (allocates per call).
        ``"triton"``: the one-launch kernel of :mod:`dspark_markov.verify.triton_verify_stream`
        (CUDA, or the CPU under ``TRITON_INTERPRET=1``) with a cached persistent verifier per
        (device, K, V), equal to the reference except at last-bit ties of the softmax rounding
        (see that module); for CUDA graphs capture its ``StreamVerifier.run``. ``"cuda"``: the
        persistent-warp CUDA C++ verifier of :mod:`dspark_markov.verify.cuda_verify` (sm_90 with
        NVRTC; the standard method, K <= 7, V % 8 == 0, 16-byte aligned rows, else ``ValueError``;
        opted in with ``DSPARK_MARKOV_UNVERIFIED=cuda_verify`` until its GPU tests pass on the H200).
    check_values : read the inputs back to range-check them (synchronises; default True).
    target_temperature : optional ``[S]`` fp32 per slot (finite, >= 0). When given,
        ``target_logits`` are RAW (before temperature) and are divided by their slot's target
        temperature inside verification with the IEEE division of ``z / T`` (``T == 0``:
        unscaled): results are bit-identical to passing ``reference.scale_target(...)`` of them
        pre-divided, without the separate temperature pass. Engines that sample the target at the
        draft temperature pass ``temperature`` here too. Top-k/top-p are not fused into
        verification (they need a whole-row selection before the softmax). Supported: top-k alone
        may filter the RAW logits first (``top_k_top_p(raw, k)``; dividing by T > 0 keeps the order,
        -inf stays -inf, so the kept set is the same except at ties that the division's rounding
        creates at the k-th value); top-p depends on T: divide first (``scale_target``), filter,
        and pass the filtered logits pre-divided (no ``target_temperature``), or let the filter
        divide as it reads the rows: ``top_k_top_p(raw, k, p, temperature=T_rows, impl="cuda")``
        writes the divided, filtered rows in one pass (bit for bit the same as dividing first).

    Returns
    -------
    ``VerifyOutput(tokens, num_emitted)``: ``tokens`` ``[B, K+1]`` int64, the accepted drafts then
    the resampled or bonus token, -1 after them; ``num_emitted`` ``[B]`` int64 = accepted + 1
    (0 for padding requests). Every emitted token is in ``[0, V)``.

    Notes
    -----
    Emitted sequences are distributed exactly as the target's (up to fp32 rounding), given drafts
    drawn from ``q``. A draft with ``q_i(x_i) = 0`` is rejected; a residual that is all zero in
    fp32 is replaced by ``p_i``. Randomness is counter-based, so a call is reproducible and does not
    depend on the batch composition. The reference allocates its outputs and temporaries
    (``O(B K V)`` fp32) and is not CUDA-graph safe.
    """
    check_choice("method", method, METHODS)
    impl = registry.resolve("verify", impl, target_logits.device if isinstance(target_logits, torch.Tensor) else "cpu")
    check_verify_inputs(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
                        seeds, target_greedy, check_values=check_values, target_temperature=target_temperature)
    registry.check_capturable("verify", impl, target_logits.device)
    if impl == "triton":
        check_triton_runs(impl, target_logits.device)
        verify_stream = registry.load("verify", "triton")  # imports Triton

        tokens, num_emitted = verify_stream(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping,
                                            positions, temperature, seeds, target_greedy, method=method,
                                            target_temperature=target_temperature)
        return VerifyOutput(tokens, num_emitted)
    if impl == "cuda":
        verify_cuda = registry.load("verify", "cuda")
        tokens, num_emitted = verify_cuda(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions,
                                          temperature, seeds, target_greedy, method=method,
                                          target_temperature=target_temperature)
        return VerifyOutput(tokens, num_emitted)
    if target_temperature is not None:
        from .reference import scale_target

        target_logits = scale_target(target_logits, target_temperature, idx_mapping)
    if target_greedy is None:
        if temperature.numel() > 0:
            target_greedy = temperature[padding_and_slot(idx_mapping, temperature.numel())[1]] == 0
        else:
            target_greedy = torch.zeros(idx_mapping.shape, dtype=torch.bool, device=target_logits.device)
    verify_reference = registry.load("verify", "reference")
    tokens, num_emitted = verify_reference(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping,
                                           positions, temperature, seeds, target_greedy, method=method)
    return VerifyOutput(tokens, num_emitted)
