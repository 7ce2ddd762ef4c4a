"""``impl="chain"`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5), one program per SM.

Exact against the reference from the chain's own cache, for several launch layouts, the exact
fallback, both cache dtypes and fp32 weights; CUDA-graph replays equal eager calls and leave the barrier
status clean; ``auto`` picks it where the measurements say so.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft.triton_chain import ChainBackend
from tests.helpers import STEPS, check_against_reference, check_graph_replays, full_problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
def test_chain_full_shape(rows):
    head, args = full_problem(rows)
    sampler = dm.MarkovSampler(head, STEPS, rows, impl="chain")
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)
    sampler.backend.check()


@pytest.mark.parametrize("block_v,num_warps,per_sm", [(64, 4, 1), (64, 4, 3), (128, 8, 1), (128, 4, 2)])
def test_chain_layouts_exact(block_v, num_warps, per_sm):
    rows = 5
    head, args = full_problem(rows, seed=4)
    sampler = dm.MarkovSampler(head, STEPS, rows, impl="chain")
    sampler.backend = ChainBackend(head, STEPS, rows, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, block_v=block_v,
                                   num_warps=num_warps, programs_per_sm=per_sm)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)
    sampler.backend.check()


def test_chain_exact_fallback_at_full_shape():
    """Every row undecided (huge filter margin): the exact recomputation path, all programs."""
    head, args = full_problem(3, seed=6)
    sampler = dm.MarkovSampler(head, STEPS, 3, impl="chain")
    sampler.backend = ChainBackend(head, STEPS, 3, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, filter_margin=1e30)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)
    sampler.backend.check()


def test_chain_fp32_cache_and_fp32_weights():
    head, args = full_problem(16, temps=(1.0,))
    out = dm.sample_drafts(head, *args, impl="chain", cache_dtype=torch.float32)
    check_against_reference(head, *args, out)
    wide = dm.MarkovHead(head.embed_weight.float(), head.head_weight.float())
    out = dm.sample_drafts(wide, *args, impl="chain")
    check_against_reference(wide, *args, out)


def test_chain_cuda_graph_replays_match_eager():
    """Repeated replays with refilled inputs: each launch resets its own scratch."""
    rows = 8
    head, _ = full_problem(rows, seed=1)
    sampler = dm.MarkovSampler(head, STEPS, rows, impl="chain")
    check_graph_replays(sampler, rows, seeds=(2, 3, 4), replays=3)
    sampler.backend.check()


@pytest.mark.parametrize("rows", [1, 4])
def test_auto_uses_its_small_batch_design_and_is_exact(rows):
    """auto with max_rows = 64 builds the small-batch design of its table (cuda_chain where NVRTC
    builds it, else chain / gumbel_fused) for the batches it takes, and it is exact there."""
    from dspark_markov.draft import auto

    head, args = full_problem(rows, seed=5)
    sampler = dm.MarkovSampler(head, STEPS, 64, impl="auto")
    small = auto.choose("gumbel", torch.bfloat16, rows, head.device)
    assert small in sampler.backend.backends and small != "fused"
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)
    assert sampler.backend.choice(rows) == small
    sampler.backend.check()
