"""Compile the top-k/top-p filter kernels for sm_90 without a GPU and print their resources.

Reuses ``compile_check.py``'s driver stand-in (launches become compile-only warm-ups) and drives
:class:`dspark_markov.verify.triton_filtering.TopKTopPFilter` on ``meta`` tensors at
V = 129,280 in both layouts, every kernel/pass variant the GPU will build (per-row and scalar
``k``/``p``, in place and out of place), printing registers, stack (spill) bytes and shared memory
from ``cuobjdump --dump-resource-usage`` of each cubin.

Usage: ``PYTHONPATH=src python tools/compile_filter.py`` with the GPU machine's Triton (3.6) if
possible; a newer one catches most errors too.
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
                                ("scalar k only", 50, None, out), ("scalar p only", None, 0.9, out),
                                ("p per row, in place, approx", None, p_rows, logits),
                                ("p per row, in place, sweep_raw", None, p_rows, logits)):
        for chunks in (1, 31):
            yield f"{label}, chunks={chunks}", logits, k, p, target, chunks


_RESOURCES = {}


def _cubin_resources(kernel):
    """(registers, stack bytes, shared bytes) from ``cuobjdump --dump-resource-usage`` of the cubin
    (works whatever PTX version Triton emits; compile_check's ptxas report needs a matching ptxas)."""
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(compile_check.triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as handle:
        handle.write(kernel.asm["cubin"])
    report = subprocess.run([tool, "--dump-resource-usage", handle.name], capture_output=True, text=True).stdout
    os.unlink(handle.name)
    registers = re.search(r"REG:(\d+)", report)
    stack = re.search(r"STACK:(\d+)", report)
    return (int(registers.group(1)) if registers else None, int(stack.group(1)) if stack else None,
            kernel.metadata.shared)


def _compile_only(self, *args, grid, warmup, **kwargs):
    """compile_check's compile-only launch, keyed by kernel, warps and phase."""
    kernel = compile_check._original_run(self, *args, grid=grid, warmup=True, **kwargs)
    if kernel is not None:
        kernel._init_handles = lambda: None
        key = (self.fn.__name__, kwargs.get("num_warps", 4), kwargs.get("PASS", "-"),
               kwargs.get("MASS", kwargs.get("ROUNDS", "-")), kwargs.get("APPROX", "-"))
        _RESOURCES[key] = _cubin_resources(kernel)
    return kernel


def main():
    driver.set_active(compile_check._CompileOnlyDriver())
    JITFunction.run = _compile_only
    from dspark_markov.verify import triton_filtering as ft

    failures = 0
    for label, logits, k, p, target, chunks in _variants():
        try:
            filt = ft.TopKTopPFilter(logits.shape[0], VOCAB, "meta", block=ft.GPU_BLOCK, chunks=chunks,
                                     capacity=ft.GPU_CAPACITY)
            filt.warps = ft.WARPS  # a meta-device filter would take the CPU's 4 warps
            if hasattr(ft, "RESOLVE_WARPS"):
                filt.resolve_warps = ft.RESOLVE_WARPS
            filt.approx = "approx" in label  # (a meta-device filter would not take it)
            filt.sweep_raw = "sweep_raw" in label
            if filt.approx:
                filt.finish_options = {"maxnreg": ft.FINISH_MAX_REGISTERS}
            filt.filter(logits, k, p, target)
            print("ok  ", label)
        except Exception as error:  # report every failure, then exit non-zero
            failures += 1
            cause = error
            while cause.__cause__ is not None:  # Triton's CompilationError names the call site; the cause says why
                cause = cause.__cause__
            print("FAIL", label, f"{type(error).__name__}: {error}"[:1500], f"\n     cause: {cause!r}"[-1200:])
    print("kernel resources (sm_90a, cuobjdump; the last variant compiled per kernel/warps/pass/mass or rounds):")
    for (name, warps, kind, mass, approx), (regs, stack, shared) in sorted(_RESOURCES.items(), key=str):
        print(f"       {name} warps={warps} pass={kind} mass={mass} approx={approx}: registers {regs} stack bytes "
              f"{stack} shared {shared}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
