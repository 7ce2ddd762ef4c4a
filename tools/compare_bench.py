"""Compare two benchmark result files (``dspark-markov bench`` JSON) case by case.

Usage: ``python tools/compare_bench.py OLD.json NEW.json [--noise 0.03]``.

For every (design, method, rows, temperature) measured ``ok`` in both files it prints the two
times, their ratio and whether the new time lies within the noise of the old one: inside the old
run's round range (``time_us_low`` .. ``time_us_high``) widened by ``--noise`` (relative, default
3%: the run-to-run spread of cold-L2 graph replays on one GPU). The last line counts the cases
within noise, faster and slower. Used for the restructure check of issue 15 (times before and after).
"""

from __future__ import annotations

import argparse
import json


def key(record) -> tuple:
    return record["design"], record["method"], record["rows"], record["temperature"]


def compare(old: list, new: list, noise: float) -> list:
    """``(key, old_us, new_us, ratio, verdict)`` per case measured in both; verdict is
    ``"within noise"``, ``"faster"`` or ``"slower"``."""
    before = {key(r): r for r in old if r["status"] == "ok" and r["time_us"] is not None}
    rows = []
    for record in new:
        if record["status"] != "ok" or record["time_us"] is None or key(record) not in before:
            continue
        was = before[key(record)]
        low = min(was["time_us_low"], was["time_us"]) * (1.0 - noise)
        high = max(was["time_us_high"], was["time_us"]) * (1.0 + noise)
        time = record["time_us"]
        verdict = "within noise" if low <= time <= high else ("faster" if time < low else "slower")
        rows.append((key(record), was["time_us"], time, time / was["time_us"], verdict))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--noise", type=float, default=0.03, help="relative widening of the old round range")
    args = parser.parse_args(argv)
    with open(args.old) as a, open(args.new) as b:
        rows = compare(json.load(a)["results"], json.load(b)["results"], args.noise)
    print("| design | method | rows | T | old us | new us | new / old | verdict |")
    print("|---|---|---:|---|---:|---:|---:|---|")
    for (design, method, count, temperature), was, now, ratio, verdict in rows:
        print(f"| {design} | {method} | {count} | {temperature} | {was:.1f} | {now:.1f} | {ratio:.3f} | {verdict} |")
    counts = {v: sum(1 for row in rows if row[4] == v) for v in ("within noise", "faster", "slower")}
    print(f"\n{len(rows)} cases: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
