"""``impl="cuda_wide"`` at DeepSeek-V4.1 shapes on the H200 (sm_90 + NVRTC).

Its bias is summed on tensor cores in another order than cuBLAS's (SPEC.md 3 leaves it free), so the
check is the SPEC invariant itself: every token is ``draw_gumbel`` of the cache this sampler wrote, and
the cache is ``round(U + bias)`` within the bias bracket (``tests.helpers.check_draws``), padding
entries untouched. Covered: rows {32, 64, 128, 253}, bf16 / fp32 base and cache, mixed T (0 / 0.6 / 1)
with padding rows and samples, strided base logits with a bias scale, NaN / all -inf / huge rows, a
vocabulary that is not a multiple of 4 (the scalar path), every token exact (``filter_margin`` huge) and
the prefetch hint off drawing the same, CUDA-graph replay equal to eager.

method="inverse_cdf" (``check_icdf``): the cache as above, greedy rows (T = 0) and rows whose max of z / T is not
finite ``argmax_first`` of the own cache bit for bit, padding samples an argmax of the reference z within the bias
bracket, every other T > 0 token the inverse CDF of its uniform under softmax(own cache / T) within the fp32 sums
(``tests.helpers.check_inverse_cdf``, the rule ``wide`` / ``inverse_cdf`` / ``stream`` are held to: block sums in
another order move a rounding boundary); rows 1-253, both dtypes, all-T = 1 and all-greedy batches, NaN / +inf /
all -inf / overflowing rows, V % 4 != 0, strided + scale, CUDA-graph replay equal to eager.

cuda_wide is opt-in (passed these tests on the H200 on 2026-12-05, but slower than cuda_gumbel / wide), so these
tests skip unless ``DSPARK_MARKOV_UNVERIFIED=cuda_wide`` is set: a run should be its own process
(``tools/gpu_plans/issue12_cuda_wide.sh check``), since a kernel fault would poison the CUDA context of every later
test in the same pytest session.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from tests.helpers import check_draws, cuda_inputs, make_head, make_inputs, new_outputs, same_values
from tests.helpers import replays_with_fresh_inputs, special_rows_inputs
from tests.helpers import sample_synced as sample

pytestmark = pytest.mark.gpu

VOCAB = 129_280
RANK = 256
STEPS = 5


@pytest.fixture(scope="module")
def head():
    from dspark_markov.draft.cuda_wide import CudaWideBackend

    why = CudaWideBackend.unavailable_reason()
    if why is not None:
        pytest.skip(why)
    return make_head(VOCAB, RANK, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)


def wide(head, rows, cache_dtype, method="gumbel", **backend_kwargs):
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method=method, impl="cuda_wide")
    if backend_kwargs:
        sampler.backend = type(sampler.backend)(head, STEPS, rows, method=method, cache_dtype=cache_dtype,
                                                device="cuda", **backend_kwargs)
    return sampler


# (rows, base logits dtype, cache dtype) of the full-shape tests of both methods
FULL_SHAPES = [
    (32, torch.bfloat16, torch.bfloat16), (64, torch.bfloat16, torch.bfloat16), (128, torch.bfloat16, torch.bfloat16),
    (253, torch.bfloat16, torch.bfloat16), (64, torch.float32, torch.float32), (253, torch.float32, torch.float32),
    (64, torch.bfloat16, torch.float32), (1, torch.bfloat16, torch.bfloat16),
    (40, torch.bfloat16, torch.bfloat16)]  # (3 m-tiles: an odd count, where a team's m-tiles wrap around)


@pytest.mark.parametrize("rows,logit_dtype,cache_dtype", FULL_SHAPES)
def test_draws_the_reference_from_its_own_cache_at_full_shape(head, rows, logit_dtype, cache_dtype):
    inputs = cuda_inputs(rows, STEPS, VOCAB, logit_dtype)
    tokens, cache = sample(wide(head, rows, cache_dtype), inputs, cache_dtype)
    check_draws(head, inputs, tokens, cache, exact=False)


def test_every_token_exact_and_no_prefetch_draw_the_same(head):
    """filter_margin = 1e30: the bound test never skips (every token's exact key); flags never change a draw."""
    inputs = cuda_inputs(64, STEPS, VOCAB, torch.bfloat16)
    tokens, cache = sample(wide(head, 64, torch.bfloat16), inputs, torch.bfloat16)
    for kwargs in ({"filter_margin": 1e30}, {"flags": 0}, {"blocks_per_sm": 1}):
        other, other_cache = sample(wide(head, 64, torch.bfloat16, **kwargs), inputs, torch.bfloat16)
        assert torch.equal(tokens, other), kwargs
        assert same_values(cache, other_cache), kwargs


def test_two_warps_per_group_at_an_odd_m_tile_count_draw_the_same(head):
    """40 rows (3 m-tiles, an odd count): the 16-warp entry points (two warps per group, each taking every other
    m-tile) against the 8-warp ones (one warp per group, every m-tile); both draw from their own caches, and the
    same. (Written for stop 42's m-tile pairs, measured slower and not kept in stop 43.)"""
    inputs = cuda_inputs(40, STEPS, VOCAB, torch.bfloat16)
    tokens, cache = sample(wide(head, 40, torch.bfloat16), inputs, torch.bfloat16)
    other, other_cache = sample(wide(head, 40, torch.bfloat16, warps_per_group=2), inputs, torch.bfloat16)
    check_draws(head, inputs, other, other_cache, exact=False)
    assert torch.equal(tokens, other)
    assert same_values(cache, other_cache)


def test_strided_logits_and_scale(head):
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    inputs = make_inputs(40, STEPS, VOCAB, strided=True, device="cuda", seed=13, embed_vocab=VOCAB + 1000)
    assert inputs["base_logits"].stride(0) != STEPS * VOCAB
    tokens, cache = sample(wide(scaled, 40, torch.bfloat16), inputs, torch.bfloat16)
    check_draws(scaled, inputs, tokens, cache, exact=False)


def test_vocabulary_not_a_multiple_of_4_takes_the_scalar_path(head):
    vocab = VOCAB - 3
    small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
    inputs = cuda_inputs(33, STEPS, vocab, torch.bfloat16, seed=21)
    sampler = wide(small, 33, torch.bfloat16)
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    assert sampler.backend.kernel_name(inputs["base_logits"], cache).endswith("_v0_s0")
    tokens, cache = sample(sampler, inputs, torch.bfloat16)
    check_draws(small, inputs, tokens, cache, exact=False)


def test_nan_and_all_minus_inf_rows_stay_in_range(head):
    inputs = special_rows_inputs(20, STEPS, VOCAB)
    tokens, cache = sample(wide(head, 20, torch.bfloat16), inputs, torch.bfloat16)
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_draws(head, inputs, tokens, cache, exact=False)


@pytest.mark.parametrize("rows", [64, 253])
def test_cuda_graph_capture_and_replay(head, rows):
    """Capture sample() once; refill every input with new values; replay equals eager."""
    sampler = wide(head, rows, torch.bfloat16)
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16):
        check_draws(head, fresh, tokens, cache, exact=False)
        eager_tokens, eager_cache = sample(wide(head, rows, torch.bfloat16), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens)
        assert same_values(cache, eager_cache)


