"""Time the candidate filter (``verify/triton_filtering_next.py``, issue 16) in ``bench --verify``'s
filter cases: the bench's FilterRunner is pointed at its ``TopKTopPFilter`` (every case is still
checked against the sort reference by its first call), and the rows that needed search rounds after
the first pass are printed. Writes ``NVIDIA-H200_filter_next_verify.{json,csv}`` to ``$JOB_OUT``
(or /tmp) after each group, so a timeout keeps what finished.

Usage on the GPU machine: ``PYTHONPATH=src python3 tools/time_filter_next.py [batch sizes, e.g. 1,253]``.
Budget compile time: the first call of each specialization compiles (a few seconds each on the H200).
"""

import os
import sys
import time
from pathlib import Path

import torch

from dspark_markov.bench import report, roofline
from dspark_markov.bench import verify_grid as vg
from dspark_markov.verify import triton_filtering, triton_filtering_next


def main():
    out = Path(os.environ.get("JOB_OUT", "/tmp"))
    sizes = tuple(int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,253,16,64").split(","))
    filters = []

    class Recorded(triton_filtering_next.TopKTopPFilter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            filters.append(self)

    triton_filtering.TopKTopPFilter = Recorded  # the bench's FilterRunner imports it at setup
    start = time.time()
    bw = roofline.measure_bandwidth(torch.device("cuda"))
    env = report.environment("cuda", ["tools/time_filter_next.py"])
    full = vg.VerifyBenchConfig(kernels=("filter_row", "filter_split"), rows=sizes, rounds=3, replays=15,
                                eager_calls=1)
    records = []
    for rows in sizes:
        kernel = "filter_split" if rows <= 16 else "filter_row"
        config = vg.VerifyBenchConfig(kernels=(kernel,), rows=(rows,), rounds=3, replays=15, eager_calls=1)
        records += vg.run_grid(config, bw, progress=False)
        print(vg.format_table(records[-6:], bw), end="", flush=True)
        print(f"t={time.time() - start:.1f}s rows needing search rounds: {[int(f.state.searched) for f in filters[-6:]]}",
              flush=True)
        vg.write_json(out / "NVIDIA-H200_filter_next_verify.json", env, full, bw, records)
        vg.write_csv(out / "NVIDIA-H200_filter_next_verify.csv", env, full, bw, records)
    print(vg.format_table(records, bw, markdown=True), flush=True)


if __name__ == "__main__":
    main()
