"""The reference sampler behind the backend interface (CPU and CUDA; allocates, not graph-safe)."""

from __future__ import annotations

from .reference import sample_drafts_reference


class ReferenceBackend:
    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = False
    MAX_ROWS = None
    D2T = True  # a reduced draft vocabulary (head.d2t)

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, fp64=False, draft_top_k=None):
        self.head = head
        self.method = method
        self.fp64 = fp64
        self.draft_top_k = draft_top_k

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        sample_drafts_reference(self.head, base_logits, anchor, idx_mapping, positions, temperature, seeds,
                                draft_tokens, logits_cache, method=self.method, fp64=self.fp64,
                                draft_top_k=self.draft_top_k)
