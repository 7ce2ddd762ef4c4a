#!/usr/bin/env bash
# The CPU half of a GPU session, from the repository root (a new checkout holds none of this: all of it is
# git-ignored, so every session starts here):
#   bash tools/gpu_plans/prepare.sh [PYTHON]     # PYTHON: one with torch and triton (default .venv-ci/bin/python,
#                                                # which `bash .ci/run` creates)
#   bash tools/gpu_plans/prepare.sh --jobs-only  # step 5 alone
# 1. NVRTC 13.0.88 (the H200 image's: its CUBIN keys match) from the nvidia-cuda-nvrtc wheel into /tmp/nvrtc13;
# 2. tools/prebuild_cubins.py: every CUDA source and compile-time variant into gpu_jobs/cuda_cache (~1-2 min);
# 3. tools/prebuild_noise_table.py: the noise table into the same cache (~1-2 min on 2 cores);
# 4. tools/extract_vllm.py: vLLM 0.33.0's gumbel_sample, filter and rejection sampler into .vllm-cache;
# 5. one job file per part of every plan, $GPU_JOBS_DIR/queue/<plan>.<part>.sh (default gpu_jobs), whose budget
#    line ("# budget: N", for tools/gpu_queue.sh) is the plan header's "budget ~N s" plus 15 s.
# Then, on the device: run(command="NO_CACHE_TAR=1 bash tools/gpu_queue.sh issue16_cluster.flags ...",
# carry=["gpu_jobs", ".vllm-cache"]). A step that fails is reported and the others still run; exit status 1 then.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
JOBS=${GPU_JOBS_DIR:-gpu_jobs}
status=0

write_jobs() {
  mkdir -p "$JOBS/queue"
  local count=0
  for plan in tools/gpu_plans/*.sh; do
    local name
    name=$(basename "$plan" .sh)
    # header lines: "#   bash tools/gpu_plans/<plan>.sh <part>  # budget ~<N> s: ..."
    while read -r part budget; do
      printf '# budget: %s\nbash %s %s\n' "$((budget + 15))" "$plan" "$part" > "$JOBS/queue/$name.$part.sh"
      count=$((count + 1))
    done < <(sed -n "s|^#   bash tools/gpu_plans/$name\.sh \([a-z_0-9]*\) *# budget ~\([0-9]*\) s.*|\1 \2|p" "$plan")
  done
  echo "prepare: $count job files in $JOBS/queue"
}

if [ "${1:-}" = "--jobs-only" ]; then
  write_jobs
  exit 0
fi
PY=${1:-.venv-ci/bin/python}
NVRTC=/tmp/nvrtc13/nvidia/cu13/lib/libnvrtc.so.13
if [ ! -f "$NVRTC" ]; then
  mkdir -p /tmp/nvrtc13 /tmp/nvrtc13-wheel
  if "$PY" -m pip download --quiet --no-deps -d /tmp/nvrtc13-wheel 'nvidia-cuda-nvrtc==13.0.88' \
     && "$PY" -m zipfile -e /tmp/nvrtc13-wheel/nvidia_cuda_nvrtc-13.0.88-*.whl /tmp/nvrtc13; then
    echo "prepare: NVRTC at $NVRTC"
  else
    echo "prepare: could not fetch the nvidia-cuda-nvrtc 13.0.88 wheel (steps 2-3 need it)" >&2
    status=1
  fi
fi
for step in "tools/prebuild_cubins.py $JOBS/cuda_cache" "tools/prebuild_noise_table.py $JOBS/cuda_cache" \
            "tools/extract_vllm.py"; do
  echo "prepare: $step"
  # shellcheck disable=SC2086
  if ! DSPARK_MARKOV_NVRTC=$NVRTC PYTHONPATH=src "$PY" $step; then
    echo "prepare: FAILED: $step" >&2
    status=1
  fi
done
write_jobs
exit $status
