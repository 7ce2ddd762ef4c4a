"""The benchmark grid: inputs, one timed runner per design, and the round-robin over designs.

For every (rows, temperature mode) case all designs share the same inputs and outputs; each gets
its own :class:`~dspark_markov.MarkovSampler` sized for the case, is called once eagerly (which
compiles its kernels and checks its inputs), then captured in a CUDA graph. The timed rounds go
round-robin over the designs -- every round visits every design, starting one design later than
the previous round -- so clock or thermal drift lands on all designs alike.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys

import torch

from .. import registry
from ..draft.sampler import MarkovSampler
from ..head import MarkovHead
from . import harness, roofline

VLLM_LOOP = "vllm_loop"  # vLLM's own speculator loop (bench/vllm_loop.py): the yardstick when it can run
DESIGNS = (VLLM_LOOP, "loop", "gumbel_fused", "inverse_cdf", "fused", "chain", "cuda_chain", "cuda_gumbel", "stream",
           "wide")
# Designs timed only when named (--designs): registry.OPT_IN_DESIGNS are not for default use (see registry.py).
OPT_IN_DESIGNS = registry.OPT_IN_DESIGNS
KNOWN_DESIGNS = ("reference",) + DESIGNS + OPT_IN_DESIGNS
TEMPERATURE_MODES = ("1", "mixed")
MIXED_TEMPERATURES = (0.0, 0.6, 1.0)  # slot s gets MIXED_TEMPERATURES[s % 3]
BASELINE = "loop"  # our own loop design: speedup_vs_loop


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    device: str = "cuda"  # "cuda" or "cpu"
    vocab: int = 129_280
    rank: int = 256
    steps: int = 5
    rows: tuple = (1, 16, 32, 64, 128, 253)
    designs: tuple = DESIGNS
    temperatures: tuple = TEMPERATURE_MODES
    cache_dtype: torch.dtype = torch.bfloat16
    logits_dtype: torch.dtype = torch.bfloat16
    weight_dtype: torch.dtype = torch.bfloat16
    rounds: int = 5
    replays: int = 30
    eager_calls: int = 10
    seed: int = 2026
    method: str | None = None  # preferred draw method; designs without it keep theirs (see design_method)

    def __post_init__(self):
        harness.check_config(self, ("vocab", "rank", "steps", "rounds", "replays", "eager_calls"))
        for design in self.designs:
            if design not in KNOWN_DESIGNS:
                raise ValueError(f"designs: expected names among {', '.join(KNOWN_DESIGNS)}, got {design!r}")
        if self.method not in (None, "gumbel", "inverse_cdf"):
            raise ValueError(f"method: expected 'gumbel' or 'inverse_cdf', got {self.method!r}")
        for mode in self.temperatures:
            if mode not in TEMPERATURE_MODES:
                raise ValueError(f"temperatures: expected '1' or 'mixed', got {mode!r}")


def cpu_config(**overrides) -> BenchConfig:
    """The small ``--device cpu`` reference run: V = 2048, rank 32, rows {1, 4}, no graphs."""
    designs = ("reference",)
    if os.environ.get("TRITON_INTERPRET") == "1":
        designs = designs + tuple(d for d in DESIGNS if d != VLLM_LOOP and d not in registry.NATIVE_DESIGNS)
    values = dict(device="cpu", vocab=2048, rank=32, rows=(1, 4), designs=designs, rounds=3, replays=5)
    values.update(overrides)
    return BenchConfig(**values)


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def design_method(cls, preferred: str | None = None) -> str:
    """The draw method a design is benchmarked with: ``preferred`` where the design has it, else
    Gumbel where it has it, else its first method (the record's ``method`` says which ran)."""
    for method in (preferred, "gumbel"):
        if method in cls.METHODS:
            return method
    return cls.METHODS[0]


def make_head(config: BenchConfig, generator: torch.Generator) -> MarkovHead:
    """W1 ``[V, R_k]`` and W2 ``[V, R_k]`` ~ N(0, 0.05^2) in the weight dtype."""
    shape = (config.vocab, config.rank)
    embed = torch.randn(shape, generator=generator, device=config.device) * 0.05
    head = torch.randn(shape, generator=generator, device=config.device) * 0.05
    return MarkovHead(embed.to(config.weight_dtype), head.to(config.weight_dtype))


class Inputs:
    """Inputs and outputs of one case (``rows`` rows, one temperature mode), slices of shared buffers.

    Slots are distinct per row (``idx_mapping`` = row index repeated over the steps, ``S = rows``);
    anchors and seeds are random; positions are consecutive from a random start per row.
    """

    def __init__(self, config: BenchConfig, rows: int, mode: str, logits_all: torch.Tensor, cache_all: torch.Tensor,
                 generator: torch.Generator):
        device, steps, vocab = config.device, config.steps, config.vocab
        self.base_logits = logits_all[:rows]  # [R, N, V]
        self.logits_cache = cache_all[:rows]  # [S = R, N, V]
        self.anchor = torch.randint(0, vocab, (rows,), generator=generator, device=device)  # [R]
        self.idx_mapping = torch.arange(rows, device=device).repeat_interleave(steps)  # [R*N]
        start = torch.randint(1, 1 << 20, (rows, 1), generator=generator, device=device)
        self.positions = (start + torch.arange(steps, device=device)).reshape(-1)  # [R*N]
        if mode == "1":
            self.temperature = torch.ones(rows, dtype=torch.float32, device=device)  # [S]
        else:
            table = torch.tensor(MIXED_TEMPERATURES, dtype=torch.float32, device=device)
            self.temperature = table[torch.arange(rows, device=device) % len(MIXED_TEMPERATURES)]
        self.seeds = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=generator, device=device)  # [S]
        self.draft_tokens = torch.empty(rows, steps, dtype=torch.int64, device=device)  # [R, N]


