#!/usr/bin/env bash
# GPU plan for impl="cuda_wide" (issue 12, large-batch Gumbel; written 2026-12-04 without device time; its parts ran on
# the H200 / H100 on 2026-12-05: exact, slower than cuda_gumbel / wide, opt-in). Run from the repository root on an H200 (sm_90), PYTHONPATH=$PWD/src, one part per job:
#   bash tools/gpu_plans/issue12_cuda_wide.sh check   # budget ~110 s: is it correct? (run this first)
#   bash tools/gpu_plans/issue12_cuda_wide.sh time    # budget ~110 s: how fast, and where does the time go?
#   bash tools/gpu_plans/issue12_cuda_wide.sh bench   # budget ~150 s: the committed benchmark with vLLM's loop
#   bash tools/gpu_plans/issue12_cuda_wide.sh icdf       # budget ~110 s: method="inverse_cdf" correct? (after check)
#   bash tools/gpu_plans/issue12_cuda_wide.sh icdf_time  # budget ~110 s: method="inverse_cdf" timed and profiled
#   bash tools/gpu_plans/issue12_cuda_wide.sh chain_trace  # budget ~60 s: where cuda_chain's 83 / 142 us go (1 / 16 rows)
#   bash tools/gpu_plans/issue12_cuda_wide.sh fault        # budget ~120 s: the 64-row illegal address of 2026-12-05 (explained: freed buffers) re-run under memcheck
# Results go to $JOB_OUT (default ./gpu_plan_out). The design runs only when opted in (draft/cuda_wide.py).
# Builds: wide.cu takes ~7 s of NVRTC, blocks.cu (the noise table's sweep kernel) ~30 s, the table sweep ~10-20 s;
# a DSPARK_MARKOV_CACHE built on the CPU with the GPU's NVRTC version (CONTRIBUTING "CUDA kernels") and the table
# file of an earlier GPU job (its content depends only on noise.cuh) skip all three.
set -u
export DSPARK_MARKOV_UNVERIFIED=cuda_wide PYTHONUNBUFFERED=1
export DSPARK_MARKOV_CACHE=${DSPARK_MARKOV_CACHE:-$PWD/gpu_jobs/cuda_cache}
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT" "$DSPARK_MARKOV_CACHE"
VLLM=${VLLM_CACHE:-.vllm-cache}
case "${1:-check}" in
check)
  # 1. (~40 s) Exactness at full shapes (V = 129,280, N = 5; mixed T 0 / 0.6 / 1 with padding rows and samples):
  #    every token == draw_gumbel(its own cache), the cache == round(U + bias) within the one-ulp bias bracket, at
  #    64 / 253 rows bf16, 64 rows fp32 and bf16 -> fp32 cache; at 253 rows also the 16-warp variant (p2) and every
  #    token exact (filter_margin 1e30: if only the default fails, the bound / seed / threshold logic is wrong; if
  #    both fail, the bias, z, the cache or the word merge). Prints how many tokens equal cuda_gumbel's (most; not all:
  #    the bias is summed in another order than cuBLAS's).
  timeout -k 2 45 python3 tools/sweep_cuda_wide.py --out "$OUT/check" --check 64,253 --time "" \
    --check-options '{"p2": {"warps_per_group": 2}, "exact": {"filter_margin": 1e30}, "noprefetch": {"flags": 0}}'
  # 2. (~35 s) The GPU tests: rows 1-253, both dtypes, strided + scale, V % 4 != 0 (scalar path), NaN / -inf rows,
  #    options drawing the same, CUDA-graph replay equal to eager.
  timeout -k 2 40 python3 -m pytest -q -m gpu tests/gpu/test_cuda_wide_gpu.py -x --durations=5 2>&1 | tail -15
  # 3. (~30 s) compute-sanitizer memcheck and racecheck side by side (V = 4096, 2 rows: cp.async stages, named
  #    barriers, the atomicMax words).
  for tool in memcheck racecheck; do
    timeout -k 2 30 compute-sanitizer --tool $tool --print-limit 30 python3 tools/sanitize.py \
      --one-call cuda_wide/gumbel > "$OUT/sanitize_$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck; do echo "== $tool"; tail -4 "$OUT/sanitize_$tool.log"; done
  ;;
