"""``MarkovSampler``: a chosen implementation with its scratch buffers allocated once."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import registry
from ..ops.constants import MAX_TOP_K
from ..validate import (check_choice, check_draft_inputs, check_head, check_int, check_sampler_sizes, check_tensor,
                        check_triton_runs)

METHODS = ("gumbel", "inverse_cdf")


class DraftOutput(NamedTuple):
    draft_tokens: torch.Tensor  # [R, N] int64
    logits_cache: torch.Tensor  # [S, N, V] bf16 or fp32


class MarkovSampler:
    """Sequential Markov draft sampler with persistent buffers (SPEC.md sections 1-5).

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` on the device the sampler runs on.
    num_steps : N, the draft steps per row.
    max_rows : the largest batch ``R`` that :meth:`sample` will be given.
    cache_dtype : ``torch.bfloat16`` (default) or ``torch.float32``.
    method : ``"gumbel"`` (SPEC.md section 4) or ``"inverse_cdf"`` (section 5).
    impl : ``"auto"`` (the default: per call, the fastest design measured for its batch size; the
        reference on the CPU, and with ``fp64``, which only the reference implements), or one of
        ``"reference"``, ``"loop"``, ``"gumbel_fused"``, ``"inverse_cdf"``, ``"fused"``, ``"chain"``
        (:mod:`dspark_markov.registry`). An implementation that cannot run the request raises
        ``ValueError``; nothing falls back silently.
    fp64 : fp64 Gumbel noise (reference only).
    d2t : optional ``[V_d]`` reduced-vocabulary table (as :class:`~dspark_markov.MarkovHead`'s ``d2t``,
        which may carry it instead; not both): base logits ``[R, N, V_d]``, cache rows, keys and
        tokens in target ids (README "Id spaces"). Designs: ``"reference"``, ``"fused"`` and ``"chain"``
        (Gumbel); ``"auto"`` is ``"fused"`` on CUDA (the reference for ``method="inverse_cdf"``).
    draft_top_k : optional int ``k``: top-k candidate drafting (vLLM's ``dspark_draft_topk``; README
        "Top-k drafting"): only the top-k base logits of each position get the bias, every other
        entry of the cached row is ``-inf``. Designs (registry family ``"draft_top_k"``):
        ``"reference"`` and ``"fused"`` (Gumbel; ``"auto"`` on CUDA).

    ``cache_dtype``, ``method``, ``impl``, ``fp64``, ``d2t`` and ``draft_top_k`` are keyword-only (a backend's constructor
    takes ``method``, ``cache_dtype`` and ``device`` by keyword too, so no order can be confused).

    CUDA graphs: with a Triton implementation, :meth:`sample` allocates nothing when the outputs
    are passed, does no host synchronisation when ``check_values=False`` (the default while a
    stream is capturing), and reads every per-call value (anchor, slots, positions, temperature,
    seeds) from the given tensors at replay time: capture once, then refill the same input tensors
    and replay. Sampling while a stream captures with an implementation that is not graph safe
    (the reference) raises ``ValueError``.

    Device failures: a backend with a device status flag (``chain``: a grid barrier that timed out)
    reports it as :class:`~dspark_markov.DeviceStatusError`, raised by an eager :meth:`sample`
    (``check_values=True``) right after its launch, or by :meth:`check`. After graph replays call
    :meth:`check` where the engine synchronises anyway (e.g. after copying the emitted tokens to
    the host), or copy :attr:`status` along with those outputs (non-zero = failure).
    """

    def __init__(self, head, num_steps: int, max_rows: int, *, cache_dtype=torch.bfloat16, method: str = "gumbel",
                 impl: str = registry.DEFAULT_IMPL, fp64: bool = False, d2t=None, draft_top_k=None):
        check_head(head)
        check_choice("method", method, METHODS)
        num_steps, max_rows = check_sampler_sizes(num_steps, max_rows, cache_dtype)
        if d2t is not None:
            head = head.with_d2t(d2t)  # ValueError naming d2t when the head has one already
        device = head.device
        family = "draft"
        options = {}
        if draft_top_k is not None:
            draft_top_k = check_int("draft_top_k", draft_top_k, 1)
            if draft_top_k > head.draft_vocab_size:
                raise ValueError(f"draft_top_k: expected at most V = {head.draft_vocab_size} (the draft vocabulary), "
                                 f"got {draft_top_k}")
            family = "draft_top_k"
            options["draft_top_k"] = draft_top_k
        modes = family == "draft_top_k" or head.d2t_index is not None
        if impl == registry.AUTO and (fp64 or (device.type != "cuda" and family == "draft_top_k")
                                      or (modes and (method != "gumbel" or (draft_top_k or 0) > MAX_TOP_K))):
            # the only implementation of fp64 noise, of the modes' inverse CDF and of k > the fused design's
            # limit; top-k's auto on the CPU
            impl = "reference"
        elif impl == registry.AUTO and family == "draft_top_k":
            impl = "fused"
        elif impl == registry.AUTO and head.d2t_index is not None:
            impl = "fused" if device.type == "cuda" else "reference"  # the designs with a reduced vocabulary
        cls = registry.load(family, impl)
        registry.check_draft_backend(cls, impl, method=method, device=device, max_rows=max_rows)
        if head.d2t_index is not None and not getattr(cls, "D2T", False):
            raise ValueError(f"d2t: impl {impl!r} has no reduced draft vocabulary; use 'fused', 'chain' or 'reference'")
        if impl not in ("reference", registry.AUTO):  # Triton designs: the CPU needs the interpreter
            check_triton_runs(impl, device)
        if fp64 and impl != "reference":
            raise ValueError(f"fp64: fp64 noise is only implemented by impl='reference', got impl={impl!r}")
        self.head = head
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.cache_dtype = cache_dtype
        self.method = method
        self.impl = impl
        self.draft_top_k = draft_top_k
        if impl == "reference":
            options["fp64"] = fp64
        self.backend = cls(head, self.num_steps, self.max_rows, method=method, cache_dtype=cache_dtype, device=device,
                           **options)
        # The confidence head's inputs (sample(markov_embeds=)) for backends that do not write them:
        # the previous tokens [anchor, x_0, ..., x_{N-2}] per row, gathered from W1 after the launch.
        self._prev = torch.zeros(self.max_rows, self.num_steps, dtype=torch.int64, device=device)

    @staticmethod
    def impl_names() -> tuple:
        """The ``impl=`` values the constructor knows (``"auto"`` included), whether or not they run here."""
        return registry.names("draft")

    def sample(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, *, draft_tokens=None,
               logits_cache=None, check_values: bool | None = None, markov_embeds=None) -> DraftOutput:
        """Draw ``draft_tokens`` ``[R, N]`` and fill ``logits_cache`` ``[S, N, V]`` (SPEC.md section 2).

        base_logits ``[R, N, V]`` bf16/fp32 (last stride 1, any row/step strides); anchor ``[R]``
        int32/int64; idx_mapping and positions ``[R*N]`` int32/int64, ordered (row, step), slot -1
        = padding; temperature ``[S]`` fp32; seeds ``[S]`` int64; every 1-D input contiguous.
        Missing outputs are allocated (``logits_cache`` zero-filled), which is not CUDA-graph safe.

        ``check_values`` (default: unless a stream is capturing) reads the inputs back: ids in
        range, finite temperatures, no two live samples on one ``(slot, step)`` cache row (two rows
        on one slot would overwrite each other's cache), and after the launch the backend's device
        status (:meth:`check`). Without it those are the caller's promise. Inputs that require grad (a
        backbone run with autograd on) are read as their values, detached.

        ``markov_embeds``: optional ``[R, N, R_k]`` output in the weight dtype, contiguous: each
        step's Markov embedding ``W1[prev]`` (prev = anchor, then the drafted tokens), the input of
        vLLM's confidence head (``torch.stack(markov_embeds, 1)``). Written by the design's own
        kernel where it has them (``draft_top_k`` ``"fused"``), else by one gather after the launch;
        graph safe either way.
        """
        capturing = isinstance(base_logits, torch.Tensor) and registry.capturing(base_logits.device)
        if capturing:
            registry.check_capturable("draft", self.impl, base_logits.device, self.backend)
        if check_values is None:
            check_values = not capturing
        dims = check_draft_inputs(self.head, base_logits, anchor, idx_mapping, positions, temperature, seeds,
                                  draft_tokens, logits_cache, check_values=check_values)
        if dims.steps != self.num_steps:
            raise ValueError(f"base_logits: expected N = {self.num_steps} steps (num_steps), got shape {tuple(base_logits.shape)}")
        if dims.rows > self.max_rows:
            raise ValueError(f"base_logits: expected at most max_rows = {self.max_rows} rows, got {dims.rows}")
        device = base_logits.device
        # Drafting is inference only: base logits (or temperatures) of a backbone run with autograd on are read as their
        # values (the torch ops with out= of some designs raise on inputs that require grad; no copy)
        if base_logits.requires_grad:
            base_logits = base_logits.detach()
        if temperature.requires_grad:
            temperature = temperature.detach()
        if markov_embeds is not None:
            check_tensor("markov_embeds", markov_embeds, shape=(dims.rows, dims.steps, self.head.rank),
                         dtypes=(self.head.dtype,), device=device, contiguous=True)
        if logits_cache is None:
            logits_cache = torch.zeros(dims.slots, dims.steps, self.head.cache_vocab_size, dtype=self.cache_dtype,
                                       device=device)
        elif logits_cache.dtype != self.cache_dtype:
            raise ValueError(f"logits_cache: expected dtype {self.cache_dtype} (the sampler's cache_dtype), got {logits_cache.dtype}")
        if draft_tokens is None:
            draft_tokens = torch.empty(dims.rows, dims.steps, dtype=torch.int64, device=device)
        if dims.rows > 0:
            embeds_in_kernel = markov_embeds is not None and getattr(self.backend, "MARKOV_EMBEDS", False)
            extra = dict(markov_embeds=markov_embeds) if embeds_in_kernel else {}
            self.backend.run(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                             logits_cache, **extra)
            if markov_embeds is not None and not embeds_in_kernel:
                self._gather_embeds(anchor, draft_tokens, markov_embeds, dims.rows)
            if check_values:
                self.check()
        return DraftOutput(draft_tokens, logits_cache)

    def _gather_embeds(self, anchor, draft_tokens, markov_embeds, rows: int) -> None:
        """``markov_embeds[:rows] = W1[prev]`` with prev = ``[anchor, x_0, ..., x_{N-2}]`` (no allocation)."""
        prev = self._prev[:rows]
        prev[:, 0].copy_(anchor)
        prev[:, 0].clamp_(0, self.head.embed_vocab_size - 1)  # as every design clamps (no out-of-bounds gather)
        prev[:, 1:].copy_(draft_tokens[:, :-1])
        torch.index_select(self.head.embed_weight, 0, prev.reshape(-1),
                           out=markov_embeds.view(rows * self.num_steps, self.head.rank))

    @property
    def status(self):
        """The backend's device status flag (``[1]`` int32, non-zero = a failure since the last
        :meth:`check`), or ``None`` for backends that cannot fail on the device. Reading it is free
        until its value is copied to the host."""
        return getattr(self.backend, "status", None)

    def check(self) -> None:
        """Raise :class:`~dspark_markov.DeviceStatusError` if a launch since the last check failed on the
        device (e.g. ``chain``'s barrier timed out), then clear the flag. One host sync for backends
        with a device status, none otherwise; not inside a graph capture."""
        check = getattr(self.backend, "check", None)
        if check is not None:
            check()