# --------------------------------------------------------------------------- method="inverse_cdf"
def check_icdf(head, inputs, tokens, cache):
    """check_draws's rules for the inverse-CDF draw (the module docstring): cache inside the bias bracket, padding
    entries untouched, greedy and non-finite rows argmax_first of the own cache, T > 0 tokens the inverse CDF of u."""
    check_draws(head, inputs, tokens, cache, exact=False, method="inverse_cdf")


@pytest.mark.parametrize("rows,logit_dtype,cache_dtype", FULL_SHAPES)
def test_inverse_cdf_draws_from_its_own_cache_at_full_shape(head, rows, logit_dtype, cache_dtype):
    inputs = cuda_inputs(rows, STEPS, VOCAB, logit_dtype)
    tokens, cache = sample(wide(head, rows, cache_dtype, "inverse_cdf"), inputs, cache_dtype)
    check_icdf(head, inputs, tokens, cache)


@pytest.mark.parametrize("temp", [1.0, 0.0])
def test_inverse_cdf_all_t1_and_all_greedy(head, temp):
    inputs = dict(cuda_inputs(253, STEPS, VOCAB, torch.bfloat16))
    inputs["temperature"] = torch.full_like(inputs["temperature"], temp)
    tokens, cache = sample(wide(head, 253, torch.bfloat16, "inverse_cdf"), inputs, torch.bfloat16)
    check_icdf(head, inputs, tokens, cache)


