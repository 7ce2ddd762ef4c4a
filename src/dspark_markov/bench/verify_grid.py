"""``dspark-markov bench --verify``: time verification, top-k/top-p filtering and block inputs.

Kernels timed, per batch size ``B`` (``K = N`` drafts per request):

- ``verify_standard`` / ``verify_block``: one verification of ``B`` requests
  (:class:`~dspark_markov.verify.triton_verify_stream.StreamVerifier` for ``impl="triton"``, the
  torch reference :func:`~dspark_markov.verify.api.verify_drafts` for ``impl="reference"``), at
  T = 1 and at mixed T (0 / 0.6 / 1 per slot; T = 0 slots verify greedily), and on request
  (``temperatures=("0.6",)``) at T = 0.6 everywhere;
- ``verify_raw`` / ``verify_block_raw``: the same with the logits taken as raw (before
  temperature) and ``target_temperature`` = the slot's T, divided inside the kernel: the cost of
  verification including the temperature pass an engine would otherwise run first (the kernel
  skips the division where T is 0 or 1, which changes nothing: ``x / 1 = x``; T = 0.6 times it);
- ``filter_row`` / ``filter_split``: a :class:`~dspark_markov.verify.triton_filtering.TopKTopPFilter`
  on ``B (K+1)`` rows ``[B*(K+1), V]`` fp32, in place (each timed call or replay is preceded,
  untimed and before the L2 flush, by a copy of the pristine input into the filtered buffer),
  with the one-program-per-row layout and with the split-row layout (``chunks``), for every
  filter input kind (:data:`FILTER_INPUTS`: Gaussian N(0, 2^2); peaked, LLM-like: the Gaussian
  plus a head of 32 boosted tokens; bf16: the Gaussian rounded to bf16, many ties) and case
  (:data:`FILTER_CASES`: ``k = 50`` and ``p = 0.9`` per row, ``[B]`` tensors; ``p = 0.9`` alone);
- ``block_inputs``: :func:`~dspark_markov.block_inputs.prepare_block_inputs` into buffers of
  ``max_reqs = 256`` requests with ``num_reqs = B`` (a one-element device tensor, as a captured
  step uses it).

Inputs: random fp32 target logits ``[B, K+1, V]`` (N(0, 2^2)), a bf16 cache ``[S = B, N, V]`` of
random logits rounded once, uniformly random draft tokens, ``num_drafts = K`` everywhere, distinct
slots ``idx_mapping = arange(B)``, random positions and seeds. Random drafts are mostly rejected at
the first draft; the Triton verifier's work does not depend on where the rejection falls (its
statistics pass reads every row up to ``num_drafts``; the resampling pass reads one row).

Timing is the sampler benchmark's (:mod:`.harness`): on CUDA every kernel is called once eagerly
(checked), captured in a CUDA graph, and replayed after an L2 flush, round-robin over the kernels of
a batch size; the time is the median of the round medians and the spread their range. All Triton
paths here are graph capturable and allocate nothing per call (the Verifier, the block-input
kernel, and the filter, whose scratch lives in its ``TopKTopPFilter``); an in-place filter case
restores its input before each timed replay, untimed (``FilterRunner.prepare``). The torch
references are not timed on CUDA. On
the CPU calls are timed by ``perf_counter`` (no graphs, no L2 flush).

Minimal bytes (the floor a perfect design could reach at the measured read bandwidth):
verification reads the ``B (K+1) V`` fp32 target logits once and the ``K`` cache rows of every
request that is not greedy once (a T = 0 request accepts and emits by the target's argmax and reads
no cache row: a third of the mixed-T requests, the one request of a mixed batch of 1);
filtering reads and writes the ``B (K+1) V`` fp32 logits once each; block inputs write their five
outputs (``max_reqs (N+1)`` int64 ids and positions and bools, ``max_reqs N`` int64 sample
positions and slots).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import sys
from pathlib import Path

import torch

from . import harness, report, roofline

KERNELS = ("verify_standard", "verify_block", "verify_raw", "verify_block_raw", "filter_row", "filter_split",
           "block_inputs")
# "cuda": the cluster-resident filter (filter_row; verify/cuda_filtering.py) and the persistent-warp verifier
# (verify_standard / verify_raw; verify/cuda_verify.py)
IMPLS = ("triton", "reference", "cuda")
TEMPERATURE_MODES = ("1", "mixed")
EXTRA_TEMPERATURE_MODES = ("0.6",)  # on request: T = 0.6 at every slot (the raw modes divide every target value)
MIXED_TEMPERATURES = (0.0, 0.6, 1.0)  # slot s gets MIXED_TEMPERATURES[s % 3]
VERIFY_METHODS = {"verify_standard": "standard", "verify_block": "block", "verify_raw": "standard",
                  "verify_block_raw": "block"}
RAW_KERNELS = ("verify_raw", "verify_block_raw")  # raw target logits + the per-slot T, divided in the kernel
TOP_K = 50
TOP_P = 0.9
FILTER_INPUTS = ("gaussian", "peaked", "bf16")
FILTER_CASES = ("k+p", "p")  # k = top_k and p = top_p per row; p = top_p alone

RECORD_FIELDS = ("kernel", "impl", "rows", "temperature", "inputs", "layout", "work_rows", "status", "time_us", "time_us_low",
                 "time_us_high", "eager_us", "timing", "minimal_bytes", "floor_us", "bandwidth_fraction",
                 "graph_output_match", "reason")
CONFIG_FIELDS = ("device", "vocab", "steps", "cache_dtype", "max_reqs", "top_k", "top_p", "rounds", "replays",
                 "eager_calls", "seed")


@dataclasses.dataclass(frozen=True)
class VerifyBenchConfig:
    """Shape and timing of a ``--verify`` run; ``steps`` is both ``K`` (drafts verified) and ``N``."""

    device: str = "cuda"
    vocab: int = 129_280
    steps: int = 5
    rows: tuple = (1, 16, 32, 64, 128, 253)
    kernels: tuple = KERNELS
    impls: tuple = ("triton",)
    temperatures: tuple = TEMPERATURE_MODES
    filter_inputs: tuple = FILTER_INPUTS
    filter_cases: tuple = FILTER_CASES
    cache_dtype: torch.dtype = torch.bfloat16
    max_reqs: int = 256
    top_k: int = TOP_K
    top_p: float = TOP_P
    rounds: int = 5
    replays: int = 30
    eager_calls: int = 10
    seed: int = 2026
    cuda_filter_flags: int | None = None  # impl "cuda": cuda_filtering.FLAG_* options (None: its defaults)

    def __post_init__(self):
        harness.check_config(self, ("vocab", "steps", "max_reqs", "rounds", "replays", "eager_calls"))
        if max(self.rows) > self.max_reqs:
            raise ValueError(f"rows: expected at most max_reqs = {self.max_reqs} requests, got {max(self.rows)}")
        for name, values, known in (("kernels", self.kernels, KERNELS), ("impls", self.impls, IMPLS),
                                    ("temperatures", self.temperatures, TEMPERATURE_MODES + EXTRA_TEMPERATURE_MODES),
                                    ("filter_inputs", self.filter_inputs, FILTER_INPUTS),
                                    ("filter_cases", self.filter_cases, FILTER_CASES)):
            if not values or any(value not in known for value in values):
                raise ValueError(f"{name}: expected names among {', '.join(known)}, got {values}")
        if self.cache_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"cache_dtype: expected torch.bfloat16 or torch.float32, got {self.cache_dtype}")
        if not 0.0 <= float(self.top_p) <= 1.0:
            raise ValueError(f"top_p: expected a value in [0, 1], got {self.top_p}")


def cpu_config(**overrides) -> VerifyBenchConfig:
    """The small ``--device cpu`` run: V = 2048, rows {1, 4}, the torch references (plus the Triton
    kernels under ``TRITON_INTERPRET=1``), timed by ``perf_counter``."""
    impls = ("reference",)
    if os.environ.get("TRITON_INTERPRET") == "1":
        impls = ("triton",) + impls
    values = dict(device="cpu", vocab=2048, rows=(1, 4), impls=impls, rounds=3, replays=5)
    values.update(overrides)
    return VerifyBenchConfig(**values)


# ----------------------------------------------------------------------------------------------
# Bytes model


def _positive(**values):
    for name, value in values.items():
        if isinstance(value, bool) or int(value) < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value}")


def verify_bytes(rows: int, drafts: int, vocab: int, *, cache_bytes: int = 2, greedy: int = 0) -> int:
    """Minimal bytes of one verification: target logits ``[B, K+1, V]`` fp32 read once plus the
    ``K`` cache rows of each of the ``B - greedy`` non-greedy requests read once (a greedy, T = 0,
    request needs only the target's argmax; the outputs, ``B (K+2)`` int64, are left out)."""
    _positive(rows=rows, drafts=drafts, vocab=vocab)
    if int(cache_bytes) not in (2, 4):
        raise ValueError(f"cache_bytes: expected 2 (bf16) or 4 (fp32), got {cache_bytes}")
    if isinstance(greedy, bool) or not 0 <= int(greedy) <= int(rows):
        raise ValueError(f"greedy: expected an integer in [0, rows = {rows}], got {greedy}")
    target = int(rows) * (int(drafts) + 1) * 4
    cache = (int(rows) - int(greedy)) * int(drafts) * int(cache_bytes)
    return int(vocab) * (target + cache)


def greedy_requests(rows: int, mode: str) -> int:
    """How many of ``rows`` requests (slot ``b`` for request ``b``) verify greedily (T = 0) in temperature ``mode``."""
    if mode != "mixed":
        return 0
    return sum(1 for b in range(int(rows)) if MIXED_TEMPERATURES[b % len(MIXED_TEMPERATURES)] == 0.0)


def filter_bytes(rows: int, vocab: int) -> int:
    """Minimal bytes of top-k/top-p over ``[rows, V]`` fp32 logits: read once, written once."""
    _positive(rows=rows, vocab=vocab)
    return 2 * int(rows) * int(vocab) * 4


def block_inputs_bytes(max_reqs: int, steps: int, *, id_bytes: int = 8) -> int:
    """Bytes of the block-input outputs: ``input_ids``/``positions`` (``id_bytes`` each) and
    ``is_padding`` (1 byte) over ``max_reqs (N+1)`` entries, ``sample_pos``/``sample_idx_mapping``
    (int64) over ``max_reqs N`` (the ``3 num_reqs`` inputs read are left out)."""
    _positive(max_reqs=max_reqs, steps=steps)
    if int(id_bytes) not in (4, 8):
        raise ValueError(f"id_bytes: expected 4 or 8, got {id_bytes}")
    return int(max_reqs) * ((int(steps) + 1) * (2 * int(id_bytes) + 1) + 16 * int(steps))


def kernel_bytes(config: VerifyBenchConfig, kernel: str, rows: int, mode: str = "1") -> tuple:
    """``(work_rows, minimal bytes)`` of ``kernel`` at ``rows`` requests (a verification's in temperature ``mode``:
    its greedy requests read no cache row)."""
    k = config.steps
    if kernel in VERIFY_METHODS:
        cache_bytes = torch.empty((), dtype=config.cache_dtype).element_size()
        return rows, verify_bytes(rows, k, config.vocab, cache_bytes=cache_bytes, greedy=greedy_requests(rows, mode))
    if kernel.startswith("filter_"):
        return rows * (k + 1), filter_bytes(rows * (k + 1), config.vocab)
    if kernel == "block_inputs":
        return config.max_reqs, block_inputs_bytes(config.max_reqs, config.steps)
    raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


# ----------------------------------------------------------------------------------------------
# Inputs and runners


class SharedInputs:
    """Buffers for the largest batch; a batch of ``B`` requests uses their first ``B`` entries."""

    def __init__(self, config: VerifyBenchConfig):
        device, k, vocab = config.device, config.steps, config.vocab
        batch = max(config.rows)
        generator = torch.Generator(device=device).manual_seed(config.seed)
        self.generator = generator
        self.target = torch.randn(batch, k + 1, vocab, generator=generator, device=device) * 2.0  # [B, K+1, V] fp32
        cache = torch.randn(batch, k, vocab, generator=generator, device=device) * 2.0
        self.cache = cache.to(config.cache_dtype)  # [S = B, N, V]
        del cache
        self.filtered = torch.empty(batch * (k + 1), vocab, dtype=torch.float32, device=device)  # [B*(K+1), V]
        self.drafts = torch.randint(0, vocab, (batch, k), generator=generator, device=device)  # [B, K]
        self.positions = torch.randint(1, 1 << 20, (batch,), generator=generator, device=device)  # [B]
        self.seeds = torch.randint(-(1 << 62), 1 << 62, (batch,), generator=generator, device=device)  # [S]
        self._filter_inputs = {}

    def filter_input(self, kind: str) -> torch.Tensor:
        """``[batch*(K+1), V]`` fp32 filter logits of input ``kind`` (built once, from the targets)."""
        if kind not in self._filter_inputs:
            gaussian = self.target.view(-1, self.target.shape[-1])
            self._filter_inputs[kind] = filter_logits(kind, gaussian, self.generator)
        return self._filter_inputs[kind]


def mixed_temperatures(slots: int, device) -> torch.Tensor:
    """``[slots]`` fp32 draft temperatures of the mixed mode: slot ``s`` gets ``MIXED_TEMPERATURES[s % 3]``."""
    table = torch.tensor(MIXED_TEMPERATURES, dtype=torch.float32, device=device)
    return table[torch.arange(slots, device=device) % len(MIXED_TEMPERATURES)]


def standard_args(shared: "SharedInputs", batch: int, temperature: torch.Tensor) -> tuple:
    """The positional inputs of a ``verify_drafts`` call on the first ``batch`` requests of ``shared`` (``K`` drafts
    each, slot ``b`` for request ``b``), as ``VerifyRunner`` builds them; ``temperature`` ``[batch]`` fp32."""
    k, device = shared.drafts.shape[1], shared.drafts.device
    return (shared.target[:batch], shared.drafts[:batch], shared.cache[:batch],
            torch.full((batch,), k, dtype=torch.int64, device=device), torch.arange(batch, device=device),
            shared.positions[:batch], temperature, shared.seeds[:batch])


class Runner:
    """One kernel set up on one batch size: ``call()`` (eager), ``outputs()``, and on CUDA a graph.

    Raises ``ValueError`` when the kernel or implementation is not available here.
    """

    layout = "-"

    def __init__(self, kernel: str, impl: str, mode: str, rows: int, shared: SharedInputs,
                 config: VerifyBenchConfig):
        cuda = config.device == "cuda"
        if impl == "cuda" and (kernel not in ("filter_row", "verify_standard", "verify_raw") or not cuda):
            raise ValueError("impls: 'cuda' is the CUDA top-k / top-p filter (kernel filter_row) and the CUDA "
                             "verifier (verify_standard, verify_raw), on a CUDA device")
        if cuda and impl not in ("triton", "cuda"):
            raise ValueError(f"impls: {impl!r} allocates per call (not CUDA-graph safe); timed on the CPU only")
        if not cuda and impl == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("impls: 'triton' needs a GPU, or TRITON_INTERPRET=1 for the CPU interpreter")
        self.kernel, self.impl, self.mode, self.rows, self.config = kernel, impl, mode, rows, config
        self.setup(shared)
        self.call(first=True)
        self.graph = None
        self.graph_output_match = None
        if cuda:  # same inputs and keys: a replay must write exactly what the eager call wrote
            self.graph, self.graph_output_match = harness.capture_checked(self.call, self.outputs, self.prepare)

    def setup(self, shared):  # pragma: no cover - overridden
        raise NotImplementedError

    def prepare(self):
        """Restore the inputs an in-place run overwrote (untimed, before each timed call); none here."""

    def call(self, first: bool = False):  # pragma: no cover - overridden
        raise NotImplementedError

    def outputs(self) -> list:  # pragma: no cover - overridden
        raise NotImplementedError


class VerifyRunner(Runner):
    def setup(self, shared):
        config, b, k = self.config, self.rows, self.config.steps
        device = config.device
        self.method = VERIFY_METHODS[self.kernel]
        self.target = shared.target[:b]  # [B, K+1, V] fp32
        self.cache = shared.cache[:b]  # [S = B, N, V]
        self.drafts = shared.drafts[:b]  # [B, K]
        self.num_drafts = torch.full((b,), k, dtype=torch.int64, device=device)  # [B]
        self.idx_mapping = torch.arange(b, device=device)  # [B], distinct slots
        self.positions = shared.positions[:b]  # [B]
        if self.mode == "1":
            self.temperature = torch.ones(b, dtype=torch.float32, device=device)  # [S]
        elif self.mode == "0.6":
            self.temperature = torch.full((b,), 0.6, dtype=torch.float32, device=device)  # [S]
        else:
            self.temperature = mixed_temperatures(b, device)
        self.seeds = shared.seeds[:b]  # [S]
        self.tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=device)  # [B, K+1]
        self.num_emitted = torch.zeros(b, dtype=torch.int64, device=device)  # [B]
        # verify_raw / verify_block_raw: the same logits taken as RAW, divided by the slot's T inside.
        self.target_temperature = self.temperature if self.kernel in RAW_KERNELS else None
        self.verifier = None
        if self.impl == "triton":
            from ..verify.triton_verify_stream import StreamVerifier

            self.verifier = StreamVerifier(b, k, config.vocab, device)
            lay = self.verifier.layout(b, self.method, raw=self.kernel in RAW_KERNELS)  # (raw: its own registers)
            self.layout = f"t1={lay.t1} t2={lay.t2} lag={lay.lag}"
        elif self.impl == "cuda":  # the persistent-warp CUDA C++ verifier (standard method; verify/cuda_verify.py)
            from ..verify.cuda_verify import CudaVerifier

            self.verifier = CudaVerifier(b, k, config.vocab, device)
            lag, iters, mult = self.verifier.schedule_of(b)
            self.layout = f"lag={lag} emit_iters={iters} piece_mult={mult}"

    def _args(self):
        return (self.target, self.drafts, self.cache, self.num_drafts, self.idx_mapping, self.positions,
                self.temperature, self.seeds)

    def call(self, first: bool = False):
        if first:
            from ..verify.api import check_verify_inputs

            check_verify_inputs(*self._args(), None, check_values=True, target_temperature=self.target_temperature)
        if self.verifier is not None:
            self.verifier.run(*self._args(), method=self.method, target_temperature=self.target_temperature,
                              tokens=self.tokens, num_emitted=self.num_emitted)
            if first:
                self.verifier.check()
        else:
            from ..verify.api import verify_drafts

            out = verify_drafts(*self._args(), method=self.method, impl="reference", check_values=False,
                                target_temperature=self.target_temperature)
            self.tokens.copy_(out.tokens)
            self.num_emitted.copy_(out.num_emitted)
        if first:
            counts = self.num_emitted
            if bool((counts < 1).any()) or bool((counts > self.config.steps + 1).any()):
                raise RuntimeError(f"{self.kernel} emitted counts outside [1, K+1]: {counts.tolist()}")
            emitted = self.tokens[:, 0]
            if bool((emitted < 0).any()) or bool((emitted >= self.config.vocab).any()):
                raise RuntimeError(f"{self.kernel} emitted a token outside [0, {self.config.vocab})")

    def outputs(self):
        return [self.tokens, self.num_emitted]


