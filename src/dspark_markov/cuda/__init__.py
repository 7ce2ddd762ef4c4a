"""CUDA C++ kernels of the package (sm_90), built at first use with NVRTC and cached on disk.

- ``noise.cuh``: keys, uniforms and Gumbel noise bit-identical to :mod:`dspark_markov.rng`
  (``__host__ __device__``: the CPU tests compile it as host C++ and compare bit for bit);
- ``chain.cu``: the persistent chain kernel of ``impl="cuda_chain"``
  (:mod:`dspark_markov.draft.cuda_chain`);
- ``blocks.cu``: the Gumbel block kernel of ``impl="cuda_gumbel"`` (:mod:`dspark_markov.draft.cuda_gumbel`)
  and the sweep that builds the noise upper-bound table (:func:`noise_table`, kept on disk);
- ``wide.cu``: the tensor-core large-batch kernels of ``impl="cuda_wide"`` (:mod:`dspark_markov.draft.cuda_wide`,
  which loads it; opt-in: exact, slower than ``wide`` / ``cuda_gumbel``), its declarations in ``wide.cuh``;
- ``wide_tc.cu``: ``cuda_wide(tensor_cores=True)``'s step on wgmma + TMA, built for sm_90a (same status);
- ``filter.cu``: the cluster-resident top-k / top-p filter of ``top_k_top_p(impl="cuda")``
  (:mod:`dspark_markov.verify.cuda_filtering`, which loads it; verified on the H200 2026-12-05; auto at one request);
- ``common.cuh``: helpers shared by the kernels (``mma.sync`` m16n8k16, bf16 rounding, the skip threshold,
  64-bit shuffles, streaming loads and stores); editing it changes every build key and the noise table's;
- :mod:`.build`: NVRTC and the CUDA driver through ``ctypes``, the disk cache.

:func:`availability` says whether these kernels can run here, and if not, why (for
``dspark-markov info`` and the backend's errors). Importing this package loads no library.
"""

from __future__ import annotations

import functools
import os

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


def load_kernels(source: str, names, device_index: int, defines=(), arch: str | None = None):
    """The functions ``names`` of ``source`` (a file of this package, built with the macros ``defines`` for ``arch``,
    default :data:`build.ARCH`) loaded on one device, compiled with NVRTC or read from the disk cache; the device's
    primary context (torch's) made current first."""
    import torch

    from . import build as _build

    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")  # the runtime makes the primary context current
        cubin = _build.cached_cubin(source, arch=arch or _build.ARCH, defines=defines)
        return _build.Kernels(cubin, names, device_index)


UNVERIFIED_ENV = "DSPARK_MARKOV_UNVERIFIED"  # comma-separated designs (or "1": all) allowed to run before their GPU tests


def unverified_reason(design: str, plan: str, status: str | None = None) -> str | None:
    """``None`` when :data:`UNVERIFIED_ENV` opts in to ``design`` (not validated for default use), else why it does
    not run; ``plan`` names the script of its GPU tests; ``status`` what is known of it (default: it has never run
    on a GPU)."""
    wanted = {name.strip() for name in os.environ.get(UNVERIFIED_ENV, "").split(",")}
    if "1" in wanted or design in wanted:
        return None
    status = status or "has not run on a GPU yet (written without device time)"
    return f"impl {design!r} {status} (its GPU tests: {plan}): set {UNVERIFIED_ENV}={design} to run it"


def head_reason(impl: str, head, rank: int | None = None) -> str | None:
    """Why the native design ``impl`` cannot draft from ``head``: its weights are not bf16, or (``rank`` given) of
    another rank; else ``None``. (``auto`` then runs the portable table; the design's constructor raises it.)"""
    import torch

    if head.dtype != torch.bfloat16:
        return f"impl '{impl}' needs bf16 weights, got {head.dtype}"
    if rank is not None and head.rank != rank:
        return f"impl '{impl}' needs rank {rank}, got {head.rank}"
    return None


