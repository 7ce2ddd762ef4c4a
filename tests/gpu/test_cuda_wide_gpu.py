"""``impl="cuda_wide"`` at DeepSeek-V4.1 shapes on the H200 (sm_90 + NVRTC).

Its bias is summed on tensor cores in another order than cuBLAS's (SPEC.md 3 leaves it free), so the
check is the SPEC invariant itself: every token is ``draw_gumbel`` of the cache this sampler wrote, and
the cache is ``round(U + bias)`` within the bias bracket (``tests.helpers.check_draws``), padding
entries untouched. Covered: rows {32, 64, 128, 253}, bf16 / fp32 base and cache, mixed T (0 / 0.6 / 1)
with padding rows and samples, strided base logits with a bias scale, NaN / all -inf / huge rows, a
vocabulary that is not a multiple of 4 (the scalar path), every token exact (``filter_margin`` huge) and
the prefetch hint off drawing the same, CUDA-graph replay equal to eager.

cuda_wide has not run on a GPU yet (written 2026-12-04 without device time), so these tests skip unless
``DSPARK_MARKOV_UNVERIFIED=cuda_wide`` is set: a first run should be its own process
(``tools/gpu_plans/issue12_cuda_wide.sh check``), since a kernel fault would poison the CUDA context of every later
test in the same pytest session.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from tests.helpers import SENTINEL, check_draws, cuda_inputs, make_head, make_inputs, new_outputs, same_values
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


def wide(head, rows, cache_dtype, **backend_kwargs):
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method="gumbel", impl="cuda_wide")
    if backend_kwargs:
        sampler.backend = type(sampler.backend)(head, STEPS, rows, method="gumbel", cache_dtype=cache_dtype,
                                                device="cuda", **backend_kwargs)
    return sampler


@pytest.mark.parametrize("rows,logit_dtype,cache_dtype", [
    (32, torch.bfloat16, torch.bfloat16), (64, torch.bfloat16, torch.bfloat16), (128, torch.bfloat16, torch.bfloat16),
    (253, torch.bfloat16, torch.bfloat16), (64, torch.float32, torch.float32), (253, torch.float32, torch.float32),
    (64, torch.bfloat16, torch.float32), (1, torch.bfloat16, torch.bfloat16)])
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
    inputs = make_inputs(20, STEPS, VOCAB, logit_dtype=torch.float32, device="cuda", seed=17, embed_vocab=VOCAB + 1000)
    base = inputs["base_logits"]
    base[0, 0, 100_000] = float("nan")
    base[0, 0, 70_000] = float("nan")
    base[1] = float("-inf")
    base[3, 1, :] = 3.0e38
    base[2, 2, 5_000] = float("inf")
    tokens, cache = sample(wide(head, 20, torch.bfloat16), inputs, torch.bfloat16)
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    check_draws(head, inputs, tokens, cache, exact=False)


@pytest.mark.parametrize("rows", [64, 253])
def test_cuda_graph_capture_and_replay(head, rows):
    """Capture sample() once; refill every input with new values; replay equals eager."""
    sampler = wide(head, rows, torch.bfloat16)
    static = {name: tensor.clone() for name, tensor in cuda_inputs(rows, STEPS, VOCAB, torch.bfloat16).items()}
    tokens, cache = new_outputs(static, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            sampler.sample(**static, draft_tokens=tokens, logits_cache=cache, check_values=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(**static, draft_tokens=tokens, logits_cache=cache, check_values=False)
    for seed in (8, 9):
        fresh = make_inputs(rows, STEPS, VOCAB, device="cuda", seed=seed, extra_slots=5, embed_vocab=VOCAB + 1000)
        fresh["temperature"] = fresh["temperature"].flip(0).contiguous()
        for name, tensor in fresh.items():
            static[name].copy_(tensor)
        cache.fill_(SENTINEL)
        tokens.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        check_draws(head, fresh, tokens, cache, exact=False)
        eager_tokens, eager_cache = sample(wide(head, rows, torch.bfloat16), fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens)
        assert same_values(cache, eager_cache)
