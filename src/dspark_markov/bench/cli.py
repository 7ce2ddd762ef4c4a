"""``dspark-markov bench``: time the draft-sampler designs over a grid of batch sizes.

Run as ``dspark-markov bench [...]`` or ``python -m dspark_markov.bench.cli [...]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from . import grid, harness, report, roofline, vllm_loop

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def _int_list(text: str) -> tuple:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _name_list(text: str) -> tuple:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in grid.KNOWN_DESIGNS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected names among {', '.join(grid.KNOWN_DESIGNS)}, got {text!r}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-markov bench",
        description="Time one whole MarkovSampler.sample call (all steps) per design as a CUDA-graph replay with "
                    "a cold L2; report speedups over vLLM's own speculator loop (design vllm_loop, built from "
                    "vLLM's gumbel_sample; over our `loop` when that cannot be imported), the minimal bytes, two "
                    "floors (W2 read once per step / once per call) and the fraction of the measured HBM read "
                    "bandwidth.")
    parser.add_argument("--verify", action="store_true",
                        help="time verification (standard, block), top-k/top-p filtering and block inputs instead "
                             "of the samplers (bench/verify_grid.py; files get a _verify suffix; --steps is K = N; "
                             "--rank, --designs, --method, --targets do not apply; target logits are fp32)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a small reference run (V=2048, rank 32, rows 1,4) timed with perf_counter")
    parser.add_argument("--vocab", type=int, help="V (default 129280; cpu: 2048)")
    parser.add_argument("--rank", type=int, help="R_k (default 256; cpu: 32)")
    parser.add_argument("--steps", type=int, help="N draft steps (default 5)")
    parser.add_argument("--rows", type=_int_list, help="batch sizes (default 1,16,32,64,128,253; cpu: 1,4)")
    parser.add_argument("--designs", type=_name_list,
                        help=f"designs to time (default {','.join(grid.DESIGNS)}; cpu: reference, plus the Triton "
                             "designs when TRITON_INTERPRET=1)")
    parser.add_argument("--vllm-cache", metavar="DIR",
                        help="folder holding vLLM's gumbel_sample as extracted by `python tools/extract_vllm.py` "
                             "(default: .vllm-cache in the working directory or the repository root); design "
                             "vllm_loop uses an installed vLLM first, and shows as n/a when neither is there")
    parser.add_argument("--temperature", choices=("1", "mixed", "both"), default="both",
                        help="all slots at T=1, mixed T=0/0.6/1 per slot, or both")
    parser.add_argument("--method", choices=("gumbel", "inverse_cdf"),
                        help="preferred draw method; a design without it (loop: gumbel only) keeps its own, and the "
                             "method column says which ran (default: gumbel where a design has it)")
    parser.add_argument("--cache-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--logits-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5; cpu: 3)")
    parser.add_argument("--replays", type=int, help="timed replays per design and round (default 30; cpu: 5)")
    parser.add_argument("--eager-calls", type=int, help="eager calls per design and round (default 10)")
    parser.add_argument("--seed", type=int, help="seed of the random inputs (default 2026)")
    parser.add_argument("--l2-flush", choices=("dirty", "clean"),
                        help="the cold L2 before each replay: dirty (a written scratch buffer; the default, and the "
                             "README tables') or clean (a read one: no write-back of the flush's lines in the timed "
                             "kernel; files named _clean-l2); default: $DSPARK_MARKOV_L2_FLUSH, else dirty")
    parser.add_argument("--out", default="benchmarks/results", help="directory of the JSON/CSV/PNG files")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    parser.add_argument("--targets", action="store_true", help="print the issue-5 targets met or missed")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return parser


def _config(args) -> grid.BenchConfig:
    overrides = {name: getattr(args, name) for name in ("vocab", "rank", "steps", "rows", "designs", "rounds",
                                                         "replays", "eager_calls", "seed", "method")
                 if getattr(args, name) is not None}
    overrides["temperatures"] = grid.TEMPERATURE_MODES if args.temperature == "both" else (args.temperature,)
    overrides["cache_dtype"] = DTYPES[args.cache_dtype]
    overrides["logits_dtype"] = DTYPES[args.logits_dtype]
    if args.device == "cpu":
        return grid.cpu_config(**overrides)
    return grid.BenchConfig(device="cuda", **overrides)


def main(argv=None) -> int:
    """Run the benchmark; 0 on success, 2 on bad arguments, 1 without a CUDA GPU (unless --device cpu)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if not args.l2_flush:
        return _run(args, argv)
    # --l2-flush: the variable every L2Flusher reads (and the results' environment records), for this run only
    before = os.environ.get(harness.FLUSH_ENV)
    os.environ[harness.FLUSH_ENV] = args.l2_flush
    try:
        return _run(args, argv)
    finally:
        if before is None:
            os.environ.pop(harness.FLUSH_ENV, None)
        else:
            os.environ[harness.FLUSH_ENV] = before


def _unwritable(folder: str) -> str | None:
    """Why the results cannot be written into ``folder`` (created if missing), or None: checked before the run, so
    that a long benchmark's timings are not lost at the end."""
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".dspark-markov-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        return f"--out: cannot write files into {folder} ({error.strerror or error})"
    return None


def _run(args, argv) -> int:
    """:func:`main` after its arguments are parsed (and ``--l2-flush`` applied)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dspark-markov bench: needs a CUDA GPU (none found); `--device cpu` runs a small reference benchmark",
              file=sys.stderr)
        return 1
    reason = _unwritable(args.out)
    if reason is not None:
        print(f"dspark-markov bench: {reason}", file=sys.stderr)
        return 2
    if args.verify:
        from . import verify_grid

        return verify_grid.run_cli(args, argv)
    try:
        config = _config(args)
    except ValueError as error:
        print(f"dspark-markov bench: {error}", file=sys.stderr)
        return 2

    if args.vllm_cache:
        os.environ[vllm_loop.CACHE_ENV] = str(Path(args.vllm_cache).resolve())
    env = report.environment(config.device, argv)
    if grid.VLLM_LOOP in config.designs:
        try:
            env["vllm_gumbel_sample"] = vllm_loop.load_gumbel_sample()[1]
        except ImportError as error:
            env["vllm_gumbel_sample"] = None
            print(f"note: {grid.VLLM_LOOP} is n/a and speedups are over `loop`: {error}", file=sys.stderr)
    device = torch.device(config.device)
    bandwidth = roofline.measure_bandwidth(device)
    records = grid.run_grid(config, bandwidth, progress=not args.no_progress)
    checks = report.check_targets(records)
    checks12 = report.check_issue12_targets(records)

    print(f"{report.environment_line(env)} | V={config.vocab} rank {config.rank} N={config.steps} "
          f"cache {args.cache_dtype} logits {args.logits_dtype}")
    print(report.format_table(records, bandwidth))
    if args.markdown:
        print(report.format_table(records, bandwidth, markdown=True))
    if args.targets:
        print(report.format_targets(checks))
        print(report.format_issue12_targets(checks12))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = report.file_stem(env, config)
    written = [report.write_json(out / f"{stem}.json", env, config, bandwidth, records, checks, checks12),
               report.write_csv(out / f"{stem}.csv", env, config, bandwidth, records)]
    if not args.no_plot:
        written.append(report.write_png(out / f"{stem}.png", env, config, records))
    print("wrote " + ", ".join(str(path) for path in written if path is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
