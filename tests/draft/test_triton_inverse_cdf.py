"""``impl="inverse_cdf"`` (SPEC.md section 5) on Triton's CPU interpreter, at small V.

Exact where SPEC.md says exact: the cache against the reference recomputed with the sampler's own
tokens, T = 0 tokens against ``argmax_first``; in distribution elsewhere: every drawn token is the
inverse CDF of its uniform under ``softmax(cache / T)`` up to fp32 summation error, and the token
counts pass a chi-square test.
"""

import math

import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import reference as ref

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from dspark_markov.draft.triton_inverse_cdf import InverseCdfBackend  # noqa: E402
from tests.helpers import check_inverse_cdf, draft_inputs, replay_reference, same_bits  # noqa: E402

NEG_INF = float("-inf")


def make_head(vocab, rank, dtype=torch.bfloat16, embed_extra=3, scale=1.0, zero_head=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab + embed_extra, rank, generator=gen)
    head = torch.zeros(vocab, rank) if zero_head else torch.randn(vocab, rank, generator=gen) * 0.4
    return dm.MarkovHead(embed.to(dtype), head.to(dtype), scale)


def run_backend(head, base, anchor, idx_mapping, positions, temperature, seeds, cache, block_size=None):
    rows, steps, _ = base.shape
    backend = InverseCdfBackend(head, steps, rows, method="inverse_cdf", cache_dtype=cache.dtype, device=base.device, block_size=block_size)
    tokens = torch.full((rows, steps), -7, dtype=torch.int64)
    backend.run(base, anchor, idx_mapping, positions, temperature, seeds, tokens, cache)
    return tokens


@pytest.mark.parametrize(
    "base_dtype,cache_dtype,weight_dtype,scale",
    [
        (torch.bfloat16, torch.bfloat16, torch.bfloat16, 1.0),
        (torch.float32, torch.float32, torch.bfloat16, 1.0),
        (torch.bfloat16, torch.float32, torch.float32, 1.0),
        (torch.float32, torch.bfloat16, torch.bfloat16, 0.37),
    ],
)
def test_cache_exact_and_draws_follow_the_inverse_cdf(base_dtype, cache_dtype, weight_dtype, scale):
    vocab, steps, rows = 777, 3, 4
    gen = torch.Generator().manual_seed(1)
    head = make_head(vocab, 24, weight_dtype, scale=scale)
    base, anchor, idx_mapping, positions, temperature, seeds = draft_inputs(rows, steps, vocab, base_dtype, gen)
    sentinel = torch.full((6, steps, vocab), 7.0, dtype=cache_dtype)
    cache = sentinel.clone()
    out = dm.sample_drafts(head, base, anchor, idx_mapping, positions, temperature, seeds, logits_cache=cache,
                           method="inverse_cdf", impl="inverse_cdf")
    tokens = out.draft_tokens
    assert out.logits_cache is cache
    assert ((tokens >= 0) & (tokens < vocab)).all()
    expected, per_step = replay_reference(head, base, anchor, idx_mapping, positions, temperature, seeds, tokens,
                                          sentinel)
    assert same_bits(cache, expected)
    assert torch.equal(cache[[1, 3]], sentinel[[1, 3]])  # slots only padding samples map to stay untouched
    for step, (z, temp, seed, position) in enumerate(per_step):
        greedy = temp == 0
        assert torch.equal(tokens[greedy, step], ref.argmax_first(z.float())[greedy])
        check_inverse_cdf(z, temp, seed, step, position, tokens[:, step])


def test_greedy_is_bit_identical_to_the_reference_gumbel_path():
    vocab, steps, rows = 1000, 3, 3
    gen = torch.Generator().manual_seed(2)
    head = make_head(vocab, 16)
    base = (torch.randn(rows, steps, vocab, generator=gen) * 2).to(torch.bfloat16)
    base[1, 1, 100:200] = 9.0  # ties: the first maximum wins
    anchor = torch.tensor([1, 2, 3], dtype=torch.int32)
    idx_mapping = torch.tensor([0, 0, 0, 1, -1, 1, 2, 2, 2], dtype=torch.int32)
    positions = torch.arange(rows * steps, dtype=torch.int32) + 40
    temperature = torch.zeros(3)
    seeds = torch.tensor([1, 2, 3])
    ours = dm.sample_drafts(head, base, anchor, idx_mapping, positions, temperature, seeds,
                            method="inverse_cdf", impl="inverse_cdf")
    theirs = dm.sample_drafts(head, base, anchor, idx_mapping, positions, temperature, seeds,
                              method="gumbel", impl="reference")
    assert torch.equal(ours.draft_tokens, theirs.draft_tokens)
    assert same_bits(ours.logits_cache, theirs.logits_cache)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy overflows to inf, as the GPU does
