"""Build and load the package's CUDA C++ kernels: NVRTC and the CUDA driver through ``ctypes``.

Why this toolchain (CONTRIBUTING.md, "CUDA kernels"): NVRTC compiles a kernel in a few seconds
with no toolkit, and ``libnvrtc`` ships with every CUDA build of torch (the ``nvidia-cuda-nvrtc``
wheel it depends on), so ``pip install -e .`` needs nothing new and a fresh GPU machine builds at
first use without nvcc or ninja. Calling NVRTC and the driver API (``libcuda``, from the driver)
through ``ctypes`` keeps even ``cuda-python`` optional, and the same code path compiles the
kernels for sm_90 on a CPU-only machine (the CPU test's compile check).

Compiled CUBINs are cached on disk, keyed by the SHA-256 of the sources, the options, the NVRTC
version and the architecture (``$DSPARK_MARKOV_CACHE``, default ``~/.cache/dspark_markov/cuda``).
The kernels use no headers (noise.cuh defines its own helpers), so NVRTC needs no include path.

Nothing here is imported by ``dspark_markov/__init__``; importing it loads no library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import site
import sys
import threading
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
ARCH = "sm_90"
# --fmad=false: no multiply-add contraction (the noise is bit-exact only without it; the bias
# GEMM uses mma and the approximate keys need no FMA either). -lineinfo for Nsight Compute.
OPTIONS = ("-std=c++17", "--fmad=false", "-lineinfo", "-default-device")


class BuildError(RuntimeError):
    """A kernel could not be compiled or loaded (the message says why, with NVRTC's log)."""


# --------------------------------------------------------------------------- NVRTC
def _nvrtc_candidates() -> list:
    found = []
    env = os.environ.get("DSPARK_MARKOV_NVRTC")
    if env:
        found.append(env)
    roots = list(sys.path)
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # some virtualenvs
        pass
    for root in roots:
        for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu*/lib/libnvrtc.so*"):
            found += sorted(p for p in glob.glob(os.path.join(root, pattern)) if "builtins" not in p
                            and ".alt." not in p)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    name = ctypes.util.find_library("nvrtc")
    if name:
        found.append(name)
    return found


_lock = threading.Lock()
_nvrtc = None
_nvrtc_error = None


def nvrtc():
    """The loaded ``libnvrtc`` (``ctypes.CDLL``); ``BuildError`` when none is found."""
    global _nvrtc, _nvrtc_error
    with _lock:
        if _nvrtc is None and _nvrtc_error is None:
            errors = []
            for path in _nvrtc_candidates():
                try:
                    # NVRTC opens libnvrtc-builtins by name: load the one beside it first.
                    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                        if ".alt." not in builtins:
                            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    lib = ctypes.CDLL(path)
                    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
                    _nvrtc = lib
                    break
                except OSError as error:
                    errors.append(f"{path}: {error}")
            if _nvrtc is None:
                _nvrtc_error = ("no NVRTC library (libnvrtc.so) found: install a CUDA build of torch (it brings "
                                "nvidia-cuda-nvrtc) or set DSPARK_MARKOV_NVRTC" + (f"; tried {errors}" if errors else ""))
        if _nvrtc is None:
            raise BuildError(_nvrtc_error)
        return _nvrtc


def nvrtc_version() -> tuple:
    lib = nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _check_nvrtc(lib, result, what, log=""):
    if result != 0:
        raise BuildError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(result).decode()}" + (f"\n{log}" if log else ""))


def sources(name: str = "chain.cu") -> dict:
    """``{file name: text}`` of a kernel source and the headers it includes (all in this folder)."""
    return {path.name: path.read_text() for path in sorted(SOURCE_DIR.glob("*.cu*")) if path.name == name
            or path.suffix == ".cuh"}


