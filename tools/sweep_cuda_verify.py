"""Time CudaVerifier schedules beside the Triton verifier, same call, same inputs as ``bench --verify``.

Usage: ``PYTHONPATH=src python3 tools/sweep_cuda_verify.py [--rows 1,16,64,253]
[--variants LAG:ITERS:MULT[:l][:s][:r],...] [--raw]
[--rounds 5] [--replays 20]``: for each batch, the bench's inputs (``bench.verify_grid.SharedInputs``, mixed T),
the Triton :class:`StreamVerifier` default and one :class:`CudaVerifier` per ``lag:emit_iters:piece_mult`` (``-`` keeps
the default; the ready-list schedule, which ignores lag, unless ``l``: the lag-ordered list; ``s``: static tickets,
``r``: per-row arrivals), each captured in a CUDA graph; rounds alternate the variants, each replay after an L2 flush;
prints the median of the rounds' medians (us) and whether every variant's tokens equal the Triton verifier's.
"""

import statistics
import sys

import torch

from dspark_markov.bench import harness, verify_grid
from dspark_markov.verify.cuda_verify import CudaVerifier, schedule
from dspark_markov.verify.triton_verify_stream import StreamVerifier


def _arg(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv):
    rows_list = [int(x) for x in _arg(argv, "--rows", "1,16,64,253").split(",")]
    variants = _arg(argv, "--variants", "-:-").split(",")
    raw = "--raw" in argv
    rounds, replays = int(_arg(argv, "--rounds", "5")), int(_arg(argv, "--replays", "20"))
    config = verify_grid.VerifyBenchConfig(device="cuda", rows=tuple(rows_list), kernels=("verify_standard",))
    shared = verify_grid.SharedInputs(config)
    flush = harness.L2Flusher(torch.device("cuda"))
    k, vocab = config.steps, config.vocab
    print(f"{torch.cuda.get_device_name()} | {'raw' if raw else 'pre-divided'} logits, mixed T | us: median of "
          f"{rounds} rounds x {replays} replays, cold L2 ({flush.mode} flush)")
    for b in rows_list:
        temperature = verify_grid.mixed_temperatures(b, "cuda")
        args = verify_grid.standard_args(shared, b, temperature)
        extra = dict(target_temperature=temperature) if raw else {}
        runs = {"triton": StreamVerifier(b, k, vocab, "cuda")}
        for v in variants:
            fields = v.split(":")
            static, rows_first = "s" in fields, "r" in fields
            queue = "l" not in fields
            given = [None if x == "-" else int(x) for x in ([f for f in fields if f not in "srl"] + ["-"] * 3)[:3]]
            used = [d if g is None else g for g, d in zip(given, schedule(b))]
            name = ("cuda queue e={1} m={2}" if queue else "cuda lag={} e={} m={}").format(*used)
            name += (" static" if static else "") + (" rows" if rows_first else "")
            runs[name] = CudaVerifier(b, k, vocab, "cuda", lag=None if queue else given[0], emit_iters=given[1],
                                      piece_mult=given[2], static=static, row_arrivals=rows_first, queue=queue)
        graphs, outs = {}, {}
        for name, verifier in runs.items():
            tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device="cuda")
            count = torch.zeros(b, dtype=torch.int64, device="cuda")

            def call(verifier=verifier, tokens=tokens, count=count):
                verifier.run(*args, **extra, tokens=tokens, num_emitted=count)

            call()
            torch.cuda.synchronize()
            verifier.check()
            outs[name] = (tokens.clone(), count.clone())
            graphs[name] = harness.capture_graph(call)
        ok = {name: torch.equal(outs[name][0], outs["triton"][0]) and torch.equal(outs[name][1], outs["triton"][1])
              for name in runs}
        medians = {name: [] for name in runs}
        for _ in range(rounds):
            for name, graph in graphs.items():
                medians[name].append(statistics.median(harness.time_graph_replays(graph, replays, flush)))
        line = " | ".join(f"{name} {statistics.median(m):.1f}{'' if ok[name] else ' (TOKENS DIFFER)'}"
                          for name, m in medians.items())
        print(f"{b:4d} requests: {line}", flush=True)
        for verifier in runs.values():
            if isinstance(verifier, CudaVerifier):
                verifier.check()
        del graphs


if __name__ == "__main__":
    main(sys.argv[1:])
