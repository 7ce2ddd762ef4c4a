"""ops.pick against SPEC.md section 5: the token whose CDF interval holds the uniform, never a zero weight."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from dspark_markov.ops import pick  # noqa: E402

BLOCK = 64


@triton.jit
def _pick_kernel(z_ptr, temp_ptr, u_ptr, block_max_ptr, block_mass_ptr, token_ptr, draws_ptr, vocab, num_blocks,
                 BLOCKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blocks = tl.arange(0, BLOCKS)
    in_row = blocks < num_blocks
    block_max = tl.load(block_max_ptr + row * num_blocks + blocks, mask=in_row, other=float("-inf"))
    block_mass = tl.load(block_mass_ptr + row * num_blocks + blocks, mask=in_row, other=0.0)
    temp = tl.load(temp_ptr + row)
    row_max = tl.max(block_max, axis=0)
    token = -2
    drawn = pick.draws(row >= 0, temp, row < 0, row_max)
    if drawn:
        chosen, remaining, scale, chosen_max = pick.pick_block(block_max, block_mass, in_row, row_max,
                                                               tl.load(u_ptr + row), BLOCKS)
        cols = chosen * BLOCK + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + row * vocab + cols, mask=cols < vocab, other=0.0)
        token = pick.pick_token(z, temp, cols, cols < vocab, scale, chosen_max, remaining, vocab)
    tl.store(token_ptr + row, token)
    tl.store(draws_ptr + row, drawn.to(tl.int32))


def _partials(z, temp):
    rows, vocab = z.shape
    blocks = -(-vocab // BLOCK)
    padded = torch.full((rows, blocks * BLOCK), float("-inf"))
    padded[:, :vocab] = z / temp[:, None]
    padded = padded.view(rows, blocks, BLOCK)
    block_max = padded.amax(dim=2)
    shift = torch.where(torch.isfinite(block_max), block_max, torch.zeros_like(block_max))
    return block_max.contiguous(), torch.exp(padded - shift[..., None]).sum(dim=2).contiguous()


def _run(z, temp, u):
    rows, vocab = z.shape
    block_max, block_mass = _partials(z, temp)
    token = torch.empty(rows, dtype=torch.int32)
    drawn = torch.empty(rows, dtype=torch.int32)
    _pick_kernel[(rows,)](z, temp, u, block_max, block_mass, token, drawn, vocab, block_max.shape[1],
                          BLOCKS=triton.next_power_of_2(block_max.shape[1]), BLOCK=BLOCK, enable_fp_fusion=False)
    return token.long(), drawn.bool()


def test_token_holds_the_uniform_in_its_cdf_interval():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 64, 1000
    z = torch.randn(rows, vocab, generator=g) * 3
    z[:, 100:700] = float("-inf")  # whole blocks and block parts of zero probability
    z[1, 10:] = -200.0  # one dominant token, the rest underflows against it
    temp = torch.rand(rows, generator=g) * 2 + 0.05
    u = torch.rand(rows, generator=g).clamp_min(2**-24)
    u[0], u[2] = 1.0, 2**-24  # the two ends of (0, 1]
    token, drawn = _run(z, temp, u)
    assert bool(drawn.all())
    weights = torch.exp((z / temp[:, None]).double() - (z / temp[:, None]).double().amax(dim=1, keepdim=True))
    cdf = torch.cumsum(weights, dim=1) / weights.sum(dim=1, keepdim=True)
    chosen = weights.gather(1, token[:, None])[:, 0]
    assert bool((chosen > 0).all()), "a zero-probability token was drawn"
    upper = cdf.gather(1, token[:, None])[:, 0]
    lower = upper - chosen / weights.sum(dim=1)
    u = u.double()
    assert bool(((lower <= u + 1e-5) & (u <= upper + 1e-5)).all())


def test_non_finite_rows_are_not_drawn():
    z = torch.zeros(3, 200)
    z[0, 5] = float("inf")
    z[1] = float("-inf")
    z[2, 7] = 3e38  # z / T overflows to +inf at T = 0.5: greedy, as the reference has it
    temp = torch.tensor([1.0, 1.0, 0.5])
    token, drawn = _run(z, temp, torch.full((3,), 0.5))
    assert not bool(drawn.any())