def test_inverse_cdf_special_rows_strided_scale_and_scalar_path(head):
    """NaN / +inf / all -inf / z / T overflow / sparse rows (fp32 cache: the values stay as given); then strided logits
    with a bias scale; then V % 4 != 0 (the scalar path, a partial last block)."""
    inputs = special_rows_inputs(20, STEPS, VOCAB)
    inputs["temperature"] = torch.tensor([0.6, 1.0, 2.0])[torch.arange(inputs["temperature"].shape[0]) % 3].cuda()
    base = inputs["base_logits"]
    base[4, :, ::3] = float("-inf")
    base[5, :, :120_000] = float("-inf")
    tokens, cache = sample(wide(head, 20, torch.float32, "inverse_cdf"), inputs, torch.float32)
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_icdf(head, inputs, tokens, cache)
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    inputs = make_inputs(40, STEPS, VOCAB, strided=True, device="cuda", seed=13, embed_vocab=VOCAB + 1000)
    tokens, cache = sample(wide(scaled, 40, torch.bfloat16, "inverse_cdf"), inputs, torch.bfloat16)
    check_icdf(scaled, inputs, tokens, cache)
    vocab = VOCAB - 3
    small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
    inputs = cuda_inputs(33, STEPS, vocab, torch.bfloat16, seed=21)
    sampler = wide(small, 33, torch.bfloat16, "inverse_cdf")
    name = sampler.backend.kernel_name(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
    assert name.endswith("_v0_s0_icdf"), name
    tokens, cache = sample(sampler, inputs, torch.bfloat16)
    check_icdf(small, inputs, tokens, cache)


def test_inverse_cdf_graph_replay_equals_eager_and_options_draw_the_same(head):
    """253 rows: capture once, refill, replay == eager; flags never change a draw; another grid draws correctly."""
    rows = 253
    sampler = wide(head, rows, torch.bfloat16, "inverse_cdf")
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16, seeds=(8,),
                                                          flip_temperature=False):
        check_icdf(head, fresh, tokens, cache)
        eager_tokens, eager_cache = sample(wide(head, rows, torch.bfloat16, "inverse_cdf"), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)
    other, other_cache = sample(wide(head, rows, torch.bfloat16, "inverse_cdf", flags=0), fresh, torch.bfloat16)
    assert torch.equal(eager_tokens, other) and same_values(eager_cache, other_cache)
    # another grid moves the block boundaries (another summation order): checked, not compared
    check_icdf(head, fresh, *sample(wide(head, rows, torch.bfloat16, "inverse_cdf", blocks_per_sm=2), fresh,
                                    torch.bfloat16))


# --------------------------------------------------------------------------- tensor_cores=True (wide_tc.cu)
TC_SHAPES = [1, 32, 40, 64, 65, 128, 192, 253]  # 1 m-tile (one warpgroup's tiles each), 2 (one barely used), 3 (odd), 4


