"""The reference sampler (``impl="reference"``) against SPEC.md, re-implemented here row by row.

``expected_drafts`` below is a deliberately plain reading of SPEC.md sections 1-4: one row and one
step at a time, NumPy for the uniforms and the argmax, float64 for the bias. Only the hash
(``murmur3_hash32``, pinned by known answers in test_rng.py) and the bit-exact fp32 noise
(``gumbel32``, SPEC.md's ``-log(-L(u))`` with the software log) come from the package.

The Markov head weights are multiples of 1/8 with a small rank, so every product and partial sum
of the bias is exact in fp32 and in float64 whatever the summation order: the bias is one value,
rounded once to the weight dtype, and the whole chain can be compared bit for bit.
"""

import math

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft.sampler import MarkovSampler

SALT = 2**30
RANK = 16


# --------------------------------------------------------------------------- the plain reading of SPEC.md
def spec_uniform32(h: np.ndarray) -> np.ndarray:
    """``u = float(h >> 16) 2^-16 + (float(h & 0xFFFF) + 0.5) 2^-32``, fp32, one rounding."""
    high = (h >> 16).astype(np.float32) * np.float32(2.0**-16)
    low = ((h & 0xFFFF).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-32)
    return (high + low).astype(np.float32)


def spec_uniform64(h_hi: np.ndarray, h_lo: np.ndarray) -> np.ndarray:
    bits = ((h_hi.astype(np.uint64) << np.uint64(32)) | h_lo.astype(np.uint64)) >> np.uint64(11)
    u = (bits.astype(np.float64) + 0.5) * 2.0**-53
    return np.where(u == 1.0, u - 2.0**-53, u)


def spec_argmax(keys: np.ndarray) -> int:
    """torch.argmax over a row: the first NaN, else the first maximum (an all -inf row gives 0)."""
    nan = np.flatnonzero(np.isnan(keys))
    if nan.size:
        return int(nan[0])
    best = 0
    for v in range(1, keys.size):
        if keys[v] > keys[best]:
            best = v
    return best


def spec_bias(w1: torch.Tensor, w2: torch.Tensor, scale: float, prev: int) -> torch.Tensor:
    """``round_w(sum_k W1[prev, k] W2[v, k])`` times ``scale`` (rounded again if != 1); ``[V]``."""
    acc = w2.double() @ w1[prev].double()  # exact: see the module docstring
    bias = acc.float().to(w1.dtype)
    if scale != 1.0:
        bias = (bias.double() * scale).float().to(w1.dtype)  # scale is exact in fp32 in these tests
    return bias


def spec_noise(seed: int, step: int, position: int, vocab: int, fp64: bool) -> np.ndarray:
    key_seed = torch.tensor(seed ^ (step << 32), dtype=torch.int64)
    key_pos = torch.tensor(position - 1 + SALT, dtype=torch.int64)
    tokens = torch.arange(vocab)
    h = dm.murmur3_hash32(key_seed, key_pos, tokens).numpy()
    if not fp64:
        return dm.gumbel32(torch.from_numpy(spec_uniform32(h))).numpy()
    h_hi = dm.murmur3_hash32(key_seed, key_pos, tokens, domain=0x9E3779B9).numpy()  # vLLM's word order
    return -np.log(-np.log(spec_uniform64(h_hi, h)))


