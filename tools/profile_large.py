"""Eager calls of large-batch designs for Nsight Compute (one NVTX range per design).

Usage (GPU): ``ncu --clock-control none --nvtx --nvtx-include "prof_<design>_<method>/" ... python3
tools/profile_large.py --rows 253 --designs inverse_cdf,gumbel_fused``. Each design runs once outside
the ranges (compile, cuBLAS heuristics), then once inside ``prof_<design>_<method>``; only kernels in a range
are profiled. Inputs as ``tools/sweep_stream.py`` (bf16 base N(0, 4), weights N(0, 0.05^2), T = 1).
"""

import argparse
import sys

import torch

import dspark_markov as dm

sys.path.insert(0, "tools")
from sweep_stream import STEPS, VOCAB, sweep_inputs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=253)
    parser.add_argument("--designs", default="inverse_cdf,gumbel_fused")
    parser.add_argument("--cache-dtype", default="bfloat16")
    parser.add_argument("--temperature", default="1")
    parser.add_argument("--steps", type=int, default=2, help="draft steps per profiled call (kernels are per step)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16())
    base, anchor, idx, pos, temp, seeds = sweep_inputs(gen, args.rows, args.temperature)
    steps = args.steps
    # (.contiguous(): with --steps 1 the sliced [rows, 1] view flattens to a stride-5 view, which the samplers refuse)
    inputs = (base[:, :steps], anchor, idx.view(args.rows, STEPS)[:, :steps].contiguous().view(-1),
              pos.view(args.rows, STEPS)[:, :steps].contiguous().view(-1), temp, seeds)
    cache_dtype = getattr(torch, args.cache_dtype)
    for item in args.designs.split(","):
        design, _, method = item.partition(":")  # e.g. wide:inverse_cdf
        method = method or ("inverse_cdf" if design == "inverse_cdf" else "gumbel")
        sampler = dm.MarkovSampler(head, steps, args.rows, cache_dtype=cache_dtype, method=method, impl=design)
        sampler.sample(*inputs, check_values=False)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"prof_{design}_{method}")
        sampler.sample(*inputs, check_values=False)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"profiled {design} {method} rows {args.rows}", flush=True)


if __name__ == "__main__":
    main()
