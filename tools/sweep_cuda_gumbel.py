"""The large-batch Gumbel designs side by side (issue 12, ``impl="cuda_gumbel"``), on one GPU, in one process.

Usage (GPU): ``PYTHONPATH=src python3 tools/sweep_cuda_gumbel.py --out DIR [--rows 32,64,128,253]
[--designs gumbel_fused,fused,cuda_gumbel] [--temperature 1|mixed|both] [--kernels 64,253] [--check 64,253]``.

In order, writing ``DIR/times.json`` / ``DIR/kernels.json`` / ``DIR/check.txt`` after each part:
1. the benchmark's timing (:func:`dspark_markov.bench.grid.run_grid`: CUDA-graph replays, cold L2,
   median of alternating rounds; the bandwidth is the measured H200 figure of benchmarks/NOTES.md, not probed);
2. per-kernel times with CUDA events (eager, L2 flushed before each call; mean over the N steps) of
   ``gumbel_fused`` and ``cuda_gumbel``: the cuBLAS GEMM, the block kernel, the combine;
3. correctness at full shapes: ``cuda_gumbel``'s tokens and cache equal ``gumbel_fused``'s bit for bit
   (same cuBLAS GEMM), and every token is ``draw_gumbel`` of the cache (``tests.helpers.check_draws``).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_markov as dm  # noqa: E402
from dspark_markov.bench import grid, harness, roofline  # noqa: E402

BANDWIDTH = roofline.Bandwidth(4250.0, 4390.0, 0, 0)  # benchmarks/NOTES.md: H200 copy / read GB/s (2026-12-02)


def ints(text):
    return tuple(int(x) for x in text.split(",") if x)


def kernel_times(design, rows, steps=5, calls=5):
    """Mean microseconds per step of the GEMM, the block kernel and the combine (eager, cold L2 per call)."""
    from dspark_markov.draft.cuda_gumbel import CudaGumbelBackend
    from dspark_markov.draft.triton_blocks import launch_combine, launch_gumbel_blocks
    from dspark_markov.draft.triton_gumbel_fused import GumbelFusedBackend

    gen = torch.Generator(device="cuda").manual_seed(0)
    config = grid.BenchConfig()
    head = grid.make_head(config, gen)
    vocab = head.vocab_size
    base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 2).bfloat16()
    idx = torch.arange(rows, device="cuda").repeat_interleave(steps)
    pos = torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen)
    temp = torch.ones(rows, device="cuda")
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    tokens = torch.zeros(rows, steps, dtype=torch.int64, device="cuda")
    cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
    cls = CudaGumbelBackend if design == "cuda_gumbel" else GumbelFusedBackend
    be = cls(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, device="cuda")
    flush = harness.L2Flusher(torch.device("cuda"))
    sums = {"gemm": 0.0, "blocks": 0.0, "combine": 0.0}
    for call in range(calls + 1):
        flush()
        be.prev[:rows].copy_(anchor)
        be.gemm.gather(be.prev[:rows], rows)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4 * steps)]
        for step in range(steps):
            e = ev[4 * step: 4 * step + 4]
            e[0].record()
            bias = be.gemm.compute(rows)
            e[1].record()
            if design == "cuda_gumbel":
                be.launch_blocks(base, idx, pos, temp, seeds, cache, bias, rows=rows, step=step)
            else:
                launch_gumbel_blocks(base, base.stride(0), base.stride(1), bias, head.scale, idx, pos, temp, seeds,
                                     cache, be.block_max, be.block_token, rows=rows, step=step, num_steps=steps,
                                     block=be.block, add_bias=True, filter=True)
            e[2].record()
            launch_combine(be.block_max, be.block_token, tokens, be.prev, be.gemm.gemm_embed, be.gemm.codes,
                           rows=rows, step=step, vocab=vocab, gather=step + 1 < steps)
            e[3].record()
        torch.cuda.synchronize()
        if call == 0:
            continue  # compiles, cuBLAS heuristics
        for step in range(steps):
            e = ev[4 * step: 4 * step + 4]
            sums["gemm"] += e[0].elapsed_time(e[1]) * 1000 / (calls * steps)
            sums["blocks"] += e[1].elapsed_time(e[2]) * 1000 / (calls * steps)
            sums["combine"] += e[2].elapsed_time(e[3]) * 1000 / (calls * steps)
    return {k: round(v, 2) for k, v in sums.items()}


def time_variants(rows, variants, rounds, replays):
    """``cuda_gumbel`` launch variants (``blocks_per_sm``, ``flags``, ``slices``, ``variant``) at ``rows`` (bench inputs, T = 1):
    median us of one call (graph replay, cold L2), tokens equal to the first variant's."""
    import statistics

    from dspark_markov.draft.cuda_gumbel import CudaGumbelBackend

    gen = torch.Generator(device="cuda").manual_seed(0)
    config = grid.BenchConfig()
    head = grid.make_head(config, gen)
    vocab, steps = head.vocab_size, 5
    base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 2).bfloat16()
    idx = torch.arange(rows, device="cuda").repeat_interleave(steps)
    pos = torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen)
    temp = torch.ones(rows, device="cuda")
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    tokens = torch.zeros(rows, steps, dtype=torch.int64, device="cuda")
    cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
    flush = harness.L2Flusher(torch.device("cuda"))
    out, first = {}, None
    for bps, flags, slices, variant, *rest in variants:
        range_chunks = rest[0] if rest else 4
        sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=torch.bfloat16, method="gumbel", impl="cuda_gumbel")
        sampler.backend = CudaGumbelBackend(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16,
                                            device="cuda", blocks_per_sm=bps, flags=flags, slices=slices,
                                            variant=variant, range_chunks=range_chunks)
        args = (base, anchor, idx, pos, temp, seeds)

        def call():
            sampler.sample(*args, draft_tokens=tokens, logits_cache=cache, check_values=False)
        graph = harness.capture_graph(call)
        medians = [statistics.median(harness.time_graph_replays(graph, replays, flush)) for _ in range(rounds)]
        same = True if first is None else bool(torch.equal(tokens, first))
        first = tokens.clone() if first is None else first
        out[f"bps{bps}_flags{flags}_slices{slices}_x{variant}_range{range_chunks}"] = (round(statistics.median(medians), 1), same)
    return out


