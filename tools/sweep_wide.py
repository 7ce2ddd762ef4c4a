"""Time impl="wide" launch layouts on the GPU beside other designs (CUDA graph, cold L2), and check them.

Usage: ``PYTHONPATH=src:. python3 tools/sweep_wide.py --plan
253/inverse_cdf/inverse_cdf,253/inverse_cdf/32x256x8x2x1x1 [--check] [--cache-dtype float32]
[--temperature mixed]``: ``rows/method/design[/temperature[/cache_dtype]]`` items (temperature "1" or "mixed"), a design being a registered impl or a wide
layout ``block_v x block_r x num_warps x stages x prefetch x programs_per_sm [x gumbel_iters [x share_words]]``. One line per (rows, design, layout): the median microseconds of one whole call
(all N steps), graph replay == eager, and (``--check``) whether the wide sampler draws what the
reference draws from its own cache (``tests.helpers.check_against_reference``) and how its Gumbel
tokens compare with the first baseline's.
"""

import argparse
import statistics
import sys
import time

import torch

import dspark_markov as dm
from dspark_markov.bench import harness

sys.path.insert(0, "tools")
from sweep_stream import STEPS, VOCAB, sweep_inputs  # noqa: E402


def time_call(call, flush, rounds, replays):
    graph = harness.capture_graph(call)
    medians = [statistics.median(harness.time_graph_replays(graph, replays, flush)) for _ in range(rounds)]
    return statistics.median(medians), graph


