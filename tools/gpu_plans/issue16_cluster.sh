#!/usr/bin/env bash
# GPU plan for the cluster-resident top-k / top-p filter of issue 16 (top_k_top_p(impl="cuda"): cuda/filter.cu,
# verify/cuda_filtering.py), written 2026-12-04 without device time; every part below ran and passed on the H200 on
# 2026-12-05 (benchmarks/results/NVIDIA-H200_2026-12-05_cluster_filter_*): kept to re-check the kernel after a change
# (the DSPARK_MARKOV_UNVERIFIED setting below is no longer needed: the filter has no gate now). Run from the repository
# root on an H200, PYTHONPATH=$PWD/src, one part per job:
#   bash tools/gpu_plans/issue16_cluster.sh check     # budget ~120 s: a smoke run, then exact at full shapes? (first)
#   bash tools/gpu_plans/issue16_cluster.sh sanitize  # budget ~60 s: memcheck + racecheck + synccheck, small shape
#   bash tools/gpu_plans/issue16_cluster.sh bench     # budget ~150 s: the bench's filter cases, Triton and cuda
#   bash tools/gpu_plans/issue16_cluster.sh ncu       # budget ~80 s: where the time goes at 253 requests, p alone
#   bash tools/gpu_plans/issue16_cluster.sh newtests  # budget ~120 s: the GPU tests written after stop 26 (ragged V, auto routing)
#   bash tools/gpu_plans/issue16_cluster.sh crossover # budget ~120 s: cluster vs Triton filter at 1-16 requests (AUTO_MAX_ROWS)
#   bash tools/gpu_plans/issue16_cluster.sh flags     # budget ~200 s: stop 27's options (ILP, ASYNC_LOAD, WARP_THRESHOLDS,
#                                                     #   L2_ROWS): the GPU test file with them
#   bash tools/gpu_plans/issue16_cluster.sh flags_sanitize # budget ~70 s: memcheck + racecheck, flags 31 and 63
#   bash tools/gpu_plans/issue16_cluster.sh flags_time # budget ~210 s: timed beside the default (3), phase trace
#   bash tools/gpu_plans/issue16_cluster.sh ncu_l2    # budget ~80 s: `ncu` with FILTER_FLAGS=63 (the L2-row build)
#   bash tools/gpu_plans/issue16_cluster.sh regress   # budget ~430 s: the GPU tests that reach top_k_top_p's auto routing (passed, stop 31)
#   bash tools/gpu_plans/issue16_cluster.sh persist   # budget ~280 s: FLAG_PERSIST / FLAG_CARRY (stop 29; passed in stop 31, slower: opt-in)
#   bash tools/gpu_plans/issue16_cluster.sh persist_sanitize # budget ~65 s: memcheck + racecheck, 415, 3 clusters
#   bash tools/gpu_plans/issue16_cluster.sh persist_sanitize_l2 # budget ~65 s: the same with 447 (the L2-row build)
#   bash tools/gpu_plans/issue16_cluster.sh persist_time # budget ~230 s: 31 / 63 beside 159 / 191 / 415 / 447
#   bash tools/gpu_plans/issue16_cluster.sh fit       # budget ~150 s: stop 40's FLAG_L2_FIT (575): its GPU tests, memcheck / racecheck
#   bash tools/gpu_plans/issue16_cluster.sh fit_time  # budget ~200 s: 63 beside 575, p alone at 11-16 / 64 / 253 requests
#   bash tools/gpu_plans/issue16_cluster.sh fit2      # budget ~170 s: stop 40's one-wave rule, default 575: 12-16 requests, the file's tests
#   bash tools/gpu_plans/issue16_cluster.sh five      # budget ~220 s: stop 40's FLAG_L2_FIVE (1087 / 1599): tests, sanitizers, timing
#   bash tools/gpu_plans/issue16_cluster.sh ncu16     # budget ~120 s: source counters of the default filter, 96 rows p alone
#   bash tools/gpu_plans/issue16_cluster.sh ncu253    # budget ~120 s: the same at 253 requests (1,518 rows)
#   bash tools/gpu_plans/issue16_cluster.sh ffs       # budget ~170 s: df_narrow's bit scan by __ffs: tests, A/B against gpu_jobs/prev_src
#   bash tools/gpu_plans/issue16_cluster.sh deep      # budget ~250 s: stop 41's FLAG_DEEP_REFINE / FLAG_SHARED_BOUNDS: tests, sanitizers, timing
#   bash tools/gpu_plans/issue16_cluster.sh finite    # budget ~250 s: stop 41's FLAG_FINITE_WEIGHT: tests, sanitizers, timing
#   bash tools/gpu_plans/issue16_cluster.sh uncounted # budget ~300 s: stop 41's FLAG_UNCOUNTED: tests, sanitizers, timing
#   bash tools/gpu_plans/issue16_cluster.sh batched   # budget ~300 s: stop 41's FLAG_BATCHED_GATHER: tests, sanitizers, timing
#   bash tools/gpu_plans/issue16_cluster.sh fused     # budget ~330 s: stop 43's FLAG_FUSED_WRITE (115263): tests, sanitizers, timing vs prev_src
#   bash tools/gpu_plans/issue16_cluster.sh fused_trace # budget ~100 s: phase trace of 49727 / 115263 / 246335 at 96 and 1,518 rows
#   bash tools/gpu_plans/issue16_cluster.sh special   # budget ~300 s: stop 44's FLAG_SPECIALIZE (508479): tests, sanitizers, timing beside 246335
#   bash tools/gpu_plans/issue16_cluster.sh sparse49  # budget ~240 s: stop 49: FLAG_SPARSE_DIGIT back in the specialized builds; DEEP_REFINE / FINITE_WEIGHT specialized; timing beside 508479
#   bash tools/gpu_plans/issue16_cluster.sh deep49    # budget ~240 s: stop 49's default 510527 (SPECIALIZE + DEEP_REFINE): its GPU tests, the default's, sanitizers, timing beside 508479
#   bash tools/gpu_plans/issue16_cluster.sh layout49  # budget ~150 s: stop 49: p alone at 11 / 16 / 64 requests in the resident build or 4-block clusters instead of the L2-row build's FIT sizes
#   bash tools/gpu_plans/issue16_cluster.sh split49   # budget ~200 s: stop 49's FLAG_SPLIT_FINAL (1559103): its GPU tests, sanitizers, timing beside the default 510527
#   bash tools/gpu_plans/issue16_cluster.sh final49   # budget ~220 s: stop 49's last default (1559103: SPLIT_FINAL for the resident build): the default's GPU tests, every FIT size, graph replay, extreme rows
#   bash tools/gpu_plans/issue16_cluster.sh sizes     # budget ~300 s: the L2-row build's cluster size (8 / 7 / 6 / 5 forced, 4-block build) at 16 / 64 / 253 requests
#   bash tools/gpu_plans/issue16_cluster.sh h200      # budget ~150 s: on an H200 only (else nothing): the bench's filter cases, Triton and cuda (default flags)
#   bash tools/gpu_plans/issue16_cluster.sh h200_tests # budget ~120 s: on an H200 only (else nothing): the filter's GPU tests at the default flags
#   bash tools/gpu_plans/issue16_cluster.sh bf16_trace # budget ~80 s: phase trace of top-p alone, Gaussian vs bf16 rows, 96 and 1,518 rows (default flags)
# Results go to $JOB_OUT (default ./gpu_plan_out). NVRTC builds filter.cu in ~1 s (cached on disk).
# If the first launch fails with an invalid-configuration error: cuLaunchKernel is assumed to honour the
# compile-time __cluster_dims__(8, 1, 1) (the CUDA guide: such a kernel launches with <<< >>>); the fallback is
# cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION in cuda/build.py.
set -u
export PYTHONUNBUFFERED=1
export DSPARK_MARKOV_UNVERIFIED=cuda_filter
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
# (stop 41's flag parts) flag_tests NAME KEXPR: the GPU test file's tests selected by `-k KEXPR` into $OUT/NAME_tests.txt;
# flag_times NAME FLAGS REQUESTS: two alternating rounds of tools/time_filter.py with those flags (comma-separated) at
# those request counts into $OUT/NAME1, $OUT/NAME2 and $OUT/NAME_bench.txt
flag_tests() {
  timeout -k 2 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py -k "$2" 2>&1 \
    | tee "$OUT/$1_tests.txt" | tail -3
}
flag_times() {
  for round in 1 2; do
    mkdir -p "$OUT/$1$round"
    JOB_OUT="$OUT/$1$round" timeout -k 2 80 python3 tools/time_filter.py --cuda-only --cuda-flags "$2" "$3" 2>&1 \
      | grep -E "^filter_row|Error" | sed "s/^/r$round /" | tee -a "$OUT/$1_bench.txt"
  done
}
# tree_times NAME ROUNDS PREV_FLAGS NEW_FLAGS REQUESTS: alternating rounds of tools/time_filter.py, the tree before a
# change (gpu_jobs/prev_src: `git archive <commit> src/dspark_markov | tar -x -C gpu_jobs/prev_src --strip-components=1`,
# its cubins prebuilt into gpu_jobs/cuda_cache too) with PREV_FLAGS, then this tree with NEW_FLAGS (comma-separated),
# into $OUT/prev<round>, $OUT/new<round> and $OUT/NAME_bench.txt
tree_times() {
  for round in $(seq "$2"); do
    for tree in prev new; do
      local src=$PWD/src flags=$4
      if [ $tree = prev ]; then src=$PWD/gpu_jobs/prev_src flags=$3; fi
      mkdir -p "$OUT/$tree$round"
      PYTHONPATH=$src JOB_OUT="$OUT/$tree$round" timeout -k 2 40 python3 tools/time_filter.py --cuda-only \
        --cuda-flags "$flags" "$5" 2>&1 | grep -E "^filter_row|Error" | sed "s/^/$tree$round /" | tee -a "$OUT/$1_bench.txt"
    done
  done
}
case "${1:-check}" in
check)
  # 1. (~60-80 s) tests/gpu/test_cuda_filtering_gpu.py (20): every input kind (Gaussian, peaked, bf16 ties, edge rows:
  #    ties, a huge logit, -inf halves, all -inf, NaN) x every case (k + p, p, k, the mixed per-row cycles) at 6, 96
  #    and 1518 rows, in and out of place; flat / tied rows through the narrowing passes; int32 k, scalars, a row
  #    stride of V + 3 with misaligned rows; CUDA-graph replay with fresh values and no allocation; two vocabulary
  #    sizes in one process; raw logits with a per-row / scalar temperature divided in the kernel (issue 18's
  #    "the same for top-k/top-p": equal to the filter of the pre-divided rows), also through
  #    DSparkStep.verify(target_temperature=, filter_impl="cuda"). A failure in
  #    the flat rows alone: the narrowing passes (df_search's loop); in every p case: the level-1 histogram or the
  #    mass target; a hang (the job's timeout): a cluster barrier not reached by every thread.
  #    First a smoke run (~5 s, its own process, each case printed before it runs): a fault or a hang (a cluster
  #    barrier not reached by every thread) then names its case instead of killing the whole pytest run.
  cat > "$OUT/cluster_smoke.py" <<'PY'
