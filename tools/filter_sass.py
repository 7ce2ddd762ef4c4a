"""Dump or compare the SASS of the top-k/top-p filter's default kernels, compiled for sm_90 without a GPU.

A refactoring of ``verify/triton_filtering.py`` that must not change the default filter (issue 16, filter5:
options added, pre-session options deleted while no GPU was available) is checked instruction for
instruction: compile both trees with the GPU machine's Triton (3.6, the side venv) on ``meta`` tensors
through ``compile_check.py``'s compile-only driver, at 6 and 1518 rows of V = 129,280 (split and row
layouts, the finish with and without its register cap), every default call shape (k + p per row, p per
row, scalar k, scalar p; in place), and compare the ``cuobjdump -sass`` instruction lists (addresses
dropped).

Usage::

    PYTHONPATH=<old tree>/src /work/venv-t36/bin/python tools/filter_sass.py dump old.json
    PYTHONPATH=src /work/venv-t36/bin/python tools/filter_sass.py dump new.json
    python tools/filter_sass.py compare old.json new.json     # IDENTICAL / DIFFERS per kernel variant
"""

import json
import os
import re
import subprocess
import sys
import tempfile

VOCAB = 129_280


def cuobjdump_tool():
    """The path of the ``cuobjdump`` in the running Triton's package (it may be absent: check before use)."""
    import triton  # noqa: PLC0415

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def cuobjdump(cubin, option="-sass"):
    """``cuobjdump OPTION`` of one cubin (the copy in the running Triton's package)."""
    tool = cuobjdump_tool()
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as handle:
        handle.write(cubin)
    try:
        return subprocess.run([tool, option, handle.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(handle.name)


def instructions(sass):
    """The instructions of a ``cuobjdump -sass`` listing, addresses dropped (five-digit addresses included)."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]


def main(argv, dump, compare, usage):
    """``dump PATH`` or ``compare OLD NEW`` (exit status 1 where a variant differs)."""
    if len(argv) == 3 and argv[1] == "dump":
        dump(argv[2])
    elif len(argv) == 4 and argv[1] == "compare":
        sys.exit(compare(argv[2], argv[3]))
    else:
        sys.exit(usage)


def dump(path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import compile_check  # noqa: PLC0415  (the driver stand-in)
    import torch  # noqa: PLC0415
    from triton.runtime import driver  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    cubins = {}

    def run(self, *args, grid, warmup, **kwargs):
        kernel = compile_check._original_run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            kernel._init_handles = lambda: None
            key = (self.fn.__name__, kwargs.get("num_warps", 4), kwargs.get("MASS", "-"), kwargs.get("K_PER_ROW", "-"),
                   kwargs.get("P_PER_ROW", "-"), kwargs.get("K_GIVEN", "-"), kwargs.get("IN_PLACE", "-"),
                   bool(kwargs.get("maxnreg")))
            cubins.setdefault(str(key), kernel.asm["cubin"])
        return kernel

    driver.set_active(compile_check._CompileOnlyDriver())
    JITFunction.run = run
    from dspark_markov.verify import triton_filtering as ft  # noqa: PLC0415

    for rows in (6, 1518):
        logits = torch.empty(rows, VOCAB, dtype=torch.float32, device="meta")
        k_rows = torch.empty(rows, dtype=torch.int64, device="meta")
        p_rows = torch.empty(rows, dtype=torch.float32, device="meta")
        for k, p in ((k_rows, p_rows), (None, p_rows), (50, None), (None, 0.9)):
            for chunks in (1, 31):
                filt = ft.TopKTopPFilter(rows, VOCAB, "meta", block=ft.GPU_BLOCK, chunks=chunks,
                                         capacity=ft.GPU_CAPACITY)
                filt.warps = ft.WARPS  # a meta-device filter would take the CPU's 4 warps
                filt.resolve_warps = ft.RESOLVE_WARPS
                if rows > ft.WIDE_ROWS:
                    filt.finish_options = {"maxnreg": ft.FINISH_MAX_REGISTERS}
                filt.filter(logits, k, p, logits)
    listing = {key: instructions(cuobjdump(cubin)) for key, cubin in cubins.items()}
    with open(path, "w") as out:
        json.dump(listing, out)
    print(f"{len(listing)} kernel variants written to {path}")


def compare(old_path, new_path):
    old, new = json.load(open(old_path)), json.load(open(new_path))
    same = True
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        status = "IDENTICAL" if a == b else "DIFFERS"
        same &= a == b
        print(f"{status:9s} {key}: {len(a or [])} / {len(b or [])} instructions")
    return 0 if same else 1


if __name__ == "__main__":
    main(sys.argv, dump, compare, __doc__)
