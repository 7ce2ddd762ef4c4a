#!/usr/bin/env bash
# GPU plan for cuda_wide(tensor_cores=True) (issue 12, large batch: wide_tc.cu, wgmma + TMA; written and first run on an
# H100 in stop 51: exact (19 GPU tests), slower than wide / cuda_gumbel, latency-bound: see benchmarks/NOTES.md; stop 52
# landed the two-row inverse-CDF epilogue and the codes' cp.async gather, measured by the plan's former `ilp` part).
# Run from the repository root on an H100 / H200 (sm_90), one part per job:
#   bash tools/gpu_plans/issue12_wide_tc.sh check  # budget ~60 s: the tensor-core GPU tests and the step-0 cache check
#   bash tools/gpu_plans/issue12_wide_tc.sh time   # budget ~60 s: main's step beside wide / cuda_gumbel at 64 / 253 rows
#   bash tools/gpu_plans/issue12_wide_tc.sh ncu    # budget ~60 s: Nsight Compute of one step at 253 and 64 rows
#   bash tools/gpu_plans/issue12_wide_tc.sh compare # budget ~90 s: this tree's step against the tree at $OLD_SRC, new / old / new
#   bash tools/gpu_plans/issue12_wide_tc.sh wgs3   # budget ~230 s: tc_warpgroups=3 (stop 53): its GPU tests, then timed beside main's step, wide, cuda_gumbel
#   bash tools/gpu_plans/issue12_wide_tc.sh fastdiv # budget ~150 s: tc_fast_div=True (stop 53): its GPU tests, then timed at mixed T with 2 / 3 warpgroups
#   bash tools/gpu_plans/issue12_wide_tc.sh ncu3   # budget ~60 s: Nsight Compute of one tc_warpgroups=3 step at 253 and 64 rows (after wgs3 passes)
#   bash tools/gpu_plans/issue12_wide_tc.sh tc55   # budget ~150 s: stop 55's descriptors, bf16x2 add and W2 L2 prefetch: tensor-core tests, builds timed with and without the prefetch, ncu SASS CSV
#   bash tools/gpu_plans/issue12_wide_tc.sh sanitize3 # budget ~90 s: compute-sanitizer memcheck / racecheck of the tc_warpgroups=3 step at 40 rows
# (compare: OLD_SRC defaults to gpu_jobs/old_src/src, e.g. `git archive 74b1f15 src/dspark_markov | tar -x -C
# gpu_jobs/old_src`, stop 52's base; prebuild its wide_tc.cu cubin here with DSPARK_MARKOV_CACHE=gpu_jobs/cuda_cache and
# PYTHONPATH=gpu_jobs/old_src/src, as for this tree, so that the GPU compiles nothing.)
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
wgs3)
  # tc_warpgroups=3 (stop 53, written without a GPU): the TC_WGS=3 build (three consumer warpgroups, no producer warp,
  # one-copy inverse-CDF loop; 154 registers, no spill). Its tests first (a fault poisons the context: own process),
  # then main's step (two warpgroups), the three-warpgroup step and wide in alternating rounds, T = 1 and mixed T.
  timeout -k 2 130 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_wide_gpu.py -k three_warpgroups \
    -rs 2>&1 | tail -15 | tee "$OUT/wgs3_tests.txt"
  OPTS='{"tc:inverse_cdf": {"tensor_cores": true}, "wg3:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3},
         "tc": {"tensor_cores": true}, "wg3": {"tensor_cores": true, "tc_warpgroups": 3}}'
  timeout -k 2 90 python3 tools/sweep_cuda_wide.py --out "$OUT/wgs3_time" --time 64,253 \
    --designs wide:inverse_cdf,cuda_gumbel --temperature both --options "$OPTS" 2>&1 | grep "time " \
    | tee "$OUT/wgs3_time.txt"
  ;;
