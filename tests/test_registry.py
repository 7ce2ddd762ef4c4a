"""One registry: one meaning of ``"auto"``, one default, graph-safety enforced, keyword-only options."""

import inspect

import pytest
import torch

import dspark_markov as dm
from dspark_markov import registry
from dspark_markov.block_inputs import prepare_block_inputs
from dspark_markov.draft.custom_op import sample_drafts_
from dspark_markov.verify.filtering import top_k_top_p


def test_every_entry_point_defaults_to_auto():
    entry_points = [(dm.sample_drafts, "impl"), (dm.MarkovSampler.__init__, "impl"), (sample_drafts_, "impl"),
                    (dm.verify_drafts, "impl"), (top_k_top_p, "impl"), (prepare_block_inputs, "impl")]
    entry_points += [(dm.DSparkStep.__init__, name) for name in ("draft_impl", "verify_impl", "block_inputs_impl",
                                                                 "filter_impl")]
    for function, name in entry_points:
        assert inspect.signature(function).parameters[name].default == registry.DEFAULT_IMPL == "auto", function


@pytest.mark.parametrize("family", ["verify", "top_k_top_p", "block_inputs"])
def test_auto_is_triton_on_cuda_and_the_reference_elsewhere(family):
    validated = "triton" not in registry.PENDING_GPU_VALIDATION.get(family, ())
    assert registry.resolve(family, "auto", "cuda") == ("triton" if validated else "reference")
    assert registry.resolve(family, "triton", "cuda") == "triton"  # always selectable by name
    assert registry.resolve(family, "auto", "cpu") == "reference"
    assert registry.resolve(family, "reference", "cuda") == "reference"
    with pytest.raises(ValueError, match="impl"):
        registry.resolve(family, "fastest", "cpu")


def test_auto_drafting_is_the_reference_on_the_cpu():
    from dspark_markov.draft.auto import choose

    assert choose("gumbel", torch.bfloat16, 1, torch.device("cpu")) == "reference"
    assert choose("gumbel", torch.bfloat16, 1, torch.device("cuda")) != "reference"
    head = dm.MarkovHead(torch.randn(40, 8), torch.randn(32, 8))
    sampler = dm.MarkovSampler(head, 2, 3, fp64=True)  # auto + fp64: the one implementation of fp64 noise
    assert sampler.impl == "reference"


def test_options_are_keyword_only():
    head = dm.MarkovHead(torch.randn(40, 8), torch.randn(32, 8))
    with pytest.raises(TypeError):
        dm.MarkovSampler(head, 2, 3, torch.bfloat16, "gumbel", "reference")
    for impl in registry.names("draft"):
        cls = registry.load("draft", impl)
        parameters = inspect.signature(cls.__init__).parameters
        for name in ("method", "cache_dtype", "device"):
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, (impl, name)


def test_capturing_with_a_reference_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "capturing", lambda device: True)
    with pytest.raises(ValueError, match="impl: 'reference'.*CUDA graph"):
        registry.check_capturable("verify", "reference", "cuda")
    registry.check_capturable("block_inputs", "triton", "cuda")  # graph safe: no error
    head = dm.MarkovHead(torch.randn(40, 8), torch.randn(32, 8))
    sampler = dm.MarkovSampler(head, 2, 3, impl="reference")
    inputs = (torch.zeros(3, 2, 32), torch.zeros(3, dtype=torch.int64), torch.zeros(6, dtype=torch.int64),
              torch.ones(6, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="impl: 'reference'"):
        sampler.sample(*inputs)


def test_capabilities_are_checked_by_name():
    head = dm.MarkovHead(torch.randn(40, 16), torch.randn(32, 16))
    with pytest.raises(ValueError, match="method"):
        dm.MarkovSampler(head, 2, 3, method="inverse_cdf", impl="chain")
    with pytest.raises(ValueError, match="max_rows"):
        dm.MarkovSampler(head, 2, 17, impl="chain")
