"""Where a CudaVerifier launch's time goes: per-ticket ``%globaltimer`` marks (its ``trace`` argument).

Usage: ``PYTHONPATH=src python3 tools/trace_cuda_verify.py [--rows 1,16,253] [--raw]
[--variant LAG:ITERS:MULT[:l][:s]]`` (``l``: the lag-ordered list, ``s``: static tickets; default the ready list,
whose emit tickets start only after their decision):
the bench's inputs (``bench.verify_grid.SharedInputs``, mixed T), three untraced launches, then one traced launch
per batch; prints, in us from the first ticket's start: the stream tickets' start spread, durations (median / p90)
and last end, the decisions (a request's last stream ticket's end), the emit tickets' durations (their wait for the
decision included) and the last end, and tickets per SM.
"""

import sys

import torch

from dspark_markov.bench import verify_grid
from dspark_markov.verify.cuda_verify import CudaVerifier


def _arg(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def _q(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv):
    rows_list = [int(x) for x in _arg(argv, "--rows", "1,16,253").split(",")]
    raw = "--raw" in argv
    fields = _arg(argv, "--variant", "-:-:-").split(":")
    queue = "l" not in fields  # (l: the lag-ordered list instead of the ready list)
    static = "s" in fields
    given = [None if x == "-" else int(x) for x in ([f for f in fields if f not in "ls"] + ["-"] * 3)[:3]]
    config = verify_grid.VerifyBenchConfig(device="cuda", rows=tuple(rows_list), kernels=("verify_standard",))
    shared = verify_grid.SharedInputs(config)
    k, vocab = config.steps, config.vocab
    print(f"{torch.cuda.get_device_name()} | {'raw' if raw else 'pre-divided'} logits, mixed T, one traced launch")
    for b in rows_list:
        temperature = verify_grid.mixed_temperatures(b, "cuda")
        args = verify_grid.standard_args(shared, b, temperature)
        extra = dict(target_temperature=temperature) if raw else {}
        verifier = CudaVerifier(b, k, vocab, "cuda", lag=None if queue else given[0], emit_iters=given[1],
                                piece_mult=given[2], queue=queue, static=static)
        for _ in range(3):
            verifier.run(*args, **extra)
        trace = torch.zeros(verifier.tickets(b), 4, dtype=torch.int64, device="cuda")
        verifier.run(*args, **extra, trace=trace)
        torch.cuda.synchronize()
        verifier.check()
        t = trace.cpu()
        t = t[t[:, 1] > 0]  # (the ready list's tickets of direct requests are never served: no marks)
        t0 = int(t[:, 0].min())
        start, end = ((t[:, 0] - t0) / 1e3).tolist(), ((t[:, 1] - t0) / 1e3).tolist()
        info, req = t[:, 2].tolist(), t[:, 3].tolist()
        stream = [i for i in range(len(info)) if not info[i] & 256]
        emits = [i for i in range(len(info)) if info[i] & 256 and not info[i] & 512]
        decided = {}
        for i in stream:
            decided[req[i]] = max(decided.get(req[i], 0.0), end[i])
        dur = [end[i] - start[i] for i in stream]
        edur = [end[i] - start[i] for i in emits]
        ewait = [max(0.0, decided[req[i]] - start[i]) for i in emits]
        elate = [max(0.0, start[i] - decided[req[i]]) for i in emits]  # decision to the emit ticket's start
        sms = torch.bincount(torch.tensor([x & 255 for x in info]))
        lag, iters, mult = verifier.schedule_of(b)
        print(f"{b:4d} requests ({'ready list' if queue else f'lag {lag}'}, emit_iters {iters}, piece_mult {mult}), "
              f"{len(info)} tickets, "
              f"end {max(end):.1f} us")
        print(f"     stream: {len(stream)} tickets, starts {min(start[i] for i in stream):.1f}-"
              f"{max(start[i] for i in stream):.1f}, duration median {_q(dur, .5):.1f} p90 {_q(dur, .9):.1f} "
              f"max {max(dur):.1f}, last end {max(end[i] for i in stream):.1f}")
        d = sorted(decided.values())
        print(f"     decisions: first {d[0]:.1f}, median {_q(d, .5):.1f}, last {d[-1]:.1f}")
        if emits:
            print(f"     emit: {len(emits)} tickets, starts {min(start[i] for i in emits):.1f}-"
                  f"{max(start[i] for i in emits):.1f}, duration median {_q(edur, .5):.1f} p90 {_q(edur, .9):.1f}, "
                  f"wait for the decision median {_q(ewait, .5):.1f} p90 {_q(ewait, .9):.1f}, "
                  f"start after it median {_q(elate, .5):.1f} p90 {_q(elate, .9):.1f}, "
                  f"last end {max(end[i] for i in emits):.1f}")
        print(f"     tickets per SM: min {int(sms[sms > 0].min())} max {int(sms.max())} over {int((sms > 0).sum())} SMs",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