tc55)
  # Stop 55: the tc54 run's profile (tc54 ran in stop 55 and is folded in here) put 11.7% of the three-warpgroup step's
  # stall samples (253 rows, two stages) on the full barrier's wait (W2 TMA loads from HBM): tc_prefetch_w2 (default)
  # asks L2 for each tile one ring cycle ahead. Tests (own process), then the builds with and without it (np) beside
  # wide / cuda_gumbel, then the SASS CSV again.
  timeout -k 2 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_wide_gpu.py \
    -k "tensor_core or three_warpgroups or fast_division" -rs 2>&1 | tail -15 | tee "$OUT/tc55_tests.txt"
  OPTS='{"tc:inverse_cdf": {"tensor_cores": true}, "tcnp:inverse_cdf": {"tensor_cores": true, "tc_prefetch_w2": false},
         "wg3:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3},
         "wg3fd:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3, "tc_fast_div": true},
         "wg3fdnp:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3, "tc_fast_div": true, "tc_prefetch_w2": false},
         "tc": {"tensor_cores": true}, "tcnp": {"tensor_cores": true, "tc_prefetch_w2": false}}'
  timeout -k 2 60 python3 tools/sweep_cuda_wide.py --out "$OUT/tc55_time" --time 64,253 \
    --designs wide:inverse_cdf,cuda_gumbel --temperature both --options "$OPTS" 2>&1 | grep "time " \
    | tee "$OUT/tc55_time.txt"
  timeout -k 2 40 ncu --clock-control none --kernel-name regex:dm_wide_tc --launch-skip 1 --launch-count 1 \
    --section WarpStateStats --section SourceCounters -f -o "$OUT/tc55_253" python3 tools/profile_wide_tc.py 253 \
    inverse_cdf 3 > "$OUT/tc55_ncu.txt" 2>&1
  timeout -k 2 30 ncu --import "$OUT/tc55_253.ncu-rep" --page source --csv --print-source sass > "$OUT/tc55_253_sass.csv" 2>&1
  rm -f "$OUT/tc55_253.ncu-rep"
  python3 tools/ncu_sass_sections.py "$OUT/tc55_253_sass.csv" --top 25 2>&1 | head -30
  ;;
fastdiv)
  # tc_fast_div=True (stop 53, written without a GPU): the TC_FASTDIV=1 builds (the branch-free inverse-CDF epilogue for
  # any T). Tests first (own process), then main's step and the fast-division builds at mixed T (T = 1 too: it must
  # not slow the T = 1 path, which takes the other branch-free copy).
  timeout -k 2 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_wide_gpu.py -k fast_division \
    -rs 2>&1 | tail -15 | tee "$OUT/fastdiv_tests.txt"
  OPTS='{"tc:inverse_cdf": {"tensor_cores": true}, "fd:inverse_cdf": {"tensor_cores": true, "tc_fast_div": true},
         "wg3:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3},
         "wg3fd:inverse_cdf": {"tensor_cores": true, "tc_warpgroups": 3, "tc_fast_div": true}}'
  timeout -k 2 60 python3 tools/sweep_cuda_wide.py --out "$OUT/fastdiv_time" --time 64,253 --designs wide:inverse_cdf \
    --temperature both --options "$OPTS" 2>&1 | grep "time " | tee "$OUT/fastdiv_time.txt"
  ;;
ncu3)
  for rows in 253 64; do
    timeout -k 2 28 ncu --clock-control none --kernel-name regex:dm_wide_tc --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section Occupancy --section SourceCounters --import-source yes --print-details all \
      python3 tools/profile_wide_tc.py "$rows" inverse_cdf 3 > "$OUT/ncu3_tc_$rows.txt" 2>&1
    grep -E "Duration|Throughput|Issued Warp|No Eligible|Eligible Warps|Cycles Per Issued" "$OUT/ncu3_tc_$rows.txt"
  done
  ;;
sanitize3)
  # (every kernel of the call: a few small ones beside the step; racecheck sees the generic-proxy shared-memory
  # accesses, not TMA writes against wgmma reads, so for the ring it is the GPU tests that speak)
  for tool in memcheck racecheck; do
    for method in inverse_cdf gumbel; do
      timeout -k 2 40 compute-sanitizer --tool $tool --print-limit 5 \
        python3 tools/profile_wide_tc.py 40 $method 3 2>&1 | tail -3 | sed "s/^/$tool $method: /" | tee -a "$OUT/sanitize3.txt"
    done
  done
  ;;
compare)
  old_src=${OLD_SRC:-$PWD/gpu_jobs/old_src/src}
  [ -d "$old_src/dspark_markov" ] || { echo "no tree at $old_src (see the header)" >&2; exit 1; }
  NEW='{"tc:inverse_cdf": {"tensor_cores": true}, "gen:inverse_cdf": {"tensor_cores": true, "tc_fast": false}, "tc": {"tensor_cores": true}}'
  OLD='{"old:inverse_cdf": {"tensor_cores": true}, "old": {"tensor_cores": true}}'
  for tree in new old new2; do
    if [ "$tree" = old ]; then path=$old_src; opts=$OLD; else path=$PWD/src; opts=$NEW; fi
    PYTHONPATH=$path timeout -k 2 28 python3 tools/sweep_cuda_wide.py --out "$OUT/cmp_$tree" --time 64,253 \
      --designs wide:inverse_cdf --temperature both --options "$opts" 2>&1 | grep "time " | sed "s/^/$tree /" \
      | tee -a "$OUT/tc_compare.txt"
  done
  ;;
*)
  echo "unknown part: $1" >&2
  exit 2
  ;;
esac
