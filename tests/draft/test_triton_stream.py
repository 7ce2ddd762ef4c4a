"""``impl="stream"`` in Triton's interpreter at small shapes, against the reference; its skip bounds.

Gumbel draws bit for bit against the reference applied to the sampler's own cache (also on rows
built so that whole tiles are skipped, and with the exact fallback forced); inverse CDF as
``tests/draft/test_triton_inverse_cdf.py`` checks it (exact cache, greedy rows bit-identical, every T > 0
token the inverse CDF of its uniform within the fp32 summation error, a chi-square test); and
the noise bounds the skips rely on.
"""

import math

import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import reference as ref
from tests.draft.large_batch_checks import inverse_cdf_chi_square, inverse_cdf_special_rows, skewed_problem
from tests.helpers import (NAN_INF_TOKENS, check_against_reference, check_inverse_cdf, draft_inputs, make_problem,
                           nan_inf_problem, replay_reference, same_bits)

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from dspark_markov.draft.triton_stream import (  # noqa: E402
    G_MAX, G_MIN, NOISE_UPPER_MARGIN, StreamBackend, clz32, noise_upper)

TEMPERATURES = {"0": (0.0,), "0.6": (0.6,), "1": (1.0,), "mixed": (1.0, 0.6, 0.0, 1.0, 1.0, 0.7, 0.0)}


def stream_sampler(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, **layout):
    sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, method=method, impl="stream")
    if layout:
        sampler.backend.__init__(head, steps, rows, method=method, cache_dtype=cache_dtype, device=head.device, **layout)
    return sampler


@pytest.mark.parametrize("weight_dtype,logit_dtype,cache_dtype,scale", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, 1.0),
    (torch.bfloat16, torch.float32, torch.float32, 0.75),
    (torch.float32, torch.float32, torch.bfloat16, 1.0),
])
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_exact_against_reference_and_padding_untouched(weight_dtype, logit_dtype, cache_dtype, scale, method, device):
    head, args = make_problem(1000, 32, 5, 3, weight_dtype=weight_dtype, logit_dtype=logit_dtype, scale=scale,
                              device=device)
    cache = torch.full((6, 3, 1000), float("nan"), dtype=cache_dtype, device=device)
    out = dm.sample_drafts(head, *args, impl="stream", method=method, logits_cache=cache)
    check_against_reference(head, *args, out, method=method)
    untouched = torch.ones(6, dtype=torch.bool)
    untouched[args[2].view(5, 3)[:, 0].clamp_min(0).unique()] = False
    assert bool(torch.isnan(cache[untouched.to(cache.device)].float()).all()), "padding or unused slots were written"


@pytest.mark.parametrize("temps", list(TEMPERATURES), ids=list(TEMPERATURES))
def test_gumbel_temperatures_and_row_chunks(temps, device):
    """20 rows in two chunks of 16 over 5 tiles of 64 (V = 300, ragged last tile), strided logits."""
    head, args = make_problem(300, 16, 20, 2, temps=TEMPERATURES[temps], padding_row=7, seed=1, device=device)
    wide = torch.randn(20, 3, 301, device=device).bfloat16()
    args[0] = wide[:, 1:3, 1:]  # row stride 3 * 301, step stride 301
    out = dm.sample_drafts(head, *args, impl="stream")
    check_against_reference(head, *args, out)


