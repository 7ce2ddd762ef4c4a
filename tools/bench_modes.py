"""Benchmark of the drafting modes (issue 17) against vLLM 0.33.0's loops of the same modes (H200).

    PYTHONPATH=src python tools/bench_modes.py --out DIR [--rows 1 16 64 253] [--top-k 64]

Cases (DeepSeek-V4.1 target vocabulary V_t = 129,280, rank 256, N = 5, bf16 weights/logits/cache,
mixed T = 1 / 0.6 / 0 rows and a padding row):
- ``d2t``: a reduced draft vocabulary of V_d = 32,000 (random distinct target ids), dense bias;
  ours ``MarkovSampler(impl="fused")`` (and ``"chain"`` up to 16 rows) vs vLLM's
  ``_sample_sequential`` with its ``index_copy_``;
- ``topk+d2t``: top-k drafting on that head; ours ``draft_top_k=k, impl="fused"`` vs
  ``_sample_sequential_topk``;
- ``topk``: top-k drafting on a full-vocabulary head (V = 129,280).
Ours also writes the Markov embeddings (``markov_embeds``, the confidence head's input, which vLLM's
loop computes anyway). Each design is one CUDA graph of a whole call, replayed after an L2 flush, in alternating rounds
(median of the round medians). vLLM's loops use the real ``gumbel_sample`` (``.vllm-cache``). The
tokens of ours and vLLM's are compared (equal unless a bias sum differs in its last bit). Writes
``modes_<gpu>_<date>.json`` / ``.csv`` after every batch size.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch

import dspark_markov as dm
from dspark_markov.bench.harness import L2Flusher, capture_graph, summarize, time_graph_replays
from dspark_markov.bench.report import environment
from dspark_markov.bench.roofline import measure_bandwidth
from dspark_markov.bench.vllm_loop import load_gumbel_sample
from dspark_markov.bench.vllm_modes import VllmModesLoop

TARGET_V, DRAFT_V, RANK, STEPS = 129_280, 32_000, 256, 5


def make_head(vocab, d2t: bool, gen):
    embed = (torch.randn(TARGET_V, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    weight = (torch.randn(vocab, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    table = None
    if d2t:
        ids = torch.randperm(TARGET_V, device="cuda", generator=gen)[:vocab].sort().values
        table = ids - torch.arange(vocab, device="cuda")
    return dm.MarkovHead(embed, weight, d2t=table, target_vocab_size=TARGET_V if d2t else None)


def make_inputs(rows, vocab, gen):
    base = (torch.randn(rows, STEPS, vocab, device="cuda", generator=gen) * 2).bfloat16()
    slots = torch.arange(rows, device="cuda")
    if rows > 1:
        slots[rows // 2] = -1
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    temperature = torch.tensor([(1.0, 0.6, 0.0)[i % 3] for i in range(rows)], device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, TARGET_V, (rows,), device="cuda", generator=gen)
    return [base, anchor, idx, positions, temperature, seeds]


def bytes_model(case, rows, k):
    """(ours, vLLM's) HBM bytes of one call (bf16; W1 rows, tokens and scalars left out)."""
    vocab = TARGET_V if case == "topk" else DRAFT_V
    cache = rows * STEPS * TARGET_V * 2
    if case == "d2t":
        ours = STEPS * vocab * RANK * 2 + rows * STEPS * vocab * 2 + cache
        # per step: bias write+read, base read, add write, index_copy read+write, gumbel read, cache write
        vllm = STEPS * (vocab * RANK * 2 + rows * vocab * 2 * 6 + rows * TARGET_V * 2 * 2)
        return ours, vllm
    gathered = rows * STEPS * k * RANK * 2
    ours = rows * STEPS * vocab * 2 + gathered + cache  # topk read, W2 rows, the cache rows
    vllm = rows * STEPS * vocab * 2 * 2 + gathered * 2  # topk read, fill, W2[index] copy written + read
    vllm += STEPS * rows * TARGET_V * 2 * 2  # gumbel_sample read + cache write
    if case == "topk+d2t":
        vllm += STEPS * rows * (vocab * 2 * 2)  # index_copy_ read + write
    return ours, vllm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 253])
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--cases", nargs="+", default=["d2t", "topk+d2t", "topk"])
    parser.add_argument("--breakdown", action="store_true", help="also time the top-k design's three phases")
    parser.add_argument("--dense-rows", type=int, nargs="+", default=None, help="rows of the d2t case (default --rows)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    gumbel_sample, origin = load_gumbel_sample()
    env = environment("cuda", sys.argv[1:])
    env.update(vllm_gumbel_sample=origin, command="python tools/bench_modes.py " + " ".join(sys.argv[1:]))
    bandwidth = measure_bandwidth(device)
    env.update(copy_gbps=bandwidth.copy_gbps, read_gbps=bandwidth.read_gbps)
    print(f"# {origin}; copy {bandwidth.copy_gbps:.0f} GB/s", flush=True)
    flush = L2Flusher(device)
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads = {"d2t": make_head(DRAFT_V, True, gen), "topk": make_head(TARGET_V, False, gen)}
    heads["topk+d2t"] = heads["d2t"]
    records = []
    stem = f"modes_{env['gpu'].replace(' ', '-')}_{env['date'][:10]}"
    for rows in args.rows:
        for case in args.cases:
            if case == "d2t" and args.dense_rows is not None and rows not in args.dense_rows:
                continue
            head = heads[case]
            inputs = make_inputs(rows, head.draft_vocab_size, gen)
            top_k = None if case == "d2t" else args.top_k
            slots = rows
            runs = {}
            started = time.perf_counter()
            try:
                sampler = dm.MarkovSampler(head, STEPS, rows, impl="fused", draft_top_k=top_k)
                loop = VllmModesLoop(head, STEPS, rows, gumbel_sample, draft_top_k=top_k)
                embeds = torch.zeros(rows, STEPS, RANK, dtype=head.dtype, device="cuda")  # the confidence head's input
                designs = [("ours", lambda t, c: sampler.sample(*inputs, draft_tokens=t, logits_cache=c,
                                                                check_values=False, markov_embeds=embeds)),
                           ("vllm", lambda t, c: loop.run(*inputs, t, c))]
                if case == "d2t" and rows <= 16:  # the persistent chain takes up to 16 rows
                    chain = dm.MarkovSampler(head, STEPS, rows, impl="chain")
                    designs.append(("chain", lambda t, c: chain.sample(*inputs, draft_tokens=t, logits_cache=c,
                                                                       check_values=False)))
                for name, fn_of in designs:
                    tokens = torch.zeros(rows, STEPS, dtype=torch.int64, device="cuda")
                    cache = torch.zeros(slots, STEPS, TARGET_V, dtype=torch.bfloat16, device="cuda")
                    graph = capture_graph(lambda: fn_of(tokens, cache))
                    runs[name] = (graph, tokens, cache)
            except Exception as error:  # noqa: BLE001 - report and go on with the next case
                print(f"rows {rows} {case}: setup failed: {type(error).__name__}: {error}", flush=True)
                records.append(dict(case=case, rows=rows, status=f"error: {error}"))
                continue
            times = {name: [] for name in runs}
            for index in range(args.rounds):
                for name in (list(runs) if index % 2 == 0 else list(runs)[::-1]):
                    times[name].append(time_graph_replays(runs[name][0], args.replays, flush))
            if args.breakdown and top_k is not None:  # the top-k design's three phases, each its own graph
                backend, (_, tokens, cache) = sampler.backend, runs["ours"]
                parts = {"select": lambda: backend.select(inputs[0]),
                         "chain": lambda: backend.chain(inputs[0], *inputs[1:], tokens, embeds),
                         "write_cache": lambda: backend.write_cache(inputs[0], inputs[2], inputs[4], cache)}
                for part, fn in parts.items():
                    times[part] = [time_graph_replays(capture_graph(fn), args.replays, flush)]
            match = torch.equal(runs["ours"][1], runs["vllm"][1])
            cache_match = torch.equal(runs["ours"][2].view(torch.int16), runs["vllm"][2].view(torch.int16))
            ours_bytes, vllm_bytes = bytes_model(case, rows, args.top_k)
            summary = {name: summarize(t) for name, t in times.items()}
            record = dict(case=case, rows=rows, top_k=top_k, status="ok", draft_vocab=head.draft_vocab_size,
                          target_vocab=TARGET_V, ours_us=summary["ours"].median, ours_low=summary["ours"].low,
                          ours_high=summary["ours"].high, vllm_us=summary["vllm"].median,
                          vllm_low=summary["vllm"].low, vllm_high=summary["vllm"].high,
                          speedup=summary["vllm"].median / summary["ours"].median,
                          ours_bytes=ours_bytes, vllm_bytes=vllm_bytes,
                          ours_bandwidth_fraction=ours_bytes / (summary["ours"].median * 1e3) / bandwidth.copy_gbps,
                          tokens_equal=match, cache_equal=cache_match,
                          setup_s=time.perf_counter() - started)
            for part in ("select", "chain_kernel", "write_cache"):
                if part.replace("_kernel", "") in summary and (part != "chain_kernel" or top_k is not None):
                    record[f"{part}_us"] = summary[part.replace("_kernel", "")].median
            if "chain" in summary and top_k is None:
                record.update(chain_us=summary["chain"].median, chain_low=summary["chain"].low,
                              chain_high=summary["chain"].high,
                              chain_speedup=summary["vllm"].median / summary["chain"].median,
                              chain_tokens_equal_fused=torch.equal(runs["chain"][1], runs["ours"][1]))
            records.append(record)
            print(f"rows {rows:4d} {case:9s} ours {record['ours_us']:8.1f} us  vLLM {record['vllm_us']:8.1f} us  "
                  f"x{record['speedup']:.2f}  bw {record['ours_bandwidth_fraction']:.2f}  tokens equal {match} "
                  f"cache equal {cache_match}" + (f"  chain {record['chain_us']:.1f} us x{record['chain_speedup']:.2f}"
                                                   if "chain_us" in record else "")
                  + "".join(f"  {p} {record[p + '_us']:.1f}" for p in ("select", "chain_kernel", "write_cache")
                            if p + "_us" in record), flush=True)
            del runs
        (args.out / f"{stem}.json").write_text(json.dumps(dict(environment=env, records=records), indent=1))
        fields = sorted({key for record in records for key in record})
        with open(args.out / f"{stem}.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
