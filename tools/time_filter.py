"""Time the Triton filter (``verify/triton_filtering.py``, issue 16) in ``bench --verify``'s filter
cases (every case checked against the sort reference by its first call) and print the rows that
needed search rounds after the first pass. Writes ``<GPU>_filter_verify_r<sizes>[_f<flags>].{json,csv}`` to ``$JOB_OUT``
(or /tmp) after each group, so a timeout keeps what finished.

Usage on the GPU machine: ``PYTHONPATH=src python3 tools/time_filter.py [batch sizes, e.g. 1,253]``.
Budget compile time: the first call of each specialization compiles (a few seconds each on the H200).

``--phases`` (the profile): the GPU time of each launch (stats, first pass, resolve, rounds, apply)
per bench input kind and case, in place after an L2 flush, the launches enqueued behind a GPU sleep
so that the events between them measure the kernels, not the host (median of ``REPEATS`` calls).

``--compare SIZES NAMES`` (issue 16, filter4): the same per-launch profile for the filter options of
:data:`VARIANTS` side by side (alternating per repeat, one process), written to ``$JOB_OUT/compare.txt``
case by case before each variant is checked bit for bit against the sort reference.
``--cuda`` (issue 16, the cluster-resident filter ``impl="cuda"``, opt-in: set ``DSPARK_MARKOV_UNVERIFIED=cuda_filter``):
the bench's filter cases for it too, in the same grid (kernel ``filter_row``, impl ``cuda``, beside the Triton
filter's default layout), each checked against the sort reference by its first call. ``--cuda-flags 3,15``: one
``cuda`` group per ``FilterArgs.flags`` value (``cuda_filtering.FLAG_*``; layout ``cluster x8 f15``), each checked
the same way; ``--cuda-only`` leaves the Triton group out.
``--profile CONFIGS``: one call per ``requests:case:kind:variant`` between cudaProfilerStart/Stop, for
``ncu --profile-from-start off --clock-control none``.
"""

import os
import re
import sys
import time
from pathlib import Path

import torch

from dspark_markov.bench import report, roofline
from dspark_markov.bench import verify_grid as vg
from dspark_markov.verify import triton_filtering


REPEATS = 7
KERNELS = ("_stats_kernel", "_pass_kernel", "_finish_kernel", "_redo_kernel", "_apply_kernel")


class _Marked:
    """A kernel whose launches record a CUDA event after them (the phase profile)."""

    def __init__(self, name, kernel, marks):
        self.name, self.kernel, self.marks = name, kernel, marks

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            result = launch(*args, **kwargs)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            label = self.name.strip("_").split("_")[0]
            self.marks.append(("rounds" if kwargs.get("ROUNDS") else label, event))
            return result

        return run


def phases(sizes):
    """Per-launch GPU times (us) of the filter at every bench kind and case; printed per size."""
    import statistics

    from dspark_markov.bench import harness

    device = torch.device("cuda")
    marks = []
    originals = {name: getattr(triton_filtering, name) for name in KERNELS}
    for name, kernel in originals.items():
        setattr(triton_filtering, name, _Marked(name, kernel, marks))
    flush = harness.L2Flusher(device)
    config = vg.VerifyBenchConfig()
    generator = torch.Generator(device=device).manual_seed(0)
    for requests in sizes:
        rows = requests * (config.steps + 1)
        gaussian = torch.randn(rows, config.vocab, generator=generator, device=device) * 2.0
        block, chunks = vg.split_chunks(rows, config.vocab, device) if requests <= 16 else (None, 1)
        filt = triton_filtering.TopKTopPFilter(rows, config.vocab, device, block=block, chunks=chunks)
        out = torch.empty_like(gaussian)
        for case in vg.FILTER_CASES:
            k = torch.full((rows,), config.top_k, dtype=torch.int64, device=device) if case == "k+p" else None
            p = torch.full((rows,), config.top_p, dtype=torch.float32, device=device)
            for kind in vg.FILTER_INPUTS:
                x = vg.filter_logits(kind, gaussian, generator)
                times = []
                for repeat in range(REPEATS + 1):
                    out.copy_(x)
                    flush()
                    torch.cuda._sleep(2_000_000)  # ~1 ms: the host enqueues every launch meanwhile
                    marks.clear()
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    filt.filter(out, k, p, out)
                    torch.cuda.synchronize()
                    if repeat:  # the first call compiles
                        stamps = [start] + [event for _, event in marks]
                        times.append([a.elapsed_time(b) * 1e3 for a, b in zip(stamps, stamps[1:])])
                labels = [label for label, _ in marks]
                phase = [statistics.median(t[i] for t in times) for i in range(len(labels))]
                print(f"phases {requests:3d} req ({rows} rows, chunks {filt.chunks}) {kind:8s} {case:3s}: "
                      + " ".join(f"{label} {t:7.1f}" for label, t in zip(labels, phase))
                      + f"  total {sum(phase):7.1f} us  searched {int(filt.state.searched)}", flush=True)
    for name, kernel in originals.items():
        setattr(triton_filtering, name, kernel)


