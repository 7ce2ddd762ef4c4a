"""Print the README's compact benchmark tables from a ``dspark-markov bench`` result file.

Usage: ``python tools/readme_tables.py RESULTS.json [--temperature 1|mixed] [--designs a,b,...]``.

One markdown table per call: a line per batch size, a column per design with its time in
microseconds and, in parentheses, its speedup over vLLM's own loop (``vllm_loop``; over ``loop``
when the file has no ``vllm_loop``), the fastest draft design of the line in bold, then both
floors (W2 read once per step, and once per call). ``n/a`` where a design cannot run the case.
``--best-method gumbel`` bolds the fastest Gumbel design only (inverse CDF draws other tokens: a
choice of ``method``, not of ``impl``).

``--verify`` reads a ``dspark-markov bench --verify`` file instead and prints the verification table
(standard, raw logits, block, block with raw logits; T = 1 / mixed) and the top-k/top-p table (the
faster layout per case, the range over the input kinds), each beside issue 18's / issue 16's targets
and vLLM 0.33's figures from those issues; bold: within the target.
"""

from __future__ import annotations

import argparse
import json

BASELINES = ("vllm_loop", "loop")


def table(records: list, temperature: str, designs=None, best_method=None) -> str:
    records = [r for r in records if r["temperature"] == temperature]
    if not records:
        raise SystemExit(f"no records at temperature {temperature!r}")
    present = list(dict.fromkeys(r["design"] for r in records))
    designs = [d for d in (designs or present) if d in present]
    baseline = next((b for b in BASELINES if b in present), None)
    by_key = {(r["design"], r["rows"]): r for r in records}
    head = "| rows | " + " | ".join(f"`{d}`" for d in designs) + " | floor | floor W2x1 |"
    lines = [head, "|---:|" + "---:|" * (len(designs) + 2)]
    for rows in sorted({r["rows"] for r in records}):
        base = by_key.get((baseline, rows), {}).get("time_us") if baseline else None
        timed = {d: by_key[(d, rows)]["time_us"] for d in designs
                 if (d, rows) in by_key and by_key[(d, rows)]["status"] == "ok" and by_key[(d, rows)]["time_us"]}
        candidates = {d: t for d, t in timed.items() if d not in BASELINES
                      and best_method in (None, by_key[(d, rows)]["method"])}
        best = min(candidates, key=candidates.get) if candidates else None
        cells = []
        for design in designs:
            if design not in timed:
                cells.append("n/a")
                continue
            text = f"{timed[design]:.0f}"
            if base and design != baseline:
                text += f" ({base / timed[design]:.2f}x)"
            cells.append(f"**{text}**" if design == best else text)
        any_record = next(r for r in records if r["rows"] == rows)
        once = any_record.get("floor_w2_once_us")
        lines.append(f"| {rows} | " + " | ".join(cells) + f" | {any_record['floor_us']:.0f} | "
                     + (f"{once:.0f}" if once is not None else "-") + " |")
    return "\n".join(lines)


# vLLM 0.33 on the same H200 and inputs (issues 16 and 18): per request count.
VLLM_VERIFY = {1: "23.4 (34.2)", 16: "46.1 (80.9)", 64: "113.6 (249.3)", 253: "362.5 (1067.0)"}  # + its T pass
VERIFY_TARGETS = {1: (20, 22), 16: (40, 45), 64: (100, 110), 253: (300, 320)}  # standard, raw
VLLM_FILTER = {1: ("106-141", "70-100"), 16: ("128-159", "246-284"), 64: ("380-458", "607-833"),
               253: ("1431-1720", "2062-3202")}  # k + p, p only
FILTER_TARGETS = {1: (40, 40), 16: (80, 100), 64: (250, 300), 253: (900, 1000)}


def _ok(records, **match):
    return [r for r in records if r["status"] == "ok" and r["time_us"] and all(r.get(k) == v for k, v in match.items())]


