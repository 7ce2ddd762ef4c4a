"""Where the time of one impl="cuda_chain" call goes: phase timestamps from inside the kernel.

Usage: ``PYTHONPATH=src python3 tools/trace_cuda_chain.py [--rows 1,16] [--steps 5]``. Builds the
backend with ``trace=True`` (thread 0 of the first and the last block records clock64() at each
phase boundary: chain.cu DM_TRACE), runs a few eager calls each after an L2 flush, converts cycles
to microseconds with the clock rate implied by the last call's event time, and prints per step the
block's compute (codes ready -> its words merged), the barrier wait and the token phase (word read,
W1 gather), for the first and the last block.
"""

import argparse

import torch

import dspark_markov as dm
from dspark_markov.bench import harness
from dspark_markov.draft.cuda_chain import CudaChainBackend


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warps", type=int, default=None)
    parser.add_argument("--reg-tiles", type=int, default=None)
    parser.add_argument("--flags", type=int, default=0)
    parser.add_argument("--variant", type=int, default=None, help="kernel variant (default: the backend's, by batch)")
    args = parser.parse_args()
    vocab, rank, steps, device = 129_280, 256, args.steps, torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, device=device, generator=gen) * 0.05).bfloat16(),
                         (torch.randn(vocab, rank, device=device, generator=gen) * 0.05).bfloat16())
    flush = harness.L2Flusher(device)
    for rows in map(int, args.rows.split(",")):
        backend = CudaChainBackend(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, device=device,
                                   trace=True, warps=args.warps, reg_tiles=args.reg_tiles,
                                   flags=args.flags, variant=args.variant)
        base = (torch.randn(rows, steps, vocab, device=device, generator=gen) * 2).bfloat16()
        inputs = [base, torch.randint(0, vocab, (rows,), device=device, generator=gen),
                  torch.arange(rows, device=device).repeat_interleave(steps),
                  torch.randint(1, 1 << 20, (rows * steps,), device=device, generator=gen),
                  torch.ones(rows, device=device), torch.randint(0, 1 << 62, (rows,), device=device, generator=gen)]
        tokens = torch.empty(rows, steps, dtype=torch.int64, device=device)
        cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device=device)
        for _ in range(4):
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            backend.run(*inputs, tokens, cache)
            end.record()
            torch.cuda.synchronize()
        event_us = start.elapsed_time(end) * 1e3
        cycles = int(backend.trace[0, 1 + 8 * steps] - backend.trace[0, 0])
        ghz = cycles / (event_us * 1e3)
        print(f"rows {rows} shape w{backend.warps} r{backend.reg_tiles} flags {backend.flags} variant {backend.variant}: event {event_us:.1f} us, first block "
              f"{cycles} cycles (=> {ghz:.2f} GHz if the kernel fills the event)", flush=True)
        times = backend.phase_times(ghz)
        for name, phases in times.items():
            print(f"  {name:5s} " + "  ".join(f"{k} {v:.1f}" for k, v in phases.items()), flush=True)
        backend.check()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