@pytest.mark.parametrize("base_dtype,cache_dtype,weight_dtype,scale", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, 1.0),
    (torch.float32, torch.bfloat16, torch.bfloat16, 0.37),
])
def test_inverse_cdf_cache_exact_and_draws_follow_the_inverse_cdf(base_dtype, cache_dtype, weight_dtype, scale):
    """The inverse-CDF design's own check (mixed T, padding, odd strides, embed-only anchors)."""
    vocab, steps, rows = 777, 3, 4
    gen = torch.Generator().manual_seed(1)
    embed = torch.randn(vocab + 3, 32, generator=gen)
    weights = torch.randn(vocab, 32, generator=gen) * 0.4
    head = dm.MarkovHead(embed.to(weight_dtype), weights.to(weight_dtype), scale)
    base, anchor, idx_mapping, positions, temperature, seeds = draft_inputs(rows, steps, vocab, base_dtype, gen)
    sentinel = torch.full((6, steps, vocab), 7.0, dtype=cache_dtype)
    cache = sentinel.clone()
    out = dm.sample_drafts(head, base, anchor, idx_mapping, positions, temperature, seeds, logits_cache=cache,
                           method="inverse_cdf", impl="stream")
    tokens = out.draft_tokens
    assert ((tokens >= 0) & (tokens < vocab)).all()
    expected, per_step = replay_reference(head, base, anchor, idx_mapping, positions, temperature, seeds, tokens,
                                          sentinel)
    assert same_bits(cache, expected)
    assert torch.equal(cache[[1, 3]], sentinel[[1, 3]])
    for step, (z, temp, seed, position) in enumerate(per_step):
        greedy = temp == 0
        assert torch.equal(tokens[greedy, step], ref.argmax_first(z.float())[greedy])
        check_inverse_cdf(z, temp, seed, step, position, tokens[:, step])


def test_inverse_cdf_tokens_follow_softmax_chi_square():
    inverse_cdf_chi_square(lambda head, steps, rows: stream_sampler(head, steps, rows, "inverse_cdf", torch.float32, block_v=16, block_r=16))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy overflows to inf, as the GPU does
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_nan_inf_rows_give_defined_tokens(method, device):
    head, args = nan_inf_problem(device)
    out = dm.sample_drafts(head, *args, impl="stream", method=method, cache_dtype=torch.float32)
    assert out.draft_tokens[:, 0].tolist() == NAN_INF_TOKENS


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_inverse_cdf_special_rows():
    inverse_cdf_special_rows(lambda head, steps, rows: stream_sampler(head, steps, rows, "inverse_cdf", torch.float32, block_v=256, block_r=16))


@pytest.mark.parametrize("winner_tile", [2, 7])
def test_gumbel_skips_keep_the_draw_exact(winner_tile, device):
    head, args = skewed_problem(winner_tile, device)
    out = dm.sample_drafts(head, *args, impl="stream")
    check_against_reference(head, *args, out)
    assert out.draft_tokens[0].tolist() == [3, 3]


def test_exact_fallback_path_matches(device):
    """A huge filter margin keeps every token a candidate and sends every tile to exact keys."""
    head, args = make_problem(700, 16, 4, 2, device=device)
    sampler = stream_sampler(head, 2, 4)
    filtered = sampler.sample(*args)
    sampler.backend.filter_margin = 1e30
    exact = sampler.sample(*args)
    assert torch.equal(filtered.draft_tokens, exact.draft_tokens)
    check_against_reference(head, *args, exact)


def test_every_row_padding_with_no_slots_and_contained_values(device):
    head, args = make_problem(300, 16, 2, 2, device=device)
    for method in ("gumbel", "inverse_cdf"):
        none = dm.sample_drafts(head, args[0], torch.tensor([4, 9], device=device), torch.full((4,), -1, device=device),
                                torch.arange(4, device=device), torch.zeros(0, device=device),
                                torch.zeros(0, dtype=torch.int64, device=device), impl="stream", method=method)
        want = dm.sample_drafts(head, args[0], torch.tensor([4, 9], device=device), torch.full((4,), -1, device=device),
                                torch.arange(4, device=device), torch.zeros(0, device=device),
                                torch.zeros(0, dtype=torch.int64, device=device), impl="reference")
        assert torch.equal(none.draft_tokens, want.draft_tokens)
        cache = torch.full((2, 2, 300), float("nan"), device=device)
        out = dm.sample_drafts(head, args[0], torch.tensor([10**6, -5], device=device),
                               torch.tensor([0, 0, 99, 99], device=device), torch.arange(4, device=device),
                               torch.ones(2, device=device), torch.tensor([1, 2], device=device), impl="stream",
                               method=method, logits_cache=cache, check_values=False)
        assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < 300)).all())
        assert not bool(torch.isnan(cache[0]).any()) and bool(torch.isnan(cache[1]).all())