import torch
from dspark_markov.verify import cuda_filtering as cf
from dspark_markov.verify.filtering import top_k_top_p
gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(6, 129_280, generator=gen, device="cuda") * 2
x[3] = 0.0  # a flat row: narrowing passes
filt = cf.CudaTopKTopPFilter(6, 129_280, "cuda")
for name, k, p in (("k+p", 50, 0.9), ("p", None, 0.9), ("k", 50, None), ("p=0", None, 0.0), ("k=5000+p", 5000, 0.9)):
    print("case", name, flush=True)
    y = x.clone()
    filt.filter(y, k, p, y)
    torch.cuda.synchronize()
    ref = top_k_top_p(x.clone(), k, p, impl="reference")
    print("  equal to the reference:", torch.equal(y, ref), "stats", filt.stats.tolist(), flush=True)
PY
  timeout -k 2 30 python3 "$OUT/cluster_smoke.py" 2>&1 | tee "$OUT/cluster_smoke.txt" | tail -12
  timeout -k 2 110 python3 -m pytest -m gpu -q -x --durations=6 tests/gpu/test_cuda_filtering_gpu.py 2>&1 \
    | tee "$OUT/cluster_tests.txt" | tail -15
  ;;
sanitize)
  cat > "$OUT/cluster_call.py" <<'PY'
import torch
from dspark_markov.verify import cuda_filtering as cf
gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(16, 4096, generator=gen, device="cuda") * 2
x[3] = 0.0  # a flat row: narrowing passes
filt = cf.CudaTopKTopPFilter(16, 4096, "cuda")
for k, p in ((50, 0.9), (None, 0.9), (7, None)):
    y = x.clone()
    filt.filter(y, k, p, y)
torch.cuda.synchronize()
print("calls done, narrowed searches:", int(filt.stats))
PY
  for tool in memcheck racecheck synccheck; do
    timeout -k 2 55 compute-sanitizer --tool $tool --print-limit 30 python3 "$OUT/cluster_call.py" \
      > "$OUT/cluster_sanitize_$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck synccheck; do echo "== $tool"; tail -4 "$OUT/cluster_sanitize_$tool.log"; done
  ;;
