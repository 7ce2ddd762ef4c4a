"""The demo's ``--engine step``: the same speculative decoding as :mod:`dspark_markov.demo`, driven
through :class:`~dspark_markov.step.DSparkStep` (persistent buffers, optional CUDA graphs).

Each round, the requests that still need tokens are moved to the front of the step's padded batch
(a stable sort on the device, no host synchronisation), the step drafts ``N`` tokens for them
(block inputs, the backbone below, the Markov sampler), the target's logits of the ``N + 1``
verified positions are written into a persistent buffer, and the step verifies. Finished requests
become the step's padding rows (``num_reqs`` is a one-element device tensor, so a captured graph
replays with the current count) and emit nothing.

The backbone is a pure tensor function of the block inputs: the base logits of mask row ``i`` are
the stationary marginal's logs at that row's position phase, ``log mu[position % period]``; it
reads no input id (the anchor only enters through the Markov head), so drafter A (zero head) is the
block-parallel drafter without a Markov head and drafter B the same plus the fitted head.

With the reference implementations (the CPU default), the step engine emits exactly the tokens of
the functional engine (:func:`~dspark_markov.demo.generate.speculative_generate`): both draw every
sample from the same (slot, position) keys.
"""

from __future__ import annotations

import time

import torch

from ..step import DSparkStep
from .generate import GenerationResult


