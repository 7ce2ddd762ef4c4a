"""ops.filter against the reference keys: the approximate ranking never changes the argmax (1-D and 2-D)."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from dspark_markov import rng  # noqa: E402
from dspark_markov.draft import reference  # noqa: E402
from dspark_markov.ops.filter import FILTER_MARGIN, filtered_argmax  # noqa: E402
from dspark_markov.ops.noise import draft_prefix  # noqa: E402
from dspark_markov.ops.numerics import block_argmax  # noqa: E402

STEP = 3


@triton.jit
def _block_kernel(z_ptr, temp_ptr, seed_ptr, pos_ptr, value_ptr, index_ptr, vocab, margin, step,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0)
    token = tl.arange(0, BLOCK)
    valid = token < vocab
    z = tl.load(z_ptr + row * vocab + token, mask=valid, other=0.0)
    temp = tl.load(temp_ptr + row)
    prefix = draft_prefix(tl.load(seed_ptr + row), step, tl.load(pos_ptr + row))
    if temp == 0.0:
        value, index = block_argmax(z, token, valid)
    else:
        value, index = filtered_argmax(z, temp, prefix, token, valid, margin, 0, False)
    tl.store(value_ptr + row, value)
    tl.store(index_ptr + row, index)


@triton.jit
def _tile_kernel(z_ptr, temp_ptr, seed_ptr, pos_ptr, value_ptr, index_ptr, rows, vocab, margin, step,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, ROWS)
    token = tl.arange(0, BLOCK)
    row_ok = r < rows
    mask = row_ok[:, None] & (token < vocab)[None, :]
    z = tl.load(z_ptr + r[:, None] * vocab + token[None, :], mask=mask, other=0.0)
    temp = tl.load(temp_ptr + r, mask=row_ok, other=0.0)
    prefix = draft_prefix(tl.load(seed_ptr + r, mask=row_ok, other=0), step,
                          tl.load(pos_ptr + r, mask=row_ok, other=0))
    value, index = filtered_argmax(z, temp, prefix, token[None, :], mask, margin, 1, False)
    tl.store(value_ptr + r, value, mask=row_ok)
    tl.store(index_ptr + r, index, mask=row_ok)


def _problem(rows, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, vocab, generator=g) * 3
    temp = torch.tensor([1.0, 0.6, 0.0, 2.5, 1.0, 0.3])[torch.arange(rows) % 6]
    seeds = torch.randint(-(2**62), 2**62, (rows,), generator=g)
    pos = torch.randint(1, 1 << 20, (rows,), generator=g)
    # Row 4: a near-tie of two tokens (exact keys equal up to rounding): the filter must go exact.
    noise = rng.draft_noise(seeds[4:5, None], STEP, pos[4:5, None], torch.arange(vocab))[0]
    z[4, 10] = 5.0 - noise[10]
    z[4, 20] = 5.0 - noise[20]
    z[5, 7] = float("nan")  # a NaN row: first NaN wins
    z[5, 9] = float("nan")
    if rows > 6:
        z[6] = float("-inf")  # all -inf: token 0
    return z, temp, seeds, pos


def _reference(z, temp, seeds, pos):
    keys = reference.gumbel_keys(z, temp, seeds, STEP, pos)
    token = reference.argmax_first(keys)
    return keys.gather(1, token[:, None])[:, 0], token


def _same(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@pytest.mark.parametrize("margin", [FILTER_MARGIN, 1e30])  # the filter, and the forced exact path
def test_block_filter_is_the_exact_argmax(margin):
    z, temp, seeds, pos = _problem(7, 300)
    value = torch.empty(7)
    index = torch.empty(7, dtype=torch.int32)
    _block_kernel[(7,)](z, temp, seeds, pos, value, index, 300, margin, STEP, BLOCK=512, enable_fp_fusion=False)
    want_value, want_token = _reference(z, temp, seeds, pos)
    assert torch.equal(index.long(), want_token)
    assert _same(value, want_value)


@pytest.mark.parametrize("rows", [3, 7])  # a tile of decided rows only (3), and one with undecided rows
def test_tile_filter_is_the_exact_argmax(rows):
    z, temp, seeds, pos = _problem(7, 300)
    if rows == 3:
        z, temp, seeds, pos = z[:3].contiguous(), temp[:3].contiguous(), seeds[:3].contiguous(), pos[:3].contiguous()
    value = torch.empty(rows)
    index = torch.empty(rows, dtype=torch.int32)
    _tile_kernel[(1,)](z, temp, seeds, pos, value, index, rows, 300, FILTER_MARGIN, STEP, ROWS=8, BLOCK=512,
                       enable_fp_fusion=False)
    want_value, want_token = _reference(z, temp, seeds, pos)
    assert torch.equal(index.long(), want_token)
    assert _same(value, want_value)
