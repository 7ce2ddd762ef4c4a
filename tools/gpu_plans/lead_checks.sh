#!/usr/bin/env bash
# GPU checks the lead could not run on 2026-12-04 (the device was withdrawn at 21:42 UTC). From the repository root
# on an H200, PYTHONPATH=$PWD/src, with vLLM's gumbel_sample extracted (`python tools/extract_vllm.py`):
#   bash tools/gpu_plans/lead_checks.sh capture   # budget ~170 s (two fresh processes, each compiling ~30-50 s)
#   bash tools/gpu_plans/lead_checks.sh regress45 # budget ~200 s: any GPU: the GPU tests nearest stop 45's API changes (never run on a GPU)
#   bash tools/gpu_plans/lead_checks.sh edges48   # budget ~60 s: any GPU: stop 48's inverse-CDF rows below -3e38 (wide's shift start), every design
#   bash tools/gpu_plans/lead_checks.sh wide49    # budget ~240 s: any GPU: stop 49's fix of wide's inverse-CDF weights (edges48's failure), its GPU tests, timing beside the tree before
#   bash tools/gpu_plans/lead_checks.sh filter48  # budget ~100 s: the persistent filters' argument checks (stop 48): the cuda filter's GPU tests at the default flags
#   bash tools/gpu_plans/lead_checks.sh edges46   # budget ~280 s: any GPU: stop 46's edge-case fixes (subnormal T, d2t -inf rows) at full shapes, every design
#   bash tools/gpu_plans/lead_checks.sh edges47   # budget ~290 s: any GPU: stop 47's fixes (cuda_chain / cuda_gumbel subnormal T, block-input clamp) and the cluster filter's extreme rows
# The vLLM-hook timing failed twice in a CUDA-graph capture (..._2026-12-04_vllm_hook_u5_failure.txt,
# ..._vllm_hook_u0_capture_failure.txt): earlier graphs, held in reference cycles, were destroyed by Python's garbage
# collector inside a later capture. Fixed in bench.harness.capture_graph (gc collected before, off during a capture)
# and in the tool (plain objects). This runs the failing scenario again: an empty NVRTC cache (compile and noise-
# table sweep inside the process), every batch size captured in one process, twice. Expect 10 records per run, every
# token equal to vLLM's loop, and no "function reset" warning.
set -u
export PYTHONUNBUFFERED=1
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
case "${1:-capture}" in
capture)
  for i in 1 2; do
    export DSPARK_MARKOV_CACHE=$(mktemp -d)
    timeout -k 2 80 python3 tools/vllm_hook_timing.py --out "$OUT/hook$i" --rows 1,16,64,128,253 --rounds 1 --replays 5 \
      > "$OUT/hook$i.txt" 2>&1; echo "hook$i rc=$?"
    grep -c '^{"rows"' "$OUT/hook$i.txt"; grep -i "error\|fail\|Traceback\|function reset" "$OUT/hook$i.txt" | head -5
  done
  ;;
edges48)
  # (~30-60 s) Stop 48 started wide's running inverse-CDF shift at -FLT_MAX instead of -3e38 (a row whose every z / T
  # lay below -3e38 drew token 0); the GPU test of those rows at full shapes, every drafting design that runs here
  timeout -k 2 55 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_extreme_values_gpu.py -k below 2>&1 \
    | tee "$OUT/edges48.txt" | tail -3
  ;;
wide49)
  # (~150-240 s) edges48 failed on an H100 (stop 49): wide's inverse CDF on the GPU (NATIVE_ROUND) weighted a token by
  # 2^(z log2(e) - shift log2(e)) with one FMA, where shift log2(e) overflowed for |z / T| > 2.36e38 (rows 0 / 1 drew
  # the last token, row 2 a -inf one) and, below that, carried its rounding error into every tile's mass (~1% at
  # |z / T| ~ 1e5). Now 2^((z - shift) log2(e)), the difference rounded first as the reference's. The failing test,
  # wide's GPU files, then wide's inverse CDF timed beside the tree before (gpu_jobs/prev_src: `git archive HEAD
  # src/dspark_markov | tar -x -C gpu_jobs/prev_src --strip-components=1` before the edit), two alternating rounds,
  # bf16 cache, T = 1 and mixed, at 64 / 128 / 253 rows (where auto picks wide).
  timeout -k 2 55 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_extreme_values_gpu.py -k below 2>&1 \
    | tee "$OUT/edges48.txt" | tail -3
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_wide_gpu.py \
    tests/gpu/test_triton_inverse_cdf_gpu.py 2>&1 | tee "$OUT/wide_tests.txt" | tail -3
  for round in 1 2; do
    for tree in prev new; do
      src=$PWD/src
      if [ $tree = prev ]; then src=$PWD/gpu_jobs/prev_src; fi
      PYTHONPATH=$src timeout -k 2 60 python3 -c 'from dspark_markov.cli import main; main()' bench --designs wide \
        --method inverse_cdf --rows 64,128,253 --temperature both --rounds 3 --replays 20 --no-plot --no-progress \
        --out "$OUT/$tree$round" 2>&1 | grep -E "wide|Error" | sed "s/^/$tree$round /" | tee -a "$OUT/wide49_bench.txt"
    done
  done
  ;;
