"""Drafting modes (issue 17): reduced vocabulary (d2t), top-k candidate drafting, Markov embeddings.

The reference against independent forms of the same rule (on heads whose bias sums are exact, so
any summation order gives the same bits): a d2t problem is the dense problem over the target
vocabulary with W2 rows zero and base logits -inf at the unmapped ids; top-k drafting is the dense
problem with the base logits -inf outside the candidates. Then the API's errors, and the Triton
designs in the interpreter at small V.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft.reference import sample_drafts_reference
from tests.modes_helpers import (SENTINEL, check_modes_draws, exact_head, make_d2t, markov_embeds_of, modes_inputs,
                                 modes_outputs)

DRAFT_V, TARGET_V, RANK = 300, 520, 16


def dense_over_target(head, inputs):
    """The d2t problem as a dense problem over the target vocabulary (W2 rows 0, base -inf unmapped)."""
    ids = head.d2t_index
    w2 = torch.zeros(head.target_vocab_size, head.rank, dtype=head.dtype)
    w2[ids] = head.head_weight
    full = dm.MarkovHead(head.embed_weight[: head.target_vocab_size], w2, head.scale)
    base = inputs["base_logits"]
    wide = torch.full((*base.shape[:2], head.target_vocab_size), float("-inf"), dtype=base.dtype)
    wide[:, :, ids] = base
    return full, dict(inputs, base_logits=wide)


def run_reference(head, inputs, cache_dtype, **options):
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    sample_drafts_reference(head, **inputs, draft_tokens=tokens, logits_cache=cache, **options)
    return tokens, cache


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_d2t_reference_is_the_dense_problem_over_target_ids(cache_dtype, scale):
    head = exact_head(DRAFT_V, TARGET_V, RANK, scale=scale)
    inputs = modes_inputs(6, 4, DRAFT_V, TARGET_V)
    tokens, cache = run_reference(head, inputs, cache_dtype)
    full, wide = dense_over_target(head, inputs)
    want_tokens, want_cache = run_reference(full, wide, cache_dtype)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(cache.view(torch.int16 if cache_dtype == torch.bfloat16 else torch.int32),
                       want_cache.view(torch.int16 if cache_dtype == torch.bfloat16 else torch.int32))
    mapped = torch.zeros(TARGET_V, dtype=torch.bool)
    mapped[head.d2t_index] = True
    assert bool(mapped[tokens].all()), "a drafted token is not a target id of the draft vocabulary"


def test_d2t_identity_table_is_the_dense_reference():
    base_head = exact_head(DRAFT_V, DRAFT_V + 37, RANK, exact=False, d2t=False)
    head = dm.MarkovHead(base_head.embed_weight, base_head.head_weight, d2t=torch.zeros(DRAFT_V, dtype=torch.int32),
                         target_vocab_size=DRAFT_V)
    inputs = modes_inputs(5, 3, DRAFT_V, DRAFT_V)
    a = run_reference(head, inputs, torch.bfloat16)
    b = run_reference(base_head, inputs, torch.bfloat16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_d2t_ties_go_to_the_lowest_target_id():
    # Greedy rows whose biased logits are all equal: torch.argmax over the target-width row picks the
    # lowest mapped target id, whatever draft id it has.
    head = exact_head(DRAFT_V, TARGET_V, RANK)
    head = dm.MarkovHead(head.embed_weight, torch.zeros_like(head.head_weight), d2t=head.d2t, target_vocab_size=TARGET_V)
    inputs = modes_inputs(3, 2, DRAFT_V, TARGET_V, temps=(0.0,))
    inputs["base_logits"] = torch.zeros_like(inputs["base_logits"])
    tokens, _ = run_reference(head, inputs, torch.bfloat16)
    assert bool((tokens == int(head.d2t_index.min())).all())


@pytest.mark.parametrize("d2t", [False, True])
@pytest.mark.parametrize("k", [1, 7, 64])
def test_top_k_reference_is_the_dense_problem_on_masked_logits(d2t, k):
    head = exact_head(DRAFT_V, TARGET_V, RANK, d2t=d2t, scale=0.5 if k == 7 else 1.0)
    inputs = modes_inputs(6, 4, DRAFT_V, TARGET_V)
    tokens, cache = run_reference(head, inputs, torch.bfloat16, draft_top_k=k)
    base = inputs["base_logits"]
    _, index = base.topk(k, dim=-1)
    masked = torch.full_like(base, float("-inf")).scatter_(-1, index, base.gather(-1, index))
    want_tokens, want_cache = run_reference(head, dict(inputs, base_logits=masked), torch.bfloat16)
    assert torch.equal(tokens, want_tokens) and torch.equal(cache.view(torch.int16), want_cache.view(torch.int16))
    live_rows = cache != SENTINEL
    assert int((~torch.isinf(cache[live_rows].view(-1, cache.shape[-1]))).sum(-1).max()) <= k


def test_top_k_rounds_once_without_the_dense_bias_rounding():
    # values + scale * fp32 sum, one rounding (vLLM's baddbmm); the dense mode rounds the bias first.
    head = exact_head(DRAFT_V, TARGET_V, 64, exact=False, d2t=False, scale=0.7)
    inputs = modes_inputs(8, 3, DRAFT_V, TARGET_V)
    tokens, cache = run_reference(head, inputs, torch.float32, draft_top_k=DRAFT_V)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=DRAFT_V)
    dense_tokens, dense_cache = run_reference(head, inputs, torch.float32)
    assert not torch.equal(cache, dense_cache)  # the bias rounding differs: the modes are not aliases


def test_markov_embeds_output():
    head = exact_head(DRAFT_V, TARGET_V, RANK)
    inputs = modes_inputs(5, 4, DRAFT_V, TARGET_V)
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    embeds = torch.full((5, 4, RANK), 9.0, dtype=head.dtype)
    sampler = dm.MarkovSampler(head, 4, 8, impl="reference", draft_top_k=5)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
    assert torch.equal(embeds, markov_embeds_of(head, inputs["anchor"], tokens))
    ref_embeds = torch.zeros_like(embeds)
    run_reference(head, inputs, torch.bfloat16, draft_top_k=5, markov_embeds=ref_embeds)
    assert torch.equal(ref_embeds, embeds)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=5)


def test_sample_drafts_modes_api():
    plain = exact_head(DRAFT_V, TARGET_V, RANK, d2t=False)
    table = make_d2t(DRAFT_V, TARGET_V, seed=3)
    inputs = modes_inputs(4, 3, DRAFT_V, TARGET_V)
    out = dm.sample_drafts(plain, **inputs, d2t=table, impl="reference")
    assert out.logits_cache.shape == (7, 3, TARGET_V)
    head = dm.MarkovHead(plain.embed_weight, plain.head_weight, d2t=table)
    check_modes_draws(head, inputs, out.draft_tokens, torch.where(out.logits_cache == 0, SENTINEL, out.logits_cache))
    out = dm.sample_drafts(head, **inputs, draft_top_k=3)  # auto on the CPU: the reference
    check_modes_draws(head, inputs, out.draft_tokens,
                      torch.where(out.logits_cache == 0, SENTINEL, out.logits_cache), draft_top_k=3)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("table, target, message", [
    (torch.zeros(DRAFT_V - 1, dtype=torch.int64), None, "d2t: expected shape"),
    (torch.zeros(DRAFT_V, 1, dtype=torch.int64), None, "d2t: expected shape"),
    (torch.zeros(DRAFT_V, dtype=torch.float32), None, "d2t: expected dtype int32 or int64"),
    ([0] * DRAFT_V, None, "d2t: expected a torch.Tensor"),
    (torch.full((DRAFT_V,), TARGET_V, dtype=torch.int64), None, "d2t: expected target ids"),
    (torch.full((DRAFT_V,), -1, dtype=torch.int64), None, "d2t: expected target ids"),
    (torch.cat([torch.tensor([1]), torch.zeros(DRAFT_V - 1, dtype=torch.int64)]), None, "d2t: expected distinct"),
    (torch.zeros(DRAFT_V, dtype=torch.int64), TARGET_V + 1, "target_vocab_size: expected an int in"),
    (torch.zeros(DRAFT_V, dtype=torch.int64), DRAFT_V - 1, "target_vocab_size: expected an int in"),
    (torch.zeros(DRAFT_V, dtype=torch.int64), 400.0, "target_vocab_size: expected an int in"),
    (None, 400, "target_vocab_size: only meaningful"),
])
def test_bad_d2t(table, target, message):
    head = exact_head(DRAFT_V, TARGET_V, RANK, d2t=False)
    with pytest.raises(ValueError, match=message):
        dm.MarkovHead(head.embed_weight, head.head_weight, d2t=table, target_vocab_size=target)


def test_d2t_twice_and_bad_top_k_and_unsupported_designs():
    head = exact_head(DRAFT_V, TARGET_V, RANK)
    with pytest.raises(ValueError, match="d2t: the head already has"):
        dm.MarkovSampler(head, 3, 4, impl="reference", d2t=head.d2t)
    for k, message in ((0, "draft_top_k: expected an int >= 1"), (DRAFT_V + 1, "draft_top_k: expected at most"),
                       (2.0, "draft_top_k: expected an int"), (True, "draft_top_k: expected an int")):
        with pytest.raises(ValueError, match=message):
            dm.MarkovSampler(head, 3, 4, impl="reference", draft_top_k=k)
    with pytest.raises(ValueError, match="d2t: impl 'gumbel_fused' has no reduced draft vocabulary"):
        dm.MarkovSampler(head, 3, 4, impl="gumbel_fused")
    with pytest.raises(ValueError, match="impl: expected one of 'reference', 'fused'"):
        dm.MarkovSampler(head, 3, 4, impl="chain", draft_top_k=4)
    inputs = modes_inputs(4, 3, DRAFT_V, TARGET_V)
    sampler = dm.MarkovSampler(head, 3, 4, impl="reference")
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    with pytest.raises(ValueError, match="logits_cache: expected shape"):
        sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache[:, :, :DRAFT_V])
    with pytest.raises(ValueError, match="markov_embeds: expected shape"):
        sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache,
                       markov_embeds=torch.zeros(4, 3, RANK + 1, dtype=head.dtype))
    with pytest.raises(ValueError, match="markov_embeds: expected dtype"):
        sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache,
                       markov_embeds=torch.zeros(4, 3, RANK, dtype=torch.float32))
    assert bool((cache == SENTINEL).all()), "a refused call wrote the cache"


# --------------------------------------------------------------------------- Triton designs (interpreter)
@pytest.mark.parametrize("d2t, k, cache_dtype, scale", [
    (True, 7, torch.bfloat16, 1.0),
    (False, 64, torch.float32, 0.5),
    (True, 1, torch.float32, 1.0),
])
def test_top_k_fused_equals_the_reference(d2t, k, cache_dtype, scale):
    head = exact_head(DRAFT_V, TARGET_V, 32, d2t=d2t, scale=scale, exact=False)
    inputs = modes_inputs(5, 3, DRAFT_V, TARGET_V)
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    embeds = torch.zeros(5, 3, 32, dtype=head.dtype)
    sampler = dm.MarkovSampler(head, 3, 8, cache_dtype=cache_dtype, impl="fused", draft_top_k=k)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=k, exact=False)
    assert torch.equal(embeds, markov_embeds_of(head, inputs["anchor"], tokens))
    # on a head with exact sums every bit equals the reference
    head = exact_head(DRAFT_V, TARGET_V, 32, d2t=d2t, scale=scale)
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    dm.MarkovSampler(head, 3, 5, cache_dtype=cache_dtype, impl="fused", draft_top_k=k).sample(
        **inputs, draft_tokens=tokens, logits_cache=cache)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=k, exact=True)


def test_top_k_fused_all_minus_inf_and_ties():
    # Greedy rows with -inf base logits draw token 0 (torch.argmax of an all -inf row); equal
    # candidates go to the lowest target id.
    head = exact_head(DRAFT_V, TARGET_V, 16)
    head = dm.MarkovHead(head.embed_weight, torch.zeros_like(head.head_weight), d2t=head.d2t, target_vocab_size=TARGET_V)
    inputs = modes_inputs(3, 2, DRAFT_V, TARGET_V, temps=(0.0,))
    inputs["base_logits"] = torch.zeros_like(inputs["base_logits"])
    inputs["base_logits"][1] = float("-inf")
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    dm.MarkovSampler(head, 2, 3, impl="fused", draft_top_k=9).sample(**inputs, draft_tokens=tokens, logits_cache=cache)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=9)
    assert int(tokens[1, 0]) == 0


@pytest.mark.parametrize("cache_dtype, scale, ordered", [(torch.bfloat16, 1.0, False), (torch.float32, 0.5, True)])
def test_fused_d2t_equals_the_reference(cache_dtype, scale, ordered):
    head = exact_head(DRAFT_V, TARGET_V, 16, scale=scale, exact=False, ordered=ordered)
    inputs = modes_inputs(5, 3, DRAFT_V, TARGET_V)
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    embeds = torch.zeros(5, 3, 16, dtype=head.dtype)
    dm.MarkovSampler(head, 3, 5, cache_dtype=cache_dtype, impl="fused").sample(
        **inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
    check_modes_draws(head, inputs, tokens, cache, exact=False)
    assert torch.equal(embeds, markov_embeds_of(head, inputs["anchor"], tokens))
    with pytest.raises(ValueError, match="method: impl 'fused' with a reduced vocabulary"):
        dm.MarkovSampler(head, 3, 5, impl="fused", method="inverse_cdf")


def test_chain_d2t_equals_the_reference():
    head = exact_head(DRAFT_V, TARGET_V, 16, scale=0.5, exact=False)
    inputs = modes_inputs(5, 3, DRAFT_V, TARGET_V)
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    dm.MarkovSampler(head, 3, 5, impl="chain").sample(**inputs, draft_tokens=tokens, logits_cache=cache)
    check_modes_draws(head, inputs, tokens, cache, exact=False)


@pytest.mark.parametrize("impl", ["fused", "chain"])
def test_d2t_last_tile_draft_mapped_to_target_zero(impl):
    """Regression: the draft id in the partial last tile that maps to target id 0 wins with z < 0. The
    tile's masked lanes also carried target id 0 (the d2t load's `other`) and z = 0, and the fast path
    took the winner's z from them (token 0 with the key of z = 0 instead of -20)."""
    draft, target, rank = 100, 128, 16
    ids = torch.arange(draft)
    ids[99], ids[0] = 0, 99  # draft 99 -> target 0 (last, partial tile), draft 0 -> target 99
    head = dm.MarkovHead(torch.zeros(target, rank, dtype=torch.bfloat16), torch.zeros(draft, rank, dtype=torch.bfloat16),
                         d2t=ids - torch.arange(draft), target_vocab_size=target)
    base = torch.full((1, 1, draft), -10.0, dtype=torch.bfloat16)
    base[..., 64:] = -100.0
    base[..., 99] = -20.0
    args = dict(anchor=torch.zeros(1, dtype=torch.int64), idx_mapping=torch.zeros(1, dtype=torch.int64),
                positions=torch.full((1,), 5, dtype=torch.int64), temperature=torch.ones(1))
    for seed in range(6):
        want = dm.sample_drafts(head, base, seeds=torch.tensor([seed * 7919 + 1]), impl="reference", **args)
        got = dm.sample_drafts(head, base, seeds=torch.tensor([seed * 7919 + 1]), impl=impl, **args)
        assert torch.equal(got.draft_tokens, want.draft_tokens), (seed, got.draft_tokens, want.draft_tokens)