bench)
  # 2. (~120-150 s) tools/time_filter.py --cuda: the bench's filter cases (Gaussian, peaked, bf16; k = 50 + p = 0.9 and
  #    p = 0.9 alone; CUDA-graph replays, cold L2, in place, 3 rounds x 15 replays, each case checked against the
  #    sort reference by its first call) for the Triton default layout AND impl="cuda" at 1 / 16 / 64 / 253 requests.
  #    Expected for cuda (not measured): p alone ~20-30 / 35-60 / 120-200 / 400-600 us (targets 40 / 100 / 300 /
  #    1,000); k + p below that (counts only, the k best gathered and sorted: ~memory-bound, ~400 us at 253
  #    requests; targets 40 / 80 / 250 / 900). If it pays, commit
  #    the files as benchmarks/results/NVIDIA-H200_<date>_cluster_filter_verify.{json,csv}, then consider making it
  #    "auto" on sm_90 (registry "top_k_top_p") after dropping its opt-in gate.
  timeout -k 2 170 python3 tools/time_filter.py --cuda 1,16,64,253 2>&1 | tee "$OUT/cluster_bench.txt"
  ;;
ncu)
  # 3. (~60-80 s; FILTER_FLAGS=63 for the L2-row build) one call per configuration under Nsight Compute (full set): 253 requests (1518 rows) p alone, Gaussian
  #    and peaked; 1 request (6 rows) p alone. Read: dram throughput vs issue-slot utilisation, the shared-atomic
  #    and cluster-barrier stalls (smsp__pcsamp_warps_issue_stalled_barrier / _membar), achieved occupancy (2 blocks).
  cat > "$OUT/cluster_ncu.py" <<'PY'
import os
import sys
import torch
from dspark_markov.bench.verify_grid import filter_logits
from dspark_markov.verify import cuda_filtering as cf
for rows, kind in ((1518, "gaussian"), (1518, "peaked"), (6, "gaussian")):
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = filter_logits(kind, torch.randn(rows, 129_280, generator=gen, device="cuda") * 2, gen)
    filt = cf.CudaTopKTopPFilter(rows, 129_280, "cuda", flags=int(os.environ.get("FILTER_FLAGS", "3")))
    p = torch.full((rows,), 0.9, device="cuda")
    filt.filter(x.clone(), None, p, x.clone())
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    y = x.clone()
    filt.filter(y, None, p, y)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
PY
  timeout -k 2 100 ncu --profile-from-start off --clock-control none --set full -k dm_filter \
    -o "$OUT/cluster_ncu" -f python3 "$OUT/cluster_ncu.py" > "$OUT/cluster_ncu_log.txt" 2>&1
  ncu --import "$OUT/cluster_ncu.ncu-rep" --page details 2>/dev/null \
    | grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|L1/TEX Hit|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Shared Memory Configuration|L2 Hit Rate|Memory Throughput" \
    | tee "$OUT/cluster_ncu.txt"
  ;;
newtests)
  # (~60 s) The GPU tests written after stop 26's device time ran out (NOT RUN yet): every FilterArgs.flags option at
  # V = 1,001 / 50,257 (a last block whose token count is not a multiple of 4: the gather's tail mask, never run on a
  # GPU; V = 129,280 splits evenly), auto's routing (<= AUTO_MAX_ROWS and temperatures to this filter), the Triton
  # filter's public path at 6 rows named explicitly, the no-allocation check through auto at 4 rows.
  timeout -k 2 110 python3 -m pytest -m gpu -q -x tests/gpu/test_cuda_filtering_gpu.py tests/gpu/test_filtering_gpu.py \
    tests/gpu/test_robustness_gpu.py -k "not chain_barrier" 2>&1 | tee "$OUT/newtests.txt" | tail -6
  ;;
crossover)
  # (~60 s) Where the cluster filter stops beating the Triton filter between 1 and 16 requests (6-96 rows): if it is
  # still faster at 5 requests (30 rows: one wave of the H200's 30 resident clusters), raise
  # verify/cuda_filtering.AUTO_MAX_ROWS to the last size where it wins for both k + p and p alone.
  timeout -k 2 110 python3 tools/time_filter.py --cuda 1,2,3,4,5,8,16 2>&1 | tee "$OUT/crossover.txt" | grep "^| filter"
  ;;
flags)
  # (~190 s; then flags_sanitize ~60 s, flags_time ~210 s) stop 27's options, NOT RUN on a GPU yet: FLAG_ILP (4: the
  # level-1 histogram four tokens per step; the one-token loop compiles to one dependent chain of ~45 instructions per
  # token), FLAG_ASYNC_LOAD (8: the slice read by cp.async, every copy in flight), FLAG_WARP_THRESHOLDS (16: the
  # gather's bucket bounds in <= 9 16-way rounds across the lanes) and FLAG_L2_ROWS (32: the -DDF_L2_ROWS build, no
  # slice in shared memory, the row re-read from L2 at every pass, four blocks per SM). The whole GPU test file: the
  # options 7 / 11 / 19 / 31 / 35 / 63 beside 0-3 at ragged V (contiguous and 16-byte aligned rows), raw temperatures,
  # misaligned rows; every input kind at 6 / 96 / 1,518 rows, flat and tied rows and graph replay with 63. A failure
  # only with 35 / 63: the L2-row build (DF_AT reads; stats[1] bit 4: a row reached it misaligned or divided).
  timeout -k 2 70 python3 -m pytest -m gpu -q tests/gpu/test_cuda_filtering_gpu.py -k every_option 2>&1 \
    | tee "$OUT/flags_tests_options.txt" | tail -6
  timeout -k 2 120 python3 -m pytest -m gpu -q tests/gpu/test_cuda_filtering_gpu.py -k "not every_option" 2>&1 \
    | tee "$OUT/flags_tests_rest.txt" | tail -6
  ;;
flags_sanitize)
  # (~60 s) memcheck + racecheck with flags 31 (resident) and 63 (the L2-row build) on 16 rows of V = 4,099
  FILTER_FLAGS=31 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=63 bash "$0" sanitize_only memcheck racecheck
  ;;
