"""The drafter's query block for DSpark (DFlash-style block drafting): ``prepare_block_inputs``.

Per live request ``r < num_reqs`` with block size ``N`` (the draft steps), the drafter's backbone
reads ``N + 1`` query rows: the anchor (the bonus / last accepted token, at position
``last_pos[r]``) followed by ``N`` mask tokens at ``last_pos[r] + 1 .. last_pos[r] + N``. Its
``N`` draft samples, ordered (request, step) as SPEC.md section 2 lays them out, predict the
positions ``last_pos[r] + 1 + i``. Every position is clamped to ``max_model_len - 1``.

Outputs go into caller-given persistent buffers sized for a padded batch of ``max_reqs``:

============================  =====================  ============================================
buffer                        shape                  live request ``r`` / padded request
============================  =====================  ============================================
``input_ids``                 ``[max_reqs*(N+1)]``   ``[bonus, mask, ..., mask]`` / 0
``positions``                 ``[max_reqs*(N+1)]``   ``min(last_pos + j, max_model_len - 1)`` / 0
``sample_pos``                ``[max_reqs*N]``       ``min(last_pos + 1 + i, max_model_len - 1)`` / 0
``sample_idx_mapping``        ``[max_reqs*N]``       ``req_slots[r]`` / -1 (SPEC.md padding row)
``is_padding``                ``[max_reqs*(N+1)]``   False / True
============================  =====================  ============================================
"""

from __future__ import annotations

import torch

from .. import registry
from ..validate import INDEX_DTYPES, check_cpu_or_cuda, check_tensor, check_triton_runs, spans_overlap

IMPLS = ("triton", "reference")


def _check_1d(name, x, device, length=None):
    check_tensor(name, x, dim=1, dtypes=INDEX_DTYPES if name != "is_padding" else (torch.bool,), device=device)
    if x.numel() > 1 and x.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous 1-D tensor (stride 1), got stride {x.stride(0)}")
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name}: expected {length} elements, got {x.shape[0]}")


def _check(last_pos, bonus_tokens, req_slots, num_steps, mask_token_id, max_model_len, input_ids, positions,
           sample_pos, sample_idx_mapping, is_padding, num_reqs, impl):
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    for name, value, low, high in (("num_steps", num_steps, 1, 2**31 - 2),
                                   ("mask_token_id", mask_token_id, 0, 2**63 - 1),
                                   ("max_model_len", max_model_len, 1, 2**63 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name}: expected an int in [{low}, {high}], got {value!r}")
    check_tensor("last_pos", last_pos, dim=1, dtypes=INDEX_DTYPES)
    check_cpu_or_cuda("last_pos", last_pos)  # (the others must share its device)
    device = last_pos.device
    length = last_pos.shape[0]
    _check_1d("last_pos", last_pos, device)
    _check_1d("bonus_tokens", bonus_tokens, device, length)
    _check_1d("req_slots", req_slots, device, length)
    _check_1d("input_ids", input_ids, device)
    if mask_token_id > torch.iinfo(input_ids.dtype).max:
        raise ValueError(f"mask_token_id: {mask_token_id} does not fit input_ids' dtype "
                         f"{str(input_ids.dtype).replace('torch.', '')}")
    queries = input_ids.shape[0]
    if queries % (num_steps + 1) != 0:
        raise ValueError(f"input_ids: expected a multiple of num_steps + 1 = {num_steps + 1} elements, got {queries}")
    max_reqs = queries // (num_steps + 1)
    _check_1d("positions", positions, device, queries)
    if max_model_len - 1 > torch.iinfo(positions.dtype).max:  # (positions are clamped to max_model_len - 1)
        raise ValueError(f"max_model_len: positions up to {max_model_len - 1} do not fit positions' dtype "
                         f"{str(positions.dtype).replace('torch.', '')}")
    _check_1d("is_padding", is_padding, device, queries)
    _check_1d("sample_pos", sample_pos, device, max_reqs * num_steps)
    _check_1d("sample_idx_mapping", sample_idx_mapping, device, max_reqs * num_steps)
    if sample_pos.dtype != torch.int64 or sample_idx_mapping.dtype != torch.int64:
        bad = "sample_pos" if sample_pos.dtype != torch.int64 else "sample_idx_mapping"
        raise ValueError(f"{bad}: expected dtype int64")
    if isinstance(num_reqs, torch.Tensor):
        check_tensor("num_reqs", num_reqs, dtypes=INDEX_DTYPES, device=device)
        if num_reqs.numel() != 1:
            raise ValueError(f"num_reqs: expected a one-element tensor, got shape {tuple(num_reqs.shape)}")
    elif num_reqs is not None:
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, int) or not 0 <= num_reqs <= min(length, max_reqs):
            raise ValueError(f"num_reqs: expected an int in [0, {min(length, max_reqs)}] (inputs hold {length}, "
                             f"buffers {max_reqs} requests), got {num_reqs!r}")
    elif length > max_reqs:
        raise ValueError(f"last_pos: {length} requests do not fit buffers sized for {max_reqs}")
    _check_apart(dict(input_ids=input_ids, positions=positions, sample_pos=sample_pos,
                      sample_idx_mapping=sample_idx_mapping, is_padding=is_padding),
                 dict(last_pos=last_pos, bonus_tokens=bonus_tokens, req_slots=req_slots,
                      **({"num_reqs": num_reqs} if isinstance(num_reqs, torch.Tensor) else {})))
    return max_reqs


def _check_apart(outputs, inputs):
    """Every output shares no memory with another output or with an input (all 1-D and contiguous): the kernel reads
    ``last_pos`` again after writing ``positions``, so an output over an input would be read after it was written."""
    tensors = [*outputs.items(), *inputs.items()]
    for i, (name, x) in enumerate(tensors[:len(outputs)]):
        for other, y in tensors[i + 1:]:
            if spans_overlap(x, y):  # (empty tensors overlap nothing)
                raise ValueError(f"{name}: shares memory with {other}; each output needs memory of its own")


