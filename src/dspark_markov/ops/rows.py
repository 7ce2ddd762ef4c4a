"""Per-sample loaders (slot, temperature, seed, position) and the gather of the next step's code.

Padding (SPEC.md section 2): a sample whose slot is negative, or outside ``[0, num_slots)``, is
treated as padding inside kernels: slot 0 (never used for a write), T = 0 and seed 0. So a bad
value never reads or writes out of bounds (launchers' ``check_values`` catches them eagerly).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .numerics import to_float32


@triton.jit
def sample_slot(idx_mapping_ptr, sample, num_slots):
    """``(live, slot)`` of sample ``sample = row * N + step``; not live: padding or out of range, slot 0."""
    slot = tl.load(idx_mapping_ptr + sample).to(tl.int64)
    live = (slot >= 0) & (slot < num_slots)
    return live, tl.where(live, slot, 0)


@triton.jit
def sample_slots(idx_mapping_ptr, sample, valid, num_slots):
    """:func:`sample_slot` for a vector of samples, of which only those where ``valid`` exist."""
    slot = tl.load(idx_mapping_ptr + sample, mask=valid, other=-1).to(tl.int64)
    live = valid & (slot >= 0) & (slot < num_slots)
    return live, tl.where(live, slot, 0)


@triton.jit
def slot_temperature(temperature_ptr, slot, live):
    """fp32 temperature of ``slot``; 0 (greedy) where not ``live``."""
    return tl.load(temperature_ptr + slot, mask=live, other=0.0)


@triton.jit
def slot_seed(seeds_ptr, slot, live):
    """int64 seed of ``slot``; 0 where not ``live``."""
    return tl.load(seeds_ptr + slot, mask=live, other=0)


@triton.jit
def draft_row(idx_mapping_ptr, positions_ptr, temperature_ptr, seeds_ptr, sample, num_slots):
    """``(live, slot, temp, seed, position)`` of sample ``sample = row * N + step``.

    ``live`` is False for padding (slot < 0) and for slots outside ``[0, num_slots)``; such
    samples get ``slot = 0`` (never used for a write), T = 0 and seed 0. int64 except ``temp``.
    """
    live, slot = sample_slot(idx_mapping_ptr, sample, num_slots)
    position = tl.load(positions_ptr + sample).to(tl.int64)
    temp = slot_temperature(temperature_ptr, slot, live)
    seed = slot_seed(seeds_ptr, slot, live)
    return live, slot, temp, seed, position


@triton.jit
def draft_rows(idx_mapping_ptr, positions_ptr, temperature_ptr, seeds_ptr, sample, valid, num_slots):
    """:func:`draft_row` for a vector of samples, of which only those where ``valid`` exist.

    Returns ``(live, slot, temp, seed, position)``; samples that are not live (padding, a slot
    outside ``[0, num_slots)``, or not ``valid``) get ``slot = 0`` (never written), T = 0, seed 0,
    and position 0 where not ``valid``.
    """
    live, slot = sample_slots(idx_mapping_ptr, sample, valid, num_slots)
    temp = tl.where(live, slot_temperature(temperature_ptr, slot, live), 0.0)
    seed = tl.where(live, slot_seed(seeds_ptr, slot, live), 0)
    position = tl.load(positions_ptr + sample, mask=valid, other=0).to(tl.int64)
    return live, slot, temp, seed, position


@triton.jit
def gather_code(embed_ptr, embed_row_stride, token, embed_vocab, codes_row, rank,
                RANK_BLOCK: tl.constexpr):
    """``codes_row[:rank] = W1[clamp(token, 0, V_t - 1), :rank]`` in the codes buffer's dtype.

    ``codes_row`` points at the row of ``codes`` to write; an fp32 buffer receives the exact
    widening of the weights. Bytes: ``R_k (|w| + |codes|)``.
    """
    token = tl.minimum(tl.maximum(token.to(tl.int64), 0), embed_vocab - 1)
    k = tl.arange(0, RANK_BLOCK)
    in_rank = k < rank
    code = tl.load(embed_ptr + token * embed_row_stride + k, mask=in_rank, other=0.0)
    if codes_row.dtype.element_ty == tl.float32:
        code = to_float32(code)
    tl.store(codes_row + k, code.to(codes_row.dtype.element_ty), mask=in_rank)