flags_time)
  # (~210 s) timed beside the default 3 (31: every resident option; 63: the L2-row build with them; the trace
  # separates the resident options)
  # without the Triton group, then the phase trace of the resident options. Expected: the histogram phase 8-10 -> ~4
  # us with masses (p alone), ~4 -> ~1.5 with counts; the load ~4-6 -> ~2-3 us; the bounds ~1.5 -> ~0.5 us: p alone
  # ~24 us a row (96 rows ~95 us, 1,518 rows ~1.25 ms), k + p ~19 us; the L2-row build slower per row (every pass
  # from L2) but ~60 rows in flight instead of 30: ~0.8-1.0 ms p alone at 1,518 rows if the rows stay in L2 (the
  # ncu part with flags 63 says: lts hit rate, dram bytes ~2 x 785 MB). Make a winner DEFAULT_FLAGS
  # (verify/cuda_filtering.py; by rows if the L2 build wins only at large batches) only if it is exact and faster,
  # then re-run `crossover` (AUTO_MAX_ROWS) and `bench` for the committed files and the README.
  timeout -k 2 160 python3 tools/time_filter.py --cuda-only --cuda-flags 3,31,63 1,16,64,253 2>&1 \
    | tee "$OUT/flags_bench.txt" | grep -E "^filter_row|rows needing"
  timeout -k 2 40 python3 tools/trace_cluster_filter.py --rows 6,1518 --flags 3,7,11,19,31,63 2>&1 | tee "$OUT/flags_trace.txt" | tail -30
  ;;
regress)
  # (~400 s on the H200: 225 s ran 60 of its ~180 tests) stop 28 changed auto's routing (top-p alone to the cluster filter at every batch, top-k up to 30 rows)
  # and the default flags (63): the GPU test files whose calls go through it (Triton filter tests with impl="auto",
  # robustness, verification incl. DSparkStep) beside the cluster filter's own file. Expect every test to pass.
  # (stop 29's persist / carry cases of the cluster filter's file are the `persist` part's: deselected here)
  timeout -k 2 420 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_filtering_gpu.py \
    tests/gpu/test_robustness_gpu.py tests/gpu/test_triton_verify_gpu.py tests/gpu/test_cuda_filtering_gpu.py \
    -k "not (159 or 191 or 255 or 415 or 447 or 511 or 407 or persistent)" 2>&1 | tee "$OUT/regress.txt" | tail -15
  ;;
persist)
  # (~200-270 s: ~105 tests, the sort reference at 1,518 rows dominates) FLAG_PERSIST (128) and FLAG_CARRY (256) (stop 29, written without a GPU; passed on the H200 in stop 31, slower: opt-in; SASS of the hot loops
  # checked): persistent clusters (as many as fit, each looping over rows c, c + G, ...) with the next row's
  # slice prefetched into L2; with CARRY a row's write also loads the next row (resident: cp.async refills of the
  # slice's slots; L2-row build: its groups read and their max tracked). The GPU test file's persist cases: every kind
  # and case at 6 / 96 / 1,518 rows with 159 / 191 (31 / 63 + persist) and 415 / 447 (+ carry), every option at ragged
  # V with 159 / 191 / 255 / 415 / 447 / 511, flat and tied rows, graph replay, and one cluster (or 3 / 7) looping over
  # 96 mixed rows (NaN, all -inf and left-alone rows between filtered ones, raw logits). A hang (the timeout) or a
  # fault: a cluster barrier count that differs between rows, or shared memory written by the next row while another
  # block still reads it (see df_row's comment in filter.cu); a wrong result only with 415 / 447 / 511: the carry.
  # (-v: a hang's log names the test that hung)
  timeout -k 2 270 python3 -m pytest -m gpu -v -x tests/gpu/test_cuda_filtering_gpu.py \
    -k "159 or 191 or 255 or 415 or 447 or 511 or 407 or persistent" 2>&1 | tee "$OUT/persist_tests.txt" | tail -8
  ;;
persist_sanitize)
  # (~55 s) memcheck + racecheck with 415 (persist + carry, resident) and 3 clusters for 16 rows (every cluster loops; a
  # flat row among them; the cp.async refills of the slice are what racecheck should look at)
  FILTER_FLAGS=415 FILTER_CLUSTERS=3 bash "$0" sanitize_only memcheck racecheck
  ;;
persist_sanitize_l2)
  # (~55 s) the same with 447 (the L2-row build takes top-p alone: L2_MIN_ROWS is lowered in the script)
  FILTER_FLAGS=447 FILTER_CLUSTERS=3 bash "$0" sanitize_only memcheck racecheck
  ;;
persist_time)
  # (~220 s) does it pay? 31 / 63 (today's default builds) beside 159 / 191 (persist) and 415 / 447 (persist + carry) at
  # 1 / 16 / 64 / 253 requests, every case checked against the reference by its first call. Expected where it helps:
  # 64 / 253 requests (a row's HBM load, 4-11 us of ~65 in the L2-row build, from L2 or inside the last row's write;
  # no wave of clusters waiting for its slowest row). If one wins for p alone: DEFAULT_FLAGS |= those bits in
  # verify/cuda_filtering.py (by rows if it pays only at large batches), then `bench` for the committed files and
  # the README.
  timeout -k 2 215 python3 tools/time_filter.py --cuda-only --cuda-flags 31,159,415,63,191,447 1,16,64,253 2>&1 \
    | tee "$OUT/persist_bench.txt" | grep -E "^filter_row|rows needing"
  ;;
ncu_l2)
  # (~80 s) the ncu part on the L2-row build (flags 63): its L2 hit rate and DRAM bytes say whether the rows stayed in L2
  FILTER_FLAGS=63 bash "$0" ncu
  ;;
fit)
  # (~100-140 s) FLAG_L2_FIT (stop 40, written without a GPU; the 8- and 4-block builds' SASS unchanged,
  # tools/cuda_sass.py): the L2-row build's cluster size picked per call (cuda_filtering.fit_cluster), builds of 5, 6, 7
  # blocks whose last block's range of reduced buckets runs past the 2,048 buckets. Each size forced on 96 rows of top-p
  # alone at V = 1,001 / 50,258 / 129,280 (test_every_fit_cluster_size_equals_reference; it prints the resident
  # clusters per size: expected ~66 / 75 / 88 / 105 / 132 for 8 / 7 / 6 / 5 / 4), the flags 575 cases of the file, then
  # memcheck + racecheck with 5 and 7 blocks forced. A failure with 5-7 only: the empty buckets (df_histogram's guard)
  # or the slice arithmetic.
  timeout -k 2 100 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "fit_cluster or 575" 2>&1 | tee "$OUT/fit_tests.txt" | grep -E "resident clusters|passed|failed|Error" | tail -8
  FILTER_FLAGS=575 FILTER_FIT=5 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=575 FILTER_FIT=7 bash "$0" sanitize_only memcheck
  ;;
