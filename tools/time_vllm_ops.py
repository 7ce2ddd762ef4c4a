"""Time vLLM 0.33.0's top-k/top-p filter and rejection sampler beside ours, in one process.

For the same-run comparisons of issues 16 (filter) and 18 (verification), on the GPU machine (no
vLLM, no network): vLLM's functions come from ``dspark_markov.bench.vllm_ops`` (an installed vLLM
0.33.0, else the copies ``tools/extract_vllm.py`` wrote into ``.vllm-cache/``: carry it to the job).

Parts (``--parts``), per batch of ``B`` requests (``--rows``, default 1, 16, 64, 253) with ``K = 5``:

- ``filter``: ``B (K+1)`` rows (6 / 96 / 384 / 1518) of fp32 logits ``[rows, V = 129,280]``, each
  input kind of ``bench --verify`` (``verify_grid.filter_logits``: gaussian, peaked, bf16) and case
  (``k+p``: k = 50 and p = 0.9 per row; ``p``: p = 0.9 alone), in place (each timed call or replay is
  preceded, untimed and before the L2 flush, by a copy of the pristine input, as
  ``verify_grid.FilterRunner``). Impls: ``vllm`` (``apply_top_k_top_p_triton(logits, k int32, p,
  has_topp_only_rows=<case is p>)``: what vLLM's sampler passes for such a batch), ``triton`` (our
  ``TopKTopPFilter``, default layout: ``verify_grid.FilterRunner``), ``cuda`` (our cluster filter,
  the kernel of ``top_k_top_p(impl="cuda")``; runs only with ``DSPARK_MARKOV_UNVERIFIED=cuda_filter``,
  else the record says why). Each first call is compared with ``top_k_top_p_reference``: ours must
  equal it (else ``status=error``); vLLM's agreement is recorded (``agreement_rows``: fraction of rows
  with the same kept set; ``agreement_tokens``; ``kept_diff``: mean |kept count - reference's|);
- ``rejection``: standard verification of ``B`` requests, ``bench --verify``'s inputs (fp32 target
  logits ``[B, K+1, V]`` N(0, 2^2), a bf16 drafter cache ``[S = B, K, V]``, random drafts, random
  positions and seeds, slots ``arange(B)``), temperature modes ``--temperatures`` (``mixed``: T = 0 /
  0.6 / 1 by slot; ``1``). Impls: ``vllm`` (``rejection_sample``: its cache is the draft logits, its
  target rows ``[B (K+1), V]``, ``draft_sampled[b (K+1) + 1 + i]`` = draft i) and ``triton`` (our
  ``StreamVerifier``, ``verify_grid.VerifyRunner``). vLLM's first call is checked: counts in
  ``[1, K+1]``, tokens in ``[0, V)``, greedy (T = 0) requests emit the target's argmax chain
  (``greedy_match``); ``accepted_mean`` is its mean count of accepted drafts.

Timing is ``bench --verify``'s (``dspark_markov.bench.harness``): each case called once eagerly
(compiles; vLLM's kernels compile at their first call here, not at start-up as in vLLM), captured in
a CUDA graph, replayed after an L2 flush, round-robin over the cases of a batch size; ``time_us`` is
the median of the round medians, ``time_us_low``/``high`` the round range, ``eager_us`` an eager call's
wall time. ``graph_output_match``: a replay wrote what the eager call wrote. Anything that cannot
run is a record with ``status`` ``n/a`` or ``error`` and the ``reason``; the tool exits 0 unless its
arguments are wrong (2).

Output: ``vllm_ops.json`` and ``vllm_ops.csv`` in ``--out`` (default ``$JOB_OUT``, else
``./vllm_ops_out``), and a table on stdout.

Usage (GPU): ``PYTHONPATH=src python tools/time_vllm_ops.py [--parts filter,rejection] [--rows 1,16,64,253]``
CPU check (interpreter, small): ``TRITON_INTERPRET=1 PYTHONPATH=src python tools/time_vllm_ops.py --device cpu
--vocab 2048 --rows 1 --rounds 1 --replays 1``; ``--list`` prints the cases and exits.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import torch

PARTS = ("filter", "rejection")
FILTER_IMPLS = ("vllm", "triton", "cuda")
REJECTION_IMPLS = ("vllm", "triton")
FIELDS = ("part", "impl", "rows", "work_rows", "mode", "layout", "status", "time_us", "time_us_low", "time_us_high",
          "eager_us", "timing", "minimal_bytes", "floor_us", "bandwidth_fraction", "graph_output_match",
          "agreement_rows", "agreement_tokens", "kept_diff", "greedy_match", "accepted_mean", "reason")


# The environment columns of every CSV line (the JSON has the whole environment).
ENV_COLUMNS = ("gpu", "driver", "torch", "triton", "cuda", "date", "l2_flush")


def _csv_list(text: str, cast=str) -> tuple:
    return tuple(cast(item) for item in text.split(",") if item.strip())


def parse_args(argv=None) -> argparse.Namespace:
    from dspark_markov.bench import verify_grid

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("JOB_OUT") or "vllm_ops_out"),
                        help="output folder (default $JOB_OUT, else ./vllm_ops_out)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--filter-impls", default=",".join(FILTER_IMPLS), help=f"among {', '.join(FILTER_IMPLS)}")
    parser.add_argument("--rejection-impls", default=",".join(REJECTION_IMPLS),
                        help=f"among {', '.join(REJECTION_IMPLS)}")
    parser.add_argument("--rows", default="1,16,64,253", help="requests B per batch (filter rows: B (K+1))")
    parser.add_argument("--vocab", type=int, default=129_280)
    parser.add_argument("--steps", type=int, default=5, help="K = N drafts per request")
    parser.add_argument("--kinds", default=",".join(verify_grid.FILTER_INPUTS),
                        help=f"filter inputs among {', '.join(verify_grid.FILTER_INPUTS)}")
    parser.add_argument("--cases", default=",".join(verify_grid.FILTER_CASES),
                        help=f"filter cases among {', '.join(verify_grid.FILTER_CASES)}")
    parser.add_argument("--temperatures", default="mixed", help="rejection temperature modes among mixed, 1, 0.6")
    parser.add_argument("--top-k", type=int, default=verify_grid.TOP_K)
    parser.add_argument("--top-p", type=float, default=verify_grid.TOP_P)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--eager-calls", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--source", choices=("auto", "installed", "cache"), default="auto",
                        help="where vLLM's functions come from (dspark_markov.bench.vllm_ops.load_op)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--compile-check", action="store_true",
                        help="no GPU: compile vLLM's kernels of every case for sm_90 on meta tensors (tools/compile_check.py's "
                             "driver stand-in; run with the GPU's Triton, e.g. /work/venv-t36) and print registers/spills")
    args = parser.parse_args(argv)
    try:
        args.parts = _checked("parts", _csv_list(args.parts), PARTS)
        args.filter_impls = _checked("filter-impls", _csv_list(args.filter_impls), FILTER_IMPLS)
        args.rejection_impls = _checked("rejection-impls", _csv_list(args.rejection_impls), REJECTION_IMPLS)
        args.kinds = _checked("kinds", _csv_list(args.kinds), verify_grid.FILTER_INPUTS)
        args.cases = _checked("cases", _csv_list(args.cases), verify_grid.FILTER_CASES)
        args.temperatures = _checked("temperatures", _csv_list(args.temperatures),
                                     verify_grid.TEMPERATURE_MODES + verify_grid.EXTRA_TEMPERATURE_MODES)
        args.rows = _csv_list(args.rows, int)
        args.config = bench_config(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def _checked(name: str, values: tuple, known: tuple) -> tuple:
    if not values or any(value not in known for value in values):
        raise ValueError(f"--{name}: expected a comma list among {', '.join(known)}, got {','.join(values)!r}")
    return values


def bench_config(args):
    """The ``VerifyBenchConfig`` whose shared inputs and runners the cases use (raises ValueError)."""
    from dspark_markov.bench import verify_grid

    return verify_grid.VerifyBenchConfig(
        device=args.device, vocab=args.vocab, steps=args.steps, rows=args.rows,
        kernels=("verify_standard", "filter_row"), impls=("triton",), temperatures=args.temperatures,
        filter_inputs=args.kinds, filter_cases=args.cases, top_k=args.top_k, top_p=args.top_p, rounds=args.rounds,
        replays=args.replays, eager_calls=args.eager_calls, seed=args.seed)


def cases(args) -> list:
    """``(part, impl, mode)`` of one batch size: mode ``"<kind> <case>"`` (filter) or the T mode."""
    found = []
    if "filter" in args.parts:
        modes = [f"{kind} {case}" for case in args.cases for kind in args.kinds]
        found += [("filter", impl, mode) for mode in modes for impl in args.filter_impls]
    if "rejection" in args.parts:
        found += [("rejection", impl, mode) for mode in args.temperatures for impl in args.rejection_impls]
    return found


# ------------------------------------------------------------------------------ vLLM's runs
class _Run:
    """One vLLM case on one batch size: ``call()`` (eager), ``prepare()``, and on CUDA ``graph``
    (captured after the checked first call; ``graph_output_match`` says whether a replay rewrote the
    eager outputs)."""

    layout = "-"

    def __init__(self, cuda: bool):
        self.call(first=True)
        self.graph = None
        self.graph_output_match = None
        if cuda:
            from dspark_markov.bench import harness

            self.graph, self.graph_output_match = harness.capture_checked(self.call, self.outputs, self.prepare,
                                                                          self.clear)

    def prepare(self):
        """Restore what an in-place run overwrote (untimed, before each timed call)."""

    def clear(self):
        """Overwrite the outputs before the checking replay."""


class VllmFilterRun(_Run):
    def __init__(self, apply, mode: str, rows: int, shared, config):
        from dspark_markov.verify.filtering import top_k_top_p_reference

        kind, case = mode.split(" ")
        device, work = config.device, rows * (config.steps + 1)
        self.apply = apply
        self.logits = shared.filter_input(kind)[:work]  # [B*(K+1), V] fp32, read only (the pristine input)
        self.out = torch.empty_like(self.logits)  # [B*(K+1), V] fp32, restored then filtered in place
        self.k = torch.full((work,), config.top_k, dtype=torch.int32, device=device) if case == "k+p" else None
        self.p = torch.full((work,), config.top_p, dtype=torch.float32, device=device)  # [B*(K+1)]
        self.topp_only = case == "p"  # vLLM's sampler: has_topp_only_rows = some row has p < 1 and no top-k
        self.layout = f"qrita has_topp_only_rows={self.topp_only}"
        self.reference = top_k_top_p_reference
        super().__init__(device == "cuda")

    def prepare(self):
        self.out.copy_(self.logits)

    def call(self, first: bool = False):
        from dspark_markov.bench.vllm_ops import interpreter_shims

        if first:
            self.prepare()
        with interpreter_shims():
            result = self.apply(self.out, self.k, self.p, has_topp_only_rows=self.topp_only)
        if result.data_ptr() != self.out.data_ptr():
            raise RuntimeError("vLLM's filter returned a new tensor (in place expected for contiguous fp32 rows)")
        if first:
            rows = self.logits.shape[0]
            k = torch.zeros(rows, dtype=torch.int64, device=self.logits.device) if self.k is None else self.k.long()
            expected = self.reference(self.logits, k, self.p)
            keep = torch.isfinite(self.out)
            if not torch.equal(self.out[keep], self.logits[keep]):
                raise RuntimeError("vLLM's filter changed a kept value")
            same = keep == expected
            self.agreement_rows = float(same.all(dim=1).float().mean())
            self.agreement_tokens = float(same.float().mean())
            self.kept_diff = float((keep.sum(dim=1) - expected.sum(dim=1)).abs().float().mean())

    def outputs(self):
        return [self.out]


class VllmRejectionRun(_Run):
    def __init__(self, sample, mode: str, rows: int, shared, config):
        from dspark_markov.bench import verify_grid

        b, k, vocab, device = rows, config.steps, config.vocab, config.device
        self.sample, self.k, self.vocab = sample, k, vocab
        self.target = shared.target[:b].reshape(b * (k + 1), vocab)  # [B*(K+1), V] fp32 (a view)
        self.draft_logits = shared.cache[:b]  # [S = B, K, V] bf16, the drafter's cache
        drafts = shared.drafts[:b]  # [B, K]
        first = torch.zeros(b, 1, dtype=drafts.dtype, device=device)  # the request's last token (not read)
        self.draft_sampled = torch.cat([first, drafts], dim=1).reshape(-1)  # [B*(K+1)]
        self.cu_num_logits = (torch.arange(b + 1, device=device) * (k + 1)).to(torch.int32)  # [B+1]
        self.pos = (shared.positions[:b, None] + torch.arange(k + 1, device=device)).reshape(-1)  # [B*(K+1)]
        self.idx_mapping = torch.arange(b, dtype=torch.int32, device=device)  # [B], distinct slots
        self.expanded_idx_mapping = self.idx_mapping.repeat_interleave(k + 1)  # [B*(K+1)]
        self.expanded_local_pos = torch.arange(k + 1, dtype=torch.int32, device=device).repeat(b)  # [B*(K+1)]
        if mode == "mixed":
            table = torch.tensor(verify_grid.MIXED_TEMPERATURES, dtype=torch.float32, device=device)
            self.temperature = table[torch.arange(b, device=device) % len(verify_grid.MIXED_TEMPERATURES)]  # [S]
        else:
            self.temperature = torch.full((b,), float(mode), dtype=torch.float32, device=device)  # [S]
        self.seed = shared.seeds[:b]  # [S]
        self.layout = "standard"
        super().__init__(device == "cuda")

    def call(self, first: bool = False):
        from dspark_markov.bench.vllm_ops import interpreter_shims

        with interpreter_shims():
            self.result = self.sample(self.target, self.draft_logits, self.draft_sampled, self.cu_num_logits, self.pos,
                                      self.idx_mapping, self.expanded_idx_mapping, self.expanded_local_pos,
                                      self.temperature, self.seed, self.k)
        if first:
            self._check()

    def _check(self):
        sampled, counts = self.result
        b, k = counts.shape[0], self.k
        if bool((counts < 1).any()) or bool((counts > k + 1).any()):
            raise RuntimeError(f"vLLM's rejection sampler emitted counts outside [1, K+1]: {counts.tolist()}")
        valid = torch.arange(k + 1, device=counts.device)[None, :] < counts[:, None].long()
        tokens = sampled[valid]
        if bool((tokens < 0).any()) or bool((tokens >= self.vocab).any()):
            raise RuntimeError(f"vLLM's rejection sampler emitted a token outside [0, {self.vocab})")
        self.accepted_mean = float((counts - 1).float().mean())
        greedy = (self.temperature[self.idx_mapping.long()] == 0).nonzero().flatten().tolist()
        argmax = self.target.view(b, k + 1, -1).argmax(dim=2)  # [B, K+1]
        drafts = self.draft_sampled.view(b, k + 1)[:, 1:]
        self.greedy_match = None
        for r in greedy:
            accepted = 0
            while accepted < k and int(drafts[r, accepted]) == int(argmax[r, accepted]):
                accepted += 1
            expected = argmax[r, :accepted + 1].tolist()
            match = int(counts[r]) == accepted + 1 and sampled[r, :accepted + 1].tolist() == expected
            self.greedy_match = match if self.greedy_match is None else (self.greedy_match and match)

    def clear(self):
        for out in self.result:
            out.fill_(0)

    def outputs(self):
        sampled, counts = self.result
        valid = torch.arange(self.k + 1, device=counts.device)[None, :] < counts[:, None].long()
        return [counts, torch.where(valid, sampled, -1)]  # entries past a request's count are never written


# ------------------------------------------------------------------------------ the grid
def _record(args, part, impl, rows, mode) -> dict:
    from dspark_markov.bench import harness, verify_grid

    kernel = "filter_row" if part == "filter" else "verify_standard"
    work_rows, nbytes = verify_grid.kernel_bytes(args.config, kernel, rows, mode)
    record = {field: None for field in FIELDS}
    record.update(part=part, impl=impl, rows=rows, work_rows=work_rows, mode=mode, layout="-", status="ok",
                  timing=harness.graph_timing_label() if args.device == "cuda" else "host", minimal_bytes=nbytes, reason="")
    return record


def _set_up(args, key, rows, shared, record):
    from dspark_markov.bench import verify_grid, vllm_ops

    part, impl, mode = key
    try:
        if impl == "vllm":
            op = "filter" if part == "filter" else "rejection"
            function, origin = vllm_ops.load_op(op, args.source)
            record["reason"] = f"from {origin}"
            run_class = VllmFilterRun if part == "filter" else VllmRejectionRun
            run = run_class(function, mode, rows, shared, args.config)
        elif part == "filter":
            # the Triton filter in the layout top_k_top_p launches for these rows (split rows below one row per SM)
            kernel = "filter_row"
            if impl == "triton":
                from dspark_markov.verify import triton_filtering

                work = rows * (args.steps + 1)
                kernel = "filter_split" if triton_filtering.default_layout(work, args.vocab, args.device)[1] > 1 \
                    else "filter_row"
            run = verify_grid.FilterRunner(kernel, impl, mode, rows, shared, args.config)
        else:
            run = verify_grid.VerifyRunner("verify_standard", impl, mode, rows, shared, args.config)
    except (ValueError, ImportError) as error:
        record.update(status="n/a", reason=str(error))
        return None
    except Exception as error:  # noqa: BLE001 - one broken case must not lose the run
        record.update(status="error", reason=f"{type(error).__name__}: {error}")
        print(f"warning: {part} ({impl}) at {rows} requests, {mode}: {record['reason']}", file=sys.stderr)
        return None
    record["layout"] = run.layout
    record["graph_output_match"] = run.graph_output_match
    for field in ("agreement_rows", "agreement_tokens", "kept_diff", "greedy_match", "accepted_mean"):
        if hasattr(run, field):
            record[field] = getattr(run, field)
    if part == "filter" and impl != "vllm":
        record.update(agreement_rows=1.0, agreement_tokens=1.0, kept_diff=0.0)  # FilterRunner checked equality
    return run


def run_all(args) -> list:
    """Every case of every batch size of ``args``: the records (fields :data:`FIELDS`)."""
    from dspark_markov.bench import harness, roofline, verify_grid
    from dspark_markov.bench.grid import _NoBar

    records = []
    if args.device == "cuda" and not torch.cuda.is_available():
        for rows in args.rows:
            for part, impl, mode in cases(args):
                record = _record(args, part, impl, rows, mode)
                record.update(status="n/a", reason="no CUDA device (run on the GPU, or --device cpu under TRITON_INTERPRET=1)")
                records.append(record)
        return records
    device = torch.device(args.device)
    shared = verify_grid.SharedInputs(args.config)
    flush = harness.L2Flusher(device) if args.device == "cuda" else None
    for rows in args.rows:
        keyed = {key: _record(args, key[0], key[1], rows, key[2]) for key in cases(args)}
        try:
            records += harness.time_cases(
                keyed, lambda key, record: _set_up(args, key, rows, shared, record),
                lambda key: f"{key[0]} ({key[1]}) at {rows} requests, {key[2]}", rounds=args.rounds,
                replays=args.replays, eager_calls=args.eager_calls, cuda=args.device == "cuda", flush=flush,
                bar=_NoBar())
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: keep the other batch sizes
            print(f"warning: {rows} requests failed: {type(error).__name__}: {error}", file=sys.stderr)
            for record in keyed.values():
                if record["status"] == "ok" and record["time_us"] is None:
                    record.update(status="error", reason=f"{type(error).__name__}: {error}")
            records += list(keyed.values())
    bandwidth = roofline.measure_bandwidth(device)
    for record in records:
        record["floor_us"] = roofline.floor_us(record["minimal_bytes"], bandwidth.read_gbps)
        if record["time_us"]:
            record["bandwidth_fraction"] = record["floor_us"] / record["time_us"]
    args.bandwidth = bandwidth._asdict()
    return records


def _cell(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def format_table(records) -> str:
    header = ["part", "impl", "B", "rows", "mode", "time us (range)", "eager us", "% BW", "agree rows", "kept diff",
              "greedy", "status"]
    lines = [header]
    for r in records:
        time_cell = "-" if r["time_us"] is None else f"{r['time_us']:.1f} ({r['time_us_low']:.1f}-{r['time_us_high']:.1f})"
        fraction = None if r["bandwidth_fraction"] is None else 100 * r["bandwidth_fraction"]
        lines.append([r["part"], r["impl"], str(r["rows"]), str(r["work_rows"]), r["mode"], time_cell,
                      _cell(r["eager_us"]), _cell(fraction), _cell(r["agreement_rows"], ".3f"),
                      _cell(r["kept_diff"], ".2f"), "-" if r["greedy_match"] is None else str(r["greedy_match"]),
                      r["status"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in lines) + "\n"
    notes = sorted({f"{r['part']} ({r['impl']}, {r['status']}): {r['reason']}" for r in records
                    if r["status"] != "ok" or (r["impl"] == "vllm" and r["reason"])})
    return text + "".join(f"  {note}\n" for note in notes)


def write(args, records, argv) -> list:
    from dspark_markov.bench import report

    args.out.mkdir(parents=True, exist_ok=True)
    env_device = args.device if args.device == "cpu" or torch.cuda.is_available() else "cpu"
    env = report.environment(env_device, argv if argv is not None else sys.argv[1:])
    config = {name: getattr(args, name) for name in ("parts", "filter_impls", "rejection_impls", "rows", "vocab",
                                                     "steps", "kinds", "cases", "temperatures", "top_k", "top_p",
                                                     "rounds", "replays", "eager_calls", "seed", "device", "source")}
    timing = ("time_us: CUDA-graph replay of one call, L2 flushed before each replay (an in-place filter's input "
              "restored untimed before the flush), median of the round medians; eager_us: an eager call's wall time"
              if args.device == "cuda" else "time_us: time.perf_counter of eager calls on the CPU (interpreter)")
    json_path = args.out / "vllm_ops.json"
    json_path.write_text(json.dumps({"environment": env, "config": config, "bandwidth": getattr(args, "bandwidth", None),
                                     "timing": timing, "results": records}, indent=2, default=str) + "\n")
    csv_path = args.out / "vllm_ops.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=ENV_COLUMNS + FIELDS)
        writer.writeheader()
        for record in records:
            writer.writerow({**{name: env.get(name) for name in ENV_COLUMNS}, **record})
    return [json_path, csv_path]


# ------------------------------------------------------------------------------ compile check (no GPU)
SM90_UNITS = 132  # H200 SMs: the grid and split counts vLLM's launchers derive from num_compute_units()


def compile_check(args) -> int:
    """Compile vLLM's kernels of every case of ``args`` for sm_90 without a GPU (0 if all compiled)."""
    import importlib.util

    from dspark_markov.bench import vllm_ops

    spec = importlib.util.spec_from_file_location("compile_check", Path(__file__).resolve().parent / "compile_check.py")
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(checker._CompileOnlyDriver())
    JITFunction.run = checker._compile_only
    failures = 0
    k, vocab = args.steps, args.vocab
    meta = torch.device("meta")
    for part in args.parts:
        op = "filter" if part == "filter" else "rejection"
        try:
            function, origin = vllm_ops.load_op(op, args.source)
        except ImportError as error:
            print(f"FAIL {part}: {error}")
            failures += 1
            continue
        module = sys.modules[function.__module__]
        standins = sys.modules.get("vllm_standins")
        if standins is not None:  # what vLLM's CUDA platform reports on an H200
            standins.current_platform.is_cuda_alike = staticmethod(lambda: True)
            standins.num_compute_units = lambda device_index=None: SM90_UNITS
            module.num_compute_units = standins.num_compute_units
        print(f"{part}: {origin}")
        for rows in args.rows:
            work = rows * (k + 1)
            labels = []
            if part == "filter":
                for case in args.cases:
                    labels.append((f"filter {work} rows {case}", case))
            else:
                labels.append((f"rejection {rows} requests", None))
            for label, case in labels:
                try:
                    if part == "filter":
                        logits = torch.empty(work, vocab, dtype=torch.float32, device=meta)
                        kk = torch.empty(work, dtype=torch.int32, device=meta) if case == "k+p" else None
                        pp = torch.empty(work, dtype=torch.float32, device=meta)
                        function(logits, kk, pp, has_topp_only_rows=case == "p")
                        if work <= module._SPLIT_MAX_BATCH:  # CUDA-only in apply (device.type == "cuda")
                            if case == "p":
                                module._apply_topp_split(logits, None, pp, float("-inf"), SM90_UNITS)
                            else:
                                module._apply_topp_split(logits, kk, pp, float("-inf"), SM90_UNITS)
                    else:
                        n = rows * (k + 1)
                        function(torch.empty(n, vocab, dtype=torch.float32, device=meta),
                                 torch.empty(rows, k, vocab, dtype=torch.bfloat16, device=meta),
                                 torch.empty(n, dtype=torch.int64, device=meta),
                                 torch.empty(rows + 1, dtype=torch.int32, device=meta),
                                 torch.empty(n, dtype=torch.int64, device=meta),
                                 torch.empty(rows, dtype=torch.int32, device=meta),
                                 torch.empty(n, dtype=torch.int32, device=meta),
                                 torch.empty(n, dtype=torch.int32, device=meta),
                                 torch.empty(rows, dtype=torch.float32, device=meta),
                                 torch.empty(rows, dtype=torch.int64, device=meta), k)
                    print("ok  ", label)
                    for (name, warps), (regs, spills, shared) in sorted(checker._COMPILED.items()):
                        print(f"       {name} warps={warps}: registers {regs} spill bytes {spills} shared {shared}")
                    checker._COMPILED.clear()
                except Exception as error:  # noqa: BLE001 - report every failure, then exit non-zero
                    failures += 1
                    print("FAIL", label, f"{type(error).__name__}: {error}"[:3000])
    return 1 if failures else 0


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.compile_check:
        return compile_check(args)
    if args.list:
        for rows in args.rows:
            for part, impl, mode in cases(args):
                print(f"{part}\t{impl}\t{rows}\t{mode}")
        return 0
    records = run_all(args)
    print(format_table(records), end="")
    print("wrote " + ", ".join(str(path) for path in write(args, records, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
