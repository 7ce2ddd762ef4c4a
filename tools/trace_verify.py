"""Where one launch of the stream verifier spends its time: a per-program ``%globaltimer`` trace, summarised.

Usage: ``PYTHONPATH=src python3 tools/trace_verify.py [rows ...] [--variants stream,raw,stream:t1=8]
[--inputs random|close] [--vocab V]`` (defaults 16 64 253, ``stream``, random drafts, V = 129,280).

Inputs as ``tools/sweep_verify.py`` (fp32 target, bf16 cache, K = 5, mixed T 0 / 0.6 / 1 per slot). Each variant
(:class:`StreamVerifier` options after the colon, ``+``-separated; ``raw``: raw logits with the per-slot
temperature) is compiled with ``trace=`` (a separately compiled variant of the kernel: its timings are close to
the untraced one's, not equal), run once eagerly to compile, then once after an L2 flush; each program of that
launch writes its start, after-wait and end times and its stage (0 stream item, 1 mass item, 2 emit item),
validity and SM, whether its request is greedy or padding (``greedy_direct``: those requests' emit items
do no work and are counted apart, as ``emit (no work)``) and a stream item's row. Printed per stage: items, when
they start (first / median / last, us after the launch's first start), how long they wait for their request's
flag, how long they run (median / p90), when they end, and how many run at each tenth of the launch (at 0, 0.1,
..., 0.9 of it: the ramp, the overlap of stream and emit items, the tail); the stream items also by kind (greedy
argmax, bonus row, target and cache row pair), by request (the spread of their ends and when the last ends) and by
how many of them their SM ran (stop 32: at 16 requests on an
H100 the stream items of equal size ended anywhere between 17.6 and 41.3 us; with ``claim`` a stream program streams
the chunks it claims, so its recorded row says nothing of them and the kinds are not printed). The issue-18 question
it answers: at 16 / 64 requests the one launch runs at ~34% / ~58% of the read bandwidth; is the time in the
stream items' start ramp, their duration, the emit items' wait for the last stream item of their request, or
the tail? Phased calls make several launches: trace one launch (``phases=()``).
On the CPU (``TRITON_INTERPRET=1``) the kernel writes zeros for the times: the tool then checks only that the
launch and the summary run.
"""

import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_verify import K, make_inputs, options as sweep_options  # noqa: E402  (its inputs and variants' syntax)

STAGES = {0: "stream", 1: "mass", 2: "emit"}
DIRECT = 1 << 16  # the trace word's flag of a greedy / padding request (the kernel's `direct`)
ROW_SHIFT = 17  # the trace word's row of a stream item (4 bits, capped at 15)
REQUEST_SHIFT = 24  # the trace word's request


def _ends_by(key: torch.Tensor, mask: torch.Tensor, end: torch.Tensor) -> list:
    """The ends of the programs in ``mask``, one tensor per value of ``key`` among them (an SM, a request)."""
    return [end[mask & (key == k)] for k in torch.unique(key[mask]).tolist()]


