"""Print ``draft/auto.py``'s AUTO_TABLE buckets from benchmark results.

Usage: ``PYTHONPATH=src python tools/auto_table.py benchmarks/results/NVIDIA-H200_..._bf16.json [...]``.
For each file (one cache dtype) and each method it prints ``(max rows, impl)`` buckets of the
fastest design per measured batch size (:func:`dspark_markov.draft.auto.table_from_results`), with
and without the native (CUDA C++) designs: ``AUTO_TABLE`` and ``PORTABLE_TABLE``.
"""

import json
import sys

from dspark_markov.draft.auto import table_from_results
from dspark_markov.registry import NATIVE_DESIGNS


def main(paths):
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        cache = data["config"]["cache_dtype"]
        for method in ("gumbel", "inverse_cdf"):
            for name, exclude in (("AUTO_TABLE", ()), ("PORTABLE_TABLE", NATIVE_DESIGNS)):
                try:
                    table = table_from_results(data["results"], method, exclude=exclude)
                except ValueError:
                    continue
                print(f"{path}: {name}, cache {cache}, method {method}: {table}")


if __name__ == "__main__":
    main(sys.argv[1:])
