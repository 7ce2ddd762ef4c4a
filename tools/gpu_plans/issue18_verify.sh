#!/usr/bin/env bash
# GPU plan for issue 18 (verification) written by verify5 on 2026-12-04 WITHOUT device time (the session's rounds
# did not run). Run from the repository root on an H200 (sm_90), PYTHONPATH=$PWD/src, one part per job, in order:
#   bash tools/gpu_plans/issue18_verify.sh check    # budget ~120 s: the GPU tests never run on the H200
#   bash tools/gpu_plans/issue18_verify.sh time     # budget ~110 s: early stop beside the default, each case checked
#   bash tools/gpu_plans/issue18_verify.sh ncu      # budget ~80 s: profiles of early stop and the default
#   bash tools/gpu_plans/issue18_verify.sh bench    # budget ~100 s: the bench cases (README table), block included
#   bash tools/gpu_plans/issue18_verify.sh phased_check  # budget ~250 s: phased launches (stop 30, main, opt-in): GPU tests
#   bash tools/gpu_plans/issue18_verify.sh phased_time   # budget ~300 s: phased launches beside the default, 2 input kinds
#   bash tools/gpu_plans/issue18_verify.sh trace         # budget ~150 s: where one launch's time goes at 1 / 16 / 64 / 253 requests
#   bash tools/gpu_plans/issue18_verify.sh dbuf          # budget ~150 s: the double-buffered fused loop beside the old default (ran in stop 33, H100)
#   bash tools/gpu_plans/issue18_verify.sh claim         # budget ~480 s: claimed chunks (stop 32; ran in stop 33 on an H100: exact, slower)
#   bash tools/gpu_plans/issue18_verify.sh emit_dbuf     # budget ~470 s: the double-buffered / reversed emit scans (stop 33, never run): GPU tests, sweep, trace
#   bash tools/gpu_plans/issue18_verify.sh layout_dbuf   # budget ~150 s: stream / emit chunk sizes again under the double-buffered default
#   bash tools/gpu_plans/issue18_verify.sh stop34        # budget ~470 s: the bench cases with stop 34's defaults, then the GPU tests of those defaults
#   bash tools/gpu_plans/issue18_verify.sh t1_large      # budget ~110 s: whole-row stream items (t1 = 64) at 64-253 requests under stop 34's defaults
#   bash tools/gpu_plans/issue18_verify.sh ncu_raw       # budget ~120 s: Nsight Compute of the default kernel at 253 requests, pre-divided against raw (stop 34, never run)
#   bash tools/gpu_plans/issue18_verify.sh winner        # budget ~230 s: emit items with the exact key of their cheap winner only (stop 39): GPU tests, sweep, ncu at 16
#   bash tools/gpu_plans/issue18_verify.sh winner253     # budget ~150 s: emit_winner at 64 / 253 requests beside the default (winner's sweep stopped at 64)
#   bash tools/gpu_plans/issue18_verify.sh winner_checks # budget ~360 s: emit_winner as the default: the verifier's GPU tests, the old path as an option, the side-by-side times
#   bash tools/gpu_plans/issue18_verify.sh winner_trace  # budget ~120 s: launch traces at 16 / 64 requests, emit_winner on and off, clean and dirty flush
#   bash tools/gpu_plans/issue18_verify.sh tail          # budget ~290 s: the two-level emit_winner (default) and the tail option: GPU tests, sweeps
#   bash tools/gpu_plans/issue18_verify.sh ncu_emit      # budget ~180 s: Nsight Compute source counters of the default kernel at 16 requests (where an emit item's ~2.3 us per tile goes; stop 38, never run)
#   bash tools/gpu_plans/issue18_verify.sh gather        # budget ~160 s: emit items loading every row's statistics with the count (stop 34, never run)
#   bash tools/gpu_plans/issue18_verify.sh eager         # budget ~200 s: emit items with fewer dependent round trips (stop 34): GPU tests, sweep
#   bash tools/gpu_plans/issue18_verify.sh defaults      # budget ~150 s: the double-buffered default against the single-buffered one and the emit options, same call
#   bash tools/gpu_plans/issue18_verify.sh span          # budget ~420 s: rows end to end in items crossing row ends (stop 34, never run): GPU tests, sweep, trace
#   bash tools/gpu_plans/issue18_verify.sh h200          # budget ~120 s: on an H200 only (else nothing): the bench cases of today's default (no patch), T = 1 and mixed
# Results go to $JOB_OUT (default ./gpu_plan_out). StreamVerifier compiles ~5-7 s per constexpr variant; a Triton
# cache carried from an earlier job of the same source skips that (tools/gpu_queue.sh). Nothing of early stop
# (StreamVerifier early_stop / stop_check / early_ready, opt-in, off by default) has run on a GPU, and it is NOT on
# main: its change recompiles the default kernel differently (tools/verify_sass.py: none of the 64 default variants
# keeps a062686's SASS; tokens bit-identical in the interpreter), so main keeps the H200-verified verifier and the
# early-stop change is tools/gpu_plans/issue18_early_stop.patch (verifier, its CPU and GPU tests, the probe tool),
# which the parts below apply to the job's copy of the tree (`early_stop_patch`). Land the patch only when `check`
# passed and `time` shows its default no slower than main's (the committed verify results) and early stop faster.
set -u
export PYTHONUNBUFFERED=1
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
T=tests/gpu/test_triton_verify_gpu.py
early_stop_patch() {  # apply tools/gpu_plans/issue18_early_stop.patch to this copy of the tree (once)
  if git apply --check tools/gpu_plans/issue18_early_stop.patch 2>/dev/null; then
    git apply tools/gpu_plans/issue18_early_stop.patch && echo "early-stop patch applied"
  fi
}
case "${1:-check}" in
check)
  # 1. (~50 s) main's (H200-verified) default: its tests not run on the H200 since stop 23: the option tests (16: fast_divide_2, padded;
  #    253: all), the DSparkStep graph test, the layouts test (block layout of b5c078a).
  timeout -k 2 50 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "(options and not early) or dspark_step or layouts" \
    2>&1 | tee "$OUT/tests_default.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -16
  # 2. (~70 s) The patch, then early stop: every launch equal to the reference (3 eager launches, pre-divided and raw, then graph
  #    replays with new inputs; counters and arrival words reset) at 16 and 253 requests, alone and with stop_check +
  #    early_ready; then the chi-square of every position with early stop. A failure here: read `_decide_row` (the
  #    per-row decision), `_terminal` (the prefix), the arrival word's fields (7 bits per row, js + 1 at bit 56).
  #    A status error (a waiting item timed out): the emit items' ready flag (early_ready: `_finish_arrival`).
  early_stop_patch
  timeout -k 2 70 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "early" 2>&1 | tee "$OUT/tests_early.txt" \
    | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -12
  ;;
