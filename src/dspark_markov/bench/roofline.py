"""The bytes model of the Markov draft step and the memory bandwidth it is measured against.

The *minimal* design moves, per draft step, W2 once (``V * R_k`` weight bytes), the step's base
logits once (``R * V`` logit bytes) and the cache once (``R * V`` cache bytes); ``N`` steps move
``N`` times that. W1 rows, the tokens and the per-row scalars are a few kilobytes and are left out.
A design that writes the bias to memory and reads it back, or that re-reads the logits to draw,
moves more; the ratio of this floor to a measured time is the fraction of bandwidth it achieves.

A second, lower floor (:func:`minimal_bytes_w2_once`) reads W2 once per *call* instead of once per
step: the bound of a design that keeps W2 on chip (shared memory, registers, L2) across the steps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .harness import median_time_us

# Buffer sizes of the bandwidth measurement: far larger than any L2 (H200: 60 MB), so every pass
# streams from HBM. On the CPU (the --device cpu reference run) smaller buffers keep it quick.
CUDA_COPY_BYTES = 1 << 30  # 1 GiB source + 1 GiB destination
CUDA_READ_BYTES = 2 << 30  # 2 GiB read by a reduction
CPU_COPY_BYTES = 64 << 20
CPU_READ_BYTES = 64 << 20


def minimal_bytes(vocab: int, rank: int, steps: int, rows: int, *, weight_bytes: int = 2, logit_bytes: int = 2,
                  cache_bytes: int = 2) -> int:
    """Bytes a minimal draft design must move for one whole call (all ``steps``).

    Per step: W2 read once (``vocab * rank * weight_bytes``), the base logits read once
    (``rows * vocab * logit_bytes``) and the cache written once (``rows * vocab * cache_bytes``).
    """
    for name, value in (("vocab", vocab), ("rank", rank), ("steps", steps), ("rows", rows)):
        if int(value) < 1:
            raise ValueError(f"{name}: expected >= 1, got {value}")
    for name, value in (("weight_bytes", weight_bytes), ("logit_bytes", logit_bytes), ("cache_bytes", cache_bytes)):
        if int(value) not in (1, 2, 4):
            raise ValueError(f"{name}: expected 1, 2 or 4 bytes per element, got {value}")
    per_step = vocab * rank * weight_bytes + rows * vocab * logit_bytes + rows * vocab * cache_bytes
    return int(steps) * per_step


def minimal_bytes_w2_once(vocab: int, rank: int, steps: int, rows: int, *, weight_bytes: int = 2,
                          logit_bytes: int = 2, cache_bytes: int = 2) -> int:
    """Bytes of the second floor: W2 read from HBM **once per call** (a chain that keeps it on chip
    across the steps), the base logits read once and the cache written once at every step.

    ``vocab * rank * weight_bytes + steps * rows * vocab * (logit_bytes + cache_bytes)``. The
    first step of a call must stream W2 from HBM (the target model evicts it between calls).
    """
    per_step = minimal_bytes(vocab, rank, 1, rows, weight_bytes=weight_bytes, logit_bytes=logit_bytes,
                             cache_bytes=cache_bytes) - vocab * rank * weight_bytes
    return vocab * rank * weight_bytes + int(steps) * per_step


def floor_us(nbytes: int, bandwidth_gbps: float) -> float:
    """The time (microseconds) to move ``nbytes`` at ``bandwidth_gbps`` (10^9 bytes per second)."""
    if not bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps: expected a positive bandwidth, got {bandwidth_gbps}")
    return nbytes / (bandwidth_gbps * 1e3)


def bandwidth_fraction(nbytes: int, time_us: float, bandwidth_gbps: float) -> float:
    """Achieved fraction of ``bandwidth_gbps``: ``(nbytes / time_us) / bandwidth``."""
    if not time_us > 0:
        raise ValueError(f"time_us: expected a positive time, got {time_us}")
    return floor_us(nbytes, bandwidth_gbps) / time_us


class Bandwidth(NamedTuple):
    copy_gbps: float  # device-to-device copy: (read + write bytes) / time
    read_gbps: float  # read-only reduction: bytes read / time
    copy_bytes: int  # size of the copy's source (the destination is as large)
    read_bytes: int  # size of the reduced buffer


def measure_bandwidth(device: torch.device, *, copy_bytes: int | None = None, read_bytes: int | None = None,
                      repeats: int = 10) -> Bandwidth:
    """Measure the memory bandwidth of ``device`` in GB/s (10^9 bytes per second).

    Copy: ``dst.copy_(src)`` of two ``copy_bytes`` fp32 buffers, counting read plus write bytes.
    Read: ``torch.sum`` of one ``read_bytes`` fp32 buffer into a preallocated scalar. Each is the
    median of ``repeats`` individually timed passes after two warm-up passes; the buffers are many
    times the L2, so no flush is needed between passes. Allocates (not for use under a graph).
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    copy_bytes = int(copy_bytes or (CUDA_COPY_BYTES if cuda else CPU_COPY_BYTES))
    read_bytes = int(read_bytes or (CUDA_READ_BYTES if cuda else CPU_READ_BYTES))

    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_time = median_time_us(lambda: dst.copy_(src), device, repeats=repeats)
    del src, dst

    data = torch.ones(read_bytes // 4, dtype=torch.float32, device=device)
    total = torch.empty((), dtype=torch.float32, device=device)
    read_time = median_time_us(lambda: torch.sum(data, dim=0, out=total), device, repeats=repeats)
    del data, total
    if cuda:
        torch.cuda.empty_cache()
    return Bandwidth(copy_gbps=2 * copy_bytes / (copy_time * 1e3), read_gbps=read_bytes / (read_time * 1e3),
                     copy_bytes=copy_bytes, read_bytes=read_bytes)
