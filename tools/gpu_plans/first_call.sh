#!/usr/bin/env bash
# The first device call of a session, whichever card comes (a request for an H200 has got an H100 since stop 34):
#   run(command="bash tools/gpu_plans/first_call.sh [h200|h100]", carry=["gpu_jobs", ".vllm-cache"])
# after `bash tools/gpu_plans/prepare.sh` on the CPU (job files, prebuilt CUBINs, vLLM's extracted ops). On an H200: the
# runs that decide issues 16 and 18 (bench cases of today's defaults), then issue 16's GPU tests; on an H100: issue 12's
# next tensor-core step checks (plan part issue12_wide_tc.tc55: stop 55's W2 L2 prefetch, its tests, its timing with
# and without it, the per-instruction stall samples again; tc54, sanitize3 and l2bw ran in stop 55). Each job comes back as
# $OUT/<job>.tgz as it finishes (tools/gpu_queue.sh), so a call cut short keeps what ran. Edit the two lists as the
# plans move on; the argument forces a list (e.g. to run the H100 list on an H200 after the H200 one).
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "${1:-}" in
  h200) list=h200 ;;
  h100) list=h100 ;;
  *) if echo "$name" | grep -q H200; then list=h200; else list=h100; fi ;;
esac
if [ "$list" = h200 ]; then
  NO_CACHE_TAR=1 bash tools/gpu_queue.sh issue16_cluster.h200 issue18_verify.h200 issue16_cluster.h200_tests
else
  NO_CACHE_TAR=1 bash tools/gpu_queue.sh issue12_wide_tc.tc55
fi
