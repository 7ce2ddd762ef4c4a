"""Compile the one-launch verifier (``StreamVerifier``) for sm_90 without a GPU; print registers and spills.

Uses :mod:`compile_check`'s driver stand-in (Triton's front end and ptxas on the CPU, nothing
launched) on ``meta`` tensors at the benchmark's shapes (V = 129,280, K = 5, bf16 cache), for the
standard and raw modes of both methods. Run it with the GPU machine's Triton before a GPU round.

Usage: ``PYTHONPATH=src:tools /work/venv-t36/bin/python tools/compile_verify.py [option=value ...]``
(options are :class:`StreamVerifier` keyword arguments, integers, e.g. ``unroll=4 max_registers=72``;
``trace=1`` compiles the launch-trace variant; ``batch=16`` the launches of 16 requests instead of 253).
"""

import sys

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction

import compile_check


def main(argv):
    driver.set_active(compile_check._CompileOnlyDriver())
    JITFunction.run = compile_check._compile_only
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    options = {}
    for item in argv:
        key, _, value = item.partition("=")
        options[key] = int(value)
    traced = bool(options.pop("trace", 0))  # trace=1: the launch-trace variant (run(trace=))
    vocab, k, rows = 129_280, 5, options.pop("batch", 253)
    meta = torch.device("meta")
    verifier = StreamVerifier(rows, k, vocab, meta, **options)
    target = torch.empty(rows, k + 1, vocab, device=meta)
    args = (target, torch.empty(rows, k, dtype=torch.int64, device=meta),
            torch.empty(rows, k, vocab, dtype=torch.bfloat16, device=meta),
            torch.empty(rows, dtype=torch.int64, device=meta), torch.empty(rows, dtype=torch.int64, device=meta),
            torch.empty(rows, dtype=torch.int64, device=meta), torch.empty(rows, device=meta),
            torch.empty(rows, dtype=torch.int64, device=meta))
    failures = 0
    for method in ("standard", "block"):
        for raw in (False, True):
            label = f"{method} raw={raw} {options}"
            try:
                trace = (torch.empty(verifier.programs(rows, method, raw=raw), 4, dtype=torch.int64, device=meta)
                         if traced else None)
                verifier.run(*args, method=method, target_temperature=args[6] if raw else None, trace=trace)
                for (name, warps), (regs, spills, shared) in sorted(compile_check._COMPILED.items()):
                    print(f"ok   {label}: {name} warps={warps} registers {regs} spill bytes {spills} shared {shared}")
                compile_check._COMPILED.clear()
            except Exception as error:  # report every failure, then exit non-zero
                failures += 1
                print("FAIL", label, f"{type(error).__name__}: {error}"[:3000])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
