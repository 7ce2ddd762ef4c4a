"""Reports of a benchmark run: terminal and markdown tables, JSON, CSV, a PNG plot, the targets.

Every file carries the environment it was measured in (GPU, driver, torch, Triton, CUDA, date,
command line), so committed results stay interpretable.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from .._version import __version__

TARGET_DESIGNS = ("fused", "chain")
ENV_FIELDS = ("gpu", "driver", "torch", "triton", "cuda", "python", "date", "command")
RECORD_FIELDS = ("design", "method", "rows", "temperature", "status", "time_us", "time_us_low", "time_us_high",
                 "eager_us", "speedup_vs_loop", "speedup_vs_vllm_loop", "minimal_bytes", "floor_us",
                 "bandwidth_fraction", "minimal_bytes_w2_once", "floor_w2_once_us", "graph_tokens_match", "reason")
CONFIG_FIELDS = ("device", "vocab", "rank", "steps", "cache_dtype", "logits_dtype", "weight_dtype", "rounds",
                 "replays", "eager_calls", "seed", "method")


def _package_version(name: str):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version():
    """The NVIDIA driver version from ``nvidia-smi``, or ``None`` where it cannot be asked."""
    try:
        answer = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = answer.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def environment(device: str, argv) -> dict:
    """GPU, driver, torch, Triton, CUDA and Python versions, the UTC date and the command line."""
    cuda = device == "cuda"
    env = {
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "driver": _driver_version() if cuda else None,
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["dspark-markov", "bench", *argv]),
        "dspark_markov": __version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if cuda:
        from . import harness

        env["l2_flush"] = harness.flush_mode()  # which cold L2 the replays saw (harness docstring)
        props = torch.cuda.get_device_properties(0)
        env.update(sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                   l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0) or None)
    return env


def config_dict(config) -> dict:
    values = {}
    for field in CONFIG_FIELDS:
        value = getattr(config, field)
        values[field] = str(value).replace("torch.", "") if isinstance(value, torch.dtype) else value
    values.update(rows=list(config.rows), designs=list(config.designs), temperatures=list(config.temperatures))
    return values


def file_stem(env: dict, config) -> str:
    """``<gpu>_<date>_<cache dtype>`` (plus the shape when it is not DeepSeek-V4.1's)."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", env["gpu"] or "cpu").strip("-")
    cache = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(config.cache_dtype, str(config.cache_dtype))
    stem = f"{name}_{env['date'][:10]}_{cache}"
    if (config.vocab, config.rank, config.steps) != (129_280, 256, 5):
        stem += f"_v{config.vocab}_r{config.rank}_n{config.steps}"
    if config.method is not None:
        stem += f"_{config.method}"
    if config.logits_dtype != torch.bfloat16:
        stem += "_fp32-logits"
    return stem + flush_suffix(env)


def flush_suffix(env: dict) -> str:
    """The results' file-name suffix of a run's cold L2: ``_clean-l2`` for the clean flush, none for the default."""
    return "_clean-l2" if env.get("l2_flush") == "clean" else ""


# ----------------------------------------------------------------------------------------------
# Tables


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _row_cells(record, field: str = "speedup_vs_loop") -> list:
    if record["status"] != "ok":
        time_cell = record["status"]
    else:
        time_cell = f"{record['time_us']:.1f} ({record['time_us_low']:.1f}-{record['time_us_high']:.1f})"
    fraction = record["bandwidth_fraction"]
    return [record["design"], record["method"] or "-", str(record["rows"]), record["temperature"], time_cell, _fmt(record["eager_us"], ".1f"),
            _fmt(record.get(field), ".2f"), f"{record['minimal_bytes'] / 1e6:.1f}", f"{record['floor_us']:.1f}",
            _fmt(record.get("floor_w2_once_us"), ".1f"), "-" if fraction is None else f"{100 * fraction:.1f}"]


HEADER = ["design", "method", "rows", "T", "time us (round range)", "eager us", "x loop", "min MB", "floor us",
          "floor W2x1 us", "% read BW"]


def speedup_field(records) -> str:
    """The speedup the tables show: over vLLM's own loop (``vllm_loop``) when the run measured it,
    else over our ``loop`` design."""
    if any(r["design"] == "vllm_loop" and r["time_us"] is not None for r in records):
        return "speedup_vs_vllm_loop"
    return "speedup_vs_loop"


def format_table(records, bandwidth, *, markdown: bool = False) -> str:
    """The results as an aligned text table, or a markdown table when ``markdown``.

    The speedup column is over vLLM's own loop when the run has it (header ``x vLLM loop``), else
    over our ``loop`` (``x loop``)."""
    field = speedup_field(records)
    header = list(HEADER)
    header[header.index("x loop")] = "x vLLM loop" if field == "speedup_vs_vllm_loop" else "x loop"
    rows = [_row_cells(r, field) for r in records]
    grouped = {}  # (design, status, reason) -> the cases it applies to
    for r in records:
        if r["status"] != "ok":
            grouped.setdefault((r["design"], r["status"], r["reason"]), []).append(f"{r['rows']}/{r['temperature']}")
    notes = [f"{design} ({status}) at rows/T {', '.join(cases)}: {reason}"
             for (design, status, reason), cases in grouped.items()]
    footer = (f"bandwidth: copy {bandwidth.copy_gbps:.0f} GB/s, read {bandwidth.read_gbps:.0f} GB/s; "
              "min MB = bytes a minimal design moves (all steps); floor = min MB / read bandwidth; "
              "floor W2x1 = the same with W2 read once per call (not once per step); % read BW = floor / time")
    return render_table(header, rows, footer, notes, markdown=markdown)


def render_table(header, rows, footer: str, notes, *, markdown: bool = False) -> str:
    """``rows`` (lists of cell strings) under ``header`` as an aligned text table with ``footer``
    and the ``notes`` on cases not measured, or as a markdown table with the footer only."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in rows]
        return "\n".join(lines + ["", footer]) + "\n"
    widths = [max(len(h), *(len(cells[i]) for cells in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in rows]
    lines += ["", footer]
    if notes:
        lines += ["", "not measured:"] + [f"  {note}" for note in notes]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Targets (issue 5)


def check_targets(records) -> list:
    """Issue-5 targets for the designs fused and chain, per temperature mode.

    1 row <= 50 us; every measured row count in 16..253 at >= 85 % of the measured read bandwidth
    over the minimal bytes; >= 3x loop at 1 row; >= 5x loop at 253 rows. ``met`` is ``None`` when
    the grid did not measure the case (a design n/a, a row count not in the grid, no loop).
    """
    by_key = {(r["design"], r["rows"], r["temperature"]): r for r in records}
    modes = list(dict.fromkeys(r["temperature"] for r in records))
    grid_rows = sorted({r["rows"] for r in records})
    checks = []
    for design in TARGET_DESIGNS:
        for mode in modes:
            def add(target, rows, field, required, at_least):
                record = by_key.get((design, rows, mode))
                value = None if record is None else record[field]
                met = None if value is None else (value >= required if at_least else value <= required)
                checks.append({"design": design, "temperature": mode, "target": target, "rows": rows,
                               "value": value, "required": required, "met": met})

            add("time at 1 row <= 50 us", 1, "time_us", 50.0, False)
            for rows in [r for r in grid_rows if 16 <= r <= 253] or [16]:
                add(f"read bandwidth at {rows} rows >= 85 %", rows, "bandwidth_fraction", 0.85, True)
            add("speedup over loop at 1 row >= 3x", 1, "speedup_vs_loop", 3.0, True)
            add("speedup over loop at 253 rows >= 5x", 253, "speedup_vs_loop", 5.0, True)
    return checks


# Issue 12 (T = 1, bf16 cache): (rows, methods, time target us, speedup target over vLLM's loop).
ISSUE12_TARGETS = ((1, ("gumbel", "inverse_cdf"), 40.0, 4.5), (16, ("gumbel", "inverse_cdf"), 60.0, 5.0),
                   (64, ("gumbel", "inverse_cdf"), 150.0, 3.3), (253, ("inverse_cdf",), 270.0, 5.0),
                   (253, ("gumbel",), 420.0, 3.3))
BASELINE_DESIGNS = ("reference", "loop", "vllm_loop")


def check_issue12_targets(records) -> list:
    """Issue-12 targets: the fastest design (not a baseline) of the given methods at T = 1, its
    time and its speedup over vLLM's own loop (``met`` is ``None`` when not measured)."""
    checks = []
    for rows, methods, time_target, speedup_target in ISSUE12_TARGETS:
        candidates = [r for r in records if r["rows"] == rows and r["temperature"] == "1" and r["time_us"] is not None
                      and r["method"] in methods and r["design"] not in BASELINE_DESIGNS]
        best = min(candidates, key=lambda r: r["time_us"], default=None)
        label = "/".join(methods)
        for target, field, required, at_least in (
                (f"{label} time at {rows} rows <= {time_target:g} us", "time_us", time_target, False),
                (f"{label} speedup over vLLM's loop at {rows} rows >= {speedup_target:g}x", "speedup_vs_vllm_loop",
                 speedup_target, True)):
            value = None if best is None else best.get(field)
            met = None if value is None else (value >= required if at_least else value <= required)
            checks.append({"design": None if best is None else best["design"], "temperature": "1", "target": target,
                           "rows": rows, "value": value, "required": required, "met": met})
    return checks


def format_issue12_targets(checks) -> str:
    lines = ["issue-12 targets (T = 1, fastest design):"]
    for check in checks:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        value = check["value"]
        shown = "-" if value is None else (f"{value:.2f}x" if "speedup" in check["target"] else f"{value:.1f} us")
        lines.append(f"  {check['target']:<58} {shown:>10}  {check['design'] or '-':<12} {verdict}")
    return "\n".join(lines) + "\n"


def format_targets(checks) -> str:
    lines = ["issue-5 targets (fused, chain):"]
    for check in checks:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        value = check["value"]
        if value is None:
            shown = "-"
        elif "bandwidth" in check["target"]:
            shown = f"{100 * value:.1f} %"
        elif "speedup" in check["target"]:
            shown = f"{value:.2f}x"
        else:
            shown = f"{value:.1f} us"
        lines.append(f"  {check['design']:<6} T={check['temperature']:<5} {check['target']:<40} {shown:>10}  {verdict}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Files


def write_json(path, env, config, bandwidth, records, checks, checks12=None) -> Path:
    extra = {} if checks12 is None else {"targets_issue12": checks12}
    return write_results_json(path, env, config_dict(config), bandwidth, records, _timing_note(config),
                              targets=checks, **extra)


def write_results_json(path, env, config_values: dict, bandwidth, records, timing: str, **extra) -> Path:
    """JSON of a run: environment, configuration, bandwidths, how ``time_us`` was taken, the
    records, then any ``extra`` sections (e.g. the targets)."""
    payload = {"environment": env, "config": config_values, "bandwidth": bandwidth._asdict(),
               "bandwidth_used_for_fraction": "read_gbps", "timing": timing, "results": records, **extra}
    path = Path(path)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def environment_line(env: dict) -> str:
    """``GPU | torch | triton | CUDA | driver`` of a run, the first part of its table header."""
    return (f"{env['gpu'] or 'cpu'} | torch {env['torch']} | triton {env['triton']} | CUDA {env['cuda']} | "
            f"driver {env['driver']}")


def _timing_note(config) -> str:
    if config.device == "cuda":
        return ("time_us: CUDA-graph replay of one MarkovSampler.sample call (all steps), L2 flushed before each "
                "replay, median of the round medians; eager_us: wall time of an eager call (check_values=False), "
                "synchronised before and after")
    return "time_us: time.perf_counter of eager calls on the CPU (no graphs, no L2 flush)"


def write_csv(path, env, config, bandwidth, records) -> Path:
    """One line per result; each line repeats the environment, the shape and the bandwidth."""
    values = config_dict(config)
    shape = {field: values[field] for field in ("device", "vocab", "rank", "steps", "cache_dtype", "logits_dtype")}
    return write_records_csv(path, env, shape, bandwidth, records, RECORD_FIELDS)


def write_records_csv(path, env, shape: dict, bandwidth, records, record_fields) -> Path:
    """CSV of ``records`` (columns ``record_fields``), each line prefixed by the environment
    (:data:`ENV_FIELDS`), the ``shape`` columns and the measured bandwidths."""
    fixed = {field: env.get(field) for field in ENV_FIELDS}
    fixed.update(shape)
    fixed.update(copy_gbps=bandwidth.copy_gbps, read_gbps=bandwidth.read_gbps)
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fixed) + list(record_fields))
        writer.writeheader()
        for record in records:
            writer.writerow({**fixed, **{field: record[field] for field in record_fields}})
    return path


