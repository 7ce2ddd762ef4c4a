"""Small stand-ins for the vLLM internals that vLLM 0.33.0's filter and rejection sampler import.

``tools/extract_vllm.py`` copies this file into ``.vllm-cache/vllm-0.33.0/`` beside the standalone
copies of ``topk_topp_triton.py`` (the Qrita top-k/top-p filter) and ``rejection_sampler_utils.py``
(the GPU rejection sampler), whose vLLM import lines it points here (``from vllm_standins import
...``). Only the Triton kernels and their launchers are vLLM's; what is below is ours and does the
least that those launchers need on a machine without vLLM:

- ``triton_kernel_dispatcher_with_warmup(kernel=..., warmup_inputs=...)``: turns a dispatch
  function (its inputs -> ``(grid, launch kwargs)``) into a launcher that binds the dispatch's
  inputs to the kernel's arguments by name (:func:`binding_plan`, the rule of vLLM's launch binding)
  and launches ``kernel[grid](**kwargs)``. vLLM's ahead-of-time warmup (compiling every variant at
  start-up) is not reproduced: ``warmup_inputs`` is kept but never called, so the first call of a
  variant compiles it (do it before a CUDA-graph capture or a timing);
- ``WarmupChoices``, ``WarmupIntRange``, ``_when``, ``TritonWarmupTensor``, ``DispatchSpec``: inert
  names that only the (never called) warmup-input functions use;
- ``current_platform.is_cuda_alike()`` (``torch.cuda.is_available()``), ``gpu_sync_allowed()`` (a
  null context), ``next_power_of_2``, ``num_compute_units``;
- ``compute_fly_entropy`` and ``philox_gumbel_block_argmax``: FLy verification and watermarking,
  not extracted. The first raises when called (``fly_window_size > 0``); the second is a Triton
  function that fails the compile if a kernel is specialised with ``WATERMARK=True``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

# A dispatch function returns ``(grid, launch kwargs)`` or ``(grid, launch kwargs, outputs)``.
DispatchSpec = tuple
CPU_COMPUTE_UNITS = max(1, os.cpu_count() or 1)  # "SMs" of a CPU device (Triton's interpreter)


# ------------------------------------------------------------------------------ warmup (inert)
class WarmupChoices:
    """A set of values a warmup input ranges over (recorded only; warmup is not run here)."""

    def __init__(self, *choices):
        self.choices = choices

    def __getitem__(self, index):
        return WarmupChoices(*(choice[index] for choice in self.choices))


class WarmupIntRange:
    """The integers ``[start, stop)`` a warmup input ranges over (recorded only)."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = int(start), int(stop)


def _when(condition) -> None:
    """A warmup-case filter; nothing to filter without warmup."""
    return None


class TritonWarmupTensor(NamedTuple):
    """A tensor's metadata in a warmup case (recorded only)."""

    dtype: Any
    aligned: bool = True
    shape: tuple = (1,)
    strides: Any = None
    init: Any = 0


# ------------------------------------------------------------------------------ launch binding
class BindingPlan(NamedTuple):
    """Where a dispatch's inputs go among a kernel's arguments.

    ``inputs``: ``(input index, kernel argument)`` pairs; ``strides``: ``(kernel argument, source
    argument, dim)`` triples, the argument being ``source.stride(dim)``.
    """

    inputs: tuple
    strides: tuple


def _argument_for(name: str, kernel_args: frozenset):
    """The kernel argument a dispatch input ``name`` feeds: ``name``, ``name_ptr``, ``NAME`` or
    ``NAME_PTR``, the first that the kernel has; ``None`` when it has none."""
    for candidate in (name, name + "_ptr", name.upper(), name.upper() + "_PTR"):
        if candidate in kernel_args:
            return candidate
    return None


def _stride_source(argument: str):
    """``(base, dim, pointer name)`` of a stride argument ``<base>_stride[_<d>]`` or
    ``<base>_STRIDE[_<d>]`` (dim 0 when no ``_<d>``), else ``None``. The lower-case marker is looked
    for first; a marker followed by anything but ``_<digits>`` names no stride."""
    for marker, pointer_suffix in (("_stride", "_ptr"), ("_STRIDE", "_PTR")):
        base, found, tail = argument.rpartition(marker)
        if not found:
            continue
        tail = tail[1:] if tail.startswith("_") else tail
        if tail == "" or tail.isdigit():
            return base, int(tail or 0), base + pointer_suffix
        return None
    return None


@functools.lru_cache(maxsize=None)
def binding_plan(kernel_args: tuple, input_names: tuple, launch_names: tuple) -> BindingPlan:
    """How a launcher fills a kernel's arguments (``kernel_args``, in order) from a dispatch's
    inputs (``input_names``) beyond the launch kwargs the dispatch returned (``launch_names``).

    1. Each input goes to the argument :func:`_argument_for` finds, unless the dispatch set that
       argument itself.
    2. Each argument still unset that names a stride (:func:`_stride_source`) takes the stride of
       the bound argument ``<base>`` (or ``<base>_ptr`` / ``<base>_PTR``) along ``dim``.
    """
    args = frozenset(kernel_args)
    launched = frozenset(launch_names)
    inputs = []
    for index, name in enumerate(input_names):
        target = _argument_for(name, args)
        if target is not None and target not in launched:
            inputs.append((index, target))
    bound = launched | {target for _, target in inputs}
    strides = []
    for argument in kernel_args:
        if argument in bound:
            continue
        parsed = _stride_source(argument)
        if parsed is None:
            continue
        base, dim, pointer = parsed
        source = base if base in bound else pointer
        if source in bound:
            strides.append((argument, source, dim))
    return BindingPlan(tuple(inputs), tuple(strides))


