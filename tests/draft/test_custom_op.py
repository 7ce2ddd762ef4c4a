"""``torch.ops.dspark_markov.sample_drafts_`` as a serving engine calls it (CPU, small shapes).

The compiled path itself is covered by ``tests/draft/test_triton_blocks.py``
(``test_custom_op_under_torch_compile_fullgraph``); these are regressions of the op's sampler cache
and argument checks.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft import custom_op
from tests.helpers import make_head, make_inputs, new_outputs, same_values


def _eager(head, inputs, impl="reference"):
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    dm.sample_drafts(head, **inputs, draft_tokens=tokens, logits_cache=cache, impl=impl)
    return tokens, cache


def _op(head, inputs, impl="reference"):
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    custom_op.sample_drafts_(head, *inputs.values(), tokens, cache, impl=impl)
    return tokens, cache


def test_weights_created_under_inference_mode():
    """Inference tensors have no version counter: the cache key used to raise torch's RuntimeError
    ("Inference tensors do not track version counter") where ``sample_drafts`` works."""
    custom_op.clear_sampler_cache()
    with torch.inference_mode():
        head = make_head(300, 16)
        inputs = make_inputs(3, 2, 300, seed=3)
        want_tokens, want_cache = _eager(head, inputs)
        for _ in range(2):  # built, then reused
            tokens, cache = _op(head, inputs)
            assert torch.equal(tokens, want_tokens) and same_values(cache, want_cache)
    assert len(custom_op._SAMPLERS) == 1
    custom_op.clear_sampler_cache()


def _op_args(head, inputs, **changes):
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    args = dict(inputs, embed_weight=head.embed_weight, head_weight=head.head_weight, draft_tokens=tokens,
                logits_cache=cache, scale=1.0, impl="reference", method="gumbel")
    args.update(changes)
    return args


@pytest.mark.parametrize("change,message", [
    (dict(base_logits=torch.zeros(2, 0, 300)), r"^base_logits: expected N >= 1"),
    (dict(logits_cache=torch.zeros(5, 2, 300, dtype=torch.float16)), r"^logits_cache: expected dtype"),
    (dict(logits_cache=torch.zeros(5, 2, 300, dtype=torch.int32)), r"^logits_cache: expected dtype"),
])
def test_errors_name_the_op_argument(change, message):
    """The op has no ``num_steps`` / ``cache_dtype`` argument: the sampler it builds used to name those."""
    head = make_head(300, 16)
    inputs = make_inputs(2, 2, 300, seed=5)
    with pytest.raises(ValueError, match=message):
        torch.ops.dspark_markov.sample_drafts_(**_op_args(head, inputs, **change))


def test_a_sampler_used_in_a_graph_capture_outlives_the_cache_bound(monkeypatch):
    """A captured CUDA graph keeps the addresses of its sampler's scratch buffers: evicting that sampler
    (more than ``_MAX_CACHED_SAMPLERS`` shapes since, e.g. an engine capturing a graph per batch size)
    used to free them under the graph. Capture is simulated on the CPU (``registry.capturing``)."""
    import gc
    import weakref

    from dspark_markov import registry

    custom_op.clear_sampler_cache()
    head = make_head(300, 16)
    inputs = make_inputs(2, 2, 300, seed=7)
    _op(head, inputs, impl="gumbel_fused")  # the warm-up builds the sampler
    monkeypatch.setattr(registry, "capturing", lambda device: True)
    _op(head, inputs, impl="gumbel_fused")  # "captured"
    monkeypatch.undo()
    (captured,) = custom_op._SAMPLERS.values()
    alive = weakref.ref(captured)
    del captured
    for rows in range(1, custom_op._MAX_CACHED_SAMPLERS + 9):  # other batch sizes evict it from the LRU
        _op(head, make_inputs(rows, 1, 300, seed=rows, extra_slots=1))
    gc.collect()
    assert len(custom_op._SAMPLERS) == custom_op._MAX_CACHED_SAMPLERS
    assert alive() is not None  # its buffers still back the graph
    tokens, cache = _op(head, inputs, impl="gumbel_fused")  # and an eager call of that shape reuses it
    assert custom_op._SAMPLERS[next(reversed(custom_op._SAMPLERS))] is alive()
    want_tokens, want_cache = _eager(head, inputs)
    assert torch.equal(tokens, want_tokens) and same_values(cache, want_cache)
    custom_op.clear_sampler_cache()
    gc.collect()
    assert alive() is None