def expected_drafts(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, cache, *,
                    fp64=False):
    """SPEC.md sections 1-4 for Gumbel draws, one row and one step at a time; writes into ``cache``."""
    rows, steps, vocab = base_logits.shape
    tokens = np.zeros((rows, steps), dtype=np.int64)
    for r in range(rows):
        prev = int(anchor[r])
        for i in range(steps):
            slot = int(idx_mapping[r * steps + i])
            temp = float(temperature[slot]) if slot >= 0 else 0.0
            seed = int(seeds[slot]) if slot >= 0 else 0
            bias = spec_bias(head.embed_weight, head.head_weight, head.scale, prev)
            z = (base_logits[r, i].float() + bias.float()).to(cache.dtype)
            if slot >= 0:
                cache[slot, i] = z
            logits = z.float().numpy()
            if temp == 0.0:
                keys = logits
            else:
                scaled = logits / np.float32(temp)  # fp32 division
                noise = spec_noise(seed, i, int(positions[r * steps + i]), vocab, fp64)
                keys = scaled.astype(np.float64) + noise if fp64 else scaled + noise
            prev = spec_argmax(keys)
            tokens[r, i] = prev
    return torch.from_numpy(tokens)


# --------------------------------------------------------------------------- problem builders
def exact_head(vocab, dtype, scale=1.0, extra_rows=3, seed=0):
    """Weights k/8, |k| <= 8: exact products and sums (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randint(-8, 9, (vocab + extra_rows, RANK), generator=gen).to(dtype) / 8
    w2 = torch.randint(-8, 9, (vocab, RANK), generator=gen).to(dtype) / 8
    return dm.MarkovHead(w1, w2, scale)


def make_problem(rows, steps, vocab, *, logit_dtype=torch.float32, temps=(1.0,), padding=(), index_dtype=torch.int64,
                 strided=False, seed=0, logit_scale=3.0):
    """Inputs of one call; rows in ``padding`` are padding at every step; slots are shuffled."""
    gen = torch.Generator().manual_seed(1000 + seed)
    if strided:  # a slice of a bigger tensor: row stride != N * V, step stride != V
        big = (torch.randn(rows, steps + 2, vocab + 9, generator=gen) * logit_scale).to(logit_dtype)
        base = big[:, 1:steps + 1, 4:4 + vocab]
        assert base.stride(0) != steps * vocab and base.stride(-1) == 1
    else:
        base = (torch.randn(rows, steps, vocab, generator=gen) * logit_scale).to(logit_dtype)
    slots = rows + 3
    order = torch.randperm(slots, generator=gen)[:rows]  # row r lives in slot order[r]
    idx = order[:, None].repeat(1, steps)
    for r in padding:
        idx[r] = -1
    temperature = torch.tensor([temps[s % len(temps)] for s in range(slots)], dtype=torch.float32)
    seeds = torch.randint(-2**62, 2**62, (slots,), generator=gen, dtype=torch.int64)
    positions = torch.randint(0, 100000, (rows, 1), generator=gen) + torch.arange(steps)
    anchor = torch.randint(0, vocab + 3, (rows,), generator=gen)
    return dict(base_logits=base, anchor=anchor.to(index_dtype), idx_mapping=idx.reshape(-1).to(index_dtype),
                positions=positions.reshape(-1).to(index_dtype), temperature=temperature, seeds=seeds)


def poisoned_cache(slots, steps, vocab, dtype):
    return torch.full((slots, steps, vocab), float("nan"), dtype=dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN of the same payload)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    int_dtype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}[a.dtype]
    return torch.equal(a.contiguous().view(int_dtype), b.contiguous().view(int_dtype))


def run_both(head, problem, cache_dtype, *, method="gumbel", fp64=False):
    slots = problem["temperature"].shape[0]
    rows, steps, vocab = problem["base_logits"].shape
    cache = poisoned_cache(slots, steps, vocab, cache_dtype)
    tokens = torch.full((rows, steps), -7, dtype=torch.int64)
    out = dm.sample_drafts(head, **problem, draft_tokens=tokens, logits_cache=cache, method=method,
                           impl="reference", fp64=fp64)
    expected_cache = poisoned_cache(slots, steps, vocab, cache_dtype)
    expected_tokens = expected_drafts(head, **problem, cache=expected_cache, fp64=fp64) if method == "gumbel" else None
    return out, tokens, cache, expected_tokens, expected_cache


# --------------------------------------------------------------------------- bit-identical chains
TEMPS = {"greedy": (0.0,), "t06": (0.6,), "t1": (1.0,), "mixed": (0.0, 0.6, 1.0, 1.7)}
SHAPES = [(1, 1, 300), (5, 5, 300), (1, 5, 1000), (5, 1, 1000), (4, 3, 1000)]


@pytest.mark.parametrize("rows,steps,vocab", SHAPES)
@pytest.mark.parametrize("temps", list(TEMPS), ids=list(TEMPS))
@pytest.mark.parametrize("logit_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                                     (torch.float32, torch.bfloat16)], ids=["bf16", "fp32", "fp32-bf16cache"])
def test_gumbel_chain_bit_identical(rows, steps, vocab, temps, logit_dtype, cache_dtype):
    head = exact_head(vocab, logit_dtype, seed=rows + steps)
    padding = (1,) if rows > 1 else ()
    problem = make_problem(rows, steps, vocab, logit_dtype=logit_dtype, temps=TEMPS[temps], padding=padding,
                           seed=rows * 7 + steps)
    out, tokens, cache, expected_tokens, expected_cache = run_both(head, problem, cache_dtype)
    assert torch.equal(tokens, expected_tokens)
    assert same_bits(cache, expected_cache)  # includes: never-written rows are still NaN
    assert out.draft_tokens is tokens and out.logits_cache is cache


def test_scale_strided_int32_padding_fp32_weights():
    """scale != 1, fp32 weights, bf16 cache, a strided slice as base logits, int32 indices, padding."""
    rows, steps, vocab = 5, 4, 300
    head = exact_head(vocab, torch.float32, scale=0.375, seed=3)
    problem = make_problem(rows, steps, vocab, temps=TEMPS["mixed"], padding=(0, 3), index_dtype=torch.int32,
                           strided=True, seed=11)
    assert problem["base_logits"].stride()[:2] == ((steps + 2) * (vocab + 9), vocab + 9)
    _, tokens, cache, expected_tokens, expected_cache = run_both(head, problem, torch.bfloat16)
    assert torch.equal(tokens, expected_tokens)
    assert same_bits(cache, expected_cache)


def test_scale_changes_the_bias():
    """A scale other than 1 changes the cached logits: the test above is not vacuous."""
    rows, steps, vocab = 3, 2, 300
    problem = make_problem(rows, steps, vocab, temps=(0.6,), seed=5)
    caches = []
    for scale in (1.0, 1.5):
        head = exact_head(vocab, torch.bfloat16, scale=scale, seed=5)
        _, _, cache, expected_tokens, expected_cache = run_both(head, problem, torch.float32)
        assert same_bits(cache, expected_cache)
        caches.append(cache)
    assert not torch.equal(caches[0], caches[1])


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
def test_fp64_noise_chain(cache_dtype):
    rows, steps, vocab = 4, 3, 1000
    head = exact_head(vocab, torch.bfloat16, seed=9)
    problem = make_problem(rows, steps, vocab, logit_dtype=torch.bfloat16, temps=TEMPS["mixed"], padding=(2,),
                           seed=13)
    _, tokens, cache, expected_tokens, expected_cache = run_both(head, problem, cache_dtype, fp64=True)
    assert torch.equal(tokens, expected_tokens)
    assert same_bits(cache, expected_cache)
    # fp64 noise is a different stream: at T > 0 it must not reproduce the fp32 draws everywhere.
    _, tokens32, _, _, _ = run_both(head, problem, cache_dtype)
    assert not torch.equal(tokens, tokens32)


def test_markov_dependence():
    """The previous token moves the bias: the anchor changes the draw (it cannot with a zero head)."""
    vocab = 1000
    problem = make_problem(1, 1, vocab, temps=(1.0,), seed=21)
    for head, expect_one in ((exact_head(vocab, torch.bfloat16, seed=21), False), (zero_head(vocab), True)):
        draws = set()
        for anchor in range(40):
            problem["anchor"] = torch.tensor([anchor])
            _, tokens, _, expected_tokens, _ = run_both(head, problem, torch.bfloat16)
            assert torch.equal(tokens, expected_tokens)
            draws.add(int(tokens[0, 0]))
        assert (len(draws) == 1) == expect_one, draws


def test_each_step_has_its_own_noise():
    """Same logits and position at two steps: the step XOR in the seed gives different draws."""
    rows, vocab = 20, 300
    problem = make_problem(rows, 2, vocab, temps=(1.0,), seed=23)
    base = problem["base_logits"].clone()
    base[:, 1] = base[:, 0]
    positions = problem["positions"].view(rows, 2).clone()
    positions[:, 1] = positions[:, 0]
    problem.update(base_logits=base, positions=positions.reshape(-1))
    _, tokens, _, expected_tokens, _ = run_both(zero_head(vocab), problem, torch.float32)
    assert torch.equal(tokens, expected_tokens)
    assert int((tokens[:, 0] != tokens[:, 1]).sum()) >= rows // 4


def test_random_weights_invariant():
    """Gaussian weights (bias summation order free): each token is the draw from the cached logits."""
    rows, steps, vocab = 4, 5, 1000
    gen = torch.Generator().manual_seed(77)
    head = dm.MarkovHead(torch.randn(vocab, 64, generator=gen).bfloat16() / 8,
                         torch.randn(vocab, 64, generator=gen).bfloat16() / 8, scale=1.25)
    problem = make_problem(rows, steps, vocab, logit_dtype=torch.bfloat16, temps=TEMPS["mixed"], seed=77)
    slots = problem["temperature"].shape[0]
    out = dm.sample_drafts(head, **problem, impl="reference", logits_cache=poisoned_cache(slots, steps, vocab,
                                                                                           torch.bfloat16))
    tokens, cache = out
    for r in range(rows):
        prev = int(problem["anchor"][r])
        for i in range(steps):
            slot = int(problem["idx_mapping"][r * steps + i])
            z = cache[slot, i]
            # The cache holds U + bias(prev) up to the bias's last-bit freedom.
            close = (problem["base_logits"][r, i].float() + spec_bias(head.embed_weight, head.head_weight, head.scale,
                                                                     prev).float()).bfloat16()
            assert torch.allclose(z.float(), close.float(), rtol=2**-7, atol=2**-7)
            temp = float(problem["temperature"][slot])
            logits = z.float().numpy()
            keys = logits if temp == 0 else logits / np.float32(temp) + spec_noise(
                int(problem["seeds"][slot]), i, int(problem["positions"][r * steps + i]), vocab, False)
            assert int(tokens[r, i]) == spec_argmax(keys)
            prev = int(tokens[r, i])


# --------------------------------------------------------------------------- argmax semantics
def zero_head(vocab, dtype=torch.float32):
    return dm.MarkovHead(torch.zeros(vocab, 4, dtype=dtype), torch.zeros(vocab, 4, dtype=dtype))


def one_step(base_row: torch.Tensor, temp: float, *, method="gumbel", cache_dtype=torch.float32, seed=123,
             position=77):
    """Draw one token from one row of base logits with a zero bias; returns (token, cached row)."""
    vocab = base_row.shape[-1]
    out = dm.sample_drafts(zero_head(vocab), base_row.reshape(1, 1, vocab).float(), torch.tensor([0]),
                           torch.tensor([0]), torch.tensor([position]), torch.tensor([temp]), torch.tensor([seed]),
                           method=method, impl="reference", cache_dtype=cache_dtype)
    return int(out.draft_tokens[0, 0]), out.logits_cache[0, 0]


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("temp", [0.0, 0.6, 1.0])
def test_nan_row_gives_first_nan(method, temp):
    row = torch.randn(300)
    row[[41, 7, 200]] = float("nan")
    row[3] = 1e30
    assert one_step(row, temp, method=method)[0] == 7


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("temp", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_all_minus_inf_row_gives_zero(method, temp, cache_dtype):
    token, cached = one_step(torch.full((300,), float("-inf")), temp, method=method, cache_dtype=cache_dtype)
    assert token == 0
    assert bool(torch.isneginf(cached).all())


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_greedy_ties_take_the_first_maximum(method):
    row = torch.zeros(1000)
    row[[612, 13, 999]] = 5.0
    assert one_step(row, 0.0, method=method)[0] == 13
    assert one_step(torch.zeros(1000), 0.0, method=method)[0] == 0  # all equal


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("temp", [0.0, 0.6, 1.0])
def test_huge_logits(method, temp):
    """1e30 in fp32 stays finite; Gumbel keys of equal huge logits tie (the noise is below their ulp),
    so the first wins; inverse CDF draws among them (equal probabilities), greedy takes the first."""
    huge = float(torch.tensor(1e30))  # the fp32 value
    row = torch.randn(300)
    row[[250, 17, 90]] = huge
    row[5] = -huge
    token, cached = one_step(row, temp, method=method)
    if method == "gumbel" or temp == 0.0:
        assert token == 17
    else:
        assert token in (17, 90, 250)
    assert float(cached[17]) == huge and bool(torch.isfinite(cached).all())


def test_inverse_cdf_spreads_over_equal_huge_logits():
    row = torch.randn(300)
    row[[250, 17, 90]] = 1e30
    drawn = {one_step(row, 1.0, method="inverse_cdf", seed=seed)[0] for seed in range(40)}
    assert drawn == {17, 90, 250}


def test_single_live_token_is_always_drawn():
    row = torch.full((300,), float("-inf"))
    row[123] = -50.0
    for method in ("gumbel", "inverse_cdf"):
        for seed in range(5):
            assert one_step(row, 1.0, method=method, seed=seed)[0] == 123


# --------------------------------------------------------------------------- inverse CDF
def test_inverse_cdf_greedy_equals_gumbel_greedy():
    rows, steps, vocab = 5, 5, 1000
    head = exact_head(vocab, torch.bfloat16, seed=31)
    problem = make_problem(rows, steps, vocab, temps=(0.0,), padding=(4,), seed=31)
    g, g_tokens, g_cache, expected_tokens, _ = run_both(head, problem, torch.bfloat16)
    _, i_tokens, i_cache, _, _ = run_both(head, problem, torch.bfloat16, method="inverse_cdf")
    assert torch.equal(g_tokens, i_tokens) and torch.equal(i_tokens, expected_tokens)
    assert same_bits(g_cache, i_cache)


def test_inverse_cdf_token_brackets_its_uniform():
    """The token's interval of the float64 CDF contains u * total, up to fp32 prefix-sum rounding."""
    rows, steps, vocab = 5, 5, 1000
    head = exact_head(vocab, torch.bfloat16, seed=41)
    problem = make_problem(rows, steps, vocab, temps=(0.6, 1.0, 1.7), padding=(1,), seed=41)
    _, tokens, cache, _, _ = run_both(head, problem, torch.float32, method="inverse_cdf")
    assert int(tokens.min()) >= 0 and int(tokens.max()) < vocab
    checked = 0
    for r in range(rows):
        for i in range(steps):
            slot = int(problem["idx_mapping"][r * steps + i])
            if slot < 0:
                continue
            temp = float(problem["temperature"][slot])
            scaled = (cache[slot, i].float() / temp).double()  # the fp32 division, then exact in float64
            weights = torch.exp(scaled - scaled.max())
            cdf = torch.cumsum(weights, 0)
            u = float(dm.uniform32(dm.murmur3_hash32(int(problem["seeds"][slot]) ^ (i << 32),
                                                     int(problem["positions"][r * steps + i]) - 1 + SALT,
                                                     0xFFFFFFFF)))
            target = u * float(cdf[-1])
            token = int(tokens[r, i])
            slack = vocab * 2.0**-23 * float(cdf[-1])  # fp32 prefix sums over V terms
            low = float(cdf[token - 1]) if token > 0 else 0.0
            assert low - slack <= target <= float(cdf[token]) + slack, (r, i, token)
            assert float(weights[token]) > 0
            checked += 1
    assert checked == 20


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_zero_probability_tokens_are_never_drawn(method):
    """-inf logits (every even token, and a whole tail) are never drawn, over many keys."""
    rows, vocab = 400, 300
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(rows, 1, vocab, generator=gen) * 4
    base[:, :, 0::2] = float("-inf")
    base[:, :, 250:] = float("-inf")
    slots = rows
    out = dm.sample_drafts(zero_head(vocab), base, torch.zeros(rows, dtype=torch.int64), torch.arange(rows),
                           torch.arange(rows) * 3 + 1, torch.full((slots,), 1.3), torch.arange(slots) * 7919 - 40,
                           method=method, impl="reference", cache_dtype=torch.float32)
    tokens = out.draft_tokens[:, 0]
    assert bool((tokens % 2 == 1).all()) and int(tokens.max()) < 250
    assert len(set(tokens.tolist())) > 50  # the draws are spread, not stuck on one token


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_draws_follow_softmax(method):
    """Frequencies over many independent keys follow softmax(z / T): chi-square within df + 10 sqrt(2 df)."""
    samples, vocab, temp = 5000, 128, 0.7
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(vocab, generator=gen)
    base = logits.expand(samples, 1, vocab)  # stride 0 between rows is fine: only the last stride matters
    out = dm.sample_drafts(zero_head(vocab), base, torch.zeros(samples, dtype=torch.int64),
                           torch.zeros(samples, dtype=torch.int64), torch.arange(samples) + 11,
                           torch.tensor([temp]), torch.tensor([2024]), method=method, impl="reference",
                           cache_dtype=torch.float32, check_values=False)  # all rows on slot 0 on purpose
    counts = torch.bincount(out.draft_tokens[:, 0], minlength=vocab).double()
    probs = torch.softmax(logits.double() / temp, 0)
    expected = probs * samples
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expect = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((observed - expect) ** 2 / expect).sum())
    df = observed.numel() - 1
    assert df > 50
    assert chi2 < df + 10 * math.sqrt(2 * df), (chi2, df)


