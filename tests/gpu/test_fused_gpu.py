"""``impl="fused"`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5)."""

import pytest
import torch

import dspark_markov as dm
from draft_checks import check_against_reference

pytestmark = pytest.mark.gpu

VOCAB, RANK, STEPS = 129_280, 256, 5


def full_problem(rows, *, temps=(1.0, 0.6, 0.0), cache_dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    embed = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    head_w = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    head = dm.MarkovHead(embed, head_w)
    base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=gen) * 2).bfloat16()
    slots = torch.arange(rows, device="cuda")
    slots[rows // 2] = -1 if rows > 1 else 0
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    temperature = torch.tensor([temps[i % len(temps)] for i in range(rows)], device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=gen)
    return head, [base, anchor, idx, positions, temperature, seeds]


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_fused_full_shape(rows, method):
    head, args = full_problem(rows)
    out = dm.sample_drafts(head, *args, impl="fused", method=method)
    check_against_reference(head, *args, out, method=method)


def test_fused_fp32_cache_all_t1():
    head, args = full_problem(16, temps=(1.0,))
    out = dm.sample_drafts(head, *args, impl="fused", cache_dtype=torch.float32)
    check_against_reference(head, *args, out)


def check_graph_replays(sampler, rows, *, seeds=(2,), replays=1):
    """Capture ``sampler.sample`` once, refill its inputs per seed, replay: equal to eager calls."""
    _, args = full_problem(rows, seed=1)
    tokens = torch.empty(rows, STEPS, dtype=torch.int64, device="cuda")
    cache = torch.zeros(rows, STEPS, VOCAB, dtype=torch.bfloat16, device="cuda")
    static = [a.clone() for a in args]
    sampler.sample(*static, draft_tokens=tokens, logits_cache=cache)  # warm-up compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(*static, draft_tokens=tokens, logits_cache=cache, check_values=False)
    for seed in seeds:
        _, fresh = full_problem(rows, seed=seed, temps=(0.6, 1.0, 0.0))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        eager = sampler.sample(*fresh)
        assert torch.equal(tokens, eager.draft_tokens)
        assert torch.equal(cache, eager.logits_cache)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_fused_cuda_graph_replay(method):
    rows = 16
    head, _ = full_problem(rows, seed=1)
    check_graph_replays(dm.MarkovSampler(head, STEPS, rows, method=method, impl="fused"), rows)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_auto_dispatches_by_batch_and_is_exact(rows):
    head, args = full_problem(rows, seed=3)
    sampler = dm.MarkovSampler(head, STEPS, 64, impl="auto")
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)
