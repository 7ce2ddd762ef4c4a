"""Compile the top-k/top-p filter kernels for sm_90 without a GPU and print their resources.

Reuses ``compile_check.py``'s driver stand-in (launches become compile-only warm-ups) and drives
:func:`dspark_markov.verify.triton_filtering.launch_top_k_top_p` on ``meta`` tensors at
V = 129,280 in both layouts, every kernel/phase variant the GPU will build (per-row and scalar
``k``/``p``, in place and out of place), printing registers, spill bytes and shared memory from
``ptxas -v``.

Usage: ``PYTHONPATH=src /work/venv36/bin/python tools/compile_filter.py`` (Triton 3.6, the GPU
machine's version).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_check  # noqa: E402  (the driver stand-in and the ptxas report)

from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

VOCAB = 129_280


def _variants():
    rows = 6
    logits = torch.empty(rows, VOCAB, dtype=torch.float32, device="meta")
    out = torch.empty_like(logits)
    k_rows = torch.empty(rows, dtype=torch.int64, device="meta")
    p_rows = torch.empty(rows, dtype=torch.float32, device="meta")
    for label, k, p, target in (("k+p per row, out of place", k_rows, p_rows, out),
                                ("k+p per row, in place", k_rows, p_rows, logits),
                                ("scalar k only", 50, None, out), ("scalar p only", None, 0.9, out)):
        for chunks in (1, 31):
            yield f"{label}, chunks={chunks}", logits, k, p, target, chunks


_RESOURCES = {}


def _compile_only(self, *args, grid, warmup, **kwargs):
    """compile_check's compile-only launch, keyed by kernel, warps and phase."""
    kernel = compile_check._original_run(self, *args, grid=grid, warmup=True, **kwargs)
    if kernel is not None:
        kernel._init_handles = lambda: None
        key = (self.fn.__name__, kwargs.get("num_warps", 4), kwargs.get("PHASE", "-"), kwargs.get("SHIFT", "-"))
        _RESOURCES[key] = compile_check._resources(kernel)
    return kernel


def main():
    driver.set_active(compile_check._CompileOnlyDriver())
    JITFunction.run = _compile_only
    from dspark_markov.verify import triton_filtering as ft

    failures = 0
    for label, logits, k, p, target, chunks in _variants():
        try:
            ft.launch_top_k_top_p(logits, k, p, target, block=ft.GPU_BLOCK, chunks=chunks, sort_size=ft.SORT_LARGE)
            print("ok  ", label)
        except Exception as error:  # report every failure, then exit non-zero
            failures += 1
            print("FAIL", label, f"{type(error).__name__}: {error}"[:3000])
    print("kernel resources (sm_90a, ptxas -v; the last variant compiled per kernel/warps/phase/shift):")
    for (name, warps, phase, shift), (regs, spills, shared) in sorted(_RESOURCES.items(), key=str):
        print(f"       {name} warps={warps} phase={phase} shift={shift}: registers {regs} spill bytes {spills} "
              f"shared {shared}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