def compile_cubin(name: str = "chain.cu", arch: str = ARCH, extra_options=(), verbose: bool = False) -> tuple:
    """Compile ``name`` for ``arch`` with NVRTC; returns ``(cubin bytes, log)``.

    ``verbose`` passes ``-Xptxas -v``: the log then lists registers, shared memory and spills.
    """
    lib = nvrtc()
    files = sources(name)
    headers = [(k, v) for k, v in files.items() if k != name]
    prog = ctypes.c_void_p()
    enc = lambda s: s.encode()  # noqa: E731
    header_src = (ctypes.c_char_p * max(len(headers), 1))(*[enc(v) for _, v in headers])
    header_names = (ctypes.c_char_p * max(len(headers), 1))(*[enc(k) for k, _ in headers])
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), enc(files[name]), enc(name), len(headers),
                                             header_src, header_names), "nvrtcCreateProgram")
    try:
        options = [f"--gpu-architecture={arch}", *OPTIONS, *extra_options]
        if verbose:
            options.append("--ptxas-options=-v")
        opts = (ctypes.c_char_p * len(options))(*[enc(o) for o in options])
        result = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log_buf = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.value.decode(errors="replace")
        _check_nvrtc(lib, result, f"compilation of {name} for {arch}", log)
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_MARKOV_CACHE", Path.home() / ".cache" / "dspark_markov")) / "cuda"


def cached_cubin(name: str = "chain.cu", arch: str = ARCH, defines=()) -> bytes:
    """The CUBIN of ``name`` for ``arch``: from the disk cache, or compiled now and stored. ``defines``: macro names
    defined for this build (``-D``), a compile-time variant of the source with its own cache entry."""
    files = sources(name)
    defines = tuple(defines)
    key_items = (sorted(files.items()), arch, OPTIONS, nvrtc_version()) + ((defines,) if defines else ())
    key = hashlib.sha256(repr(key_items).encode()).hexdigest()[:24]
    path = cache_dir() / f"{Path(name).stem}-{arch}-{key}.cubin"
    if path.exists():
        return path.read_bytes()
    cubin, _ = compile_cubin(name, arch, extra_options=[f"-D{define}" for define in defines])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        tmp.replace(path)
    except OSError:  # a read-only home: keep the build in memory only
        pass
    return cubin


# --------------------------------------------------------------------------- the CUDA driver
_driver = None
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # percent of the unified L1 / shared memory as shared
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


def driver():
    """``libcuda`` (``ctypes.CDLL``), initialised; ``BuildError`` without a driver."""
    global _driver
    with _lock:
        if _driver is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as error:
                raise BuildError(f"no CUDA driver (libcuda.so.1): {error}") from error
            _check_cu(lib, lib.cuInit(0), "cuInit")
            _driver = lib
        return _driver


def _check_cu(lib, result, what):
    if result != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(text))
        raise BuildError(f"CUDA driver {what} failed ({result}: {(text.value or b'?').decode()})")