def test_refuses_bad_layouts_and_methods():
    head, _ = make_problem(300, 16, 2, 1)
    for name, value in (("block_v", 100), ("block_r", 8), ("num_warps", 3)):
        with pytest.raises(ValueError, match=name):
            StreamBackend(head, 1, 2, method="gumbel", cache_dtype=torch.bfloat16, device=torch.device("cpu"), **{name: value})
    with pytest.raises(ValueError, match="method"):
        StreamBackend(head, 1, 2, method="top_k", cache_dtype=torch.bfloat16, device=torch.device("cpu"))


# --------------------------------------------------------------------------- the skip bounds
def exact_noise(h):
    return rng.gumbel32(rng.uniform32(h))


@triton.jit
def _clz_upper_kernel(h_ptr, clz_ptr, upper_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.load(h_ptr + offsets).to(tl.uint32)
    tl.store(clz_ptr + offsets, clz32(h, False))
    tl.store(upper_ptr + offsets, noise_upper(h, False))


def test_noise_bounds_on_the_hashes_that_reach_them():
    """Why the skips are safe, checked where it is tight (the GPU test checks all 2^32 hashes).

    u = high 2^-16 + (low + 1/2) 2^-32 >= h 2^-32 (exact parts, monotone rounding), and h >=
    2^(31 - clz(h)), so u >= 2^-(clz(h) + 1) (u = 2^-33 at h = 0). -L(u) >= u (the series is u(1 + u p)
    with p >= 0; the log branch holds for u >= 1/4 since -log(1 - u) >= u), so g = -log(-L(u)) <=
    (clz(h) + 1) ln 2: noise_upper. The largest noise is at h = 0 (u = 2^-33, g = 33 ln 2 - tiny <= G_MAX);
    every h >= 2^20 has g <= 12 ln 2 + margin, far below G_MAX; u <= 1 gives -L <= -log(2^-24), so
    g >= -log(24 ln 2) >= G_MIN. Checked exhaustively over h < 2^20 and on 2^20 random hashes.
    """
    gen = torch.Generator().manual_seed(9)
    small = torch.arange(1 << 20, dtype=torch.int64)
    spread = torch.randint(0, 2**32, (1 << 20,), generator=gen, dtype=torch.int64)
    extremes = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=torch.int64)
    hashes = torch.cat([small[:1 << 16], spread[:1 << 14], extremes])  # interpreted kernel: a subset
    block = 1024
    padded = torch.cat([hashes, hashes[: (-hashes.numel()) % block]])
    clz = torch.empty(padded.numel(), dtype=torch.int32)
    upper = torch.empty(padded.numel(), dtype=torch.float32)
    _clz_upper_kernel[(padded.numel() // block,)](padded.to(torch.int32), clz, upper, BLOCK=block,
                                                 enable_fp_fusion=False)
    want_clz = torch.where(padded == 0, 32, 31 - torch.floor(torch.log2(padded.clamp_min(1).double())).long())
    assert torch.equal(clz.long(), want_clz)
    assert bool((exact_noise(padded) <= upper).all())
    everything = torch.cat([small, spread, extremes])
    noise = exact_noise(everything)
    assert float(noise.max()) == float(exact_noise(torch.tensor([0]))) <= G_MAX
    assert float(noise[everything >= 1 << 20].max()) <= 12 * math.log(2) + NOISE_UPPER_MARGIN < G_MAX
    assert float(noise.min()) >= G_MIN
    assert float(exact_noise(torch.tensor([2**32 - 1]))) >= G_MIN
    torch_upper = (31 - torch.floor(torch.log2(everything.clamp_min(1).double())) + 1).where(everything > 0,
                                                                                             torch.tensor(33.0))
    assert bool((noise.double() <= torch_upper * math.log(2) + NOISE_UPPER_MARGIN).all())