time)
  early_stop_patch  # probe_stream_verify.py and the early-stop kernels come with it
  # 3. (~60 s) Early stop beside the default (the same run): standard and raw, mixed T, 1/16/64/253 requests; every
  #    replayed output against the reference ("correctness: 0 bad variant-cases" expected). The arithmetic (bench
  #    inputs: js = 0 for ~2/3 of the requests) says early stop reads ~35-50% of today's bytes at 64/253.
  E=early_stop=1
  timeout -k 2 60 python3 tools/probe_stream_verify.py "$OUT/mixed" 1,16,64,253 --temps mixed std "std:$E" \
    "std:$E+stop_check=1" "std:$E+early_ready=1" "std:$E+stop_check=1+early_ready=1" raw "raw:$E+stop_check=1"
  # 4. (~25 s) T = 1 (the 1-request target), chunk sizes and lags of early stop (runtime arguments: no compile).
  timeout -k 2 25 python3 tools/probe_stream_verify.py "$OUT/t1" 1,16,64,253 --temps 1 --rounds 2 std "std:$E" \
    "std:$E+stop_check=1+early_ready=1" "std:$E+t1=16@253" "std:$E+t1=8@253" "std:$E+t1=4@64" "std:$E+t1=16@64" \
    "std:$E+t1=2@16" "std:$E+t1=6@16" "std:$E+t1=2@1" "std:$E+lag=1@1" "std:$E+lag=4@16" "raw:$E+stop_check=1"
  # 5. (~20 s) High acceptance (the target = the cache + small noise: every row read): the worst case of early stop,
  #    which must not be slower than the default by more than its per-row arrivals (~1 us per row per item).
  timeout -k 2 20 python3 tools/probe_stream_verify.py "$OUT/close" 16,64,253 --inputs close --rounds 2 std "std:$E" \
    "std:$E+stop_check=1+early_ready=1" "std:$E+t1=16@253"
  ;;
