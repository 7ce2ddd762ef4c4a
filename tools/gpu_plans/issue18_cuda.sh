#!/usr/bin/env bash
# GPU plan for issue 18: the persistent-warp CUDA C++ verifier (verify/cuda_verify.py, cuda/verify.cu; stop 35,
# written without device time). Run from the repository root on an H200 (sm_90), PYTHONPATH=$PWD/src, one part per job:
#   bash tools/gpu_plans/issue18_cuda.sh check     # budget ~200 s: its GPU tests (first run), then a bench beside the Triton verifier
#   bash tools/gpu_plans/issue18_cuda.sh quick     # budget ~230 s: the GPU tests, the bench (mixed T) beside the Triton verifier, ncu at 253
#   bash tools/gpu_plans/issue18_cuda.sh sweep     # budget ~180 s: schedules (lag, emit piece, stream piece) beside the Triton verifier; a traced launch per batch
#   bash tools/gpu_plans/issue18_cuda.sh mini      # budget ~80 s: a traced launch per batch, then three schedules beside the Triton verifier
#   bash tools/gpu_plans/issue18_cuda.sh first     # budget ~190 s: mini, then the GPU tests of reference / Triton equality, impl="cuda", graphs, NaN rows
#   bash tools/gpu_plans/issue18_cuda.sh queue     # budget ~190 s: the ready-list schedule (stop 37): its GPU tests, a traced launch per batch, schedules beside the Triton verifier
#   bash tools/gpu_plans/issue18_cuda.sh qshort    # budget ~100 s: the ready list with static tickets (the default): its tests at full shapes and DSparkStep(verify_impl="cuda"), then three emit sizes beside the Triton verifier
#   bash tools/gpu_plans/issue18_cuda.sh bench     # budget ~150 s: the bench cases (standard, raw; T = 1 and mixed) beside the Triton verifier
#   bash tools/gpu_plans/issue18_cuda.sh ncu       # budget ~170 s: Nsight Compute of the CUDA verifier at 16 and 253 requests
#   bash tools/gpu_plans/issue18_cuda.sh sanitize  # budget ~150 s: compute-sanitizer memcheck / racecheck of the CUDA verifier's tests at 16 requests
#   bash tools/gpu_plans/issue18_cuda.sh mult      # budget ~110 s: stream tickets per warp in whole rounds (piece_mult by batch, static ready list) beside the Triton verifier, a trace at 16 requests; the DSparkStep test
# Results go to $JOB_OUT (default ./gpu_plan_out).
set -u
export PYTHONUNBUFFERED=1 DSPARK_MARKOV_UNVERIFIED=cuda_verify
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
T=tests/gpu/test_cuda_verify_gpu.py
case "${1:-check}" in
check)
  # 1. (~15 s) one batch first: a hang or a wrong token shows here before the long tests
  timeout -k 2 60 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T -k "full_shapes and 16" 2>&1 \
    | tee "$OUT/tests_smoke.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tail -12
  # 2. (~90 s) the whole file
  timeout -k 2 120 python3 -m pytest -m gpu -v -p no:cacheprovider $T 2>&1 | tee "$OUT/tests.txt" \
    | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -20
  # 3. (~60 s) the bench cases beside the Triton verifier (mixed T)
  timeout -k 2 70 python3 tools/bench_verify_kernels.py "$OUT/bench" verify_standard,verify_raw --impls triton,cuda \
    --rows 1,16,64,253 --temperatures mixed --rounds 3 --replays 10 2>&1 | grep -E "^\||bandwidth|Error|error" \
    | tee "$OUT/bench.txt"
  ;;
quick)
  timeout -k 2 90 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T 2>&1 | tee "$OUT/tests.txt" \
    | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -20
  timeout -k 2 70 python3 tools/bench_verify_kernels.py "$OUT/bench" verify_standard,verify_raw --impls triton,cuda \
    --rows 1,16,64,253 --temperatures mixed --rounds 3 --replays 10 2>&1 | grep -E "^\||bandwidth|Error|error" \
    | tee "$OUT/bench.txt"
  timeout -k 2 60 ncu --kernel-name regex:dm_verify --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section SourceCounters python3 tools/time_cuda_verify.py 253 5 > "$OUT/ncu_253.txt" 2>&1
  grep -E "Duration|DRAM Throughput|L2 Hit|Achieved Occupancy|Issue Slots|Stall" "$OUT/ncu_253.txt" | head -30
  ;;