def wide_tc(head, rows, method="inverse_cdf", **backend_kwargs):
    return wide(head, rows, torch.bfloat16, method, tensor_cores=True, **backend_kwargs)


def special_bf16_inputs(rows=20):
    """special_rows_inputs with bf16 base logits (NaN, all -inf, +inf rows): the tensor-core path's dtype."""
    special = special_rows_inputs(rows, STEPS, VOCAB)
    return dict(special, base_logits=special["base_logits"].bfloat16())


def scaled_strided_case(head):
    """A head with a bias scale (the _s1 entry points) and 40 rows of base logits whose rows and steps lie VOCAB + 8
    apart (even strides: still 4-byte pairs)."""
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    inputs = make_inputs(40, STEPS, VOCAB, device="cuda", seed=13, embed_vocab=VOCAB + 1000)
    strided = torch.empty(40, STEPS + 1, VOCAB + 8, dtype=torch.bfloat16, device="cuda")[:, 1:, :VOCAB]
    strided.copy_(inputs["base_logits"])
    return scaled, dict(inputs, base_logits=strided)


@pytest.mark.parametrize("rows", TC_SHAPES)
def test_tensor_core_step_draws_from_its_own_cache_at_full_shape(head, rows):
    inputs = cuda_inputs(rows, STEPS, VOCAB, torch.bfloat16)
    sampler = wide_tc(head, rows)
    assert sampler.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
    tokens, cache = sample(sampler, inputs, torch.bfloat16)
    check_icdf(head, inputs, tokens, cache)


@pytest.mark.parametrize("temp", [1.0, 0.0])
def test_tensor_core_step_all_t1_and_all_greedy(head, temp):
    inputs = dict(cuda_inputs(253, STEPS, VOCAB, torch.bfloat16))
    inputs["temperature"] = torch.full_like(inputs["temperature"], temp)
    tokens, cache = sample(wide_tc(head, 253), inputs, torch.bfloat16)
    check_icdf(head, inputs, tokens, cache)


def test_tensor_core_step_cache_equals_the_mma_sync_step(head):
    """Both steps sum the bias over the rank in fp32 on tensor cores, in other orders: a step-0 cache entry (same
    previous tokens: the anchors) differs only where the fp32 sums (~1e-7 apart) straddle a bf16 rounding boundary
    (~1e-4 of the entries; tools/check_wide_tc.py measured 1.00000 at 64 / 130 / 253 rows on an H100), so >= 99.9%
    must be identical (one misplaced 64 x 64 item of 128 rows is ~0.8%); both draws' rules."""
    step0_caches_agree(head, cuda_inputs(128, STEPS, VOCAB, torch.bfloat16), 128)


def step0_caches_agree(head, inputs, rows, **tc_kwargs):
    """The tensor-core step's step-0 cache entries against wide.cu's (mma_sync) step's: >= 99.9% identical (the bias
    sums' orders differ); both draws' rules. Returns the live step-0 entries of the tensor-core cache (float)."""
    tokens, cache = sample(wide_tc(head, rows, **tc_kwargs), inputs, torch.bfloat16)
    ref_tokens, ref_cache = sample(wide(head, rows, torch.bfloat16, "inverse_cdf"), inputs, torch.bfloat16)
    slots = inputs["idx_mapping"].view(rows, STEPS)[:, 0]
    live = slots[slots >= 0].long()
    a, b = cache[live, 0].float(), ref_cache[live, 0].float()
    assert float((a == b).float().mean()) >= 0.999
    check_icdf(head, inputs, tokens, cache)
    check_icdf(head, inputs, ref_tokens, ref_cache)
    return a