# --------------------------------------------------------------------------- outputs and allocation
def test_outputs_allocated_when_missing():
    rows, steps, vocab = 3, 2, 300
    head = exact_head(vocab, torch.bfloat16)
    problem = make_problem(rows, steps, vocab, padding=(2,))
    out = dm.sample_drafts(head, **problem, impl="reference")
    slots = problem["temperature"].shape[0]
    assert out.draft_tokens.shape == (rows, steps) and out.draft_tokens.dtype == torch.int64
    assert out.logits_cache.shape == (slots, steps, vocab) and out.logits_cache.dtype == torch.bfloat16
    fp32 = dm.sample_drafts(head, **problem, impl="reference", cache_dtype=torch.float32)
    assert fp32.logits_cache.dtype == torch.float32
    assert torch.equal(fp32.logits_cache.bfloat16(), out.logits_cache)


def test_sampler_reuse_matches_functional_api():
    rows, steps, vocab = 4, 3, 300
    head = exact_head(vocab, torch.bfloat16)
    sampler = MarkovSampler(head, steps, 8, cache_dtype=torch.bfloat16, method="gumbel", impl="reference")
    for seed in range(2):
        problem = make_problem(rows, steps, vocab, temps=TEMPS["mixed"], seed=seed)
        a = sampler.sample(**problem)
        b = dm.sample_drafts(head, **problem, impl="reference")
        assert torch.equal(a.draft_tokens, b.draft_tokens) and same_bits(a.logits_cache, b.logits_cache)
