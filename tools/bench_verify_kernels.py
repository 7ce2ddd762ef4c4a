"""``dspark-markov bench --verify`` restricted to some kernels (same harness, same JSON/CSV writers).

Usage: ``PYTHONPATH=src python3 tools/bench_verify_kernels.py OUT_DIR [kernel,...] [--rows 1,16,64,253]
[--temperatures 1,mixed] [--impls triton,cuda] [--rounds R] [--replays N]``. Default kernels: the four verification
kernels (``verify_standard``, ``verify_block``, ``verify_raw``, ``verify_block_raw``). The files are
named and written as the full benchmark writes them (``<gpu>_<date>_bf16_verify.json/.csv``).
"""

import sys
from pathlib import Path

import torch

from dspark_markov.bench import report, roofline, verify_grid


def main(argv):
    out = Path(argv[0])
    kernels = ("verify_standard", "verify_block", "verify_raw", "verify_block_raw")
    rows, temperatures, rounds, replays = (1, 16, 64, 253), ("1", "mixed"), 5, 30
    impls = ("triton",)
    rest = argv[1:]
    i = 0
    while i < len(rest):
        if rest[i] == "--rows":
            rows = tuple(int(x) for x in rest[i + 1].split(","))
            i += 2
        elif rest[i] == "--temperatures":
            temperatures = tuple(rest[i + 1].split(","))
            i += 2
        elif rest[i] == "--rounds":
            rounds = int(rest[i + 1])
            i += 2
        elif rest[i] == "--impls":
            impls = tuple(rest[i + 1].split(","))
            i += 2
        elif rest[i] == "--replays":
            replays = int(rest[i + 1])
            i += 2
        else:
            kernels = tuple(rest[i].split(","))
            i += 1
    config = verify_grid.VerifyBenchConfig(device="cuda", rows=rows, kernels=kernels, temperatures=temperatures,
                                           rounds=rounds, replays=replays, impls=impls)
    env = report.environment("cuda", ["bench", "--verify"] + argv[1:])
    env["command"] = "python3 tools/bench_verify_kernels.py " + " ".join(argv)
    bandwidth = roofline.measure_bandwidth(torch.device("cuda"))
    print(f"bandwidth: read {bandwidth.read_gbps:.0f} GB/s; timing {len(kernels)} kernels x {len(rows)} batch sizes",
          flush=True)
    records = verify_grid.run_grid(config, bandwidth, progress=True)
    print(f"{report.environment_line(env)} | V={config.vocab} K=N={config.steps} cache bf16")
    print(verify_grid.format_table(records, bandwidth), end="")
    print(verify_grid.format_table(records, bandwidth, markdown=True), end="")
    out.mkdir(parents=True, exist_ok=True)
    stem = verify_grid.file_stem(env, config)
    written = [verify_grid.write_json(out / f"{stem}.json", env, config, bandwidth, records),
               verify_grid.write_csv(out / f"{stem}.csv", env, config, bandwidth, records)]
    print("wrote " + ", ".join(str(path) for path in written))


if __name__ == "__main__":
    main(sys.argv[1:])