def marginal_backbone(log_mu: torch.Tensor, max_reqs: int, num_steps: int):
    """The demo drafter's backbone ``(input_ids, positions) -> base_logits``.

    Parameters
    ----------
    log_mu : ``[period, V]`` fp32, the per-phase log marginals.
    max_reqs, num_steps : the step's padded batch and ``N``.

    Returns a callable mapping ``input_ids``/``positions`` ``[max_reqs*(N+1)]`` int64 to
    ``[max_reqs, N, V]`` fp32 contiguous logits ``log_mu[positions of the mask rows % period]``.
    It ignores ``input_ids``; it only indexes tensors (no host synchronisation, no Python branch on
    values), so it is CUDA-graph capturable (its output is allocated from the graph's pool).
    """
    period = log_mu.shape[0]

    def backbone(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        mask_rows = positions.view(max_reqs, num_steps + 1)[:, 1:]  # [max_reqs, N]
        return log_mu[mask_rows % period]  # [max_reqs, N, V]

    return backbone


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepGenerator:
    """Speculative generation through one :class:`DSparkStep` (one per drafter).

    Parameters
    ----------
    target_logits_fn : ``(prev [R, N+1], position [R, N+1]) -> [R, N+1, V]`` fp32 target logits
        (temperature applied); called outside any graph, once per round.
    head : the drafter's :class:`~dspark_markov.MarkovHead` (its device is the run's device).
    backbone : ``(input_ids, positions) -> [max_reqs, N, V]`` (see :func:`marginal_backbone`).
    batch : requests ``B`` (= the step's ``max_reqs`` and slots; request ``b`` uses slot ``b``).
    num_steps : ``N = K``. temperature ``[B]`` fp32, seeds ``[B]`` int64: per slot.
    method, draft_method, cache_dtype : verification method, draft sampler, cache dtype.
    draft_impl, verify_impl, block_inputs_impl : the step's implementations (reference on CPU;
        ``"auto"``/``"triton"``/``"triton"`` on CUDA).
    graphs : capture draft and verify in two CUDA graphs (CUDA only; Triton verify and block
        inputs required) at the first :meth:`generate` and replay them every round.
    """

    def __init__(self, target_logits_fn, head, backbone, *, batch: int, num_steps: int, temperature, seeds,
                 method="standard", draft_method="gumbel", cache_dtype=torch.bfloat16, draft_impl="reference",
                 verify_impl="reference", block_inputs_impl="reference", graphs: bool = False):
        device = head.device
        if graphs and device.type != "cuda":
            raise ValueError(f"graphs: CUDA graphs need a CUDA device, got {device}")
        if graphs and (verify_impl != "triton" or block_inputs_impl != "triton"):
            raise ValueError("graphs: capture needs verify_impl='triton' and block_inputs_impl='triton'")
        self.device = device
        self.target_logits_fn = target_logits_fn
        self.batch, self.k = b, k = int(batch), int(num_steps)
        self.vocab = head.vocab_size
        self.temperature, self.seeds = temperature, seeds
        self.graphs = graphs
        self.step = DSparkStep(head, backbone, num_steps=k, max_reqs=b, num_slots=b, mask_token_id=0,
                               max_model_len=1 << 30, cache_dtype=cache_dtype, draft_method=draft_method,
                               draft_impl=draft_impl, verify_method=method, verify_impl=verify_impl,
                               block_inputs_impl=block_inputs_impl)
        if graphs and not getattr(self.step.sampler.backend, "GRAPH_SAFE", False):
            raise ValueError(f"draft_impl: {draft_impl!r} is not CUDA-graph capturable; pass graphs=False")
        # Eager rounds validate values on the CPU only: on CUDA that would synchronise every round.
        self._check = None if device.type == "cpu" else False

        def i64(*shape):
            return torch.zeros(shape, dtype=torch.int64, device=device)

        # Static inputs of the step, refilled every round (the captured graphs read these tensors).
        self.last_pos, self.bonus, self.req_slots = i64(b), i64(b), i64(b)  # [B] each, step row order
        self.num_reqs = i64(1)  # [1], live requests (the first rows)
        self.num_drafts = i64(b)  # [B]
        self.target = torch.zeros(b, k + 1, self.vocab, dtype=torch.float32, device=device)  # [B, K+1, V]
        self._draft_graph = self._verify_graph = None
        self._warm = False

    # ------------------------------------------------------------------ one round
    def _draft(self, check_values=None):
        return self.step.draft(self.last_pos, self.bonus, self.req_slots, self.temperature, self.seeds,
                               num_reqs=self.num_reqs, check_values=check_values)

    def _verify(self, check_values=None):
        return self.step.verify(self.target, self.num_drafts, self.temperature, self.seeds,
                                check_values=check_values)

    def _fill_target(self):
        """Target logits of the anchor + drafts rows, at the drafts' positions (outside the graphs)."""
        drafts = self.step.draft_tokens.clamp(0, self.vocab - 1)  # [B, K]; padded rows are not read
        prev = torch.cat([self.bonus[:, None], drafts], dim=1)  # [B, K+1]
        position = self.last_pos[:, None] + 1 + torch.arange(self.k + 1, device=self.device)  # [B, K+1]
        self.target.copy_(self.target_logits_fn(prev, position))

    def _capture(self):
        """Warm up (compiles every kernel) on a side stream, then capture draft and verify."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._draft(check_values=False)
            self._fill_target()
            self._verify(check_values=False)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self._draft_graph, self._verify_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._draft_graph):
            self._draft(check_values=False)
        with torch.cuda.graph(self._verify_graph):
            self._verify(check_values=False)
        torch.cuda.synchronize(self.device)

    def _round(self):
        if self._draft_graph is not None:
            self._draft_graph.replay()
            self._fill_target()
            self._verify_graph.replay()
        else:
            self._draft(self._check)
            self._fill_target()
            self._verify(self._check)
        return self.step.tokens, self.step.num_emitted  # [B, K+1], [B] in step row order

    # ------------------------------------------------------------------ the loop
    def _load(self, generated, last, start, length):
        """Live requests first (stable), written into the static inputs; returns the row order."""
        live = generated < length  # [B]
        order = torch.sort((~live).to(torch.int8), stable=True).indices  # [B], live requests first
        self.num_reqs.copy_(live.sum().reshape(1))
        self.last_pos.copy_((start + generated - 1)[order])  # the bonus token's position
        self.bonus.copy_(last[order])
        self.req_slots.copy_(order)  # request b uses slot b
        self.num_drafts.copy_(torch.clamp(length - generated - 1, 0, self.k)[order])
        return order, live

    def generate(self, anchor, start, length: int, progress=None):
        """Generate ``length`` tokens per request; returns ``(GenerationResult, seconds)``.

        anchor, start : ``[B]`` int64 (the token before the first generated one and its position).
        ``seconds`` is the wall clock of the decoding loop alone (after graph capture), with the
        device synchronised at both ends. Accepted/emitted means are over (request, round) pairs
        with ``num_drafts == K``, as :func:`~dspark_markov.demo.generate.speculative_generate` counts them.
        """
        device, b, k = self.device, self.batch, self.k
        anchor, start = anchor.to(device).long(), start.to(device).long()
        out = torch.full((b, length), -1, dtype=torch.int64, device=device)
        generated = torch.zeros(b, dtype=torch.int64, device=device)
        last = anchor.clone()
        if device.type == "cuda" and not self._warm:  # compile every kernel before the clock starts
            self._load(generated, last, start, length)
            if self.graphs:
                self._capture()
            else:
                self._round()
            self._warm = True
        accepted_sum = torch.zeros((), dtype=torch.int64, device=device)
        emitted_sum = torch.zeros_like(accepted_sum)
        full_rounds = torch.zeros_like(accepted_sum)
        rounds, done = 0, 0
        _sync(device)
        began = time.perf_counter()
        remaining = b
        while remaining > 0:
            order, live = self._load(generated, last, start, length)
            tokens_rows, count_rows = self._round()
            tokens = torch.empty_like(tokens_rows).index_copy_(0, order, tokens_rows)  # [B, K+1] request order
            count = torch.empty_like(count_rows).index_copy_(0, order, count_rows)  # [B]
            full = live & (torch.clamp(length - generated - 1, 0, k) == k)
            accepted_sum += torch.where(full, count - 1, 0).sum()
            emitted_sum += torch.where(full, count, 0).sum()
            full_rounds += full.sum()
            new = torch.clamp(torch.minimum(count, length - generated), min=0)  # [B]
            for j in range(k + 1):
                write = (j < new)
                column = torch.where(write, generated + j, 0)
                value = torch.where(write, tokens[:, j], out.gather(1, column[:, None])[:, 0])
                out.scatter_(1, column[:, None], value[:, None])
            last = torch.where(new > 0, tokens.gather(1, torch.clamp(new - 1, min=0)[:, None])[:, 0], last)
            generated = generated + new
            rounds += 1
            # One sync per round, which also carries the draft sampler's device status (a chain
            # barrier that timed out inside a replay), so a failure is raised at the round it happened.
            status = self.step.status
            flags = [(generated < length).sum(), generated.sum()] + ([status[0].long()] if status is not None else [])
            values = torch.stack(flags).tolist()
            remaining, total = values[0], values[1]
            if len(values) > 2 and values[2] != 0:
                self.step.check()  # raises DeviceStatusError
            if progress is not None:
                progress.update(total - done)
            done = total
        _sync(device)
        seconds = time.perf_counter() - began
        full = max(int(full_rounds), 1)
        result = GenerationResult(out, rounds, int(accepted_sum) / full, int(emitted_sum) / full)
        return result, seconds
