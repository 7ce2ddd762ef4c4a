"""Timing: CUDA-graph replays with a cold L2, eager host cost, and the median/spread of rounds.

How a replay is timed, and why that way
---------------------------------------
Each timed replay is enqueued as ``flush; start event; graph replay; end event``. The flush is a
``zero_()`` (mode ``dirty``; ``clean``: a read, below) of a scratch buffer of at least twice the L2
(256 MB by default) launched *outside* the graph, so the events bracket the sampler alone and stream
order guarantees that the flush has finished (and has evicted W2, the logits and the cache from L2)
before the start event fires. The alternative -- capturing flush + sample and subtracting a
separately timed flush-only graph -- is not sound: the two times are not additive (the flush's tail
overlaps the sampler's first kernel, and after a dirty flush the sampler's first reads pay for
writing back its dirty lines either way), and a difference of two noisy medians is noisier than
either. The host never waits between replays: the flush takes ~0.1 ms on the GPU, long enough for
the host to enqueue the events and the replay behind it, so the GPU does not idle inside the timed
interval.

Two kinds of cold L2 (``DSPARK_MARKOV_L2_FLUSH``, or ``L2Flusher(mode=...)``): ``dirty`` (the default, every
committed result before 2026-12-06 and what their "cold L2" means) leaves the L2 full of the flush's dirty lines,
so a kernel's first ~L2-size of misses also writes ~50-60 MB back to HBM (12-17 us of the bus on an H200 / H100)
that the kernel never wrote; ``clean`` reads the scratch buffer instead of writing it, so the L2 holds clean lines
of unrelated data (any dirty line the previous replay left is written back during the flush, untimed) and a
kernel's time counts only its own bytes, as the floors assume. Results say which they used.

The times of a round are reduced to their median; a measurement is the median of the round
medians, with the lowest and highest round median as its spread (:func:`summarize`).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from typing import Callable, NamedTuple, Sequence

import torch

FLUSH_BYTES = 256 << 20  # >= 2x the L2 of any current NVIDIA GPU (H200: 60 MB)


class Summary(NamedTuple):
    median: float  # median of the round medians
    low: float  # lowest round median
    high: float  # highest round median
    round_medians: tuple  # one per round, in order
    samples: int  # number of individual timings


def summarize(rounds: Sequence[Sequence[float]]) -> Summary:
    """Median of the per-round medians, and their min/max as the spread.

    ``rounds`` holds one non-empty sequence of times per round. Round medians resist the odd slow
    replay; the spread across rounds shows drift (clocks, other work) that a single round hides.
    """
    if len(rounds) == 0:
        raise ValueError("rounds: expected at least one round of timings, got none")
    medians = []
    for index, times in enumerate(rounds):
        if len(times) == 0:
            raise ValueError(f"rounds: round {index} holds no timings")
        medians.append(float(statistics.median(times)))
    return Summary(float(statistics.median(medians)), min(medians), max(medians), tuple(medians),
                   sum(len(times) for times in rounds))


FLUSH_MODES = ("dirty", "clean")
FLUSH_ENV = "DSPARK_MARKOV_L2_FLUSH"  # the default mode of every L2Flusher (bench --l2-flush sets it for its run)


def flush_mode(mode: str | None = None) -> str:
    """``mode``, else ``DSPARK_MARKOV_L2_FLUSH``, else ``"dirty"``; checked against :data:`FLUSH_MODES`."""
    mode = mode or os.environ.get(FLUSH_ENV) or "dirty"
    if mode not in FLUSH_MODES:
        raise ValueError(f"mode: expected one of {FLUSH_MODES} (or DSPARK_MARKOV_L2_FLUSH), got {mode!r}")
    return mode


def graph_timing_label() -> str:
    """A record's ``timing`` for CUDA-graph replays: ``graph`` (dirty flush) or ``graph, clean L2``."""
    return "graph" if flush_mode() == "dirty" else "graph, clean L2"


class L2Flusher:
    """Evicts the L2 through a scratch buffer of ``max(FLUSH_BYTES, 2 x L2 size)`` bytes: writes it (``dirty``:
    the L2 is left full of dirty lines) or reads it (``clean``: clean lines); see the module docstring."""

    def __init__(self, device: torch.device, nbytes: int | None = None, mode: str | None = None):
        props = torch.cuda.get_device_properties(device)
        l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.mode = flush_mode(mode)
        self.nbytes = int(nbytes or max(FLUSH_BYTES, 2 * l2_bytes)) // 4 * 4
        self.buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.words = self.buffer.view(torch.int32)
        self.sink = torch.zeros((), dtype=torch.int32, device=device)

    def __call__(self) -> None:
        if self.mode == "dirty":
            self.buffer.zero_()
        else:
            torch.amax(self.words, dim=0, out=self.sink)