ncu)
  early_stop_patch  # probe_stream_verify.py and the early-stop kernels come with it
  # 6. (~40 s) Where early stop's time goes at 253 and 16 requests (mixed T) beside the default: DRAM bytes (the
  #    skipped rows), L2 hit rate of the emitted row, occupancy (80 registers; the early-stop variants spill 256-770
  #    bytes, a few LDL per streamed group), issue; and raw T = 1 (26 us slower than standard at 253 today).
  for spec in std std:early_stop=1+stop_check=1+early_ready=1; do
    for rows in 253 16; do
      timeout -k 2 18 ncu --clock-control none -k regex:_stream_verify_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section ComputeWorkloadAnalysis --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
        python3 tools/probe_stream_verify.py --ncu $rows $spec > "$OUT/ncu_${spec//[:=+]/_}_$rows.txt" 2>&1
      grep -E "Duration|dram__bytes|lts__t|Achieved Occ|Issue Slots|DRAM Th" "$OUT/ncu_${spec//[:=+]/_}_$rows.txt"
    done
  done
  # Raw T = 1 vs standard T = 1 at 253 (the default kernel): the same streamed SASS loops, but a kernel 1.7x larger
  # (10.6k vs 6.3k SASS instructions; the emit scan loop 365 vs 301: the div_rn branch inlined) with stream and emit
  # programs co-resident: expect "No Instruction" stalls (instruction-cache misses) in WarpStateStats if that is the
  # 26 us; else compare the executed instructions per section.
  for spec in std raw; do
    timeout -k 2 18 ncu --clock-control none -k regex:_stream_verify_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats --metrics dram__bytes_read.sum \
      python3 tools/probe_stream_verify.py --ncu 253 $spec 1 > "$OUT/ncu_${spec}_T1_253.txt" 2>&1
    grep -E "Duration|dram__bytes|No Instruction|Issue Slots|Executed Instructions " "$OUT/ncu_${spec}_T1_253.txt"
  done
  ;;
bench)
  # 7. (~90 s) The bench's cases for the README (CUDA graph, cold L2, median of alternating rounds): the default
  #    (standard, raw, block, block raw: block's emit items as b5c078a sets them), then early stop through the
  #    environment switch (the bench harness builds StreamVerifier without options). Commit both as
  #    benchmarks/results/NVIDIA-H200_<date>_verify*_bench.*; land the patch and make early stop the default
  #    (EARLY_STOP_FROM) only where it wins and steps 1-3 passed.
  timeout -k 2 50 python3 tools/bench_verify_kernels.py "$OUT/bench_default" verify_standard,verify_raw,verify_block,verify_block_raw \
    --rows 1,16,64,253 --temperatures 1,mixed --rounds 3 --replays 10 2>&1 | grep "^|" | tee "$OUT/bench_default.txt"
  early_stop_patch  # main's default above, the patched tree's early stop below
  DSPARK_MARKOV_VERIFY_EARLY_STOP=1,stop_check,early_ready timeout -k 2 40 python3 tools/bench_verify_kernels.py \
    "$OUT/bench_early" verify_standard,verify_raw --rows 1,16,64,253 --temperatures 1,mixed --rounds 3 --replays 10 \
    2>&1 | grep "^|" | tee "$OUT/bench_early.txt"
  ;;
phased_check)
  # 8. (~200 s with compiles: ~6 s per launch variant) StreamVerifier(phases=...) is on main, off by default
  #    (PHASES_FROM = None), CPU-tested only. Its GPU tests: tokens equal to one launch and the reference at 16 / 253
  #    requests with drafts mostly rejected early and mostly accepted, rows after a request's emitted one never
  #    written (a sentinel in the partials stays), eager and graph replays with new inputs, raw and pre-divided
  #    (OPTION_VARIANTS phases_1 / phases_1_2). A failure: the epilogue's `decided` (count < HI), the items' check of
  #    the accepted count (acc >= ROW_LO) and the per-phase Layout (rows=).
  timeout -k 2 240 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "phase" 2>&1 | tee "$OUT/tests_phased.txt" \
    | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -14
  ;;
