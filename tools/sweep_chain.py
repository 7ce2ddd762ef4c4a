"""Sweep impl="chain" launch configurations on the GPU (CUDA graph, cold L2, median of rounds).

Usage: ``PYTHONPATH=src python3 tools/sweep_chain.py [--rows 1,4,16] [--block-v 64,128]
[--warps 4,8] [--stages 2,3] [--per-sm 1,2] [--slots 1,16] [--steps 5] [--temperature 1|mixed]``. Prints one line per configuration with the
median microseconds of all N steps, whether the barrier status stayed clean, and whether the
tokens equal those of impl="fused" on the same inputs (the bias may differ in its last bit, so a
rare mismatch is possible; the GPU tests check exactness against the reference).
"""

import argparse
import itertools
import statistics

import torch

import dspark_markov as dm
from dspark_markov.bench import harness
from sweep_fused import sweep_head, sweep_inputs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--block-v", default="64,128")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--per-sm", default="1", help="programs per SM (capped at what fits)")
    parser.add_argument("--steps", type=int, default=5, help="N (1 shows the cost of the first step alone)")
    parser.add_argument("--slots", default="1", help="word slots per row (ChainBackend word_slots)")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    args = parser.parse_args()
    vocab, steps = 129_280, args.steps
    gen, head = sweep_head(vocab)
    flush = harness.L2Flusher(torch.device("cuda"))
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = sweep_inputs(gen, rows, steps, vocab, args.temperature)
        fused_tokens = dm.sample_drafts(head, *inputs, impl="fused").draft_tokens
        tokens = torch.empty(rows, steps, dtype=torch.int64, device="cuda")
        cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
        results = []
        grid = itertools.product(*(map(int, s.split(",")) for s in
                                   (args.block_v, args.warps, args.stages, args.per_sm, args.slots)))
        for block_v, warps, stages, per_sm, slots in grid:
            label = (f"N {steps} rows {rows:3d} block_v {block_v:4d} warps {warps} stages {stages} "
                     f"per_sm {per_sm} slots {slots}")
            sampler = dm.MarkovSampler(head, steps, rows, impl="chain")
            backend = sampler.backend
            backend.__init__(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, device=torch.device("cuda"),
                             block_v=block_v, num_warps=warps, num_stages=stages,
                             programs_per_sm=per_sm, word_slots=slots)

            def call():
                sampler.sample(*inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
            try:
                graph = harness.capture_graph(call)
            except Exception as error:  # a configuration that does not compile (e.g. shared memory)
                print(f"{label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                continue
            rounds = [statistics.median(harness.time_graph_replays(graph, 20, flush)) for _ in range(3)]
            torch.cuda.synchronize()
            clean = int(backend.status.item()) == 0
            same = bool(torch.equal(tokens, fused_tokens))
            results.append((statistics.median(rounds), label))
            print(f"{label} programs {backend.layout(rows).programs}: {statistics.median(rounds):8.1f} us  status clean: {clean}  "
                  f"tokens == fused: {same}",
                  flush=True)
        if results:
            best = min(results)
            print(f"BEST {best[1]}: {best[0]:.1f} us", flush=True)


if __name__ == "__main__":
    main()
