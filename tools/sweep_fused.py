"""Sweep impl="fused" launch configurations on the GPU (CUDA graph, cold L2, median of rounds).

Usage: ``PYTHONPATH=src python3 tools/sweep_fused.py [--rows 1,16,64,253] [--method gumbel]``.
Prints one line per (rows, block_v, block_r, num_warps) with the median microseconds of all steps.
"""

import argparse
import itertools
import statistics

import torch

import dspark_markov as dm
from dspark_markov.bench import harness


def sweep_head(vocab, rank=256):
    """``(generator, head)``: the seeded generator and a bf16 MarkovHead at DeepSeek-V4.1 shapes."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16())
    return gen, head


def sweep_inputs(gen, rows, steps, vocab, temperature):
    """``(base, anchor, idx, pos, temp, seeds)`` of a sweep; ``temperature`` "1" or "mixed" (0/0.6/1)."""
    base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 2).bfloat16()
    anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    idx = torch.arange(rows, device="cuda").repeat_interleave(steps)
    pos = torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen)
    if temperature == "1":
        temp = torch.ones(rows, device="cuda")
    else:
        temp = torch.tensor([0.0, 0.6, 1.0], device="cuda")[torch.arange(rows, device="cuda") % 3]
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    return base, anchor, idx, pos, temp, seeds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,64,253")
    parser.add_argument("--method", default="gumbel")
    parser.add_argument("--block-v", default="64,128")
    parser.add_argument("--block-r", default="16,32")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    args = parser.parse_args()
    vocab, steps = 129_280, 5
    gen, head = sweep_head(vocab)
    flush = harness.L2Flusher(torch.device("cuda"))
    for rows in (int(r) for r in args.rows.split(",")):
        base, anchor, idx, pos, temp, seeds = sweep_inputs(gen, rows, steps, vocab, args.temperature)
        tokens = torch.empty(rows, steps, dtype=torch.int64, device="cuda")
        cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
        reference_tokens = None
        results = []
        for block_v, block_r, warps in itertools.product(*(map(int, s.split(",")) for s in
                                                           (args.block_v, args.block_r, args.warps))):
            sampler = dm.MarkovSampler(head, steps, rows, method=args.method, impl="fused")
            backend = sampler.backend
            backend.__init__(head, steps, rows, method=args.method, cache_dtype=torch.bfloat16, device=torch.device("cuda"),
                             block_v=block_v, block_r=block_r, num_warps=warps)

            def call():
                sampler.sample(base, anchor, idx, pos, temp, seeds, draft_tokens=tokens, logits_cache=cache,
                               check_values=False)
            try:
                graph = harness.capture_graph(call)
            except Exception as error:  # a configuration that does not compile (e.g. shared memory)
                print(f"rows {rows:4d} block_v {block_v:4d} block_r {block_r:3d} warps {warps}: {type(error).__name__}")
                continue
            if reference_tokens is None:
                reference_tokens = tokens.clone()
            same = bool(torch.equal(tokens, reference_tokens)) or args.method != "gumbel"
            rounds = [statistics.median(harness.time_graph_replays(graph, 20, flush)) for _ in range(3)]
            results.append((statistics.median(rounds), block_v, block_r, warps, same))
            print(f"rows {rows:4d} block_v {block_v:4d} block_r {block_r:3d} warps {warps}: "
                  f"{statistics.median(rounds):8.1f} us  tokens same: {same}", flush=True)
        best = min(results)
        print(f"BEST rows {rows}: {best[0]:.1f} us at block_v {best[1]} block_r {best[2]} warps {best[3]}")


if __name__ == "__main__":
    main()
