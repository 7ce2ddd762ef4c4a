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

Device status (a backend whose kernel can fail without the host knowing, e.g. a persistent kernel
whose bounded grid barrier gives up; ``chain``, and the CUDA C++ chain, follow this contract):

- ``status``: a ``[1]`` int32 tensor on the device, allocated in ``__init__``, that the kernel
  ORs a non-zero failure bit into and never clears (sticky across launches and graph replays).
  ``run`` reads the attribute at every launch, so a dispatcher (``auto``) may point several
  backends at one shared flag before their first launch.
- ``check()``: reads ``status`` (one host sync); if non-zero, zeroes it and raises
  :class:`~dspark_markov.DeviceStatusError` (a ``RuntimeError``) whose message names the impl and
  says the tokens since the last check are meaningless. Each failure is reported once.
- The launch must still end (bounded waits) with every token in ``[0, V)`` and no write outside
  the outputs; the tokens are then simply not the reference's.

Callers: :meth:`MarkovSampler.sample` calls ``check()`` after the launch when ``check_values``
is on (eager calls; never during a capture); :meth:`MarkovSampler.check`,
:meth:`~dspark_markov.DSparkStep.check` and ``AutoBackend.check`` call it on request (after
graph replays, at a point where the engine synchronises anyway). Backends without a device
status define neither attribute.

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
    "cuda_chain": ("dspark_markov.draft.cuda_chain", "CudaChainBackend"),
    "stream": ("dspark_markov.draft.triton_stream", "StreamBackend"),
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
