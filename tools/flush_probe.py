"""What the two kinds of cold L2 (``harness.L2Flusher`` modes ``dirty`` and ``clean``) cost a plain read.

Usage (GPU): ``PYTHONPATH=src python3 tools/flush_probe.py [--mb 70,281,1112] [--rounds 5] [--replays 20]``: for
each size, ``torch.amax`` over an fp32 buffer of that many MB (the bytes of the verification inputs at 16 / 64 /
253 requests) captured in a CUDA graph, timed after each mode's flush, the modes alternating round by round;
prints the median of the round medians (us) and the read rate (TB/s) of each mode. A dirty flush leaves ~L2-size
dirty lines that the timed read's misses write back; a clean one does not.
"""

import sys

import torch

from dspark_markov.bench import harness


def _arg(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv):
    sizes = [int(x) for x in _arg(argv, "--mb", "70,281,1112").split(",")]
    rounds, replays = int(_arg(argv, "--rounds", "5")), int(_arg(argv, "--replays", "20"))
    device = torch.device("cuda")
    flushers = {mode: harness.L2Flusher(device, mode=mode) for mode in harness.FLUSH_MODES}
    props = torch.cuda.get_device_properties(device)
    print(f"{torch.cuda.get_device_name()} | L2 {getattr(props, 'L2_cache_size', 0) >> 20} MB | torch.amax of fp32, "
          f"CUDA graph, median of {rounds} rounds x {replays} replays")
    for mb in sizes:
        x = torch.randn(mb << 18, device=device)  # mb MB of fp32
        out = torch.empty((), device=device)

        def read(x=x, out=out):
            torch.amax(x, dim=0, out=out)

        graph = harness.capture_graph(read)
        times = {mode: [] for mode in flushers}
        for _ in range(rounds):
            for mode, flush in flushers.items():
                times[mode].append(harness.time_graph_replays(graph, replays, flush))
        line = [f"{mb:5d} MB"]
        for mode, rounds_ in times.items():
            us = harness.summarize(rounds_).median
            line.append(f"{mode} {us:8.1f} us {mb * 2**20 / us / 1e6:5.2f} TB/s")
        print(" | ".join(line))
        del graph, x


if __name__ == "__main__":
    main(sys.argv[1:])
