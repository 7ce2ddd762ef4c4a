"""The drafting modes' designs on the GPU at full shapes (issue 17): target vocabulary V_t = 129,280,
draft vocabulary V_d = 32,000 (random distinct target ids), rank 256, N = 5, rows 1 / 16 / 64 / 253.

Each design's cached rows are the reference's within the bias's reordering bound (-inf exactly where
the reference has it), each token is the reference draw of its own cached row, unwritten rows keep
their sentinel (tests/modes_helpers.check_modes_draws); CUDA-graph replays equal eager calls.
"""

import pytest
import torch

import dspark_markov as dm
from tests.modes_helpers import check_modes_draws, make_d2t, modes_inputs, modes_outputs

pytestmark = pytest.mark.gpu

TARGET_V, DRAFT_V, RANK, STEPS = 129_280, 32_000, 256, 5


def full_head(d2t=True, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    vocab = DRAFT_V if d2t else TARGET_V
    embed = (torch.randn(TARGET_V, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    weight = (torch.randn(vocab, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    table = make_d2t(vocab, TARGET_V, seed=seed, device="cuda", ordered=seed % 2 == 0) if d2t else None
    return dm.MarkovHead(embed, weight, d2t=table, target_vocab_size=TARGET_V if d2t else None)


def run(head, rows, cache_dtype=torch.bfloat16, **options):
    inputs = modes_inputs(rows, STEPS, head.draft_vocab_size, TARGET_V, device="cuda", extra_slots=2)
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    embeds = torch.zeros(rows, STEPS, RANK, dtype=head.dtype, device="cuda")
    options.setdefault("impl", "fused")
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, **options)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
    torch.cuda.synchronize()
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=options.get("draft_top_k"), exact=False)
    prev = torch.cat([inputs["anchor"][:, None], tokens[:, :-1]], dim=1)
    assert torch.equal(embeds, head.embed_weight[prev])
    return sampler, inputs


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
def test_fused_d2t_full_shape(rows):
    run(full_head(seed=rows), rows)


@pytest.mark.parametrize("rows", [1, 16])
def test_chain_d2t_full_shape(rows):
    sampler, _ = run(full_head(seed=rows + 1), rows, impl="chain")
    sampler.check()  # no barrier gave up


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
def test_top_k_fused_d2t_full_shape(rows):
    run(full_head(seed=rows), rows, draft_top_k=64)


@pytest.mark.parametrize("k, cache_dtype", [(64, torch.bfloat16), (256, torch.float32)])
def test_top_k_fused_full_vocabulary(k, cache_dtype):
    run(full_head(d2t=False, seed=5), 16, cache_dtype=cache_dtype, draft_top_k=k)


@pytest.mark.parametrize("top_k", [None, 64])
def test_modes_cuda_graph_replay(top_k):
    rows = 16
    head = full_head(seed=3)
    sampler, inputs = run(head, rows, draft_top_k=top_k)
    static = {name: value.clone() for name, value in inputs.items()}
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    embeds = torch.zeros(rows, STEPS, RANK, dtype=head.dtype, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(**static, draft_tokens=tokens, logits_cache=cache, check_values=False, markov_embeds=embeds)
    fresh = modes_inputs(rows, STEPS, head.draft_vocab_size, TARGET_V, device="cuda", extra_slots=2, seed=9)
    for name, value in fresh.items():
        static[name].copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    want_tokens, want_cache = modes_outputs(head, fresh, torch.bfloat16)
    want_embeds = torch.zeros_like(embeds)
    sampler.sample(**fresh, draft_tokens=want_tokens, logits_cache=want_cache, markov_embeds=want_embeds)
    assert torch.equal(tokens, want_tokens) and torch.equal(embeds, want_embeds)
    assert torch.equal(cache.view(torch.int16), want_cache.view(torch.int16))