def check_inverse_cdf_draws(inputs, tokens, cache):
    """Every T > 0 token is the inverse CDF of its uniform (tests.helpers.check_inverse_cdf), per step."""
    from tests.helpers import check_inverse_cdf
    _, _, idx, pos, temp, seeds = inputs
    rows = tokens.shape[0]
    slots, positions = idx.view(rows, STEPS), pos.view(rows, STEPS)
    for step in range(STEPS):
        slot = slots[:, step]
        check_inverse_cdf(cache[slot, step], temp[slot], seeds[slot], step, positions[:, step], tokens[:, step])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True,
                        help="comma-separated rows/method/design, design a registered impl or a wide layout "
                             "block_v x block_r x warps x stages x prefetch x per_sm")
    parser.add_argument("--cache-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--temperature", default="1", choices=("1", "mixed"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--json", default="", help="also write the records (and GPU, driver, torch, triton) here")
    args = parser.parse_args()
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, 256, device="cuda", generator=gen) * 0.05).bfloat16())
    flush = harness.L2Flusher(torch.device("cuda"))
    print(f"gpu {torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}"
          f" cache {args.cache_dtype} T={args.temperature}", flush=True)
    cases = {}
    first_tokens = {}
    seen = set()
    for item in args.plan.split(","):
        rows, method, design, *extra = item.split("/")
        rows = int(rows)
        temperature = extra[0] if extra else args.temperature
        cache_dtype = getattr(torch, extra[1]) if len(extra) > 1 else getattr(torch, args.cache_dtype)
        layout = None
        if design[0].isdigit():
            layout, design = tuple(int(x) for x in design.split("x")), "wide"
        case = (rows, temperature, cache_dtype)
        if case not in cases:
            cases[case] = (sweep_inputs(torch.Generator(device="cuda").manual_seed(rows), rows, temperature),
                           torch.empty(rows, STEPS, dtype=torch.int64, device="cuda"),
                           torch.empty(rows, STEPS, VOCAB, dtype=cache_dtype, device="cuda"))
        inputs, tokens, cache = cases[case]
        name = design if layout is None else "wide " + "x".join(map(str, layout))
        begin = time.perf_counter()
        try:
            sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method=method, impl=design)
            if layout is not None:
                options = dict(zip(("gumbel_iters", "share_words"), layout[6:]))
                sampler.backend.__init__(head, STEPS, rows, method=method, cache_dtype=cache_dtype,
                                         device=torch.device("cuda"), layout=layout[:6], **options)

            def call():
                sampler.sample(*inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
            call()
            torch.cuda.synchronize()
            eager = tokens.clone()
            compiled = time.perf_counter() - begin
            us, graph = time_call(call, flush, args.rounds, args.replays)
            graph.replay()
            torch.cuda.synchronize()
            replay_same = bool(torch.equal(tokens, eager))
        except Exception as error:  # noqa: BLE001 - a layout that does not compile or fit: report, go on
            print(f"rows {rows:4d} {name:>26} {method:>11} T={temperature}: {type(error).__name__}: {str(error)[:400]}",
                  flush=True)
            continue
        extra = ""
        key = (case, method)
        if key not in first_tokens:
            first_tokens[key] = eager
        elif method == "gumbel":
            extra = f" tokens==first {int((eager == first_tokens[key]).sum())}/{eager.numel()}"
        if args.check and layout is not None:
            try:
                from tests.helpers import check_against_reference
                check_against_reference(head, *inputs, _Out(eager, cache), method=method)
                if method == "inverse_cdf":
                    check_inverse_cdf_draws(inputs, eager, cache)
                extra += " reference: ok"
            except AssertionError as error:
                extra += f" reference: FAIL {str(error)[:300]}"
            except Exception as error:  # noqa: BLE001
                extra += f" reference: {type(error).__name__} {str(error)[:200]}"
        label = f"T={temperature} {str(cache_dtype).replace('torch.', '')}"
        print(f"rows {rows:4d} {name:>26} {method:>11} {label}: {us:8.1f} us  replay==eager {replay_same}{extra}"
              f"  (set-up {compiled:.1f} s)", flush=True)
        resources = kernel_resources(seen)
        for line in resources:
            print("    " + line, flush=True)
        records.append(dict(rows=rows, design=name, method=method, temperature=temperature,
                            cache_dtype=str(cache_dtype).replace("torch.", ""), time_us=round(us, 1),
                            graph_equals_eager=replay_same, check=extra.strip(), kernels=resources))
        if args.json:
            write_json(args.json, records)


_DRIVER = []


def write_json(path, records):
    import json
    import subprocess

    import triton
    if not _DRIVER:
        try:
            _DRIVER.append(subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=10).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            _DRIVER.append("unknown")
    driver = _DRIVER[0]
    meta = dict(gpu=torch.cuda.get_device_name(), driver=driver, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, vocab=VOCAB, rank=256, steps=STEPS,
                timing="CUDA graph replays, cold L2 (harness.L2Flusher), median of rounds of replay medians")
    with open(path, "w") as handle:
        json.dump(dict(meta=meta, records=records), handle, indent=1)


def kernel_resources(seen):
    """``name: regs / spills / shared bytes`` of every compiled wide kernel not reported yet."""
    from dspark_markov.draft import triton_stream, triton_wide
    lines = []
    for fn in (triton_wide._wide_step_kernel, triton_wide._pick_wide_kernel, triton_stream._pick_kernel):
        try:
            for cache in fn.device_caches.values():
                for key, kernel in cache[0].items():
                    if id(kernel) in seen:
                        continue
                    seen.add(id(kernel))
                    const = {k: v for k, v in getattr(kernel, "constants", {}).items()
                             if str(k) in ("BLOCK_V", "BLOCK_R", "STAGES", "INVERSE_CDF", "PREFETCH")} \
                        if isinstance(getattr(kernel, "constants", None), dict) else ""
                    lines.append(f"{fn.__name__}: regs {kernel.n_regs} spills {kernel.n_spills} "
                                 f"shared {kernel.metadata.shared} warps {kernel.metadata.num_warps} {const}")
        except Exception as error:  # noqa: BLE001 - diagnostics only
            lines.append(f"{fn.__name__}: resources unavailable ({type(error).__name__}: {error})")
    return lines


class _Out:
    def __init__(self, draft_tokens, logits_cache):
        self.draft_tokens, self.logits_cache = draft_tokens, logits_cache


if __name__ == "__main__":
    main()
