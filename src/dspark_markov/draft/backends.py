"""Registry of draft-sampler implementations (``impl=``), imported lazily.

A backend is a class constructed once per :class:`~dspark_markov.draft.sampler.MarkovSampler`
with ``(head, num_steps, max_rows, method, cache_dtype, device)``; it allocates its scratch buffers
there and exposes ``run(base_logits, anchor, idx_mapping, positions, temperature, seeds,
draft_tokens, logits_cache)``, which launches work only (no validation, no allocation for the
Triton backends, so a call can be captured in a CUDA graph). Class attributes:

- ``METHODS``: the ``method=`` values it supports;
- ``DEVICES``: device types it runs on (``"cpu"`` means Triton's interpreter for Triton backends);
- ``GRAPH_SAFE``: whether ``run`` is capturable;
- ``MAX_ROWS``: the largest batch it takes (``None``: any).

The implementation is chosen explicitly and never falls back silently; ``"auto"`` is a backend of
its own (:mod:`dspark_markov.draft.auto`) that dispatches each call by its batch size to the
fastest measured design.
"""

from __future__ import annotations

import importlib

_BACKENDS = {
    "reference": ("dspark_markov.draft.reference_backend", "ReferenceBackend"),
    "loop": ("dspark_markov.draft.triton_loop", "LoopBackend"),
    "gumbel_fused": ("dspark_markov.draft.triton_gumbel_fused", "GumbelFusedBackend"),
    "inverse_cdf": ("dspark_markov.draft.triton_inverse_cdf", "InverseCdfBackend"),
    "fused": ("dspark_markov.draft.triton_fused", "FusedBackend"),
    "chain": ("dspark_markov.draft.triton_chain", "ChainBackend"),
    "auto": ("dspark_markov.draft.auto", "AutoBackend"),
}

IMPLS = tuple(_BACKENDS)


def backend_class(impl: str):
    """The backend class of ``impl``; ``ValueError`` for an unknown or unavailable name."""
    if impl not in _BACKENDS:
        raise ValueError(f"impl: expected one of {', '.join(repr(i) for i in IMPLS)}, got {impl!r}")
    module_name, class_name = _BACKENDS[impl]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"impl: {impl!r} is not available here ({error})") from error
    return getattr(module, class_name)