class DesignRun:
    """One design set up on one case: a sampler, its first (checked) call and, on CUDA, its graph.

    Raises ``ValueError`` when the design is not available here or refuses the case.
    """

    def __init__(self, design: str, head: MarkovHead, inputs: Inputs, config: BenchConfig):
        cls = registry.load("draft", design, "designs")  # ValueError when the module is missing or fails
        cuda = config.device == "cuda"
        if cuda and not getattr(cls, "GRAPH_SAFE", False):
            raise ValueError(f"designs: {design!r} is not CUDA-graph safe, so it cannot be timed as a graph replay")
        if not cuda and design != "reference" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"designs: {design!r} needs a GPU, or TRITON_INTERPRET=1 for the CPU interpreter")
        self.design = design
        self.method = design_method(cls, config.method)
        self.inputs = inputs
        rows = inputs.base_logits.shape[0]
        self.sampler = MarkovSampler(head, config.steps, rows, cache_dtype=config.cache_dtype, method=self.method,
                                     impl=design)
        _first_call_and_graph(self, config, cuda)

    def check(self) -> None:
        """After the timed calls: the sampler's device status (raises ``DeviceStatusError``), then one
        more replay (CUDA) that must draw the eager call's tokens again (``RuntimeError`` if not), so
        that a time is never reported for a graph that stopped computing the case."""
        self.sampler.check()
        _check_replay_again(self)

    def call(self, check_values: bool = False):
        i = self.inputs
        self.sampler.sample(i.base_logits, i.anchor, i.idx_mapping, i.positions, i.temperature, i.seeds,
                            draft_tokens=i.draft_tokens, logits_cache=i.logits_cache, check_values=check_values)


def _first_call_and_graph(run, config: BenchConfig, cuda: bool) -> None:
    """The run's first (checked) call, its token range check and, on CUDA, its graph with the
    replay-equals-eager check (``run.graph``, ``run.graph_tokens_match``)."""
    run.call(check_values=True)
    tokens = run.inputs.draft_tokens
    if int(tokens.min()) < 0 or int(tokens.max()) >= config.vocab:
        raise RuntimeError(f"{run.design} drew a token outside [0, {config.vocab})")
    run.graph = None
    run.graph_tokens_match = None
    run.eager_tokens = tokens.clone()
    if cuda:  # same inputs and seeds: a replay must draw exactly what the eager call drew
        run.graph, run.graph_tokens_match = harness.capture_checked(run.call, lambda: [tokens], lambda: None,
                                                                    clear=lambda: tokens.fill_(-1))


