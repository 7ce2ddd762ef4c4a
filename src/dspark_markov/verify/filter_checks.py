"""The arguments of a top-k / top-p filter call, checked (``filtering.top_k_top_p`` and the persistent filters'
``filter``: ``triton_filtering.TopKTopPFilter``, ``cuda_filtering.CudaTopKTopPFilter``): shapes, dtypes, devices,
strides and scalar values, on the host only (no synchronisation, no allocation: per-row tensors' values are read on
the device, semantics in ``filtering``'s module doc)."""

from __future__ import annotations

import math

import torch

from ..validate import check_apart, check_tensor, check_vector

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _per_row(name, value, rows, device, dtypes, kind, finite=False):
    if isinstance(value, torch.Tensor):
        check_vector(name, value, length=rows, dtypes=dtypes, device=device)  # contiguous: kernels read ptr + row
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected an int, a [B] int tensor or None, got {type(value).__name__}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a float, a [B] float32 tensor or None, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # (an int beyond the float range)
        raise ValueError(f"{name}: expected a float >= 0, got an int too large for a float") from None
    if math.isnan(number) or number < 0 or (finite and math.isinf(number)):
        raise ValueError(f"{name}: expected a {'finite ' if finite else ''}float >= 0, got {value}")
    if number > _FLOAT32_MAX:  # (fp32 rows: torch.full of it overflows)
        if finite:
            raise ValueError(f"{name}: expected a value within the float32 range, got {value}")
        number = math.inf  # p beyond fp32: top-p off, as any p >= 1
    return number


def check_arguments(logits, k, p, out, temperature=None):
    """Validate a filter call's arguments (shapes, dtypes, devices, strides, scalar values) without a host
    synchronisation or an allocation; return ``(k, p, temperature)`` with scalars normalised (``k`` clamped to
    ``[0, V]``, ``p`` beyond fp32 as ``inf``). ``out`` None: in place. Per-row tensors' values are read on the device
    (module doc). A wrong ``out`` is refused, never written past."""
    check_tensor("logits", logits, dim=2, dtypes=(torch.float32,), last_stride_one=True)
    rows, vocab = logits.shape
    if vocab < 1:
        raise ValueError(f"logits: expected V >= 1 columns, got shape {tuple(logits.shape)}")
    if vocab >= 2**31 - 1:
        raise ValueError(f"logits: expected fewer than 2^31 - 1 columns, got {vocab}")
    k = None if k is None else _per_row("k", k, rows, logits.device, (torch.int32, torch.int64), int)
    if isinstance(k, int):  # (k <= 0 and k >= V both mean no top-k: any int, however large, fits the kernels)
        k = min(max(k, 0), vocab)
    p = None if p is None else _per_row("p", p, rows, logits.device, (torch.float32,), float)
    if out is not None:
        check_tensor("out", out, shape=logits.shape, dtypes=(torch.float32,), device=logits.device,
                     last_stride_one=True)
        check_apart("out", out, "logits", logits)
    written = logits if out is None else out
    if rows > 1 and written.stride(0) < vocab:  # (an expanded row, stride 0: one row written by several)
        name = "logits" if out is None else "out"
        raise ValueError(f"{name}: rows overlap (stride {written.stride(0)} < V = {vocab}); the filter writes every row"
                         + ("; pass out= to filter them into separate rows" if out is None else ""))
    if temperature is not None:
        temperature = _per_row("temperature", temperature, rows, logits.device, (torch.float32,), float, finite=True)
    return k, p, temperature
