"""The draft sampler as a torch custom op, ``torch.ops.dspark_markov.sample_drafts_``.

The op mutates ``draft_tokens`` ``[R, N]`` and ``logits_cache`` ``[S, N, V]`` in place and returns
nothing, so ``torch.compile(fullgraph=True)`` traces it as one opaque call (its fake
implementation does nothing: the outputs already have their shapes). Behind it, a module-level
cache keeps one :class:`~dspark_markov.draft.sampler.MarkovSampler` per (weights, shapes, dtypes,
impl, method, rows), so a compiled call reuses the sampler's persistent buffers instead of
rebuilding them; with a graph-safe ``impl`` ("loop", "gumbel_fused", ...) the op can also run
inside a captured CUDA graph (the sampler must then already exist: call the op once eagerly
before capturing, which building the graph's warm-up does anyway).

Signature of the op::

    sample_drafts_(base_logits, anchor, idx_mapping, positions, temperature, seeds,
                   embed_weight, head_weight, draft_tokens!, logits_cache!,
                   scale: float, impl: str, method: str) -> ()
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .. import registry
from ..head import MarkovHead
from .sampler import MarkovSampler

OP_NAME = "dspark_markov::sample_drafts_"
_MAX_CACHED_SAMPLERS = 32
_SAMPLERS: "OrderedDict[tuple, MarkovSampler]" = OrderedDict()
# Samplers that ran while a CUDA stream was capturing: a captured graph replays into their scratch
# buffers, so the LRU bound never frees them (kept until clear_sampler_cache()).
_CAPTURED: "dict[tuple, MarkovSampler]" = {}


def _version(weight: torch.Tensor):
    # Inference tensors (created under torch.inference_mode()) have no version counter: reading
    # ``_version`` raises. Their in-place updates cannot be seen (see cached_sampler).
    return None if weight.is_inference() else weight._version


def _sampler_key(embed_weight, head_weight, scale, num_steps, rows, cache_dtype, impl, method):
    # The version counters make an in-place weight update build a new sampler (the interpreter
    # path keeps fp32 copies of the weights).
    return (embed_weight.data_ptr(), head_weight.data_ptr(), _version(embed_weight), _version(head_weight),
            tuple(embed_weight.shape), tuple(head_weight.shape), embed_weight.dtype, str(embed_weight.device),
            float(scale), int(num_steps), int(rows), cache_dtype, impl, method)


def cached_sampler(embed_weight, head_weight, scale, num_steps, rows, cache_dtype, impl, method) -> MarkovSampler:
    """The cached :class:`MarkovSampler` for these weights and shapes (built on first use).

    At most 32 samplers are kept (least recently used evicted), plus every sampler that ran while a
    CUDA stream was capturing (its graph replays into the sampler's buffers). Keys include the
    weights' ``data_ptr`` and version counters, so new or updated weights get a new sampler.
    Inference tensors (weights created under ``torch.inference_mode()``) have no version counter:
    an in-place update of those, like one through ``param.data`` (which bypasses the counter), is
    not seen, so call :func:`clear_sampler_cache` after one (it matters where a design keeps a copy
    of the weights: the CPU interpreter path of "loop" / "gumbel_fused").
    """
    key = _sampler_key(embed_weight, head_weight, scale, num_steps, rows, cache_dtype, impl, method)
    sampler = _SAMPLERS.get(key)
    if sampler is None:
        sampler = _CAPTURED.get(key)
        if sampler is None:
            head = MarkovHead(embed_weight, head_weight, scale)
            sampler = MarkovSampler(head, num_steps, max(int(rows), 1), cache_dtype=cache_dtype, method=method,
                                    impl=impl)
        _SAMPLERS[key] = sampler
        while len(_SAMPLERS) > _MAX_CACHED_SAMPLERS:
            _SAMPLERS.popitem(last=False)
    else:
        _SAMPLERS.move_to_end(key)
    if registry.capturing(embed_weight.device):
        _CAPTURED[key] = sampler
    return sampler


def clear_sampler_cache() -> None:
    """Drop every cached sampler (and the buffers it holds; free the CUDA graphs that captured the op first)."""
    _SAMPLERS.clear()
    _CAPTURED.clear()


@torch.library.custom_op(OP_NAME, mutates_args=("draft_tokens", "logits_cache"))
def _sample_drafts_op(base_logits: torch.Tensor, anchor: torch.Tensor, idx_mapping: torch.Tensor,
                      positions: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                      embed_weight: torch.Tensor, head_weight: torch.Tensor, draft_tokens: torch.Tensor,
                      logits_cache: torch.Tensor, scale: float, impl: str, method: str) -> None:
    if base_logits.dim() != 3:
        raise ValueError(f"base_logits: expected a 3-D tensor [R, N, V], got shape {tuple(base_logits.shape)}")
    rows, steps, _ = base_logits.shape
    # The sampler built below takes N and its cache dtype from these: name them, not the sampler's
    # num_steps / cache_dtype, which the op has no argument for.
    if steps < 1:
        raise ValueError(f"base_logits: expected N >= 1 draft steps, got shape {tuple(base_logits.shape)}")
    if logits_cache.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"logits_cache: expected dtype bfloat16 or float32, got {logits_cache.dtype}")
    sampler = cached_sampler(embed_weight, head_weight, scale, steps, rows, logits_cache.dtype, impl, method)
    sampler.sample(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens=draft_tokens,
                   logits_cache=logits_cache)


@_sample_drafts_op.register_fake
def _sample_drafts_fake(base_logits, anchor, idx_mapping, positions, temperature, seeds, embed_weight, head_weight,
                        draft_tokens, logits_cache, scale, impl, method) -> None:
    return None


def sample_drafts_(head: MarkovHead, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                   logits_cache, *, impl: str = registry.DEFAULT_IMPL, method: str = "gumbel") -> None:
    """Sample drafts in place through the custom op (usable under ``torch.compile(fullgraph=True)``).

    Parameters
    ----------
    head : MarkovHead (its weights and ``scale`` are passed to the op).
    base_logits : ``[R, N, V]`` bf16/fp32, last stride 1. anchor : ``[R]`` int32/int64.
    idx_mapping, positions : ``[R*N]`` int32/int64 (slot -1 = padding).
    temperature : ``[S]`` fp32. seeds : ``[S]`` int64.
    draft_tokens : ``[R, N]`` int64, written. logits_cache : ``[S, N, V]`` bf16/fp32, written for
        live samples; its dtype is the sampler's cache dtype.
    impl, method : as for :class:`MarkovSampler` (``"auto"`` is resolved once per cached sampler).

    Validation is that of :meth:`MarkovSampler.sample` (value checks skipped while a CUDA stream
    is capturing). CUDA-graph safe for graph-safe implementations once the sampler is cached.
    A head with a reduced draft vocabulary (``d2t``) is refused (``ValueError``): the op passes the
    weights only; use :class:`MarkovSampler` for it.
    """
    if getattr(head, "d2t_index", None) is not None:
        raise ValueError("head: the custom op has no reduced draft vocabulary (d2t); use MarkovSampler(head, ...)")
    torch.ops.dspark_markov.sample_drafts_(base_logits, anchor, idx_mapping, positions, temperature, seeds,
                                           head.embed_weight, head.head_weight, draft_tokens, logits_cache,
                                           float(head.scale), impl, method)
