#!/usr/bin/env bash
# GPU plan (stop 38): what the benchmark's "cold L2" charges a kernel. harness.L2Flusher's default (dirty) zeroes
# 256 MB, leaving the L2 full of dirty lines that a timed kernel's misses write back (~50-60 MB it never wrote);
# mode clean (DSPARK_MARKOV_L2_FLUSH=clean) reads the buffer instead. Both, same call, for a plain read, vLLM's
# rejection sampler beside ours, and the verification bench cases; run from the repository root, PYTHONPATH=src,
# .vllm-cache carried (tools/extract_vllm.py):
#   bash tools/gpu_plans/l2_flush.sh verify   # budget ~200 s: read probe; vLLM's rejection_sample beside StreamVerifier (dirty, clean); bench cases (clean)
#   bash tools/gpu_plans/l2_flush.sh filter   # budget ~260 s: vLLM's top-k/top-p filter beside ours (triton, cuda), clean L2, 16 / 64 / 253 requests
#   bash tools/gpu_plans/l2_flush.sh probe    # budget ~60 s: the read probe with plain Triton streaming reads beside torch.amax (the best read of the verify inputs' bytes)
#   bash tools/gpu_plans/l2_flush.sh checks   # budget ~255 s: GPU tests of what stop 38 touched (bench harness, auto's dispatch, CudaVerifier's new schedule), the read probe at the verify inputs' exact bytes, vLLM's filter beside the Triton filter's default layout at 16 requests
#   bash tools/gpu_plans/l2_flush.sh floor    # budget ~150 s: the read probe and vLLM's rejection_sample beside ours in both modes, one machine (the verifier against the fastest plain read of its bytes)
#   bash tools/gpu_plans/l2_flush.sh lag      # budget ~120 s: smaller stream items with a lag that re-reads the emitted row while it is in L2, at 64 / 253 requests (the Triton verifier)
#   bash tools/gpu_plans/l2_flush.sh final    # budget ~170 s: auto's GPU tests after its last change, then the Triton verifier's launch trace at 16 / 64 / 253 requests, dirty and clean flush
#   bash tools/gpu_plans/l2_flush.sh h200s    # budget ~170 s: on an H200 only (else nothing): the read probe, the verify bench (standard, mixed T) in both modes, vLLM's rejection_sample beside ours (clean)
#   bash tools/gpu_plans/l2_flush.sh h200     # budget ~370 s: on an H200 only (else nothing): the read probe, the verify bench cases (T = 1 and mixed) in both modes, vLLM's rejection_sample beside ours in both modes
#   bash tools/gpu_plans/l2_flush.sh l2bw     # budget ~50 s: the L2's own read rate (stop 54): warm reads of 8-48 MB beside both cold modes, torch.amax and Triton streaming reads
# Results go to $JOB_OUT (default ./gpu_plan_out).
set -u
export PYTHONUNBUFFERED=1
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
case "${1:-verify}" in
l2bw)
  # (~30-50 s) What the 1-row chain's later steps can stream from L2 (benchmarks/NOTES.md "Stop 50" assumed ~10 TB/s):
  # 21.8 MB is cuda_chain's L2-resident share of W2 per step at 1 row.
  timeout -k 2 45 python3 tools/flush_probe.py --stream --warm --mb 8,16,21.8,32,48 --rounds 3 --replays 20 2>&1 \
    | tee "$OUT/l2bw.txt" | grep -v Warning
  ;;
verify)
  timeout -k 2 40 python3 tools/flush_probe.py 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  for mode in dirty clean; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 70 python3 tools/time_vllm_ops.py --parts rejection --rows 1,16,64,253 \
      --rounds 3 --replays 20 --out "$OUT/rejection_$mode" 2>&1 | tee "$OUT/rejection_$mode.txt" | grep -v Warning | tail -12
  done
  DSPARK_MARKOV_L2_FLUSH=clean timeout -k 2 70 python3 tools/bench_verify_kernels.py "$OUT/bench_clean" \
    verify_standard,verify_raw --rows 1,16,64,253 --temperatures mixed --rounds 3 --replays 20 2>&1 \
    | grep -E "^\||bandwidth|Error|error" | tee "$OUT/bench_clean.txt"
  ;;
checks)
  timeout -k 2 110 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_bench_gpu.py \
    tests/gpu/test_chain_gpu.py tests/gpu/test_fused_gpu.py tests/gpu/test_cuda_gumbel_gpu.py -k "auto or flush or bench or cli" \
    2>&1 | tee "$OUT/tests.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -8
  DSPARK_MARKOV_UNVERIFIED=cuda_verify timeout -k 2 60 python3 -m pytest -m gpu -q -p no:cacheprovider \
    tests/gpu/test_cuda_verify_gpu.py -k "full_shapes or queue_static" 2>&1 | tee "$OUT/tests_cuda_verify.txt" \
    | grep -E "passed|failed|FAILED|ERROR|Error" | tail -6
  timeout -k 2 45 python3 tools/flush_probe.py --stream --rounds 5 --replays 20 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  DSPARK_MARKOV_L2_FLUSH=clean timeout -k 2 40 python3 tools/time_vllm_ops.py --parts filter --filter-impls vllm,triton \
    --rows 16 --rounds 3 --replays 10 --out "$OUT/filter_b16" 2>&1 | tee "$OUT/filter_b16.txt" | grep -v Warning | tail -14
  ;;