def prepare_block_inputs_reference(last_pos, bonus_tokens, req_slots, num_reqs, *, num_steps, mask_token_id,
                                   max_model_len, max_reqs):
    """The five outputs as new tensors (``input_ids, positions, sample_pos, sample_idx_mapping, is_padding``).

    ``num_reqs`` is an int here. Dtypes: int64 except ``is_padding`` (bool).
    """
    device = last_pos.device
    steps = num_steps
    live = torch.arange(max_reqs, device=device) < num_reqs  # [max_reqs]
    base = torch.zeros(max_reqs, dtype=torch.int64, device=device)
    base[:num_reqs] = last_pos[:num_reqs].long()
    bonus = torch.zeros_like(base)
    bonus[:num_reqs] = bonus_tokens[:num_reqs].long()
    slots = torch.full_like(base, -1)
    slots[:num_reqs] = req_slots[:num_reqs].long()
    j = torch.arange(steps + 1, device=device)
    ids = torch.full((max_reqs, steps + 1), mask_token_id, dtype=torch.int64, device=device)
    ids[:, 0] = bonus
    ids = torch.where(live[:, None], ids, 0)
    last = max_model_len - 1
    # min(base + j, last) without forming base + j where it would overflow int64 (base near 2**63 - 1)
    positions = torch.where(live[:, None], torch.where(base[:, None] > last - j, last, base[:, None] + j), 0)
    sample_pos = positions[:, 1:]  # sample i takes query row i + 1's position
    mapping = slots[:, None].expand(max_reqs, steps)
    padding = ~live[:, None].expand(max_reqs, steps + 1)
    return ids.reshape(-1), positions.reshape(-1), sample_pos.reshape(-1), mapping.reshape(-1), padding.reshape(-1)


def prepare_block_inputs(last_pos, bonus_tokens, req_slots, *, num_steps, mask_token_id, max_model_len, input_ids,
                         positions, sample_pos, sample_idx_mapping, is_padding, num_reqs=None,
                         impl=registry.DEFAULT_IMPL):
    """Write the drafter's query block and the draft samples' layout (table in the module doc).

    Parameters
    ----------
    last_pos, bonus_tokens, req_slots : torch.Tensor
        ``[L]`` int32/int64, contiguous, one entry per request (only the first ``num_reqs`` are
        read): the bonus token's position, the bonus token, the request-state slot.
    num_steps : int
        ``N``, the draft steps (block size); ``N + 1`` query rows per request.
    mask_token_id, max_model_len : int
        The mask token; positions are clamped to ``max_model_len - 1`` (which must fit ``positions``' dtype).
    input_ids, positions, is_padding : torch.Tensor
        ``[max_reqs * (N + 1)]`` outputs, int32/int64 (``is_padding`` bool); define ``max_reqs``.
    sample_pos, sample_idx_mapping : torch.Tensor
        ``[max_reqs * N]`` int64 outputs, ordered (request, step). No output may share memory with another
        output or an input (``ValueError`` naming it).
    num_reqs : int, torch.Tensor or None
        Live requests. ``None``: ``L``. An int in ``[0, min(L, max_reqs)]``. Or a one-element
        int32/int64 tensor on the device: read by the kernel (no host synchronisation, so a
        captured CUDA graph replays with the current count); there it is clamped to
        ``[0, min(L, max_reqs)]`` rather than checked.
    impl : {"auto", "triton", "reference"}
        ``"auto"`` (the default, :mod:`dspark_markov.registry`): ``"triton"`` on CUDA, the reference
        on the CPU; both write the same values.

    Notes
    -----
    The Triton path is one launch over a fixed grid (``cdiv(max_reqs * (N + 1), 1024)``
    programs, each writing 1024-element chunks of every output), so it is CUDA-graph safe with a
    device ``num_reqs``; an int ``num_reqs`` is baked into a capture. ``last_pos`` is assumed
    ``>= 0`` (not checked: that would synchronise).
    """
    check_tensor("input_ids", input_ids)  # (first: "auto" resolves by the tensor's device)
    impl = registry.resolve("block_inputs", impl, input_ids.device)
    max_reqs = _check(last_pos, bonus_tokens, req_slots, num_steps, mask_token_id, max_model_len, input_ids,
                      positions, sample_pos, sample_idx_mapping, is_padding, num_reqs, impl)
    length = last_pos.shape[0]
    registry.check_capturable("block_inputs", impl, input_ids.device)
    if impl == "reference":
        count = length if num_reqs is None else num_reqs
        if isinstance(count, torch.Tensor):
            count = max(0, min(int(count.reshape(-1)[0]), length, max_reqs))
        outs = prepare_block_inputs_reference(last_pos, bonus_tokens, req_slots, count, num_steps=num_steps,
                                              mask_token_id=mask_token_id, max_model_len=max_model_len,
                                              max_reqs=max_reqs)
        for dst, src in zip((input_ids, positions, sample_pos, sample_idx_mapping, is_padding), outs):
            dst.copy_(src)
        return
    check_triton_runs(impl, last_pos.device)
    from . import triton_block_inputs  # noqa: PLC0415  (Triton is imported only when used)

    triton_block_inputs.launch_block_inputs(last_pos, bonus_tokens, req_slots, length if num_reqs is None else num_reqs,
                                            input_ids, positions, sample_pos, sample_idx_mapping, is_padding,
                                            num_steps=num_steps, mask_token_id=mask_token_id,
                                            max_model_len=max_model_len, max_reqs=max_reqs)