fit_time)
  # (~190 s) 63 beside 575 (FLAG_L2_FIT), p alone and k + p (k + p runs the resident build either way: a control), at
  # 11 / 14 / 16 requests (66 / 84 / 96 rows: expected sizes 8 / 6 / 5 from the counts above) and 64 / 253 (expected 8:
  # the same kernel, a control of the noise). Expected at 16 requests: ~0.8 x 63's (one wave of slices 1.6 x as long
  # instead of two waves), i.e. H200 ~85-95 us against 104-114 (issue 16's target: <= 100).
  timeout -k 2 190 python3 tools/time_filter.py --cuda-only --cuda-flags 63,575 11,14,16,64,253 2>&1 \
    | tee "$OUT/fit_bench.txt" | grep -E "^filter_row|rows needing|Error"
  ;;
fit2)
  # (~120-160 s) after fit / fit_time (H100, stop 40: resident clusters 62 / 69 / 79 / 94 / 124 of 8 / 7 / 6 / 5 / 4;
  # one wave of 7 at 66 rows and of 5 at 84 faster than two waves of 8, five waves of 6 at 384 rows slower) the rule is
  # "one wave of the largest cluster that holds the batch, else 8" and 575 the default. Timed: 12 / 13 / 15 requests
  # (72 / 78 / 90 rows: 6, 6, 5 blocks; not measured before) and 16 / 64 (8: a control). Then the cluster filter's GPU
  # test file without the persist cases (the default flags now 575).
  timeout -k 2 60 python3 tools/time_filter.py --cuda-only --cuda-flags 63,575 12,13,15,16,64 2>&1 \
    | tee "$OUT/fit2_bench.txt" | grep -E "^filter_row|rows needing|Error"
  timeout -k 2 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "not (159 or 191 or 255 or 415 or 447 or 511 or 407 or persistent)" 2>&1 | tee "$OUT/fit2_tests.txt" | tail -4
  ;;
five)
  # (~150-200 s) FLAG_L2_FIVE (stop 40, written after fit2): the L2-row builds at five blocks per SM (-DDF_L2_FIVE:
  # 48 registers, ~24 bytes of scattered spills, 1,024 candidates), a quarter more rows in flight; with FLAG_L2_FIT
  # (1599) 96 rows should fit one wave of 6-block clusters (the counts are printed: expected ~77 / 86 / 100 / 118 of 8 /
  # 7 / 6 / 5). Timed first (63 the old default, 575 the default, 1599 and 1087), then the file's tests with 1087 /
  # 1599 and the forced sizes, then memcheck + racecheck with 6 blocks forced. Make 1599 the default only if it is
  # faster at 16, 64 and 253 requests and exact.
  timeout -k 2 70 python3 tools/time_filter.py --cuda-only --cuda-flags 63,575,1599,1087 11,16,64,253 2>&1 \
    | tee "$OUT/five_bench.txt" | grep -E "^filter_row.* p |rows needing|Error"
  timeout -k 2 110 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "1087 or 1599 or fit_cluster" 2>&1 | tee "$OUT/five_tests.txt" | grep -E "resident clusters|passed|failed|Error" | tail -12
  FILTER_FLAGS=1599 FILTER_FIT=6 bash "$0" sanitize_only memcheck racecheck
  ;;
ncu16)
  # (~60-100 s) where 16 requests of p alone go (96 rows, Gaussian, default flags: the 8-block L2-row build in two
  # waves; ~114-125 us on an H100, 104-114 on the H200, issue 16's target <= 100): Nsight Compute's source counters
  # (executed instructions and stall samples per SASS line), warp state, scheduler and occupancy of one in-place call,
  # as a report and as the SASS-with-source CSV for tools/ncu_sass_sections.py (the phases: df_histogram's loop, the
  # max pass, df_collect's gather, the write).
  cat > "$OUT/ncu16.py" <<'PY'
import os
import torch
from dspark_markov.bench.verify_grid import filter_logits
from dspark_markov.verify import cuda_filtering as cf
rows = int(os.environ.get("FILTER_ROWS", "96"))  # (ncu253: 1,518)
gen = torch.Generator(device="cuda").manual_seed(1)
x = filter_logits("gaussian", torch.randn(rows, 129_280, generator=gen, device="cuda") * 2, gen)
flags = os.environ.get("FILTER_FLAGS")  # (default: DEFAULT_FLAGS)
filt = cf.CudaTopKTopPFilter(rows, 129_280, "cuda", flags=None if flags is None else int(flags))
y = x.clone()
filt.filter(y, None, 0.9, y)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
y = x.clone()
filt.filter(y, None, 0.9, y)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("stats", filt.stats.tolist(), "fit", filt.fit_cluster(rows))
PY
  timeout -k 2 90 ncu --profile-from-start off --clock-control none -k dm_filter --section SourceCounters \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis \
    --import-source yes -f -o "$OUT/filter${FILTER_ROWS:-96}" python3 "$OUT/ncu16.py" > "$OUT/ncu${FILTER_ROWS:-96}_log.txt" 2>&1
  tail -4 "$OUT/ncu${FILTER_ROWS:-96}_log.txt"
  ncu --import "$OUT/filter${FILTER_ROWS:-96}.ncu-rep" --page details 2>/dev/null | tee "$OUT/ncu${FILTER_ROWS:-96}_details.txt" \
    | grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc|No Eligible|Warp Cycles Per Issued"
  timeout -k 2 30 ncu --import "$OUT/filter${FILTER_ROWS:-96}.ncu-rep" --page source --csv --print-source sass 2>&1 \
    | head -c 4000000 > "$OUT/filter${FILTER_ROWS:-96}_source.csv"
  ls -la "$OUT"
  ;;
ncu253)
  # (~60-120 s) the same at 253 requests (1,518 rows, ~23 waves of 8-block clusters), where stop 44 found the filter
  # bound by per-token work rather than by a row's latency-bound phases (cluster sizes, fewer atomics and fewer
  # histogram instructions all measured no faster there): which phase's SASS holds the instructions and the stalls
  FILTER_ROWS=1518 bash "$0" ncu16
  ;;
ffs)
  # (~120-160 s) df_narrow's lowest set bit by __ffs on the device (the ncu16 profile: its loop ~4% of the instructions
  # at 96 rows). The file's tests without the persist / five cases, then the default filter timed twice against the
  # tree before the change (gpu_jobs/prev_src: `git archive <commit> src/dspark_markov | tar -x -C gpu_jobs/prev_src
  # --strip-components=1`), alternating, p alone and k + p at 16 / 64 / 253 requests.
  timeout -k 2 75 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "not (159 or 191 or 255 or 415 or 447 or 511 or 407 or persistent or 1087 or 1599)" 2>&1 \
    | tee "$OUT/ffs_tests.txt" | tail -3
  tree_times ffs 2 575 575 16,64,253
  ;;
