"""A discrete-event model of CudaVerifier's ticket schedule, to read its H100 timings (stop 35) against.

Usage: ``python3 tools/model_cuda_verify.py [--atomic-ns 0,20] [--policy ahead,after,static] [--rows]``. ``W`` warps
take tickets
in list order (verify_plan.cuh: stream tickets of request g, then the emit tickets of request g - lag): ``ahead``
takes the next ticket when the current one starts (the first GPU version: a warp waiting in an emit ticket holds a
stream ticket), ``after`` takes it when the current one ends (emit tickets; the version after stop 35's runs),
``static``: warp ``w`` takes tickets ``w, w + W, ...`` (no counter); ``--rows``: per-row arrival words. A stream
ticket (16 KB) lasts ``max(latency, streaming warps x 16 KB / bandwidth)``; an emit ticket waits for its request's
decision (its last stream ticket's end + ``decide_us``) and then lasts ``emit_us``. ``atomic_ns``: each ticket claim
and each arrival is served, one at a time, by its word (the ticket counter; a request's stream / emit counter): the
cost of same-address atomics if they serialise. Prints the modelled launch time (us) by batch and lag, beside the H100
measurements of the first versions (benchmarks/results/NVIDIA-H100-80GB-HBM3_2026-12-05_cuda_verify_stop35.txt).
Pure Python: it knows nothing of the GPU but these parameters.
"""

import heapq
import sys

MEASURED = {(1, 4): 28.3, (16, 4): 141.3, (16, 16): 133.8, (16, 0): 212.8, (64, 8): 411.0, (64, 16): 340.7,
            (253, 8): 1801.5, (253, 16): 1265.7, (253, 0): 2858.1}  # (requests, lag): us, v2, H100
EMIT = {1: 127, 16: 127, 64: 64, 253: 32}  # emit tickets per request (emit pieces of 1,024 / 2,048 / 4,096 tokens)


def model(batch, lag, emits, *, policy="ahead", atomic_ns=0.0, rows=False, stream=272, warps=2112, bandwidth=3.35e6,
          piece=16384, latency=3.0, emit_us=2.0, decide_us=2.0):
    """Modelled launch time in us (bandwidth in bytes per us: 3.35e6 = 3.35 TB/s)."""
    lag = min(lag, batch)
    tickets = [("s", b) for b in range(lag) for _ in range(stream)]
    for g in range(lag, batch):
        tickets += [("s", g)] * stream + [("e", g - lag)] * emits
    tickets += [("e", b) for b in range(batch - lag, batch) for _ in range(emits)]
    atomic = atomic_ns / 1e3
    free = {}  # word -> time it can serve the next atomic

    def serve(word, now):
        t = max(now, free.get(word, 0.0)) + atomic
        free[word] = t
        return t

    left, decided, waiting = [stream] * batch, [None] * batch, [[] for _ in range(batch)]
    state = {"next": 0, "streaming": 0, "seq": 0}
    events, held = [], {}

    def push(time, kind, warp, ticket):
        state["seq"] += 1
        heapq.heappush(events, (time, state["seq"], kind, warp, ticket))

    def claim(now, warp=None):
        if policy == "static":  # warp w's tickets w, w + W, ...: no counter
            ticket = state.setdefault(("at", warp), warp)
            state[("at", warp)] = ticket + warps
            return (ticket, now) if ticket < len(tickets) else (None, now)
        if state["next"] >= len(tickets):
            return None, now
        state["next"] += 1
        return state["next"] - 1, serve("tickets", now)

    def start(warp, ticket, now):
        kind, b = tickets[ticket]
        if kind == "s":
            state["streaming"] += 1
            push(now + max(latency, state["streaming"] * piece / bandwidth), "stream_end", warp, ticket)
        elif decided[b] is not None and decided[b] <= now:
            push(now + emit_us, "emit_end", warp, ticket)
        else:
            waiting[b].append((warp, ticket))

    def free_warp(warp, now):
        if policy == "ahead":  # the held ticket is usable once its claim has come back
            ticket, ready = held.pop(warp, (None, now))
            if ticket is None:
                ticket, ready = claim(now, warp)
            if ticket is None:
                return
            now = max(now, ready)
            following, back = claim(now, warp)
            if following is not None:
                held[warp] = (following, back)
        else:
            ticket, now = claim(now, warp)
            if ticket is None:
                return
        start(warp, ticket, now)

    for warp in range(warps):
        free_warp(warp, 0.0)
    end = 0.0
    while events:
        now, _, kind, warp, ticket = heapq.heappop(events)
        end = max(end, now)
        b = tickets[ticket][1]
        if kind == "stream_end":
            state["streaming"] -= 1
            # row_arrivals: a row's arrivals on its own word (11 words a request; the rows' last arrivals on the
            # request's word, 11 more, are left out)
            now = serve(("row", b, ticket % 11) if rows else ("stream", b), now)
            left[b] -= 1
            if left[b] == 0:
                decided[b] = now + decide_us
                push(decided[b], "decided", warp, ticket)
            free_warp(warp, now)
        elif kind == "decided":
            for w, t in waiting[b]:
                push(now + emit_us, "emit_end", w, t)
            waiting[b] = []
        else:
            free_warp(warp, serve(("emit", b), now))
    return end


def main(argv):
    atomics = [float(x) for x in (argv[argv.index("--atomic-ns") + 1] if "--atomic-ns" in argv else "0,20").split(",")]
    policies = (argv[argv.index("--policy") + 1] if "--policy" in argv else "ahead,after,static").split(",")
    rows = "--rows" in argv
    for (batch, lag), measured in sorted(MEASURED.items()):
        cells = [f"{policy} {ns:g} ns: {model(batch, lag, EMIT[batch], policy=policy, atomic_ns=ns, rows=rows):.0f}"
                 for policy in policies for ns in atomics]
        print(f"{batch:4d} requests, lag {lag:2d}: measured {measured:.0f} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