phased_time)
  # 9. (~250 s, ~15 compiles of ~6 s first: 253 requests come first) Phased launches beside the default in one run (CUDA graph, cold L2, mixed T; each variant's tokens
  #    against the first's; lag: the Layout's lag of every launch, runtime, no compile: a row-0 launch's own lag is
  #    resident / c1 requests, ~198 at 253, where its emit items may re-read row 0 from DRAM): the bench's random drafts, then close inputs (nearly every draft accepted: every row
  #    needed, the worst case). Make it the default (PHASES_FROM, PHASES) only where it wins on random drafts and
  #    loses at most a few us on close ones; then `bench` for the committed files and the README table.
  timeout -k 2 190 python3 tools/sweep_verify.py 253 64 16 1 --rounds 3 \
    --variants "stream,stream:phases=1,stream:phases=1/2,stream:phases=1/2/3/4/5,stream:phases=1+lag=16,stream:phases=1+lag=64,raw,raw:phases=1" \
    2>&1 | tee "$OUT/sweep_phased_random.txt"
  timeout -k 2 95 python3 tools/sweep_verify.py 253 64 16 --rounds 3 --inputs close \
    --variants "stream,stream:phases=1,stream:phases=1/2" 2>&1 | tee "$OUT/sweep_phased_close.txt"
  ;;
trace)
  # 10. (~60-90 s: a traced variant compiles ~6 s per layout) Stop 31: at 16 / 64 requests the one launch runs at ~34% /
  #    ~58% of the read bandwidth (47.7 / 109.8 us, floors 16.0 / 64.1) and phases do not help there. Where does the
  #    time go: the stream items' start ramp, their duration (bandwidth per item), the emit items' wait for their
  #    request's last stream item, or the tail? tools/trace_verify.py prints per stage start / wait / duration / end
  #    and the items running at tenths of the launch (a traced launch, eager, after an L2 flush).
  timeout -k 2 100 python3 tools/trace_verify.py 1 16 64 253 --variants "stream,stream:compact=1,raw" 2>&1 | tee "$OUT/trace_random.txt"
  timeout -k 2 30 python3 tools/trace_verify.py 16 64 --inputs close 2>&1 | tee "$OUT/trace_close.txt"
  ;;
claim)
  # 12. (~300 s) StreamVerifier(claim=G) (stop 32, CPU-tested, opt-in): each request's chunks of t1 / G tiles are claimed
  #    from a counter by ~as many programs as the fixed items had, so a request's programs end within one chunk of each
  #    other instead of 17.6-41.3 us apart (stop 32's H100 trace at 16 requests). First its GPU tests (reference, raw,
  #    graph replay, counters reset; alone and phased), then the sweep (tokens against the default) and the trace (the
  #    stream stage's end spread per request is what should shrink). At 80 registers claim=4 spills 20 bytes (raw 280:
  #    default 0 / 116; tools/compile_verify.py), at 128 none (two programs per SM). If it wins at 16 / 64 requests:
  #    CLAIM (a default by batch, as PHASES_FROM) and `bench` for the committed files and the README table. (claim
  #    turns the stream items' L2 prefetch off: stream:prefetch=0 is the like-for-like baseline.)
  #    The whole test file: the default kernel's stream body moved into _stream_chunk in the same stop (its SASS: see
  #    tools/gpu_plans/README.md, stop 32), so this is also its regression run.
  timeout -k 2 300 python3 -m pytest -m gpu -v -p no:cacheprovider $T 2>&1 | tee "$OUT/tests_claim.txt" \
    | grep -E "FAILED|ERROR|passed|failed" | tail -8
  timeout -k 2 120 python3 tools/sweep_verify.py 1 16 64 253 --rounds 3 \
    --variants "stream,stream:prefetch=0,stream:claim=2,stream:claim=4,stream:claim=8,stream:claim=4+max_registers=128,raw,raw:claim=4" \
    2>&1 | tee "$OUT/sweep_claim.txt"
  timeout -k 2 40 python3 tools/trace_verify.py 16 64 --variants "stream,stream:claim=4" 2>&1 | tee "$OUT/trace_claim.txt"
  ;;
