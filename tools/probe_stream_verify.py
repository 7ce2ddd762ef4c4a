"""Time StreamVerifier variants side by side on the GPU and check every replayed output against the reference.

CUDA-graph replays, cold L2, median of alternating rounds; then each variant's last replayed tokens and counts
against ``verify_drafts(impl="reference")`` on the same inputs, the status word and the counter / arrival-word
reset. Inputs as ``dspark-markov bench --verify`` (fp32 N(0, 2^2) target, bf16 cache, random drafts, K = 5,
V = 129,280; mixed T = 0 / 0.6 / 1 per slot, or a fixed T), or ``--inputs close`` (the target rows of the drafts
= the cache + N(0, 0.05^2), drafts drawn from the cache: most drafts accepted, the worst case of early stop).

Usage: ``PYTHONPATH=src python3 tools/probe_stream_verify.py OUT ROWS SPEC [SPEC ...] [--rounds R]
[--temps mixed,1] [--inputs random|close] [--trace SPEC@rows]``, or ``... --ncu ROWS SPEC [T]`` (three eager
launches of one variant at mixed T or T, for ``ncu --launch-skip 2 --launch-count 1``).
SPEC = name[:opt=v+opt=v][@rows,rows][~temp,temp]; name: std | raw (raw logits + target_temperature) |
blk | blkraw (block verification); opt: StreamVerifier keyword arguments (integers).
Writes OUT/probe.txt (as it goes) and OUT/probe.json. (issue 18; verify4's and verify5's GPU probe)
"""

import json
import os
import statistics
import sys
import time

import torch

T0 = time.time()


def log(msg, out=None):
    line = f"[{time.time() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def parse_spec(spec):
    rows, temps = None, None
    if "~" in spec:
        spec, _, t = spec.partition("~")
        temps = t.split(",")
    if "@" in spec:
        spec, _, r = spec.partition("@")
        rows = [int(x) for x in r.split(",")]
    name, _, rest = spec.partition(":")
    opts = {}
    for item in filter(None, rest.split("+")):
        k, _, v = item.partition("=")
        opts[k] = int(v)
    return name, opts, rows, temps


def ncu_launches(rows, spec, temp="mixed"):
    """Three eager launches of one variant at ``rows`` requests, mixed T or a fixed T (profile the last one)."""
    from dspark_markov.draft.reference import scaled_logits
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    name, opts, _, _ = parse_spec(spec)
    V, K = 129_280, 5
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2026)
    raw_target = torch.randn(rows, K + 1, V, generator=g, device=dev) * 2.0
    cache = (torch.randn(rows, K, V, generator=g, device=dev) * 2.0).bfloat16()
    drafts = torch.randint(0, V, (rows, K), generator=g, device=dev)
    positions = torch.randint(1, 1 << 20, (rows,), generator=g, device=dev)
    seeds = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=g, device=dev)
    temperature = torch.tensor([0.0, 0.6, 1.0], device=dev)[torch.arange(rows, device=dev) % 3]
    if temp != "mixed":
        temperature = torch.full((rows,), float(temp), device=dev)
    raw = name in ("raw", "blkraw")
    target = raw_target if raw else scaled_logits(raw_target, temperature)
    verifier = StreamVerifier(rows, K, V, dev, **opts)
    for _ in range(3):
        verifier.run(target, drafts, cache, torch.full((rows,), K, device=dev), torch.arange(rows, device=dev),
                     positions, temperature, seeds, method="block" if name.startswith("blk") else "standard",
                     target_temperature=temperature if raw else None)
    torch.cuda.synchronize()
    verifier.check()
    print("ok", rows, spec)


