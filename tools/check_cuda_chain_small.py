"""One small impl="cuda_chain" problem checked against the reference: for compute-sanitizer runs.

Usage: ``PYTHONPATH=src compute-sanitizer --tool memcheck python3 tools/check_cuda_chain_small.py``
(also ``--tool racecheck``; ``--quick``: two block shapes, bf16 cache only; ``--hints``: the 16-warp
shape, kernel variant 43 with flags 31 and 15, rows 2 and 12; ``--variants=107,7275``: those variants with
flags 15, rows 2 and 12). V = 4096, 3 steps, rows 3 and 12 (one padding row, T in {1, 0.6, 0}),
4 blocks (so every block is resident under the tool), every block shape; exits non-zero on a
mismatch or a barrier timeout.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.helpers
import dspark_markov as dm  # noqa: E402
from dspark_markov.draft.cuda_chain import CudaChainBackend  # noqa: E402
from tests.helpers import check_against_reference  # noqa: E402


def main() -> int:
    vocab, rank, steps = 4096, 256, 3
    gen = torch.Generator(device="cuda").manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16())
    hints = "--hints" in sys.argv or any(a.startswith("--variants=") for a in sys.argv)
    row_counts = (2, 12) if hints else (3, 12)  # 2: FLAG_EXACT_SMALL's path
    for arg in sys.argv:  # --rows=12: only those
        if arg.startswith("--rows="):
            row_counts = tuple(int(r) for r in arg.split("=", 1)[1].split(","))
    for rows in row_counts:
        base = (torch.randn(rows, steps, vocab, device="cuda", generator=gen) * 2).bfloat16()
        slots = torch.arange(rows, device="cuda")
        slots[1] = -1
        idx = slots.repeat_interleave(steps)
        pos = torch.randint(1, 1 << 20, (rows * steps,), device="cuda", generator=gen)
        temp = torch.tensor([1.0, 0.6, 0.0], device="cuda")[torch.arange(rows, device="cuda") % 3]
        seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=gen)
        anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        args = [base, anchor, idx, pos, temp, seeds]
        quick = "--quick" in sys.argv
        shapes = ((16, 1, 0, 0), (8, 3, 0, 0)) if quick else ((16, 0, 0, 0), (16, 1, 0, 0), (8, 3, 0, 0))
        if "--hints" in sys.argv:  # the run-time flags and kernel variant 43 (cuda_chain flags / variant)
            shapes = ((16, 1, 31, 43), (16, 1, 15, 43))
        for arg in sys.argv:  # --variants=107,7275: those kernel variants with flags 15
            if arg.startswith("--variants="):
                shapes = tuple((16, 1, 15, int(v)) for v in arg.split("=", 1)[1].split(","))
        for warps, regs, flags, variant in shapes:
            for cache_dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32):
                sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, impl="reference")
                sampler.backend = CudaChainBackend(head, steps, rows, method="gumbel", cache_dtype=cache_dtype, device=head.device, warps=warps,
                                                   reg_tiles=regs, num_blocks=4, smem_tiles=2, flags=flags,
                                                   variant=variant)
                out = sampler.sample(*args, check_values=False)
                torch.cuda.synchronize()
                sampler.backend.check()
                check_against_reference(head, *args, out)
                print(f"rows {rows} warps {warps} reg_tiles {regs} flags {flags} variant {variant} cache {cache_dtype}: "
                      "ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
