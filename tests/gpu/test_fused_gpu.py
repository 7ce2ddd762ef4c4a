"""``impl="fused"`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5)."""

import pytest
import torch

import dspark_markov as dm
from tests.helpers import STEPS, VOCAB, check_against_reference, check_graph_replays, full_problem

pytestmark = pytest.mark.gpu

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
