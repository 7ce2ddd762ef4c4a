"""verify_drafts (SPEC.md section 6): losslessness over many rounds, structure, keys, validation.

Statistical tests use fixed seeds and the threshold ``df + 10 sqrt(2 df)`` (about seven standard
deviations of a chi-square with ``df`` degrees of freedom), so a correct implementation fails with
negligible probability and a biased one fails with high probability (see the negative controls).
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.demo.generate import (BigramLanguage, chi_square, chi_square_threshold, fit_markov_head, pair_counts,
                                speculative_generate)
from dspark_markov.draft.reference import argmax_first
from dspark_markov.verify import keys

VOCAB = 16


def _language():
    # Mildly peaked rows and a rank-1 head: drafts are accepted about half the time, so the
    # accept, residual and bonus paths all occur often.
    return BigramLanguage(VOCAB, period=2, rank=3, sharpness=2.0, seed=3)


def _drafter(language, cache_dtype):
    log_mu = language.marginals().log().float()
    head = fit_markov_head(language, rank=1)

    def base_logits_fn(position):
        return log_mu[position % language.period].to(torch.float32 if cache_dtype == torch.float32 else torch.bfloat16)

    return head, base_logits_fn


def _assert_chi_square(observed, expected, what):
    statistic, dof = chi_square(observed, expected)
    assert dof > 0, what
    threshold = chi_square_threshold(dof)
    assert statistic <= threshold, f"{what}: chi-square {statistic:.1f} on {dof} df > {threshold:.1f}"
    return statistic, dof


def _generate(method, temperature, cache_dtype, *, batch=2000, length=6, k=3, draft_method="gumbel", seed=11):
    language = _language()
    head, base_logits_fn = _drafter(language, cache_dtype)
    anchor = torch.full((batch,), 5, dtype=torch.int64)
    start = torch.full((batch,), 40, dtype=torch.int64)
    temp = torch.full((batch,), temperature, dtype=torch.float32)
    seeds = torch.arange(batch, dtype=torch.int64) * 7919 + seed * (1 << 40)

    def target_logits_fn(prev, position):
        return language.logits(prev, position) / temperature

    result = speculative_generate(target_logits_fn, base_logits_fn, head, anchor, start, length, num_steps=k,
                                  temperature=temp, seeds=seeds, method=method, draft_method=draft_method,
                                  cache_dtype=cache_dtype)
    return language, anchor, start, result


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("method", ["standard", "block"])
def test_multi_round_output_follows_target(method, temperature, cache_dtype):
    """Each trial is one request (its own seed) generating 6 tokens over several draft-verify rounds.

    Every request keeps its seed across rounds, so positions after a rejection are re-drafted at a
    different step in the next round on the same request state: a reused noise would bias them.
    Checks the marginal of every position against the exact chain, and the (prev, next) pairs
    against the target's conditional distribution.
    """
    length = 6
    language, anchor, start, result = _generate(method, temperature, cache_dtype, length=length)
    tokens = result.tokens
    assert bool((tokens >= 0).all()) and bool((tokens < VOCAB).all())
    assert result.rounds >= 3  # several rounds, so positions were re-drafted
    assert 0.3 < result.accepted < 2.7  # partial acceptance: every path of verification is used
    marginals = language.position_marginals(5, 40, length, temperature)
    batch = tokens.shape[0]
    for t in range(length):
        observed = torch.bincount(tokens[:, t], minlength=VOCAB).double()
        _assert_chi_square(observed, marginals[t] * batch, f"position {t}")
    observed, expected = pair_counts(language, anchor, start, tokens, temperature)
    _assert_chi_square(observed, expected, "pairs")


def test_multi_round_inverse_cdf_drafts():
    """Drafts from the inverse-CDF sampler are verified against the same q: still lossless."""
    language, anchor, start, result = _generate("standard", 1.0, torch.bfloat16, draft_method="inverse_cdf",
                                                length=4, seed=5)
    marginals = language.position_marginals(5, 40, 4, 1.0)
    for t in range(4):
        observed = torch.bincount(result.tokens[:, t], minlength=VOCAB).double()
        _assert_chi_square(observed, marginals[t] * result.tokens.shape[0], f"position {t}")


def test_block_accepts_at_least_as_many_as_standard():
    accepted = {}
    for method in ("standard", "block"):
        accepted[method] = _generate(method, 1.0, torch.float32, batch=1500, length=12, k=4, seed=2)[3].accepted
    # Block verification is optimal in expected accepted length; allow 3 % for sampling noise.
    assert accepted["block"] >= accepted["standard"] * 0.97, accepted


def test_block_verification_toy_example():
    """The example of Sun et al. 2024: p = (1/3, 2/3), q = (2/3, 1/3), two drafts.

    Expected accepted tokens: 10/9 token by token, 11/9 by block. 200,000 trials; the standard
    deviation of the mean is below 0.002, so 0.01 is five standard deviations.
    """
    batch, k = 200_000, 2
    p = torch.tensor([1 / 3, 2 / 3])
    q = torch.tensor([2 / 3, 1 / 3])
    target = p.log().expand(batch, k + 1, 2).contiguous()
    cache = q.log().expand(batch, k, 2).contiguous()
    drafts = torch.multinomial(q, batch * k, replacement=True, generator=torch.Generator().manual_seed(0)).view(batch, k)
    args = (target, drafts, cache, torch.full((batch,), k), torch.arange(batch), torch.full((batch,), 9),
            torch.ones(batch), torch.arange(batch) * 104729 + 17)
    standard = dm.verify_drafts(*args, method="standard")
    block = dm.verify_drafts(*args, method="block")
    assert abs(float((standard.num_emitted - 1).float().mean()) - 10 / 9) < 0.01
    assert abs(float((block.num_emitted - 1).float().mean()) - 11 / 9) < 0.01
    for out in (standard, block):  # the first emitted token follows p
        first = torch.bincount(out.tokens[:, 0], minlength=2).double()
        _assert_chi_square(first, p.double() * batch, "first token")


def _one_round(draft_temperature, verify_temperature, *, batch=6000, k=2, method="standard", seed=0):
    """One round from a fixed state: draws with sample_drafts, verifies with the given temperature."""
    language = _language()
    head, base_logits_fn = _drafter(language, torch.float32)
    position = torch.full((batch,), 30, dtype=torch.int64)
    steps = position[:, None] + torch.arange(k)
    anchor = torch.full((batch,), 2, dtype=torch.int64)
    slots = torch.arange(batch)
    seeds = slots * 31337 + seed
    draft = dm.sample_drafts(head, base_logits_fn(steps), anchor, slots.repeat_interleave(k), steps.reshape(-1),
                             torch.full((batch,), draft_temperature), seeds, cache_dtype=torch.float32)
    prev = torch.cat([anchor[:, None], draft.draft_tokens], dim=1)
    target = language.logits(prev, position[:, None] + torch.arange(k + 1))
    out = dm.verify_drafts(target, draft.draft_tokens, draft.logits_cache, torch.full((batch,), k), slots, position,
                           torch.full((batch,), verify_temperature), seeds, method=method)
    expected = torch.softmax(language.logits(anchor[:1], position[:1]).double(), dim=-1)[0] * batch
    return out, torch.bincount(out.tokens[:, 0], minlength=VOCAB).double(), expected


@pytest.mark.parametrize("method", ["standard", "block"])
def test_one_round_first_token_and_negative_control(method):
    out, observed, expected = _one_round(0.5, 0.5, method=method)
    _assert_chi_square(observed, expected, "first token")
    # Negative control: verifying against the wrong draft distribution (T = 1 instead of 0.5)
    # breaks losslessness, and the same test must see it.
    _, observed_bad, _ = _one_round(0.5, 1.0, method=method)
    statistic, dof = chi_square(observed_bad, expected)
    assert statistic > chi_square_threshold(dof)


# --------------------------------------------------------------------------- structure
def _random_case(batch=7, k=4, vocab=33, slots=9, seed=0, cache_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    cache = (torch.randn(slots, k + 1, vocab, generator=g) * 2).to(cache_dtype)
    idx = torch.randperm(slots, generator=g)[:batch]
    temperature = torch.rand(slots, generator=g) + 0.3
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    positions = torch.randint(1, 10_000, (batch,), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
    # Drafts drawn from q with the reference Gumbel draw, so the inputs are self-consistent.
    drafts = torch.stack([dm.draft.reference.draw_gumbel(cache[idx, i], temperature[idx], seeds[idx], i,
                                                         positions + i) for i in range(k)], dim=1)
    return target, drafts, cache, num_drafts, idx, positions, temperature, seeds


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_structure(method, cache_dtype):
    for seed in range(5):
        target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=seed,
                                                                                             cache_dtype=cache_dtype)
        idx = idx.clone()
        idx[1] = -1  # a padding request
        drafts[1] = -1  # its drafts are ignored, whatever they hold
        out = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds, method=method)
        assert isinstance(out, dm.VerifyOutput)
        assert out.tokens.dtype == torch.int64 and out.num_emitted.dtype == torch.int64
        assert out.tokens.shape == (7, 5) and out.num_emitted.shape == (7,)
        assert int(out.num_emitted[1]) == 0 and bool((out.tokens[1] == -1).all())
        for b in range(7):
            if b == 1:
                continue
            count = int(out.num_emitted[b])
            assert 1 <= count <= int(num_drafts[b]) + 1
            assert out.tokens[b, :count - 1].tolist() == drafts[b, :count - 1].tolist()  # accepted prefix
            assert 0 <= int(out.tokens[b, count - 1]) < 33
            assert bool((out.tokens[b, count:] == -1).all())
        again = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds, method=method)
        assert torch.equal(again.tokens, out.tokens) and torch.equal(again.num_emitted, out.num_emitted)


def test_batch_composition_does_not_change_results():
    target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=4)
    full = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds)
    perm = torch.tensor([3, 0, 6])
    part = dm.verify_drafts(target[perm], drafts[perm], cache, num_drafts[perm], idx[perm], positions[perm],
                            temperature, seeds)
    assert torch.equal(part.tokens, full.tokens[perm]) and torch.equal(part.num_emitted, full.num_emitted[perm])


def test_identical_draft_and_target_accepts_everything():
    target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=1)
    same_target = (cache[idx, :5].float() / temperature[idx, None, None]).contiguous()
    for method in ("standard", "block"):
        out = dm.verify_drafts(same_target, drafts, cache, num_drafts, idx, positions, temperature, seeds,
                               method=method)
        assert torch.equal(out.num_emitted, num_drafts + 1)


def test_greedy_target_is_exact_argmax():
    target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=2)
    temperature = temperature.clone()
    temperature[idx[::2]] = 0.0  # these requests are greedy (default target_greedy: slot T == 0)
    drafts = drafts.clone()
    greedy_rows = torch.arange(7)[::2]
    argmax = torch.argmax(target, dim=-1)
    drafts[greedy_rows, :2] = argmax[greedy_rows, :2]  # the first two drafts agree with the target
    drafts[greedy_rows, 2] = (argmax[greedy_rows, 2] + 1) % 33  # the third does not
    num_drafts = torch.full((7,), 4)
    for method in ("standard", "block"):
        out = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds, method=method)
        for b in greedy_rows.tolist():
            assert int(out.num_emitted[b]) == 3
            assert out.tokens[b, :3].tolist() == argmax[b, :3].tolist()
    # An explicit target_greedy overrides the temperature; all-accepted greedy emits the argmax bonus.
    drafts = argmax[:, :4].clone()
    out = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds,
                           target_greedy=torch.ones(7, dtype=torch.bool))
    assert torch.equal(out.tokens, argmax) and bool((out.num_emitted == 5).all())


def test_greedy_drafts_with_probabilistic_target():
    """Draft T = 0: q is one-hot at the cached argmax; acceptance probability is p(x)."""
    batch, vocab = 20000, 8
    g = torch.Generator().manual_seed(7)
    cache = torch.randn(1, 1, vocab, generator=g).expand(batch, 1, vocab).contiguous()
    x = argmax_first(cache[:, 0])
    target = torch.randn(1, 2, vocab, generator=g).expand(batch, 2, vocab).contiguous()
    p0 = torch.softmax(target[0, 0].double(), dim=-1)
    out = dm.verify_drafts(target, x[:, None], cache, torch.ones(batch, dtype=torch.int64), torch.arange(batch),
                           torch.full((batch,), 3), torch.zeros(batch), torch.arange(batch) * 3 + 1,
                           target_greedy=torch.zeros(batch, dtype=torch.bool))
    first = torch.bincount(out.tokens[:, 0], minlength=vocab).double()
    _assert_chi_square(first, p0 * batch, "first token")
    accept_rate = float((out.num_emitted == 2).double().mean())
    assert abs(accept_rate - float(p0[x[0]])) < 5 * (0.25 / batch) ** 0.5


def test_no_drafts_is_a_keyed_target_sample():
    batch, vocab = 30000, 12
    g = torch.Generator().manual_seed(9)
    target = torch.randn(1, 1, vocab, generator=g).expand(batch, 1, vocab).contiguous()
    out = dm.verify_drafts(target, torch.zeros(batch, 0, dtype=torch.int64), torch.zeros(batch, 1, vocab),
                           torch.zeros(batch, dtype=torch.int64), torch.arange(batch), torch.full((batch,), 77),
                           torch.ones(batch), torch.arange(batch) + 1000)
    assert bool((out.num_emitted == 1).all())
    _assert_chi_square(torch.bincount(out.tokens[:, 0], minlength=vocab).double(),
                       torch.softmax(target[0, 0].double(), -1) * batch, "bonus")


def test_all_padding_and_no_slots():
    target = torch.randn(3, 3, 10)
    out = dm.verify_drafts(target, torch.zeros(3, 2, dtype=torch.int64), torch.zeros(0, 2, 10),
                           torch.full((3,), 2), torch.full((3,), -1), torch.zeros(3, dtype=torch.int64),
                           torch.zeros(0), torch.zeros(0, dtype=torch.int64))
    assert bool((out.tokens == -1).all()) and bool((out.num_emitted == 0).all())


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_every_input_on_another_device_is_refused_by_name(impl):
    """All inputs on one device other than CPU or CUDA ('meta'): the device checks pass (the same device everywhere),
    so the value checks read values a meta tensor does not have (a RuntimeError from torch before; helper audit)."""
    case = [x.to("meta") for x in _random_case()]
    with pytest.raises(ValueError, match="^target_logits: expected a CPU or CUDA tensor"):
        dm.verify_drafts(*case, impl=impl)


def test_nan_logits_stay_in_range():
    target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=3)
    target[0, :] = float("nan")
    target[2, :] = float("-inf")
    cache[idx[3]] = float("nan")
    for method in ("standard", "block"):
        out = dm.verify_drafts(target, drafts, cache, num_drafts, idx, positions, temperature, seeds, method=method)
        emitted = out.tokens[out.tokens >= 0]
        assert bool((emitted < 33).all())
        assert bool((out.num_emitted >= 1).all())


@pytest.mark.parametrize("method", ["standard", "block"])
def test_masked_target_tokens_are_never_emitted(method):
    """Exact support: tokens with -inf target logits (e.g. outside a top-k) are never emitted,
    although the drafts propose them often (they are rejected: p = 0 gives ratio 0)."""
    batch, vocab, k = 3000, 10, 3
    g = torch.Generator().manual_seed(13)
    cache = torch.randn(1, k, vocab, generator=g).expand(batch, k, vocab).contiguous()
    slots = torch.arange(batch)
    seeds = slots * 977 + 5
    position = torch.full((batch,), 50)
    temp = torch.ones(batch)
    drafts = torch.stack([dm.draft.reference.draw_gumbel(cache[:, i], temp, seeds, i, position + i)
                          for i in range(k)], dim=1)
    target = torch.randn(1, k + 1, vocab, generator=g).expand(batch, k + 1, vocab).clone()
    target[..., ::2] = float("-inf")  # even tokens are masked
    assert bool((drafts % 2 == 0).any())
    out = dm.verify_drafts(target, drafts, cache, torch.full((batch,), k), slots, position, temp, seeds,
                           method=method)
    emitted = out.tokens[out.tokens >= 0]
    assert bool((emitted % 2 == 1).all())
    first = torch.bincount(out.tokens[:, 0], minlength=vocab).double()
    _assert_chi_square(first, torch.softmax(target[0, 0].double(), -1) * batch, "first token")


# --------------------------------------------------------------------------- keys
def test_redrafted_position_gets_fresh_noise():
    seed = torch.tensor([[123456789]])
    position = torch.tensor([[500]])
    tokens = torch.arange(4096)
    step0 = rng.draft_noise(seed, 0, position, tokens)
    step1 = rng.draft_noise(seed, 1, position, tokens)
    assert not torch.equal(step0, step1)
    assert float((step0 == step1).double().mean()) < 0.01
    u0 = rng.inverse_cdf_uniform(seed, 0, position)
    u1 = rng.inverse_cdf_uniform(seed, 1, position)
    assert float(u0) != float(u1)


def test_verification_keys_are_apart_from_draft_keys():
    """Same seeds and positions: verification hashes never equal draft hashes, and are uncorrelated."""
    n = 20000
    seeds = torch.arange(n, dtype=torch.int64)[:, None] * 2654435761
    positions = torch.arange(n, dtype=torch.int64)[:, None] % 997 + 1
    u_accept = keys.accept_uniforms(seeds, positions, 3)  # [n, 3]
    g_resample = keys.resample_noise(seeds, positions, torch.arange(3))
    for step in range(3):
        u_draft = rng.inverse_cdf_uniform(seeds, step, positions)  # [n, 1]
        g_draft = rng.draft_noise(seeds, step, positions, torch.arange(3))
        for a, b in ((u_accept, u_draft.expand(-1, 3)), (g_resample, g_draft)):
            assert float((a == b).double().mean()) < 0.001
            corr = torch.corrcoef(torch.stack([a.reshape(-1).double(), b.reshape(-1).double()]))[0, 1]
            assert abs(float(corr)) < 5 / (3 * n) ** 0.5
    # Rounds of a request start at increasing positions: their uniforms differ.
    assert not torch.equal(keys.accept_uniforms(seeds, positions, 3), keys.accept_uniforms(seeds, positions + 1, 3))


def test_accept_uniform_definition():
    seed, pos = torch.tensor([[-5]]), torch.tensor([[1234]])
    u = keys.accept_uniforms(seed, pos, 2)
    for i in range(2):
        h = rng.murmur3_hash32(seed, pos - 1, torch.tensor(i), domain=keys.ACCEPT_DOMAIN)
        assert float(u[0, i]) == float(rng.uniform32(h))


# --------------------------------------------------------------------------- validation
def test_validation_errors_name_the_argument():
    target, drafts, cache, num_drafts, idx, positions, temperature, seeds = _random_case(seed=0)
    args = dict(target_logits=target, draft_tokens=drafts, logits_cache=cache, num_drafts=num_drafts,
                idx_mapping=idx, positions=positions, temperature=temperature, seeds=seeds)

    def call(**changes):
        kwargs = dict(args)
        extra = {key: changes.pop(key) for key in ("method", "impl", "target_greedy") if key in changes}
        kwargs.update(changes)
        return dm.verify_drafts(*kwargs.values(), **extra)

    cases = [
        ("target_logits", dict(target_logits=target.double())),
        ("target_logits", dict(target_logits=target[0])),
        ("draft_tokens", dict(draft_tokens=drafts[:, :3])),
        ("draft_tokens", dict(draft_tokens=drafts.float())),
        ("logits_cache", dict(logits_cache=cache[:, :3])),  # N < K
        ("logits_cache", dict(logits_cache=cache[..., :32])),
        ("logits_cache", dict(logits_cache=cache.half())),
        ("num_drafts", dict(num_drafts=num_drafts + 5)),
        ("num_drafts", dict(num_drafts=num_drafts - 1 - num_drafts.max())),
        ("idx_mapping", dict(idx_mapping=idx + 100)),
        ("positions", dict(positions=positions[:3])),
        ("temperature", dict(temperature=-temperature)),
        ("seeds", dict(seeds=seeds.int())),
        ("draft_tokens", dict(draft_tokens=drafts + 33, num_drafts=torch.full((7,), 4))),
        ("target_greedy", dict(target_greedy=torch.ones(7))),
        ("method", dict(method="tree")),
        ("impl", dict(impl="triton_nope")),
    ]
    for name, changes in cases:
        with pytest.raises(ValueError, match=name):
            call(**changes)


@pytest.mark.parametrize("method", ["standard", "block"])
def test_one_round_joint_distribution_of_the_whole_block(method):
    """The emitted block, completed by sampling the target, has the target's joint distribution.

    V = 4, K = 3: all 256 sequences of 4 tokens are cells of one chi-square over 60,000 trials.
    Checks every position of the block at once, including the block method's later drafts.
    """
    vocab, k, batch = 4, 3, 60000
    g = torch.Generator().manual_seed(21)
    transition = torch.randn(vocab, vocab, generator=g) * 1.2  # target: logits A[prev] + c[row]
    row_bias = torch.randn(k + 1, vocab, generator=g) * 0.5
    head = dm.MarkovHead(torch.randn(vocab, 2, generator=g), torch.randn(vocab, 2, generator=g))
    base = (torch.randn(1, k, vocab, generator=g)).expand(batch, k, vocab).contiguous()
    anchor = torch.full((batch,), 1, dtype=torch.int64)
    slots = torch.arange(batch)
    seeds = slots * 6364136223846793005 + 1442695040888963407
    position = torch.full((batch,), 1000, dtype=torch.int64)
    steps = position[:, None] + torch.arange(k)
    temp = torch.full((batch,), 0.8)
    draft = dm.sample_drafts(head, base, anchor, slots.repeat_interleave(k), steps.reshape(-1), temp, seeds,
                             cache_dtype=torch.float32)
    prev = torch.cat([anchor[:, None], draft.draft_tokens], dim=1)
    target = (transition[prev] + row_bias).contiguous()
    out = dm.verify_drafts(target, draft.draft_tokens, draft.logits_cache, torch.full((batch,), k), slots, position,
                           temp, seeds, method=method)
    sequence = out.tokens.clone()
    for j in range(k + 1):  # complete each block by sampling the target (torch's own generator)
        last = anchor if j == 0 else sequence[:, j - 1]
        fresh = torch.multinomial(torch.softmax(transition[last] + row_bias[j], dim=-1), 1, generator=g)[:, 0]
        sequence[:, j] = torch.where(j < out.num_emitted, sequence[:, j], fresh)
    code = sequence @ (vocab ** torch.arange(k, -1, -1))
    observed = torch.bincount(code, minlength=vocab ** (k + 1)).double()
    joint = torch.ones(1, dtype=torch.float64)
    prev_token = torch.tensor([1])
    for j in range(k + 1):  # exact joint over all sequences, in the same base-V order
        cond = torch.softmax((transition + row_bias[j]).double(), dim=-1)  # [prev, next]
        joint = (joint[:, None] * cond[prev_token]).reshape(-1)
        prev_token = torch.arange(vocab).repeat(vocab ** j)
    _assert_chi_square(observed, joint * batch, "joint block")
    assert float((out.num_emitted - 1).double().mean()) > 0.5  # drafts are often accepted
