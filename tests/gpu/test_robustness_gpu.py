"""Issue 14 on the GPU: top_k_top_p allocates nothing per call (item 7); a real barrier timeout of
``chain`` is raised (item 3)."""

import pytest
import torch

import dspark_markov as dm

pytestmark = pytest.mark.gpu

VOCAB, RANK = 129_280, 256


def _allocations() -> int:
    return torch.cuda.memory_stats()["allocation.all.allocated"]


@pytest.mark.parametrize("rows", [4, 256])
def test_item7_top_k_top_p_repeated_call_allocates_nothing(rows):
    """Item 7: the Triton filter's scratch is persistent; a second same-shape call allocates nothing."""
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, VOCAB, device="cuda", generator=g)
    k = torch.randint(1, 200, (rows,), device="cuda", generator=g)
    p = torch.rand(rows, device="cuda", generator=g)
    work = logits.clone()
    dm.top_k_top_p(work, k, p)  # first calls: compile both variants, build the scratch
    dm.top_k_top_p(work, 50, 0.9)
    work.copy_(logits)
    torch.cuda.synchronize()
    before = _allocations()
    dm.top_k_top_p(work, k, p)
    dm.top_k_top_p(work, 50, 0.9)
    torch.cuda.synchronize()
    assert _allocations() == before, "top_k_top_p allocated on a repeated call (not CUDA-graph friendly)"
    expected = dm.top_k_top_p(logits.clone(), 50, 0.9, impl="reference")
    again = dm.top_k_top_p(logits.clone(), 50, 0.9)
    assert torch.equal(again, expected)


def test_item3_chain_barrier_timeout_is_raised_on_the_gpu():
    """More programs than fit on the GPU: the bounded barrier gives up, and the sampler raises."""
    g = torch.Generator(device="cuda").manual_seed(1)
    head = dm.MarkovHead((torch.randn(VOCAB, RANK, device="cuda", generator=g) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, RANK, device="cuda", generator=g) * 0.05).bfloat16())
    base = torch.randn(1, 2, VOCAB, device="cuda", generator=g).bfloat16()
    args = [base, torch.tensor([5], device="cuda"), torch.tensor([0, 0], device="cuda"),
            torch.tensor([10, 11], device="cuda"), torch.ones(1, device="cuda"),
            torch.tensor([3], device="cuda")]
    sampler = dm.MarkovSampler(head, 2, 1, impl="chain")
    sampler.sample(*args)  # fits: no error
    layout = sampler.backend.layout(1)
    sampler.backend.spin_limit = 1 << 12
    fitted = layout.programs
    layout.programs = min(layout.num_tiles, fitted * 8)  # far more than are resident at once
    out = sampler.sample(*args, check_values=False)
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < VOCAB)).all())
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        sampler.check()
    layout.programs = fitted
    sampler.backend.spin_limit = 1 << 20
    sampler.sample(*args)  # reported once; the next good call passes its own check
