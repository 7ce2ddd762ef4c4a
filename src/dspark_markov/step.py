"""``DSparkStep``: one DSpark draft-and-verify step over persistent buffers (CUDA-graph capturable).

A step composes, in order:

``draft``
    1. :func:`~dspark_markov.block_inputs.prepare_block_inputs` writes the drafter's query block
       (``input_ids``/``positions`` ``[max_reqs*(N+1)]``) and the samples' layout
       (``sample_pos``/``sample_idx_mapping`` ``[max_reqs*N]``, ``is_padding``);
    2. the caller's ``backbone(input_ids, positions)`` returns ``base_logits`` ``[max_reqs, N, V]``;
    3. :class:`~dspark_markov.MarkovSampler` draws ``draft_tokens`` ``[max_reqs, N]`` and writes the
       logits cache ``[S, N, V]`` (anchors: the bonus tokens, 0 for padded requests).

``verify``
    1. optionally :func:`~dspark_markov.verify.filtering.top_k_top_p` on the target logits (in
       place);
    2. verification of the drafts (``"triton"``: the one-launch
       :class:`~dspark_markov.verify.triton_verify_stream.StreamVerifier`, or the torch reference),
       against the cache and keys of the last ``draft``.

Every buffer is allocated in ``__init__``. With Triton implementations and ``check_values=False``
(the default while a stream is capturing) neither method allocates nor synchronises, so each can
be captured in a CUDA graph once and replayed after refilling its input tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import registry
from .draft.sampler import MarkovSampler
from .validate import (INDEX_DTYPES, check_head, check_int, check_range, check_tensor, check_unique_slots,
                       check_vector)
from .verify.api import check_verify_inputs


class StepVerifyOutput(NamedTuple):
    tokens: torch.Tensor  # [max_reqs, N+1] int64, emitted tokens, -1 after the last one
    num_emitted: torch.Tensor  # [max_reqs] int64, accepted + 1 (0 for padded requests)


def _capturing(device: torch.device) -> bool:
    return registry.capturing(device)


class DSparkStep:
    """Persistent-buffer DSpark step: block inputs, backbone, Markov drafts, verification.

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` (defines ``V``, the device and the weight dtype).
    backbone : callable ``backbone(input_ids, positions) -> base_logits``; ``input_ids`` and
        ``positions`` are ``[max_reqs*(N+1)]`` int64 (request-major, the anchor then ``N`` mask
        rows), ``base_logits`` is ``[max_reqs, N, V]`` bf16/fp32 with last stride 1. It must be
        capturable itself if the step is captured.
    num_steps : ``N``, drafts per request. max_reqs : the padded batch of every call.
    num_slots : ``S``, request-state slots of the logits cache ``[S, N, V]``.
    mask_token_id, max_model_len : as :func:`~dspark_markov.block_inputs.prepare_block_inputs`.
    cache_dtype : ``torch.bfloat16`` (default) or ``torch.float32``.
    draft_method, draft_impl : :class:`~dspark_markov.MarkovSampler`'s ``method`` and ``impl``.
    verify_method : ``"standard"`` or ``"block"``. verify_impl, block_inputs_impl, filter_impl :
        ``"auto"`` (the default: ``"triton"`` on CUDA, the reference on the CPU;
        :mod:`dspark_markov.registry`; ``filter_impl="auto"`` follows ``top_k_top_p``'s ``auto``
        on every call: the cluster filter on sm_90 with top-k for a step of <= 30 rows, with top-p
        alone at any size, or for raw logits with ``target_temperature``), ``"triton"``, ``"cuda"``
        (the filter; for verify_impl the opt-in CUDA C++ verifier, standard method, sm_90:
        :mod:`dspark_markov.verify.cuda_verify`) or ``"reference"`` (the references allocate and
        are not capturable: capturing with one raises ``ValueError``).

    Attributes
    ----------
    input_ids, positions, is_padding : ``[max_reqs*(N+1)]``; sample_pos, sample_idx_mapping :
    ``[max_reqs*N]`` int64; anchor : ``[max_reqs]`` int64; draft_tokens : ``[max_reqs, N]`` int64;
    logits_cache : ``[S, N, V]``; req_slots, req_positions : ``[max_reqs]`` int64, each request's
    slot (-1 padded) and the position of its first draft, as the last ``draft`` laid them out.
    """

    def __init__(self, head, backbone, *, num_steps: int, max_reqs: int, num_slots: int, mask_token_id: int,
                 max_model_len: int, cache_dtype=torch.bfloat16, draft_method: str = "gumbel",
                 draft_impl: str = registry.DEFAULT_IMPL, verify_method: str = "standard",
                 verify_impl: str = registry.DEFAULT_IMPL, block_inputs_impl: str = registry.DEFAULT_IMPL,
                 filter_impl: str = registry.DEFAULT_IMPL):
        check_head(head)
        if getattr(head, "d2t_index", None) is not None:  # its caches are sized by head.vocab_size (V_d)
            raise ValueError("head: DSparkStep does not take a reduced draft vocabulary (d2t) yet; use MarkovSampler")
        if not callable(backbone):
            raise ValueError(f"backbone: expected a callable (input_ids, positions) -> base_logits, got {backbone!r}")
        num_steps, max_reqs, num_slots = (
            check_int(name, value, 1) for name, value in (("num_steps", num_steps), ("max_reqs", max_reqs),
                                                          ("num_slots", num_slots)))
        max_model_len = check_int("max_model_len", max_model_len, 1, 2**62)  # (positions are int64)
        mask_token_id = check_int("mask_token_id", mask_token_id, 0)
        verify_impl = registry.resolve("verify", verify_impl, head.device, "verify_impl")
        if verify_method not in ("standard", "block"):
            raise ValueError(f"verify_method: expected 'standard' or 'block', got {verify_method!r}")
        block_inputs_impl = registry.resolve("block_inputs", block_inputs_impl, head.device, "block_inputs_impl")
        self._filter_auto = filter_impl == registry.AUTO  # top_k_top_p's own choice per call (verify())
        filter_impl = registry.resolve("top_k_top_p", filter_impl, head.device, "filter_impl")
        self.head = head
        self.backbone = backbone
        self.num_steps = n = int(num_steps)
        self.max_reqs = r = int(max_reqs)
        self.num_slots = int(num_slots)
        self.vocab = head.vocab_size
        self.mask_token_id = int(mask_token_id)
        self.max_model_len = int(max_model_len)
        self.verify_method = verify_method
        self.verify_impl = verify_impl
        self.block_inputs_impl = block_inputs_impl
        self.filter_impl = filter_impl
        device = self.device = head.device
        self.sampler = MarkovSampler(head, n, r, cache_dtype=cache_dtype, method=draft_method, impl=draft_impl)
        self.verifier = None
        if verify_impl == "triton":
            from .verify.triton_verify_stream import StreamVerifier  # imports Triton

            self.verifier = StreamVerifier(r, n, self.vocab, device)
        elif verify_impl == "cuda":
            self.verifier = _cuda_verifier(r, n, self.vocab, device, verify_method)

        def i64(*shape, fill=0):
            return torch.full(shape, fill, dtype=torch.int64, device=device)

        self.input_ids, self.positions = i64(r * (n + 1)), i64(r * (n + 1))
        self.is_padding = torch.ones(r * (n + 1), dtype=torch.bool, device=device)
        self.sample_pos, self.sample_idx_mapping = i64(r * n), i64(r * n, fill=-1)
        self.anchor = i64(r)
        self.draft_tokens = i64(r, n)
        self.logits_cache = torch.zeros(self.num_slots, n, self.vocab, dtype=cache_dtype, device=device)
        self.req_slots, self.req_positions = i64(r, fill=-1), i64(r)
        self.tokens, self.num_emitted = i64(r, n + 1, fill=-1), i64(r)
        # verify(target_temperature=) with top_k / top_p: each target row's temperature (its request's slot; padding
        # requests 0: unscaled), [max_reqs*(N+1)], refilled per call without allocation
        self.row_slot, self.slot_clamped = i64(r * (n + 1)), i64(r)
        self.row_temperature = torch.zeros(r * (n + 1), dtype=torch.float32, device=device)
        self.live_b, self.live_f = torch.zeros(r, dtype=torch.bool, device=device), torch.zeros(r, device=device)

    def draft(self, last_pos, bonus_tokens, req_slots, temperature, seeds, *, num_reqs=None,
              check_values: bool | None = None) -> torch.Tensor:
        """Draft ``N`` tokens for each live request; returns :attr:`draft_tokens` ``[max_reqs, N]``.

        Parameters
        ----------
        last_pos, bonus_tokens, req_slots : ``[L]`` int32/int64 (``L <= max_reqs`` read), the
            bonus token's position, the bonus token (the Markov anchor) and the request's slot.
        temperature : ``[S]`` fp32, seeds : ``[S]`` int64, per slot (SPEC.md section 2).
        num_reqs : live requests (``None``: ``L``), an int or a one-element device tensor (read on
            the device, so a captured graph replays with the current count).
        check_values : validate by reading values back (synchronises); default: not while capturing.

        Also writes :attr:`logits_cache` rows of live requests and the request layout that
        :meth:`verify` reads. CUDA-graph safe with Triton implementations and no value checks.
        """
        from .block_inputs import prepare_block_inputs

        if check_values is None:
            check_values = not _capturing(self.device)
        n, r = self.num_steps, self.max_reqs
        registry.check_capturable("block_inputs", self.block_inputs_impl, self.device, argument="block_inputs_impl")
        # one entry per slot of the step's logits cache [num_slots, N, V] (else the sampler names that buffer)
        check_vector("temperature", temperature, length=self.num_slots, dtypes=(torch.float32,), device=self.device)
        check_vector("seeds", seeds, length=self.num_slots, dtypes=(torch.int64,), device=self.device)
        count = num_reqs
        if (check_values and isinstance(num_reqs, torch.Tensor) and num_reqs.numel() == 1
                and num_reqs.dtype in INDEX_DTYPES and num_reqs.device.type != "meta"):
            # (value checks synchronise anyway: read the device count, clamped as the kernels clamp it, so the
            # live requests' slots, positions and bonus tokens are checked under their own names here too)
            # (the slice below stops at L by itself)
            count = max(0, min(int(num_reqs.reshape(-1)[0]), self.max_reqs))
        if check_values and isinstance(req_slots, torch.Tensor) and isinstance(count, (int, type(None))):
            live = req_slots[: req_slots.shape[0] if count is None else count]
            # (checked under their own names here: the sampler sees them as idx_mapping and anchor)
            check_range("req_slots", live, -1, self.num_slots)
            if (isinstance(last_pos, torch.Tensor) and last_pos.shape == req_slots.shape
                    and last_pos.dtype in INDEX_DTYPES and last_pos.device == req_slots.device):
                # a live request's position is never negative (padding requests, slot -1, are not read); other
                # dtypes / shapes are named by prepare_block_inputs' own checks
                check_range("last_pos", last_pos[: live.shape[0]][live >= 0], 0, 2**63)
            check_unique_slots("req_slots", live.reshape(-1), what="requests")
            if isinstance(bonus_tokens, torch.Tensor) and bonus_tokens.shape == req_slots.shape:
                check_range("bonus_tokens", bonus_tokens[: live.shape[0]], 0, self.head.embed_vocab_size)
        prepare_block_inputs(last_pos, bonus_tokens, req_slots, num_steps=n, mask_token_id=self.mask_token_id,
                             max_model_len=self.max_model_len, input_ids=self.input_ids, positions=self.positions,
                             sample_pos=self.sample_pos, sample_idx_mapping=self.sample_idx_mapping,
                             is_padding=self.is_padding, num_reqs=num_reqs, impl=self.block_inputs_impl)
        base_logits = self.backbone(self.input_ids, self.positions)
        if not isinstance(base_logits, torch.Tensor) or tuple(base_logits.shape) != (r, n, self.vocab):
            shape = tuple(base_logits.shape) if isinstance(base_logits, torch.Tensor) else type(base_logits)
            raise ValueError(f"backbone: expected base_logits of shape {(r, n, self.vocab)}, got {shape}")
        # The anchor of each request is its query block's first input id (the bonus token; 0 if padded).
        self.anchor.copy_(self.input_ids.view(r, n + 1)[:, 0])
        self.req_slots.copy_(self.sample_idx_mapping.view(r, n)[:, 0])
        self.req_positions.copy_(self.sample_pos.view(r, n)[:, 0])
        self.sampler.sample(base_logits, self.anchor, self.sample_idx_mapping, self.sample_pos, temperature, seeds,
                            draft_tokens=self.draft_tokens, logits_cache=self.logits_cache,
                            check_values=check_values)
        return self.draft_tokens

    def check(self) -> None:
        """Raise :class:`~dspark_markov.DeviceStatusError` if a draft launch since the last check failed on
        the device (``chain``'s barrier timed out; see :meth:`MarkovSampler.check`).

        An eager :meth:`draft` checks by itself; after graph replays call this where the engine
        synchronises anyway (after reading :attr:`num_emitted`), or copy :attr:`status` and
        :attr:`verify_status` with it. Also raises if a Triton verification's bounded wait timed out
        (``StreamVerifier.check``).
        """
        self.sampler.check()
        if self.verifier is not None:
            self.verifier.check()

    @property
    def status(self):
        """The draft sampler's device status flag (``[1]`` int32, non-zero = failure) or ``None``."""
        return self.sampler.status

    @property
    def verify_status(self):
        """The Triton verifier's device status flag (``[1]`` int32, non-zero = a bounded wait timed out)
        or ``None`` (reference verification)."""
        return None if self.verifier is None else getattr(self.verifier, "status", None)

    def _row_temperatures(self, target_temperature):
        """``[max_reqs*(N+1)]`` fp32: each target row's slot temperature (0 for padding requests), in persistent
        buffers (no allocation: CUDA-graph safe)."""
        r, n = self.max_reqs, self.num_steps
        slots = target_temperature.shape[0]
        if slots == 0:  # every request is padding
            return self.row_temperature.zero_()
        # a slot outside [0, S) is padding (as in the kernels; without value checks it may reach here)
        torch.clamp(self.req_slots, min=0, max=slots - 1, out=self.slot_clamped)
        self.row_slot.view(r, n + 1).copy_(self.slot_clamped.view(r, 1).expand(r, n + 1))
        torch.index_select(target_temperature, 0, self.row_slot, out=self.row_temperature)
        torch.eq(self.req_slots, self.slot_clamped, out=self.live_b)
        self.live_f.copy_(self.live_b)
        self.row_temperature.view(r, n + 1).mul_(self.live_f.view(r, 1))
        return self.row_temperature

    def verify(self, target_logits, num_drafts, temperature, seeds, *, target_greedy=None, top_k=None, top_p=None,
               target_temperature=None, check_values: bool | None = None) -> StepVerifyOutput:
        """Verify the last :meth:`draft`'s tokens against the target (SPEC.md section 6).

        Parameters
        ----------
        target_logits : ``[max_reqs, N+1, V]`` fp32 (last stride 1), temperature applied; filtered
            in place when ``top_k``/``top_p`` are given.
        num_drafts : ``[max_reqs]`` int32/int64, drafts to verify per request (``<= N``).
        temperature : ``[S]`` fp32, seeds : ``[S]`` int64 (the draft's).
        target_greedy : optional ``[max_reqs]`` bool (default: greedy iff the slot's T == 0).
        top_k, top_p : optional filtering of the target rows before verification: a scalar, or a
            per-row tensor over the ``max_reqs*(N+1)`` rows of ``target_logits`` (request-major).
        target_temperature : optional ``[S]`` fp32 per slot: ``target_logits`` are RAW, divided by
            their request's slot temperature (IEEE ``z / T``, ``T == 0`` and padding requests
            unscaled) without a separate pass: inside verification (``verify_drafts``'
            ``target_temperature``), or, with ``top_k``/``top_p``, by the filter as it reads each
            row (``filter_impl="cuda"``, ``"auto"`` where the cluster filter runs, or ``"reference"``;
            the Triton filter cannot), which leaves
            ``target_logits`` divided and filtered for verification. Either way the tokens are
            those of passing the pre-divided logits (``verify.reference.scale_target``).

        Returns ``StepVerifyOutput(tokens [max_reqs, N+1], num_emitted [max_reqs])`` (views of
        persistent buffers with the Triton verifier). CUDA-graph safe with ``verify_impl="triton"``,
        a Triton filter and no value checks.
        """
        if check_values is None:
            check_values = not _capturing(self.device)
        n, r = self.num_steps, self.max_reqs
        # Shapes, dtypes and strides are checked on every call (no host sync); values only when asked.
        check_tensor("target_logits", target_logits, dim=3)  # (its shape first: the checks below name the
        if tuple(target_logits.shape) != (r, n + 1, self.vocab):  # step's own buffers for a mismatch)
            raise ValueError(f"target_logits: expected shape {(r, n + 1, self.vocab)}, "
                             f"got {tuple(target_logits.shape)}")
        check_verify_inputs(target_logits, self.draft_tokens, self.logits_cache, num_drafts, self.req_slots,
                            self.req_positions, temperature, seeds, target_greedy, check_values=check_values,
                            target_temperature=target_temperature)
        if top_k is not None or top_p is not None:
            if not target_logits.is_contiguous():
                raise ValueError("target_logits: expected a contiguous tensor when filtering (filtered in place)")
            from .verify.filtering import _auto_impl, top_k_top_p

            rows = target_logits.view(r * (n + 1), self.vocab)
            filter_impl = self.filter_impl
            # "auto": the cluster filter for a small step or raw rows, where it runs
            if self._filter_auto and _auto_impl(registry.AUTO, rows, target_temperature, top_k) == "cuda":
                filter_impl = "cuda"
            registry.check_capturable("top_k_top_p", filter_impl, self.device, argument="filter_impl")
            row_temperature = None
            if target_temperature is not None:  # the filter divides the raw rows; verification reads them divided
                if filter_impl == "triton":
                    raise ValueError("target_temperature: with top_k / top_p the filter divides the raw rows, which "
                                     "filter_impl 'triton' cannot: use filter_impl='cuda' (or 'reference')")
                row_temperature = self._row_temperatures(target_temperature)
                target_temperature = None
            top_k_top_p(rows, top_k, top_p, impl=filter_impl, temperature=row_temperature)
        if self.verifier is not None:
            tokens, count = self.verifier.run(target_logits, self.draft_tokens, self.logits_cache, num_drafts,
                                              self.req_slots, self.req_positions, temperature, seeds, target_greedy,
                                              method=self.verify_method, tokens=self.tokens,
                                              num_emitted=self.num_emitted, target_temperature=target_temperature)
            return StepVerifyOutput(tokens, count)
        registry.check_capturable("verify", self.verify_impl, self.device, argument="verify_impl")
        from .verify.api import verify_drafts

        out = verify_drafts(target_logits, self.draft_tokens, self.logits_cache, num_drafts, self.req_slots,
                            self.req_positions, temperature, seeds, target_greedy=target_greedy,
                            method=self.verify_method, impl="reference", check_values=False,
                            target_temperature=target_temperature)
        self.tokens.copy_(out.tokens)
        self.num_emitted.copy_(out.num_emitted)
        return StepVerifyOutput(self.tokens, self.num_emitted)


def _cuda_verifier(max_reqs, num_steps, vocab, device, verify_method):
    """``verify_impl="cuda"``: a persistent :class:`~dspark_markov.verify.cuda_verify.CudaVerifier` (CUDA-graph safe),
    or ``ValueError`` naming ``verify_impl`` where it cannot run (not CUDA, unavailable, the block method, K > 7,
    V not a multiple of 8)."""
    from .verify import cuda_verify  # noqa: PLC0415

    if torch.device(device).type != "cuda":
        raise ValueError(f"verify_impl: 'cuda' verifies on a CUDA device, the head is on {device}")
    why = cuda_verify.scope_reason(num_steps, vocab)
    if why is None and verify_method != "standard":
        why = f"verify_method {verify_method!r}: it runs the standard method only"
    if why is not None:
        raise ValueError(f"verify_impl: 'cuda' cannot run here: {why}; verify_impl='triton' can")
    return cuda_verify.CudaVerifier(max_reqs, num_steps, vocab, device)
