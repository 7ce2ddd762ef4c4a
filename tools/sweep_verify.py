"""Time verification designs and layouts side by side on the GPU (CUDA graph, cold L2, median of rounds).

Usage: ``PYTHONPATH=src python3 tools/sweep_verify.py [rows ...] [--variants NAME,...] [--rounds R]
[--inputs random|close]``.
Inputs as ``dspark-markov bench --verify`` (fp32 target N(0, 2^2), bf16 cache, random drafts,
K = 5, V = 129,280, mixed T 0 / 0.6 / 1 per slot); ``--inputs close``: the raw target is the cache plus
N(0, 0.05^2) and the greedy slots' drafts are their target rows' argmaxes, so nearly every draft is accepted
(every row is needed: the worst case of ``phases``). Variants: ``stream`` (:class:`StreamVerifier`,
default layout), ``raw`` (the
stream kernel on raw logits with the per-slot temperature), ``stream:t1=4,lag=2`` (layout
overrides; ``stream:phases=1`` or ``phases=1/2``: phased launches), ``block``/``raw_block`` (block verification). Prints microseconds and whether every
variant's tokens equal the first variant's of its method (raw against pre-divided: bit equality).
"""

import statistics
import sys

import torch

from dspark_markov.bench import harness
from dspark_markov.draft.reference import scaled_logits
from dspark_markov.verify.triton_verify_stream import StreamVerifier

V, K = 129_280, 5


def parse(argv):
    rows, variants, rounds, inputs = [], ["stream", "raw", "block", "raw_block"], 5, "random"
    i = 0
    while i < len(argv):
        if argv[i] == "--inputs":
            inputs = argv[i + 1]
            if inputs not in ("random", "close"):
                raise SystemExit(f"--inputs: expected random or close, got {inputs!r}")
            i += 2
        elif argv[i] == "--variants":
            variants = argv[i + 1].split(",") if "," in argv[i + 1] else [argv[i + 1]]
            i += 2
        elif argv[i] == "--rounds":
            rounds = int(argv[i + 1])
            i += 2
        else:
            rows.append(int(argv[i]))
            i += 1
    return rows or [1, 16, 64, 253], [v.replace(";", ",") for v in variants], rounds, inputs


def options(spec):
    name, _, rest = spec.partition(":")
    opts = {}
    for item in filter(None, rest.split("+")):
        key, _, value = item.partition("=")
        opts[key] = tuple(int(v) for v in value.split("/")) if "/" in value else int(value)
    return name, opts


def make_inputs(big, inputs="random", dev="cuda", vocab=V):
    """The inputs of ``big`` requests (module docstring; ``inputs``: random or close), as
    ``(raw_target, args)``: ``args(rows)`` gives ``StreamVerifier.run``'s positional inputs of the first ``rows``
    requests (pre-divided target logits; swap in ``raw_target[:rows]`` with ``target_temperature=args[6]``)."""
    g = torch.Generator(device=dev).manual_seed(2026)
    raw_target = torch.randn(big, K + 1, vocab, generator=g, device=dev) * 2.0
    cache = (torch.randn(big, K, vocab, generator=g, device=dev) * 2.0).bfloat16()
    if inputs == "close":  # p ~ q at every token: (almost) every draft accepted
        raw_target = torch.cat([cache.float(), cache[:, -1:].float()], dim=1) + 0.05 * torch.randn(
            big, K + 1, vocab, generator=g, device=dev)
    drafts = torch.randint(0, vocab, (big, K), generator=g, device=dev)
    positions = torch.randint(1, 1 << 20, (big,), generator=g, device=dev)
    seeds = torch.randint(-(1 << 62), 1 << 62, (big,), generator=g, device=dev)
    table = torch.tensor([0.0, 0.6, 1.0], device=dev)
    temperature = table[torch.arange(big, device=dev) % 3]
    target = scaled_logits(raw_target, temperature)  # pre-divided, as the standard mode takes them
    if inputs == "close":  # greedy slots (T = 0) accept a draft equal to their target row's argmax: those too
        greedy = temperature == 0
        drafts[greedy] = target[greedy, :K].argmax(-1)

    def args(rows):
        return (target[:rows], drafts[:rows], cache[:rows], torch.full((rows,), K, device=dev),
                torch.arange(rows, device=dev), positions[:rows], temperature[:rows], seeds[:rows])
    return raw_target, args


def main(argv):
    rows_list, variants, rounds, inputs = parse(argv)
    dev = torch.device("cuda")
    raw_target, batch_args = make_inputs(max(rows_list), inputs, dev)
    flush = harness.L2Flusher(dev)
    print(f"V={V} K={K} bf16 cache, mixed T, {inputs} inputs, {flush.mode} L2 flush; variants {variants}")
    for rows in rows_list:
        args = batch_args(rows)
        raw_args = (raw_target[:rows],) + args[1:]
        graphs, keep, outputs = {}, [], {}
        for spec in variants:
            name, opts = options(spec)
            method = "block" if name.endswith("block") else "standard"
            tokens = torch.full((rows, K + 1), -1, dtype=torch.int64, device=dev)
            count = torch.zeros(rows, dtype=torch.int64, device=dev)
            verifier = StreamVerifier(rows, K, V, dev, **opts)
            raw = name.startswith("raw")

            def call(verifier=verifier, method=method, tokens=tokens, count=count, raw=raw):
                if raw:
                    verifier.run(*raw_args, method=method, target_temperature=args[6], tokens=tokens,
                                 num_emitted=count)
                else:
                    verifier.run(*args, method=method, tokens=tokens, num_emitted=count)
            try:
                call()
                torch.cuda.synchronize()
                verifier.check()
                graphs[spec] = harness.capture_graph(call)
                keep.append(verifier)
                outputs[spec] = (method, tokens, count)
            except Exception as error:  # noqa: BLE001 - report and keep going
                print(f"rows {rows} {spec}: {type(error).__name__}: {str(error)[:500]}")
        times = {spec: [] for spec in graphs}
        for _ in range(rounds):
            for spec, graph in graphs.items():
                times[spec].append(statistics.median(harness.time_graph_replays(graph, 20, flush)))
        first = {}
        floor = rows * V * ((K + 1) * 4 + K * 2) / 4.39e12 * 1e6
        for spec in graphs:
            method, tokens, count = outputs[spec]
            if method not in first:
                first[method] = (spec, tokens, count)
            ref_spec, ref_tokens, ref_count = first[method]
            same = torch.equal(tokens, ref_tokens) and torch.equal(count, ref_count)
            t = statistics.median(times[spec])
            print(f"rows {rows:4d} {spec:28s} {t:9.1f} us  ({min(times[spec]):.1f}-{max(times[spec]):.1f})  "
                  f"floor {floor:6.1f}  {100 * floor / t:5.1f}%  equal to {ref_spec}: {same}  "
                  f"mean emitted {count.double().mean().item():.2f}")
        for verifier in keep:
            verifier.check()
    from dspark_markov.verify import triton_verify_stream as ts

    try:
        for cache in ts._stream_verify_kernel.device_caches.values():
            for kernel in cache[0].values():
                print("stream kernel: registers", kernel.n_regs, "spills", kernel.n_spills, "shared",
                      kernel.metadata.shared)
    except Exception as error:  # noqa: BLE001 - Triton internals differ between versions
        print("registers: n/a", error)


if __name__ == "__main__":
    main(sys.argv[1:])