def unavailable_reason(load, gate=None) -> str | None:
    """Why a design whose kernels ``load(device_index)`` builds and loads cannot run here, or ``None``:
    :func:`availability` without the chain's build, then ``gate()`` (e.g. an opt-in reason), then the build
    and load on the current GPU (cached on disk), whose ``BuildError`` is the reason."""
    import torch

    from . import build as _build

    why = availability(build=False) or (gate() if gate is not None else None)
    if why is None:
        try:
            load(torch.cuda.current_device())
        except _build.BuildError as error:
            return str(error)
    return why


@functools.lru_cache(maxsize=None)
def chain_kernels(device_index: int):
    """The loaded functions of ``chain.cu`` on one device (compiled or read from the disk cache)."""
    return load_kernels("chain.cu", CHAIN_KERNELS, device_index)


BLOCKS_KERNELS = tuple(f"dm_blocks_b{b}_c{c}_v{v}_s{s}" for b in (0, 1) for c in (0, 1) for v in (0, 1)
                       for s in (0, 1)) + tuple(f"dm_blocks_b0_c0_v1_s0_x{x}" for x in (1, 2, 3, 5, 7, 13, 15)) + (
    "dm_blocks_noise_table", "dm_blocks_table_floats")
TB_SIZE = 33 << 6  # noise.cuh DM_TB_SIZE (fp32 entries)


@functools.lru_cache(maxsize=None)
def blocks_kernels(device_index: int):
    """The loaded functions of ``blocks.cu`` (``impl="cuda_gumbel"``) on one device."""
    return load_kernels("blocks.cu", BLOCKS_KERNELS, device_index)


_noise_tables: dict = {}


def noise_table(device_index: int):
    """The noise upper-bound table ``[TB_SIZE]`` fp32 on one device (noise.cuh ``tb_bucket``).

    ``table[b]`` is the largest exact noise ``rng.gumbel32(rng.uniform32(h))`` over every hash ``h``
    of bucket ``b`` (-inf for an empty bucket), found by evaluating all 2^32 hashes on the GPU
    (``blocks.cu dm_blocks_noise_table``, ~10 s on an H200). The table depends only on noise.cuh's
    exact IEEE operations and the sweep kernel, so it is kept on disk beside the CUBINs, keyed by the
    text of blocks.cu and its headers and by ``TB_SIZE`` (an edit of either source sweeps again): a
    machine sweeps the hashes once per source version. ``tests/gpu/test_cuda_gumbel_gpu.py`` rebuilds it and compares.
    """
    import torch

    table = _noise_tables.get(device_index)
    if table is not None:
        return table
    path = noise_table_path()
    device = torch.device("cuda", device_index)
    if path.exists() and path.stat().st_size == TB_SIZE * 4:
        table = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).to(device)
    else:
        table = build_noise_table(device_index)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(table.cpu().numpy().tobytes())
            tmp.replace(path)
        except OSError:  # a read-only home: keep it in memory only
            pass
    _noise_tables[device_index] = table
    return table


def noise_table_path():
    """Where :func:`noise_table` keeps the table on disk: keyed by the text of blocks.cu (the sweep) and its headers
    (the noise) and by ``TB_SIZE`` (``tools/prebuild_noise_table.py`` writes the same file from a host sweep)."""
    import hashlib

    from . import build as _build

    texts = _build.sources("blocks.cu")
    material = "".join(f"{name}\0{texts[name]}\0" for name in sorted(texts)) + f"TB_SIZE={TB_SIZE}"
    key = hashlib.sha256(material.encode()).hexdigest()[:24]
    return _build.cache_dir() / f"noise_table-{key}.f32"


def build_noise_table(device_index: int):
    """Sweep all 2^32 hashes on the GPU into a fresh noise upper-bound table (see :func:`noise_table`)."""
    import ctypes

    import torch

    kernels = blocks_kernels(device_index)
    device = torch.device("cuda", device_index)
    with torch.cuda.device(device):
        words = torch.zeros(TB_SIZE, dtype=torch.int32, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        ptr = [ctypes.c_uint64(words.data_ptr())]
        kernels.launch("dm_blocks_noise_table", 4096, 256, 0, stream, ptr)
        kernels.launch("dm_blocks_table_floats", -(-TB_SIZE // 256), 256, 0, stream, ptr)
        torch.cuda.synchronize(device)
    return words.view(torch.float32)