VARIANTS = {  # name: filter attributes over the defaults (issue 16, filter4: options timed side by side)
    "current": {},
    "previous": {"lean": False, "stats_fast": False, "full_apply": False, "finish_options": {}},
    "reg255": {"finish_options": {}},
    "reg128": {"finish_options": {"maxnreg": 128}},
    "nt512": {"narrow_tile": 512},
    "late": {"late_gather": True},
    "w8": {"resolve_warps": 8},
    "exact": {"approx": False, "sweep_raw": False},  # (filter5) the default lean exact top-p sweep
    "approx": {"approx": True},  # approximate masses + exact redo (filter5)
    "raw": {"approx": False, "sweep_raw": True},  # exact, the bracket's lower end completed by the finish
}


def compare(sizes, names):
    """Per-launch GPU times (us) of each variant in :data:`VARIANTS`, side by side (alternating per
    repeat), at every bench kind and case; printed and written to ``$JOB_OUT/compare.txt`` before the
    outputs are checked against the sort reference (``check`` lines: rows that differ)."""
    import statistics

    from dspark_markov.bench import harness
    from dspark_markov.verify.filtering import top_k_top_p_reference

    log = open(Path(os.environ.get("JOB_OUT", "/tmp")) / "compare.txt", "a")

    def say(text):
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    device = torch.device("cuda")
    marks = []
    originals = {name: getattr(triton_filtering, name) for name in KERNELS}
    for name, kernel in originals.items():
        setattr(triton_filtering, name, _Marked(name, kernel, marks))
    flush = harness.L2Flusher(device)
    config = vg.VerifyBenchConfig()
    generator = torch.Generator(device=device).manual_seed(0)
    start_time = time.time()
    for requests in sizes:
        rows = requests * (config.steps + 1)
        gaussian = torch.randn(rows, config.vocab, generator=generator, device=device) * 2.0
        block, chunks = vg.split_chunks(rows, config.vocab, device) if requests <= 16 else (None, 1)
        filters = {}
        for name in names:
            filt = triton_filtering.TopKTopPFilter(rows, config.vocab, device, block=block, chunks=chunks)
            for attribute, value in VARIANTS[name].items():
                setattr(filt, attribute, value)
            filters[name] = filt
        out = torch.empty_like(gaussian)
        for case in vg.FILTER_CASES:
            k = torch.full((rows,), config.top_k, dtype=torch.int64, device=device) if case == "k+p" else None
            p = torch.full((rows,), config.top_p, dtype=torch.float32, device=device)
            for kind in vg.FILTER_INPUTS:
                x = vg.filter_logits(kind, gaussian, generator)
                times = {name: [] for name in names}
                labels = {}
                for repeat in range(REPEATS + 1):
                    for name in names:
                        out.copy_(x)
                        flush()
                        torch.cuda._sleep(2_000_000)
                        marks.clear()
                        begin = torch.cuda.Event(enable_timing=True)
                        begin.record()
                        filters[name].filter(out, k, p, out)
                        torch.cuda.synchronize()
                        if repeat:
                            stamps = [begin] + [event for _, event in marks]
                            times[name].append([a.elapsed_time(b) * 1e3 for a, b in zip(stamps, stamps[1:])])
                            labels[name] = [label for label, _ in marks]
                        elif requests == sizes[0] and case == vg.FILTER_CASES[0] and kind == vg.FILTER_INPUTS[0]:
                            say(f"compiled {name} t={time.time() - start_time:.1f}s")
                for name in names:
                    phase = [statistics.median(t[i] for t in times[name]) for i in range(len(labels[name]))]
                    say(f"{name:18s} {requests:3d} req ({rows} rows, chunks {filters[name].chunks}) {kind:8s} {case:3s}: "
                        + " ".join(f"{label} {t:7.1f}" for label, t in zip(labels[name], phase))
                        + f"  total {sum(phase):7.1f} us  searched {int(filters[name].state.searched)}"
                        + f" redone {int(filters[name].state.redone)}")
                # correctness after the timings are written: each variant once more, against the reference
                k_rows = k if k is not None else torch.zeros(rows, dtype=torch.int64, device=device)
                keep = top_k_top_p_reference(x, k_rows, p)
                want = torch.where(keep, x, torch.full((), float("-inf"), device=device))
                for name in names:
                    out.copy_(x)
                    filters[name].filter(out, k, p, out)
                    bad = (out.view(torch.int32) != want.view(torch.int32)).any(dim=1).sum().item()
                    say(f"check {name:18s} {requests:3d} req {kind:8s} {case:3s}: rows differing from the reference {bad}")
        say(f"t={time.time() - start_time:.1f}s")
    for name, kernel in originals.items():
        setattr(triton_filtering, name, kernel)