def kernel_arg_names(kernel) -> tuple:
    """A Triton kernel's argument names (``JITFunction.arg_names``, else its Python signature)."""
    names = getattr(kernel, "arg_names", None)
    if names is not None:
        return tuple(names)
    function = getattr(kernel, "fn", None) or kernel
    return tuple(inspect.signature(function).parameters)


def bind_launch(kernel_args: tuple, inputs: dict, launch_kwargs: dict) -> dict:
    """The kwargs of one launch: ``launch_kwargs`` plus the dispatch ``inputs`` (name -> value)
    bound by :func:`binding_plan` (tensors' strides read where a stride argument asks for one)."""
    names, values = tuple(inputs), tuple(inputs.values())
    plan = binding_plan(tuple(kernel_args), names, tuple(launch_kwargs))
    kwargs = dict(launch_kwargs)
    for index, target in plan.inputs:
        kwargs[target] = values[index]
    for target, source, dim in plan.strides:
        kwargs[target] = kwargs[source].stride(dim)
    return kwargs


class DispatchedKernel:
    """A Triton kernel launched through a dispatch function (see the module docstring)."""

    def __init__(self, kernel, dispatch, warmup_inputs):
        self.kernel = kernel
        self.dispatch = dispatch
        self.warmup_inputs = warmup_inputs  # kept for reference; warmup is not run
        self.signature = inspect.signature(dispatch)
        functools.update_wrapper(self, dispatch, updated=())

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        spec = self.dispatch(*bound.args, **bound.kwargs)
        if len(spec) not in (2, 3):
            raise ValueError(f"{self.dispatch.__name__}: expected (grid, kwargs[, outputs]), got {len(spec)} items")
        grid, launch_kwargs = spec[0], spec[1]
        outputs = spec[2] if len(spec) == 3 else None
        kwargs = bind_launch(kernel_arg_names(self.kernel), dict(bound.arguments), dict(launch_kwargs))
        kernel = kwargs.pop("kernel", None) or self.kernel
        if grid is not None:
            kernel[grid](**kwargs)
        return outputs

    def __getitem__(self, grid):
        return self.kernel[grid]


class LaunchedKernel:
    """A native Triton kernel decorated without a dispatch: ``launcher(grid, *args, **kwargs)``."""

    def __init__(self, kernel, warmup_inputs):
        self.kernel = kernel
        self.warmup_inputs = warmup_inputs
        functools.update_wrapper(self, kernel, updated=())

    def __call__(self, grid, *args, **kwargs):
        return self.kernel[grid](*args, **kwargs)

    def __getitem__(self, grid):
        return self.kernel[grid]


def triton_kernel_dispatcher_with_warmup(*, warmup_inputs, kernel=None):
    """Decorator: a dispatch function of ``kernel`` -> a launcher (:class:`DispatchedKernel`); with
    ``kernel=None`` the decorated function is the Triton kernel itself (:class:`LaunchedKernel`)."""

    def decorate(function):
        if kernel is None:
            return LaunchedKernel(function, warmup_inputs)
        return DispatchedKernel(kernel, function, warmup_inputs)

    return decorate


# ------------------------------------------------------------------------------ platform, utils
class _Platform:
    """The part of vLLM's ``current_platform`` the filter asks about."""

    @staticmethod
    def is_cuda_alike() -> bool:
        """True where a CUDA (or ROCm) device is usable, as vLLM's CUDA/ROCm platforms say.

        On a CPU-only machine (Triton's interpreter) False, so the filter's monolithic kernel also
        handles the top-p-only rows (its split pipeline runs on CUDA tensors only)."""
        return bool(torch.cuda.is_available())

    @property
    def device_type(self) -> str:
        return "cuda" if self.is_cuda_alike() else "cpu"


current_platform = _Platform()


def gpu_sync_allowed():
    """vLLM's sync-debug scope; nothing is checked here."""
    return contextlib.nullcontext()


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n < 1``)."""
    n = int(n)
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def num_compute_units(device_index: int | None = None) -> int:
    """Streaming multiprocessors of CUDA device ``device_index`` (``None``: the current one), or
    :data:`CPU_COMPUTE_UNITS` without CUDA."""
    if not torch.cuda.is_available():
        return CPU_COMPUTE_UNITS
    index = torch.cuda.current_device() if device_index is None else int(device_index)
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


# ------------------------------------------------------------------------------ not extracted
def compute_fly_entropy(*args, **kwargs):
    """FLy verification's entropy (vLLM ``v1.spec_decode.fly``): not extracted."""
    raise NotImplementedError("vllm_standins: FLy verification (fly_window_size > 0) is not extracted; "
                              "call rejection_sample with fly_window_size=0")


@triton.jit
def philox_gumbel_block_argmax(logits, mask, block_idx, contexts_row_ptr, key_0, key_1,
                               CONTEXT_WIDTH: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Watermarking's keyed draw (vLLM ``v1.worker.gpu.sample.watermark``): not extracted; a kernel
    specialised with ``WATERMARK=True`` fails to compile here."""
    tl.static_assert(False, "vllm_standins: watermarking is not extracted (call rejection_sample without contexts)")
    return tl.max(logits, axis=0, return_indices=True)
