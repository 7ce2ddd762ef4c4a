"""Draft samplers against their distribution: sample_drafts(impl="reference") draws ~ softmax(cache / T).

Each trial is one row with its own slot and seed; all trials run as the rows of one call. Rows of
one step that share the previous token (and temperature) share their cached logits, so their
draws are one multinomial sample, tested by a chi-square per group with the threshold
``df + 10 sqrt(2 df)``. T = 0 must equal ``torch.argmax`` of the cache exactly.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.demo.generate import chi_square, chi_square_threshold

VOCAB = 40
STEPS = 3
ROWS = 4000


def _head(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB, 2, generator=g)
    head = torch.randn(VOCAB, 2, generator=g)
    return dm.MarkovHead(embed.to(dtype), head.to(dtype))


def _draw(method, temperatures, cache_dtype, *, rows=ROWS, seed=1):
    """One call over ``rows`` trials; temperature of row r is ``temperatures[r % len]``."""
    g = torch.Generator().manual_seed(seed)
    head = _head(seed)
    base = (torch.randn(1, STEPS, VOCAB, generator=g) * 1.5).expand(rows, STEPS, VOCAB).contiguous()
    anchor = torch.full((rows,), 7, dtype=torch.int64)
    slots = torch.randperm(rows, generator=g)  # distinct slots in a shuffled order
    temperature = torch.empty(rows, dtype=torch.float32)
    temp_id = torch.arange(rows) % len(temperatures)
    temperature[slots] = torch.tensor(temperatures, dtype=torch.float32)[temp_id]
    seeds = torch.randint(-(2**62), 2**62, (rows,), generator=g)
    positions = (torch.randint(1, 5000, (rows, 1), generator=g) + torch.arange(STEPS)).reshape(-1)
    out = dm.sample_drafts(head, base, anchor, slots.repeat_interleave(STEPS), positions, temperature, seeds,
                           method=method, impl="reference", cache_dtype=cache_dtype)
    return out, slots, temperature, temp_id, anchor


def _grouped_counts(out, slots, temperature, temp_id, anchor, step, n_temps, temperature_override=None):
    """Observed and expected counts per (previous token, temperature) group of one step."""
    prev = anchor if step == 0 else out.draft_tokens[:, step - 1]
    group = prev * n_temps + temp_id
    n_groups = VOCAB * n_temps
    token = out.draft_tokens[:, step]
    observed = torch.zeros(n_groups * VOCAB, dtype=torch.float64)
    observed.index_add_(0, group * VOCAB + token, torch.ones_like(token, dtype=torch.float64))
    temp = temperature[slots] if temperature_override is None else temperature_override
    probs = torch.softmax(out.logits_cache[slots, step].float() / temp[:, None], dim=-1).double()
    expected = torch.zeros(n_groups, VOCAB, dtype=torch.float64).index_add_(0, group, probs)
    return observed.view(n_groups, VOCAB), expected


@pytest.mark.parametrize("temperatures", [(1.0,), (0.6,), (0.6, 1.3)], ids=["T1", "T0.6", "mixed"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_draws_follow_softmax_of_cache(method, cache_dtype, temperatures):
    out, slots, temperature, temp_id, anchor = _draw(method, temperatures, cache_dtype)
    assert bool((out.draft_tokens >= 0).all()) and bool((out.draft_tokens < VOCAB).all())
    for step in range(STEPS):
        observed, expected = _grouped_counts(out, slots, temperature, temp_id, anchor, step, len(temperatures))
        statistic, dof = chi_square(observed, expected)
        assert dof >= VOCAB // 2
        assert statistic <= chi_square_threshold(dof), f"step {step}: {statistic:.1f} on {dof} df"


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_negative_control_wrong_temperature_is_detected(method):
    """The same statistic rejects draws at T = 1 tested against softmax(cache / 0.8)."""
    out, slots, temperature, temp_id, anchor = _draw(method, (1.0,), torch.float32, seed=2)
    wrong = torch.full((ROWS,), 0.8)
    observed, expected = _grouped_counts(out, slots, temperature, temp_id, anchor, 0, 1, temperature_override=wrong)
    statistic, dof = chi_square(observed, expected)
    assert statistic > chi_square_threshold(dof)


def test_gumbel_and_inverse_cdf_differ_in_tokens():
    gumbel = _draw("gumbel", (1.0,), torch.float32, rows=500)[0]
    inverse = _draw("inverse_cdf", (1.0,), torch.float32, rows=500)[0]
    assert not torch.equal(gumbel.draft_tokens[:, 0], inverse.draft_tokens[:, 0])


def test_seed_changes_draws_and_same_seed_repeats():
    first = _draw("gumbel", (1.0,), torch.float32, rows=300, seed=4)[0]
    again = _draw("gumbel", (1.0,), torch.float32, rows=300, seed=4)[0]
    other = _draw("gumbel", (1.0,), torch.float32, rows=300, seed=5)[0]
    assert torch.equal(first.draft_tokens, again.draft_tokens)
    assert not torch.equal(first.draft_tokens, other.draft_tokens)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_temperature_zero_is_torch_argmax(method, cache_dtype):
    out, slots, _, _, _ = _draw(method, (0.0,), cache_dtype, rows=257)
    for step in range(STEPS):
        assert torch.equal(out.draft_tokens[:, step], torch.argmax(out.logits_cache[slots, step], dim=-1))


def test_temperature_zero_ties_take_the_first_maximum():
    head = dm.MarkovHead(torch.zeros(VOCAB, 2), torch.zeros(VOCAB, 2))
    base = torch.zeros(3, 1, VOCAB)
    base[:, 0, 5] = 2.0
    base[:, 0, 9] = 2.0
    base[2, 0, 1] = float("nan")  # a NaN wins, as in torch.argmax
    for method in ("gumbel", "inverse_cdf"):
        out = dm.sample_drafts(head, base, torch.zeros(3, dtype=torch.int64), torch.arange(3), torch.arange(3),
                               torch.zeros(3), torch.arange(3), method=method, cache_dtype=torch.float32)
        assert out.draft_tokens[:, 0].tolist() == [5, 5, 1]