def verify_table(records) -> str:
    """Verification: a line per request count, T = 1 / mixed per kernel."""
    kernels = ("verify_standard", "verify_raw", "verify_block", "verify_block_raw")
    lines = ["| requests | standard (T = 1 / mixed) | raw logits (T = 1 / mixed) | block (T = 1 / mixed) "
             "| block, raw (T = 1 / mixed) | issue-18 target (standard / raw) | vLLM (+ its T pass) | floor |",
             "|---:|" + "---:|" * 7]
    for rows in sorted({r["rows"] for r in _ok(records, kernel="verify_standard")}):
        cells = []
        for kernel in kernels:
            target = VERIFY_TARGETS.get(rows, (None, None))[1 if "raw" in kernel else 0]
            times = []
            for temperature in ("1", "mixed"):
                found = _ok(records, kernel=kernel, rows=rows, temperature=temperature)
                text = f"{found[0]['time_us']:.1f}" if found else "n/a"
                bold = found and target is not None and "block" not in kernel and found[0]["time_us"] <= target
                times.append(f"**{text}**" if bold else text)
            cells.append(" / ".join(times))
        target = VERIFY_TARGETS.get(rows)
        floor = _ok(records, kernel="verify_standard", rows=rows)[0]["floor_us"]
        lines.append(f"| {rows} | " + " | ".join(cells) + f" | {'<= %d / %d' % target if target else '-'} | "
                     f"{VLLM_VERIFY.get(rows, '-')} | {floor:.1f} |")
    return "\n".join(lines)


def _filter_cell(records, rows, case, impls, target):
    """The times of the faster layout of ``impls`` (lower median over the input kinds) as "lo-hi", bold if the
    slowest input kind is within ``target``; "n/a" without a record."""
    best = None
    for kernel in ("filter_row", "filter_split"):
        times = sorted(r["time_us"] for r in _ok(records, kernel=kernel, rows=rows)
                       if r["inputs"].split()[-1] == case and r.get("impl", "triton") in impls)
        if times and (best is None or times[len(times) // 2] < best[len(best) // 2]):
            best = times
    text = "n/a" if best is None else (f"{best[0]:.0f}" if round(best[0]) == round(best[-1])
                                       else f"{best[0]:.0f}-{best[-1]:.0f}")
    return f"**{text}**" if best and target is not None and best[-1] <= target else text


def filter_table(records) -> str:
    """Top-k/top-p: per request count and case, the layout with the lower median over the input kinds; with records
    of the CUDA filter (impl "cuda") beside the Triton filter's, both: "triton / cuda"."""
    with_cuda = bool(_ok(records, kernel="filter_row", impl="cuda"))
    ours = "ours (triton / cuda)" if with_cuda else "ours"
    lines = [f"| requests (rows) | k + p: {ours} / vLLM / target | p only: {ours} / vLLM / target "
             "| floor (read + write once) | block inputs |", "|---:|---:|---:|---:|---:|"]
    for rows in sorted({r["rows"] for r in _ok(records, kernel="filter_row")}):
        cells = []
        for index, case in enumerate(("k+p", "p")):
            target = FILTER_TARGETS.get(rows, (None, None))[index]
            text = _filter_cell(records, rows, case, ("triton", "reference"), target)
            if with_cuda:
                text += " / " + _filter_cell(records, rows, case, ("cuda",), target)
            cells.append(f"{text} / {VLLM_FILTER.get(rows, ('-', '-'))[index]} / "
                         + (f"<= {target}" if target is not None else "-"))
        any_filter = _ok(records, kernel="filter_row", rows=rows)[0]
        blocks = _ok(records, kernel="block_inputs", rows=rows)
        lines.append(f"| {rows} ({any_filter['work_rows']}) | " + " | ".join(cells) + f" | {any_filter['floor_us']:.1f} | "
                     + (f"{blocks[0]['time_us']:.1f}" if blocks else "-") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    parser.add_argument("--designs", help="comma-separated columns, in order (default: every design in the file)")
    parser.add_argument("--best-method", choices=("gumbel", "inverse_cdf"), help="bold the fastest of this method only")
    parser.add_argument("--verify", action="store_true", help="a bench --verify file: the verification and filter tables")
    args = parser.parse_args(argv)
    with open(args.results) as handle:
        records = json.load(handle)["results"]
    if args.verify:
        print(verify_table(records) + "\n\n" + filter_table(records))
        return 0
    print(table(records, args.temperature, args.designs.split(",") if args.designs else None, args.best_method))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
