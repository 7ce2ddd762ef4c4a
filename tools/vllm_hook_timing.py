"""GPU check of the vLLM hook at DeepSeek-V4.1 shapes: the hook against vLLM's loop, in CUDA graphs.

Run on a CUDA machine from the repository root (vLLM need not be installed; its ``gumbel_sample``
comes from ``.vllm-cache/``, see ``tools/extract_vllm.py``)::

    PYTHONPATH=src python tools/vllm_hook_timing.py --out DIR

Two stand-in speculators (``tests/integrations/vllm_standin.py``: what is real vLLM code and what is re-created is
said there) get the same batch: one runs vLLM's loop (no hook), the other asks the plugin's hook
first. Per batch size it checks draft_tokens and the whole draft_logits cache (sentinel-filled, so
padding rows and unused slots must stay untouched) against vLLM's loop, eagerly and after a CUDA
graph replay, then times both graphs (cold L2, alternating rounds). It also checks
``DSPARK_MARKOV_VLLM_IMPL=gumbel_fused`` (cuBLAS bias, the same GEMM as vLLM's F.linear), where
the cache must be bit-identical. Writes ``vllm_hook_gpu.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.integrations

from tests.integrations import vllm_standin as standin  # noqa: E402

from dspark_markov.bench import harness, report, vllm_loop  # noqa: E402
from dspark_markov.draft import auto  # noqa: E402
from dspark_markov.integrations.vllm import hook  # noqa: E402

V, RANK, N, MAX_REQS = 129_280, 256, 5, 256


def compare(plain, hooked, rows):
    tokens_equal = bool(torch.equal(plain.draft_tokens[:rows], hooked.draft_tokens[:rows]))
    differ = plain.draft_logits != hooked.draft_logits
    ndiff = int(differ.sum())
    ulps = 0
    if ndiff:
        a = plain.draft_logits[differ].view(torch.int16).int()
        b = hooked.draft_logits[differ].view(torch.int16).int()
        ulps = int((a - b).abs().max())
    return {"tokens_equal": tokens_equal, "token_mismatches": int((plain.draft_tokens[:rows] != hooked.draft_tokens[:rows]).sum()),
            "cache_mismatches": ndiff, "cache_max_ulps": ulps}


def run_both(plain, hooked, rows, hidden):
    for spec in (plain, hooked):
        spec.draft_logits.fill_(-3.0)
        spec.draft_tokens.fill_(-1)
    plain._sample_sequential(rows, hidden)
    taken = hook.stats["taken"]
    hooked._sample_sequential(rows, hidden)
    if plain.draft_logits.is_cuda:
        torch.cuda.synchronize()
    return hook.stats["taken"] == taken + 1


def use_auto_tables_from(paths) -> None:
    """Replace ``auto``'s tables of each cache dtype by those the files give, oldest file first, merged as
    ``tools/auto_table.py`` merges them (``auto.merge_results``: a later file's measurement of a design
    replaces an earlier one). In place: every backend built afterwards, the hook's included, chooses by them."""
    from dspark_markov import registry

    by_cache = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        by_cache.setdefault(getattr(torch, data["config"]["cache_dtype"]), []).append(data["results"])
    for cache, runs in by_cache.items():
        records = auto.merge_results(*runs)
        for table, exclude in ((auto.AUTO_TABLE, ()), (auto.PORTABLE_TABLE, registry.NATIVE_DESIGNS)):
            for method in ("gumbel", "inverse_cdf"):
                try:
                    table[(method, cache)] = auto.table_from_results(records, method, exclude=exclude)
                except ValueError:  # no record of that method
                    continue
        print(f"auto tables from {paths}:", {k: v for k, v in auto.AUTO_TABLE.items() if k[1] == cache}, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--rows", default="1,16,64,253")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the checks (Triton interpreter), no timing")
    parser.add_argument("--vocab", type=int, default=V)
    parser.add_argument("--rank", type=int, default=RANK)
    parser.add_argument("--max-reqs", type=int, default=MAX_REQS)
    parser.add_argument("--auto-from", metavar="RESULTS.json", nargs="*", default=(),
                        help="time the hook with the auto tables these benchmark results give (tools/auto_table.py), "
                             "e.g. a sampler benchmark of the same machine run just before, not yet in draft/auto.py")
    args = parser.parse_args()
    if args.auto_from:
        use_auto_tables_from(args.auto_from)
    vocab, rank, max_reqs = args.vocab, args.rank, args.max_reqs
    cuda = args.device == "cuda"
    rows_list = [int(r) for r in args.rows.split(",")]
    device = torch.device(args.device)
    gumbel_sample, origin = vllm_loop.load_gumbel_sample()
    print("gumbel_sample:", origin, flush=True)
    gen = torch.Generator(device=device).manual_seed(2026)
    padded = -(-vocab // 64) * 64  # ParallelLMHead pads W2's rows to 64 (129280 = 64 * 2020: none)
    w1 = (torch.randn(vocab, rank, generator=gen, device=device) * 0.05).bfloat16()
    w2 = (torch.randn(padded, rank, generator=gen, device=device) * 0.05).bfloat16()
    base = (torch.randn(max_reqs * N, vocab, generator=gen, device=device) * 2.0).bfloat16()
    hidden = torch.zeros(max_reqs * N, 8, dtype=torch.bfloat16, device=device)
    kwargs = dict(max_num_reqs=max_reqs, num_steps=N, vocab=vocab, device=device)
    plain = standin.Speculator(standin.DraftModel(w1, w2, vocab, 1.0, base), gumbel_sample, **kwargs)
    hooked = standin.Speculator(standin.HookedDraftModel(w1, w2, vocab, 1.0, base), gumbel_sample, **kwargs)
    flush = harness.L2Flusher(device) if cuda else None
    results = []
    for rows in rows_list:
        for mode, temps in (("1", (1.0,)), ("mixed", (0.0, 0.6, 1.0))):
            padding = (min(3, rows - 1),) if rows >= 16 else ()
            for spec in (plain, hooked):
                standin.fill_batch(spec, rows, torch.Generator().manual_seed(rows), padding_rows=padding,
                                   temperatures=temps)
            record = {"rows": rows, "temperature": mode, "padding_rows": list(padding)}
            t0 = time.time()
            record["hook_took_it"] = run_both(plain, hooked, rows, hidden)
            record["eager"] = compare(plain, hooked, rows)
            state = hook._states[hooked]
            record["impl"] = auto.choose("gumbel", torch.bfloat16, rows, device, state.head, state.steps) if state.impl == "auto" else state.impl
            if cuda:
                graphs = {name: harness.capture_graph(lambda s=spec: s._sample_sequential(rows, hidden))
                          for name, spec in (("vllm_loop", plain), ("hook", hooked))}
                for spec in (plain, hooked):
                    spec.draft_logits.fill_(-3.0)
                    spec.draft_tokens.fill_(-1)
                for graph in graphs.values():
                    graph.replay()
                torch.cuda.synchronize()
                record["graph"] = compare(plain, hooked, rows)
                # Plain objects, no reference cycle: the graphs are freed at the `del` below, never by a garbage
                # collection inside a later capture (harness.capture_graph also collects before and holds gc off).
                runs = {name: types.SimpleNamespace(graph=g, call=None) for name, g in graphs.items()}
                times, _ = harness.time_round_robin(runs, lambda key: True, lambda key, e: print(key, e), rounds=args.rounds,
                                                    replays=args.replays, eager_calls=0, cuda=True, flush=flush)
                for name in runs:
                    summary = harness.summarize(times[name])
                    record[f"{name}_us"] = summary.median
                    record[f"{name}_us_range"] = [summary.low, summary.high]
                record["speedup"] = record["vllm_loop_us"] / record["hook_us"]
                del graphs, runs
            record["seconds"] = round(time.time() - t0, 1)
            print(json.dumps(record), flush=True)
            results.append(record)
    # The cuBLAS-bias design: the bias is vLLM's GEMM, so the cache must be bit-identical.
    os.environ[hook.IMPL_ENV] = "gumbel_fused"
    exact = []
    for rows in (1, rows_list[-1]):
        for spec in (plain, hooked):
            standin.fill_batch(spec, rows, torch.Generator().manual_seed(rows + 7), padding_rows=(0,) if rows > 1 else (),
                               temperatures=(0.0, 0.6, 1.0))
        took = run_both(plain, hooked, rows, hidden)
        exact.append({"rows": rows, "impl": "gumbel_fused", "hook_took_it": took, **compare(plain, hooked, rows)})
        print(json.dumps(exact[-1]), flush=True)
    env = report.environment(args.device, sys.argv[1:])
    env["command"] = " ".join(["python", "tools/vllm_hook_timing.py", *sys.argv[1:]])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"environment": env, "gumbel_sample": origin, "shapes": {"vocab": vocab, "rank": rank, "steps": N,
               "max_num_reqs": max_reqs}, "results": results, "gumbel_fused_exact": exact,
               "hook_stats": dict(hook.stats),
               "timing": "CUDA-graph replay of one _sample_sequential call (all 5 steps), L2 flushed before each "
                         "replay, median of round medians; both graphs alternate"}
    (out / "vllm_hook_gpu.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"{'rows':>5} {'T':>5} {'vLLM loop us':>13} {'hook us':>9} {'x':>6}  impl          tokens  cache (mismatches, max ulps)")
    for r in results:
        if "hook_us" in r:
            print(f"{r['rows']:>5} {r['temperature']:>5} {r['vllm_loop_us']:>13.1f} {r['hook_us']:>9.1f} {r['speedup']:>6.2f}  {r['impl']:<12}  "
                  f"{r['graph']['tokens_equal']!s:<6}  {r['graph']['cache_mismatches']}, {r['graph']['cache_max_ulps']}")
    # In-kernel bias designs may differ from vLLM's GEMM in the last bf16 bit (reported above); the
    # replay must equal the eager call, and the cuBLAS-bias design must equal vLLM's loop exactly.
    ok = all(r["hook_took_it"] for r in results) and all(
        e["hook_took_it"] and e["tokens_equal"] and e["cache_mismatches"] == 0 for e in exact) and all(
        r["graph"] == r["eager"] for r in results if "graph" in r)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