@pytest.mark.parametrize("warpgroups", [2, 3])
def test_tensor_core_step_subnormal_sums_equal_the_mma_sync_step(head, warpgroups):
    """z = U + bias in and around bf16's subnormal range (base logits and a bias scale of 2^-128): the tensor-core
    step adds each pair with one add.rn.bf16x2, which must give wide.cu's fp32 add rounded to bf16 (double rounding
    is innocuous for sums of two bf16 values; subnormals must not be flushed): the step-0 caches as in
    test_tensor_core_step_cache_equals_the_mma_sync_step, and both draws' rules."""
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 2.0**-128)
    inputs = dict(cuda_inputs(64, STEPS, VOCAB, torch.bfloat16))
    inputs["base_logits"] = (inputs["base_logits"].float() * 2.0**-128).bfloat16()
    assert bool((inputs["base_logits"].float().abs() < 2.0**-126).float().mean() > 0.5)  # mostly subnormal
    a = step0_caches_agree(scaled, inputs, 64, tc_warpgroups=warpgroups)
    assert bool(((a != 0) & (a.abs() < 2.0**-126)).any())  # subnormal sums were written


def test_tensor_core_step_special_rows_strided_scale_and_fallbacks(head):
    """Special rows (bf16 base: NaN, all -inf, +inf), strided logits with a bias scale (the _s1 entry point); an fp32
    cache and an odd vocabulary take wide.cu's step (tensor_core_path False) and still draw correctly."""
    inputs = special_bf16_inputs()
    tokens, cache = sample(wide_tc(head, 20), inputs, torch.bfloat16)
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_icdf(head, inputs, tokens, cache)
    scaled, inputs = scaled_strided_case(head)
    sampler = wide_tc(scaled, 40)
    assert sampler.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
    tokens, cache = sample(sampler, inputs, torch.bfloat16)
    check_icdf(scaled, inputs, tokens, cache)
    inputs = cuda_inputs(64, STEPS, VOCAB, torch.bfloat16)
    sampler = wide(head, 64, torch.float32, "inverse_cdf", tensor_cores=True)
    assert not sampler.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.float32)[1])
    check_icdf(head, inputs, *sample(sampler, inputs, torch.float32))
    vocab = VOCAB - 1
    small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
    inputs = cuda_inputs(33, STEPS, vocab, torch.bfloat16, seed=21)
    sampler = wide_tc(small, 33)
    assert not sampler.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
    check_icdf(small, inputs, *sample(sampler, inputs, torch.bfloat16))


def test_tensor_core_step_graph_replay_equals_eager(head):
    rows = 253
    sampler = wide_tc(head, rows)
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16, seeds=(8, 9)):
        check_icdf(head, fresh, tokens, cache)
        eager_tokens, eager_cache = sample(wide_tc(head, rows), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)


@pytest.mark.parametrize("rows", [1, 40, 64, 130, 253])
def test_tensor_core_gumbel_draws_from_its_own_cache_at_full_shape(head, rows):
    inputs = cuda_inputs(rows, STEPS, VOCAB, torch.bfloat16)
    tokens, cache = sample(wide_tc(head, rows, "gumbel"), inputs, torch.bfloat16)
    check_draws(head, inputs, tokens, cache, exact=False)


def test_tensor_core_gumbel_special_rows_scale_exact_and_graph(head):
    """Special rows (bf16: NaN, all -inf, +inf), strided logits with a scale, every token exact (filter_margin huge)
    drawing what the bounded ranking draws, and a CUDA-graph replay equal to eager."""
    inputs = special_bf16_inputs()
    tokens, cache = sample(wide_tc(head, 20, "gumbel"), inputs, torch.bfloat16)
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_draws(head, inputs, tokens, cache, exact=False)
    scaled, inputs = scaled_strided_case(head)
    tokens, cache = sample(wide_tc(scaled, 40, "gumbel"), inputs, torch.bfloat16)
    check_draws(scaled, inputs, tokens, cache, exact=False)
    inputs = cuda_inputs(64, STEPS, VOCAB, torch.bfloat16)
    tokens, cache = sample(wide_tc(head, 64, "gumbel"), inputs, torch.bfloat16)
    other, other_cache = sample(wide_tc(head, 64, "gumbel", filter_margin=1e30), inputs, torch.bfloat16)
    assert torch.equal(tokens, other) and same_values(cache, other_cache)
    sampler = wide_tc(head, 253, "gumbel")
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, 253, STEPS, VOCAB, torch.bfloat16, seeds=(8,)):
        check_draws(head, fresh, tokens, cache, exact=False)
        eager_tokens, eager_cache = sample(wide_tc(head, 253, "gumbel"), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)