emit_dbuf)
  # 12. (~440 s) Stop 33: the stream loops are double-buffered by default now (dbuf + 128 registers, standard method);
  #    the trace still shows each emit item scanning one 1,024-value tile at a time (~2 us a tile: the load, then the
  #    noise and key arithmetic with nothing in flight). emit_dbuf=1 loads tile t + 1 before tile t's keys (same keys:
  #    tests/verify test_double_buffered_loops_give_the_same_partials, exact noise too). emit_reverse=1 scans each
  #    emit chunk from its end (the most recently streamed lines, likelier still in L2: at 253 requests ncu counted
  #    ~0.13 GB of the emitted rows re-read from DRAM, 13.8% L2 hits; the same result, >= keeps the first maximum).
  #    First the GPU tests of the options (16 and 253 requests, standard and block, eager and graph replays against the
  #    reference), then the times beside the new default (tokens checked by the sweep), then the trace (emit duration
  #    per item is the measure).
  timeout -k 2 240 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "emit_dbuf or emit_reverse" 2>&1 \
    | tee "$OUT/tests_emit_dbuf.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
  timeout -k 2 130 python3 tools/sweep_verify.py 1 16 64 253 --rounds 3 --variants "stream,stream:emit_dbuf=1,\
stream:emit_reverse=1,stream:emit_dbuf=1+emit_reverse=1,raw,raw:emit_dbuf=1+emit_reverse=1,block,block:emit_dbuf=1" \
    2>&1 | tee "$OUT/sweep_emit_dbuf.txt"
  timeout -k 2 60 python3 tools/trace_verify.py 16 64 253 --variants "stream,stream:emit_dbuf=1+emit_reverse=1" 2>&1 \
    | tee "$OUT/trace_emit_dbuf.txt"
  ;;
layout_dbuf)
  # 13. (~140 s) The Layout's t1 / t2 defaults were measured with three 8-warp programs per SM; the double-buffered
  #    default (stop 33) runs two, and at 16 requests its 384 stream items (t1 = 16) need two waves of 264 slots (the
  #    H100 trace: items start up to 23 us in; t1 = 22 or 32, fewer items, were slower there). Smaller chunks (more,
  #    shorter waves) and the emit chunk sizes beside the default; every variant's tokens checked by the sweep.
  #    (Stop 34: at 16 / 32 requests, where the pre-divided default keeps the double buffers; raw too.)
  timeout -k 2 130 python3 tools/sweep_verify.py 16 32 --rounds 3 --variants "stream,stream:t1=8,stream:t1=10,\
stream:t1=12,stream:t1=8+t2=2,stream:t2=8,raw,raw:t1=8,raw:t1=12" 2>&1 | tee "$OUT/sweep_layout_dbuf.txt"
  ;;
ncu_raw)
  # 20. (~110 s) Raw logits at 253 requests cost ~43 us more than pre-divided ones on the H200 (359.1 against 316.5,
  #    stop 34) although only the T = 0.6 third of the mixed-T slots divides: where does it go (issue slots, executed
  #    instructions, stall reasons, DRAM bytes)? The sweep's first launches compile and check; the profiled one is the
  #    4th launch of the verifier kernel (adjust --launch-skip if the sweep's launch order changed).
  for spec in stream raw; do
    timeout -k 2 50 ncu --clock-control none -k regex:_stream_verify_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy \
      --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      python3 tools/sweep_verify.py 253 --rounds 1 --variants $spec > "$OUT/ncu_${spec}_253.txt" 2>&1
    grep -E "Duration|dram__bytes|lts__t|Issue Slots|Executed Instructions |Achieved Occ|Stall|No Instruction" \
      "$OUT/ncu_${spec}_253.txt" | head -30
  done
  ;;
winner)
  # 22. (~230 s) emit_winner=1 (stop 39, after ncu_emit: ~640 of an emit item's ~2,100 instructions per warp were the
  #    exact keys of its 1,024 lane bests): the exact key of the cheap winner only, a near-tie rescanning the chunk.
  #    GPU tests (options at 16 / 253 requests, the near-tie traps with the hardware lg2), then the times beside the
  #    default (and t2 = 2 / 8 with it, its fixed cost being smaller), then its instruction counts at 16 requests.
  timeout -k 2 110 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "emit_winner" 2>&1 \
    | tee "$OUT/tests_winner.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
  timeout -k 2 80 python3 tools/sweep_verify.py 1 16 64 253 --rounds 3 --variants "stream,stream:emit_winner=1,\
stream:emit_winner=1+t2=2,raw,raw:emit_winner=1,block,block:emit_winner=1" 2>&1 | tee "$OUT/sweep_winner.txt"
  timeout -k 2 30 python3 tools/sweep_verify.py 64 --rounds 3 --variants "stream,stream:emit_winner=1+t2=4,\
stream:emit_winner=1+t2=16" 2>&1 | tee "$OUT/sweep_winner_t2.txt"
  timeout -k 2 60 ncu --clock-control none -k regex:_stream_verify_kernel --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -f -o "$OUT/winner16" python3 tools/sweep_verify.py 16 \
    --rounds 1 --variants "stream:emit_winner=1" > "$OUT/ncu_winner.txt" 2>&1
  timeout -k 2 40 ncu --import "$OUT/winner16.ncu-rep" --page source --csv --print-source sass 2>&1 \
    | head -c 3000000 > "$OUT/winner16_source.csv"
  ;;