def summarize(trace: torch.Tensor, points: int = 10, bonus_row: int | None = None) -> dict:
    """Summary of a ``[programs, 4]`` int64 trace (start ns, after-wait ns, end ns, stage + 4 valid + 8 smid +
    2^16 direct + 2^17 row + 2^24 request).

    Returns ``{"total_us", "sms", "padding", "stages": {name: {...}}}``, times in us after the first start of a
    valid program; ``active``: running items of the stage at ``points`` instants ``total * i / points`` (i = 0 ..
    points - 1); ``duration``: (median, p90 by the nearest rank). Programs that are not valid (lag padding, or
    items of requests an earlier launch decided) are counted in ``padding`` only; the emit items of greedy and
    padding requests (``direct``: they do no work) form the stage ``"emit (no work)"``, apart from ``"emit"``.
    With ``bonus_row`` (the row index of every request's bonus row: ``K`` when every request has ``K`` drafts) the
    stream items are also summarised by kind: ``"stream: greedy"`` (greedy requests' argmax items), ``"stream:
    bonus row"`` (a target row without a cache row) and ``"stream: pair"`` (a target and a cache row).
    ``"sm_load"``: ``{stream items on an SM: (SMs, median over those SMs of their last stream item's end)}``: whether
    the stream phase's tail comes from the SMs that run more items. ``"requests"``: over the requests with stream
    items, the median and largest spread of their stream items' ends (last - first) and the median and largest last
    end (when the request's statistics are ready): what ``claim`` should shrink."""
    trace = trace.detach().to("cpu", torch.int64)
    if trace.dim() != 2 or trace.shape[1] != 4:
        raise ValueError(f"trace: expected [programs, 4] int64, got {tuple(trace.shape)}")
    code = trace[:, 3]
    valid = (code >> 2) & 1 == 1
    stage = code & 3
    direct = (code & DIRECT) != 0
    smid = (code >> 3) & (DIRECT // 8 - 1)
    if not bool(valid.any()):
        return {"total_us": 0.0, "sms": 0, "padding": int(trace.shape[0]), "stages": {}}
    t0 = int(trace[valid, 0].min())
    start = (trace[:, 0] - t0).double() / 1e3
    waited = (trace[:, 1] - trace[:, 0]).double() / 1e3
    end = (trace[:, 2] - t0).double() / 1e3
    total = float(end[valid].max())
    instants = [total * i / points for i in range(points)]
    out = {"total_us": total, "sms": int(torch.unique(smid[valid]).numel()), "padding": int((~valid).sum()),
           "stages": {}}
    groups = [(name, valid & (stage == value) & ~(direct & (stage == 2))) for value, name in STAGES.items()]
    groups.append(("emit (no work)", valid & (stage == 2) & direct))
    streamed = valid & (stage == 0)
    if bonus_row is not None:
        row = (code >> ROW_SHIFT) & 15
        groups += [("stream: greedy", streamed & direct),
                   ("stream: bonus row", streamed & ~direct & (row == bonus_row)),
                   ("stream: pair", streamed & ~direct & (row != bonus_row))]
    load: dict = {}
    for ends in _ends_by(smid, streamed, end):
        load.setdefault(len(ends), []).append(float(ends.max()))
    out["sm_load"] = {count: (len(ends), statistics.median(ends)) for count, ends in sorted(load.items())}
    per_request = _ends_by(code >> REQUEST_SHIFT, streamed, end)
    spreads = [float(ends.max() - ends.min()) for ends in per_request]
    lasts = [float(ends.max()) for ends in per_request]
    if lasts:
        out["requests"] = {"n": len(lasts), "spread": (statistics.median(spreads), max(spreads)),
                           "ready": (statistics.median(lasts), max(lasts))}
    for name, mask in groups:
        if not bool(mask.any()):
            continue
        s, w, e = start[mask].tolist(), waited[mask].tolist(), end[mask].tolist()
        dur = sorted(b - a for a, b in zip(s, e))
        out["stages"][name] = {
            "n": len(s), "start": (min(s), statistics.median(s), max(s)), "wait_median": statistics.median(w),
            "duration": (statistics.median(dur), dur[max(0, math.ceil(0.9 * len(dur)) - 1)]),
            "end": (min(e), statistics.median(e), max(e)),
            "active": [sum(1 for a, b in zip(s, e) if a <= t < b) for t in instants],
        }
    return out


def format_summary(label: str, summary: dict) -> str:
    lines = [f"{label}: total {summary['total_us']:.1f} us on {summary['sms']} SMs, {summary['padding']} programs "
             f"not valid"]
    for name, st in summary["stages"].items():
        lines.append(
            f"  {name:14s} n={st['n']:5d}  start {st['start'][0]:6.1f} / {st['start'][1]:6.1f} / {st['start'][2]:6.1f}"
            f"  wait med {st['wait_median']:5.2f}  dur med {st['duration'][0]:6.2f} p90 {st['duration'][1]:6.2f}"
            f"  end {st['end'][0]:6.1f} / {st['end'][1]:6.1f} / {st['end'][2]:6.1f}  active at tenths "
            + " ".join(str(a) for a in st["active"]))
    if summary.get("requests"):
        req = summary["requests"]
        lines.append(f"  requests ({req['n']}): stream ends spread med {req['spread'][0]:.1f} / max "
                     f"{req['spread'][1]:.1f} us, last stream end (ready) med {req['ready'][0]:.1f} / max "
                     f"{req['ready'][1]:.1f} us")
    if summary.get("sm_load"):
        lines.append("  stream items per SM: " + ", ".join(f"{count} on {sms} SMs (their last end med {last:.1f} us)"
                                                             for count, (sms, last) in summary["sm_load"].items()))
    return "\n".join(lines)


def parse(argv):
    rows, variants, inputs, vocab = [], ["stream"], "random", 129_280
    i = 0
    while i < len(argv):
        if argv[i] in ("--variants", "--inputs", "--vocab"):
            if i + 1 >= len(argv):
                raise SystemExit(f"{argv[i]}: expected a value")
            value = argv[i + 1]
            if argv[i] == "--variants":
                variants = value.split(",")
            elif argv[i] == "--inputs":
                if value not in ("random", "close"):
                    raise SystemExit(f"--inputs: expected random or close, got {value!r}")
                inputs = value
            else:
                vocab = int(value)
            i += 2
        else:
            rows.append(int(argv[i]))
            i += 1
    return rows or [16, 64, 253], variants, inputs, vocab


def options(spec):
    """``stream:t1=8+lag=4`` -> ``("stream", {"t1": 8, "lag": 4})`` (tools/sweep_verify.py's syntax; ``a/b`` values
    are tuples); only the stream kernel's standard method (``stream``, ``raw``) is traced."""
    name, opts = sweep_options(spec)
    if name not in ("stream", "raw"):
        raise SystemExit(f"--variants: expected stream or raw (with options), got {spec!r}")
    return name, opts


def main(argv):
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    rows_list, variants, inputs, vocab = parse(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raw_target, batch_args = make_inputs(max(rows_list), inputs, dev, vocab)
    flush = None
    if dev.type == "cuda":
        from dspark_markov.bench import harness

        flush = harness.L2Flusher(dev)
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__)
    print(f"V={vocab} K={K} bf16 cache, mixed T, {inputs} inputs")
    for rows in rows_list:
        args = batch_args(rows)
        for spec in variants:
            name, opts = options(spec)
            opts.setdefault("phases", ())
            verifier = StreamVerifier(rows, K, vocab, dev, **opts)
            trace = torch.zeros(verifier.programs(rows, raw=name == "raw"), 4, dtype=torch.int64, device=dev)
            call_args = ((raw_target[:rows],) + args[1:]) if name == "raw" else args
            extra = {"target_temperature": args[6]} if name == "raw" else {}
            for _ in range(2):  # compile, then the traced launch after an L2 flush
                if flush is not None:
                    flush()
                tokens, count = verifier.run(*call_args, trace=trace, **extra)
            verifier.check()
            print(format_summary(f"rows {rows} {spec} (mean emitted {count.double().mean().item():.2f})",
                                 summarize(trace, bonus_row=None if opts.get("claim") or opts.get("span") else K)))
            # (make_inputs: K drafts in every request; a claimed program's row says nothing of what it streamed, a
            # spanned item's row is 0)


if __name__ == "__main__":
    main(sys.argv[1:])