deep)
  # (~200-250 s) stop 41's kernel flags FLAG_DEEP_REFINE (2048: a top-p search refined down to 32 candidates before the
  # rank by counting, which was 10% of the instructions in ncu16) and FLAG_SHARED_BOUNDS (4096: a gather's bucket
  # bounds searched by one warp per block). The file's tests with them (6175 / 6719 and the options 2051 / 2623 /
  # 4127), memcheck + racecheck (6719 through the L2-row build, 6175 resident), then 575 (the default) beside 2623 /
  # 4671 / 6719, two alternating rounds, p alone and k + p at 16 / 64 / 253 requests. Make them default only if exact
  # and faster.
  flag_tests deep "6175 or 6719 or 2051 or 2623 or 4127"
  FILTER_FLAGS=6719 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=6175 bash "$0" sanitize_only memcheck
  flag_times deep 575,2623,4671,6719 16,64,253
  ;;
finite)
  # (~200-250 s) stop 41's FLAG_FINITE_WEIGHT (8192: top-p's histogram loop by df_weight_finite / df_bucket_finite
  # where the row max is finite, ~40 instructions a token instead of ~50; the loop is the issue-bound phase of a wave).
  # The file's tests with it (8767 / 14911 and the options 8223 / 8767 / 8197 / 14911: ragged V, a +inf row max),
  # memcheck + racecheck (14911 through the L2-row build, 8223 resident), then 575 beside 8767 / 14911 / 6719, two
  # alternating rounds, p alone and k + p at 1 / 16 / 64 / 253 requests.
  flag_tests finite "8767 or 14911 or 8223 or 8197"
  FILTER_FLAGS=14911 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=8223 bash "$0" sanitize_only memcheck
  flag_times finite 575,8767,14911,6719 1,16,64,253
  ;;
uncounted)
  # (~250-300 s) stop 41's FLAG_UNCOUNTED (16384: top-p alone histograms masses only, two shared adds a token, and its
  # search gathers first, narrowing after an overfull bucket). The file's tests with it (16415 resident, 16959 / 31295
  # the L2-row builds, flat and tied rows: the narrowing after the gather), memcheck + racecheck (31295 and 16415; the
  # script's flat row overfills its bucket), then 575 beside 16959 / 25151 (with FLAG_FINITE_WEIGHT) / 31295, two
  # alternating rounds, p alone and k + p at 1 / 16 / 64 / 253 requests.
  flag_tests uncounted "16415 or 16959 or 31295 or 16386 or 16391"
  FILTER_FLAGS=31295 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=16415 bash "$0" sanitize_only memcheck racecheck
  flag_times uncounted 575,16959,25151,31295 1,16,64,253
  ;;
batched)
  # (~250-300 s) stop 41's FLAG_BATCHED_GATHER (32768: the gather's reads four in flight; ran in stop 41 with a since
  # removed flag 65536, an eight-read write pass, in 115263 / 129599 as well): the file's tests with it (32769 / 32799
  # resident, 33343 / 49727 / 64063 the L2-row builds; ragged V: the partial last group), memcheck + racecheck (64063,
  # 32799), the tests that take the default flags, then 575 (stop 40's default) beside 16959 (+ UNCOUNTED) / 49727
  # (+ BATCHED_GATHER, stop 41's default) / 64063 (all five), two alternating rounds, p alone and k + p at
  # 1 / 16 / 64 / 253 requests.
  flag_tests batched "32769 or 32799 or 33343 or 49727 or 64063"
  FILTER_FLAGS=64063 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=32799 bash "$0" sanitize_only memcheck racecheck
  flag_tests default "not (every_kind or every_option or flat_and_tied or graph_replay or fit_cluster)"  # (~40 s)
  flag_times batched 575,16959,49727,64063 1,16,64,253
  ;;
fused)
  # (~250-330 s) stop 43's FLAG_FUSED_WRITE (65536, the L2-row build: top-p alone written by its one gather, then only
  # the bucket's members below the cut set to -inf; no write pass). The file's tests with it (115263 = 49727 + it: every
  # kind and case at 6 / 96 / 1,518 rows, ragged V (the partial group's scalar stores), flat and tied rows (the bucket
  # overflows: the write pass after the gather's writes), graph replay, each FIT cluster size) and with the default
  # 49727 (its SASS moved: the gather's branch, FilterShared grew 16 bytes), memcheck + racecheck with 115263 (a flat
  # row overflows), then three alternating rounds: this tree's 49727 and 115263 beside gpu_jobs/prev_src's 49727 (the
  # tree before the change; its cubins prebuilt into gpu_jobs/cuda_cache too), p alone and k + p at 1 / 16 / 64 / 253
  # requests. Make it default only where it is exact and faster. Also FLAG_PREFETCH_SLICE (131072: each block's slice
  # requested into L2 by one bulk prefetch before the first read): 180799 = 49727 + it, 246335 = 115263 + it.
  timeout -k 2 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "115263 or fused or 49727 or 180799 or 246335" 2>&1 | tee "$OUT/fused_tests.txt" | tail -3
  FILTER_FLAGS=115263 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=246335 bash "$0" sanitize_only memcheck
  tree_times fused 3 49727 49727,115263,180799,246335 1,16,64,253
  ;;
special)
  # (~200-300 s) stop 44's FLAG_SPECIALIZE (262144, written without device time): each build compiled for the kernel
  # flags its launches pass (-DDF_FIXED_FLAGS: the other options' code dropped; the resident build's SASS 27% smaller,
  # the L2-row build's 15%), after the default's resident build slowed 4-7% at 1 request when only code it never runs
  # was added (MASS_CARRY). The file's tests with it (508479 = 246335 + it; 262175 = 31 + it; 262271 = 127 + it: the
  # 4-block build; the FIT sizes' specialized builds: "special"), memcheck + racecheck with 508479 and with its 6-block
  # build, then two alternating rounds of 246335 beside 508479 (the generic build's SASS is the measured one: no tree
  # before needed), p alone and k + p at 1 / 16 / 64 / 253 requests. Default only where exact and faster.
  timeout -k 2 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "508479 or 262175 or 262271 or special" 2>&1 | tee "$OUT/special_tests.txt" | tail -3
  FILTER_FLAGS=508479 bash "$0" sanitize_only memcheck racecheck
  FILTER_FLAGS=508479 FILTER_FIT=6 bash "$0" sanitize_only memcheck
  flag_times special 246335,508479 1,16,64,253
  ;;
