#!/usr/bin/env bash
# A GPU job queue for a session that shares one device machine between several people (CONTRIBUTING,
# "Lead, running one H200"). Jobs live in gpu_jobs/queue/ (git-ignored: name gpu_jobs in the device call's carry).
# Usage on the device machine, from the repository root (NO_CACHE_TAR=1: no Triton cache back):
#   bash tools/gpu_queue.sh JOB [JOB ...]    (each JOB is gpu_jobs/queue/JOB.sh)
# A job's first lines may say "# budget: SECONDS" (default 120). Each job runs under `timeout` (killed at
# its budget) with PYTHONPATH=src, JOB_OUT=<a folder of its own>, a shared TRITON_CACHE_DIR;
# its folder (log.txt + what it wrote) comes back as $OUT/JOB.tgz.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
# CUBINs built on the CPU with the GPU's NVRTC (tools/prebuild_cubins.py): jobs that do not set their own cache use them
if [ -d gpu_jobs/cuda_cache ] && [ -z "${DSPARK_MARKOV_CACHE:-}" ]; then export DSPARK_MARKOV_CACHE=$PWD/gpu_jobs/cuda_cache; fi
mkdir -p $TRITON_CACHE_DIR /tmp/jobout
if [ -f gpu_jobs/triton_cache.tar.xz ]; then tar -xJf gpu_jobs/triton_cache.tar.xz -C / 2>/dev/null; fi
{ date; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > /tmp/jobout/env.txt 2>&1
for job in "$@"; do
  f=gpu_jobs/queue/$job.sh
  budget=$(sed -n 's/^# budget: *\([0-9]*\).*/\1/p' $f | head -1); budget=${budget:-120}
  mkdir -p /tmp/jobout/$job
  start=$(date +%s)
  JOB_OUT=/tmp/jobout/$job timeout -k 5 $budget bash $f > /tmp/jobout/$job/log.txt 2>&1
  rc=$?
  echo "== job $job rc=$rc wall=$(( $(date +%s) - start ))s budget=${budget}s" | tee -a /tmp/jobout/$job/log.txt
  cp /tmp/jobout/env.txt /tmp/jobout/$job/
  tar -czf $OUT/$job.tgz -C /tmp/jobout $job
done
[ -n "$NO_CACHE_TAR" ] || tar -cf - -C / tmp/triton_cache 2>/dev/null | xz -6 -T0 > $OUT/triton_cache.tar.xz
ls -la $OUT
