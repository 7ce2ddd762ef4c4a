"""``impl="loop"`` / ``impl="gumbel_fused"`` at DeepSeek-V4.1 shapes on the GPU, and CUDA graphs.

V = 129,280, rank 256, N = 5, rows {1, 16, 64, 253}, bf16 weights. The bias comes from cuBLAS,
which may round differently from the reference's fp32 GEMM in the last bit, so cached logits are
checked inside the bracket that a bias within one bf16 ulp (plus the fp32 accumulation error
bound) allows; tokens must equal ``draw_gumbel`` of the sampler's own cache exactly, and the two
implementations (same cuBLAS call, same kernels) must agree bit for bit.
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
IMPLS = ("loop", "gumbel_fused")


@pytest.fixture(scope="module")
def head():
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference bias is a true fp32 GEMM
    return make_head(VOCAB, RANK, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)


def inputs_for(rows, logit_dtype, seed=7):
    return cuda_inputs(rows, STEPS, VOCAB, logit_dtype, seed)


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
@pytest.mark.parametrize("logit_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                                     (torch.bfloat16, torch.float32)])
def test_matches_reference_at_full_shape(head, rows, logit_dtype, cache_dtype):
    inputs = inputs_for(rows, logit_dtype)
    results = {}
    for impl in IMPLS:
        sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method="gumbel", impl=impl)
        results[impl] = sample(sampler, inputs, cache_dtype)
        check_draws(head, inputs, *results[impl], exact=False)
    assert torch.equal(results["loop"][0], results["gumbel_fused"][0])
    assert same_values(results["loop"][1], results["gumbel_fused"][1])


def test_strided_logits_and_scale(head):
    """Base logits with row stride != N*V and a bias scale != 1, at 16 rows."""
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    inputs = make_inputs(16, STEPS, VOCAB, strided=True, device="cuda", seed=13, embed_vocab=VOCAB + 1000)
    assert inputs["base_logits"].stride(0) != STEPS * VOCAB
    results = [sample(dm.MarkovSampler(scaled, STEPS, 16, cache_dtype=torch.bfloat16, method="gumbel", impl=impl), inputs, torch.bfloat16)
               for impl in IMPLS]
    check_draws(scaled, inputs, *results[0], exact=False)
    assert torch.equal(results[0][0], results[1][0]) and same_values(results[0][1], results[1][1])


def test_nan_and_all_minus_inf_rows_stay_in_range(head):
    inputs = special_rows_inputs(4, STEPS, VOCAB, plus_inf=False)
    for impl in IMPLS:
        sampler = dm.MarkovSampler(head, STEPS, 4, cache_dtype=torch.bfloat16, method="gumbel", impl=impl)
        tokens, cache = sample(sampler, inputs, torch.bfloat16)
        assert tokens.min() >= 0 and tokens.max() < VOCAB
        assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rows", [1, 64, 253])
def test_cuda_graph_capture_and_replay(head, impl, rows):
    """Capture sample() once; refill every input with new values; replay equals eager."""
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="gumbel", impl=impl)
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16):
        check_draws(head, fresh, tokens, cache, exact=False)
        eager_tokens, eager_cache = sample(dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="gumbel", impl=impl),
                                           fresh, torch.bfloat16)
        assert torch.equal(tokens, eager_tokens)
        assert same_values(cache, eager_cache)


def test_custom_op_compiles_on_gpu(head):
    """torch.compile(fullgraph=True) around the custom op on CUDA equals eager."""
    from dspark_markov.draft import custom_op

    inputs = inputs_for(16, torch.bfloat16)

    def step(base_logits, anchor, idx_mapping, positions, temperature, seeds, tokens, cache):
        custom_op.sample_drafts_(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, tokens,
                                 cache, impl="gumbel_fused")
        return tokens

    eager_tokens, eager_cache = new_outputs(inputs, torch.bfloat16)
    step(*inputs.values(), eager_tokens, eager_cache)
    compiled = torch.compile(step, fullgraph=True)
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    compiled(*inputs.values(), tokens, cache)
    torch.cuda.synchronize()
    assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache)
