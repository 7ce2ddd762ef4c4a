"""CUDA C++ kernels of the package (sm_90), built at first use with NVRTC and cached on disk.

- ``noise.cuh``: keys, uniforms and Gumbel noise bit-identical to :mod:`dspark_markov.rng`
  (``__host__ __device__``: the CPU tests compile it as host C++ and compare bit for bit);
- ``chain.cu``: the persistent chain kernel of ``impl="cuda_chain"``
  (:mod:`dspark_markov.draft.cuda_chain`);
- :mod:`.build`: NVRTC and the CUDA driver through ``ctypes``, the disk cache.

:func:`availability` says whether these kernels can run here, and if not, why (for
``dspark-markov info`` and the backend's errors). Importing this package loads no library.
"""

from __future__ import annotations

import functools

REQUIRED_CAPABILITY = (9, 0)


def availability(device=None, build: bool = True) -> str | None:
    """``None`` if the CUDA kernels can run on ``device`` (default: the current GPU), else why not.

    Checks, in order: a CUDA GPU visible to torch, compute capability 9.0 (the kernels use sm_90
    features and are tuned for Hopper), an NVRTC library, the CUDA driver, and (``build=True``)
    that ``chain.cu`` compiles and loads (cached on disk after the first success).
    """
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        return f"needs a CUDA device, got {device}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = torch.cuda.get_device_capability(index)
    if tuple(capability) != REQUIRED_CAPABILITY:
        return f"needs compute capability 9.0 (Hopper, sm_90), got {capability[0]}.{capability[1]}"
    from . import build as _build

    try:
        _build.nvrtc()
        _build.driver()
        if build:
            chain_kernels(index)
    except _build.BuildError as error:
        return str(error)
    return None


# Compile-time variants of the 16-warp / one-register-tile kernel (chain.cu's V6 bits; draft/cuda_chain.py
# VARIANTS says what each is).
CHAIN_VARIANTS = (0, 11, 43, 107, 7275)
CHAIN_KERNELS = tuple(f"dm_chain_w{w}_r{r}_nt{nt}" for w, r in ((16, 0), (16, 1), (8, 3))
                      for nt in (1, 2)) + tuple(f"dm_chain_w16_r1_nt{nt}_v{v}" for v in CHAIN_VARIANTS[1:] for nt in (1, 2)) + (
                          "dm_noise_bound", "dm_noise_table")


@functools.lru_cache(maxsize=None)
def chain_kernels(device_index: int):
    """The loaded functions of ``chain.cu`` on one device (compiled or read from the disk cache)."""
    import torch

    from . import build as _build

    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")  # the runtime makes the primary context current
        return _build.Kernels(_build.cached_cubin("chain.cu"), CHAIN_KERNELS, device_index)
