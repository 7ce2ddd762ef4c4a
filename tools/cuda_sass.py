"""Dump or compare the SASS of the CUDA C++ kernels per function, built with NVRTC for sm_90 without a GPU.

Moving helpers of a GPU-verified kernel into a shared header (``cuda/common.cuh``) must change none of its
functions: build each source of both trees with the GPU machine's NVRTC (13.0; ``DSPARK_MARKOV_NVRTC`` points at
a ``libnvrtc.so.13``, e.g. the ``nvidia-cuda-nvrtc`` cu13 wheel's) through ``cuda.build.compile_cubin`` (the
options the backends use), split ``cuobjdump -sass`` by function and compare the instruction lists (addresses
dropped), so that another function order in the cubin does not count. ~30-60 s per tree on 2 cores.

Usage::

    DSPARK_MARKOV_NVRTC=/path/libnvrtc.so.13 PYTHONPATH=<old tree>/src /work/venv-t36/bin/python tools/cuda_sass.py dump old.json
    DSPARK_MARKOV_NVRTC=/path/libnvrtc.so.13 PYTHONPATH=src /work/venv-t36/bin/python tools/cuda_sass.py dump new.json
    python tools/cuda_sass.py compare old.json new.json     # per source: IDENTICAL / DIFFERS per function

(review5, 2026-12-04: blocks.cu 25/25 and chain.cu 16/16 functions identical between a062686 and the header move.
Stop 29, 2026-12-05: filter.cu's three builds (resident, -DDF_L2_ROWS, -DDF_L2_ROWS -DDF_C=4) added to the list; all
five identical between a9d3421 and FLAG_PERSIST's change, which moved prefetch_l2_bulk into common.cuh.)
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from filter_sass import cuobjdump, instructions, main  # noqa: E402  (the same SASS listing and command line)

# The GPU-verified CUDA builds: (source, defines); filter.cu in its three builds (verify/cuda_filtering.py: resident,
# the L2-row build, the 4-block L2-row build). wide.cu is opt-in and left out.
SOURCES = (("blocks.cu", ()), ("chain.cu", ()), ("filter.cu", ()), ("filter.cu", ("DF_L2_ROWS",)),
           ("filter.cu", ("DF_L2_ROWS", "DF_C=4")))
# Stop 49: the filter's FLAG_SPECIALIZE builds (-DDF_FIXED_FLAGS: the resident build's kernel flags, the L2-row
# build's at 8 blocks) of 508479 (the flags measured first with specialization), of 510527 (with DEEP_REFINE) and of
# the default 1559103 (its resident build with SPLIT_FINAL, 1263647; its L2-row build is 510527's, 247839); the flags
# are spelled out so that two trees build the same variants (an option added to one tree's KERNEL_FLAGS but left out of
# these must leave them unchanged).
SPECIALIZED = (("filter.cu", ("DF_FIXED_FLAGS=213023",)), ("filter.cu", ("DF_L2_ROWS", "DF_FIXED_FLAGS=245791")),
               ("filter.cu", ("DF_FIXED_FLAGS=215071",)), ("filter.cu", ("DF_L2_ROWS", "DF_FIXED_FLAGS=247839")),
               ("filter.cu", ("DF_FIXED_FLAGS=1263647",)))


def dump(path):
    from dspark_markov.cuda import build  # noqa: PLC0415

    listing = {}
    for source, defines in SOURCES + SPECIALIZED:
        cubin, _ = build.compile_cubin(source, extra_options=[f"-D{define}" for define in defines])
        parts = re.split(r"\n\s*Function : (\S+)", cuobjdump(cubin))
        key = " ".join((source, *(f"-D{define}" for define in defines)))
        listing[key] = {name: instructions(body) for name, body in zip(parts[1::2], parts[2::2])}
        print(f"{key}: {len(listing[key])} functions", flush=True)
    with open(path, "w") as out:
        json.dump(listing, out)


def compare(old_path, new_path):
    old, new = json.load(open(old_path)), json.load(open(new_path))
    same = True
    for source in sorted(set(old) | set(new)):
        a, b = old.get(source, {}), new.get(source, {})
        for name in sorted(set(a) | set(b)):
            equal = a.get(name) == b.get(name)
            same &= equal
            print(f"{'IDENTICAL' if equal else 'DIFFERS':9s} {source} {name}: "
                  f"{len(a.get(name) or [])} / {len(b.get(name) or [])} instructions")
    return 0 if same else 1


if __name__ == "__main__":
    main(sys.argv, dump, compare, __doc__)