@pytest.mark.parametrize("method", ["inverse_cdf", "gumbel"])
def test_tensor_core_step_vocabulary_tail_inside_a_tile(head, method):
    """An even vocabulary that is not a multiple of 64 (129,250: the last tile holds 34 tokens; TMA zero-fills W2 past
    V, the epilogue masks the tail) and a small one (1,000 on 1-2 blocks), on the tensor-core path."""
    for vocab, rows in ((VOCAB - 30, 70), (1_000, 33)):
        small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
        inputs = cuda_inputs(rows, STEPS, vocab, torch.bfloat16, seed=23)
        sampler = wide_tc(small, rows, method)
        assert sampler.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
        tokens, cache = sample(sampler, inputs, torch.bfloat16)
        if method == "gumbel":
            check_draws(small, inputs, tokens, cache, exact=False)
        else:
            check_icdf(small, inputs, tokens, cache)


def test_tensor_core_fast_epilogue_equals_the_general_one(head):
    """The inverse-CDF step's branch-free epilogue (stop 52: interior items whose warp's rows are all samples with a
    cache row at T in {0, 1}) writes exactly what the general epilogue writes (tc_fast=False sends every item through
    it): tokens and cache bit for bit (as int16: NaN payloads and zero signs too), on mixed T with padding,
    all T = 1, special rows (NaN: the payload patch, +inf, all -inf, 3e38), a bias scale and a vocabulary tail. The
    fast paths run in the all-T = 1 cases (every warp of 16 rows but the padding row's and rows 240-255 at 253 rows),
    the scaled one, the tail's first m-tile and the special rows' warp 0 (rows 0-15 at 32 rows; the padding row 16 is
    in warp 1) at steps 0-3; at mixed T rarely (a warp's 16 rows all at T in {0, 1})."""
    def at_t1(inputs, greedy_too=False):  # every slot at T = 1 (the greedy ones kept greedy: T in {0, 1})
        temp = inputs["temperature"]
        return dict(inputs, temperature=torch.where(greedy_too & (temp == 0), temp, torch.ones_like(temp)))

    special = special_rows_inputs(32, STEPS, VOCAB)
    special_t1 = at_t1(dict(special, base_logits=special["base_logits"].bfloat16()), greedy_too=True)
    t1 = at_t1(cuda_inputs(253, STEPS, VOCAB, torch.bfloat16, seed=31))
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    tail = dm.MarkovHead(head.embed_weight, head.head_weight[:VOCAB - 30].contiguous())
    cases = [(head, cuda_inputs(253, STEPS, VOCAB, torch.bfloat16)), (head, t1), (head, special_t1), (scaled, t1),
             (tail, at_t1(cuda_inputs(70, STEPS, VOCAB - 30, torch.bfloat16, seed=23), greedy_too=True))]
    for case_head, inputs in cases:
        rows = inputs["base_logits"].shape[0]
        fast = wide_tc(case_head, rows)
        general = wide_tc(case_head, rows, tc_fast=False)
        assert fast.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
        tokens, cache = sample(fast, inputs, torch.bfloat16)
        other, other_cache = sample(general, inputs, torch.bfloat16)
        assert torch.equal(tokens, other) and torch.equal(cache.view(torch.int16), other_cache.view(torch.int16))
        check_icdf(case_head, inputs, tokens, cache)


