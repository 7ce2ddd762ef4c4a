"""ops.rows against reference.row_keys: padding and out-of-range slots, and the exact code gather."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from dspark_markov.draft import reference  # noqa: E402
from dspark_markov.ops.rows import draft_row, draft_rows, gather_code  # noqa: E402


@triton.jit
def _rows_kernel(idx_ptr, pos_ptr, temp_ptr, seed_ptr, live_ptr, temp_out, seed_out, pos_out, samples, num_slots,
                 BLOCK: tl.constexpr):
    sample = tl.program_id(0)
    live, slot, temp, seed, position = draft_row(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, num_slots)
    tl.store(live_ptr + sample, live.to(tl.int32))
    tl.store(temp_out + sample, temp)
    tl.store(seed_out + sample, seed)
    tl.store(pos_out + sample, position)
    many = tl.arange(0, BLOCK)
    valid = many < samples
    lives, _, temps, seeds, positions = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, many, valid, num_slots)
    if sample == 0:  # the vector form writes after the scalar rows, over the same outputs: same values
        tl.store(live_ptr + samples + many, lives.to(tl.int32), mask=valid)
        tl.store(temp_out + samples + many, temps, mask=valid)
        tl.store(seed_out + samples + many, seeds, mask=valid)
        tl.store(pos_out + samples + many, positions, mask=valid)


def test_row_loaders_match_row_keys():
    slots = 5
    idx = torch.tensor([0, 4, -1, 5, 99, 2, -7, 1], dtype=torch.int32)  # 5 and 99 are out of range
    pos = torch.arange(8, dtype=torch.int64) * 1000 + 3
    temperature = torch.tensor([0.0, 0.6, 1.0, 1.5, 0.25])
    seeds = torch.tensor([11, -22, 33, 2**62, -(2**61)], dtype=torch.int64)
    n = idx.shape[0]
    live = torch.empty(2 * n, dtype=torch.int32)
    temp, seed, position = torch.empty(2 * n), torch.empty(2 * n, dtype=torch.int64), torch.empty(2 * n,
                                                                                                   dtype=torch.int64)
    _rows_kernel[(n,)](idx, pos, temperature, seeds, live, temp, seed, position, n, slots, BLOCK=8)
    in_range = torch.where((idx >= 0) & (idx < slots), idx, -1)
    padding, want_temp, want_seed, want_pos = reference.row_keys(in_range, pos, temperature, seeds)
    for half in (slice(0, n), slice(n, 2 * n)):
        assert torch.equal(live[half].bool(), ~padding)
        assert torch.equal(temp[half], want_temp)
        assert torch.equal(seed[half], want_seed)
        assert torch.equal(position[half], want_pos)


@triton.jit
def _gather_kernel(embed_ptr, tokens_ptr, codes_ptr, embed_vocab, rank, RANK_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    gather_code(embed_ptr, rank, tl.load(tokens_ptr + row), embed_vocab, codes_ptr + row * rank, rank, RANK_BLOCK)


@pytest.mark.parametrize("codes_dtype", [torch.bfloat16, torch.float32])
def test_gather_code_clamps_and_widens_exactly(codes_dtype):
    every_bf16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    embed = every_bf16[: 64 * 24].view(64, 24).contiguous()  # subnormals, infinities, NaNs included
    tokens = torch.tensor([0, 63, -5, 1000, 17], dtype=torch.int64)
    codes = torch.zeros(5, 24, dtype=codes_dtype)
    _gather_kernel[(5,)](embed, tokens, codes, 64, 24, RANK_BLOCK=32)
    want = embed[tokens.clamp(0, 63)].to(codes_dtype)
    ints = torch.int16 if codes_dtype == torch.bfloat16 else torch.int32
    nan = torch.isnan(want)
    assert bool(torch.isnan(codes)[nan].all())
    assert torch.equal(codes.view(ints)[~nan], want.view(ints)[~nan])
