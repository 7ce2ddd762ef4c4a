"""Compile every Triton kernel of the draft samplers for sm_90 on a machine without a GPU.

Triton's front end and ptxas run on the CPU; only the launch needs a GPU. This script installs a
driver stand-in that reports an sm_90 target, forces every launch into a compile-only warm-up, and
drives each backend on ``meta`` tensors at full DeepSeek-V4.1 shapes, so compile errors of the
GPU paths (which the interpreter never sees) show up before any GPU time is spent.

Usage: ``PYTHONPATH=src python tools/compile_check.py [impl ...]`` with the Triton version of the
GPU machine installed (e.g. triton==3.6.0).
"""

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver
from triton.runtime.jit import JITFunction


class _CompileOnlyDriver(CudaDriver):
    def __init__(self):  # no libcuda: nothing is launched
        pass

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("meta")


_original_run = JITFunction.run


_COMPILED = {}


def _resources(kernel):
    """(registers, spill bytes, shared bytes) of a compiled kernel, from ptxas -v on its PTX."""
    import os
    import re
    import subprocess
    import tempfile

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(kernel.asm["ptx"])
    report = subprocess.run([ptxas, "-arch=sm_90a", "-v", handle.name, "-o", os.devnull],
                            capture_output=True, text=True).stderr
    os.unlink(handle.name)
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return (int(registers.group(1)) if registers else None, int(spills.group(1)) if spills else None,
            kernel.metadata.shared)


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _original_run(self, *args, grid=grid, warmup=True, **kwargs)
    if kernel is not None:
        kernel._init_handles = lambda: None  # nothing to load without a GPU
        _COMPILED[(self.fn.__name__, kwargs.get("num_warps", 4))] = _resources(kernel)
    return kernel


def main(impls):
    driver.set_active(_CompileOnlyDriver())
    JITFunction.run = _compile_only
    import dspark_markov as dm
    from dspark_markov import registry

    load = registry.load

    def load_on_meta(family, impl, argument="impl"):
        found = load(family, impl, argument)
        if family == "draft" and "meta" not in found.DEVICES:
            found.DEVICES = tuple(found.DEVICES) + ("meta",)
        return found

    registry.load = load_on_meta

    def resolve(impl):
        return load_on_meta("draft", impl)

    vocab, rank, steps = 129_280, 256, 5
    failures = 0
    for impl, method in impls:
        for weight_dtype, cache_dtype, rows in ((torch.bfloat16, torch.bfloat16, 1), (torch.bfloat16, torch.float32, 253),
                                                (torch.float32, torch.bfloat16, 16)):
            rows = min(rows, resolve(impl).MAX_ROWS or rows)  # chain takes small batches only
            head = dm.MarkovHead(torch.empty(vocab, rank, dtype=weight_dtype, device="meta"),
                                 torch.empty(vocab, rank, dtype=weight_dtype, device="meta"))
            args = [torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="meta"),
                    torch.empty(rows, dtype=torch.int64, device="meta"),
                    torch.empty(rows * steps, dtype=torch.int64, device="meta"),
                    torch.empty(rows * steps, dtype=torch.int64, device="meta"),
                    torch.empty(rows, dtype=torch.float32, device="meta"),
                    torch.empty(rows, dtype=torch.int64, device="meta")]
            label = f"{impl}/{method} w={weight_dtype} cache={cache_dtype} rows={rows}"
            try:
                sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, method=method, impl=impl)
                sampler.sample(*args, logits_cache=torch.empty(rows, steps, vocab, dtype=cache_dtype, device="meta"),
                               check_values=False)
                print("ok  ", label)
                for (name, warps), (regs, spills, shared) in sorted(_COMPILED.items()):
                    print(f"       {name} warps={warps}: registers {regs} spill bytes {spills} shared {shared}")
                _COMPILED.clear()
            except Exception as error:  # report every failure, then exit non-zero
                failures += 1
                print("FAIL", label, f"{type(error).__name__}: {error}"[:3000])
    return 1 if failures else 0


if __name__ == "__main__":
    names = sys.argv[1:] or ["loop", "gumbel_fused", "inverse_cdf", "fused", "fused:inverse_cdf"]
    pairs = []
    for name in names:
        impl, _, method = name.partition(":")
        pairs.append((impl, method or ("inverse_cdf" if impl == "inverse_cdf" else "gumbel")))
    sys.exit(main(pairs))