def test_special_rows():
    """NaN, +inf, all -inf, huge and masked rows; z = base exactly (W2 = 0), three blocks of 256."""
    vocab, rows = 600, 10
    head = make_head(vocab, 8, torch.float32, zero_head=True)
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(rows, 1, vocab, generator=gen)
    z = base[:, 0]
    z[0, [300, 37]] = float("nan")
    z[1] = NEG_INF
    z[2, [513, 450]] = float("inf")
    z[3] = torch.randn(vocab, generator=gen) * 3e37
    z[3, 444] = 3.4e38
    z[4] = NEG_INF
    z[4, [5, 590]] = 0.0
    z[5] = NEG_INF
    z[5, 400] = -3.0e38
    z[6, [290, 33]] = float("nan")
    z[7] = NEG_INF
    z[8, 1::2] = NEG_INF
    z[9, :256] = NEG_INF
    temperature = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.6, 1.0, 0.0, 1.0, 0.6, 1.0, 0.6])
    idx_mapping = torch.tensor([0, 1, 2, 3, 4, 5, 6, -1, 8, 9])
    slots_huge_cold = torch.tensor([10])  # row 3 again at T = 0.6: z / T overflows, so argmax
    seeds = torch.arange(11) * 1000 + 1
    positions = torch.arange(rows) + 1
    cache = torch.zeros(11, 1, vocab)
    tokens = run_backend(head, base, torch.zeros(rows, dtype=torch.long), idx_mapping, positions, temperature,
                         seeds, cache)[:, 0]
    assert tokens[0] == 37 and tokens[6] == 33  # first NaN, at T > 0 and at T = 0
    assert tokens[1] == 0 and tokens[7] == 0  # all -inf (row 7 is padding)
    assert tokens[2] == 450  # first +inf
    assert tokens[3] == 444  # T = 1: the 3.4e38 logit carries all the mass
    assert int(tokens[4]) in (5, 590)
    assert tokens[5] == 400  # the only finite logit, however negative
    assert tokens[8] % 2 == 0 and tokens[9] >= 256
    assert same_bits(cache[[0, 1, 2, 3, 4, 5, 6, 8, 9], 0], z[[0, 1, 2, 3, 4, 5, 6, 8, 9]])
    assert (cache[7] == 0).all()
    hot = run_backend(head, base[3:4], torch.zeros(1, dtype=torch.long), slots_huge_cold, positions[:1],
                      temperature, seeds, cache)
    assert int(hot) == 444


def test_every_row_padding_with_no_slots():
    vocab = 300
    head = make_head(vocab, 8)
    base = torch.randn(2, 2, vocab).to(torch.bfloat16)
    out = dm.sample_drafts(head, base, torch.tensor([4, 9]), torch.full((4,), -1), torch.arange(4),
                           torch.zeros(0), torch.zeros(0, dtype=torch.int64), method="inverse_cdf",
                           impl="inverse_cdf")
    expected = dm.sample_drafts(head, base, torch.tensor([4, 9]), torch.full((4,), -1), torch.arange(4),
                                torch.zeros(0), torch.zeros(0, dtype=torch.int64), method="gumbel", impl="reference")
    assert torch.equal(out.draft_tokens, expected.draft_tokens)
    assert out.logits_cache.shape == (0, 2, vocab)


def test_out_of_range_slots_and_anchors_are_contained():
    """Without the eager range checks, bad slots act as padding and bad anchors are clamped."""
    vocab = 300
    head = make_head(vocab, 8, embed_extra=0)
    base = torch.randn(2, 1, vocab)
    cache = torch.zeros(2, 1, vocab)
    temperature = torch.tensor([1.0, 1.0])
    tokens = run_backend(head, base, torch.tensor([-5, 10**6]), torch.tensor([2, 99]), torch.arange(2), temperature,
                         torch.tensor([1, 2]), cache)
    assert (cache == 0).all()
    z = (base[:, 0] + head.bias(torch.tensor([0, vocab - 1])).float())
    assert torch.equal(tokens[:, 0], ref.argmax_first(z))


def test_tokens_follow_softmax_chi_square():
    """300 draws per temperature over V = 32 in 2 blocks (one -inf token, never drawn).

    Each draw costs 3 interpreted programs, so the sample is small; the threshold is the
    chi-square's mean plus 10 standard deviations, ``df + 10 sqrt(2 df)``.
    """
    vocab, rows, steps, calls = 32, 40, 5, 3
    head = make_head(vocab, 8, torch.float32, zero_head=True)
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(vocab, generator=gen) * 0.5
    logits[10] = NEG_INF
    base = logits.expand(rows, steps, vocab)  # stride 0 over rows and steps: z = logits everywhere
    temperature = torch.tensor([1.0, 0.6]).repeat(rows // 2)
    counts = {1.0: torch.zeros(vocab), 0.6: torch.zeros(vocab)}
    for call in range(calls):
        seeds = torch.arange(rows) + 1000 * call
        idx_mapping = torch.arange(rows).repeat_interleave(steps)
        positions = torch.randint(0, 2**31, (rows * steps,), generator=gen)
        cache = torch.zeros(rows, steps, vocab)
        tokens = run_backend(head, base, torch.zeros(rows, dtype=torch.long), idx_mapping, positions, temperature,
                             seeds, cache, block_size=16)
        for temp in counts:
            counts[temp] += torch.bincount(tokens[temperature == temp].flatten(), minlength=vocab).float()
    pooled_observed = torch.zeros(vocab, dtype=torch.float64)
    pooled_expected = torch.zeros(vocab, dtype=torch.float64)
    for temp, observed in counts.items():
        assert observed[10] == 0
        total = observed.sum()
        assert total == calls * rows * steps // 2
        pooled_observed += observed.double()
        pooled_expected += torch.softmax((logits / temp).double(), dim=0) * total
    keep = pooled_expected > 0
    chi2 = float((((pooled_observed - pooled_expected) ** 2)[keep] / pooled_expected[keep]).sum())
    df = int(keep.sum()) - 1
    assert chi2 < df + 10 * math.sqrt(2 * df), (chi2, df)


def test_rejects_bad_block_size_and_method():
    head = make_head(300, 8)
    with pytest.raises(ValueError, match="block_size"):
        InverseCdfBackend(head, 2, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device=torch.device("cpu"), block_size=100)
    with pytest.raises(ValueError, match="method"):
        dm.MarkovSampler(head, 2, 4, method="gumbel", impl="inverse_cdf")