filter48)
  # (~50-100 s) Stop 48 made CudaTopKTopPFilter.filter / TopKTopPFilter.filter check their arguments
  # (verify/filter_checks.py) and top_k_top_p call the unchecked _run: the cuda filter's GPU tests that call filter()
  # directly at the default flags (every kind and case at 6 / 96 / 1,518 rows), and those of the public function's
  # routing, scalar and int32 arguments, raw logits and DSparkStep. Ran (H100, stop 48): 22 passed.
  timeout -k 2 95 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "246335 or scalar_and or raw_logits or dspark_step or auto_routes" 2>&1 | tee "$OUT/filter48.txt" | tail -3
  ;;
regress45)
  # (~100-200 s with compiles) Stop 45 changed the API's edges without a GPU: the reference's clamped anchors and
  # out-of-range slots as padding (draft/reference.py), DSparkStep's graph-safe slot clamp for per-row temperatures
  # (step.py), top_k_top_p's argument checks and the out/logits overlap check (verify/filtering.py,
  # cuda_filtering.py), the sharded sampler's torch path. The GPU tests closest to them, whole files:
  timeout -k 2 190 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_robustness_gpu.py \
    tests/gpu/test_verify_gpu.py tests/gpu/test_block_inputs_gpu.py tests/gpu/test_filtering_gpu.py 2>&1 \
    | tee "$OUT/regress45.txt" | tail -5
  ;;
edges46)
  # (~150-280 s with compiles) Stop 46 fixed, on the CPU, stream / wide dropping every candidate with a subnormal T
  # and fused / chain giving the lowest mapped id for d2t rows of all -inf keys (ops.numerics.word_token, fused's
  # combine). The new GPU file runs both cases for EVERY design here, the CUDA C++ ones included (cuda_chain /
  # cuda_gumbel bound keys by z * (1/T) too: a failure there is a bug to fix in chain.cu / blocks.cu); then the GPU
  # files of the changed Triton designs, which the stop's one H100 call did not reach.
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_extreme_values_gpu.py 2>&1 \
    | tee "$OUT/edges46.txt" | tail -8
  timeout -k 2 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_fused_gpu.py tests/gpu/test_chain_gpu.py \
    tests/gpu/test_wide_gpu.py tests/gpu/test_stream_gpu.py 2>&1 | tee -a "$OUT/edges46.txt" | tail -5
  ;;
edges47)
  # (~150-290 s with compiles) Stop 47 (no GPU when written): cuda_chain / cuda_gumbel give NaN approximate keys where
  # 1 / T overflows (chain.cu row_keys, blocks.cu row_state), so such rows take their exact keys; the block inputs
  # clamp positions without an int64 sum that wraps (reference and Triton; test_block_inputs_gpu.py's new clamp test at
  # max_model_len on both sides of 2^31 and 2^63 - 1, graph-replayed); a new GPU file of the cluster filter on
  # extreme key rows (+-inf ties, +-0, subnormals, +-3e38, p one ulp below 1, every default flag set; the input must
  # come back unchanged). Then the two CUDA drafting designs' own GPU files (changed kernels).
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_extreme_values_gpu.py \
    tests/gpu/test_block_inputs_gpu.py 2>&1 | tee "$OUT/edges47.txt" | tail -8
  timeout -k 2 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_extreme_gpu.py 2>&1 \
    | tee -a "$OUT/edges47.txt" | tail -5
  timeout -k 2 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_gumbel_gpu.py \
    tests/gpu/test_cuda_chain_gpu.py 2>&1 | tee -a "$OUT/edges47.txt" | tail -5
  ;;
*) echo "usage: $0 capture|regress45|edges46|edges47"; exit 2 ;;
esac
