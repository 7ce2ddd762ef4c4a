#!/usr/bin/env bash
# Check the vLLM plugin (dspark_markov.integrations.vllm) against vLLM 0.33.0's own speculator loop, on the CPU.
#
#   bash tools/check_vllm.sh [pytest args...]
#
# 1. A side environment .venv-vllm/ (git-ignored) with vllm==0.33.0 (the first time ~4+ minutes and ~9.4 GB:
#    vLLM brings its own CUDA build of torch, which imports without a GPU) and this package (editable, no deps).
# 2. tools/extract_vllm.py: vLLM's gumbel_sample into .vllm-cache/ (the benchmark's vllm_loop baseline).
# 3. The tests that need vLLM, under Triton's interpreter (CUDA_VISIBLE_DEVICES= so that vLLM keeps Triton on a
#    machine without a GPU): tests/integrations/test_vllm.py (vLLM's _sample_sequential with and without the hook,
#    bit for bit, also with a reduced vocabulary, top-k drafting and the confidence head (issue 17); every declined
#    case; version guard; entry point), the vllm_loop tests of tests/bench/test_bench.py and the modes' baseline
#    (tests/bench/test_vllm_modes.py).
# The output is written to benchmarks/results/vllm_check_<date>.txt as well. Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
VERSION=0.33.0
PY=$VENV/bin/python

have_vllm() {
  [ -x "$PY" ] && "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VERSION')" 2>/dev/null
}
if ! have_vllm; then
  echo "check_vllm: installing vllm==$VERSION into $VENV (several minutes, ~9.4 GB)" >&2
  python3 -m venv "$VENV" || exit 1
  "$VENV/bin/pip" install -q "vllm==$VERSION" || exit 1
fi
"$VENV/bin/pip" install -q --no-deps -e . || exit 1
"$PY" -c "import pytest" 2>/dev/null || "$VENV/bin/pip" install -q pytest || exit 1
"$PY" tools/extract_vllm.py --site-packages "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || exit 1

export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=
out="benchmarks/results/vllm_check_$(date -u +%F).txt"
{
  echo "# tools/check_vllm.sh, $(date -u +%FT%TZ), git $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests tools || echo '+local changes')"
  "$PY" -c "import importlib.metadata as m, platform; print('# python', platform.python_version(), '| vllm', m.version('vllm'), '| torch', m.version('torch'), '| triton', m.version('triton'), '| TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= (CPU)')"
  "$PY" -m pytest -v -p no:cacheprovider -rxXs tests/integrations/test_vllm.py tests/bench/test_bench.py tests/bench/test_vllm_modes.py -k "vllm or Vllm or test_vllm" "$@" 2>&1 \
    | grep -v -e "^WARNING: Location" -e "^W[0-9]\{4\} "
  echo "# pytest exit status ${PIPESTATUS[0]}"
} | tee "$out"
status=$(tail -n 1 "$out" | grep -o '[0-9]*$')
echo "check_vllm: wrote $out" >&2
exit "${status:-1}"
