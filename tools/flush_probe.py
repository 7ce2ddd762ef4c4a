"""What the two kinds of cold L2 (``harness.L2Flusher`` modes ``dirty`` and ``clean``) cost a plain read.

Usage (GPU): ``PYTHONPATH=src python3 tools/flush_probe.py [--mb 70.32832,281.31328,1112.06656] [--rounds 5]
[--replays 20] [--stream]``: for each size, ``torch.amax`` over an fp32 buffer of that many MB (10^6 bytes; the
defaults are the verification inputs' bytes at 16 / 64 / 253 requests, ``bench --verify``'s min MB) captured in a
CUDA graph, timed after each mode's flush, the modes alternating
round by round; prints the median of the round medians (us) and the read rate (TB/s) of each mode. A dirty flush
leaves ~L2-size dirty lines that the timed read's misses write back; a clean one does not. ``--stream``: also a
plain Triton streaming read (persistent programs, ``P`` per SM, each summing ``UNROLL`` tiles of 1,024 fp32 per
step over a contiguous share), the best such read of those bytes, beside ``torch.amax``. ``--warm``: a third mode, no
flush at all (each replay reads what the previous one left in L2; a GPU sleep between replays): for sizes below the L2
this is the L2's read rate, the figure the 1-row chain's arithmetic (benchmarks/NOTES.md, "Stop 50") had to assume,
e.g. ``--stream --warm --mb 8,16,21.8,32,48``.
"""

import sys

import torch
import triton
import triton.language as tl

from dspark_markov.bench import harness


@triton.jit
def _stream_sum(x_ptr, out_ptr, n, share, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    # x [n] fp32 -> out [programs] fp32: program p sums x[p share : (p + 1) share], UNROLL tiles of BLOCK at a time
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * share
    end = tl.minimum(start + share, n)
    lane = tl.arange(0, BLOCK)
    step = tl.arange(0, UNROLL)[:, None] * BLOCK
    acc = tl.zeros([UNROLL, BLOCK], tl.float32)
    for base in range(start, end, BLOCK * UNROLL):
        token = base + step + lane[None, :]
        acc += tl.load(x_ptr + token, mask=token < end, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def _stream_reader(x, per_sm, unroll, warps):
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = sms * per_sm
    share = -(-x.numel() // programs)
    share = -(-share // (1024 * unroll)) * 1024 * unroll
    out = torch.empty(programs, device=x.device)

    def read():
        _stream_sum[(programs,)](x, out, x.numel(), share, BLOCK=1024, UNROLL=unroll, num_warps=warps)

    return read


def _arg(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv):
    sizes = [float(x) for x in _arg(argv, "--mb", "70.32832,281.31328,1112.06656").split(",")]
    rounds, replays = int(_arg(argv, "--rounds", "5")), int(_arg(argv, "--replays", "20"))
    device = torch.device("cuda")
    flushers = {mode: harness.L2Flusher(device, mode=mode) for mode in harness.FLUSH_MODES}
    if "--warm" in argv:
        # no memory traffic: the previous replay's lines stay in L2; a GPU sleep (~25 us) keeps the queue ahead of the
        # host, whose enqueue of a replay (~18 us) the first version (no sleep) measured instead of the read
        flushers["warm"] = lambda: torch.cuda._sleep(50_000)
    props = torch.cuda.get_device_properties(device)
    print(f"{torch.cuda.get_device_name()} | L2 {getattr(props, 'L2_cache_size', 0) >> 20} MB | torch.amax of fp32, "
          f"CUDA graph, median of {rounds} rounds x {replays} replays")
    for mb in sizes:
        x = torch.randn(round(mb * 1e6 / 4), device=device)  # mb MB (10^6 bytes) of fp32
        out = torch.empty((), device=device)

        def read(x=x, out=out):
            torch.amax(x, dim=0, out=out)

        readers = {"torch.amax": read}
        if "--stream" in argv:
            for per_sm, unroll, warps in ((1, 4, 8), (2, 4, 8), (2, 8, 8), (4, 4, 4), (8, 2, 4)):
                readers[f"triton P={per_sm} U={unroll} W={warps}"] = _stream_reader(x, per_sm, unroll, warps)
        graphs = {name: harness.capture_graph(fn) for name, fn in readers.items()}
        times = {(name, mode): [] for name in graphs for mode in flushers}
        for _ in range(rounds):
            for (name, mode), rounds_ in times.items():
                rounds_.append(harness.time_graph_replays(graphs[name], replays, flushers[mode]))
        for name in graphs:
            line = [f"{mb:9.3f} MB {name:24s}"]
            for mode in flushers:
                us = harness.summarize(times[(name, mode)]).median
                line.append(f"{mode} {us:8.1f} us {mb / us:5.2f} TB/s")
            print(" | ".join(line))
        del graphs, x


if __name__ == "__main__":
    main(sys.argv[1:])
