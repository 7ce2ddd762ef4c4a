#!/usr/bin/env bash
# GPU plan: vLLM 0.33.0's own top-k/top-p filter (Qrita, apply_top_k_top_p_triton) and GPU rejection sampler
# (rejection_sample) timed beside ours in one process (tools/time_vllm_ops.py), for the same-run comparisons of
# issues 16 and 18. Written 2026-12-05 WITHOUT device time: vLLM's kernels run under Triton's interpreter against
# top_k_top_p_reference (tests/bench/test_vllm_ops.py) and compile for sm_90 with Triton 3.6 (`--compile-check`:
# every kernel; _topk_topp_kernel 221-255 registers, 12 B spill at 6 rows k+p), but have NOT RUN ON A GPU here.
# The GPU machine has no vLLM: carry `.vllm-cache` (python tools/extract_vllm.py --wheel <vllm-0.33.0 wheel> writes
# it; SOURCE.txt holds the SHA-256s the loader checks). Run from the repository root on an H200, PYTHONPATH=$PWD/src,
# one part per job, in order:
#   bash tools/gpu_plans/vllm_side_by_side.sh check        # budget ~60 s: vLLM's ops compiled and exact-checked on the GPU
#   bash tools/gpu_plans/vllm_side_by_side.sh filter       # budget ~240 s: vLLM's filter beside TopKTopPFilter, 4 batch sizes
#   bash tools/gpu_plans/vllm_side_by_side.sh rejection    # budget ~70 s: vLLM's rejection sampler beside StreamVerifier
#   bash tools/gpu_plans/vllm_side_by_side.sh filter_cuda  # budget ~150 s: the CUDA filter (opt-in) beside TopKTopPFilter;
#                                                          #   only after issue16_cluster.sh check passed
# Results go to $JOB_OUT (default ./gpu_plan_out): one folder per part and batch size, each with vllm_ops.json /
# vllm_ops.csv (time_us = CUDA-graph replay, L2 flushed, median of 5 round medians; bench --verify's method) and
# the table in <part>_b<rows>.txt / rejection.txt. vLLM's kernels compile at their first call (~2-5 s per variant; a carried Triton cache skips
# that). What to look at: time_us of impl vllm vs triton per (rows, mode); agreement_rows / kept_diff of vllm (its
# pivot search is approximate at the top-p boundary; interpreter runs against top_k_top_p_reference: k+p every row
# identical (64 rows V=4096, 6 rows V=129,280, all kinds); p alone, monolithic kernel (rows > 64 on the GPU), V=4096:
# Gaussian 69% of rows identical (-1..+2 tokens), peaked and bf16 100%; at V=129,280 (6 rows, the CPU's tiles of 256,
# not the GPU's 8192) 0% / 17% / 67% (gaussian / peaked / bf16) identical, kept counts off by up to -602..+449 tokens
# (of thousands kept; tokens alike >= 99.8%); p alone, split pipeline (<= 64 rows on the
# GPU, x16 slices at 6 rows of V=129,280): a third of the rows identical, 0..+6 tokens more kept); greedy_match True
# and graph_output_match True for every vllm record; any status other than ok (reason column).
set -u
export PYTHONUNBUFFERED=1
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
TOOL=tools/time_vllm_ops.py
case "${1:-check}" in
check)
  # 1. (~10 s) Where vLLM's functions come from (the extracted copies, SHA-256 checked), and the compile check
  #    with this machine's Triton (no launch).
  timeout -k 2 15 python3 -c 'from dspark_markov.bench import vllm_ops; [print(op, "->", how) for op, how in vllm_ops.availability().items()]'
  # 2. (~45 s) The CPU tests, now on the GPU (compiled, no interpreter shims): vLLM's top-k equal to the reference on
  #    distinct values, k = 50 & p = 0.9 and p alone (the split pipeline below 65 rows, as apply_top_k_top_p_triton
  #    runs it on CUDA), the split pipeline called directly, the rejection sampler (greedy = the argmax chain,
  #    draft = target -> every draft accepted, mixed T in range), the stand-in launcher's binding.
  timeout -k 2 60 python3 -m pytest -q -p no:cacheprovider -rs tests/bench/test_vllm_ops.py 2>&1 | tee "$OUT/tests.txt" | tail -8
  ;;
filter)
  # 3. (~240 s) Per batch size 1 / 16 / 64 / 253 requests (6 / 96 / 384 / 1518 rows of V = 129,280 fp32), inputs
  #    gaussian / peaked / bf16, k = 50 & p = 0.9 and p = 0.9 alone: vLLM's filter (has_topp_only_rows as vLLM's sampler
  #    passes it: False with k, True for p alone) and TopKTopPFilter (default layout). One process per batch size, so
  #    a failure or a timeout loses one size only. Expected per size: ~10-20 s of compiles the first time, ~1 s of
  #    setup and reference check per case, ~0.5 s of timing per case (12 cases).
  for rows in 1 16 64 253; do
    timeout -k 2 110 python3 $TOOL --parts filter --filter-impls vllm,triton --rows $rows --out "$OUT/filter_b$rows" \
      2>&1 | tee "$OUT/filter_b$rows.txt" | grep -vE "^\s*$" | tail -16
  done
  ;;
rejection)
  # 4. (~70 s) Standard verification of 1 / 16 / 64 / 253 requests (K = 5, bf16 drafter cache, random drafts), mixed
  #    T (0 / 0.6 / 1 by slot) and T = 1: vLLM's rejection_sample (5 launches, allocates its outputs: from the graph's
  #    pool under capture) beside StreamVerifier. vLLM's first call: counts in [1, K+1], greedy requests = argmax chain.
  timeout -k 2 90 python3 $TOOL --parts rejection --temperatures mixed,1 --rows 1,16,64,253 --out "$OUT/rejection" \
    2>&1 | tee "$OUT/rejection.txt" | tail -22
  ;;
filter_cuda)
  # 5. (~150 s) The cluster-resident CUDA filter (top_k_top_p(impl="cuda")'s kernel, NEVER RUN ON A GPU before
  #    issue16_cluster.sh check) beside TopKTopPFilter, same cases; in a process of its own so that a device fault
  #    there cannot take vLLM's and our Triton records with it. Compare with `filter`'s vllm records (same inputs,
  #    seed and timing method; another process).
  export DSPARK_MARKOV_UNVERIFIED=cuda_filter
  for rows in 1 16 64 253; do
    timeout -k 2 70 python3 $TOOL --parts filter --filter-impls triton,cuda --rows $rows --out "$OUT/filter_cuda_b$rows" \
      2>&1 | tee "$OUT/filter_cuda_b$rows.txt" | grep -vE "^\s*$" | tail -16
  done
  ;;
*)
  echo "usage: $0 check|filter|rejection|filter_cuda" >&2
  exit 2
  ;;
esac
