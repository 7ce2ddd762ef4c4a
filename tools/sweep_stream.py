"""Sweep impl="stream" launch shapes on the GPU beside fused / inverse_cdf (CUDA graph, cold L2).

Usage: ``PYTHONPATH=src python3 tools/sweep_stream.py [--rows 64,253] [--method inverse_cdf]
[--layouts 128x64x8x0x2,64x64x4x1x1] [--baselines fused,inverse_cdf] [--cache-dtype bfloat16] [--temperature 1]``.
One line per (rows, design, layout): the median microseconds of one whole call (all N steps) and
whether the tokens equal the first layout's (Gumbel: they must; inverse CDF: they need not, the
tile structure changes the fp32 sums).
"""

import argparse
import statistics
import time

import torch

import dspark_markov as dm
from dspark_markov.bench import harness

VOCAB, STEPS = 129_280, 5


def sweep_inputs(gen, rows, temperature):
    """``(base, anchor, idx, pos, temp, seeds)``; ``temperature`` "1" or "mixed" (0/0.6/1 by slot)."""
    base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=gen) * 2).bfloat16()
    anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=gen)
    idx = torch.arange(rows, device="cuda").repeat_interleave(STEPS)
    pos = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    if temperature == "1":
        temp = torch.ones(rows, device="cuda")
    else:
        temp = torch.tensor([0.0, 0.6, 1.0], device="cuda")[torch.arange(rows, device="cuda") % 3]
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    return base, anchor, idx, pos, temp, seeds


def time_sampler(sampler, inputs, tokens, cache, flush, rounds, replays):
    def call():
        sampler.sample(*inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
    graph = harness.capture_graph(call)
    medians = [statistics.median(harness.time_graph_replays(graph, replays, flush)) for _ in range(rounds)]
    return statistics.median(medians)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="64,253")
    parser.add_argument("--method", default="inverse_cdf", choices=("gumbel", "inverse_cdf"))
    parser.add_argument("--layouts", default="128x64x8x0x2",
                        help="block_v x block_r x num_warps [x group_chunks [x row_stages [x native_round]]], comma-separated")
    parser.add_argument("--baselines", default="", help="other designs to time beside (e.g. fused,inverse_cdf)")
    parser.add_argument("--cache-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    cache_dtype = getattr(torch, args.cache_dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16())
    flush = harness.L2Flusher(torch.device("cuda"))
    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",") if item]
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = sweep_inputs(gen, rows, args.temperature)
        tokens = torch.empty(rows, STEPS, dtype=torch.int64, device="cuda")
        cache = torch.empty(rows, STEPS, VOCAB, dtype=cache_dtype, device="cuda")
        first = None
        for design in [d for d in args.baselines.split(",") if d]:
            method = "inverse_cdf" if design == "inverse_cdf" else args.method
            try:
                sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method=method, impl=design)
                us = time_sampler(sampler, inputs, tokens, cache, flush, args.rounds, args.replays)
                print(f"rows {rows:4d} {design:>12} {method:>11}: {us:8.1f} us", flush=True)
            except Exception as error:  # noqa: BLE001 - report and go on
                print(f"rows {rows:4d} {design:>12}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        for layout in layouts:
            block_v, block_r, warps = layout[:3]
            group_chunks = layout[3] if len(layout) > 3 else None
            row_stages = layout[4] if len(layout) > 4 else None
            native_round = bool(layout[5]) if len(layout) > 5 else True
            name = "x".join(map(str, layout))
            begin = time.perf_counter()
            try:
                sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method=args.method, impl="stream")
                sampler.backend.__init__(head, STEPS, rows, method=args.method, cache_dtype=cache_dtype, device=torch.device("cuda"),
                                         block_v=block_v, block_r=block_r, num_warps=warps,
                                         group_chunks=group_chunks, row_stages=row_stages,
                                         native_round=native_round)
                us = time_sampler(sampler, inputs, tokens, cache, flush, args.rounds, args.replays)
            except Exception as error:  # noqa: BLE001 - a layout that does not compile or fit
                print(f"rows {rows:4d} stream {name}: {type(error).__name__}: "
                      f"{str(error)[:300]}", flush=True)
                continue
            if first is None:
                first = tokens.clone()
            same = bool(torch.equal(tokens, first))
            print(f"rows {rows:4d} stream {name:>12} {args.method:>11} {args.cache_dtype} "
                  f"T={args.temperature}: {us:8.1f} us  tokens same: {same}  "
                  f"(set-up {time.perf_counter() - begin:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