def main(argv):
    if argv[0] == "--ncu":
        return ncu_launches(int(argv[1]), argv[2], *argv[3:4])
    out_dir = argv[0]
    os.makedirs(out_dir, exist_ok=True)
    txt = os.path.join(out_dir, "probe.txt")
    rows_list = [int(x) for x in argv[1].split(",")]
    specs, rounds, temps, traces = [], 3, ["mixed"], []
    inputs = "random"
    i = 2
    while i < len(argv):
        if argv[i] == "--trace":  # --trace SPEC@rows,rows (mixed T)
            traces.append(argv[i + 1]); i += 2
        elif argv[i] == "--inputs":  # random (the bench's) | close (targets near the cache: most drafts accepted)
            inputs = argv[i + 1]; i += 2
        elif argv[i] == "--rounds":
            rounds = int(argv[i + 1]); i += 2
        elif argv[i] == "--temps":
            temps = argv[i + 1].split(","); i += 2
        else:
            specs.append(argv[i]); i += 1
    from dspark_markov.bench import harness
    from dspark_markov.draft.reference import scaled_logits
    from dspark_markov.verify.triton_verify_stream import StreamVerifier
    import dspark_markov as dm
    import dspark_markov.draft.reference  # noqa: F401

    V, K = 129_280, 5
    dev = torch.device("cuda")
    log(f"{torch.cuda.get_device_name()} torch {torch.__version__}", txt)
    g = torch.Generator(device=dev).manual_seed(2026)
    big = max(rows_list)
    raw_target = torch.randn(big, K + 1, V, generator=g, device=dev) * 2.0
    cache = (torch.randn(big, K, V, generator=g, device=dev) * 2.0).bfloat16()
    drafts = torch.randint(0, V, (big, K), generator=g, device=dev)
    positions = torch.randint(1, 1 << 20, (big,), generator=g, device=dev)
    seeds = torch.randint(-(1 << 62), 1 << 62, (big,), generator=g, device=dev)
    flush = harness.L2Flusher(dev)
    results = []
    verifiers = {}
    checks = []
    for temp_mode in temps:
        if temp_mode == "mixed":
            table = torch.tensor([0.0, 0.6, 1.0], device=dev)
            temperature = table[torch.arange(big, device=dev) % 3]
        else:
            temperature = torch.full((big,), float(temp_mode), device=dev)
        target = scaled_logits(raw_target, temperature)
        if inputs == "close":  # the drafts' rows: the target = the cache + small noise (acceptance ~0.9)
            raw_target, drafts = raw_target.clone(), drafts.clone()  # (earlier cases keep theirs for the checks)
            raw_target[:, :K] = cache.float() + 0.05 * torch.randn(big, K, V, generator=g, device=dev)
            target = scaled_logits(raw_target, temperature)
            for i in range(K):
                drafts[:, i] = dm.draft.reference.draw_gumbel(cache[:, i], temperature, seeds, i, positions + i)
        for rows in rows_list:
            args = (target[:rows], drafts[:rows], cache[:rows], torch.full((rows,), K, device=dev),
                    torch.arange(rows, device=dev), positions[:rows], temperature[:rows], seeds[:rows])
            raw_args = (raw_target[:rows],) + args[1:]
            graphs, outs = {}, {}
            for spec in specs:
                name, opts, only, only_temps = parse_spec(spec)
                if (only and rows not in only) or (only_temps and temp_mode not in only_temps):
                    continue
                key = (spec, rows)
                tokens = torch.full((rows, K + 1), -1, dtype=torch.int64, device=dev)
                count = torch.zeros(rows, dtype=torch.int64, device=dev)
                vkey = (spec, big)
                if vkey not in verifiers:
                    verifiers[vkey] = StreamVerifier(big, K, V, dev, **opts)
                verifier = verifiers[vkey]
                raw = name in ("raw", "blkraw")
                method = "block" if name.startswith("blk") else "standard"

                def call(verifier=verifier, tokens=tokens, count=count, raw=raw, args=args, raw_args=raw_args,
                         method=method):
                    if raw:
                        verifier.run(*raw_args, target_temperature=args[6], tokens=tokens, num_emitted=count,
                                     method=method)
                    else:
                        verifier.run(*args, tokens=tokens, num_emitted=count, method=method)
                try:
                    t = time.time()
                    call()
                    torch.cuda.synchronize()
                    verifier.check()
                    graphs[spec] = harness.capture_graph(call)
                    outs[spec] = (tokens, count, verifier, method)
                    if time.time() - t > 2:
                        log(f"  compiled {spec} rows {rows} in {time.time() - t:.1f}s", txt)
                except Exception as error:  # noqa: BLE001
                    log(f"rows {rows} {spec}: {type(error).__name__}: {str(error)[:800]}", txt)
            times = {s: [] for s in graphs}
            for _ in range(rounds):
                for s, graph in graphs.items():
                    times[s].append(statistics.median(harness.time_graph_replays(graph, 15, flush)))
            parts = []
            for s in graphs:
                med = statistics.median(times[s])
                parts.append(f"{s}:{med:.1f}")
                results.append(dict(spec=s, rows=rows, temp=temp_mode, inputs=inputs, us=med, low=min(times[s]),
                                high=max(times[s])))
            log(f"time T={temp_mode} rows={rows} | " + "  ".join(parts), txt)
            with open(os.path.join(out_dir, "probe.json"), "w") as f:
                json.dump(results, f, indent=1)
            checks.append((temp_mode, rows, args, outs))
    # correctness after all timings: replayed outputs vs the torch reference (same keys)
    bad = 0
    for temp_mode, rows, args, outs in checks:
        methods = {"standard"} | {o[3] for o in outs.values()}
        refs = {m: dm.verify_drafts(*args, impl="reference", method=m) for m in sorted(methods)}
        mean_emitted = float(refs["standard"].num_emitted.float().mean())
        line = []
        for s, (tokens, count, verifier, method) in outs.items():
            ref = refs[method]
            same = torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
            eq_rows = int(((tokens == ref.tokens).all(1) & (count == ref.num_emitted)).sum())
            status = int(verifier.status.item())
            reset = int(verifier.counters.abs().sum()) == 0 and int(verifier.arrivals.abs().sum()) == 0
            bad += (not same) or status != 0 or not reset
            line.append(f"{s}:{eq_rows}/{rows}{'' if status == 0 else ' STATUS'}{'' if reset else ' NORESET'}")
        log(f"check T={temp_mode} rows={rows} vs reference (mean emitted {mean_emitted:.2f}) | " + "  ".join(line), txt)
    log(f"correctness: {bad} bad variant-cases", txt)
    # launch traces (mixed T): phase summary per stage, raw tensors saved
    table = torch.tensor([0.0, 0.6, 1.0], device=dev)
    temperature = table[torch.arange(big, device=dev) % 3]
    target = scaled_logits(raw_target, temperature)
    for spec in traces:
        name, opts, only, _ = parse_spec(spec)
        for rows in only or rows_list:
            try:
                verifier = StreamVerifier(rows, K, V, dev, **opts)
                args = (target[:rows], drafts[:rows], cache[:rows], torch.full((rows,), K, device=dev),
                        torch.arange(rows, device=dev), positions[:rows], temperature[:rows], seeds[:rows])
                kw = dict(target_temperature=temperature[:rows]) if name == "raw" else {}
                if name == "raw":
                    args = (raw_target[:rows],) + args[1:]
                trace = torch.zeros(verifier.programs(rows), 4, dtype=torch.int64, device=dev)
                for _ in range(3):
                    flush()
                    verifier.run(*args, trace=trace, **kw)
                torch.cuda.synchronize()
                verifier.check()
                torch.save(trace.cpu(), os.path.join(out_dir, f"trace_{name}_{'_'.join(f'{k}{v}' for k, v in opts.items())}_{rows}.pt"))
                tr = trace.cpu()
                stage, valid = tr[:, 3] & 3, (tr[:, 3] >> 2) & 1
                t0 = int(tr[valid == 1, 0].min())
                parts = [f"total {(int(tr[valid == 1, 2].max()) - t0) / 1e3:.1f}us"]
                for st in (0, 2):
                    sel = (stage == st) & (valid == 1)
                    if int(sel.sum()) == 0:
                        continue
                    a, g_, e = tr[sel, 0] - t0, tr[sel, 1] - t0, tr[sel, 2] - t0
                    d = (e - g_).float() / 1e3
                    parts.append(f"stage{st}: n={int(sel.sum())} start {int(a.min()) / 1e3:.1f}-{int(a.max()) / 1e3:.1f} "
                                 f"go med {float(g_.float().median()) / 1e3:.1f} end {int(e.min()) / 1e3:.1f}-{int(e.max()) / 1e3:.1f} "
                                 f"dur med {float(d.median()):.2f} p90 {float(d.quantile(0.9)):.2f} "
                                 f"wait med {float((g_ - a).float().median()) / 1e3:.2f}")
                log(f"trace {spec} rows {rows}: " + " | ".join(parts), txt)
            except Exception as error:  # noqa: BLE001
                log(f"trace {spec} rows {rows}: {type(error).__name__}: {str(error)[:500]}", txt)
    try:
        from dspark_markov.verify import triton_verify_stream as ts
        for c in ts._stream_verify_kernel.device_caches.values():
            for kernel in c[0].values():
                log(f"kernel regs {kernel.n_regs} spills {kernel.n_spills}", txt)
    except Exception as error:  # noqa: BLE001
        log(f"registers n/a {error}", txt)


if __name__ == "__main__":
    main(sys.argv[1:])
