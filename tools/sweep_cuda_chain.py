"""Time impl="cuda_chain" variants beside impl="chain" on the GPU (CUDA graph, cold L2, alternating rounds).

Usage: ``PYTHONPATH=src python3 tools/sweep_cuda_chain.py [--rows 1,2,4,8,16] [--steps 1,2,5]
[--cache bf16,fp32] [--temperature 1,mixed] [--variants reg,noreg,smem0] [--triton] [--json PATH]``.

Variants (:data:`VARIANTS`): ``default`` (the backend's default shape, variant and flags), ``v5`` (the v5
kernel: variant 0, no flags), ``w16r1`` / ``w16r0`` (16 warps, one or no register tile per warp), ``w8r3``
(8 warps of 255 registers, 3 register tiles), ``smem0`` (no register or shared-memory tiles: W2 re-read
from L2 at every step), ``exact`` / ``w8r3exact`` (exact keys for every logit: the filter's worth),
``pfw2`` / ``pfbase`` / ``pf`` / ``all`` (run-time flags on the v5 kernel), ``v11*`` / ``v43*`` (kernel
variants 11 and 43 with flags; see the dict), ``v107`` ... ``v7275`` (the variants of cuda_chain.VARIANTS
with flags 15). ``--triton`` adds impl="chain" (the Triton chain). Each
line: the median of the round medians and the spread, whether the barrier status stayed clean, whether
the tokens equal the first variant's, and the second floor (one W2 read per call: 66.2 MB at 4.38 TB/s).
"""

import argparse
import json
import statistics
import sys

import torch

import dspark_markov as dm
from dspark_markov.bench import harness
from dspark_markov.draft.cuda_chain import CudaChainBackend

VARIANTS = {"default": {}, "v5": {"variant": 0, "flags": 0}, "w16r1": {"warps": 16, "reg_tiles": 1},
            "w16r0": {"warps": 16, "reg_tiles": 0}, "w8r3": {"warps": 8, "reg_tiles": 3},
            "smem0": {"warps": 16, "reg_tiles": 0, "smem_tiles": 0}, "exact": {"filter_margin": 1e30},
            "w8r3exact": {"warps": 8, "reg_tiles": 3, "filter_margin": 1e30},
            # run-time flags on the v5 kernel (1 = W2 L2 prefetch at launch, 2 = next step's base logits,
            # 4 = step 0 in dependency order)
            "pfw2": {"variant": 0, "flags": 1}, "pfbase": {"variant": 0, "flags": 2},
            "pf": {"variant": 0, "flags": 3}, "all": {"variant": 0, "flags": 7},
            # kernel variants 11 / 43 (cuda_chain.VARIANTS) with flags (8 = exact keys at 1-2 rows, 16 = step 0's
            # shared-memory tiles copied at launch with flag 4)
            "v11": {"variant": 11, "flags": 0}, "v11pf": {"variant": 11, "flags": 3},
            "v11all": {"variant": 11, "flags": 7}, "v11x": {"variant": 11, "flags": 11},
            "v43": {"variant": 43, "flags": 0}, "v43pf": {"variant": 43, "flags": 3},
            "v43all": {"variant": 43, "flags": 7}, "v43x": {"variant": 43, "flags": 11},
            "v43allx": {"variant": 43, "flags": 15}, "v43e": {"variant": 43, "flags": 31},
            "v43ex": {"variant": 43, "flags": 27},
            # cuda3 (flags 15): 107 = 43 + the noise-table phase B at 4-16 rows; + 1024 register tiles loaded before
            # the step loop, + 2048 four load batches per L2 tile, + 4096 base logits / W1 rows not kept in L1
            **{f"v{v}": {"variant": v, "flags": 15} for v in (107, 7275)}}


def inputs_for(gen, rows, steps, vocab, temperature, device):
    base = (torch.randn(rows, steps, vocab, device=device, generator=gen) * 2).bfloat16()
    anchor = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    idx = torch.arange(rows, device=device).repeat_interleave(steps)
    pos = torch.randint(1, 1 << 20, (rows * steps,), device=device, generator=gen)
    if temperature == "1":
        temp = torch.ones(rows, device=device)
    else:
        temp = torch.tensor([0.0, 0.6, 1.0], device=device)[torch.arange(rows, device=device) % 3]
    seeds = torch.randint(0, 1 << 62, (rows,), device=device, generator=gen)
    return [base, anchor, idx, pos, temp, seeds]


