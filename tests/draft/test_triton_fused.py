"""``impl="fused"`` in Triton's interpreter at small shapes, against the reference."""

import pytest
import torch

import dspark_markov as dm
from tests.helpers import (DTYPE_CASES, NAN_INF_TOKENS, check_against_reference, check_exact_and_untouched,
                           make_problem, nan_inf_problem)

pytest.importorskip("triton")


@pytest.mark.parametrize("weight_dtype,logit_dtype,cache_dtype,scale", DTYPE_CASES)
def test_gumbel_exact_against_reference(weight_dtype, logit_dtype, cache_dtype, scale, device):
    check_exact_and_untouched("fused", weight_dtype, logit_dtype, cache_dtype, scale, device)


def test_strided_base_logits_and_odd_vocab(device):
    head, args = make_problem(301, 16, 3, 2, device=device)
    wide = torch.randn(3, 4, 301, device=device).bfloat16()
    base = wide[:, 1:3]  # row stride 4 * V, not N * V
    args[0] = base
    out = dm.sample_drafts(head, *args, impl="fused")
    check_against_reference(head, *args, out)


def test_nan_inf_rows_give_defined_tokens(device):
    head, args = nan_inf_problem(device)
    for method in ("gumbel", "inverse_cdf"):
        out = dm.sample_drafts(head, *args, impl="fused", method=method, cache_dtype=torch.float32)
        assert out.draft_tokens[:, 0].tolist() == NAN_INF_TOKENS, method


def test_inverse_cdf_greedy_identical_and_cache_exactness(device):
    head, args = make_problem(700, 16, 6, 2, temps=(0.0, 1.0, 0.6), device=device)
    out = dm.sample_drafts(head, *args, impl="fused", method="inverse_cdf")
    check_against_reference(head, *args, out, method="inverse_cdf")


def test_inverse_cdf_follows_softmax(device):
    """Tokens of identical rows with distinct seeds follow softmax(cache / T): chi-square."""
    vocab, rows, calls, temp = 32, 128, 5, 0.8
    gen = torch.Generator().manual_seed(3)
    head = dm.MarkovHead(torch.randn(vocab, 16, generator=gen).bfloat16().to(device),
                         (torch.randn(vocab, 16, generator=gen) * 0.2).bfloat16().to(device))
    base = (torch.randn(1, 1, vocab, generator=gen) * 1.5).bfloat16().expand(rows, 1, vocab).contiguous().to(device)
    base[:, :, 5] = float("-inf")  # a zero-probability token
    counts = torch.zeros(vocab, dtype=torch.float64)
    cache = None
    for call in range(calls):
        seeds = torch.arange(rows, dtype=torch.int64) * 1_000_003 + call * 7_777
        out = dm.sample_drafts(head, base, torch.full((rows,), 3, device=device), torch.arange(rows, device=device),
                               torch.full((rows,), 50, device=device), torch.full((rows,), temp, device=device),
                               seeds.to(device), impl="fused", method="inverse_cdf")
        counts += torch.bincount(out.draft_tokens[:, 0].cpu(), minlength=vocab).double()
        cache = out.logits_cache[0, 0].float().cpu()
    probs = torch.softmax(cache.double() / torch.tensor(temp, dtype=torch.float32).double(), dim=0)
    assert counts[5] == 0
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    assert chi2 < df + 10 * (2 * df) ** 0.5, f"chi2 {chi2:.1f} with df {df}"


def test_graph_free_buffers_are_reused(device):
    """Two runs of one sampler give identical results: all state lives in persistent buffers."""
    head, args = make_problem(500, 16, 4, 2, device=device)
    sampler = dm.MarkovSampler(head, 2, 4, impl="fused")
    first = sampler.sample(*args)
    codes_ptr = sampler.backend.codes.data_ptr()
    second = sampler.sample(*args)
    assert sampler.backend.codes.data_ptr() == codes_ptr
    assert torch.equal(first.draft_tokens, second.draft_tokens)
    assert torch.equal(first.logits_cache, second.logits_cache)


def test_out_of_range_values_stay_in_bounds_without_checks(device):
    """check_values=False: a bad anchor is clamped and a bad slot is padding; no write outside."""
    head, args = make_problem(300, 16, 3, 1, temps=(1.0, 1.0), padding_row=None, device=device)
    args[1] = torch.tensor([10**6, -5, 2], device=device)
    args[2] = torch.tensor([0, 99, 1], device=device)
    cache = torch.full((4, 1, 300), float("nan"), dtype=torch.bfloat16, device=device)
    out = dm.sample_drafts(head, *args, impl="fused", logits_cache=cache, check_values=False)
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < 300)).all())
    written = ~torch.isnan(cache[:, 0].float()).all(dim=-1)
    assert written.tolist() == [True, True, False, False]


def test_exact_fallback_path_matches(device):
    """A huge filter margin sends every tile through the exact path: same tokens and cache."""
    head, args = make_problem(900, 16, 4, 3, device=device)
    sampler = dm.MarkovSampler(head, 3, 4, impl="fused")
    filtered = sampler.sample(*args)
    sampler.backend.filter_margin = 1e30
    exact = sampler.sample(*args)
    assert torch.equal(filtered.draft_tokens, exact.draft_tokens)
    check_against_reference(head, *args, exact)



def test_block_r_below_the_dot_tile_is_refused():
    head, _ = make_problem(300, 16, 2, 1)
    with pytest.raises(ValueError, match="block_r"):
        dm.MarkovSampler(head, 1, 2, impl="fused").backend.__init__(head, 1, 2, method="gumbel",
                                                                   cache_dtype=torch.bfloat16,
                                                                   device=torch.device("cpu"), block_r=8)