def capture_graph(fn: Callable[[], object], warmup: int = 2) -> "torch.cuda.CUDAGraph":
    """Capture ``fn`` into a CUDA graph after ``warmup`` calls on a side stream (PyTorch's recipe).

    Python's cyclic garbage collector is run before the capture and kept off during it (as vLLM does
    around its captures): a collection inside the capture may free an earlier ``CUDAGraph`` held in a
    reference cycle, whose destruction (``cudaGraphExecDestroy``) is not permitted while a stream captures
    and invalidates the capture (``cudaErrorStreamCaptureInvalidated``; the 2026-12-04 hook-timing failures).

    The graph keeps ``fn`` (``graph.keepalive``), and so whatever ``fn`` holds (a sampler, its buffers, the
    outputs): a graph replays raw device pointers, and a caller that kept only the graph would otherwise replay
    into freed memory (tools/sweep_cuda_wide.py's illegal address at 64 rows on 2026-12-05, helper-18's analysis).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.cuda.graph(graph):
            fn()
    finally:
        if enabled:
            gc.enable()
    torch.cuda.synchronize()
    graph.keepalive = fn
    return graph


def capture_checked(fn: Callable[[], object], outputs: Callable[[], list], prepare: Callable[[], None],
                    clear: Callable[[], None] | None = None):
    """``(graph, match)``: ``fn`` captured (:func:`capture_graph`) after its eager call, then replayed once on
    cleared outputs (``clear``, default: zero every tensor of ``outputs()``) and restored inputs (``prepare``);
    ``match`` says whether the replay wrote exactly what the eager call had (same inputs, same keys)."""
    eager = [out.clone() for out in outputs()]
    graph = capture_graph(fn)
    if clear is None:
        for out in outputs():
            out.zero_()
    else:
        clear()
    prepare()
    graph.replay()
    torch.cuda.synchronize()
    return graph, all(torch.equal(a, b) for a, b in zip(outputs(), eager))


def time_graph_replays(graph, count: int, flush: Callable[[], None],
                       prepare: Callable[[], None] | None = None) -> list:
    """Microseconds of ``count`` replays of ``graph``, each after a flush and timed by its own events.

    ``prepare`` (untimed, before the flush): restores the inputs of an in-place run."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends):
        if prepare is not None:
            prepare()
        flush()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]  # ms -> us


def time_eager_cuda(fn: Callable[[], object], count: int, flush: Callable[[], None],
                    prepare: Callable[[], None] | None = None) -> list:
    """Wall microseconds of ``count`` eager calls, synchronised before and after each (host cost + GPU)."""
    times = []
    for _ in range(count):
        if prepare is not None:
            prepare()
        flush()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - begin) * 1e6)
    return times


def time_host(fn: Callable[[], object], count: int, prepare: Callable[[], None] | None = None) -> list:
    """Wall microseconds of ``count`` calls of ``fn`` by ``time.perf_counter`` (CPU runs)."""
    times = []
    for _ in range(count):
        if prepare is not None:
            prepare()
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e6)
    return times


def median_time_us(fn: Callable[[], object], device: torch.device, *, repeats: int = 10, warmup: int = 2) -> float:
    """Median microseconds of ``repeats`` calls of ``fn`` after ``warmup`` calls.

    CUDA: each call bracketed by its own events (GPU time); CPU: ``time.perf_counter``.
    """
    if int(repeats) < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if torch.device(device).type != "cuda":
        return float(statistics.median(time_host(fn, repeats)))
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(statistics.median(start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)))