winner253)
  # 23. (~150 s) winner's sweep ran out of its 80 s before 253 requests: 64 and 253 with and without emit_winner (the
  #    pre-divided launches from 17 requests are the single-buffered loops at 80 registers, where emit_winner spills
  #    2 bytes), and 253 with 8-tile emit items.
  timeout -k 2 130 python3 tools/sweep_verify.py 64 253 --rounds 3 --variants "stream,stream:emit_winner=1,\
stream:emit_winner=1+t2=8,raw,raw:emit_winner=1,block,block:emit_winner=1" 2>&1 | tee "$OUT/sweep_winner253.txt"
  ;;
winner_checks)
  # 24. (~360 s) emit_winner on by default (but pre-divided launches of 17-128 requests): every default-path GPU test of
  #    the verifier (full shapes, fp32 cache, graphs, DSparkStep, the chi-squares, raw = pre-divided, layouts, the
  #    near-tie traps, phased launches), the per-lane exact keys as an option, verify_drafts' own GPU tests, then the
  #    default against emit_winner=0 at 1 / 16 / 64 / 253 requests (pre-divided, raw, block).
  timeout -k 2 200 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "not options or emit_winner" 2>&1 \
    | tee "$OUT/tests_default.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -40
  timeout -k 2 40 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_verify_gpu.py 2>&1 \
    | tee "$OUT/tests_verify_api.txt" | tail -3
  timeout -k 2 110 python3 tools/sweep_verify.py 1 16 64 253 --rounds 3 --variants "stream,stream:emit_winner=0,\
raw,raw:emit_winner=0,block,block:emit_winner=0" 2>&1 | tee "$OUT/sweep_winner_default.txt"
  ;;
winner_trace)
  # 25. (~120 s) Where the 16-request launch's time goes with emit_winner (stop 38's trace, clean: last request ready
  #    at 30.3 us, emit items 9.3 us each, end 42.9 us): traces at 16 / 64 requests, on and off, both flushes.
  for mode in clean dirty; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 55 python3 tools/trace_verify.py 16 64 \
      --variants "stream:emit_winner=1,stream:emit_winner=0" 2>&1 | tee "$OUT/trace_$mode.txt"
  done
  ;;
tail)
  # 26. (~290 s) emit_winner now falls back to every lane's exact key on a cross-lane near-tie (a review: the first
  #    version rescanned ~1,000x more often), and `tail` (opt-in): the last requests' emit items over fewer tiles
  #    (the 16-request trace: the last request ready at 29.6 us, its 4-tile emit items ~8 us each, end 40.0 us).
  timeout -k 2 120 python3 -m pytest -m gpu -q -p no:cacheprovider $T -k "equals_reference or near_ties or \
emit_winner or tail or dspark_step or capture" 2>&1 | tee "$OUT/tests_tail.txt" | tail -4
  timeout -k 2 150 python3 tools/sweep_verify.py 16 64 253 --rounds 3 --variants "stream,stream:emit_winner=0,\
stream:tail=5+tail_t2=2,stream:tail=5+tail_t2=1,stream:tail=16+tail_t2=2,raw,raw:tail=5+tail_t2=2" 2>&1 \
    | tee "$OUT/sweep_tail.txt"
  ;;
