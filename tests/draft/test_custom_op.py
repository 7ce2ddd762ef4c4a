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