class VllmLoopRun:
    """vLLM's own speculator loop (:class:`~.vllm_loop.VllmLoop`) on one case, with its graph.

    Raises ``ValueError`` (the design shows as n/a) when vLLM's ``gumbel_sample`` cannot be
    imported, or when the case has a cache dtype other than the logits' (vLLM's loop needs them equal).
    """

    def __init__(self, head: MarkovHead, inputs: Inputs, config: BenchConfig):
        from . import vllm_loop

        try:
            gumbel_sample, self.origin = vllm_loop.load_gumbel_sample()
        except ImportError as error:
            raise ValueError(f"designs: {VLLM_LOOP!r} needs vLLM's gumbel_sample: {error}") from error
        if config.cache_dtype != config.logits_dtype:
            raise ValueError(f"designs: {VLLM_LOOP!r} needs the cache in the logits' dtype, as vLLM's gumbel_sample "
                             f"does (cache {config.cache_dtype}, logits {config.logits_dtype}; for an fp32 cache "
                             "pass --logits-dtype float32)")
        if config.device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"designs: {VLLM_LOOP!r} needs a GPU, or TRITON_INTERPRET=1 for the CPU interpreter")
        self.design = VLLM_LOOP
        self.method = "gumbel"
        self.inputs = inputs
        self.loop = vllm_loop.VllmLoop(head, config.steps, gumbel_sample)
        _first_call_and_graph(self, config, config.device == "cuda")

    def check(self) -> None:
        """One more replay after the timed calls must draw the eager call's tokens again."""
        _check_replay_again(self)

    def call(self, check_values: bool = False):
        i = self.inputs
        self.loop.run(i.base_logits, i.anchor, i.idx_mapping, i.positions, i.temperature, i.seeds, i.draft_tokens,
                      i.logits_cache)


def _check_replay_again(run) -> None:
    if run.graph is None:
        return
    tokens = run.inputs.draft_tokens  # shared by the case's designs: refilled by this design's replay
    tokens.fill_(-1)
    run.graph.replay()
    if tokens.is_cuda:
        torch.cuda.synchronize()
    if not torch.equal(tokens, run.eager_tokens):
        raise RuntimeError(f"{run.design}: a graph replay after the timed rounds drew other tokens than the eager call")


def _record(config: BenchConfig, design: str, rows: int, mode: str) -> dict:
    sizes = dict(weight_bytes=element_bytes(config.weight_dtype), logit_bytes=element_bytes(config.logits_dtype),
                 cache_bytes=element_bytes(config.cache_dtype))
    nbytes = roofline.minimal_bytes(config.vocab, config.rank, config.steps, rows, **sizes)
    once = roofline.minimal_bytes_w2_once(config.vocab, config.rank, config.steps, rows, **sizes)
    return {"design": design, "method": None, "rows": rows, "temperature": mode, "status": "ok", "reason": "",
            "time_us": None, "time_us_low": None, "time_us_high": None, "eager_us": None,
            "speedup_vs_loop": None, "speedup_vs_vllm_loop": None, "minimal_bytes": nbytes, "floor_us": None,
            "bandwidth_fraction": None, "minimal_bytes_w2_once": once, "floor_w2_once_us": None,
            "graph_tokens_match": None}


def _set_up(design, head, inputs, config, record):
    """A :class:`DesignRun`, or ``None`` with the record marked n/a (refused) or error (anything else)."""
    try:
        run = VllmLoopRun(head, inputs, config) if design == VLLM_LOOP else DesignRun(design, head, inputs, config)
    except ValueError as error:
        record.update(status="n/a", reason=str(error))
        return None
    except Exception as error:  # noqa: BLE001 - one broken design must not lose the whole run
        record.update(status="error", reason=f"{type(error).__name__}: {error}")
        print(f"warning: {design} at {record['rows']} rows, T={record['temperature']}: {record['reason']}",
              file=sys.stderr)
        return None
    record["method"] = run.method
    record["graph_tokens_match"] = run.graph_tokens_match
    if run.graph_tokens_match is False:
        print(f"warning: {design} at {record['rows']} rows: the graph replay drew other tokens than the eager call",
              file=sys.stderr)
    return run