ncu_emit)
  # 21. (~150 s) Stop 38's trace at 16 requests (H100, clean flush): the last request ready at 30.3 us, then its emit
  #    items take 9.3 us (median) for four 1,024-value tiles; issuing the four tiles' loads at once was slower, so the
  #    time is not load latency. Per-line stall reasons of the default kernel (stream and emit items together: read
  #    the lines of _emit_scan / _emit_keys / block_argmax / _arrive), as a report and as SASS-with-source CSV.
  timeout -k 2 120 ncu --clock-control none -k regex:_stream_verify_kernel --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SchedulerStats --section Occupancy \
    --import-source yes -f -o "$OUT/verify16" python3 tools/sweep_verify.py 16 --rounds 1 --variants stream \
    > "$OUT/ncu_emit.txt" 2>&1
  tail -5 "$OUT/ncu_emit.txt"
  timeout -k 2 40 ncu --import "$OUT/verify16.ncu-rep" --page source --csv --print-source sass 2>&1 \
    | head -c 3000000 > "$OUT/verify16_source.csv"
  ls -la "$OUT"
  ;;
gather)
  # 19. (~150 s) emit_gather=1 (stop 34, written after the device time ran out): an emit item loads every row's
  #    statistics ([8, KP1] words) with the accepted count and picks row js (one round trip instead of two before its
  #    scan). GPU tests (16 and 253, both methods, raw), then the times beside the default (emit_eager on).
  timeout -k 2 110 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "emit_gather" 2>&1 \
    | tee "$OUT/tests_gather.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -4
  timeout -k 2 60 python3 tools/sweep_verify.py 16 64 253 --rounds 3 --variants "stream,stream:emit_gather=1,raw,\
raw:emit_gather=1,block,block:emit_gather=1" 2>&1 | tee "$OUT/sweep_gather.txt"
  ;;
eager)
  # 18. (~190 s) emit_eager=1 (stop 34): an emit item acquires an already-set ready flag once (the wait's second
  #    acquire only after polling), and the last emit item of a request issues its epilogue loads together (partials,
  #    positive-residual flags, target argmax, drafts: one round trip instead of four): the emit chain of the last
  #    request ready is the 16-request tail. GPU tests (16 and 253, standard and block), then the times.
  timeout -k 2 110 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "emit_eager_0" 2>&1 \
    | tee "$OUT/tests_eager.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -4
  #    (emit_eager is the default since this ran: the variants below now time it against emit_eager=0.)
  timeout -k 2 80 python3 tools/sweep_verify.py 1 16 64 253 --rounds 3 --variants "stream,stream:emit_eager=0,raw,\
raw:emit_eager=0,block,block:emit_eager=0" 2>&1 | tee "$OUT/sweep_eager.txt"
  ;;
t1_large)
  # 17. (~100 s) span=1 at 253 requests (whole rows per item there: t1 = 64) was 8 us faster than the 32-tile items
  #    on the H200 (stop 34); without span that is t1 = 64 (one chunk per row). Under stop 34's defaults (single-
  #    buffered pre-divided loops from 17 requests, emit options on), pre-divided and raw, with the trace at 253.
  timeout -k 2 100 python3 tools/sweep_verify.py 64 128 253 --rounds 3 --variants "stream,stream:t1=64,stream:t1=48,\
stream:t1=64+t2=32,raw,raw:t1=64" 2>&1 | tee "$OUT/sweep_t1_large.txt"
  ;;
stop34)
  # 16. (~450 s) Stop 34's defaults (emit_dbuf + emit_reverse for the standard method; double-buffered stream loops
  #    for raw logits and for pre-divided ones up to 16 requests): the bench cases for the committed files and the
  #    README table, then the GPU tests of the default paths, then the variants that keep the other paths covered.
  timeout -k 2 60 python3 tools/bench_verify_kernels.py "$OUT/bench_default" verify_standard,verify_raw,verify_block,verify_block_raw \
    --rows 1,16,64,253 --temperatures 1,mixed --rounds 3 --replays 10 2>&1 | grep "^|" | tee "$OUT/bench_default.txt"
  timeout -k 2 240 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "not options" 2>&1 \
    | tee "$OUT/tests_defaults.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -40
  timeout -k 2 130 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "emit_off or dbuf_1 or dbuf_0" 2>&1 \
    | tee "$OUT/tests_variants.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
  ;;