def profile(configs):
    """The launches of one filter call per config ``requests:case:kind:variant`` (e.g.
    ``253:p:gaussian:lean``) between ``cudaProfilerStart/Stop`` (after an untimed warm-up call), for
    ``ncu --profile-from-start off --clock-control none ...``."""
    device = torch.device("cuda")
    config = vg.VerifyBenchConfig()
    generator = torch.Generator(device=device).manual_seed(0)
    for item in configs:
        requests, case, kind, name = item.split(":")
        rows = int(requests) * (config.steps + 1)
        gaussian = torch.randn(rows, config.vocab, generator=generator, device=device) * 2.0
        x = vg.filter_logits(kind, gaussian, generator)
        block, chunks = vg.split_chunks(rows, config.vocab, device) if int(requests) <= 16 else (None, 1)
        filt = triton_filtering.TopKTopPFilter(rows, config.vocab, device, block=block, chunks=chunks)
        for attribute, value in VARIANTS[name].items():
            setattr(filt, attribute, value)
        k = torch.full((rows,), config.top_k, dtype=torch.int64, device=device) if case == "k+p" else None
        p = torch.full((rows,), config.top_p, dtype=torch.float32, device=device)
        out = x.clone()
        filt.filter(out, k, p, out)
        out.copy_(x)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        filt.filter(out, k, p, out)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {item}", flush=True)


def main():
    if "--profile" in sys.argv:
        sys.argv.remove("--profile")
        profile(sys.argv[1].split(","))
        return
    if "--compare" in sys.argv:
        sys.argv.remove("--compare")
        sizes = tuple(int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,16,64,253").split(","))
        names = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else tuple(VARIANTS)
        compare(sizes, names)
        return
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        sizes = tuple(int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,16,64,253").split(","))
        phases(sizes)
        return
    out = Path(os.environ.get("JOB_OUT", "/tmp"))
    with_cuda = "--cuda" in sys.argv
    if with_cuda:
        sys.argv.remove("--cuda")
    cuda_flags = (None,)
    if "--cuda-flags" in sys.argv:  # e.g. --cuda-flags 3,15: one cuda group per FilterArgs.flags value, alternating
        at = sys.argv.index("--cuda-flags")
        cuda_flags = tuple(int(f) for f in sys.argv[at + 1].split(","))
        del sys.argv[at:at + 2]
        with_cuda = True
    cuda_only = "--cuda-only" in sys.argv  # no Triton group (the cuda groups alone: a flags comparison)
    if cuda_only:
        sys.argv.remove("--cuda-only")
    sizes = tuple(int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,253,16,64").split(","))
    filters = []

    class Recorded(triton_filtering.TopKTopPFilter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            filters.append(self)

    triton_filtering.TopKTopPFilter = Recorded  # the bench's FilterRunner imports it at setup
    start = time.time()
    bw = roofline.measure_bandwidth(torch.device("cuda"))
    env = report.environment("cuda", ["tools/time_filter.py"])
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", env["gpu"] or "cpu").strip("-")  # (as the bench's file names)
    # one pair of files per invocation (two runs in one job folder must not overwrite each other)
    stem = f"{gpu}_filter_verify_r{'-'.join(map(str, sizes))}" + ("" if cuda_flags == (None,) else
                                                                  "_f" + "-".join(map(str, cuda_flags)))
    impls = ("triton", "cuda") if with_cuda else ("triton",)
    full = vg.VerifyBenchConfig(kernels=("filter_row", "filter_split"), rows=sizes, rounds=3, replays=15,
                                eager_calls=1, impls=impls)
    records = []
    for rows in sizes:
        kernel = "filter_split" if rows <= 16 else "filter_row"
        new = []
        groups = [] if cuda_only else [((kernel,), ("triton",), None)]
        if with_cuda or cuda_only:
            groups += [(("filter_row",), ("cuda",), flags) for flags in cuda_flags]
        for kernels, group, flags in groups:
            config = vg.VerifyBenchConfig(kernels=kernels, rows=(rows,), rounds=3, replays=15, eager_calls=1,
                                          impls=group, cuda_filter_flags=flags)
            new += vg.run_grid(config, bw, progress=False)
        records += new
        print(vg.format_table(new, bw), end="", flush=True)
        print(f"t={time.time() - start:.1f}s rows needing search rounds: {[int(f.state.searched) for f in filters[-6:]]}",
              flush=True)
        vg.write_json(out / f"{stem}.json", env, full, bw, records)
        vg.write_csv(out / f"{stem}.csv", env, full, bw, records)
    print(vg.format_table(records, bw, markdown=True), flush=True)


if __name__ == "__main__":
    main()