def test_modes_auto_routes_what_the_fused_designs_refuse_to_the_reference_and_step_refuses_d2t():
    head = exact_head(DRAFT_V, TARGET_V, RANK)
    cuda = torch.device("cuda")
    from dspark_markov.draft import sampler as sampler_module

    assert sampler_module.MAX_TOP_K == 1024
    # inverse CDF with d2t or top-k, and k above the fused design's limit: the reference (was: a ValueError from
    # the 'fused' that auto picked); built on the CPU, so the check is the choice itself
    for options in ({"method": "inverse_cdf"}, {"method": "inverse_cdf", "draft_top_k": 4}):
        assert dm.MarkovSampler(head, 2, 2, impl="auto", **options).impl == "reference"
    big = dm.MarkovHead(torch.randn(2000, RANK).bfloat16(), torch.randn(1500, RANK).bfloat16())
    assert dm.MarkovSampler(big, 2, 2, impl="auto", draft_top_k=1025).impl == "reference"
    assert cuda.type == "cuda"
    with pytest.raises(ValueError, match="head: DSparkStep does not take a reduced draft vocabulary"):
        dm.DSparkStep(head, lambda ids, pos: None, num_steps=2, max_reqs=2, num_slots=2, mask_token_id=1,
                      max_model_len=100)
    from dspark_markov.draft.custom_op import sample_drafts_

    with pytest.raises(ValueError, match="head: the custom op has no reduced draft vocabulary"):
        sample_drafts_(head, *([None] * 8))