def time_round_robin(runs: dict, is_ok: Callable[[object], bool], on_error: Callable[[object, Exception], None], *,
                     rounds: int, replays: int, eager_calls: int, cuda: bool, flush,
                     before: Callable[[object, int], None] | None = None,
                     after_round: Callable[[], None] | None = None) -> tuple:
    """Time every run of ``runs`` (key -> object with ``graph`` and ``call``) in alternating rounds.

    Each round starts one run later than the previous, so drift hits every run alike. On CUDA a
    round times ``replays`` graph replays (L2 flushed before each) and ``eager_calls`` eager calls;
    on the CPU ``replays`` host-timed calls. A run with a ``prepare()`` (an in-place run's input
    restore) has it called, untimed, before every timed call or replay (and before the flush). A
    run whose timing raises is reported to ``on_error`` and skipped afterwards (``is_ok`` says
    which runs still count). Returns ``(times, eager)``:
    per key, one list of microseconds per round.
    """
    times = {key: [] for key in runs}
    eager = {key: [] for key in runs}
    order = list(runs)
    for round_index in range(rounds):
        shift = round_index % max(len(order), 1)
        for key in order[shift:] + order[:shift]:
            if before is not None:
                before(key, round_index)
            if not is_ok(key):  # failed in an earlier round
                continue
            run = runs[key]
            try:
                prepare = getattr(run, "prepare", None)
                if cuda:
                    times[key].append(time_graph_replays(run.graph, replays, flush, prepare))
                    eager[key].append(time_eager_cuda(run.call, eager_calls, flush, prepare))
                else:
                    times[key].append(time_host(run.call, replays, prepare))
            except Exception as error:  # noqa: BLE001 - reported per run, the others go on
                on_error(key, error)
        if after_round is not None:
            after_round()
    return times, eager


def check_config(config, positive_fields) -> None:
    """The checks every benchmark configuration shares: the device, positive sizes, the rows."""
    if config.device not in ("cuda", "cpu"):
        raise ValueError(f"device: expected 'cuda' or 'cpu', got {config.device!r}")
    for name in positive_fields:
        if not 1 <= int(getattr(config, name)) <= 2**31 - 1:
            raise ValueError(f"{name}: expected >= 1 and < 2^31, got {getattr(config, name)}")
    if not config.rows or any(not 1 <= int(r) <= 2**31 - 1 for r in config.rows):
        raise ValueError(f"rows: expected a non-empty list of row counts in [1, 2^31), got {config.rows}")
    if not -(2**63) <= int(getattr(config, "seed", 0)) <= 2**63 - 1:
        raise ValueError(f"seed: expected an int64, got {config.seed}")


def time_cases(records: dict, set_up: Callable[[object, dict], object], label: Callable[[object], str], *,
               rounds: int, replays: int, eager_calls: int, cuda: bool, flush, bar) -> list:
    """Set up every case of ``records`` (key -> record), time them round-robin, store the timings.

    ``set_up(key, record)`` returns the case's run (``graph`` and ``call``) or ``None`` when it
    cannot run (it then says why in ``record``); ``label(key)`` names the case in the progress bar
    ``bar`` and in warnings. A run whose timing raises is marked ``status="error"``, and so is a
    run whose ``check()`` (if it has one: a design's device status, e.g. a persistent kernel's grid
    barrier that gave up during the replays) raises after the timing: its times would be those of
    meaningless tokens. Returns the records in the order of ``records``.
    """
    runs = {}
    for key, record in records.items():
        bar.set_postfix_str(f"{label(key)} setup")
        run = set_up(key, record)
        if run is not None:
            runs[key] = run
        bar.update(1)

    def report_error(key, error):
        records[key].update(status="error", reason=f"{type(error).__name__}: {error}")
        print(f"warning: {label(key)}: {records[key]['reason']}", file=sys.stderr)

    times, eager = time_round_robin(
        runs, lambda key: records[key]["status"] == "ok", report_error,
        rounds=rounds, replays=replays, eager_calls=eager_calls, cuda=cuda, flush=flush,
        before=lambda key, index: bar.set_postfix_str(f"{label(key)} round {index + 1}"),
        after_round=lambda: bar.update(len(records)))
    for key, run in runs.items():
        check = getattr(run, "check", None)
        if records[key]["status"] == "ok" and check is not None:
            try:
                check()
            except RuntimeError as error:  # DeviceStatusError
                report_error(key, error)
        if records[key]["status"] == "ok":
            store_timing(records[key], times[key], eager[key])
    return list(records.values())


def store_timing(record: dict, times: list, eager: list) -> None:
    """Fill ``time_us`` (median of round medians), its range and ``eager_us`` of a record."""
    timing = summarize(times)
    record.update(time_us=timing.median, time_us_low=timing.low, time_us_high=timing.high)
    if eager:
        record["eager_us"] = summarize(eager).median
