"""The host-side start of a persistent verifier's ``run``, shared by the designs, and their functional form.

:class:`~.triton_verify.Verifier` and :class:`~.triton_verify_stream.StreamVerifier` check the
batch against the shape they were built for, take their own output buffers unless the caller passes
some, and launch nothing for an empty batch or for a call without slots. Pure torch; no Triton.
"""

from __future__ import annotations

import torch


def start_run(verifier, target_logits, method, temperature, tokens, num_emitted):
    """Check ``target_logits`` ``[B, K+1, V]`` and ``method`` against ``verifier`` (its ``k``,
    ``vocab``, ``max_batch``, ``tokens`` ``[max_batch, K+1]`` and ``num_emitted`` ``[max_batch]``).

    Returns ``(batch, tokens, num_emitted, finished)``: the output views (the caller's, or views of
    the verifier's buffers) and whether nothing is left to launch — an empty batch, or no slots
    (``temperature`` ``[0]``: every request is padding, so tokens are -1 and counts 0, written here).
    Allocates nothing and never synchronises (CUDA-graph safe).
    """
    batch, k1, vocab = target_logits.shape
    if k1 != verifier.k + 1 or vocab != verifier.vocab or batch > verifier.max_batch:
        raise ValueError(f"target_logits: expected [B <= {verifier.max_batch}, {verifier.k + 1}, {verifier.vocab}], "
                         f"got shape {tuple(target_logits.shape)}")
    if method not in ("standard", "block"):
        raise ValueError(f"method: expected 'standard' or 'block', got {method!r}")
    if tokens is None:
        tokens = verifier.tokens[:batch]
    if num_emitted is None:
        num_emitted = verifier.num_emitted[:batch]
    if batch == 0:
        return batch, tokens, num_emitted, True
    if temperature.shape[0] == 0:
        tokens.fill_(-1)
        num_emitted.zero_()
        return batch, tokens, num_emitted, True
    return batch, tokens, num_emitted, False


def cached_instance(store: dict, make, batch: int, k: int, vocab: int, device):
    """The persistent verifier of ``(device, K, V)`` in ``store`` with room for ``batch`` requests:
    ``make(max_batch, K, V, device)`` builds one for the next power of two of ``batch`` (at least 16) on first use
    and when a bigger batch comes; otherwise the stored one is reused, so repeated calls allocate no scratch."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, int(k), int(vocab))
    verifier = store.get(key)
    if verifier is None or verifier.max_batch < batch:
        verifier = make(max(16, 1 << (int(batch) - 1).bit_length()), k, vocab, device)
        store[key] = verifier
    return verifier


def run_fresh(cached, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
              seeds, target_greedy, method, target_temperature):
    """``verify_drafts``' call of a cached persistent verifier: ``cached(batch, K, V, device)`` gives it, and only
    the two outputs (``[B, K+1]`` and ``[B]`` int64) are allocated, from the caching allocator (not for CUDA
    graphs: capture the verifier's ``run`` with your own outputs). Returns ``(tokens, num_emitted)``."""
    batch, k1, vocab = target_logits.shape
    device = target_logits.device
    tokens = torch.empty(batch, k1, dtype=torch.int64, device=device)
    num_emitted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, num_emitted
    verifier = cached(batch, k1 - 1, vocab, device)
    return verifier.run(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature,
                        seeds, target_greedy, method=method, target_temperature=target_temperature, tokens=tokens,
                        num_emitted=num_emitted)
