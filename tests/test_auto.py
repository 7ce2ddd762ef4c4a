"""``impl="auto"``: the measured table and per-call dispatch."""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft import auto


def test_cpu_auto_is_the_reference():
    for rows in (1, 5, 300):
        assert auto.choose("gumbel", torch.bfloat16, rows, torch.device("cpu")) == "reference"


@pytest.mark.parametrize("key", sorted(auto.AUTO_TABLE, key=str))
def test_table_buckets_are_increasing_and_cover_every_batch(key):
    buckets = auto.AUTO_TABLE[key]
    limits = [limit for limit, _ in buckets[:-1]]
    assert limits == sorted(limits) and buckets[-1][0] is None
    method = key[0]
    for _, impl in buckets:
        from dspark_markov.draft.backends import backend_class

        assert method in backend_class(impl).METHODS


def test_cuda_choices_follow_the_table():
    cuda = torch.device("cuda")
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda) == "gumbel_fused"
    assert auto.choose("gumbel", torch.bfloat16, 4, cuda) == "gumbel_fused"
    assert auto.choose("gumbel", torch.bfloat16, 16, cuda) == "fused"
    assert auto.choose("gumbel", torch.bfloat16, 64, cuda) == "fused"
    assert auto.choose("gumbel", torch.bfloat16, 253, cuda) == "gumbel_fused"
    assert auto.choose("inverse_cdf", torch.bfloat16, 8, cuda) == "fused"
    assert auto.choose("inverse_cdf", torch.float32, 8, cuda) == "inverse_cdf"


def test_auto_sampler_on_cpu_matches_reference():
    gen = torch.Generator().manual_seed(0)
    head = dm.MarkovHead(torch.randn(50, 8, generator=gen), torch.randn(40, 8, generator=gen))
    base = torch.randn(3, 2, 40, generator=gen)
    args = (base, torch.tensor([1, 2, 3]), torch.arange(3).repeat_interleave(2), torch.arange(6) + 5,
            torch.tensor([1.0, 0.0, 0.6]), torch.tensor([3, 4, 5]))
    sampler = dm.MarkovSampler(head, 2, 4, impl="auto")
    assert set(sampler.backend.backends) == {"reference"}
    got = sampler.sample(*args)
    want = dm.sample_drafts(head, *args)
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert torch.equal(got.logits_cache, want.logits_cache)
