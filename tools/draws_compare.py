"""Compare two ``tools/draws_digest.py`` outputs (old tree, new tree): tokens and cache digests per case."""

import json
import sys


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}


old, new = (load(p) for p in sys.argv[1:3])
bad = 0
for key in sorted(set(old) & set(new)) + sorted(set(old) ^ set(new)):
    a, b = old.get(key), new.get(key)
    if a is None or b is None or "error" in a or "error" in b:
        print(f"{key}: MISSING/ERROR old={a and a.get('error')} new={b and b.get('error')}")
        bad += 1
        continue
    same_cache = a["cache"] == b["cache"]
    diff = sum(x != y for ra, rb in zip(a["tokens"], b["tokens"]) for x, y in zip(ra, rb))
    total = sum(len(r) for r in a["tokens"])
    greedy_diff = sum(x != y for ra, rb, gr in zip(a["tokens"], b["tokens"], a["greedy_rows"]) if gr
                      for x, y in zip(ra, rb))
    print(f"{key}: tokens differ {diff}/{total} (of them on greedy rows: {greedy_diff}), cache {'identical' if same_cache else 'DIFFERS'}")
    if diff or not same_cache:
        bad += 1
print("RESULT", "bit-identical" if bad == 0 else f"{bad} cases differ")
sys.exit(1 if bad else 0)