def _driver_version() -> str:
    import ctypes

    from dspark_markov.cuda import build

    value = ctypes.c_int()
    build.driver().cuDriverGetVersion(ctypes.byref(value))
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


def _nvrtc_version() -> str:
    from dspark_markov.cuda import build

    return ".".join(map(str, build.nvrtc_version()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--steps", default="5")
    parser.add_argument("--cache", default="bf16")
    parser.add_argument("--temperature", default="1")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--triton", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--flush", default="write", choices=("write", "read"),
                        help="how the L2 is emptied before each replay: the harness's zero-fill (leaves ~60 MB "
                             "of dirty lines that the first reads must write back) or a read of the buffer")
    args = parser.parse_args()
    device = torch.device("cuda")
    vocab, rank = 129_280, 256
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, device=device, generator=gen) * 0.05).bfloat16(),
                         (torch.randn(vocab, rank, device=device, generator=gen) * 0.05).bfloat16())
    flush = harness.L2Flusher(device)
    if args.flush == "read":  # evicts as well, but leaves clean lines: no write-back in the timed call
        sink = torch.empty((), dtype=torch.int64, device=device)
        flush_buffer = flush.buffer.view(torch.int64)

        def flush():
            torch.sum(flush_buffer, dim=0, out=sink)
    props = torch.cuda.get_device_properties(device)
    print(f"# {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    w2_floor_us = vocab * rank * 2 / 4.38e12 * 1e6
    records = []
    for steps in map(int, args.steps.split(",")):
        for cache_name in args.cache.split(","):
            cache_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cache_name]
            for temperature in args.temperature.split(","):
                for rows in map(int, args.rows.split(",")):
                    inputs = inputs_for(gen, rows, steps, vocab, temperature, device)
                    runs = {}
                    designs = [(v, "cuda_chain") for v in args.variants.split(",")]
                    if args.triton:
                        designs.append(("triton", "chain"))
                    for variant, impl in designs:
                        sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, impl=impl)
                        if impl == "cuda_chain" and VARIANTS[variant]:
                            sampler.backend = CudaChainBackend(head, steps, rows, method="gumbel", cache_dtype=cache_dtype, device=device,
                                                               **VARIANTS[variant])
                        tokens = torch.empty(rows, steps, dtype=torch.int64, device=device)
                        cache = torch.empty(rows, steps, vocab, dtype=cache_dtype, device=device)

                        def call(sampler=sampler, tokens=tokens, cache=cache):
                            sampler.sample(*inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
                        try:
                            runs[variant] = (sampler, harness.capture_graph(call), tokens)
                        except Exception as error:  # noqa: BLE001 - report and go on
                            print(f"{variant} rows {rows}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                    times = {key: [] for key in runs}
                    order = list(runs)
                    for index in range(args.rounds):
                        shift = index % max(len(order), 1)
                        for key in order[shift:] + order[:shift]:
                            times[key].append(statistics.median(harness.time_graph_replays(runs[key][1], args.replays,
                                                                                           flush)))
                    ref = runs[order[0]][2] if order else None
                    for key, (sampler, _, tokens) in runs.items():
                        summary = harness.summarize([[t] for t in times[key]])
                        status = getattr(sampler.backend, "status", None)
                        clean = status is None or int(status.item()) == 0
                        same = bool(torch.equal(tokens, ref))
                        record = dict(variant=key, rows=rows, steps=steps, cache=cache_name, temperature=temperature,
                                      flush=args.flush,
                                      time_us=summary.median, low=summary.low, high=summary.high, clean=clean,
                                      tokens_equal_first=same)
                        records.append(record)
                        print(f"N {steps} rows {rows:2d} cache {cache_name} T {temperature:5s} flush {args.flush} {key:7s}: "
                              f"{summary.median:7.1f} us [{summary.low:6.1f}, {summary.high:6.1f}]  clean {clean}  "
                              f"same tokens as {order[0]}: {same}  W2-once floor {w2_floor_us:.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=props.name, torch=torch.__version__, cuda=torch.version.cuda,
                           driver=_driver_version(), triton=_triton_version(), nvrtc=_nvrtc_version(),
                           command=" ".join(sys.argv), records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