class _LaunchConfig(ctypes.Structure):
    """The driver's ``CUlaunchConfig`` (cuda.h): grid, block, dynamic shared memory, stream, launch attributes."""

    _fields_ = [(name, ctypes.c_uint) for name in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY",
                                                   "blockDimZ", "sharedMemBytes")] + [
        ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class Kernels:
    """The functions of one CUBIN loaded into the current device's primary context (torch's)."""

    def __init__(self, cubin: bytes, names, device_index: int):
        lib = driver()
        self.lib = lib
        ctx = ctypes.c_void_p()
        _check_cu(lib, lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:  # this thread has no context yet: use the device's primary one, as torch does
            dev = ctypes.c_int()
            _check_cu(lib, lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
            _check_cu(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            _check_cu(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        _check_cu(lib, lib.cuModuleLoadData(ctypes.byref(self.module), self._image), "cuModuleLoadData")
        self.functions = {}
        for name in names:
            fn = ctypes.c_void_p()
            _check_cu(lib, lib.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()),
                      f"cuModuleGetFunction({name})")
            self.functions[name] = fn
        # Under lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a function is loaded
        # at its first launch; a first launch inside a CUDA-graph capture would then run the loader (memory
        # allocation, synchronisation) inside the capture. Load every function now (cuFuncLoad, driver >= 12.4).
        load = getattr(lib, "cuFuncLoad", None)
        if load is not None:
            for name, fn in self.functions.items():
                _check_cu(lib, load(fn), f"cuFuncLoad({name})")

    def attribute(self, name: str, attribute: int) -> int:
        value = ctypes.c_int()
        _check_cu(self.lib, self.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, self.functions[name]),
                  "cuFuncGetAttribute")
        return value.value

    def set_dynamic_smem(self, name: str, nbytes: int) -> None:
        _check_cu(self.lib, self.lib.cuFuncSetAttribute(self.functions[name],
                                                        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                        int(nbytes)), f"cuFuncSetAttribute({name})")

    def set_attribute(self, name: str, attribute: int, value: int) -> None:
        """``cuFuncSetAttribute`` (e.g. :data:`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`)."""
        _check_cu(self.lib, self.lib.cuFuncSetAttribute(self.functions[name], int(attribute), int(value)),
                  f"cuFuncSetAttribute({name}, {attribute})")

    def blocks_per_sm(self, name: str, threads: int, smem: int) -> int:
        count = ctypes.c_int()
        _check_cu(self.lib, self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(count), self.functions[name], int(threads), ctypes.c_size_t(int(smem))),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return count.value

    def max_active_clusters(self, name: str, cluster: int, threads: int, smem: int) -> int:
        """``cuOccupancyMaxActiveClusters``: how many clusters of ``name`` (its compile-time ``__cluster_dims__`` of
        ``cluster`` blocks, ``threads`` each, ``smem`` bytes of dynamic shared memory) the device holds at once."""
        config = _LaunchConfig(gridDimX=int(cluster), gridDimY=1, gridDimZ=1, blockDimX=int(threads), blockDimY=1,
                               blockDimZ=1, sharedMemBytes=int(smem), hStream=None, attrs=None, numAttrs=0)
        count = ctypes.c_int()
        _check_cu(self.lib, self.lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), self.functions[name],
                                                                  ctypes.byref(config)),
                  f"cuOccupancyMaxActiveClusters({name})")
        return count.value

    def launch(self, name: str, grid: int, threads: int, smem: int, stream: int, params) -> None:
        """Launch ``name`` on ``stream`` (a raw ``cudaStream_t``); ``params``: ctypes argument objects."""
        pointers = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in params])
        _check_cu(self.lib, self.lib.cuLaunchKernel(self.functions[name], int(grid), 1, 1, int(threads), 1, 1,
                                                    ctypes.c_uint(int(smem)), ctypes.c_void_p(stream), pointers,
                                                    None), f"cuLaunchKernel({name})")


# cuda.h enums of cuTensorMapEncodeTiled
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3


def tensor_map_bf16_2d(address: int, inner: int, outer: int, row_bytes: int, box_inner: int, box_outer: int):
    """A ``CUtensorMap`` (128 bytes, ``ctypes`` array of 16 uint64: pass it by value as a ``__grid_constant__``
    kernel parameter) of a 2-D bf16 tensor ``[outer, inner]`` at ``address`` with rows ``row_bytes`` apart, read by
    TMA in boxes ``[box_outer, box_inner]`` with the 128-byte swizzle (``box_inner`` * 2 must be 128) and zeros past
    the edges. ``BuildError`` from the driver's checks (alignment: address 16-byte, ``row_bytes`` a multiple of 16)."""
    lib = driver()
    # cuTensorMapEncodeTiled wants the map 64-byte aligned (CUDA 13's CUtensorMap is alignas(128)): ctypes gives 16;
    # a 128-byte aligned view into a larger buffer (from_buffer keeps the buffer alive)
    raw = (ctypes.c_uint8 * 255)()
    tensor_map = (ctypes.c_uint64 * 16).from_buffer(raw, (-ctypes.addressof(raw)) % 128)
    dims = (ctypes.c_uint64 * 2)(int(inner), int(outer))
    strides = (ctypes.c_uint64 * 1)(int(row_bytes))
    box = (ctypes.c_uint32 * 2)(int(box_inner), int(box_outer))
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    encode = getattr(lib, "cuTensorMapEncodeTiled", None)
    if encode is None:
        raise BuildError("this CUDA driver has no cuTensorMapEncodeTiled (TMA needs a CUDA 12 driver)")
    _check_cu(lib, encode(ctypes.byref(tensor_map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ctypes.c_void_p(int(address)),
                          dims, strides, box, element_strides, 0, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, 0), "cuTensorMapEncodeTiled")
    return tensor_map


def max_dynamic_smem(device_index: int) -> int:
    lib = driver()
    value, dev = ctypes.c_int(), ctypes.c_int()
    _check_cu(lib, lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    _check_cu(lib, lib.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                            dev), "cuDeviceGetAttribute")
    return value.value
