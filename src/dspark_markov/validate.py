"""Input checks shared by every entry point (SPEC.md section 7).

Every violation raises ``ValueError`` naming the argument and what was expected, before any
kernel runs. Shape/dtype/device/stride checks never synchronise with the device; value-range
checks (``check_values=True``) read the tensors back and so are skipped inside CUDA-graph capture.

Stride rule (the same for every entry point): a 1-D per-row or per-slot tensor (``anchor``,
``idx_mapping``, ``positions``, ``temperature``, ``seeds``, ``num_drafts``, ``target_greedy``,
``k``, ``p``, ``last_pos``, ...) must be contiguous; a strided view raises ``ValueError`` naming
it (:func:`check_vector`), so kernels index such tensors as ``ptr + row``. Multi-dimensional
tensors state their own stride needs (usually: last stride 1, other strides free).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

class DeviceStatusError(RuntimeError):
    """A kernel reported a failure through its device status flag (e.g. a grid barrier timed out).

    The outputs of the launch(es) since the last check are meaningless (tokens stay in ``[0, V)``).
    Raised by ``check()`` of a sampler or backend, and by an eager :meth:`MarkovSampler.sample`
    (``check_values=True``) after its launch; see the backend protocol in
    :mod:`dspark_markov.registry`.
    """


INDEX_DTYPES = (torch.int32, torch.int64)
LOGIT_DTYPES = (torch.bfloat16, torch.float32)
CACHE_DTYPES = (torch.bfloat16, torch.float32)


def check_tensor(name, x, *, dim=None, shape=None, dtypes=None, device=None, last_stride_one=False,
                 contiguous=False):
    """Raise ``ValueError`` unless ``x`` is a tensor of the given rank/shape/dtypes/device/strides."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name}: expected dtype {names}, got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != torch.device(device):
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {x.device}")
    if last_stride_one and x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected the last dimension contiguous (stride 1), got strides {x.stride()}")
    if contiguous and not x.is_contiguous():
        what = "1-D tensor (stride 1)" if x.dim() == 1 else "tensor"
        raise ValueError(f"{name}: expected a contiguous {what}, got strides {x.stride()} "
                         f"(pass .contiguous())")


def check_vector(name, x, *, length=None, dtypes=None, device=None):
    """A 1-D per-row / per-slot tensor: ``[length]`` (if given), ``dtypes``, ``device``, contiguous."""
    check_tensor(name, x, dim=1, shape=None if length is None else (length,), dtypes=dtypes, device=device,
                 contiguous=True)


def memory_span(x) -> tuple:
    """``(first, end)`` byte addresses of a non-empty tensor with non-negative strides: every element lies in
    ``[first, end)`` (conservative: the gaps of a strided view count)."""
    last = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))
    return x.data_ptr(), x.data_ptr() + (last + 1) * x.element_size()


def spans_overlap(a, b) -> bool:
    """Whether the memory spans (:func:`memory_span`) of two tensors on one device intersect (conservative:
    interleaved rows count); an empty tensor overlaps nothing."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = memory_span(a), memory_span(b)
    return a0 < b1 and b0 < a1


def check_apart(name, out, source_name, source) -> None:
    """Raise ``ValueError`` unless ``out`` is ``source`` itself (same start and strides: in place) or shares none of
    its memory (:func:`spans_overlap`); a kernel reading ``source`` while writing ``out`` would otherwise read rows it
    already wrote."""
    if (out.data_ptr() == source.data_ptr() and out.stride() == source.stride()) or out.device.type == "meta":
        return
    if spans_overlap(out, source):
        raise ValueError(f"{name}: overlaps {source_name} without being the same rows (the filter would read rows it "
                         f"already wrote); pass {name}={source_name} (in place) or memory of its own")


def check_choice(name, value, choices):
    """Raise ``ValueError`` unless ``value`` is one of ``choices`` (an option such as ``method``)."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def check_triton_runs(impl, device, name: str = "impl") -> None:
    """Raise ``ValueError`` unless a Triton implementation ``impl`` can run on ``device`` here.

    CUDA: always (Triton imported). CPU: only under Triton's interpreter, which must be switched on
    (``TRITON_INTERPRET=1``) before the kernels are defined, i.e. before the package imports Triton;
    without it a launch would fail deep inside Triton ("0 active drivers").
    """
    if torch.device(device).type != "cpu":
        return
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise ValueError(f"{name}: {impl!r} needs Triton ({error}); install it with "
                         f"pip install 'dspark-markov[triton]'") from error
    from .ops.constants import INTERPRET
    if not INTERPRET:
        raise ValueError(f"{name}: {impl!r} runs on the CPU only in Triton's interpreter: set TRITON_INTERPRET=1 "
                         f"before importing dspark_markov (slow, meant for tests), or use impl='reference'")


