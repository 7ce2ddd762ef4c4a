"""``impl="wide"`` in Triton's interpreter at small shapes, against the reference.

Gumbel draws bit for bit against the reference applied to the sampler's own cache (row blocks,
several programs per row block, strided logits, rows built so that whole tiles are skipped, the
exact fallback forced); inverse CDF as ``tests/draft/test_triton_inverse_cdf.py`` checks it (cache,
greedy rows bit-identical, every T > 0 token the inverse CDF of its uniform within the fp32
summation error, a chi-square test). The skip bounds (G_MAX, G_MIN, the clz bound) are those of
``impl="stream"``, proved in ``tests/draft/test_triton_stream.py`` (and over all 2^32 hashes by
``tests/gpu/test_stream_gpu.py``).
"""


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

from dspark_markov.draft.triton_wide import LOG_UPPER_MARGIN, WideBackend, log_noise_upper  # noqa: E402

TEMPERATURES = {"0": (0.0,), "0.6": (0.6,), "1": (1.0,), "mixed": (1.0, 0.6, 0.0, 1.0, 1.0, 0.7, 0.0)}


def wide_sampler(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, **options):
    sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, method=method, impl="wide")
    if options:
        sampler.backend.__init__(head, steps, rows, method=method, cache_dtype=cache_dtype, device=head.device,
                                 **options)
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
    out = dm.sample_drafts(head, *args, impl="wide", method=method, logits_cache=cache)
    check_against_reference(head, *args, out, method=method)
    untouched = torch.ones(6, dtype=torch.bool)
    untouched[args[2].view(5, 3)[:, 0].clamp_min(0).unique()] = False
    assert bool(torch.isnan(cache[untouched.to(cache.device)].float()).all()), "padding or unused slots were written"


@pytest.mark.parametrize("temps", list(TEMPERATURES), ids=list(TEMPERATURES))
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_temperatures_row_blocks_and_programs(temps, method, device):
    """20 rows in two row blocks of 16, 2 programs each over 5 tiles of 64 (V = 300, ragged), strided logits."""
    head, args = make_problem(300, 16, 20, 2, temps=TEMPERATURES[temps], padding_row=7, seed=1, device=device)
    wide = torch.randn(20, 3, 301, device=device).bfloat16()
    args[0] = wide[:, 1:3, 1:]  # row stride 3 * 301, step stride 301
    sampler = wide_sampler(head, 2, 20, method, programs=2)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out, method=method)


@pytest.mark.parametrize("layout", [(64, 16, 4, 2, 0, 1), (32, 32, 4, 1, 1, 1)], ids=["pipelined", "prefetch"])
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_layouts_whole_tiles(layout, method, device):
    """V = 320, a multiple of both tile widths (the unmasked EVEN_V path), base pipelined or prefetched."""
    head, args = make_problem(320, 16, 20, 2, padding_row=3, seed=5, device=device)
    out = wide_sampler(head, 2, 20, method, layout=layout, programs=2).sample(*args)
    check_against_reference(head, *args, out, method=method)


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
                           method="inverse_cdf", impl="wide")
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
    inverse_cdf_chi_square(lambda head, steps, rows: wide_sampler(head, steps, rows, "inverse_cdf", torch.float32, layout=(16, 64, 4, 1, 1, 1)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy overflows to inf, as the GPU does
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_nan_inf_rows_give_defined_tokens(method, device):
    head, args = nan_inf_problem(device)
    out = dm.sample_drafts(head, *args, impl="wide", method=method, cache_dtype=torch.float32)
    assert out.draft_tokens[:, 0].tolist() == NAN_INF_TOKENS


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_inverse_cdf_special_rows():
    inverse_cdf_special_rows(lambda head, steps, rows: wide_sampler(head, steps, rows, "inverse_cdf", torch.float32, layout=(256, 16, 4, 1, 1, 1), programs=2))


@pytest.mark.parametrize("winner_tile", [2, 7])
@pytest.mark.parametrize("programs", [1, 3])
def test_gumbel_skips_keep_the_draw_exact(winner_tile, programs, device):
    head, args = skewed_problem(winner_tile, device)
    out = wide_sampler(head, 2, 3, programs=programs).sample(*args)
    check_against_reference(head, *args, out)
    assert out.draft_tokens[0].tolist() == [3, 3]


def test_exact_fallback_path_matches(device):
    """A huge filter margin keeps every token a candidate and sends every tile to exact keys."""
    head, args = make_problem(700, 16, 4, 2, device=device)
    sampler = wide_sampler(head, 2, 4)
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
                                torch.zeros(0, dtype=torch.int64, device=device), impl="wide", method=method)
        want = dm.sample_drafts(head, args[0], torch.tensor([4, 9], device=device), torch.full((4,), -1, device=device),
                                torch.arange(4, device=device), torch.zeros(0, device=device),
                                torch.zeros(0, dtype=torch.int64, device=device), impl="reference")
        assert torch.equal(none.draft_tokens, want.draft_tokens)
        cache = torch.full((2, 2, 300), float("nan"), device=device)
        out = dm.sample_drafts(head, args[0], torch.tensor([10**6, -5], device=device),
                               torch.tensor([0, 0, 99, 99], device=device), torch.arange(4, device=device),
                               torch.ones(2, device=device), torch.tensor([1, 2], device=device), impl="wide",
                               method=method, logits_cache=cache, check_values=False)
        assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < 300)).all())
        assert not bool(torch.isnan(cache[0]).any()) and bool(torch.isnan(cache[1]).all())


