"""Keys, uniforms and noise (SPEC.md section 4) against the known answers and float64."""

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from dspark_markov.ops import noise as rng_triton  # noqa: E402  (the device twins of rng)

KNOWN = [
    (0, 0, 0, 0x8134CDF8, 0xD28AD962),
    (1, 2, 3, 0x23B53F91, 0xE3AAF818),
    (-1, 17, 1023, 0xC8C13C14, 0xD223C51C),
    (0x123456789ABCDEF, 123456789, 199999, 0x5DDE974F, 0x0547D2FE),
    (-(2**63), 2**30, 4096, 0xF1A9355B, 0x3AED160F),
    (2**63 - 1, 2**30 + 7, 0xFFFFFFFF, 0xD952F9AA, 0x49E8EA7F),
]


@pytest.mark.parametrize("seed,pos,token,h0,h1", KNOWN)
def test_known_answers(seed, pos, token, h0, h1):
    args = (torch.tensor(seed), torch.tensor(pos), torch.tensor(token))
    assert int(dm.murmur3_hash32(*args)) == h0
    assert int(dm.murmur3_hash32(*args, domain=dm.GOLDEN_DOMAIN)) == h1


def test_known_answers_vectorised_and_python_ints():
    seeds = torch.tensor([k[0] for k in KNOWN])
    pos = torch.tensor([k[1] for k in KNOWN])
    tok = torch.tensor([k[2] for k in KNOWN])
    assert dm.murmur3_hash32(seeds, pos, tok).tolist() == [k[3] for k in KNOWN]
    assert int(dm.murmur3_hash32(1, 2, 3)) == 0x23B53F91


def test_only_low_32_bits_of_pos_and_token_matter():
    base = dm.murmur3_hash32(torch.tensor(5), torch.tensor(7), torch.tensor(9))
    assert int(dm.murmur3_hash32(torch.tensor(5), torch.tensor(7 + 2**32), torch.tensor(9))) == int(base)


def test_uniform32_range_and_endpoints():
    h = torch.tensor([0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF, 0xFFFF0000, 0x12345678])
    u = dm.uniform32(h)
    assert u.dtype == torch.float32
    assert float(u[0]) == 0.5 * 2.0**-32  # smallest value, exact
    assert float(u[4]) == 1.0  # the largest hash rounds to 1.0, as SPEC.md allows
    exact = (h >> 16).double() * 2.0**-16 + ((h & 0xFFFF).double() + 0.5) * 2.0**-32
    assert torch.equal(u, exact.float())  # one rounding of the exact sum
    rand = dm.uniform32(dm.murmur3_hash32(torch.arange(100000), 3, 4))
    assert bool((rand > 0).all()) and bool((rand <= 1).all())


def test_uniform64_range_and_top_endpoint():
    all_ones = torch.tensor(0xFFFFFFFF)
    u = dm.uniform64(all_ones, all_ones)
    assert float(u) < 1.0 and float(u) == 1.0 - 2.0**-53
    assert float(dm.uniform64(torch.tensor(0), torch.tensor(0))) == 0.5 * 2.0**-53


def test_log_f32_matches_float64_within_two_ulp():
    x = torch.exp(torch.linspace(-25.0, 3.0, 200001, dtype=torch.float64)).float()
    got = rng.log_f32(x).double()
    want = torch.log(x.double())
    err = (got - want).abs()
    ulp = torch.finfo(torch.float32).eps * torch.clamp(want.abs(), min=2.0**-24)
    assert bool((err <= 2 * ulp + 1e-12).all())


def test_gumbel32_matches_float64_noise():
    h = dm.murmur3_hash32(torch.arange(200000), 11, 13)
    u = dm.uniform32(h)
    got = dm.gumbel32(u).double()
    ud = u.double()
    want = -torch.log(-torch.log1p(-ud).clamp(max=-(2.0**-24)).where(ud < 1, torch.tensor(np.log(2.0**-24))))
    assert torch.allclose(got, want, rtol=5e-6, atol=5e-6)
    assert bool(torch.isfinite(got).all())


def test_gumbel32_endpoints_are_finite():
    u = torch.tensor([0.5 * 2.0**-32, 0.2499999, 0.25, 1.0 - 2.0**-24, 1.0])
    g = dm.gumbel32(u)
    assert bool(torch.isfinite(g).all())
    assert float(g[-1]) == pytest.approx(-np.log(-np.log(2.0**-24)), rel=1e-6)


def test_gumbel64_matches_float64():
    u = dm.uniform64(dm.murmur3_hash32(torch.arange(1000), 0, 1), dm.murmur3_hash32(torch.arange(1000), 0, 1,
                                                                                      domain=dm.GOLDEN_DOMAIN))
    assert torch.equal(dm.gumbel64(u), -torch.log(-torch.log(u)))


def test_step_seed_and_salt():
    assert int(dm.draft_step_seed(torch.tensor(5), 3)) == 5 ^ (3 << 32)
    assert int(dm.draft_step_seed(torch.tensor(-1), 1)) == -1 ^ (1 << 32)
    assert int(dm.draft_key_pos(torch.tensor(10))) == 9 + 2**30
    assert dm.DRAFT_POS_SALT == 2**30


@triton.jit
def _noise_kernel(seed_ptr, pos_ptr, noise_ptr, hash_ptr, V, STEP: tl.constexpr, DOMAIN: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    cols = tl.arange(0, BLOCK)
    prefix = rng_triton.draft_prefix(seed, tl.full([], STEP, tl.int32), pos)
    tl.store(noise_ptr + row * V + cols, rng_triton.draft_noise(prefix, cols), mask=cols < V)
    h = rng_triton.hash_finish(rng_triton.hash_prefix(seed, pos, DOMAIN), cols)
    tl.store(hash_ptr + row * V + cols, h.to(tl.int64), mask=cols < V)


def test_triton_noise_bit_identical(device):
    """The Triton device functions reproduce the torch noise and hashes bit for bit."""
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345678901234, 7], device=device)
    pos = torch.tensor([1, 17, 2**31 + 5, 0, 99999, 2**40], device=device)
    vocab = 1000
    noise = torch.empty(6, vocab, device=device)
    hashes = torch.empty(6, vocab, dtype=torch.int64, device=device)
    tokens = torch.arange(vocab, device=device)
    for step in (0, 4):
        for domain in (0, dm.GOLDEN_DOMAIN):
            _noise_kernel[(6,)](seeds, pos, noise, hashes, vocab, STEP=step, DOMAIN=domain, BLOCK=1024,
                                enable_fp_fusion=False)
            assert torch.equal(noise, dm.draft_noise(seeds[:, None], step, pos[:, None], tokens))
            assert torch.equal(hashes, dm.murmur3_hash32(seeds[:, None], pos[:, None], tokens, domain=domain))
