#!/usr/bin/env bash
# GPU plan for cuda_wide(tensor_cores=True) (issue 12, large batch: wide_tc.cu, wgmma + TMA; written and first run on an
# H100 in stop 51: exact (19 GPU tests), slower than wide / cuda_gumbel, latency-bound: see benchmarks/NOTES.md).
# Run from the repository root on an H100 / H200 (sm_90), one part per job:
#   bash tools/gpu_plans/issue12_wide_tc.sh check  # budget ~60 s: the tensor-core GPU tests and the step-0 cache check
#   bash tools/gpu_plans/issue12_wide_tc.sh ilp    # budget ~120 s: the two-row epilogue patch: tests, then timed beside main's
#   bash tools/gpu_plans/issue12_wide_tc.sh time   # budget ~60 s: main's step beside wide / cuda_gumbel at 64 / 253 rows
#   bash tools/gpu_plans/issue12_wide_tc.sh ncu    # budget ~60 s: Nsight Compute of one step at 253 and 64 rows
# Results go to $JOB_OUT (default ./gpu_plan_out). prepare.sh's cuda_cache holds main's wide_tc.cu cubin (sm_90a).
set -u
export DSPARK_MARKOV_UNVERIFIED=cuda_wide PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD/src}
export DSPARK_MARKOV_CACHE=${DSPARK_MARKOV_CACHE:-$PWD/gpu_jobs/cuda_cache}
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT" "$DSPARK_MARKOV_CACHE"
OPTIONS='{"tc:inverse_cdf": {"tensor_cores": true}, "tc": {"tensor_cores": true}}'
case "${1:-check}" in
check)
  timeout -k 2 40 python3 tools/check_wide_tc.py 2>&1 | tee "$OUT/tc_check.txt"
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_wide_gpu.py -k tensor_core -rs \
    2>&1 | tail -15 | tee "$OUT/tc_tests.txt"
  ;;
ilp)
  # tools/gpu_plans/issue12_wide_tc_ilp.patch (written after stop 51's profile: the inverse-CDF epilogue with the two
  # rows of a thread side by side in every phase, tree reductions, one vote per item; the codes gathered by cp.async
  # with every chunk in flight instead of a dependent token load and chunk load per chunk (up to 32 per thread and
  # step: possibly tens of us per step); Gumbel keeps its row-by-row epilogue and gather, whose changed versions
  # spilled; the item coordinates shared by the base loads and the epilogue): main's
  # step timed first, then the patch applied to this copy of the tree, its tests (both methods), and the same timing.
  # Land it when its tests pass and it is faster (CPU: it compiles with no spill and no wgmma serialisation).
  timeout -k 2 50 python3 tools/sweep_cuda_wide.py --out "$OUT/main_time" --time 64,253 --designs wide:inverse_cdf \
    --temperature 1 --options "$OPTIONS" 2>&1 | grep "time " | tee "$OUT/main_time.txt"
  git apply tools/gpu_plans/issue12_wide_tc_ilp.patch || { echo "the ilp patch does not apply" >&2; exit 1; }
  trap 'git apply -R tools/gpu_plans/issue12_wide_tc_ilp.patch' EXIT  # (a later part on this copy runs main's step)
  echo "ilp patch applied"
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_wide_gpu.py -k tensor_core -rs \
    2>&1 | tail -15 | tee "$OUT/ilp_tests.txt"
  timeout -k 2 50 python3 tools/sweep_cuda_wide.py --out "$OUT/ilp_time" --time 64,253 --designs wide:inverse_cdf \
    --temperature 1 --options "$OPTIONS" 2>&1 | grep "time " | tee "$OUT/ilp_time.txt"
  ;;
time)
  timeout -k 2 55 python3 tools/sweep_cuda_wide.py --out "$OUT/tc_time" --time 64,253 \
    --designs wide:inverse_cdf,cuda_gumbel --temperature both --options "$OPTIONS" 2>&1 | grep "time " | tee "$OUT/tc_time.txt"
  ;;
ncu)
  for rows in 253 64; do
    timeout -k 2 28 ncu --clock-control none --kernel-name regex:dm_wide_tc --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section Occupancy --section SourceCounters --import-source yes --print-details all \
      python3 tools/profile_wide_tc.py "$rows" > "$OUT/ncu_tc_$rows.txt" 2>&1
    grep -E "Duration|Throughput|Issued Warp|No Eligible|Eligible Warps|Cycles Per Issued" "$OUT/ncu_tc_$rows.txt"
  done
  ;;
*)
  echo "unknown part: $1" >&2
  exit 2
  ;;
esac
