"""``torch.ops.dspark_markov.sample_drafts_`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5).

The op is what an engine's compiled model calls: it must draw what ``sample_drafts`` draws with the
same design (tokens and cache bit for bit), that must be what the reference draws from the cached
logits, a CUDA graph captured around the op must replay what eager calls draw from fresh inputs,
and ``torch.compile(fullgraph=True)`` must trace it as one opaque call.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft import custom_op
from tests.helpers import STEPS, VOCAB, check_against_reference, full_problem

pytestmark = pytest.mark.gpu


def _outputs(rows, cache_dtype=torch.bfloat16):
    tokens = torch.full((rows, STEPS), -7, dtype=torch.int64, device="cuda")
    cache = torch.zeros(rows, STEPS, VOCAB, dtype=cache_dtype, device="cuda")
    return tokens, cache


def _eager(head, args, impl):
    tokens, cache = _outputs(args[0].shape[0])
    out = dm.sample_drafts(head, *args, draft_tokens=tokens, logits_cache=cache, impl=impl)
    return out


@pytest.mark.parametrize("rows,impl", [(1, "auto"), (16, "auto"), (64, "auto"), (3, "gumbel_fused"), (5, "fused")])
def test_op_equals_sample_drafts_and_reference(rows, impl):
    custom_op.clear_sampler_cache()
    head, args = full_problem(rows)
    tokens, cache = _outputs(rows)
    custom_op.sample_drafts_(head, *args, tokens, cache, impl=impl)
    want = _eager(head, args, impl)
    assert torch.equal(tokens, want.draft_tokens)
    assert torch.equal(cache, want.logits_cache)
    check_against_reference(head, *args, want)
    custom_op.clear_sampler_cache()


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_op_in_a_cuda_graph_replays_fresh_inputs(rows):
    """Eager call first (builds the cached sampler), capture, refill the inputs, replay: equal to eager."""
    custom_op.clear_sampler_cache()
    head, args = full_problem(rows, seed=1)
    static = [a.clone() for a in args]
    tokens, cache = _outputs(rows)
    custom_op.sample_drafts_(head, *static, tokens, cache, impl="auto")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        custom_op.sample_drafts_(head, *static, tokens, cache, impl="auto")
    for seed in (2, 3):
        _, fresh = full_problem(rows, seed=seed, temps=(0.6, 1.0, 0.0))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want = _eager(head, fresh, "auto")
        assert torch.equal(tokens, want.draft_tokens)
        assert torch.equal(cache, want.logits_cache)
    assert len(custom_op._CAPTURED) >= 1  # the captured sampler is kept past the LRU bound
    custom_op.clear_sampler_cache()


def test_op_under_torch_compile_fullgraph_on_cuda():
    custom_op.clear_sampler_cache()
    rows = 4
    head, args = full_problem(rows, seed=5)

    def step(base_logits, anchor, idx_mapping, positions, temperature, seeds, tokens, cache):
        custom_op.sample_drafts_(head, base_logits * 1.0, anchor, idx_mapping, positions, temperature, seeds,
                                 tokens, cache, impl="auto")
        return tokens, cache

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    tokens, cache = _outputs(rows)
    compiled(*args, tokens, cache)
    want = _eager(head, args, "auto")
    assert torch.equal(tokens, want.draft_tokens)
    assert torch.equal(cache, want.logits_cache)
    custom_op.clear_sampler_cache()