time)
  # 4. (~35 s) One call as a CUDA-graph replay, cold L2, beside cuda_gumbel: 32 / 64 / 128 / 253 rows, T = 1 and
  #    mixed; the 16-warp variant and the L2 prefetch off (flags 0) at the same shapes.
  timeout -k 2 45 python3 tools/sweep_cuda_wide.py --out "$OUT/time" --check "" --time 32,64,128,253 \
    --temperature both --designs cuda_gumbel,cuda_wide --options '{"p2": {"warps_per_group": 2}, "noprefetch": {"flags": 0}}'
  # 5. (~50 s) Nsight Compute of one step (N = 1: the start, one dm_wide_b0_c0_v1_s0, one finish) at 253 and 64 rows.
  #    Expected from the SASS (445 instructions per 16 x 16 m-tile, ~56 per logit + per-row work): issue-bound near
  #    ~60 us per step at 253 rows at perfect issue (memory floor ~45 us, tensor pipe ~31 us), W2-read-bound near
  #    ~25 us per step at 64 rows. Look at issue-slot use, warp stalls, DRAM throughput, achieved occupancy (8 warps).
  for rows in 253 64; do
    timeout -k 2 25 ncu --clock-control none --nvtx --nvtx-include "prof_cuda_wide_gumbel/" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum \
      python3 tools/profile_large.py --rows $rows --designs cuda_wide --steps 1 > "$OUT/ncu_$rows.txt" 2>&1
    grep -E "dm_wide|Duration|inst_executed|dram__bytes|Registers Per|Achieved Occ|Compute \(SM\) Th|DRAM Th|Issue Slots|No Eligible" \
      "$OUT/ncu_$rows.txt" | head -40
  done
  ;;
bench)
  # 6. (~120 s) The benchmark for README and auto (the lead regenerates auto from it once the check part passed):
  #    vLLM's real loop, cuda_gumbel and cuda_wide at 32 / 64 / 128 / 253 rows, T = 1 and mixed (bf16), then fp32
  #    cache + logits at 64 / 253.
  timeout -k 2 75 python3 -m dspark_markov.cli bench --designs vllm_loop,cuda_gumbel,cuda_wide --rows 32,64,128,253 \
    --temperature both --vllm-cache "$VLLM" --out "$OUT/bench" --no-plot --no-progress 2>&1 | tail -20
  timeout -k 2 40 python3 -m dspark_markov.cli bench --designs vllm_loop,cuda_gumbel,cuda_wide --rows 64,253 \
    --temperature 1 --cache-dtype float32 --logits-dtype float32 --vllm-cache "$VLLM" --out "$OUT/bench" --no-plot \
    --no-progress 2>&1 | tail -8
  # 7. (~30 s) cuda_gumbel / cuda_chain after blocks.cu / chain.cu moved helpers into common.cuh (their SASS is
  #    instruction for instruction unchanged under NVRTC 13.0, checked on the CPU; this confirms it on the device).
  timeout -k 2 35 python3 -m pytest -q -m gpu tests/gpu/test_cuda_gumbel_gpu.py -x -k "full_shape or graph" 2>&1 | tail -4
  ;;
icdf)
  # 8. (~60 s) method="inverse_cdf" (icdf5, 2026-12-04; passed on an H100 2026-12-05): the GPU tests at V = 129,280 (check_icdf: cache in the
  #    bias bracket, greedy / NaN / +inf / all -inf rows argmax_first of the own cache bit for bit, T > 0 tokens the
  #    inverse CDF of u within the fp32 sums; rows 1-253 both dtypes, all T = 1 / all greedy, strided + scale,
  #    V % 4 != 0, graph replay == eager). If the special-rows test alone fails: dw_pick's NaN / +inf / -inf branches;
  #    if every T > 0 row fails: the partial layout part[row][block] or icdf_gpb / icdf_blocks; if only greedy rows
  #    fail: the word path's ICDF gating (need0/need1, wread).
  timeout -k 2 70 python3 -m pytest -q -m gpu tests/gpu/test_cuda_wide_gpu.py -x -k inverse_cdf --durations=4 2>&1 \
    | tail -15
  # 9. (~25 s) memcheck and racecheck of one small inverse-CDF call (the per-(warp, row) partials in shared memory,
  #    the __syncthreads before the block merge, dm_wide_pick's reads of the cache and the partials).
  for tool in memcheck racecheck; do
    timeout -k 2 30 compute-sanitizer --tool $tool --print-limit 30 python3 tools/sanitize.py \
      --one-call cuda_wide/inverse_cdf > "$OUT/sanitize_icdf_$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck; do echo "== $tool"; tail -4 "$OUT/sanitize_icdf_$tool.log"; done
  ;;
