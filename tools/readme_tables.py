"""Print the README's compact benchmark tables from a ``dspark-markov bench`` result file.

Usage: ``python tools/readme_tables.py RESULTS.json [--temperature 1|mixed] [--designs a,b,...]``.

One markdown table per call: a line per batch size, a column per design with its time in
microseconds and, in parentheses, its speedup over vLLM's own loop (``vllm_loop``; over ``loop``
when the file has no ``vllm_loop``), the fastest draft design of the line in bold, then both
floors (W2 read once per step, and once per call). ``n/a`` where a design cannot run the case.
``--best-method gumbel`` bolds the fastest Gumbel design only (inverse CDF draws other tokens: a
choice of ``method``, not of ``impl``).
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    parser.add_argument("--designs", help="comma-separated columns, in order (default: every design in the file)")
    parser.add_argument("--best-method", choices=("gumbel", "inverse_cdf"), help="bold the fastest of this method only")
    args = parser.parse_args(argv)
    with open(args.results) as handle:
        records = json.load(handle)["results"]
    print(table(records, args.temperature, args.designs.split(",") if args.designs else None, args.best_method))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
