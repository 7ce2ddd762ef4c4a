"""One registry of implementations (``impl=``) for drafting, verification, top-k/top-p and block inputs.

Every entry point that takes ``impl=`` resolves it here, with one meaning and one default:

- an explicit name (``"reference"``, ``"triton"``, a draft design such as ``"chain"``) runs that
  implementation or raises ``ValueError`` naming ``impl``; nothing falls back silently;
- ``"auto"`` (the default everywhere: :data:`DEFAULT_IMPL`) runs the fastest implementation
  measured on the H200 that can run the request, and the reference on the CPU (Triton's
  interpreter is for tests). For drafting that is :mod:`dspark_markov.draft.auto`, which picks a
  design per call by batch size from the committed benchmarks; for verification, top-k/top-p and
  block inputs it is ``"triton"`` on CUDA (the only CUDA-graph-safe implementation; the
  references allocate per call);
- :func:`check_capturable` refuses, with a ``ValueError``, an implementation that is not
  CUDA-graph safe while a stream is capturing (the callers that capture call it).

The protocol. A **draft backend** is a class constructed once with
``(head, num_steps, max_rows, *, method, cache_dtype, device)`` that allocates its scratch there
and whose ``run(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
logits_cache)`` launches work only; class attributes ``METHODS``, ``DEVICES``, ``GRAPH_SAFE``,
``MAX_ROWS`` (checked by :func:`check_draft_backend`).

Device status (a backend whose kernel can fail without the host knowing, e.g. a persistent kernel
whose bounded grid barrier gives up; ``chain`` and ``cuda_chain`` follow this contract):

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
status define neither attribute. A **function implementation** (the other
families) has one signature per family, given by the family's public function
(``verify_drafts``, ``top_k_top_p``, ``prepare_block_inputs``); its devices and graph safety are
in its :data:`REGISTRY` entry. Modules are imported by name, lazily (importing the package
imports no Triton); a name whose module cannot be imported raises ``ValueError``.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

AUTO = "auto"
DEFAULT_IMPL = AUTO


class Entry(NamedTuple):
    module: str
    attribute: str
    devices: tuple = ("cpu", "cuda")  # "cpu" means Triton's interpreter for Triton implementations
    graph_safe: bool = True  # classes declare GRAPH_SAFE themselves; this is for functions


_DRAFT = "dspark_markov.draft."
REGISTRY = {
    "draft": {
        "reference": Entry(_DRAFT + "reference_backend", "ReferenceBackend", graph_safe=False),
        "loop": Entry(_DRAFT + "triton_loop", "LoopBackend"),
        "gumbel_fused": Entry(_DRAFT + "triton_gumbel_fused", "GumbelFusedBackend"),
        "inverse_cdf": Entry(_DRAFT + "triton_inverse_cdf", "InverseCdfBackend"),
        "fused": Entry(_DRAFT + "triton_fused", "FusedBackend"),
        "chain": Entry(_DRAFT + "triton_chain", "ChainBackend"),
        "cuda_chain": Entry(_DRAFT + "cuda_chain", "CudaChainBackend"),
        "cuda_gumbel": Entry(_DRAFT + "cuda_gumbel", "CudaGumbelBackend"),
        "cuda_wide": Entry(_DRAFT + "cuda_wide", "CudaWideBackend"),
        "stream": Entry(_DRAFT + "triton_stream", "StreamBackend"),
        "wide": Entry(_DRAFT + "triton_wide", "WideBackend"),
        AUTO: Entry(_DRAFT + "auto", "AutoBackend"),
    },
    # Top-k candidate drafting (MarkovSampler(draft_top_k=k), issue 17): its own designs, same protocol
    # plus ``draft_top_k=`` in the constructor. "auto": the reference on the CPU, "fused" on CUDA.
    "draft_top_k": {
        "reference": Entry(_DRAFT + "reference_backend", "ReferenceBackend", graph_safe=False),
        "fused": Entry(_DRAFT + "triton_top_k", "TopKFusedBackend"),
    },
    "verify": {
        "reference": Entry("dspark_markov.verify.reference", "verify_reference", graph_safe=False),
        # verify_drafts allocates its outputs per call; graphs capture a StreamVerifier / Verifier (DSparkStep)
        "triton": Entry("dspark_markov.verify.triton_verify_stream", "verify_stream", graph_safe=False),
        # the persistent-warp CUDA C++ verifier (issue 18; sm_90, standard method; opted in until its GPU tests pass:
        # verify.cuda_verify.unavailable_reason); "auto" never picks it
        "cuda": Entry("dspark_markov.verify.cuda_verify", "verify_cuda", devices=("cuda",), graph_safe=False),
    },
    "top_k_top_p": {
        "reference": Entry("dspark_markov.verify.filtering_reference", "top_k_top_p_reference", graph_safe=False),
        "triton": Entry("dspark_markov.verify.triton_filtering", "launch_top_k_top_p"),
        # the cluster-resident CUDA C++ filter (issue 16; sm_90): verify.filtering.top_k_top_p's "auto" picks it
        # for small batches and temperatures (verify.cuda_filtering.auto_picks), registry.resolve never does
        "cuda": Entry("dspark_markov.verify.cuda_filtering", "launch_top_k_top_p", devices=("cuda",)),
    },
    "block_inputs": {
        "reference": Entry("dspark_markov.block_inputs.api", "prepare_block_inputs_reference", graph_safe=False),
        "triton": Entry("dspark_markov.block_inputs.triton_block_inputs", "launch_block_inputs"),
    },
}


# Draft designs that are CUDA C++ built at first use (NVRTC): no Triton interpreter path, and they may be
# unavailable on a CUDA machine (no NVRTC, not sm_90: their class's ``unavailable_reason()`` says why);
# ``auto`` then runs the fastest measured portable (Triton) design instead (draft/auto.py).
NATIVE_DESIGNS = ("cuda_chain", "cuda_gumbel", "cuda_wide")
# Draft designs not for default use (never run on a GPU, or run and not kept: cuda_wide is exact but slower than the
# designs auto picks): constructed only when opted in (DSPARK_MARKOV_UNVERIFIED, see the design's module), timed by
# `bench` only when named, and never in an `auto` table, even from a results file that measured them
# (draft/auto.py table_from_results), until the design is validated and leaves this list.
OPT_IN_DESIGNS = ("cuda_wide",)

# Implementations that "auto" does not pick until they have passed their GPU tests on the H200;
# they stay selectable by name. Empty now: the rewritten Triton top-k/top-p filter (issue 16) passed
# `pytest -m gpu tests/gpu/test_filtering_gpu.py` on the H200 (17 passed, 2026-12-01 22:20 UTC). Add a
# family's "triton" here when a kernel is replaced and has only run in the interpreter.
PENDING_GPU_VALIDATION: dict = {}


def names(family: str) -> tuple:
    """The ``impl=`` values of ``family`` (including ``"auto"``)."""
    table = REGISTRY[family]
    return tuple(table) if AUTO in table else tuple(table) + (AUTO,)


def check_name(family: str, impl: str, argument: str = "impl") -> None:
    """``ValueError`` naming ``argument`` unless ``impl`` is a name of ``family``."""
    if impl not in names(family):
        raise ValueError(f"{argument}: expected one of {', '.join(repr(i) for i in names(family))}, got {impl!r}")


def resolve(family: str, impl: str, device, argument: str = "impl") -> str:
    """The implementation ``impl`` runs on ``device``: itself, or what ``"auto"`` means there."""
    check_name(family, impl, argument)
    if impl != AUTO or AUTO in REGISTRY[family]:
        return impl
    if torch.device(device).type != "cuda" or "triton" in PENDING_GPU_VALIDATION.get(family, ()):
        return "reference"
    return "triton"


def load(family: str, impl: str, argument: str = "impl"):
    """The class or function of ``impl`` (imported now); ``ValueError`` if unknown or unavailable."""
    check_name(family, impl, argument)
    entry = REGISTRY[family][impl]
    try:
        module = importlib.import_module(entry.module)
    except ImportError as error:
        raise ValueError(f"{argument}: {impl!r} is not available here ({error})") from error
    return getattr(module, entry.attribute)


def graph_safe(family: str, impl: str, implementation=None) -> bool:
    """Whether ``impl`` can be captured in a CUDA graph (a backend's own ``GRAPH_SAFE`` wins)."""
    declared = getattr(implementation, "GRAPH_SAFE", None)
    return bool(declared) if declared is not None else REGISTRY[family][impl].graph_safe


def capturing(device) -> bool:
    """Whether the current CUDA stream of ``device`` is capturing a graph."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_capturable(family: str, impl: str, device, implementation=None, argument: str = "impl") -> None:
    """``ValueError`` when a graph is being captured on ``device`` and ``impl`` is not graph safe."""
    if capturing(device) and not graph_safe(family, impl, implementation):
        raise ValueError(f"{argument}: {impl!r} allocates or synchronises per call and cannot be captured in a "
                         f"CUDA graph; use a Triton implementation (or 'auto' on CUDA)")


def check_draft_backend(cls, impl: str, *, method: str, device, max_rows: int) -> None:
    """The capability checks of a draft backend class: method, device type and batch size."""
    device = torch.device(device)
    if method not in cls.METHODS:
        raise ValueError(f"method: impl {impl!r} supports {', '.join(repr(m) for m in cls.METHODS)}, got {method!r}")
    if device.type not in cls.DEVICES:
        raise ValueError(f"impl: {impl!r} runs on {', '.join(cls.DEVICES)}, but the head is on {device}")
    if cls.MAX_ROWS is not None and max_rows > cls.MAX_ROWS:
        raise ValueError(f"max_rows: impl {impl!r} takes at most {cls.MAX_ROWS} rows, got {max_rows}")