floor)
  timeout -k 2 45 python3 tools/flush_probe.py --stream --rounds 5 --replays 20 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  for mode in dirty clean; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 50 python3 tools/time_vllm_ops.py --parts rejection --rows 16,64,253 \
      --rounds 5 --replays 20 --out "$OUT/rejection_$mode" 2>&1 | tee "$OUT/rejection_$mode.txt" | grep -v Warning | tail -8
  done
  ;;
lag)
  # stop 38: at 253 requests the verifier is ~40 us above a plain read of its bytes, the time the emitted rows' 0.13 GB
  # re-read from DRAM takes; the re-read can hit the L2 only if less than ~L2 of traffic passes between a row's read
  # and its emit (items in flight x item bytes + lag requests x 4.4 MB; default t1 = 32, lag = 33: ~220 MB)
  timeout -k 2 100 python3 tools/sweep_verify.py 253 64 --rounds 3 --variants "stream,stream:t1=16+lag=8,\
stream:t1=16+lag=12,stream:t1=16+lag=16,stream:t1=8+lag=4,stream:t1=8+lag=6,stream:t1=8+lag=10,stream:t1=32+lag=8,\
stream:t1=32+lag=16,stream:t1=32+lag=4" 2>&1 | tee "$OUT/sweep.txt" | grep -v Warning
  ;;
final)
  timeout -k 2 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_chain_gpu.py tests/gpu/test_fused_gpu.py \
    tests/gpu/test_cuda_gumbel_gpu.py -k auto 2>&1 | tee "$OUT/tests.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -6
  for mode in dirty clean; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 40 python3 tools/trace_verify.py 16 64 253 2>&1 | tee "$OUT/trace_$mode.txt" \
      | grep -v Warning | tail -40
  done
  ;;
h200s)
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then echo "not an H200: nothing run"; exit 0; fi
  timeout -k 2 35 python3 tools/flush_probe.py --stream --rounds 3 --replays 20 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  for mode in dirty clean; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 45 python3 tools/bench_verify_kernels.py "$OUT/bench_$mode" \
      verify_standard --rows 1,16,64,253 --temperatures mixed --rounds 3 --replays 20 2>&1 \
      | grep -E "^\||bandwidth|Error|error" | tee "$OUT/bench_$mode.txt"
  done
  DSPARK_MARKOV_L2_FLUSH=clean timeout -k 2 45 python3 tools/time_vllm_ops.py --parts rejection --rows 16,64,253 \
    --rounds 3 --replays 20 --out "$OUT/rejection_clean" 2>&1 | tee "$OUT/rejection_clean.txt" | grep -v Warning | tail -8
  ;;
probe)
  timeout -k 2 55 python3 tools/flush_probe.py --stream --rounds 5 --replays 20 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  ;;
h200)
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then echo "not an H200: nothing run"; exit 0; fi
  timeout -k 2 40 python3 tools/flush_probe.py --stream --rounds 3 --replays 20 2>&1 | tee "$OUT/probe.txt" | grep -v Warning
  for mode in dirty clean; do
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 90 python3 tools/bench_verify_kernels.py "$OUT/bench_$mode" \
      verify_standard,verify_raw --rows 1,16,64,253 --temperatures 1,mixed --rounds 5 --replays 20 2>&1 \
      | grep -E "^\||bandwidth|Error|error" | tee "$OUT/bench_$mode.txt"
    DSPARK_MARKOV_L2_FLUSH=$mode timeout -k 2 70 python3 tools/time_vllm_ops.py --parts rejection --rows 1,16,64,253 \
      --rounds 3 --replays 20 --out "$OUT/rejection_$mode" 2>&1 | tee "$OUT/rejection_$mode.txt" | grep -v Warning | tail -12
  done
  ;;
filter)
  for rows in 16 64 253; do
    DSPARK_MARKOV_L2_FLUSH=clean DSPARK_MARKOV_UNVERIFIED=cuda_filter timeout -k 2 80 python3 tools/time_vllm_ops.py \
      --parts filter --filter-impls vllm,triton,cuda --rows $rows --rounds 3 --replays 10 --out "$OUT/filter_b$rows" \
      2>&1 | tee "$OUT/filter_b$rows.txt" | grep -v Warning | tail -20
  done
  ;;
esac