# --------------------------------------------------------------------------- tc_warpgroups=3 (wide_tc.cu TC_WGS=3)
@pytest.mark.parametrize("rows", TC_SHAPES)
def test_three_warpgroups_write_the_same_cache_and_draw_from_it(head, rows):
    """tc_warpgroups=3 (stop 53: three consumer warpgroups, no producer warp): every item's wgmmas and epilogue are the
    two-warpgroup step's, only other warpgroups run them, so the step-0 cache (the same previous tokens: the anchors)
    equals its cache bit for bit (as int16), the whole cache wherever the tokens agree; every token is the inverse CDF
    of its own cache (check_icdf: the block partials merge in another order, which may move a rounding boundary)."""
    inputs = cuda_inputs(rows, STEPS, VOCAB, torch.bfloat16)
    three = wide_tc(head, rows, tc_warpgroups=3)
    assert three.backend.tensor_core_path(inputs["base_logits"], new_outputs(inputs, torch.bfloat16)[1])
    tokens, cache = sample(three, inputs, torch.bfloat16)
    check_icdf(head, inputs, tokens, cache)
    two_tokens, two_cache = sample(wide_tc(head, rows), inputs, torch.bfloat16)
    assert torch.equal(cache[:, 0].view(torch.int16), two_cache[:, 0].view(torch.int16))
    if torch.equal(tokens, two_tokens):
        assert torch.equal(cache.view(torch.int16), two_cache.view(torch.int16))


def test_three_warpgroups_special_rows_tail_fast_epilogue_and_graph(head):
    """tc_warpgroups=3: special rows (NaN, all -inf, +inf), a bias scale on strided logits, a vocabulary tail inside a
    tile (and 1,000 tokens on 1-2 blocks), all T = 1 and all greedy, the branch-free epilogue equal to the general one
    bit for bit (same warpgroups, same merge order), and a CUDA-graph replay equal to eager."""
    inputs = special_bf16_inputs()
    tokens, cache = sample(wide_tc(head, 20, tc_warpgroups=3), inputs, torch.bfloat16)
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_icdf(head, inputs, tokens, cache)
    scaled, inputs = scaled_strided_case(head)
    check_icdf(scaled, inputs, *sample(wide_tc(scaled, 40, tc_warpgroups=3), inputs, torch.bfloat16))
    for vocab, rows in ((VOCAB - 30, 70), (1_000, 33)):
        small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
        inputs = cuda_inputs(rows, STEPS, vocab, torch.bfloat16, seed=23)
        check_icdf(small, inputs, *sample(wide_tc(small, rows, tc_warpgroups=3), inputs, torch.bfloat16))
    for temp in (1.0, 0.0):
        inputs = dict(cuda_inputs(253, STEPS, VOCAB, torch.bfloat16, seed=31))
        inputs["temperature"] = torch.full_like(inputs["temperature"], temp)
        fast = wide_tc(head, 253, tc_warpgroups=3)
        tokens, cache = sample(fast, inputs, torch.bfloat16)
        check_icdf(head, inputs, tokens, cache)
        general = wide_tc(head, 253, tc_warpgroups=3, tc_fast=False)
        other, other_cache = sample(general, inputs, torch.bfloat16)
        assert torch.equal(tokens, other) and torch.equal(cache.view(torch.int16), other_cache.view(torch.int16))
        assert torch.equal(fast.backend.part.view(torch.int32), general.backend.part.view(torch.int32))
    sampler = wide_tc(head, 253, tc_warpgroups=3)
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, 253, STEPS, VOCAB, torch.bfloat16, seeds=(8, 9)):
        check_icdf(head, fresh, tokens, cache)
        eager_tokens, eager_cache = sample(wide_tc(head, 253, tc_warpgroups=3), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)