sweep)
  timeout -k 2 30 python3 -m pytest -m gpu -x -p no:cacheprovider $T -k "schedules or full_shapes" 2>&1 | tail -3
  timeout -k 2 80 python3 tools/sweep_cuda_verify.py --rows 1,16,64,253 --variants -:-:-,-:-:4,32:-:4,-:-:-:s,-:-:-:s:r,-:-:2:s:r,-:-:4:s:r \
    --rounds 3 --replays 10 2>&1 | tee "$OUT/sweep.txt" | grep -v Warning
  timeout -k 2 40 python3 tools/trace_cuda_verify.py --rows 1,16,64,253 2>&1 | tee "$OUT/trace.txt" | grep -v Warning
  ;;
mini)
  timeout -k 2 30 python3 tools/trace_cuda_verify.py --rows 1,16,253 2>&1 | tee "$OUT/trace.txt" | grep -v Warning
  timeout -k 2 45 python3 tools/sweep_cuda_verify.py --rows 16,253 --variants -:-:-,-:-:-:s,-:-:-:s:r,-:-:2:s:r,-:-:4:s:r --rounds 3 \
    --replays 10 2>&1 | tee "$OUT/sweep.txt" | grep -v Warning
  ;;
first)
  bash "$0" mini
  timeout -k 2 100 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T -k "full_shapes or impl_cuda or graph or nan" \
    2>&1 | tee "$OUT/tests.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tail -25
  ;;
queue)
  timeout -k 2 60 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T -k "full_shapes or schedules or graph or nan" \
    2>&1 | tee "$OUT/tests.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tail -30
  timeout -k 2 30 python3 tools/trace_cuda_verify.py --rows 16,253 --variant -:-:-:s 2>&1 | tee "$OUT/trace.txt" | grep -v Warning
  timeout -k 2 90 python3 tools/sweep_cuda_verify.py --rows 1,16,64,253 --variants -:-:-,-:-:-:l,-:-:-:s,-:1:-:s,-:2:-:s,-:8:-:s,-:-:2:s,-:-:-:s:r \
    --rounds 3 --replays 10 2>&1 | tee "$OUT/sweep.txt" | grep -v Warning
  ;;
qshort)
  timeout -k 2 60 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T -k "full_shapes or queue_static or dsparkstep" 2>&1 \
    | tee "$OUT/tests.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tail -12
  timeout -k 2 40 python3 tools/sweep_cuda_verify.py --rows 1,16,64,253 --variants -:-:-:s,-:1:-:s,-:2:-:s \
    --rounds 3 --replays 10 2>&1 | tee "$OUT/sweep.txt" | grep -v Warning
  ;;
mult)
  # stop 38: at 16 requests the default's 4,352 tickets are 2.06 per warp (2,112 warps on 132 SMs), so the last
  # request's pieces wait for a third round; larger pieces give whole rounds (m = 2: 1.03, 3: 0.73, 4: 0.52 per warp)
  timeout -k 2 40 python3 -m pytest -m gpu -x -v -p no:cacheprovider $T -k "dsparkstep" 2>&1 \
    | tee "$OUT/tests.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tail -6
  for spec in "1 -:-:1:s,-:-:2:s,-:-:4:s" "16 -:-:2:s,-:-:3:s,-:-:4:s,-:8:3:s,-:2:3:s" \
              "64 -:-:6:s,-:-:8:s,-:-:11:s,-:-:16:s" "253 -:-:2:s,-:-:4:s,-:-:8:s,-:-:16:s"; do
    set -- $spec
    timeout -k 2 30 python3 tools/sweep_cuda_verify.py --rows $1 --variants $2 --rounds 3 --replays 10 2>&1 \
      | tee -a "$OUT/sweep.txt" | grep -v Warning
  done
  timeout -k 2 20 python3 tools/trace_cuda_verify.py --rows 16 --variant -:-:3:s 2>&1 | tee "$OUT/trace.txt" \
    | grep -v Warning
  ;;
bench)
  timeout -k 2 140 python3 tools/bench_verify_kernels.py "$OUT/bench" verify_standard,verify_raw --impls triton,cuda \
    --rows 1,16,64,253 --temperatures 1,mixed --rounds 5 --replays 20 2>&1 | grep -E "^\||bandwidth|Error|error" \
    | tee "$OUT/bench.txt"
  ;;
ncu)
  for rows in 16 253; do
    timeout -k 2 80 ncu --kernel-name regex:dm_verify --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters \
      python3 tools/time_cuda_verify.py $rows 5 > "$OUT/ncu_$rows.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers|Issue Slots|Stall" "$OUT/ncu_$rows.txt" | head -30
  done
  ;;
sanitize)
  for tool in memcheck racecheck; do
    timeout -k 2 70 compute-sanitizer --tool $tool python3 tools/time_cuda_verify.py 16 2 > "$OUT/sanitize_$tool.txt" 2>&1
    tail -3 "$OUT/sanitize_$tool.txt"
  done
  ;;
esac
