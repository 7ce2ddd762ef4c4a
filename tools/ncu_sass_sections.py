"""Instructions and stall samples per section of a kernel's SASS, from an Nsight Compute source CSV.

Usage: ``python3 tools/ncu_sass_sections.py FILE.csv [NAME:FIRST-LAST ...]`` where FILE.csv comes from
``ncu --import R.ncu-rep --page source --csv --print-source sass`` and each section is a range of SASS line numbers
(0-based, as ``--list`` prints them). ``--list PATTERN``: the lines whose SASS contains PATTERN (e.g. ``MUFU.LG2``,
``STRONG.SYS``), with their executed count and samples, to find the boundaries. ``--top N``: the N lines with the
most stall samples, each with its two largest stall reasons. Prints, per section, the warp
instructions executed, the sampled stalls and the top stall reasons.
"""

import csv
import sys


def load(path):
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if len(rows) < 2:
        raise SystemExit(f"{path}: not an Nsight Compute source CSV (no header line)")
    header, data = rows[1], rows[2:]
    return {h: i for i, h in enumerate(header)}, header, data


def number(text):
    return float(text) if text else 0.0


def main(argv):
    if not argv:
        raise SystemExit(__doc__)
    index, header, data = load(argv[0])
    executed, samples = index["Instructions Executed"], index["Warp Stall Sampling (All Samples)"]
    if len(argv) > 1 and argv[1] == "--list":
        if len(argv) < 3:
            raise SystemExit("--list: give a PATTERN (a SASS substring, e.g. MUFU.LG2)")
        for k, row in enumerate(data):
            if argv[2] in row[1]:
                print(f"{k:6d} {number(row[executed]):10.0f} {number(row[samples]):5.0f}  {row[1].strip()[:80]}")
        return
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    if len(argv) > 1 and argv[1] == "--top":
        count = int(argv[2]) if len(argv) > 2 else 30
        for k, row in sorted(enumerate(data), key=lambda kr: -number(kr[1][samples]))[:count]:
            reasons = sorted(((number(row[index[h]]), h[6:]) for h in stalls), reverse=True)[:2]
            print(f"{k:6d} {number(row[executed]):10.0f} {number(row[samples]):5.0f}  "
                  + " ".join(f"{h} {v:.0f}" for v, h in reasons if v > 0) + f"  {row[1].strip()[:70]}")
        return
    total = sum(number(r[samples]) for r in data)
    print(f"{argv[0]}: {len(data)} SASS lines, {sum(number(r[executed]) for r in data):.0f} warp instructions, "
          f"{total:.0f} stall samples")
    for spec in argv[1:]:
        name, _, span = spec.rpartition(":")
        first, last = (int(v) for v in span.split("-"))
        part = data[first:last]
        count = sum(number(r[samples]) for r in part)
        reasons = sorted(((sum(number(r[index[h]]) for r in part), h[6:]) for h in stalls), reverse=True)[:4]
        print(f"{name:24s} {first:5d}-{last:5d} {sum(number(r[executed]) for r in part):10.0f} inst "
              f"{count:6.0f} samples ({100 * count / max(total, 1):4.1f}%)  "
              + ", ".join(f"{h} {v:.0f}" for v, h in reasons if v > 0))


if __name__ == "__main__":
    main(sys.argv[1:])
