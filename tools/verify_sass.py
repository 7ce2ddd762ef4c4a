"""Dump or compare the SASS of ``StreamVerifier``'s default kernel, compiled for sm_90 without a GPU.

A change of ``verify/triton_verify_stream.py`` that must not change the default verifier (options added while
no GPU was available) is checked instruction for instruction, as ``tools/filter_sass.py`` does for the filter:
compile both trees with the GPU machine's Triton (3.6, the side venv) on ``meta`` tensors through
``compile_check.py``'s compile-only driver, for every default launch shape of the benchmark (V = 129,280,
K = 3 and 5, 1 / 16 / 64 / 253 requests; standard and block; pre-divided and raw logits; with and without
greedy flags: 64 variants, ~2-3 min per tree on 2 cores), and compare the ``cuobjdump -sass`` instruction lists
(addresses dropped), with the stack frame and the opcode counts that changed.

Usage::

    PYTHONPATH=<old tree>/src /work/venv-t36/bin/python tools/verify_sass.py dump old.json
    PYTHONPATH=src /work/venv-t36/bin/python tools/verify_sass.py dump new.json
    python tools/verify_sass.py compare old.json new.json     # IDENTICAL / DIFFERS per variant

(review5, 2026-12-04: the early-stop change kept the default's loads, their widths and 80 registers, but none
of the 64 variants was identical to a062686's, the H200-verified kernel.)
"""

import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from filter_sass import cuobjdump, instructions, main  # noqa: E402  (the same SASS listing and command line)

VOCAB = 129_280


def dump(path):
    import compile_check  # noqa: PLC0415  (the driver stand-in; tools/ is on the path, above)
    import torch  # noqa: PLC0415
    from triton.runtime import driver  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    label, cubins = [None], {}

    def run(self, *args, grid, warmup, **kwargs):
        kernel = compile_check._original_run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            kernel._init_handles = lambda: None
            cubins[label[0]] = kernel.asm["cubin"]
        return kernel

    driver.set_active(compile_check._CompileOnlyDriver())
    JITFunction.run = run
    from dspark_markov.verify.triton_verify_stream import StreamVerifier  # noqa: PLC0415

    meta = torch.device("meta")
    for k in (3, 5):
        for rows in (1, 16, 64, 253):
            verifier = StreamVerifier(256, k, VOCAB, meta)  # the defaults (a meta device compiles the GPU paths)
            args = (torch.empty(rows, k + 1, VOCAB, device=meta), torch.empty(rows, k, dtype=torch.int64, device=meta),
                    torch.empty(rows, k, VOCAB, dtype=torch.bfloat16, device=meta),
                    *[torch.empty(rows, dtype=torch.int64, device=meta) for _ in range(3)],
                    torch.empty(rows, device=meta), torch.empty(rows, dtype=torch.int64, device=meta))
            for method in ("standard", "block"):
                for raw in (False, True):
                    for greedy in (False, True):
                        label[0] = f"k={k} rows={rows} {method} raw={raw} greedy={greedy}"
                        flags = torch.empty(rows, dtype=torch.bool, device=meta) if greedy else None
                        verifier.run(*args, flags, method=method, target_temperature=args[6] if raw else None)
    listing = {key: {"sass": instructions(cuobjdump(cubin)),
                     "resources": " ".join(re.findall(r"(?:REG|STACK|LOCAL):\d+", cuobjdump(cubin, "--dump-resource-usage")))}
               for key, cubin in cubins.items()}
    with open(path, "w") as out:
        json.dump(listing, out)
    print(f"{len(listing)} kernel variants written to {path}")


def _opcodes(sass):
    return collections.Counter(line.split()[1] if line.startswith("@") else line.split()[0] for line in sass)


def compare(old_path, new_path):
    old, new = json.load(open(old_path)), json.load(open(new_path))
    same = True
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            same = False
            print(f"MISSING   {key}: only in {'new' if a is None else 'old'}")
            continue
        equal = a["sass"] == b["sass"]
        same &= equal
        line = f"{'IDENTICAL' if equal else 'DIFFERS':9s} {key}: {len(a['sass'])} / {len(b['sass'])} instructions"
        if not equal:
            ca, cb = _opcodes(a["sass"]), _opcodes(b["sass"])
            moved = {op: cb[op] - ca[op] for op in sorted(set(ca) | set(cb)) if ca[op] != cb[op]}
            line += f"; {a['resources']} -> {b['resources']}; opcodes {moved}"
        print(line)
    return 0 if same else 1


if __name__ == "__main__":
    main(sys.argv, dump, compare, __doc__)