sparse49)
  # (~150-240 s) Stop 49: FLAG_SPECIALIZE (508479) measured faster than the default 246335 for p alone at 1 / 16 / 64
  # requests and level at 253 (H100, `special`), so the digit of stop 48 (FLAG_SPARSE_DIGIT, 524288) is back: df_refine
  # is a template whose instance without it is the old source (tools/cuda_sass.py: the specialized default builds'
  # SASS identical), so only a build with it compiled in changes. Its GPU tests (1032767 = 508479 + it; 786463 the
  # resident 31 specialized + it; 770623 / 524319 the generic builds, as this part ran; since then the host refuses it
  # without FLAG_SPECIALIZE and those two select nothing), memcheck with 1032767 (a flat row), then two
  # alternating rounds of 508479 beside 1032767, 510527 (+ DEEP_REFINE) and 516671 (+ FINITE_WEIGHT), each specialized,
  # p alone and k + p at 1 / 16 / 64 / 253 requests (every case checked against the sort reference by its first call).
  flag_tests sparse49 "1032767 or 786463 or 770623 or 524319"
  FILTER_FLAGS=1032767 bash "$0" sanitize_only memcheck
  flag_times sparse49 508479,1032767,510527,516671 1,16,64,253
  ;;
deep49)
  # (~150-240 s) Stop 49's default, 510527 (508479 = 246335 + FLAG_SPECIALIZE, with FLAG_DEEP_REFINE: `sparse49` measured
  # it 2-6% faster for bf16 rows at every batch): the file's tests with it (510527; 264223 the resident 31 specialized +
  # DEEP_REFINE), the tests that take the default flags, the extreme rows' file (default flags), memcheck + racecheck
  # with 510527, then two more alternating rounds of 508479 beside 510527, p alone and k + p at 1 / 16 / 64 / 253
  # requests.
  flag_tests deep49 "510527 or 264223"
  flag_tests default49 "not (every_kind or every_option or flat_and_tied or graph_replay or fit_cluster)"
  timeout -k 2 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_extreme_gpu.py 2>&1 \
    | tee "$OUT/extreme49_tests.txt" | tail -3
  FILTER_FLAGS=510527 bash "$0" sanitize_only memcheck racecheck
  flag_times deep49 508479,510527 1,16,64,253
  ;;
split49)
  # (~120-200 s) Stop 49's FLAG_SPLIT_FINAL (1048576; 1559103 = the default 510527 + it, 1312799 = 264223 + it:
  # 31 + DEEP_REFINE + SPECIALIZE + it): the row's last cluster barrier split into arrive (after the search) and wait (before the block
  # leaves), the write phase between them (ncu253: 14% of the stall samples wait at cluster barriers). The file's tests
  # with it (every kind and case at 6 / 96 / 1,518 rows, ragged V, flat and tied rows), memcheck + racecheck with
  # 1559103 (a flat row; blocks leaving while others still read their shared memory would show here), then two
  # alternating rounds beside 510527, p alone and k + p at 1 / 16 / 64 / 253 requests. Default only if exact and faster.
  flag_tests split49 "1559103 or 1312799"
  FILTER_FLAGS=1559103 bash "$0" sanitize_only memcheck racecheck
  flag_times split49 510527,1559103 1,16,64,253
  ;;
final49)
  # (~150-220 s) Stop 49's last default, 1559103 (510527 with FLAG_SPLIT_FINAL in the resident build's launches; the
  # L2-row build's compiled flags stay 510527's). The tests that take the default flags, every FLAG_L2_FIT size (the
  # test's FIVE variants were refused by the constructor since SPECIALIZE became default: mended, not yet run), graph
  # replay with 510527 / 1559103, the extreme rows' file.
  flag_tests final49 "fit_cluster or (graph_replay and (510527 or 1559103))"
  flag_tests default_final49 "not (every_kind or every_option or flat_and_tied or graph_replay or fit_cluster)"
  timeout -k 2 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_extreme_gpu.py 2>&1 \
    | tee "$OUT/extreme_final49_tests.txt" | tail -3
  ;;
layout49)
  # (~100-150 s) Stop 49: specialization took the resident build's p alone 10% faster at one request (33.7 -> 29.9 us,
  # one wave of ~30 clusters), so 16 requests (96 rows, two waves of the L2-row build's 8-block clusters on an H100:
  # 62 resident, 94 of 5 blocks) might run faster in three waves of the resident build (stop 40's generic builds: 117-137
  # us resident against 115-124 in L2), or in one wave of the 4-block L2-row build (124 resident; FLAG_L2_CLUSTER4,
  # 510079 = 510527 - FIT + CLUSTER4; slower in stop 40's generic builds). p alone at 11 / 16 / 64 requests, the
  # default 510527 beside the resident build (L2_MIN_ROWS raised) and 510079, two alternating rounds.
  cat > "$OUT/force_layout.py" <<'PY'
import os, runpy, sys
from dspark_markov.verify import cuda_filtering as cf
cf.L2_MIN_ROWS = int(os.environ.get("L2_MIN", cf.L2_MIN_ROWS))
sys.argv = ["tools/time_filter.py"] + sys.argv[1:]
runpy.run_path("tools/time_filter.py", run_name="__main__")
PY
  for round in 1 2; do
    for v in default resident c4; do
      flags=510527 l2min=31
      if [ $v = resident ]; then l2min=100000; fi
      if [ $v = c4 ]; then flags=510079; fi
      mkdir -p "$OUT/$v$round"
      L2_MIN=$l2min JOB_OUT="$OUT/$v$round" timeout -k 2 60 python3 "$OUT/force_layout.py" --cuda-only --cuda-flags $flags \
        11,16,64 2>&1 | grep -E "^filter_row.* p  |Error" | sed "s/^/$v$round /" | tee -a "$OUT/layout49_bench.txt"
    done
  done
  ;;
sizes)
  # (~200-300 s) stop 44: the L2-row build's cluster size when a batch takes many waves. FLAG_L2_FIT picks a smaller
  # cluster only where its one wave holds a batch that one wave of 8-block clusters does not (66-90 rows on an H100);
  # from 16 requests (96 rows) on it runs 8 blocks per row (~62-66 rows resident on an H100). Fewer blocks per row put more rows in flight (4 blocks: twice as many), each block streaming
  # more of its row between the same cluster barriers and latency-bound search phases, which the phase traces put at
  # about half of a row's time. Two alternating rounds, p alone (k + p runs the resident build whatever the size) at
  # 16 / 64 / 253 requests, the default flags with the size forced (8 / 7 / 6 / 5; FIT's builds) and FLAG_L2_CLUSTER4's
  # 4-block build (245887 = 246335 - FIT + CLUSTER4). Every case checked against the sort reference by its first call.
  cat > "$OUT/force_cluster.py" <<'PY'