defaults)
  # 15. (~120 s) Stop 34's span run on the H200 measured the double-buffered default (stop 33, chosen on an H100) at
  #    45.9 / 111.9 / 338.9 us for 16 / 64 / 253 requests, where stop 31's single-buffered default had 47.7 / 109.8 /
  #    323.1 in its own session: the two (dbuf=0: single-buffered at 80 registers, three programs per SM) side by side,
  #    each with and without the emit scan's options, pre-divided, raw and block; tokens checked against the default.
  timeout -k 2 140 python3 tools/sweep_verify.py 1 16 32 64 128 253 --rounds 3 --variants "stream,stream:dbuf=0,\
stream:emit_dbuf=1+emit_reverse=1,stream:dbuf=0+emit_dbuf=1+emit_reverse=1,stream:dbuf=0+emit_reverse=1,raw,raw:dbuf=0,\
raw:emit_dbuf=1+emit_reverse=1,raw:dbuf=0+emit_dbuf=1+emit_reverse=1,block,block:emit_reverse=1" 2>&1 \
    | tee "$OUT/sweep_defaults.txt"
  ;;
span)
  # 14. (~400 s) Stop 34: span=1 lays a request's rows end to end and cuts them into items that may cross a row's end,
  #    so the stream items fill one wave of resident programs (16 requests: 16 items of 24 tiles on 264 slots instead
  #    of 384 items of 16 tiles in two waves, where the H100 trace showed the second wave ending ~39 us in, the
  #    requests ready at 32 / 39 us median / max). First the GPU tests (16 and 253 requests; NaN partials before each
  #    run so a partial that no item wrote cannot pass), then the times beside the default (tokens checked), then
  #    the trace at 16 (stream ends, ready times) and 64.
  timeout -k 2 200 python3 -m pytest -m gpu -v -p no:cacheprovider $T -k "span" 2>&1 \
    | tee "$OUT/tests_span.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
  timeout -k 2 150 python3 tools/sweep_verify.py 4 16 32 64 253 --rounds 3 --variants "stream,stream:span=1,\
stream:span=1+emit_dbuf=1+emit_reverse=1,stream:emit_dbuf=1+emit_reverse=1,raw,raw:span=1,\
raw:span=1+emit_dbuf=1+emit_reverse=1" 2>&1 | tee "$OUT/sweep_span.txt"
  timeout -k 2 50 python3 tools/trace_verify.py 16 64 --variants "stream,stream:span=1" 2>&1 | tee "$OUT/trace_span.txt"
  ;;
dbuf)
  # 11. (~130 s) Stop 32's trace (H100, 16 requests): the stream items of equal size end between 17.6 and 41.3 us and
  #    the plateau streams at ~84% of the read bandwidth; each fused-loop group of 4 tiles is loaded, then reduced with
  #    no load in flight. dbuf=1 (exact on the CPU, tests/verify layouts test) keeps the next group's loads in flight
  #    during the reduction; it has never run on a GPU. At the default 80 registers it spills 300 bytes (496 raw;
  #    tools/compile_verify.py dbuf=1), at max_registers=128 none (two programs per SM instead of three: the Layout
  #    follows). Tokens checked against the default by the sweep; then the trace, per kind of stream item and per SM
  #    load (where the tail comes from).
  timeout -k 2 100 python3 tools/sweep_verify.py 16 64 253 --rounds 3 \
    --variants "stream,stream:dbuf=1,stream:dbuf=1+max_registers=128,raw,raw:dbuf=1+max_registers=128" \
    2>&1 | tee "$OUT/sweep_dbuf.txt"
  timeout -k 2 40 python3 tools/trace_verify.py 16 64 --variants "stream,stream:dbuf=1+max_registers=128" 2>&1 \
    | tee "$OUT/trace_dbuf.txt"
  ;;
h200)
  # (~60-110 s with compiles) On an H200 only (issue 18's targets are H200 figures; none has run the verifier since
  # stop 34, and stop 39's emit_winner default was measured on H100s only): the bench's cases of the default, standard,
  # raw, block and block raw at 1 / 16 / 64 / 253 requests, T = 1 and mixed (no early-stop patch). Commit as
  # benchmarks/results/NVIDIA-H200_<date>_verify_default_bench.* and update the README's verification table.
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then echo "not an H200: nothing run"; exit 0; fi
  timeout -k 2 110 python3 tools/bench_verify_kernels.py "$OUT/h200_verify_bench" verify_standard,verify_raw,verify_block,verify_block_raw \
    --rows 1,16,64,253 --temperatures 1,mixed --rounds 3 --replays 10 2>&1 | tee "$OUT/h200_verify_bench.txt" | grep "^|"
  ;;
esac
