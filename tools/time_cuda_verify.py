"""Launch the CUDA verifier on the GPU tests' random inputs (profilers and sanitizers wrap this).

Usage: ``PYTHONPATH=src python3 tools/time_cuda_verify.py ROWS [CALLS] [--raw]``: ``CALLS`` eager launches of
:class:`~dspark_markov.verify.cuda_verify.CudaVerifier` (default 5) on ``tests/gpu/test_triton_verify_gpu.py``'s
``_case(ROWS, 0)`` (V = 129,280, K = 5, bf16 cache), then the tokens of the last one against the reference.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_markov as dm  # noqa: E402
from dspark_markov.verify.cuda_verify import CudaVerifier  # noqa: E402
from tests.gpu.test_triton_verify_gpu import K, VOCAB, _case  # noqa: E402


def main(argv):
    rows = int(argv[0])
    calls = int(argv[1]) if len(argv) > 1 and not argv[1].startswith("-") else 5
    raw = "--raw" in argv
    args = _case(rows, 0)
    extra = dict(target_temperature=args[6]) if raw else {}
    verifier = CudaVerifier(rows, K, VOCAB, "cuda")
    for _ in range(calls):
        tokens, count = verifier.run(*args, **extra)
    torch.cuda.synchronize()
    verifier.check()
    ref = dm.verify_drafts(*args, **extra)
    same = torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    print(f"rows {rows}: {calls} launches, tokens {'equal to' if same else 'DIFFERENT from'} the reference")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
