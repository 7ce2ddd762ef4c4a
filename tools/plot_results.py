"""Plot committed sampler-grid results: ``{stem}.png`` next to each ``{stem}.json`` of ``dspark-markov bench``.

The GPU runs write JSON and CSV with ``--no-plot`` (the device machine's time is scarce; matplotlib is the ``bench``
extra); this renders their plots on any machine afterwards, from the committed numbers alone
(``bench.report.png_from_json``: time against rows per design, log-log, one panel per temperature mode, the floor
and the W2-read-once floor).

Usage (matplotlib installed, e.g. ``pip install -e .[bench]``)::

    PYTHONPATH=src python tools/plot_results.py benchmarks/results/NVIDIA-H200_2026-12-04_large4_bf16.json ...
"""

import sys

from dspark_markov.bench import report


def main(argv) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv[1:]:
        path = report.png_from_json(name)
        if path is None:
            return 1  # (no matplotlib: report.write_png said so)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
