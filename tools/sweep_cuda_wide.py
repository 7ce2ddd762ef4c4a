"""``impl="cuda_wide"`` on one GPU, in one process (issue 12, large-batch Gumbel): exactness, then timing.

Usage (GPU): ``PYTHONPATH=src python3 tools/sweep_cuda_wide.py --out DIR [--check 64,253] [--time 64,253]
[--designs cuda_gumbel,cuda_wide,cuda_wide:inverse_cdf] [--temperature 1|mixed|both] [--options JSON]``.

In order, each part printed and written to ``DIR`` as soon as it ends:
1. ``--check``: at full shapes (V = 129,280, rank 256, N = 5; tests.helpers inputs: mixed T 0 / 0.6 / 1, a padding
   row and a padding sample), every token is ``draw_gumbel`` of the cache ``cuda_wide`` wrote and the cache is
   ``round(U + bias)`` within the bias bracket (``tests.helpers.check_draws``), for bf16 / fp32 base and cache;
   how many tokens equal ``cuda_gumbel``'s (the bias sums differ in order, so not all must);
2. ``--time``: one call as a CUDA-graph replay, L2 flushed before each replay, median of alternating rounds
   (``bench.harness``), benchmark inputs (``bench.grid``: bf16 N(0, 4) base), T = 1 and / or mixed;
   ``--options`` adds ``cuda_wide`` backends built with other options (``{"label": {kwargs}}``; checked too, at the
   largest ``--check`` batch).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_markov as dm  # noqa: E402
from dspark_markov.bench import grid, harness  # noqa: E402

T0 = time.time()


def log(*parts):
    print(f"[{time.time() - T0:6.1f}s]", *parts, flush=True)


def ints(text):
    return tuple(int(x) for x in text.split(",") if x)


def check(rows_list, out, options=None):
    from tests.helpers import check_draws, cuda_inputs, make_head, sample_synced

    torch.backends.cuda.matmul.allow_tf32 = False
    head = make_head(129_280, 256, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)
    results = []
    cases = [(rows, torch.bfloat16, torch.bfloat16, {}) for rows in rows_list]
    cases += [(rows_list[0], torch.float32, torch.float32, {}), (rows_list[0], torch.bfloat16, torch.float32, {})]
    cases += [(rows_list[-1], torch.bfloat16, torch.bfloat16, kwargs) for kwargs in (options or {}).values()]
    for rows, logit_dtype, cache_dtype, kwargs in cases:
        inputs = cuda_inputs(rows, 5, 129_280, logit_dtype)
        label = f"rows {rows} base {logit_dtype} cache {cache_dtype} {kwargs}"
        tokens = cache = other = other_cache = None
        try:
            wide = dm.MarkovSampler(head, 5, rows, cache_dtype=cache_dtype, method="gumbel", impl="cuda_wide")
            if kwargs:
                wide.backend = type(wide.backend)(head, 5, rows, method="gumbel", cache_dtype=cache_dtype,
                                                  device="cuda", **kwargs)
            tokens, cache = sample_synced(wide, inputs, cache_dtype)
            ref = dm.MarkovSampler(head, 5, rows, cache_dtype=cache_dtype, method="gumbel", impl="cuda_gumbel")
            other, other_cache = sample_synced(ref, inputs, cache_dtype)
            same = int((tokens == other).sum())
            check_draws(head, inputs, tokens, cache, exact=False)
            line = f"check {label}: draws exact from own cache: OK; tokens equal to cuda_gumbel's {same}/{tokens.numel()}"
        except Exception as error:  # noqa: BLE001 (reported, the sweep goes on)
            line = f"check {label}: FAILED {type(error).__name__}: {error}"[:1500]
            if tokens is not None and other is not None:
                from dspark_markov.draft.reference import draw_gumbel  # noqa: F401 (diagnostics below)
                live = (cache.float() == cache.float()) & (other_cache.float() == other_cache.float())
                eq = (cache.float() == other_cache.float()) & live
                diff = (cache.float() - other_cache.float()).abs()[live]
                line += (f"\n  tokens equal to cuda_gumbel's {int((tokens == other).sum())}/{tokens.numel()}; cache equal "
                         f"{int(eq.sum())}/{int(live.sum())}, max |diff| {float(diff.max()) if diff.numel() else 0}; "
                         f"tokens[:4] {tokens[:4].tolist()} vs {other[:4].tolist()}")
        log(line)
        results.append(line)
        (out / "check.txt").write_text("\n".join(results) + "\n")


def timing(rows_list, designs, temperatures, options, out, rounds=3, replays=15):
    config = grid.BenchConfig()
    gen = torch.Generator(device="cuda").manual_seed(config.seed)
    head = grid.make_head(config, gen)
    vocab, steps = head.vocab_size, config.steps
    flush = harness.L2Flusher(torch.device("cuda"))
    results = {}
    for rows in rows_list:
        base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 4).bfloat16()
        anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        idx = torch.arange(rows, device="cuda").repeat_interleave(steps)
        pos = torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen)
        seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
        for mode in temperatures:
            temp = (torch.ones(rows, device="cuda") if mode == "1" else
                    torch.tensor(grid.MIXED_TEMPERATURES, device="cuda")[torch.arange(rows, device="cuda") % 3])
            graphs = {}
            # a design "impl:method" (e.g. cuda_wide:inverse_cdf) samples by that method, else Gumbel
            runs = [(d, *d.partition(":")[::2], {}) for d in designs]
            # an options label "name:method" samples by that method (e.g. {"tc:inverse_cdf": {"tensor_cores": true}})
            runs += [(f"cuda_wide[{k}]", "cuda_wide", k.partition(":")[2], v) for k, v in options.items()]
            for label, impl, method, kwargs in runs:
                method = method or "gumbel"
                sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=torch.bfloat16, method=method, impl=impl)
                if kwargs:
                    sampler.backend = type(sampler.backend)(head, steps, rows, method=method,
                                                            cache_dtype=torch.bfloat16, device="cuda", **kwargs)
                tokens = torch.zeros(rows, steps, dtype=torch.int64, device="cuda")
                cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
                if kwargs.get("tensor_cores"):  # a timing must not silently measure wide.cu's fallback step
                    log(f"{label} rows {rows}: tensor-core path {sampler.backend.tensor_core_path(base, cache)}")

                def call(sampler=sampler, tokens=tokens, cache=cache):
                    sampler.sample(base, anchor, idx, pos, temp, seeds, draft_tokens=tokens, logits_cache=cache,
                                   check_values=False)
                graphs[label] = harness.capture_graph(call)  # (it keeps call, so the sampler and buffers, alive)
            medians = {label: [] for label in graphs}
            for _ in range(rounds):
                for label, graph in graphs.items():
                    medians[label].append(statistics.median(harness.time_graph_replays(graph, replays, flush)))
            for label, values in medians.items():
                results[f"{label} rows {rows} T {mode}"] = round(statistics.median(values), 1)
                log(f"time {label} rows {rows} T {mode}: {statistics.median(values):.1f} us (rounds {values})")
            (out / "times.json").write_text(json.dumps(results, indent=1))
            del graphs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--check", default="64,253")
    parser.add_argument("--time", default="64,253")
    parser.add_argument("--designs", default="cuda_gumbel,cuda_wide")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed", "both"))
    parser.add_argument("--options", default="{}", help='JSON {"label": {backend kwargs}} of extra cuda_wide runs')
    parser.add_argument("--check-options", default="{}", help="as --options, checked but not timed")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.empty(1, device="cuda")
    log("start", torch.cuda.get_device_name())
    if ints(args.check):
        check(ints(args.check), out, {**json.loads(args.options), **json.loads(args.check_options)})
    if ints(args.time):
        temps = ("1", "mixed") if args.temperature == "both" else (args.temperature,)
        timing(ints(args.time), [d for d in args.designs.split(",") if d], temps, json.loads(args.options), out)
    log("done")


if __name__ == "__main__":
    main()
