"""Time backend variants against each other on the GPU (CUDA graph, cold L2, median of rounds).

Usage: ``PYTHONPATH=src python3 tools/compare_variants.py`` — edit VARIANTS to compare other
constructor options. Prints microseconds per call (all steps) and whether the draws agree.
"""

import statistics

import torch

import dspark_markov as dm
from dspark_markov.bench import harness

VARIANTS = [
    ("gumbel_fused", {"noise_filter": False}),
    ("gumbel_fused", {"noise_filter": True}),
    ("fused", {}),
]
ROWS = (1, 16, 64, 253)


def main():
    vocab, rank, steps = 129_280, 256, 5
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16())
    flush = harness.L2Flusher(torch.device("cuda"))
    for rows in ROWS:
        base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 2).bfloat16()
        inputs = (base, torch.randint(0, vocab, (rows,), device="cuda", generator=gen),
                  torch.arange(rows, device="cuda").repeat_interleave(steps),
                  torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen),
                  torch.ones(rows, device="cuda"), torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen))
        tokens = torch.empty(rows, steps, dtype=torch.int64, device="cuda")
        cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
        # The graphs are replayed after the loop, so every sampler (whose buffers the graphs use)
        # must stay alive until then.
        graphs, samplers, first = [], [], None
        for impl, options in VARIANTS:
            sampler = dm.MarkovSampler(head, steps, rows, impl=impl)
            sampler.backend = type(sampler.backend)(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16,
                                                    device=torch.device("cuda"), **options)
            samplers.append(sampler)

            def call(sampler=sampler):
                sampler.sample(*inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
            graphs.append(harness.capture_graph(call))
            first = tokens.clone() if first is None else first
            same = bool(torch.equal(tokens, first))
            graphs[-1].same = same
        rounds = [[] for _ in VARIANTS]
        for _ in range(3):
            for index, graph in enumerate(graphs):
                rounds[index].append(statistics.median(harness.time_graph_replays(graph, 20, flush)))
        for (impl, options), graph, times in zip(VARIANTS, graphs, rounds):
            print(f"rows {rows:4d} {impl:13s} {str(options):24s} {statistics.median(times):8.1f} us  "
                  f"draws equal the first variant's: {graph.same}", flush=True)


if __name__ == "__main__":
    main()
