"""``impl="loop"`` and ``impl="gumbel_fused"`` against the reference (SPEC.md sections 2-4).

CPU: Triton's interpreter at small V with a small block (several blocks, a ragged last one). On the
CPU the bias GEMM is the reference's own fp32-then-round, so tokens *and* caches are bit-exact.
The checks (:func:`tests.helpers.check_draws`) are shared with ``tests/gpu/test_triton_samplers_gpu.py``,
where cuBLAS may change the bias in its last bit (``exact=False``).
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft.reference import argmax_first, draw_gumbel, row_keys
from tests.helpers import SENTINEL, check_draws, make_head, make_inputs, new_outputs, run_sampler, same_values

triton = pytest.importorskip("triton")

IMPLS = ("loop", "gumbel_fused")


# --------------------------------------------------------------------------- CPU tests
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("logit_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                     (torch.float32, torch.bfloat16), (torch.float32, torch.float32)])
def test_bit_exact_against_reference(impl, logit_dtype, cache_dtype):
    """Tokens and caches equal the reference exactly (mixed T, padding, ragged last block)."""
    head = make_head(600, 16, scale=1.0 if cache_dtype == torch.bfloat16 else 0.75)
    inputs = make_inputs(3, 2, 600, logit_dtype=logit_dtype, seed=hash((impl, str(logit_dtype))) % 1000)
    tokens, cache = run_sampler(impl, head, inputs, cache_dtype)
    check_draws(head, inputs, tokens, cache, exact=True)
    ref_tokens, ref_cache = run_sampler("reference", head, inputs, cache_dtype)
    assert torch.equal(tokens, ref_tokens)
    assert same_values(cache, ref_cache)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.float16])
def test_other_weight_dtypes_and_strided_logits(weight_dtype):
    """fp32/fp16 weights, base logits with row stride != N*V; loop == gumbel_fused == reference."""
    head = make_head(500, 8, dtype=weight_dtype, scale=1.5)
    inputs = make_inputs(3, 2, 500, logit_dtype=torch.float32, strided=True, seed=5)
    for name in ("anchor", "idx_mapping", "positions"):  # int32 index tensors are accepted too
        inputs[name] = inputs[name].to(torch.int32)
    assert inputs["base_logits"].stride(0) != 2 * 500
    results = [run_sampler(impl, head, inputs, torch.bfloat16, block=128) for impl in IMPLS]
    check_draws(head, inputs, *results[0], exact=True)
    assert torch.equal(results[0][0], results[1][0]) and same_values(results[0][1], results[1][1])


def test_nan_inf_and_huge_logits_give_defined_tokens():
    """NaN rows (first NaN wins, also across blocks), all -inf rows (-> 0), +inf and fp32-max logits."""
    vocab = 700
    head = make_head(vocab, 8)
    inputs = make_inputs(4, 2, vocab, logit_dtype=torch.float32, seed=9)
    base = inputs["base_logits"]
    base[0, 0, 650] = float("nan")  # a NaN in the last (ragged) block only...
    base[0, 0, 300] = float("nan")  # ...and an earlier one in another block: 300 must win
    base[0, 1, 140] = float("nan")  # two NaNs in one block: the first (135) wins
    base[0, 1, 135] = float("nan")
    base[1, :, :] = float("-inf")  # all -inf (row 1 is live in step 0): token 0 at any T
    base[3, 0, :] = 3.0e38  # rounds to +inf in a bf16 cache: the first +inf key wins
    base[3, 1, 400] = float("inf")
    # distinct slots per step; row 1 live with T = 0 then 0.6 (slots 0, 1), row 2 padding
    inputs["idx_mapping"].copy_(torch.tensor([2, 5, 0, 1, -1, -1, 3, 4]))
    results = {impl: run_sampler(impl, head, inputs, torch.bfloat16, block=128) for impl in IMPLS}
    for impl, (tokens, cache) in results.items():
        check_draws(head, inputs, tokens, cache, exact=True)
        assert tokens[0, 0] == 300 and tokens[0, 1] == 135 and tokens[1, 0] == 0 and tokens[1, 1] == 0
        assert tokens[3, 1] == 400
    assert torch.equal(results["loop"][0], results["gumbel_fused"][0])
    assert same_values(results["loop"][1], results["gumbel_fused"][1])


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_slots_and_anchor_are_clamped_in_kernel(impl):
    """With check_values=False a slot >= S is padding and an anchor outside [0, V_t) is clamped."""
    head = make_head(400, 8)
    inputs = make_inputs(3, 2, 400, seed=11)
    inputs["idx_mapping"][1] = 10**6  # row 0, step 1: out of range -> padding (no write)
    inputs["anchor"][0] = -5
    inputs["anchor"][2] = 10**9
    tokens, cache = run_sampler(impl, head, inputs, torch.float32, block=128, check_values=False)
    check_draws(head, inputs, tokens, cache, exact=True)
    with pytest.raises(ValueError, match="anchor"):
        run_sampler(impl, head, inputs, torch.float32, block=128, check_values=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_run_reuses_buffers_like_a_graph_replay(impl):
    """One sampler, fixed input/output tensors refilled in place (what a CUDA-graph replay does):

    the backend's buffers keep their addresses and each call equals a fresh sampler's result.
    """
    head = make_head(400, 8)
    first = make_inputs(3, 2, 400, seed=21)
    second = make_inputs(3, 2, 400, seed=22)
    sampler = dm.MarkovSampler(head, 2, 3, cache_dtype=torch.bfloat16, method="gumbel", impl=impl)
    buffers = {name: t.data_ptr() for name, t in vars(sampler.backend).items() if isinstance(t, torch.Tensor)}
    buffers.update({f"gemm.{n}": t.data_ptr() for n, t in vars(sampler.backend.gemm).items()
                    if isinstance(t, torch.Tensor)})
    assert any(name.startswith("block") for name in buffers)
    live = {k: v.clone() for k, v in first.items()}
    tokens, cache = new_outputs(first, torch.bfloat16)
    for inputs in (first, second, first):
        for name, tensor in inputs.items():
            live[name].copy_(tensor)
        cache.fill_(SENTINEL)
        sampler.sample(**live, draft_tokens=tokens, logits_cache=cache, check_values=False)
        want_tokens, want_cache = run_sampler(impl, head, inputs, torch.bfloat16)
        assert torch.equal(tokens, want_tokens) and same_values(cache, want_cache)
    after = {name: t.data_ptr() for name, t in vars(sampler.backend).items() if isinstance(t, torch.Tensor)}
    after.update({f"gemm.{n}": t.data_ptr() for n, t in vars(sampler.backend.gemm).items()
                  if isinstance(t, torch.Tensor)})
    assert after == buffers


def test_fewer_rows_than_max_rows_and_one_row():
    """A sampler built for 4 rows serves 1 and 3 rows (buffers are sliced, not rebuilt)."""
    head = make_head(300, 8)
    for impl in IMPLS:
        sampler = dm.MarkovSampler(head, 2, 4, cache_dtype=torch.bfloat16, method="gumbel", impl=impl)
        for rows in (1, 3):
            inputs = make_inputs(rows, 2, 300, seed=30 + rows, extra_slots=1)
            tokens, cache = new_outputs(inputs, torch.bfloat16)
            sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache)
            check_draws(head, inputs, tokens, cache, exact=True)


def test_choices_are_validated():
    head = make_head(300, 8)
    for impl in IMPLS:
        with pytest.raises(ValueError, match="method"):
            dm.MarkovSampler(head, 2, 2, cache_dtype=torch.bfloat16, method="inverse_cdf", impl=impl)
    from dspark_markov.draft.triton_loop import LoopBackend

    with pytest.raises(ValueError, match="block"):
        LoopBackend(head, 2, 2, method="gumbel", cache_dtype=torch.bfloat16, device="cpu", block=100)


def test_custom_op_under_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) of a function calling the op equals eager; samplers are cached."""
    from dspark_markov.draft import custom_op

    head = make_head(300, 8)
    inputs = make_inputs(2, 2, 300, seed=41)

    def step(base_logits, anchor, idx_mapping, positions, temperature, seeds, tokens, cache):
        custom_op.sample_drafts_(head, base_logits * 1.0, anchor, idx_mapping, positions, temperature, seeds,
                                 tokens, cache, impl="gumbel_fused")
        return tokens + 0, cache

    custom_op.clear_sampler_cache()
    eager_tokens, eager_cache = new_outputs(inputs, torch.bfloat16)
    step(*inputs.values(), eager_tokens, eager_cache)
    assert len(custom_op._SAMPLERS) == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    out_tokens, _ = compiled(*inputs.values(), tokens, cache)
    assert torch.equal(out_tokens, eager_tokens) and torch.equal(tokens, eager_tokens)
    assert same_values(cache, eager_cache)
    assert len(custom_op._SAMPLERS) == 1  # the compiled call reused the eager call's sampler
    want_tokens, want_cache = run_sampler("reference", head, inputs, torch.bfloat16)
    assert torch.equal(tokens, want_tokens) and same_values(cache, want_cache)
