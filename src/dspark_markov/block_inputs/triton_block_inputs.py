"""The Triton kernel of :func:`dspark_markov.block_inputs.prepare_block_inputs` (own module so
that importing the package never imports Triton)."""

from __future__ import annotations

import triton
import triton.language as tl

CHUNK = 1024  # elements of each output written per program: wide stores cover the padded tail


@triton.jit
def _clamped_position(base, offset, last_position):
    """``min(base + offset, last_position)`` (``offset >= 0``), never taking an int64 sum that overflowed (``base``
    near 2^63 - 1)."""
    return tl.where(base > last_position - offset, last_position, base + offset)


@triton.jit(do_not_specialize=["num_reqs_value", "mask_token_id", "max_model_len"])
def _block_inputs_kernel(
    last_pos_ptr, bonus_ptr, slots_ptr, input_len,  # [L] int32/int64 each
    num_reqs_ptr, num_reqs_value,  # one-element int32/int64 tensor (when ON_DEVICE) or an int
    input_ids_ptr, positions_ptr, is_padding_ptr,  # [max_reqs * (N + 1)] int32/int64, int32/int64, bool
    sample_pos_ptr, mapping_ptr,  # [max_reqs * N] int64 each
    max_reqs, mask_token_id, max_model_len,
    STEPS: tl.constexpr, ON_DEVICE: tl.constexpr, CHUNK: tl.constexpr,
):
    if ON_DEVICE:
        num_reqs = tl.load(num_reqs_ptr).to(tl.int64)
    else:
        num_reqs = tl.zeros([], tl.int64) + num_reqs_value
    num_reqs = tl.minimum(tl.maximum(num_reqs, 0), tl.minimum(input_len, max_reqs))  # never read past inputs
    offset = tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    last_position = max_model_len - 1

    # Query rows: element e is request e // (N + 1), row j = e % (N + 1) of its block.
    in_range = offset < max_reqs * (STEPS + 1)
    request = offset // (STEPS + 1)
    j = offset % (STEPS + 1)
    live = in_range & (request < num_reqs)
    base = tl.load(last_pos_ptr + request, mask=live, other=0).to(tl.int64)
    bonus = tl.load(bonus_ptr + request, mask=live & (j == 0), other=0).to(tl.int64)
    ids = tl.where(j == 0, bonus, mask_token_id)
    tl.store(input_ids_ptr + offset, tl.where(live, ids, 0).to(input_ids_ptr.dtype.element_ty), mask=in_range)
    query_pos = tl.where(live, _clamped_position(base, j, last_position), 0)
    tl.store(positions_ptr + offset, query_pos.to(positions_ptr.dtype.element_ty), mask=in_range)
    tl.store(is_padding_ptr + offset, (live == 0).to(tl.int1), mask=in_range)

    # Samples, ordered (request, step): element s is request s // N, step i = s % N.
    in_range = offset < max_reqs * STEPS
    request = offset // STEPS
    i = offset % STEPS
    live = in_range & (request < num_reqs)
    base = tl.load(last_pos_ptr + request, mask=live, other=0).to(tl.int64)
    slot = tl.load(slots_ptr + request, mask=live, other=-1).to(tl.int64)
    tl.store(sample_pos_ptr + offset, tl.where(live, _clamped_position(base, i + 1, last_position), 0), mask=in_range)
    tl.store(mapping_ptr + offset, tl.where(live, slot, -1), mask=in_range)


def launch_block_inputs(last_pos, bonus_tokens, req_slots, num_reqs, input_ids, positions, sample_pos,
                        sample_idx_mapping, is_padding, *, num_steps, mask_token_id, max_model_len, max_reqs):
    """One launch, grid ``(cdiv(max_reqs * (N + 1), 1024),)`` (fixed by ``max_reqs``: graph safe).

    Arguments as validated by ``prepare_block_inputs``; ``num_reqs`` is an int or a one-element
    device tensor. Bytes: ``num_reqs * 3 * 8`` read (x2 for the two layouts) plus
    ``max_reqs * ((N + 1) * (2 * id bytes + 1) + 16 N)`` written.
    """
    if max_reqs == 0:
        return
    on_device = hasattr(num_reqs, "data_ptr")
    grid = (triton.cdiv(max_reqs * (num_steps + 1), CHUNK),)
    _block_inputs_kernel[grid](
        last_pos, bonus_tokens, req_slots, last_pos.shape[0],
        num_reqs if on_device else last_pos, 0 if on_device else int(num_reqs),
        input_ids, positions, is_padding,
        sample_pos, sample_idx_mapping,
        max_reqs, mask_token_id, max_model_len,
        STEPS=num_steps, ON_DEVICE=on_device, CHUNK=CHUNK,
        num_warps=4,
    )