def test_refuses_bad_layouts_and_methods():
    head, _ = make_problem(300, 16, 2, 1)
    cpu = torch.device("cpu")
    for name, layout in (("block_v", (100, 16, 4, 1, 1, 1)), ("block_r", (64, 8, 4, 1, 1, 1)),
                         ("num_warps", (64, 16, 3, 1, 1, 1)), ("layout", (64, 16, 4))):
        with pytest.raises(ValueError, match=name):
            WideBackend(head, 1, 2, method="gumbel", cache_dtype=torch.bfloat16, device=cpu, layout=layout)
    with pytest.raises(ValueError, match="programs"):
        WideBackend(head, 1, 2, method="gumbel", cache_dtype=torch.bfloat16, device=cpu, programs=0)
    with pytest.raises(ValueError, match="method"):
        WideBackend(head, 1, 2, method="top_k", cache_dtype=torch.bfloat16, device=cpu)


# --------------------------------------------------------------------------- the skip bound
@triton.jit
def _log_upper_kernel(h_ptr, upper_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.load(h_ptr + offsets).to(tl.uint32)
    tl.store(upper_ptr + offsets, log_noise_upper(h, False))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # log2(0) = -inf for h < 256 (the bound is +inf there)
def test_log_noise_upper_bounds_the_noise_where_it_is_tight():
    """g <= log_noise_upper(h) (argument in its docstring) on the hashes where it is tightest.

    Small hashes (large noise: the only tokens that can beat a good key), hashes around every
    power of two (where the h >> 8 truncation and the log2 change), random ones and the extremes;
    the GPU test checks all 2^32 with the hardware log2. The bound is also tight where tokens can win
    (u < 2^-10, g > 6.9): within the truncation of h (2^-12), u / 2 (from -L(u) = u (1 + u/2 + ...))
    and the margin, for 2^20 <= h < 2^22 (a filter that keeps every token would be no filter).
    """
    gen = torch.Generator().manual_seed(9)
    powers = torch.tensor([1 << k for k in range(8, 32)], dtype=torch.int64)
    near = (powers[:, None] + torch.arange(-3, 4)[None, :]).flatten()
    hashes = torch.cat([torch.arange(1 << 13, dtype=torch.int64), near, (1 << 20) + torch.arange(1 << 12) * 509, torch.randint(0, 2**32, (1 << 13,), generator=gen),
                        torch.tensor([0, 255, 256, 2**32 - 1])])
    block = 1024
    padded = torch.cat([hashes, hashes[: (-hashes.numel()) % block]])
    upper = torch.empty(padded.numel(), dtype=torch.float32)
    _log_upper_kernel[(padded.numel() // block,)](padded.to(torch.int32), upper, BLOCK=block, enable_fp_fusion=False)
    noise = rng.gumbel32(rng.uniform32(padded))
    assert bool((noise <= upper).all())
    assert bool((upper[padded < 256] == float("inf")).all())
    small_u = (padded >= 1 << 20) & (padded < 1 << 22)
    assert int(small_u.sum()) > 0
    assert float((upper[small_u] - noise[small_u]).max()) < 2.0**-12 + 2.0**-11 + LOG_UPPER_MARGIN + 2.0**-16