def check_power_of_two(name, value, minimum) -> int:
    """``value`` as an int power of two ``>= minimum`` (a block size; ints as :func:`check_int` takes them);
    ``ValueError`` naming ``name`` otherwise."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < minimum or number & (number - 1):
        raise ValueError(f"{name}: expected a power of two >= {minimum}, got {value}")
    return int(number)


def check_cpu_or_cuda(name, x) -> None:
    """Raise ``ValueError`` unless ``x`` is on the CPU or a CUDA device: a ``meta`` tensor (or one on another
    device) has no values the checks or the reference could read (torch would raise a RuntimeError)."""
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a CPU or CUDA tensor, got one on {x.device}")


def check_range(name, x, low, high):
    """Raise ``ValueError`` unless every value of ``x`` lies in ``[low, high)`` (synchronises)."""
    check_cpu_or_cuda(name, x)
    if x.numel() == 0:
        return
    lo, hi = int(x.min()), int(x.max())
    if lo < low or hi >= high:
        raise ValueError(f"{name}: expected values in [{low}, {high}), got values in [{lo}, {hi}]")


def check_unique_slots(name, slots, steps: int = 1, what: str = "rows") -> None:
    """Raise ``ValueError`` if two live entries of ``slots`` write the same cache row (synchronises).

    ``slots`` ``[R * steps]`` ordered (row, step), ``-1`` (any negative) = padding: a cache row is
    ``(slot, step)``, so one row may change slot between steps, and padding may repeat.
    """
    check_cpu_or_cuda(name, slots)
    if slots.numel() < 2:
        return
    grid = slots.reshape(-1, steps).long()
    rows = grid.shape[0]
    keys = grid * steps + torch.arange(steps, device=slots.device)  # distinct per (slot, step)
    keys = torch.where(grid >= 0, keys, -1 - torch.arange(grid.numel(), device=slots.device).view(rows, steps))
    flat = keys.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    ordered = flat[order]
    same = (ordered[1:] == ordered[:-1]).nonzero()
    if same.numel() == 0:
        return
    at = int(same[0, 0])
    first, second = int(order[at]), int(order[at + 1])
    slot, step = int(grid.reshape(-1)[first]), first % steps
    where = f" at step {step}" if steps > 1 else ""
    raise ValueError(f"{name}: {what} {first // steps} and {second // steps} both use slot {slot}{where}, so "
                     f"they would write the same logits_cache row; each live {what[:-1]} needs its own slot")


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    ai = a.index if a.index is not None else torch.cuda.current_device()
    bi = b.index if b.index is not None else torch.cuda.current_device()
    return ai == bi


def check_int(name, value, minimum, maximum: int = 2**31 - 1) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``ValueError`` naming ``name`` otherwise.

    Python and numpy ints and one-element integer tensors pass (``operator.index``); floats (even
    ``2.0``), strings, ``bool`` and ``None`` do not: a size is never truncated or parsed. The
    default ``maximum`` is the kernels' int32 index range (a size beyond it could not be allocated
    or indexed anyway).
    """
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if number < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {number}")
    if number > maximum:
        raise ValueError(f"{name}: expected an int <= {maximum}, got {number}")
    return int(number)


def check_head(head, name: str = "head") -> None:
    """Raise ``ValueError`` unless ``head`` is a :class:`~dspark_markov.MarkovHead`."""
    from .head import MarkovHead

    if not isinstance(head, MarkovHead):
        raise ValueError(f"{name}: expected a MarkovHead(embed_weight, head_weight, scale), got {type(head).__name__}")


