"""Where the time of one top_k_top_p(impl="cuda") call goes: phase timestamps from inside the cluster filter.

Usage (an H200): ``PYTHONPATH=src python3 tools/trace_cluster_filter.py [--rows 6,96,1518]``. Compiles filter.cu
with ``-DDF_TRACE`` (thread 0 of every block of rows 0 and rows / 2 records clock64() at each DF_MARK: filter.cu),
runs each case (k = 50 + p = 0.9, p = 0.9 alone: ``--cases``; Gaussian and peaked rows, or ``--kinds``) eagerly
after an L2 flush, for each ``--flags`` value (the kernel's options, cuda_filtering.FLAG_*; a value with
FLAG_L2_ROWS runs the -DDF_L2_ROWS build), and prints for the traced rows the marks in time order with the cycles
since the previous mark (rank 0, and the slowest block of the cluster), and microseconds at the clock implied by the
call's event time at the smallest batch.

Marks: 0 start, 1 slice loaded, 2 row max known (cluster barrier), 18 level-1 bins added, 19 cluster barrier,
3 histogram reduced (scan, cluster barrier), 4 k+p: bucket located, 13 candidates gathered, 14 cluster barrier,
15 sorted, 16 masses scanned, 5 collect done, 6 found; 7 search: bucket located, 8 narrowing done, 9 collect done,
10 found; 11 cut known, 12 last cluster barrier, 17 row written.
"""

import argparse

import torch

from dspark_markov.bench import harness
from dspark_markov.bench.verify_grid import filter_logits
from dspark_markov.cuda import build
from dspark_markov.verify import cuda_filtering as cf
from dspark_markov.verify.filtering import top_k_top_p