import os, runpy, sys
from dspark_markov.verify import cuda_filtering as cf
size = int(os.environ["FORCE_C"])
fit = cf.CudaTopKTopPFilter.fit_cluster
cf.CudaTopKTopPFilter.fit_cluster = lambda self, rows: size if size in self.l2_fits else fit(self, rows)
sys.argv = ["tools/time_filter.py"] + sys.argv[1:]
runpy.run_path("tools/time_filter.py", run_name="__main__")
PY
  for round in 1 2; do
    for c in 8 4 7 5 6; do
      flags=246335
      if [ $c = 4 ]; then flags=245887; fi
      mkdir -p "$OUT/c$c$round"
      FORCE_C=$c JOB_OUT="$OUT/c$c$round" timeout -k 2 50 python3 "$OUT/force_cluster.py" --cuda-only --cuda-flags $flags \
        16,64,253 2>&1 | grep -E "^filter_row|Error" | sed "s/^/c$c r$round /" | tee -a "$OUT/sizes_bench.txt" | grep " p "
    done
  done
  ;;
h200)
  # (~100-150 s) On an H200 only (issue 16's targets are H200 figures; none has come since stop 34): `bench`'s filter
  # cases with the default flags (stop 49's DEFAULT_FLAGS 1559103), Triton and cuda, 1 / 16 / 64 / 253 requests, every
  # case checked against the sort reference by its first call. Commit the files as
  # benchmarks/results/NVIDIA-H200_<date>_filter_default_verify.{json,csv} and regenerate the README's issue-16 table.
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then echo "not an H200: nothing run"; exit 0; fi
  timeout -k 2 170 python3 tools/time_filter.py --cuda 1,16,64,253 2>&1 | tee "$OUT/h200_filter_bench.txt" \
    | grep -E "^filter_row|Error"
  ;;
h200_tests)
  # (~70-120 s) On an H200 only: issue 16's "exact on the H200 at full shapes" under the default flags (1559103): the
  # filter's GPU tests of the default (every input kind and case at 6 / 96 / 1,518 rows, ragged V, flat and tied rows;
  # every FIT cluster size at the default flags and without stop 43's) and those without a flags parameter (auto routing, scalar / int32
  # arguments, two vocabularies, raw logits, DSparkStep), then the auto / cuda routing tests of test_filtering_gpu.py
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then echo "not an H200: nothing run"; exit 0; fi
  timeout -k 2 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cuda_filtering_gpu.py \
    -k "1559103 or (fit_cluster and special) or auto_routes or scalar_and or two_vocabulary or raw_logits or dspark_step" \
    2>&1 | tee "$OUT/h200_tests.txt" | tail -3
  timeout -k 2 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_filtering_gpu.py -k "auto or cuda" 2>&1 \
    | tee -a "$OUT/h200_tests.txt" | tail -3
  ;;
fused_trace)
  # (~60-100 s) where a row's time goes with FLAG_FUSED_WRITE / FLAG_PREFETCH_SLICE (the DF_MARK phase trace; the
  # -DDF_TRACE L2-row build compiles here with NVRTC): 96 and 1,518 rows, p alone, beside the default
  timeout -k 2 100 python3 tools/trace_cluster_filter.py --rows 96,1518 --flags 49727,115263,246335 > "$OUT/fused_trace.txt" 2>&1
  tail -40 "$OUT/fused_trace.txt"
  ;;
bf16_trace)
  # (~40-80 s, any GPU) stop 48: bf16-rounded rows are the slowest kind of top-p alone at every batch (H100, stop 43:
  # +3-7% over Gaussian) and the one the H200 estimates leave just above issue 16's targets; which phase pays for
  # the ties (the DF_MARK trace of the default flags, 96 and 1,518 rows, p alone, Gaussian beside bf16). Ran (H100,
  # `..._2026-12-07_filter_sparse_stop48.txt`): the refinement and ranking (mark 15) 17 (Gaussian) / 24 (bf16) of
  # ~135 trace-us at 96 rows: bf16's refined bucket leaves ~150 tied candidates to rank by counting
  timeout -k 2 80 python3 tools/trace_cluster_filter.py --rows 96,1518 --kinds gaussian,bf16 --cases p \
    --flags 246335 > "$OUT/bf16_trace.txt" 2>&1
  tail -30 "$OUT/bf16_trace.txt"
  ;;
sanitize_only)
  # (used by `flags_sanitize`) memcheck / racecheck on 16 aligned rows of V = 4,099 with FILTER_FLAGS (default 3),
  # tools in $2...
  shift
  cat > "$OUT/cluster_call_flags.py" <<'PY'
import os
import torch
from dspark_markov.verify import cuda_filtering as cf
gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.full((16, 4100), 5.0, device="cuda")[:, :4099]  # rows 16-byte aligned, a last block of 3 mod 4 tokens
x.copy_(torch.randn(16, 4099, generator=gen, device="cuda") * 2)
x[3] = 0.0  # a flat row: narrowing passes
cf.L2_MIN_ROWS = 1  # (the L2-row builds take top-p alone from 31 rows by default: these 16 reach them too)
filt = cf.CudaTopKTopPFilter(16, 4099, "cuda", flags=int(os.environ.get("FILTER_FLAGS", "3")))
clusters = int(os.environ.get("FILTER_CLUSTERS", "0"))  # FLAG_PERSIST: fewer clusters than rows (the loop over rows)
if clusters:
    filt.cap_clusters(clusters)
fit = int(os.environ.get("FILTER_FIT", "0"))  # FLAG_L2_FIT: one cluster size forced (5-7: ranges past bucket 2,047)
if fit:
    filt.force_cluster(fit)
t = torch.full((16,), 0.7, device="cuda")
for k, p, temp in ((50, 0.9, None), (None, 0.9, None), (7, None, None), (None, 0.9, t)):
    y = torch.full((16, 4100), 5.0, device="cuda")[:, :4099]
    y.copy_(x)
    filt.filter(y, k, p, y, temp)
torch.cuda.synchronize()
print("calls done, flags", filt.flags, "narrowed searches:", filt.stats.tolist())
PY
  for tool in "$@"; do
    timeout -k 2 55 compute-sanitizer --tool $tool --print-limit 30 python3 "$OUT/cluster_call_flags.py" \
      > "$OUT/cluster_sanitize_flags${FILTER_FLAGS:-3}${FILTER_FIT:+_c$FILTER_FIT}_$tool.log" 2>&1 &
  done
  wait
  for tool in "$@"; do
    echo "== $tool (flags ${FILTER_FLAGS:-3})"; tail -3 "$OUT/cluster_sanitize_flags${FILTER_FLAGS:-3}${FILTER_FIT:+_c$FILTER_FIT}_$tool.log"
  done
  ;;
*)
  echo "usage: $0 check|sanitize|bench|ncu|ncu_l2|newtests|crossover|flags|flags_sanitize|flags_time|regress|persist|persist_sanitize|persist_sanitize_l2|persist_time|fit|fit_time|fit2|five|ncu16|ffs|deep|finite|uncounted|batched|sanitize_only" >&2
  exit 2
  ;;
esac