def check_sampler_sizes(num_steps, max_rows, cache_dtype) -> tuple[int, int]:
    """Construction checks shared by every sampler: ``num_steps``/``max_rows`` ints >= 1, a cache dtype.

    Returns ``(num_steps, max_rows)`` as ints.
    """
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype: expected torch.bfloat16 or torch.float32, got {cache_dtype}")
    return check_int("num_steps", num_steps, 1), check_int("max_rows", max_rows, 1)


class DraftDims(NamedTuple):
    rows: int
    steps: int
    vocab: int
    slots: int


def check_cache_strides(logits_cache, slots: int, steps: int, width: int) -> None:
    """The cache ``[S, N, width]`` kernels write by ``slot * stride(0) + step * width + v``: step stride ``width``
    and slots that do not overlap (an expanded view would have every slot's rows written over each other). With one
    step (N = 1) the step stride is never used, so any is accepted (a ``[S, 1, W]`` slice of a wider buffer)."""
    if steps > 1 and logits_cache.numel() > 0 and logits_cache.stride(1) != width:
        raise ValueError(f"logits_cache: expected step stride {width} (V), got strides {logits_cache.stride()}")
    if slots > 1 and logits_cache.numel() > 0 and logits_cache.stride(0) < steps * width:
        raise ValueError(f"logits_cache: slots overlap (slot stride {logits_cache.stride(0)} < N V = "
                         f"{steps * width}); each slot's rows are written")


def check_draft_inputs(
    head,
    base_logits,
    anchor,
    idx_mapping,
    positions,
    temperature,
    seeds,
    draft_tokens=None,
    logits_cache=None,
    *,
    check_values: bool = True,
) -> DraftDims:
    """Validate the arguments of ``sample_drafts`` (SPEC.md section 2); return the dimensions."""
    check_tensor("base_logits", base_logits, dim=3, dtypes=LOGIT_DTYPES, last_stride_one=True)
    device = base_logits.device
    if not _same_device(head.device, device):
        raise ValueError(f"base_logits: expected a tensor on the head's device {head.device}, got one on {device}")
    rows, steps, vocab = base_logits.shape
    if vocab != head.vocab_size:
        raise ValueError(f"base_logits: expected V = {head.vocab_size} (head_weight rows), got shape {tuple(base_logits.shape)}")
    if steps < 1:
        raise ValueError(f"base_logits: expected N >= 1 draft steps, got shape {tuple(base_logits.shape)}")
    # The Triton launchers index the 1-D inputs with unit stride: a strided view is rejected, not misread.
    check_vector("anchor", anchor, length=rows, dtypes=INDEX_DTYPES, device=device)
    check_vector("idx_mapping", idx_mapping, length=rows * steps, dtypes=INDEX_DTYPES, device=device)
    check_vector("positions", positions, length=rows * steps, dtypes=INDEX_DTYPES, device=device)
    check_vector("temperature", temperature, dtypes=(torch.float32,), device=device)
    slots = temperature.shape[0]
    check_vector("seeds", seeds, length=slots, dtypes=(torch.int64,), device=device)
    if draft_tokens is not None:
        check_tensor("draft_tokens", draft_tokens, shape=(rows, steps), dtypes=(torch.int64,), device=device,
                     last_stride_one=True)
        if rows > 1 and draft_tokens.stride(0) < steps:  # (an expanded view: rows written over each other)
            raise ValueError(f"draft_tokens: rows overlap (row stride {draft_tokens.stride(0)} < N = {steps}); "
                             f"every row is written")
    if logits_cache is not None:
        width = getattr(head, "cache_vocab_size", vocab)  # the target vocabulary with a d2t table
        check_tensor("logits_cache", logits_cache, shape=(slots, steps, width), dtypes=CACHE_DTYPES,
                     device=device, last_stride_one=True)
        check_cache_strides(logits_cache, slots, steps, width)
    if check_values:
        check_range("anchor", anchor, 0, head.embed_vocab_size)
        check_range("idx_mapping", idx_mapping, -1, slots)
        check_unique_slots("idx_mapping", idx_mapping, steps)
        if slots > 0:
            if bool(torch.isnan(temperature).any()) or bool((temperature < 0).any()) or bool(torch.isinf(temperature).any()):
                raise ValueError("temperature: expected finite values >= 0 (0 means greedy), got NaN, inf or a negative value")
    return DraftDims(rows, steps, vocab, slots)
