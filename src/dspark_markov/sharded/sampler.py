"""``ShardedMarkovSampler``: the Markov chain with W2 split by vocabulary across ranks.

Per step every rank computes its shard of the logits and cache and its best (key, global id)
candidate per row (:func:`~dspark_markov.sharded.step._shard_step`); the ranks exchange one packed
int64 word per rank and row (:mod:`~dspark_markov.sharded.transport`) and all take the same winner,
which is ``torch.argmax`` over the whole vocabulary (:mod:`~dspark_markov.sharded.keys`). Every rank
therefore draws the tokens the single-GPU reference draws from the same cached logits.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ..draft.reference import padding_and_slot, row_keys
from ..draft.sampler import DraftOutput, MarkovSampler
from .. import registry
from ..head import MarkovHead
from ..validate import (CACHE_DTYPES, DeviceStatusError, check_cache_strides, check_cpu_or_cuda, check_draft_inputs,
                        check_int, check_sampler_sizes, check_tensor)
from .partition import all_shard_bounds, max_shard_width, shard_bounds
from .step import _shard_step
from .transport import TRANSPORTS, _canonical, agree, agree_call, flag_device, install_transport

CACHE_LAYOUTS = ("sharded", "gathered")


class ShardedMarkovSampler:
    """Vocabulary-sharded (tensor-parallel) Gumbel-max Markov draft sampler.

    Rank ``k`` of ``world`` owns W2 rows and cache columns ``[k V // world, (k + 1) V // world)``
    (:func:`~dspark_markov.sharded.partition.shard_bounds`; uneven shards differ by one token).

    Parameters
    ----------
    embed_weight : ``[V_t, R_k]`` W1, the full embedding (small), on every rank.
    head_weight : this rank's W2 shard ``[V_shard, R_k]`` when ``vocab_size`` is given, or the full
        W2 ``[V, R_k]`` (then the rank keeps a view of its rows only).
    group : the process group (``None``: the default group). Construction is collective.
    num_steps : N. max_rows : the largest batch of the sharded fast path.
    cache_dtype : ``torch.bfloat16`` or ``torch.float32``.
    scale : the head's bias multiplier. vocab_size : global V when ``head_weight`` is a shard.
    cache_layout : ``"sharded"``: each rank's ``logits_cache`` is ``[S, N, V_shard]``, its own
        columns; ``"gathered"``: ``[S, N, V]`` on every rank, the shards all-gathered after the N
        steps. ``"sharded"`` should be faster: its only traffic is the ``8 B`` winner word per rank,
        row and step, while gathering moves ``(world - 1) / world R N V c`` bytes into each rank
        (253 rows, N = 5, V = 129,280, bf16: ~290 MB per rank at TP8, hundreds of microseconds of
        NVLink, more than the whole chain). Verify from a sharded cache with
        :func:`~dspark_markov.sharded.verify.sharded_token_probability` (two ``[M]`` all-reduces, after
        one of three int64 that agrees the checks).
    transport : ``"collective"`` / ``"nccl"`` (all-gather, any backend), ``"all_reduce"`` or
        ``"symm_mem"`` (CUDA, NCCL group); see :mod:`~dspark_markov.sharded.transport`. If any
        rank cannot install it, all fall back to ``"collective"`` together
        (:attr:`transport_fallback_reason` says why).
    replicated_head_weight : optional full W2 ``[V, R_k]``; batches above ``max_rows`` then run the
        single-GPU :class:`~dspark_markov.MarkovSampler` (``fallback_impl``) on replicated weights,
        on every rank alike (the choice depends only on the batch size). Without it such batches
        raise ``ValueError``. fallback_max_rows : the largest fallback batch (default 1024).
    timeout_ms : bounded wait of the ``symm_mem`` barrier.
    agree_checks : agree every call's argument checks across ranks (default ``True``): one
        all-reduce of three int64 per call (on NCCL it is read back, a host sync), after which a
        call rejected on any rank raises the same ``ValueError`` on every rank, as does a call
        with a different batch size on some rank. ``False`` saves that collective; a rank whose
        call raises then leaves its peers in the step's collective until the group's timeout.

    The method is Gumbel-max (SPEC.md section 4). CUDA graphs: this torch version of the shard
    step allocates and uses boolean indexing for the cache write, so it is not capturable; the
    transports' buffers are persistent, so a kernel version of :func:`_shard_step` makes it so.
    """

    def __init__(self, embed_weight, head_weight, group=None, num_steps: int = 5, max_rows: int = 8,
                 cache_dtype=torch.bfloat16, *, scale: float = 1.0, vocab_size: int | None = None,
                 cache_layout: str = "sharded", transport: str = "collective", replicated_head_weight=None,
                 fallback_impl: str = "auto", fallback_max_rows: int = 1024, timeout_ms: int = 10_000,
                 agree_checks: bool = True, _fail_setup_for_test: bool = False):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("group: torch.distributed is not initialised (call init_process_group first)")
        group = group if group is not None else dist.group.WORLD
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # Local argument checks become a vote, so a rank with bad arguments never leaves the
        # others waiting in a collective: all ranks raise together.
        error = None
        try:
            self._setup_local(embed_weight, head_weight, num_steps, max_rows, cache_dtype, scale, vocab_size,
                              cache_layout, transport, replicated_head_weight, fallback_impl, fallback_max_rows)
        except Exception as caught:  # noqa: BLE001 - voted on, then re-raised on this rank
            error = caught
        device = embed_weight.device if isinstance(embed_weight, torch.Tensor) else torch.device("cpu")
        flags_on = flag_device(group, device)
        if not agree(error is None, group, flags_on):
            raise error if error is not None else ValueError("group: another rank rejected its arguments")
        self.agree_checks = bool(agree_checks)
        self._check_same_config(flags_on, transport)
        self._flags_on = flags_on
        self.transport, self.transport_fallback_reason = install_transport(
            transport, group, self.world, self.rank, self.max_rows, self.num_steps, self.device, timeout_ms,
            _fail_setup_for_test=_fail_setup_for_test)
        self.transport_name = self.transport.name

    # ------------------------------------------------------------------ construction
    def _setup_local(self, embed_weight, head_weight, num_steps, max_rows, cache_dtype, scale, vocab_size,
                     cache_layout, transport, replicated_head_weight, fallback_impl, fallback_max_rows):
        if cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout: expected 'sharded' or 'gathered', got {cache_layout!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport: expected one of {', '.join(repr(t) for t in TRANSPORTS)}, got {transport!r}")
        check_sampler_sizes(num_steps, max_rows, cache_dtype)
        registry.check_name("draft", fallback_impl, "fallback_impl")
        check_tensor("head_weight", head_weight, dim=2)
        vocab = head_weight.shape[0] if vocab_size is None else check_int("vocab_size", vocab_size, 1, 2**32 - 1)
        fallback_max_rows = check_int("fallback_max_rows", fallback_max_rows, 1)
        if vocab < self.world:  # (named by the argument that gave V; shard_bounds would name its own parameter)
            raise ValueError(f"head_weight: expected at least the world size {self.world} rows (V >= world, so that "
                             f"every shard is non-empty), got shape {tuple(head_weight.shape)}" if vocab_size is None
                             else f"vocab_size: expected V >= world size {self.world}, got {vocab}")
        start, end = shard_bounds(vocab, self.world, self.rank)
        if vocab_size is None:
            shard_weight = head_weight[start:end]  # a view of this rank's rows
        else:
            if head_weight.shape[0] != end - start:
                raise ValueError(f"head_weight: expected this rank's shard of {end - start} rows "
                                 f"[{start}, {end}) of V = {vocab}, got shape {tuple(head_weight.shape)}")
            shard_weight = head_weight
        if vocab >= 2**32:
            raise ValueError(f"vocab_size: expected V < 2**32, got {vocab}")
        self.shard_head = MarkovHead(embed_weight, shard_weight, scale)  # validates dtypes, ranks, V_t >= V_shard
        check_cpu_or_cuda("embed_weight", embed_weight)  # (the torch shard step cannot run on meta: no registry check)
        if self.shard_head.embed_vocab_size < vocab:
            raise ValueError(f"embed_weight: expected at least V = {vocab} rows, got shape {tuple(embed_weight.shape)}")
        self.vocab_size = vocab
        self.vocab_start, self.vocab_end = start, end
        self.shard_width = end - start
        self.bounds = all_shard_bounds(vocab, self.world)
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.cache_dtype = cache_dtype
        self.cache_layout = cache_layout
        self.device = self.shard_head.device
        self.fallback_impl = fallback_impl
        self.fallback_max_rows = int(fallback_max_rows)
        self._fallback = None
        self.replicated_head = None
        if replicated_head_weight is not None:
            check_tensor("replicated_head_weight", replicated_head_weight, shape=(vocab, self.shard_head.rank))
            self.replicated_head = MarkovHead(embed_weight, replicated_head_weight, scale)
        device = self.device
        width = max_shard_width(vocab, self.world)
        self.shard_tokens = torch.arange(start, end, dtype=torch.int64, device=device)  # [V_shard]
        self.packed = torch.empty(self.max_rows, dtype=torch.int64, device=device)  # [max_rows]
        self.z_rows = torch.empty(self.max_rows, self.num_steps, width, dtype=cache_dtype, device=device)  # [max_rows, N, ceil(V/world)]
        if cache_layout == "gathered":
            self.z_gathered = torch.empty(self.world, self.max_rows, self.num_steps, width, dtype=cache_dtype,
                                          device=device)  # [world, max_rows, N, ceil(V/world)]

    def _check_same_config(self, flags_on, transport):
        """Every rank must have been built with the same V, N, max_rows, layout, cache dtype, transport and
        agree_checks (the last two decide which collectives each call runs), and the same ``scale`` (each rank's
        bias would otherwise be scaled differently: other tokens than the reference's, silently)."""
        scale_bits = struct.unpack("<q", struct.pack("<d", self.shard_head.scale))[0]  # (the float64, bit for bit)
        config = torch.tensor([self.vocab_size, self.num_steps, self.max_rows,
                               CACHE_LAYOUTS.index(self.cache_layout), CACHE_DTYPES.index(self.cache_dtype),
                               self.replicated_head is not None, self.fallback_max_rows,
                               TRANSPORTS.index(_canonical(transport)), self.agree_checks, scale_bits],
                              dtype=torch.int64, device=flags_on)
        low, high = config.clone(), config.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(low, high):
            raise ValueError("group: ranks were built with different vocab_size, num_steps, max_rows, cache_layout, "
                             "cache_dtype, replicated_head_weight, fallback_max_rows, transport, agree_checks or "
                             f"scale (min {low.tolist()}, max {high.tolist()})")

    # ------------------------------------------------------------------ sampling
    def sample(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, *, draft_tokens=None,
               logits_cache=None, check_values: bool | None = None) -> DraftOutput:
        """Draw ``draft_tokens`` ``[R, N]`` (identical on every rank) and fill this rank's cache.

        Collective: every rank calls it with the same R and the same anchor/slots/positions/
        temperature/seeds (the batch size alone picks the path, so ranks never diverge). Each rank
        validates its arguments, then (``agree_checks``, the default) the ranks agree in one
        all-reduce: if any rank rejected its call, or the ranks' batch sizes differ, every rank
        raises the same ``ValueError`` (naming the argument and the first rank that rejected it)
        before any rank writes anything or enters the step's collective.

        base_logits : ``[R, N, V]`` (full; each rank reads its columns) or ``[R, N, V_shard]`` (this
            rank's columns), bf16/fp32, last stride 1. Above ``max_rows`` the full one is needed.
        anchor ``[R]``; idx_mapping, positions ``[R*N]`` (-1 = padding); temperature ``[S]`` fp32;
        seeds ``[S]`` int64 — as for :meth:`MarkovSampler.sample`.
        logits_cache : ``[S, N, V_shard]`` (``cache_layout="sharded"``) or ``[S, N, V]``
            (``"gathered"``) in ``cache_dtype``; allocated zero-filled when missing. Padding rows are
            never written.
        """
        if check_values is None:
            check_values = not (isinstance(base_logits, torch.Tensor) and base_logits.is_cuda
                                and torch.cuda.is_current_stream_capturing())
        error, prepared = None, None
        try:
            prepared = self._prepare(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                                     logits_cache, check_values)
        except Exception as caught:  # noqa: BLE001 - voted on, then raised on every rank
            error = caught
        rows = prepared[0].shape[0] if prepared is not None else -1
        self._agree("sample", error, rows)
        base_logits, draft_tokens, logits_cache = prepared
        rows = base_logits.shape[0]
        if rows == 0:
            return DraftOutput(draft_tokens, logits_cache)
        if rows > self.max_rows:
            self._sample_replicated(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                                    logits_cache)
            if check_values:
                self.check()
            return DraftOutput(draft_tokens, logits_cache)
        if base_logits.shape[-1] == self.vocab_size and self.shard_width != self.vocab_size:
            base_logits = base_logits[:, :, self.vocab_start:self.vocab_end]  # view, last stride 1
        self._sample_sharded(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                             logits_cache)
        return DraftOutput(draft_tokens, logits_cache)

    def check(self) -> None:
        """Collective: raise :class:`~dspark_markov.DeviceStatusError` on every rank if the replicated
        fallback sampler of any rank reported a device failure since the last check (see
        :meth:`MarkovSampler.check`). The sharded path has no device status of its own."""
        error = None
        try:
            if self._fallback is not None:
                self._fallback.check()
        except DeviceStatusError as caught:
            error = caught
        self._agree("check", error, 0)

    def _agree(self, what, error, rows) -> None:
        """One all-reduce (MIN) of ``[failing rank or world, R, -R]``; raise on every rank if needed."""
        if not self.agree_checks and what == "sample":
            if error is not None:
                raise error
            return
        agree_call(error, rows, self.group, self._flags_on, "base_logits: ranks were called with different batch sizes R")

    def _prepare(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache,
                 check_values):
        """This rank's checks (no collective); returns ``(base_logits, draft_tokens, logits_cache)``."""
        if not isinstance(base_logits, torch.Tensor) or base_logits.dim() != 3:
            raise ValueError("base_logits: expected a 3-D tensor [R, N, V] or [R, N, V_shard]")
        width = base_logits.shape[-1]
        if width not in (self.vocab_size, self.shard_width):
            raise ValueError(f"base_logits: expected last dimension V = {self.vocab_size} or this rank's shard "
                             f"width {self.shard_width}, got shape {tuple(base_logits.shape)}")
        proxy = SimpleNamespace(device=self.device, vocab_size=width, embed_vocab_size=self.shard_head.embed_vocab_size)
        dims = check_draft_inputs(proxy, base_logits, anchor, idx_mapping, positions, temperature, seeds,
                                  draft_tokens, None, check_values=check_values)
        if dims.steps != self.num_steps:
            raise ValueError(f"base_logits: expected N = {self.num_steps} steps (num_steps), got shape {tuple(base_logits.shape)}")
        cache_width = self.shard_width if self.cache_layout == "sharded" else self.vocab_size
        if logits_cache is None:
            logits_cache = torch.zeros(dims.slots, dims.steps, cache_width, dtype=self.cache_dtype, device=self.device)
        else:
            check_tensor("logits_cache", logits_cache, shape=(dims.slots, dims.steps, cache_width),
                         dtypes=(self.cache_dtype,), device=self.device, last_stride_one=True)
            check_cache_strides(logits_cache, dims.slots, dims.steps, cache_width)
        if dims.rows > self.max_rows:  # the replicated path's own checks, so that they are voted on too
            if self.replicated_head is None:
                raise ValueError(f"base_logits: expected at most max_rows = {self.max_rows} rows (no "
                                 f"replicated_head_weight for larger batches), got {dims.rows}")
            if dims.rows > self.fallback_max_rows:
                raise ValueError(f"base_logits: expected at most fallback_max_rows = {self.fallback_max_rows} rows, "
                                 f"got {dims.rows}")
            if width != self.vocab_size:
                raise ValueError(f"base_logits: batches above max_rows = {self.max_rows} run on replicated weights "
                                 f"and need the full [R, N, V = {self.vocab_size}] logits, got shape "
                                 f"{tuple(base_logits.shape)}")
            if self._fallback is None:  # built here, so that a design that cannot run on some rank is voted on
                try:
                    self._fallback = MarkovSampler(self.replicated_head, self.num_steps, self.fallback_max_rows,
                                                   cache_dtype=self.cache_dtype, method="gumbel",
                                                   impl=self.fallback_impl)
                except ValueError as error:  # (named by the argument that chose the design)
                    raise ValueError(f"fallback_impl: {error}") from error
        if draft_tokens is None:
            draft_tokens = torch.empty(dims.rows, dims.steps, dtype=torch.int64, device=self.device)
        return base_logits, draft_tokens, logits_cache

    def _sample_sharded(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                        logits_cache):
        rows, steps, width = base_logits.shape
        slots = idx_mapping.view(rows, steps)
        pos = positions.view(rows, steps)
        z_rows = self.z_rows[:rows]  # [R, N, ceil(V/world)], contiguous
        packed = self.packed[:rows]
        prev = anchor.long().clamp(0, self.shard_head.embed_vocab_size - 1)  # (as the kernels: check_values=False)
        for step in range(steps):
            padding, temp, seed, position = row_keys(slots[:, step], pos[:, step], temperature, seeds)
            z = z_rows[:, step, :width]  # [R, V_shard]
            _shard_step(self.shard_head, base_logits[:, step], prev, temp, seed, position, step, self.shard_tokens,
                        z, packed)
            if self.cache_layout == "sharded":
                live = ~padding
                logits_cache[slots[live, step].long(), step] = z[live]
            token = self.transport.exchange(packed, step)
            draft_tokens[:, step] = token
            prev = token
        if self.cache_layout == "gathered":
            self._gather_cache(z_rows, slots, logits_cache)

    def _gather_cache(self, z_rows, slots, logits_cache):
        """All-gather every rank's ``[R, N, V_shard]`` rows and write the full ``[S, N, V]`` cache."""
        rows = z_rows.shape[0]
        views = [self.z_gathered[peer, :rows] for peer in range(self.world)]  # each [R, N, ceil(V/world)]
        dist.all_gather(views, z_rows, group=self.group)
        row, step = (~padding_and_slot(slots, logits_cache.shape[0])[0]).nonzero(as_tuple=True)  # the live samples
        slot = slots[row, step].long()
        for peer, (start, end) in enumerate(self.bounds):
            logits_cache[slot, step, start:end] = views[peer][row, step, :end - start]

    def _sample_replicated(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                           logits_cache):
        rows = base_logits.shape[0]
        if self.replicated_head is None:
            raise ValueError(f"base_logits: expected at most max_rows = {self.max_rows} rows (no "
                             f"replicated_head_weight for larger batches), got {rows}")
        if rows > self.fallback_max_rows:
            raise ValueError(f"base_logits: expected at most fallback_max_rows = {self.fallback_max_rows} rows, got {rows}")
        if base_logits.shape[-1] != self.vocab_size:
            raise ValueError(f"base_logits: batches above max_rows = {self.max_rows} run on replicated weights and "
                             f"need the full [R, N, V = {self.vocab_size}] logits, got shape {tuple(base_logits.shape)}")
        if self.cache_layout == "gathered":
            self._fallback.sample(base_logits, anchor, idx_mapping, positions, temperature, seeds,
                                  draft_tokens=draft_tokens, logits_cache=logits_cache, check_values=False)
            return
        full = torch.zeros(logits_cache.shape[0], self.num_steps, self.vocab_size, dtype=self.cache_dtype,
                           device=self.device)
        full[:, :, self.vocab_start:self.vocab_end] = logits_cache
        self._fallback.sample(base_logits, anchor, idx_mapping, positions, temperature, seeds,
                              draft_tokens=draft_tokens, logits_cache=full, check_values=False)
        logits_cache.copy_(full[:, :, self.vocab_start:self.vocab_end])