SLOTS = 24  # filter.cu DF_TRACE_SLOTS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="6,96,1518")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--kinds", default="gaussian,peaked",
                        help="comma-separated input kinds (verify_grid.FILTER_INPUTS)")
    parser.add_argument("--cases", default="k+p,p",
                        help="comma-separated cases: k+p (k = 50, p = 0.9), p (p = 0.9 alone)")
    parser.add_argument("--flags", default=f"{cf.RESIDENT_KERNEL_FLAGS & ~cf.FIXED_ONLY_FLAGS & cf.DEFAULT_FLAGS},"
                                           f"{cf.DEFAULT_FLAGS & ~(cf.FLAG_SPECIALIZE | cf.FIXED_ONLY_FLAGS)}",  # resident, L2
                        help="comma-separated FilterArgs.flags values to run (cuda_filtering.FLAG_*), e.g. 0,3; the "
                             "traced builds are generic (-DDF_TRACE, flags read at run time, FLAG_SPECIALIZE and the "
                             "options it alone compiles in, FIXED_ONLY_FLAGS, do not apply): the default flags' "
                             "kernel options, not the specialized build the default launches")
    parser.add_argument("--relaxed", action="store_true",
                        help="also time a build whose cluster barriers arrive relaxed (-DDF_RELAXED_EXPERIMENT: no "
                             "GPU-scope fence; a timing experiment, its results may differ from the reference)")
    args = parser.parse_args()
    vocab, device = 129_280, torch.device("cuda")
    torch.empty(1, device=device)
    all_flags = [int(f) for f in args.flags.split(",")]
    if any(f & cf.FLAG_L2_CLUSTER4 for f in all_flags):  # (its trace layout is [2 rows][8 blocks])
        parser.error("--flags: FLAG_L2_CLUSTER4 (the 4-block build) is not traced by this tool")
    if any(f & cf.FLAG_PERSIST for f in all_flags):  # (it launches a cluster per row, as the one-row builds)
        parser.error("--flags: FLAG_PERSIST (the -DDF_PERSIST builds) is not traced by this tool")
    for options in (("-DDF_TRACE",), ("-DDF_TRACE", "-DDF_RELAXED_EXPERIMENT"))[:2 if args.relaxed else 1]:
        for l2 in sorted({bool(f & cf.FLAG_L2_ROWS) for f in all_flags}):  # FLAG_L2_ROWS: the -DDF_L2_ROWS build
            build_options = options + tuple(f"-D{d}" for d in (cf.L2_DEFINES if l2 else ()))
            print("== build", " ".join(build_options), flush=True)
            cubin, _ = build.compile_cubin("filter.cu", extra_options=build_options)
            kernels = build.Kernels(cubin, cf.KERNELS, 0)
            if not l2:
                kernels.set_dynamic_smem(cf.KERNELS[0], cf.MAX_SLICE * 4)
            kernels.set_attribute(cf.KERNELS[0], build.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
            for flags in (f for f in all_flags if bool(f & cf.FLAG_L2_ROWS) == l2):
                print(f"== flags {flags}", flush=True)
                run(kernels, args, vocab, device, flags & cf.KERNEL_FLAGS, 0 if l2 else cf.smem_bytes(vocab))


def run(kernels, args, vocab, device, flags, smem):
    flush = harness.L2Flusher(device)
    ghz = None
    for rows in map(int, args.rows.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(1)
        gaussian = torch.randn(rows, vocab, generator=gen, device=device) * 2
        for kind in args.kinds.split(","):
            x = filter_logits(kind, gaussian, gen)
            cases = [case for case in (("k+p", 50, 0.9), ("p", None, 0.9)) if case[0] in args.cases.split(",")]
            for name, k, p in cases:
                stats = torch.zeros(1 + 2 * cf.CLUSTER * SLOTS, dtype=torch.int64, device=device)
                out = torch.empty_like(x)
                fa = cf.FilterArgs(
                    logits=x.data_ptr(), out=out.data_ptr(), k_ptr=0, p_ptr=0, stats=stats.data_ptr(), rows=rows,
                    vocab=vocab, in_stride=vocab, out_stride=vocab, slice=cf.slice_len(vocab),
                    k_value=k or 0, k_per_row=0, k64=0, p_per_row=0, p_value=cf.f32(p), t_ptr=0, t_per_row=0,
                    t_value=1.0, flags=flags)
                stream = torch.cuda.current_stream().cuda_stream
                for _ in range(args.calls):
                    stats.zero_()
                    flush()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    kernels.launch(cf.KERNELS[0], rows * cf.CLUSTER, cf.THREADS, smem, stream, [fa])
                    end.record()
                    torch.cuda.synchronize()
                event_us = start.elapsed_time(end) * 1e3
                ok = torch.equal(out, top_k_top_p(x.clone(), k, p, impl="reference"))
                trace = stats[1:].view(2, cf.CLUSTER, SLOTS).cpu()
                if ghz is None:  # the smallest batch: one wave, the traced row spans the call (clock64 is per SM)
                    span = int(trace[0, 0, 17] - trace[0, 0, 0])
                    ghz = span / (event_us * 1e3) if span > 0 else 1.98
                print(f"rows {rows} {kind} {name}: event {event_us:.1f} us, equal to the reference {ok}, "
                      f"clock {ghz:.2f} GHz", flush=True)
                for t, label in ((0, "row 0"), (1, f"row {rows // 2}")):
                    block = trace[t]  # [rank, slot]: each block's own SM clock
                    marks = sorted((s for s in range(1, SLOTS) if int(block[0, s]) != 0), key=lambda s: int(block[0, s]))
                    parts, prev = [], 0
                    for s in marks:
                        deltas = [int(block[r, s]) - int(block[r, prev]) for r in range(cf.CLUSTER)
                                  if int(block[r, s]) != 0 and int(block[r, prev]) != 0]
                        parts.append(f"{s}:{deltas[0] / ghz / 1e3:.2f}/{max(deltas) / ghz / 1e3:.2f}")
                        prev = s
                    total = max(int(block[r, 17]) - int(block[r, 0]) for r in range(cf.CLUSTER)) / ghz / 1e3
                    print(f"  {label}: total {total:.2f} us; mark:us since previous (rank 0 / slowest block) "
                          + " ".join(parts), flush=True)

if __name__ == "__main__":
    main()
