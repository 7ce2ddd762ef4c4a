#!/usr/bin/env bash
# GPU plan for the top-k / top-p filter options of issue 16 written by filter5 on 2026-12-04 WITHOUT device time
# (TopKTopPFilter.sweep_raw and .approx, verify/triton_filtering.py; both opt-in, off by default). NOTHING of them
# has run on a GPU. Run from the repository root on an H200 (sm_90), PYTHONPATH=$PWD/src, one part per job:
#   bash tools/gpu_plans/issue16_filter5.sh check   # budget ~120 s: are the options exact? (run this first)
#   bash tools/gpu_plans/issue16_filter5.sh sanitize  # budget ~60 s: memcheck + racecheck over the options' kernels
#   bash tools/gpu_plans/issue16_filter5.sh time    # budget ~100 s: per launch, side by side, each case checked
#   bash tools/gpu_plans/issue16_filter5.sh bench   # budget ~90 s: the bench's filter cases (README table)
# Results go to $JOB_OUT (default ./gpu_plan_out). Compiles: the filter's kernels take ~20 s (one process per
# part; a Triton cache carried from an earlier GPU job of the same source skips it: tools/gpu_queue.sh).
# The default kernels on main compile to the same SASS as filter4's H200-verified build (tools/filter_sass.py);
# nothing here re-verifies them beyond the tests. Then, for the clean-up `git apply tools/gpu_plans/issue16_filter5_clean.patch` (the pre-session
# options deleted; the default kernels rewritten without them: apply and the p-only pass keep their SASS, stats,
# finish and the k+p pass are scheduled differently, CPU-tested only): apply it, run `check` and `time` again, and
# expect the `exact` per-launch times of this run within noise.
set -u
export PYTHONUNBUFFERED=1
OUT=${JOB_OUT:-$PWD/gpu_plan_out}
mkdir -p "$OUT"
case "${1:-check}" in
check)
  # 1. (~60-80 s) The filter's GPU tests (31): the default at every bench input kind and case, both layouts, capacity
  #    16 (search rounds), CUDA-graph replay without allocation; and the options: sweep_raw, approx, approx with
  #    approx_slack 1e12 (every open row through _redo_kernel and the second finish), at 6 and 1518 rows, every kind
  #    plus the edge rows (huge logit, -inf halves, all -inf, NaN), per-row p = 0.9 and the mixed p cycle, in and
  #    out of place. A failure of approx alone (not approx-redo): the bound or _approx_resolve; of approx-redo: the
  #    redo sweep's reset of the row state; of sweep_raw: _complete_bracket.
  timeout -k 2 110 python3 -m pytest -m gpu -q -x --durations=8 tests/gpu/test_filtering_gpu.py 2>&1 \
    | tee "$OUT/tests.txt" | tail -15
  ;;
sanitize)
  # 1b. (budget ~60 s) memcheck and racecheck side by side over one call of each option (16 rows of V = 4096, p alone,
  #     approx once with every row redone): _redo_kernel, _complete_bracket and _approx_resolve are new kernels / paths
  #     (tools/sanitize.py lists only the default filter calls).
  cat > "$OUT/options_call.py" <<'PY'
import torch
from dspark_markov.verify import triton_filtering as ft
x = torch.randn(16, 4096, generator=torch.Generator().manual_seed(0)).cuda() * 2
p = torch.full((16,), 0.9, device="cuda")
for options in ({"sweep_raw": True}, {"approx": True}, {"approx": True, "approx_slack": 1e12}):
    filt = ft.TopKTopPFilter(16, 4096, "cuda", capacity=512)
    for name, value in options.items():
        setattr(filt, name, value)
    y = x.clone()
    filt.filter(y, None, p, y)
torch.cuda.synchronize()
print("calls done")
PY
  for tool in memcheck racecheck; do
    timeout -k 2 55 compute-sanitizer --tool $tool --print-limit 30 python3 "$OUT/options_call.py" \
      > "$OUT/sanitize_$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck; do echo "== $tool"; tail -4 "$OUT/sanitize_$tool.log"; done
  ;;
time)
  # 2. (~60 s) Per-launch GPU times (stats, pass, finish, [finish, redo,] apply; median of 7, cold L2) of the lean
  #    exact sweep (today's default), sweep_raw and approx at 253 / 64 / 16 / 1 requests, k + p and p alone, Gaussian,
  #    peaked and bf16 inputs, then each checked against the sort reference ("check ... rows differing 0") and
  #    approx's running count of redone rows. Predicted at 253 requests, p alone: pass 695 -> ~560 us (raw, 64 SASS
  #    instructions per logit instead of 80) and ~410 us (approx, ~48) plus, for approx, ~10% of the Gaussian/bf16 and
  #    ~56% of the peaked rows redone (CPU emulation of the bound, module doc "Approximate masses").
  timeout -k 2 90 python3 tools/time_filter.py --compare 253,64,16,1 exact,raw,approx 2>&1 | tee "$OUT/compare_log.txt"
  ;;
bench)
  # 3. (~70 s) The bench's filter cases (CUDA-graph replays, cold L2, in place, each case checked against the
  #    reference by its first call) with the default filter: the README table. To time an option as the default,
  #    set it in TopKTopPFilter.__init__ first (and only keep it there if `check` passed).
  #    vLLM's filter is not in .vllm-cache (only gumbel.py was extracted): its column stays the issue's measurement.
  timeout -k 2 85 python3 tools/time_filter.py 1,16,64,253 2>&1 | tee "$OUT/bench.txt"
  ;;
*)
  echo "usage: $0 check|sanitize|time|bench" >&2
  exit 2
  ;;
esac
