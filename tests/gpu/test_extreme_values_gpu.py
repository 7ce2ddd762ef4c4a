"""Legal inputs at the ends of the float range on the GPU, for every drafting design that runs here (stop 46).

The CPU file (``tests/draft/test_extreme_values.py``) covers the Triton designs in the interpreter at small V; this
one runs every available design (the CUDA C++ ones too: ``cuda_chain`` / ``cuda_gumbel`` rank tokens by ``z * (1/T)``
bounds as ``stream`` / ``wide`` did, written before the subnormal-T fix and never run with such a T) at V = 129,280,
rank 256, bf16 weights: a subnormal temperature (1 / T overflows fp32 while ``div_rn(z, T)`` stays finite), and with
a reduced vocabulary a row whose keys are all -inf (``torch.argmax``: 0). Every token must be the reference's draw
from the design's own cache. A design that refuses the inputs (a ValueError: d2t or the head unsupported) is left
out of that case; one that is unavailable here is skipped.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from dspark_markov import registry
from dspark_markov.draft import reference as ref

pytestmark = pytest.mark.gpu

VOCAB, RANK = 129_280, 256
DESIGNS = [name for name in dm.MarkovSampler.impl_names() if name not in ("reference", "auto")]


def _random_head(gen, scale):
    """A full-shape bf16 head on the GPU (``[V, rank]`` both weights) from ``gen``."""
    return dm.MarkovHead(torch.randn(VOCAB, RANK, generator=gen).bfloat16().cuda(),
                         torch.randn(VOCAB, RANK, generator=gen).bfloat16().cuda(), scale=scale)


def _runs_here(impl):
    try:
        cls = registry.load("draft", impl)
    except ValueError as error:
        return str(error)
    why_not = getattr(cls, "unavailable_reason", None)
    return why_not() if why_not is not None else None


@pytest.mark.parametrize("impl", DESIGNS)
def test_subnormal_temperatures(impl):
    why = _runs_here(impl)
    if why is not None:
        pytest.skip(why)
    gen = torch.Generator().manual_seed(0)
    head = _random_head(gen, 0.0)
    base = torch.stack([torch.zeros(VOCAB), -(torch.rand(VOCAB, generator=gen) + 1.0) * 1e-3,
                        torch.cat([torch.zeros(1), -torch.rand(VOCAB - 1, generator=gen) - 1.0])])[:, None]
    temperature = torch.tensor([1e-45, 1e-40, 2e-39]).cuda()
    args = [base.bfloat16().cuda(), torch.tensor([3, 4, 5]).cuda(), torch.tensor([0, 1, 2]).cuda(),
            torch.tensor([100, 7, 0]).cuda(), temperature, torch.tensor([42, -1, 2**62]).cuda()]
    try:
        out = dm.sample_drafts(head, *args, impl=impl, method="gumbel")
    except ValueError as error:
        pytest.skip(f"{impl}: {error}")
    want = ref.draw_gumbel(out.logits_cache[:, 0].float(), temperature, args[5], 0, args[3])
    assert torch.equal(out.draft_tokens[:, 0], want), (out.draft_tokens[:, 0], want)
    assert int(out.draft_tokens[2, 0]) == 0  # the only finite key


@pytest.mark.parametrize("impl", DESIGNS)
def test_reduced_vocabulary_all_minus_inf_rows_give_token_0(impl):
    why = _runs_here(impl)
    if why is not None:
        pytest.skip(why)
    vocab_t = VOCAB + 1000
    gen = torch.Generator().manual_seed(0)
    head = dm.MarkovHead(torch.randn(vocab_t, RANK, generator=gen).bfloat16().cuda(),
                         torch.randn(VOCAB, RANK, generator=gen).bfloat16().cuda(),
                         d2t=torch.full((VOCAB,), 5).cuda(), target_vocab_size=vocab_t)  # target ids 0..4 unmapped
    base = torch.stack([torch.full((VOCAB,), float("-inf")), torch.full((VOCAB,), float("-inf")),
                        -1000.0 - torch.rand(VOCAB, generator=gen)])[:, None].cuda()
    args = [base, torch.tensor([3, 4, 5]).cuda(), torch.tensor([0, 1, 2]).cuda(), torch.tensor([100, 7, 0]).cuda(),
            torch.tensor([0.0, 1.0, 1e-45]).cuda(), torch.tensor([42, 43, 44]).cuda()]
    try:
        out = dm.sample_drafts(head, *args, impl=impl, method="gumbel", cache_dtype=torch.float32)
    except ValueError as error:
        pytest.skip(f"{impl}: {error}")
    assert out.draft_tokens[:, 0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("impl", DESIGNS)
def test_inverse_cdf_rows_below_minus_3e38(impl):
    """Inverse-CDF rows whose every z / T is finite but below -3e38 (stop 48: ``wide`` started its running shift at
    -3e38 and drew token 0 for them; stop 49, on an H100: its GPU path still drew the last token, or a -inf one, as
    2^fma(z / T, log2 e, -shift log2 e) overflowed: now 2^((z / T - shift) log2 e)); fp32 cache, zero bias: the cache
    is the base row."""
    why = _runs_here(impl)
    if why is not None:
        pytest.skip(why)
    head = dm.MarkovHead(torch.zeros(VOCAB + 1, RANK).bfloat16().cuda(), torch.zeros(VOCAB, RANK).bfloat16().cuda(),
                         scale=0.0)
    lone = torch.full((VOCAB,), float("-inf"))
    lone[VOCAB - 3] = -3.2e38
    base = torch.stack([torch.full((VOCAB,), -3.2e38), torch.full((VOCAB,), -1e38), lone])[:, None].cuda()
    temperature = torch.tensor([1.0, 0.3, 1.0]).cuda()
    args = [base, torch.tensor([3, 4, 5]).cuda(), torch.tensor([0, 1, 2]).cuda(), torch.tensor([10, 11, 12]).cuda(),
            temperature, torch.tensor([12345, 999, 5]).cuda()]
    try:
        out = dm.sample_drafts(head, *args, impl=impl, method="inverse_cdf", cache_dtype=torch.float32)
    except ValueError as error:
        pytest.skip(f"{impl}: {error}")
    want = ref.draw_inverse_cdf(out.logits_cache[:, 0], temperature, args[5], 0, args[3])
    assert torch.equal(out.draft_tokens[:, 0], want), (out.draft_tokens[:, 0], want)
    assert int(out.draft_tokens[2, 0]) == VOCAB - 3


@pytest.mark.parametrize("impl", DESIGNS)
def test_one_step_cache_with_any_step_stride(impl):
    """Stop 50: with N = 1 the cache's step stride is never used (``validate.check_cache_strides``); a ``[S, 1, V]``
    view whose step stride is not V is written exactly as a contiguous cache is, and nothing outside the view."""
    why = _runs_here(impl)
    if why is not None:
        pytest.skip(why)
    gen = torch.Generator().manual_seed(5)
    head = _random_head(gen, 0.0625)
    rows, slots = 4, 6
    args = [(torch.randn(rows, 1, VOCAB, generator=gen) * 2).bfloat16().cuda(), torch.tensor([3, 4, 5, 9]).cuda(),
            torch.tensor([0, 5, 2, 3]).cuda(), torch.tensor([100, 7, 0, 2**31 - 1]).cuda(),
            torch.tensor([1.0, 0.0, 0.7, 1.3, 2.0, 1.0]).cuda(), torch.arange(slots).cuda() * 977 - 3]
    for method in ("gumbel", "inverse_cdf"):
        try:
            want = dm.sample_drafts(head, *args, impl=impl, method=method)
        except ValueError as error:  # (a design of the other method)
            assert "method" in str(error), error
            continue
        store = torch.full((slots, VOCAB + 16), 3.0, dtype=want.logits_cache.dtype, device="cuda")
        store[:, :VOCAB] = 0.0  # (slots no request writes stay 0, as in the cache sample_drafts allocates)
        cache = store.as_strided((slots, 1, VOCAB), (VOCAB + 16, VOCAB + 8, 1))
        got = dm.sample_drafts(head, *args, impl=impl, method=method, logits_cache=cache)
        assert torch.equal(got.draft_tokens, want.draft_tokens), (impl, method)
        assert torch.equal(cache, want.logits_cache), (impl, method)
        assert bool((store[:, VOCAB:] == 3.0).all()), "wrote outside the view"