def write_png(path, env, config, records):
    """Time against rows per design (log-log), one panel per temperature mode, with the floor (minimal bytes at the
    measured read bandwidth) and, where the records have it, the second floor of issue 12 (W2 read once per call).
    ``config``: anything with ``vocab``, ``rank``, ``steps`` and ``cache_dtype`` (a :class:`grid.GridConfig`, or the
    ``config`` section of a results JSON: :func:`png_from_json`).

    Returns the path, or ``None`` when matplotlib is not installed (``pip install dspark-markov[bench]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG written", file=sys.stderr)
        return None
    modes = list(dict.fromkeys(r["temperature"] for r in records))
    figure, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False, sharey=True)
    for axis, mode in zip(axes[0], modes):
        subset = [r for r in records if r["temperature"] == mode]
        for design in dict.fromkeys(r["design"] for r in subset):
            points = [r for r in subset if r["design"] == design and r["time_us"] is not None]
            if not points:
                continue
            rows = [r["rows"] for r in points]
            times = [r["time_us"] for r in points]
            spread = [[t - r["time_us_low"] for t, r in zip(times, points)],
                      [r["time_us_high"] - t for t, r in zip(times, points)]]
            axis.errorbar(rows, times, yerr=spread, marker="o", capsize=3, label=design)
        floor = sorted({(r["rows"], r["floor_us"]) for r in subset})
        axis.plot([f[0] for f in floor], [f[1] for f in floor], "k--", label="floor: minimal bytes / read BW")
        once = sorted({(r["rows"], r["floor_w2_once_us"]) for r in subset if r.get("floor_w2_once_us") is not None})
        if once:
            axis.plot([f[0] for f in once], [f[1] for f in once], "k:", label="floor with W2 read once per call")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.minorticks_off()
        axis.set_xticks([f[0] for f in floor])
        axis.set_xticklabels([str(f[0]) for f in floor])
        axis.set_xlabel("rows")
        axis.set_title("T = 1" if mode == "1" else "mixed T (0 / 0.6 / 1)")
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("microseconds per call (all steps)")
    cache = str(config.cache_dtype).replace("torch.", "")
    figure.suptitle(f"{env['gpu'] or 'cpu'}: V={config.vocab}, rank {config.rank}, N={config.steps}, "
                    f"{cache} cache")
    legend = {}  # one legend below the panels (inside them it hid the lines): every panel's designs and floors
    for axis in axes[0]:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    columns = min(len(legend), 6)
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=columns, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.04 * -(-len(legend) // columns) + 0.02, 1, 1))
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def png_from_json(json_path, png_path=None):
    """The plot of :func:`write_png` for a committed results JSON (``dspark-markov bench``'s ``{stem}.json``: its
    ``environment``, ``config`` and ``results``), written next to it as ``{stem}.png`` unless ``png_path`` is given.
    Returns the path, or ``None`` without matplotlib; ``ValueError`` for a JSON that is not a sampler grid."""
    json_path = Path(json_path)
    payload = json.loads(json_path.read_text())
    records = payload.get("results")
    if not isinstance(records, list) or not records or not all("design" in r and "floor_us" in r for r in records):
        raise ValueError(f"json_path: {json_path} holds no sampler grid (a results list with design and floor_us)")
    config = SimpleNamespace(**payload["config"])
    return write_png(png_path or json_path.with_suffix(".png"), payload["environment"], config, records)