def split_chunks(rows: int, vocab: int, device) -> tuple:
    """``(block, chunks)`` of the forced split-row filter layout: the filter's own default where it
    splits (about four programs per SM on CUDA: what ``top_k_top_p`` launches), else two programs
    per row."""
    from ..verify import triton_filtering

    device = torch.device(device)
    block, chunks = triton_filtering.default_layout(rows, vocab, device)
    blocks = -(-vocab // block)
    if blocks < 2:
        raise ValueError(f"kernels: filter_split needs V >= 2 blocks of {block}, got V = {vocab}")
    return block, min(max(chunks, 2), blocks)


class FilterRunner(Runner):
    def setup(self, shared):
        config, k = self.config, self.config.steps
        device = config.device
        work = self.rows * (k + 1)
        inputs, case = self.mode.split(" ")
        self.logits = shared.filter_input(inputs)[:work]  # [B*(K+1), V] fp32, read only (the pristine input)
        self.out = shared.filtered[:work]  # [B*(K+1), V] fp32: restored from logits, then filtered in place
        self.k = None
        if case == "k+p":
            self.k = torch.full((work,), config.top_k, dtype=torch.int64, device=device)  # [B*(K+1)]
        self.p = torch.full((work,), config.top_p, dtype=torch.float32, device=device)  # [B*(K+1)]
        self.block = self.chunks = None
        if self.kernel == "filter_split":
            if self.impl != "triton":
                raise ValueError("kernels: filter_split is a layout of the Triton filter (the reference sorts)")
            self.block, self.chunks = split_chunks(work, config.vocab, device)
            self.layout = f"split x{self.chunks}"
        elif self.impl == "cuda":
            from ..verify import cuda_filtering

            self.layout = f"cluster x{cuda_filtering.CLUSTER}"  # (the blocks per row of this call once the filter exists)
        else:
            self.layout = "row" if self.impl == "triton" else "sort"
            if self.impl == "triton":
                from ..verify import triton_filtering

                self.block = triton_filtering.GPU_BLOCK if device == "cuda" else triton_filtering.CPU_BLOCK
                self.chunks = 1
        self.filter = None
        if self.impl == "triton":
            from ..verify.triton_filtering import TopKTopPFilter

            self.filter = TopKTopPFilter(work, config.vocab, device, block=self.block, chunks=self.chunks)
        elif self.impl == "cuda":  # ValueError (the record says n/a and why) unless it can run and is opted in
            from ..verify.cuda_filtering import CudaTopKTopPFilter

            self.filter = CudaTopKTopPFilter(work, config.vocab, device, flags=config.cuda_filter_flags)
            cluster = self.filter.launch_plan(self.out, self.k)[2]  # (FLAG_L2_FIT: 5 to 8 blocks by batch)
            flags = config.cuda_filter_flags
            self.layout = f"cluster x{cluster}" + ("" if flags is None else f" f{flags}")

    def prepare(self):
        self.out.copy_(self.logits)

    def call(self, first: bool = False):
        """One in-place filter of ``out`` (the caller restores it first: :meth:`prepare`)."""
        if first:
            self.prepare()
        if self.impl == "reference":
            from ..verify.filtering import top_k_top_p

            top_k_top_p(self.out, self.k, self.p, impl="reference", out=self.out)
        else:
            if first:  # the public function's argument checks, once
                from ..verify.filtering import _check

                _check(self.out, self.k, self.p, "triton", self.out)
            self.filter.filter(self.out, self.k, self.p, self.out)
        if first:
            from ..verify.filtering import top_k_top_p_reference

            rows = self.logits.shape[0]
            k = torch.zeros(rows, dtype=torch.int64, device=self.logits.device) if self.k is None else self.k
            keep = top_k_top_p_reference(self.logits, k, self.p)
            expected = torch.where(keep, self.logits, torch.full((), float("-inf"), device=self.logits.device))
            if not torch.equal(self.out, expected):
                raise RuntimeError(f"{self.kernel} ({self.impl}) disagrees with top_k_top_p_reference")

    def outputs(self):
        return [self.out]


class BlockInputsRunner(Runner):
    def setup(self, shared):
        config, n, r = self.config, self.config.steps, self.config.max_reqs
        device = config.device
        generator = shared.generator
        self.last_pos = torch.randint(0, 1 << 20, (r,), generator=generator, device=device)  # [max_reqs]
        self.bonus = torch.randint(0, config.vocab, (r,), generator=generator, device=device)  # [max_reqs]
        self.req_slots = torch.arange(r, device=device)  # [max_reqs]
        self.num_reqs = torch.full((1,), self.rows, dtype=torch.int64, device=device)  # [1], read by the kernel
        self.input_ids = torch.zeros(r * (n + 1), dtype=torch.int64, device=device)  # [max_reqs*(N+1)]
        self.positions = torch.zeros(r * (n + 1), dtype=torch.int64, device=device)  # [max_reqs*(N+1)]
        self.is_padding = torch.zeros(r * (n + 1), dtype=torch.bool, device=device)  # [max_reqs*(N+1)]
        self.sample_pos = torch.zeros(r * n, dtype=torch.int64, device=device)  # [max_reqs*N]
        self.mapping = torch.zeros(r * n, dtype=torch.int64, device=device)  # [max_reqs*N]

    def call(self, first: bool = False):
        from ..block_inputs import prepare_block_inputs

        prepare_block_inputs(self.last_pos, self.bonus, self.req_slots, num_steps=self.config.steps,
                             mask_token_id=self.config.vocab - 1, max_model_len=1 << 21, input_ids=self.input_ids,
                             positions=self.positions, sample_pos=self.sample_pos,
                             sample_idx_mapping=self.mapping, is_padding=self.is_padding, num_reqs=self.num_reqs,
                             impl=self.impl)
        if first and int(self.is_padding.view(self.config.max_reqs, -1)[:, 0].logical_not().sum()) != self.rows:
            raise RuntimeError(f"block_inputs ({self.impl}) did not mark exactly {self.rows} live requests")

    def outputs(self):
        return [self.input_ids, self.positions, self.is_padding, self.sample_pos, self.mapping]


def _runner_class(kernel):
    if kernel in VERIFY_METHODS:
        return VerifyRunner
    return FilterRunner if kernel.startswith("filter_") else BlockInputsRunner


# ----------------------------------------------------------------------------------------------
# The grid


def _record(config: VerifyBenchConfig, kernel: str, impl: str, rows: int, mode: str) -> dict:
    work_rows, nbytes = kernel_bytes(config, kernel, rows, mode)
    filtering = kernel.startswith("filter_")
    return {"kernel": kernel, "impl": impl, "rows": rows, "temperature": "-" if filtering else mode,
            "inputs": mode if filtering else "-", "layout": "-",
            "work_rows": work_rows, "status": "ok", "time_us": None, "time_us_low": None, "time_us_high": None,
            "eager_us": None, "timing": harness.graph_timing_label() if config.device == "cuda" else "host",
            "minimal_bytes": nbytes, "floor_us": None, "bandwidth_fraction": None, "graph_output_match": None,
            "reason": ""}


def _cases(config: VerifyBenchConfig) -> list:
    """``(kernel, impl, mode)`` of one batch size: the temperature mode of a verification, the
    ``"<input kind> <case>"`` of a filter (:func:`filter_modes`), ``"-"`` for block inputs."""
    cases = []
    for kernel in config.kernels:
        if kernel in VERIFY_METHODS:
            modes = config.temperatures
        elif kernel.startswith("filter_"):
            modes = filter_modes(config)
        else:
            modes = ("-",)
        for impl in config.impls:
            if kernel == "filter_split" and impl != "triton":
                continue  # a layout of the Triton filter only
            if impl == "cuda" and VERIFY_METHODS.get(kernel) == "block":
                continue  # the CUDA verifier runs the standard method only
            cases += [(kernel, impl, mode) for mode in modes]
    return cases


def filter_modes(config: VerifyBenchConfig) -> tuple:
    """``"<input kind> <case>"`` for every filter input kind and case of ``config``."""
    return tuple(f"{inputs} {case}" for case in config.filter_cases for inputs in config.filter_inputs)


def filter_logits(kind: str, gaussian: torch.Tensor, generator=None) -> torch.Tensor:
    """The filter input ``kind`` (:data:`FILTER_INPUTS`) made from N(0, 2^2) logits ``gaussian [R, V]``.

    ``peaked`` (LLM-like: a few tokens hold most of the mass) adds ``14 - 2.5 ln(1 + r)`` to 32
    random tokens ``r = 0..31`` of each row; ``bf16`` rounds to bf16 (runs of ties).
    """
    if kind == "gaussian":
        return gaussian
    if kind == "bf16":
        return gaussian.to(torch.bfloat16).to(torch.float32)
    if kind == "peaked":
        rows, vocab = gaussian.shape
        head = torch.rand(rows, vocab, generator=generator, device=gaussian.device).topk(32, dim=1).indices
        boost = 14.0 - 2.5 * torch.log1p(torch.arange(32, device=gaussian.device, dtype=torch.float32))
        return gaussian.clone().scatter_add_(1, head, boost.expand(rows, 32).contiguous())
    raise ValueError(f"kind: expected one of {', '.join(FILTER_INPUTS)}, got {kind!r}")


def _set_up(key, rows, shared, config, record):
    kernel, impl, mode = key
    try:
        runner = _runner_class(kernel)(kernel, impl, mode, rows, shared, config)
    except ValueError as error:
        record.update(status="n/a", reason=str(error))
        return None
    except Exception as error:  # noqa: BLE001 - one broken kernel must not lose the whole run
        record.update(status="error", reason=f"{type(error).__name__}: {error}")
        print(f"warning: {kernel} ({impl}) at {rows} rows, T={mode}: {record['reason']}", file=sys.stderr)
        return None
    record["layout"] = runner.layout
    record["graph_output_match"] = runner.graph_output_match
    if runner.graph_output_match is False:
        print(f"warning: {kernel} ({impl}) at {rows} rows: the graph replay wrote other outputs than the eager call",
              file=sys.stderr)
    return runner


def _time_rows(config, rows, shared, flush, bar) -> list:
    """Set up every kernel at one batch size, then time them round-robin; the records."""
    records = {key: _record(config, key[0], key[1], rows, key[2]) for key in _cases(config)}
    return harness.time_cases(
        records, lambda key, record: _set_up(key, rows, shared, config, record),
        lambda key: f"{key[0]} ({key[1]}) at {rows} rows", rounds=config.rounds, replays=config.replays,
        eager_calls=config.eager_calls, cuda=config.device == "cuda", flush=flush, bar=bar)


def run_grid(config: VerifyBenchConfig, bandwidth: roofline.Bandwidth, *, progress: bool = True) -> list:
    """Time every (rows, kernel, impl, temperature mode) of ``config``; one dict per combination
    (fields :data:`RECORD_FIELDS`; ``bandwidth_fraction`` against ``bandwidth.read_gbps``)."""
    from .grid import _NoBar

    shared = SharedInputs(config)
    flush = harness.L2Flusher(torch.device(config.device)) if config.device == "cuda" else None
    per_rows = len(_cases(config))
    if progress:  # tqdm only when a bar is shown (as bench.grid)
        from tqdm import tqdm

        bar = tqdm(total=len(config.rows) * per_rows * (1 + config.rounds), file=sys.stderr,
                   desc="bench --verify", unit="step")
    else:
        bar = _NoBar()
    records = []
    for rows in config.rows:
        gc.collect()  # the previous size's runners (each holds its graph, which holds its call: a cycle)
        try:
            records += _time_rows(config, rows, shared, flush, bar)
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: keep the other batch sizes
            print(f"warning: {rows} rows failed: {type(error).__name__}: {error}", file=sys.stderr)
            for kernel, impl, mode in _cases(config):
                record = _record(config, kernel, impl, rows, mode)
                record.update(status="error", reason=f"{type(error).__name__}: {error}")
                records.append(record)
    bar.close()
    add_derived(records, bandwidth)
    return records


def add_derived(records: list, bandwidth: roofline.Bandwidth) -> None:
    """Fill ``floor_us`` and ``bandwidth_fraction`` of every record in place."""
    for record in records:
        record["floor_us"] = roofline.floor_us(record["minimal_bytes"], bandwidth.read_gbps)
        if record["time_us"] is not None:
            record["bandwidth_fraction"] = record["floor_us"] / record["time_us"]


# ----------------------------------------------------------------------------------------------
# Reports


HEADER = ["kernel", "impl", "rows", "T / inputs", "layout", "time us (round range)", "eager us", "min MB", "floor us",
          "% read BW"]


def _cells(record) -> list:
    if record["status"] != "ok":
        time_cell = record["status"]
    else:
        time_cell = f"{record['time_us']:.1f} ({record['time_us_low']:.1f}-{record['time_us_high']:.1f})"
    fraction = record["bandwidth_fraction"]
    eager = record["eager_us"]
    mode = record["temperature"] if record.get("inputs", "-") == "-" else record["inputs"]
    return [record["kernel"], record["impl"], str(record["rows"]), mode, record["layout"], time_cell,
            "-" if eager is None else f"{eager:.1f}", f"{record['minimal_bytes'] / 1e6:.3f}",
            f"{record['floor_us']:.2f}", "-" if fraction is None else f"{100 * fraction:.1f}"]


def format_table(records, bandwidth, *, markdown: bool = False) -> str:
    """The results as an aligned text table, or a markdown table when ``markdown``."""
    rows = [_cells(r) for r in records]
    footer = (f"bandwidth: copy {bandwidth.copy_gbps:.0f} GB/s, read {bandwidth.read_gbps:.0f} GB/s; min MB: "
              "verify = target logits + K cache rows (none for a T = 0 request) read once, "
              "filter = logits read + written once, block_inputs = its outputs; floor = min MB / read bandwidth; % read BW = floor / time")
    grouped = {}  # (kernel, impl, status, reason) -> the cases it applies to
    for r in records:
        if r["status"] != "ok":
            grouped.setdefault((r["kernel"], r["impl"], r["status"], r["reason"]), []).append(
                f"{r['rows']}/{r['temperature'] if r.get('inputs', '-') == '-' else r['inputs']}")
    notes = [f"{kernel} ({impl}, {status}) at rows/T {', '.join(cases)}: {reason}"
             for (kernel, impl, status, reason), cases in grouped.items()]
    return report.render_table(HEADER, rows, footer, notes, markdown=markdown)


def config_dict(config: VerifyBenchConfig) -> dict:
    values = {field: getattr(config, field) for field in CONFIG_FIELDS}
    values["cache_dtype"] = str(config.cache_dtype).replace("torch.", "")
    values.update(drafts=config.steps, rows=list(config.rows), kernels=list(config.kernels),
                  impls=list(config.impls), temperatures=list(config.temperatures),
                  filter_inputs=list(config.filter_inputs), filter_cases=list(config.filter_cases))
    return values


def file_stem(env: dict, config: VerifyBenchConfig) -> str:
    """``<gpu>_<date>_<cache dtype>[_v<V>_n<N>]_verify``."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", env["gpu"] or "cpu").strip("-")
    cache = {torch.bfloat16: "bf16", torch.float32: "fp32"}[config.cache_dtype]
    stem = f"{name}_{env['date'][:10]}_{cache}"
    if (config.vocab, config.steps) != (129_280, 5):
        stem += f"_v{config.vocab}_n{config.steps}"
    return stem + report.flush_suffix(env) + "_verify"


def timing_note(config: VerifyBenchConfig) -> str:
    if config.device == "cuda":
        return ("time_us: CUDA-graph replay of one call, L2 flushed before each replay, median of the round "
                "medians (low/high: lowest/highest round median); eager_us: wall time of an eager call, "
                "synchronised before and after")
    return "time_us: time.perf_counter of eager calls on the CPU (no graphs, no L2 flush)"


def write_json(path, env, config, bandwidth, records) -> Path:
    return report.write_results_json(path, env, config_dict(config), bandwidth, records, timing_note(config))


def write_csv(path, env, config, bandwidth, records) -> Path:
    """One line per result; each line repeats the environment, the shape and the bandwidth."""
    values = config_dict(config)
    shape = {field: values[field] for field in ("device", "vocab", "steps", "cache_dtype", "max_reqs", "top_k",
                                                 "top_p")}
    return report.write_records_csv(path, env, shape, bandwidth, records, RECORD_FIELDS)


# ----------------------------------------------------------------------------------------------
# Command line (called by ``bench.cli.main`` for ``--verify``)


# Options of the sampler benchmark that mean nothing here: refused rather than silently ignored.
_NOT_FOR_VERIFY = ("rank", "designs", "method", "vllm_cache")


def config_from_args(args) -> VerifyBenchConfig:
    for name in _NOT_FOR_VERIFY:
        if getattr(args, name, None) is not None:
            raise ValueError(f"--{name.replace('_', '-')}: not used by --verify")
    if getattr(args, "logits_dtype", "bfloat16") != "bfloat16":
        raise ValueError("--logits-dtype: not used by --verify (its target logits are fp32; --cache-dtype sets the "
                         "drafter cache's dtype)")
    if getattr(args, "targets", False):
        raise ValueError("--targets: not used by --verify (the issue-5 targets are the samplers')")
    overrides = {name: getattr(args, name) for name in ("vocab", "steps", "rows", "rounds", "replays", "eager_calls",
                                                         "seed") if getattr(args, name, None) is not None}
    overrides["temperatures"] = TEMPERATURE_MODES if args.temperature == "both" else (args.temperature,)
    overrides["cache_dtype"] = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.cache_dtype]
    if args.device == "cpu":
        return cpu_config(**overrides)
    return VerifyBenchConfig(device="cuda", **overrides)


def run_cli(args, argv) -> int:
    """The ``--verify`` run of ``dspark-markov bench``: 0 on success, 2 on bad arguments."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"dspark-markov bench: {error}", file=sys.stderr)
        return 2
    env = report.environment(config.device, argv)
    bandwidth = roofline.measure_bandwidth(torch.device(config.device))
    records = run_grid(config, bandwidth, progress=not args.no_progress)
    cache = str(config.cache_dtype).replace("torch.", "")
    print(f"{report.environment_line(env)} | V={config.vocab} K=N={config.steps} cache {cache} | "
          f"top-k {config.top_k} top-p {config.top_p} | block inputs max_reqs {config.max_reqs}")
    print(format_table(records, bandwidth), end="")
    if args.markdown:
        print(format_table(records, bandwidth, markdown=True), end="")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = file_stem(env, config)
    written = [write_json(out / f"{stem}.json", env, config, bandwidth, records),
               write_csv(out / f"{stem}.csv", env, config, bandwidth, records)]
    print("wrote " + ", ".join(str(path) for path in written))
    return 0