def run_grid(config: BenchConfig, bandwidth: roofline.Bandwidth, *, progress: bool = True) -> list:
    """Time every (rows, temperature mode, design) of ``config``; one dict per combination.

    Records hold ``time_us`` (median of round medians; CUDA-graph replay with a cold L2 on CUDA,
    ``perf_counter`` on the CPU), ``time_us_low``/``time_us_high`` (lowest/highest round median),
    ``eager_us`` (CUDA: wall time of an eager call, synchronised), ``speedup_vs_loop``,
    ``minimal_bytes``, ``floor_us`` and ``bandwidth_fraction`` (against ``bandwidth.read_gbps``).
    """
    cuda = config.device == "cuda"
    generator = torch.Generator(device=config.device).manual_seed(config.seed)
    head = make_head(config, generator)
    max_rows = max(config.rows)
    shape = (max_rows, config.steps, config.vocab)
    logits_all = (torch.randn(shape, generator=generator, device=config.device) * 2.0).to(config.logits_dtype)
    cache_all = torch.empty(shape, dtype=config.cache_dtype, device=config.device)
    flush = harness.L2Flusher(torch.device(config.device)) if cuda else None

    cases = [(rows, mode) for mode in config.temperatures for rows in config.rows]
    bar = _progress_bar(len(cases) * len(config.designs) * (1 + config.rounds), progress)
    records = []
    for rows, mode in cases:
        gc.collect()  # the previous case's runs (each holds its graph, which holds its call: a cycle)
        try:
            inputs = Inputs(config, rows, mode, logits_all, cache_all, generator)
            records += _time_case(config, head, inputs, rows, mode, flush, bar)
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: keep the other cases and the reports
            print(f"warning: case {rows} rows, T={mode} failed: {type(error).__name__}: {error}", file=sys.stderr)
            for design in config.designs:
                record = _record(config, design, rows, mode)
                record.update(status="error", reason=f"{type(error).__name__}: {error}")
                records.append(record)
    bar.close()
    add_derived(records, bandwidth)
    return records


class _NoBar:
    """What :func:`run_grid` calls on a tqdm bar, doing nothing (``progress=False``)."""

    def set_postfix_str(self, text):
        pass

    def update(self, count=1):
        pass

    def close(self):
        pass


def _progress_bar(total: int, progress: bool):
    """A tqdm bar on stderr, or a silent stand-in when ``progress`` is off (tqdm then not needed)."""
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, desc="bench", unit="step")


def _time_case(config, head, inputs, rows, mode, flush, bar) -> list:
    """Set up every design on one case, then time them round-robin; the case's records."""
    records = {design: _record(config, design, rows, mode) for design in config.designs}
    return harness.time_cases(
        records, lambda design, record: _set_up(design, head, inputs, config, record),
        lambda design: f"{design} at {rows} rows, T={mode}", rounds=config.rounds, replays=config.replays,
        eager_calls=config.eager_calls, cuda=config.device == "cuda", flush=flush, bar=bar)


def add_derived(records: list, bandwidth: roofline.Bandwidth) -> None:
    """Fill ``speedup_vs_loop`` (over our ``loop``), ``speedup_vs_vllm_loop`` (over vLLM's own loop),
    ``floor_us``, ``floor_w2_once_us`` and ``bandwidth_fraction`` of every record in place."""
    baselines = {}
    for name in (BASELINE, VLLM_LOOP):
        baselines[name] = {(r["rows"], r["temperature"]): r["time_us"] for r in records
                           if r["design"] == name and r["time_us"] is not None}
    for record in records:
        record["floor_us"] = roofline.floor_us(record["minimal_bytes"], bandwidth.read_gbps)
        if record.get("minimal_bytes_w2_once") is not None:
            record["floor_w2_once_us"] = roofline.floor_us(record["minimal_bytes_w2_once"], bandwidth.read_gbps)
        if record["time_us"] is None:
            continue
        record["bandwidth_fraction"] = record["floor_us"] / record["time_us"]
        key = (record["rows"], record["temperature"])
        for name, field in ((BASELINE, "speedup_vs_loop"), (VLLM_LOOP, "speedup_vs_vllm_loop")):
            base = baselines[name].get(key)
            if base is not None:
                record[field] = base / record["time_us"]