@pytest.mark.parametrize("rows", [1, 40, 64, 130, 253])
def test_three_warpgroups_gumbel_draws_from_its_own_cache(head, rows):
    """tc_warpgroups=3, method="gumbel": the step-0 cache equal to the two-warpgroup step's bit for bit (as int16), and
    since each row's word is the atomicMax of exact keys, the tokens too (then the whole cache); every token the
    reference's draw from its own cache; at 253 rows special rows and a graph replay equal to eager as well."""
    inputs = cuda_inputs(rows, STEPS, VOCAB, torch.bfloat16)
    tokens, cache = sample(wide_tc(head, rows, "gumbel", tc_warpgroups=3), inputs, torch.bfloat16)
    check_draws(head, inputs, tokens, cache, exact=False)
    two_tokens, two_cache = sample(wide_tc(head, rows, "gumbel"), inputs, torch.bfloat16)
    assert torch.equal(tokens, two_tokens) and torch.equal(cache.view(torch.int16), two_cache.view(torch.int16))
    if rows == 253:
        special = special_bf16_inputs()
        tokens, cache = sample(wide_tc(head, 20, "gumbel", tc_warpgroups=3), special, torch.bfloat16)
        assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
        check_draws(head, special, tokens, cache, exact=False)
        sampler = wide_tc(head, rows, "gumbel", tc_warpgroups=3)
        for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16, seeds=(8,)):
            check_draws(head, fresh, tokens, cache, exact=False)
            eager_tokens, eager_cache = sample(wide_tc(head, rows, "gumbel", tc_warpgroups=3), fresh, torch.bfloat16)
            assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)


# --------------------------------------------------------------------------- tc_fast_div=True (wide_tc.cu TC_FASTDIV=1)
@pytest.mark.parametrize("warpgroups", [2, 3])
def test_fast_division_epilogue_equals_the_general_one(head, warpgroups):
    """tc_fast_div=True (stop 53): items whose rows are samples with a cache row at any T take the branch-free
    epilogue with the reciprocal division; tokens, cache (as int16) and the last step's block partials (x = z / T's
    sums: a quotient one ulp off would show there, rarely in a token) bit for bit those of tc_fast=False (the general
    epilogue, same build and merge order), on mixed T (0 / 0.6 / 1 and padding), T = 0.7 everywhere, T = 1e-20 / 1e5
    rows (outside [2^-16, 2^16]: the div_rn redo), special rows at T = 0.6 (NaN, +inf, all -inf, 3e38) and a scale; and
    the draws check_icdf's."""
    def at(inputs, temp):  # every non-greedy slot at `temp`
        t = inputs["temperature"]
        return dict(inputs, temperature=torch.where(t == 0, t, torch.full_like(t, temp)))

    special = special_bf16_inputs(32)
    extreme = dict(cuda_inputs(64, STEPS, VOCAB, torch.bfloat16, seed=41))
    extreme["temperature"] = torch.tensor([1e-20, 1e5, 0.6, 1.0], device="cuda").repeat(
        -(-extreme["temperature"].numel() // 4))[:extreme["temperature"].numel()]
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    cases = [(head, cuda_inputs(253, STEPS, VOCAB, torch.bfloat16)),
             (head, at(cuda_inputs(253, STEPS, VOCAB, torch.bfloat16, seed=31), 0.7)), (head, extreme),
             (head, at(special, 0.6)), (scaled, at(cuda_inputs(70, STEPS, VOCAB, torch.bfloat16, seed=23), 0.7))]
    for case_head, inputs in cases:
        rows = inputs["base_logits"].shape[0]
        fast = wide_tc(case_head, rows, tc_fast_div=True, tc_warpgroups=warpgroups)
        general = wide_tc(case_head, rows, tc_fast_div=True, tc_warpgroups=warpgroups, tc_fast=False)
        tokens, cache = sample(fast, inputs, torch.bfloat16)
        other, other_cache = sample(general, inputs, torch.bfloat16)
        assert torch.equal(tokens, other) and torch.equal(cache.view(torch.int16), other_cache.view(torch.int16))
        assert torch.equal(fast.backend.part.view(torch.int32), general.backend.part.view(torch.int32))
        check_icdf(case_head, inputs, tokens, cache)