icdf_time)
  # 10. (~60 s) Timing beside the Triton design that holds the inverse-CDF record (wide 543.8 / 229.4 us at 253 / 64
  #     rows) and vLLM's loop: T = 1 and mixed, bf16. Predicted from the SASS (~347 SASS instructions per 16 x 16
  #     m-tile on the T = 1 path, ~42 per logit; dm_wide_pick ~3-4 us per step): 253 rows ~45-65 us per step (memory
  #     floor 45, issue 42, tensor pipe 32) + pick -> ~260-360 us per call (target 270); 64 rows ~25-30 us per step
  #     (W2's 66 MB ~15 us + 33 MB of logits) + pick -> ~150-180 us (target 150). Mixed T: z / T by the row's 1 / T
  #     and two Markstein FMAs (~408 instead of ~347 per m-tile: issue ~+18% at 253 rows, ~0 at 64 rows).
  timeout -k 2 70 python3 -m dspark_markov.cli bench --designs vllm_loop,wide,cuda_wide --method inverse_cdf \
    --rows 64,253 --temperature both --vllm-cache "$VLLM" --out "$OUT/bench_icdf" --no-plot --no-progress 2>&1 | tail -12
  # 11. (~35 s) Nsight Compute of one step (N = 1) at 253 and 64 rows: dm_wide_b0_c0_v1_s0_icdf and dm_wide_pick.
  #     Look at DRAM throughput and issue-slot use of the step, and the pick's duration (latency-bound: one warp per
  #     row, four dependent loads: keys, partials, ~1,000 cached tokens, the W1 row).
  for rows in 253 64; do
    timeout -k 2 17 ncu --clock-control none --nvtx --nvtx-include "prof_cuda_wide_inverse_cdf/" \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum \
      python3 tools/profile_large.py --rows $rows --designs cuda_wide:inverse_cdf --steps 1 > "$OUT/ncu_icdf_$rows.txt" 2>&1
    grep -E "dm_wide|Duration|inst_executed|dram__bytes|Achieved Occ|Compute \(SM\) Th|DRAM Th|Issue Slots" \
      "$OUT/ncu_icdf_$rows.txt" | head -30
  done
  ;;
fault)
  # (~120 s) Explained on the CPU (stop 27, helper-18): the sweep kept only the graphs, so replays ran into freed
  # samplers' buffers; harness.capture_graph now keeps the callable alive. This part confirms it: no fault expected.
  # Stop 26's timing sweep hit an illegal memory access right after the 32-row timings (64 rows next;
  # ..._2026-12-05_cuda_wide_time.txt), not reproduced by the bench or the GPU tests: the same sweep under
  # compute-sanitizer memcheck (first error with its kernel and address), 32 / 64 rows, T = 1 then mixed.
  timeout -k 2 115 compute-sanitizer --tool memcheck --print-limit 10 python3 tools/sweep_cuda_wide.py --out "$OUT/fault" \
    --check "" --time 32,64 --temperature both --designs cuda_gumbel,cuda_wide \
    --options '{"p2": {"warps_per_group": 2}, "noprefetch": {"flags": 0}}' > "$OUT/fault.txt" 2>&1
  grep -m 12 -E "Invalid|ERROR SUMMARY|at 0x|by thread|time cuda" "$OUT/fault.txt"
  ;;
chain_trace)
  # Small batch (issue 12's 1 / 16 rows: cuda_chain 83 / 142 us against 40 / 60; not worked on since stop 23): the
  # kernel's own phase timestamps per step (compute, barrier wait, token phase; first and last block), the default
  # variants and flags, T = 1. Read before changing chain.cu: which phase a 40 us call must shrink.
  timeout -k 2 55 python3 tools/trace_cuda_chain.py --rows 1,16 --flags 15 2>&1 | tee "$OUT/chain_trace.txt" | tail -40
  ;;
esac