def sliced_gemm_bits(rows_list, slices_list, log):
    """Is cuBLAS's bias of a vocabulary slice bit-identical to the same columns of the whole GEMM?"""
    gen = torch.Generator(device="cuda").manual_seed(1)
    head = grid.make_head(grid.BenchConfig(), gen)
    w2 = head.head_weight
    vocab = head.vocab_size
    for rows in rows_list:
        codes = head.embed_weight[torch.randint(0, vocab, (rows,), device="cuda", generator=gen)]
        full = torch.matmul(codes, w2.t())
        for slices in slices_list:
            per = -(-vocab // (4096 * slices)) * 4096
            same = all(torch.equal(torch.matmul(codes, w2[lo:lo + per].t()), full[:, lo:lo + per])
                       for lo in range(0, vocab, per))
            log(f"sliced GEMM rows {rows} slices {slices}: bit-identical to the whole GEMM: {same}")


def rescan_rate(rows, log):
    """How often gumbel_fused's filter (ops.filter) rescans a 2048-token block with exact keys: the share of
    blocks whose two best exact keys lie within key_slack (the approximate keys are within 2 x the noise
    bound of these, so this is the rate up to that margin). Bench inputs (bf16 N(0, 4) base), T = 1, step 0."""
    from dspark_markov import rng
    from dspark_markov.ops.constants import FILTER_MARGIN

    gen = torch.Generator(device="cuda").manual_seed(0)
    head = grid.make_head(grid.BenchConfig(), gen)
    vocab = head.vocab_size
    base = (torch.randn(rows, 1, vocab, device="cuda", generator=gen) * 2).bfloat16()
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    pos = torch.randint(1, 1 << 20, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    z = (base[:, 0].float() + head.bias(anchor).float()).bfloat16().float()
    keys = z + rng.draft_noise(seeds[:, None], 0, pos[:, None], torch.arange(vocab, device="cuda"))
    for block in (2048, 4096):
        pad = (-vocab) % block
        k = torch.nn.functional.pad(keys, (0, pad), value=float("-inf")).view(rows, -1, block)
        top = k.topk(2, dim=-1).values
        slack = FILTER_MARGIN + (top[..., 0].abs() + 64) * 2.0**-20
        rate = float(((top[..., 0] - top[..., 1]) <= slack).float().mean())
        log(f"rescan rows {rows} block {block}: {rate:.2e} of {k.shape[1] * rows} blocks within key_slack "
            f"(bf16 ties in z: {float((z.view(-1)[:-1] == z.view(-1)[1:]).float().mean()):.3f} of neighbours)")


def check(rows, log):
    """cuda_gumbel == gumbel_fused bit for bit; tokens == draw_gumbel(own cache) (tests.helpers)."""
    from tests.helpers import check_draws, make_head, make_inputs, new_outputs, same_values

    torch.backends.cuda.matmul.allow_tf32 = False
    head = make_head(129_280, 256, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)
    pairs = ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32))
    for logit_dtype, cache_dtype in pairs[:1] if rows > 128 else pairs:
        inputs = make_inputs(rows, 5, 129_280, logit_dtype=logit_dtype, device="cuda", seed=7, extra_slots=5,
                             embed_vocab=129_280 + 1000)
        out = {}
        for impl in ("gumbel_fused", "cuda_gumbel"):
            sampler = dm.MarkovSampler(head, 5, rows, cache_dtype=cache_dtype, method="gumbel", impl=impl)
            tokens, cache = new_outputs(inputs, cache_dtype)
            sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache)
            torch.cuda.synchronize()
            out[impl] = (tokens, cache)
        same_tokens = torch.equal(out["gumbel_fused"][0], out["cuda_gumbel"][0])
        same_cache = same_values(out["gumbel_fused"][1], out["cuda_gumbel"][1])
        try:
            check_draws(head, inputs, *out["cuda_gumbel"], exact=False)
            draws = "ok"
        except AssertionError as error:
            draws = f"FAILED {error}"
        log(f"check rows {rows} {logit_dtype}/{cache_dtype}: tokens equal gumbel_fused {same_tokens}, cache equal "
            f"{same_cache}, check_draws {draws}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="32,64,128,253")
    parser.add_argument("--designs", default="gumbel_fused,fused,cuda_gumbel")
    parser.add_argument("--temperature", default="1", choices=("1", "mixed", "both"))
    parser.add_argument("--kernels", default="64,253")
    parser.add_argument("--check", default="64,253")
    parser.add_argument("--variants", default="", help="blocks_per_sm:flags:slices:variant[:range_chunks], e.g. 3:0:1:0,3:1:4:3:4")
    parser.add_argument("--variant-rows", default="64,253")
    parser.add_argument("--vllm-cache", help="folder of tools/extract_vllm.py's copy (design vllm_loop)")
    parser.add_argument("--rescan", default="", help="rows at which to measure gumbel_fused's rescan rate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=15)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(text):
        print(text, flush=True)
        lines.append(text)
        (out / "check.txt").write_text("\n".join(lines) + "\n")

    if args.vllm_cache:
        import os

        from dspark_markov.bench import vllm_loop

        os.environ[vllm_loop.CACHE_ENV] = str(Path(args.vllm_cache).resolve())
    t0 = time.time()
    temps = grid.TEMPERATURE_MODES if args.temperature == "both" else (args.temperature,)
    config = grid.BenchConfig(device="cuda", rows=ints(args.rows), designs=tuple(args.designs.split(",")),
                              temperatures=temps, rounds=args.rounds, replays=args.replays, eager_calls=2)
    records = grid.run_grid(config, BANDWIDTH, progress=False)
    (out / "times.json").write_text(json.dumps(records, indent=1, default=str))
    for r in records:
        log(f"time {r['design']:>14} rows {r['rows']:>3} T={r['temperature']:<5} {r.get('time_us')} us "
            f"[{r.get('time_us_low')}, {r.get('time_us_high')}] {r.get('status', '')} {r.get('reason', '')}")
    log(f"timing done at {time.time() - t0:.1f} s")
    if args.variants:
        variants = [tuple(int(x) for x in v.split(":")) for v in args.variants.split(",")]
        for rows in ints(args.variant_rows):
            result = time_variants(rows, variants, args.rounds, args.replays)
            log(f"variants rows {rows}: {result}")
        log(f"variants done at {time.time() - t0:.1f} s")
    checks = ints(args.check)
    if checks:
        check(checks[-1], log)  # the largest first: the case this design is for
    sliced_gemm_bits((32, 64, 128, 253), (2, 4, 8), log)
    kernels = {}
    for rows in ints(args.kernels):
        for design in ("gumbel_fused", "cuda_gumbel"):
            kernels[f"{design}@{rows}"] = kernel_times(design, rows)
            log(f"kernels {design} rows {rows}: {kernels[f'{design}@{rows}']} us per step")
            (out / "kernels.json").write_text(json.dumps(kernels, indent=1))
    log(f"kernels done at {time.time() - t0:.1f} s")
    for rows in checks[:-1]:
        check(rows, log)
    for rows in ints(args.rescan):
        rescan_rate(rows, log)
    log(f"all done at {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
