"""Print ``draft/auto.py``'s AUTO_TABLE buckets from benchmark results.

Usage: ``PYTHONPATH=src python tools/auto_table.py benchmarks/results/NVIDIA-H200_..._bf16.json [...]``.
Files of the same cache dtype and ``--method`` setting (the config's ``method``: ``None`` for
a run of both methods) are merged in the order given (:func:`dspark_markov.draft.auto.
merge_results`: a later file's measurement of a design replaces an earlier one, so give a full run
first and partial re-runs after it). For each cache dtype and each method it prints ``(max rows,
impl)`` buckets of the fastest design per measured batch size (:func:`~dspark_markov.draft.auto.
table_from_results`), with and without the native (CUDA C++) designs: ``AUTO_TABLE`` and
``PORTABLE_TABLE``.
"""

import json
import sys

from dspark_markov.draft.auto import merge_results, table_from_results
from dspark_markov.registry import NATIVE_DESIGNS


def main(paths):
    runs = {}  # (cache dtype, the run's method setting) -> record lists, in the order given
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        key = (data["config"]["cache_dtype"], data["config"].get("method"))
        runs.setdefault(key, []).append((path, data["results"]))
    for (cache, _), files in runs.items():
        records = merge_results(*(results for _, results in files))
        names = " + ".join(path for path, _ in files)
        for method in ("gumbel", "inverse_cdf"):
            for name, exclude in (("AUTO_TABLE", ()), ("PORTABLE_TABLE", NATIVE_DESIGNS)):
                try:
                    table = table_from_results(records, method, exclude=exclude)
                except ValueError:
                    continue
                print(f"{names}: {name}, cache {cache}, method {method}: {table}")


if __name__ == "__main__":
    main(sys.argv[1:])
