"""Build every CUDA C++ source of the package for sm_90 on a CPU machine, into a cache a GPU job then loads.

A GPU job otherwise spends device time on NVRTC (chain.cu ~10-30 s, blocks.cu ~30 s, wide.cu ~7 s, filter.cu ~1 s
on a fresh machine). ``cuda.build.cached_cubin`` keys a CUBIN by the sources, the options, the NVRTC version and
the architecture, so a cache built here with the GPU image's NVRTC (13.0: the ``nvidia-cuda-nvrtc`` cu13 wheel's
``libnvrtc.so.13``, through ``DSPARK_MARKOV_NVRTC``) is exactly what the GPU would build. ``tools/gpu_queue.sh``
points ``DSPARK_MARKOV_CACHE`` at ``gpu_jobs/cuda_cache`` (git-ignored; carry ``gpu_jobs``) when it exists. Any
edit of a ``.cu`` / ``.cuh`` afterwards changes the key: the GPU then builds that source itself (nothing stale is
ever loaded). The noise table (``cuda.noise_table``) is not built here (it needs the GPU's sweep, ~10-20 s).

Usage: ``DSPARK_MARKOV_NVRTC=/path/libnvrtc.so.13 PYTHONPATH=src python tools/prebuild_cubins.py [DIR]``
(default ``gpu_jobs/cuda_cache``); prints each source's key file and the NVRTC version.
"""

import os
import sys
import time
from pathlib import Path

SOURCES = ("chain.cu", "blocks.cu", "wide.cu", "filter.cu", "verify.cu")
WANTED_NVRTC = (13, 0)  # the H200 image's (torch 2.11+cu130)


def specialized(cf) -> list:
    """The filter builds a filter of ``cf.DEFAULT_FLAGS`` loads when those include FLAG_SPECIALIZE (the kernel flags
    compiled in, ``cf.compiled_flags``): the resident build and the L2-row build of every FLAG_L2_FIT size."""
    if not cf.DEFAULT_FLAGS & cf.FLAG_SPECIALIZE:
        return []
    fixed = (f"DF_FIXED_FLAGS={cf.compiled_flags(cf.DEFAULT_FLAGS, False)}",)
    fixed_l2 = (f"DF_FIXED_FLAGS={cf.compiled_flags(cf.DEFAULT_FLAGS, True)}",)
    return [("filter.cu", fixed)] + [("filter.cu", cf.l2_defines(size) + fixed_l2) for size in cf.L2_FIT_SIZES]


def main(argv) -> int:
    folder = Path(argv[1] if len(argv) > 1 else "gpu_jobs/cuda_cache").resolve()
    os.environ["DSPARK_MARKOV_CACHE"] = str(folder)  # cache_dir() = $DSPARK_MARKOV_CACHE/cuda
    from dspark_markov.cuda import build  # noqa: PLC0415  (after the environment is set)
    from dspark_markov.draft import cuda_wide  # noqa: PLC0415
    from dspark_markov.verify import cuda_filtering  # noqa: PLC0415

    # compile-time variants: the L2-row builds of filter.cu (cuda_filtering.L2_DEFINES, L2_C4_DEFINES), and each of
    # the three with FLAG_PERSIST's -DDF_PERSIST, and with FLAG_CARRY's -DDF_PERSIST -DDF_CARRY
    builds = ((), cuda_filtering.L2_DEFINES, cuda_filtering.L2_C4_DEFINES)
    variants = ([("filter.cu", d) for d in builds[1:]]
                + [("filter.cu", d + extra) for extra in (cuda_filtering.PERSIST_DEFINES, cuda_filtering.CARRY_DEFINES)
                   for d in builds]
                # FLAG_L2_FIT's other sizes (8 and 4 are above)
                + [("filter.cu", cuda_filtering.l2_defines(size)) for size in cuda_filtering.L2_FIT_SIZES
                   if size not in (cuda_filtering.CLUSTER, 4)]
                # FLAG_L2_FIVE's builds of every FLAG_L2_FIT size
                + [("filter.cu", cuda_filtering.l2_defines(size, five=True)) for size in cuda_filtering.L2_FIT_SIZES]
                # the default flags' FLAG_SPECIALIZE builds (stop 49): the resident one and the L2-row one of each size
                + specialized(cuda_filtering))

    version = build.nvrtc_version()
    if version != WANTED_NVRTC:
        print(f"prebuild_cubins: NVRTC {version} is not the GPU image's {WANTED_NVRTC}: its keys would not match "
              "(set DSPARK_MARKOV_NVRTC to a libnvrtc.so.13)", file=sys.stderr)
        return 2
    for name, defines in [(name, ()) for name in SOURCES] + list(variants):
        start = time.time()
        build.cached_cubin(name, defines=defines)
        print(f"{name} {' '.join(f'-D{d}' for d in defines)}: {time.time() - start:.1f} s", flush=True)
    # the architecture-specific target (wgmma / TMA): wide_tc.cu, one build per combination of cuda_wide's
    # tc_warpgroups and tc_fast_div
    arch = cuda_wide.TC_ARCH
    for name, defines in [("wide_tc.cu", cuda_wide.tc_defines(w, f)) for w in cuda_wide.TC_WARPGROUPS
                          for f in (False, True)]:
        start = time.time()
        build.cached_cubin(name, arch=arch, defines=defines)
        print(f"{name} ({arch}) {' '.join(f'-D{d}' for d in defines)}: {time.time() - start:.1f} s", flush=True)
    for path in sorted(build.cache_dir().glob("*.cubin")):
        print(path.name)
    print(f"NVRTC {version[0]}.{version[1]}, cache {build.cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
