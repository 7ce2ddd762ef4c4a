"""Bad input raises ``ValueError`` naming the argument, before anything runs (SPEC.md section 7).

Device mismatches use ``meta`` tensors, so they are tested on a CPU-only machine too.
"""

import re

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft.sampler import MarkovSampler

ROWS, STEPS, VOCAB, EXTRA, RANK, SLOTS = 3, 2, 300, 4, 8, 5


def head(dtype=torch.bfloat16, vocab=VOCAB):
    gen = torch.Generator().manual_seed(0)
    return dm.MarkovHead(torch.randn(vocab + EXTRA, RANK, generator=gen).to(dtype),
                         torch.randn(vocab, RANK, generator=gen).to(dtype))


def good_inputs(rows=ROWS, steps=STEPS, vocab=VOCAB, slots=SLOTS):
    return dict(
        base_logits=torch.randn(rows, steps, vocab),
        anchor=torch.arange(rows, dtype=torch.int64),
        idx_mapping=torch.arange(rows * steps, dtype=torch.int64) % max(slots, 1),
        positions=torch.arange(rows * steps, dtype=torch.int64) + 10,
        temperature=torch.full((slots,), 0.8),
        seeds=torch.arange(slots, dtype=torch.int64),
    )


def raises_naming(name):
    """``pytest.raises`` for a ValueError whose message starts with ``name:``."""
    return pytest.raises(ValueError, match="^" + re.escape(name) + ":")


def call(inputs=None, the_head=None, **kwargs):
    inputs = good_inputs() if inputs is None else inputs
    return dm.sample_drafts(the_head or head(), **inputs, impl=kwargs.pop("impl", "reference"), **kwargs)


def test_good_inputs_pass():
    out = call()
    assert out.draft_tokens.shape == (ROWS, STEPS)


# --------------------------------------------------------------------------- shapes
BAD_SHAPES = {
    "base_logits": torch.randn(ROWS, VOCAB),  # 2-D
    "anchor": torch.zeros(ROWS + 1, dtype=torch.int64),
    "idx_mapping": torch.zeros(ROWS, STEPS, dtype=torch.int64),  # [R, N] instead of [R*N]
    "positions": torch.zeros(ROWS * STEPS - 1, dtype=torch.int64),
    "temperature": torch.ones(SLOTS, 1),
    "seeds": torch.zeros(SLOTS + 1, dtype=torch.int64),
}


@pytest.mark.parametrize("name", list(BAD_SHAPES))
def test_wrong_shape(name):
    inputs = good_inputs()
    inputs[name] = BAD_SHAPES[name]
    with raises_naming(name):
        call(inputs)


@pytest.mark.parametrize("name,value", [
    ("draft_tokens", torch.zeros(ROWS, STEPS + 1, dtype=torch.int64)),
    ("logits_cache", torch.zeros(SLOTS - 1, STEPS, VOCAB, dtype=torch.bfloat16)),
    ("logits_cache", torch.zeros(SLOTS, STEPS, VOCAB - 1, dtype=torch.bfloat16)),
])
def test_wrong_output_shape(name, value):
    with raises_naming(name):
        call(**{name: value})


def test_not_a_tensor():
    inputs = good_inputs()
    inputs["anchor"] = [0, 1, 2]
    with raises_naming("anchor"):
        call(inputs)
    inputs = good_inputs()
    inputs["base_logits"] = inputs["base_logits"].numpy()
    with raises_naming("base_logits"):
        call(inputs)


# --------------------------------------------------------------------------- dtypes
BAD_DTYPES = {
    "base_logits": torch.float16,
    "anchor": torch.float32,
    "idx_mapping": torch.float32,
    "positions": torch.int16,
    "temperature": torch.float64,
    "seeds": torch.int32,
}


@pytest.mark.parametrize("name", list(BAD_DTYPES))
def test_wrong_dtype(name):
    inputs = good_inputs()
    inputs[name] = inputs[name].to(BAD_DTYPES[name])
    with raises_naming(name):
        call(inputs)


@pytest.mark.parametrize("name,value", [
    ("draft_tokens", torch.zeros(ROWS, STEPS, dtype=torch.int32)),
    ("logits_cache", torch.zeros(SLOTS, STEPS, VOCAB, dtype=torch.float16)),
])
def test_wrong_output_dtype(name, value):
    with raises_naming(name):
        call(**{name: value})


def test_cache_dtype_mismatch():
    with raises_naming("cache_dtype"):
        call(cache_dtype=torch.float16)
    with raises_naming("cache_dtype"):
        MarkovSampler(head(), STEPS, ROWS, cache_dtype=torch.float64, method="gumbel", impl="reference")
    sampler = MarkovSampler(head(), STEPS, ROWS, cache_dtype=torch.bfloat16, method="gumbel", impl="reference")
    with raises_naming("logits_cache"):  # the sampler's cache dtype is bf16
        sampler.sample(**good_inputs(), logits_cache=torch.zeros(SLOTS, STEPS, VOCAB))


# --------------------------------------------------------------------------- devices ('meta' stands for another device)
@pytest.mark.parametrize("name", ["anchor", "idx_mapping", "positions", "temperature", "seeds"])
def test_wrong_device(name):
    inputs = good_inputs()
    inputs[name] = inputs[name].to("meta")
    with raises_naming(name):
        call(inputs)


def test_base_logits_on_another_device_than_the_head():
    inputs = good_inputs()
    inputs["base_logits"] = inputs["base_logits"].to("meta")
    with raises_naming("base_logits"):
        call(inputs)


@pytest.mark.parametrize("name,value", [
    ("draft_tokens", torch.zeros(ROWS, STEPS, dtype=torch.int64, device="meta")),
    ("logits_cache", torch.zeros(SLOTS, STEPS, VOCAB, dtype=torch.bfloat16, device="meta")),
])
def test_output_on_wrong_device(name, value):
    with raises_naming(name):
        call(**{name: value})


# --------------------------------------------------------------------------- strides
def test_base_logits_last_stride():
    transposed = torch.randn(ROWS, VOCAB, STEPS).transpose(1, 2)  # [R, N, V], last stride N
    inputs = good_inputs()
    inputs["base_logits"] = transposed
    with raises_naming("base_logits"):
        call(inputs)


def test_output_last_stride():
    with raises_naming("draft_tokens"):
        call(draft_tokens=torch.zeros(STEPS, ROWS, dtype=torch.int64).t())
    with raises_naming("logits_cache"):
        call(logits_cache=torch.zeros(SLOTS, VOCAB, STEPS, dtype=torch.bfloat16).transpose(1, 2))
    with raises_naming("logits_cache"):  # last stride 1, but the steps are not V apart
        call(logits_cache=torch.zeros(SLOTS, STEPS, VOCAB + 5, dtype=torch.bfloat16)[:, :, :VOCAB])


def test_strided_base_logits_are_accepted():
    big = torch.randn(ROWS, STEPS + 1, VOCAB + 3)
    inputs = good_inputs()
    inputs["base_logits"] = big[:, 1:, 3:]
    assert call(inputs).draft_tokens.shape == (ROWS, STEPS)


# --------------------------------------------------------------------------- value ranges
@pytest.mark.parametrize("bad", [-1, VOCAB + EXTRA])
def test_anchor_out_of_range(bad):
    inputs = good_inputs()
    inputs["anchor"][1] = bad
    with raises_naming("anchor"):
        call(inputs)


def test_anchor_may_use_the_extra_embedding_rows():
    inputs = good_inputs()
    inputs["anchor"][1] = VOCAB + EXTRA - 1
    call(inputs)


@pytest.mark.parametrize("bad", [-2, SLOTS])
def test_slot_out_of_range(bad):
    inputs = good_inputs()
    inputs["idx_mapping"][3] = bad
    with raises_naming("idx_mapping"):
        call(inputs)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_bad_temperature(bad):
    inputs = good_inputs()
    inputs["temperature"][2] = bad
    with raises_naming("temperature"):
        call(inputs)


def test_value_checks_can_be_skipped():
    """``check_values=False`` (as under graph capture) skips only the checks that read values back."""
    inputs = good_inputs()
    inputs["temperature"][0] = 0.0
    call(inputs, check_values=False)
    inputs["anchor"] = inputs["anchor"].float()
    with raises_naming("anchor"):
        call(inputs, check_values=False)


# --------------------------------------------------------------------------- N and V mismatches
def test_vocab_mismatch_with_the_head():
    with raises_naming("base_logits"):
        call(good_inputs(vocab=VOCAB + 1))


def test_steps_mismatch():
    sampler = MarkovSampler(head(), STEPS, ROWS, cache_dtype=torch.bfloat16, method="gumbel", impl="reference")
    with raises_naming("base_logits"):
        sampler.sample(**good_inputs(steps=STEPS + 1))
    with raises_naming("logits_cache"):
        call(logits_cache=torch.zeros(SLOTS, STEPS + 1, VOCAB, dtype=torch.bfloat16))
    with raises_naming("draft_tokens"):
        call(draft_tokens=torch.zeros(ROWS, STEPS - 1, dtype=torch.int64))


def test_too_many_rows_for_the_sampler():
    sampler = MarkovSampler(head(), STEPS, ROWS - 1, cache_dtype=torch.bfloat16, method="gumbel", impl="reference")
    with raises_naming("base_logits"):
        sampler.sample(**good_inputs())


# --------------------------------------------------------------------------- names of methods, impls, sizes
def test_bad_method():
    with raises_naming("method"):
        call(method="top_k")


@pytest.mark.parametrize("impl", ["cuda", "", "Reference"])
def test_bad_impl(impl):
    with raises_naming("impl"):
        call(impl=impl)


@pytest.mark.parametrize("name,args", [("num_steps", (0, 4)), ("max_rows", (2, 0))])
def test_bad_sampler_sizes(name, args):
    with raises_naming(name):
        MarkovSampler(head(), *args, cache_dtype=torch.bfloat16, method="gumbel", impl="reference")


# --------------------------------------------------------------------------- MarkovHead
def test_head_dtype_mismatch():
    with raises_naming("head_weight"):
        dm.MarkovHead(torch.zeros(VOCAB, RANK, dtype=torch.bfloat16), torch.zeros(VOCAB, RANK))


def test_head_rank_mismatch():
    with raises_naming("head_weight"):
        dm.MarkovHead(torch.zeros(VOCAB, RANK), torch.zeros(VOCAB, RANK + 1))


def test_head_embed_smaller_than_vocab():
    with raises_naming("embed_weight"):
        dm.MarkovHead(torch.zeros(VOCAB - 1, RANK), torch.zeros(VOCAB, RANK))


def test_head_device_mismatch():
    with raises_naming("head_weight"):
        dm.MarkovHead(torch.zeros(VOCAB, RANK), torch.zeros(VOCAB, RANK, device="meta"))


@pytest.mark.parametrize("name,embed,head_w", [
    ("embed_weight", torch.zeros(VOCAB * RANK), torch.zeros(VOCAB, RANK)),
    ("head_weight", torch.zeros(VOCAB, RANK), torch.zeros(1, VOCAB, RANK)),
    ("embed_weight", torch.zeros(VOCAB, RANK, dtype=torch.int64), torch.zeros(VOCAB, RANK, dtype=torch.int64)),
    ("embed_weight", torch.zeros(0, RANK), torch.zeros(VOCAB, RANK)),
    ("head_weight", torch.zeros(VOCAB, RANK), "weights"),
])
def test_head_bad_weights(name, embed, head_w):
    with raises_naming(name):
        dm.MarkovHead(embed, head_w)


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_head_bad_scale(scale):
    with raises_naming("scale"):
        dm.MarkovHead(torch.zeros(VOCAB, RANK), torch.zeros(VOCAB, RANK), scale)


# --------------------------------------------------------------------------- empty batches
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_empty_batch_returns_empty_outputs(method):
    out = call(good_inputs(rows=0), method=method)
    assert out.draft_tokens.shape == (0, STEPS) and out.draft_tokens.dtype == torch.int64
    assert out.logits_cache.shape == (SLOTS, STEPS, VOCAB)
    cache = torch.full((SLOTS, STEPS, VOCAB), 3.0, dtype=torch.bfloat16)
    tokens = torch.empty(0, STEPS, dtype=torch.int64)
    out = call(good_inputs(rows=0), method=method, draft_tokens=tokens, logits_cache=cache)
    assert out.draft_tokens is tokens and out.logits_cache is cache
    assert bool((cache == 3.0).all())  # untouched


def test_no_slots_all_padding():
    """S = 0 (every row is padding): valid tokens, nothing written."""
    inputs = good_inputs(slots=0) | dict(idx_mapping=torch.full((ROWS * STEPS,), -1, dtype=torch.int64))
    out = call(inputs)
    assert out.logits_cache.shape == (0, STEPS, VOCAB)
    assert int(out.draft_tokens.min()) >= 0 and int(out.draft_tokens.max()) < VOCAB


def test_slot_values_need_slots():
    inputs = good_inputs(slots=0)
    with raises_naming("idx_mapping"):
        call(inputs)


def test_given_cache_dtype_wins_over_cache_dtype_argument():
    cache = torch.zeros(SLOTS, STEPS, VOCAB, dtype=torch.bfloat16)
    out = call(logits_cache=cache, cache_dtype=torch.float32)
    assert out.logits_cache is cache


def test_errors_come_before_any_write():
    tokens = torch.full((ROWS, STEPS), -5, dtype=torch.int64)
    cache = torch.full((SLOTS, STEPS, VOCAB), 7.0, dtype=torch.bfloat16)
    inputs = good_inputs()
    inputs["idx_mapping"][-1] = SLOTS  # found only by the value checks, which read the inputs back
    with raises_naming("idx_mapping"):
        call(inputs, draft_tokens=tokens, logits_cache=cache)
    assert bool((tokens == -5).all()) and bool((cache == 7.0).all())


@pytest.mark.parametrize("name", ["anchor", "idx_mapping", "positions", "temperature", "seeds"])
def test_strided_1d_inputs_are_rejected(name):
    """The Triton launchers read the 1-D inputs with unit stride, so a strided view must not pass."""
    inputs = good_inputs()
    value = inputs[name]
    spread = torch.zeros(value.numel() * 2, dtype=value.dtype)
    spread[::2] = value
    inputs[name] = spread[::2]
    with raises_naming(name):
        call(inputs)


def test_strided_outputs_are_accepted():
    """Outputs need a unit last stride (and step stride V for the cache), not contiguity."""
    inputs = good_inputs()
    expected = call(inputs)
    tokens = torch.full((ROWS, STEPS + 1), -1, dtype=torch.int64)[:, :STEPS]
    cache = torch.zeros(SLOTS, STEPS + 1, VOCAB, dtype=torch.bfloat16)[:, 1:]
    out = call(inputs, draft_tokens=tokens, logits_cache=cache)
    assert torch.equal(out.draft_tokens, expected.draft_tokens)
    assert torch.equal(out.logits_cache, expected.logits_cache)


@pytest.mark.parametrize("impl, method", [("reference", "gumbel"), ("loop", "gumbel"), ("gumbel_fused", "gumbel"),
                                          ("reference", "inverse_cdf"), ("inverse_cdf", "inverse_cdf")])
def test_one_step_cache_takes_any_step_stride(impl, method):
    """With N = 1 the cache's step stride is never used: a ``[S, 1, V]`` view whose step stride is not V (one step of
    a wider buffer) is accepted and written as the contiguous cache is (it was refused before stop 50)."""
    inputs = good_inputs(steps=1)
    expected = call(inputs, impl=impl, method=method)
    store = torch.full((SLOTS, VOCAB + 7), 3.0, dtype=torch.bfloat16)
    store[:, :VOCAB] = 0.0  # (slots no row writes keep 0, as in the cache sample_drafts allocates)
    cache = store.as_strided((SLOTS, 1, VOCAB), (VOCAB + 7, VOCAB + 3, 1))
    assert cache.stride(1) != VOCAB
    out = call(inputs, impl=impl, method=method, logits_cache=cache)
    assert torch.equal(out.draft_tokens, expected.draft_tokens)
    assert torch.equal(cache, expected.logits_cache)
    assert bool((store[:, VOCAB:] == 3.0).all()), "wrote outside the view"


# --------------------------------------------------------------------------- tensors without values ('meta')
# A meta tensor passes the device-consistency checks when every input is on it, but has no values: the value checks
# (validate.check_range / check_unique_slots) and the reference / Triton paths raised torch's RuntimeError or
# NotImplementedError. Every entry point now names the first such argument (helper audit; verify_drafts:
# tests/verify/test_verify.py).
def meta_only(name):
    return pytest.raises(ValueError, match="^" + re.escape(name) + ": expected a CPU or CUDA tensor, got one on meta")


def test_value_checks_refuse_meta_tensors():
    from dspark_markov.validate import check_range, check_unique_slots

    for x in (torch.zeros(4, dtype=torch.int64, device="meta"), torch.zeros(0, dtype=torch.int64, device="meta")):
        with meta_only("idx_mapping"):
            check_range("idx_mapping", x, -1, SLOTS)
        with meta_only("idx_mapping"):
            check_unique_slots("idx_mapping", x)
    check_range("idx_mapping", torch.tensor([0, 4]), -1, SLOTS)  # CPU: as before
    with raises_naming("idx_mapping"):
        check_range("idx_mapping", torch.tensor([0, 5]), -1, SLOTS)


def _step():
    backbone = lambda ids, pos: torch.zeros(ROWS, STEPS, VOCAB)  # noqa: E731
    return dm.DSparkStep(head(), backbone, num_steps=STEPS, max_reqs=ROWS, num_slots=SLOTS, mask_token_id=7,
                         max_model_len=100, draft_impl="reference", block_inputs_impl="reference",
                         verify_impl="reference", filter_impl="reference")


@pytest.mark.parametrize("name", ["req_slots", "bonus_tokens", "last_pos"])
def test_step_draft_refuses_meta_request_tensors(name):
    requests = dict(last_pos=torch.tensor([3, 4, 5]), bonus_tokens=torch.tensor([5, 6, 7]),
                    req_slots=torch.tensor([0, 1, 2]))
    requests[name] = requests[name].to("meta")
    step = _step()
    with meta_only(name):
        step.draft(**requests, temperature=torch.full((SLOTS,), 0.8), seeds=torch.arange(SLOTS))
    requests = {key: value.to("meta") for key, value in requests.items()}  # all of them: the first checked is named
    with meta_only("req_slots"):
        step.draft(**requests, temperature=torch.full((SLOTS,), 0.8), seeds=torch.arange(SLOTS))


@pytest.mark.parametrize("impl", ["reference", "auto", "triton"])
@pytest.mark.parametrize("per_row", [False, True])
def test_top_k_top_p_refuses_meta_logits(impl, per_row):
    logits = torch.zeros(ROWS, VOCAB, device="meta")
    k = torch.full((ROWS,), 5, device="meta") if per_row else 5
    p = torch.full((ROWS,), 0.9, device="meta") if per_row else 0.9
    with meta_only("logits"):
        dm.top_k_top_p(logits, k, p, impl=impl)


@pytest.mark.parametrize("impl", ["reference", "auto", "triton"])
def test_prepare_block_inputs_refuses_meta_tensors(impl):
    def i64(n, device):
        return torch.zeros(n, dtype=torch.int64, device=device)

    for device in ("meta", "cpu"):  # every tensor on meta; last_pos alone on meta (was: bonus_tokens named)
        queries = ROWS * (STEPS + 1)
        with meta_only("last_pos"):
            dm.prepare_block_inputs(i64(ROWS, "meta"), i64(ROWS, device), i64(ROWS, device), num_steps=STEPS,
                                    mask_token_id=7, max_model_len=100, input_ids=i64(queries, device),
                                    positions=i64(queries, device), sample_pos=i64(ROWS * STEPS, device),
                                    sample_idx_mapping=i64(ROWS * STEPS, device),
                                    is_padding=torch.zeros(queries, dtype=torch.bool, device=device), impl=impl)


def test_head_refuses_a_meta_d2t():
    weights = dict(embed_weight=torch.zeros(VOCAB, RANK, device="meta"),
                   head_weight=torch.zeros(VOCAB - 10, RANK, device="meta"))
    with meta_only("d2t"):
        dm.MarkovHead(**weights, d2t=torch.zeros(VOCAB - 10, dtype=torch.int64, device="meta"))


def test_sharded_sampler_refuses_meta_weights(tmp_path):
    import torch.distributed as dist

    from dspark_markov.sharded import ShardedMarkovSampler

    if not dist.is_available() or not dist.is_gloo_available() or dist.is_initialized():
        pytest.skip("needs gloo and no process group of its own")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with meta_only("embed_weight"):  # (its torch shard step has no registry device check)
            ShardedMarkovSampler(torch.zeros(VOCAB, RANK, device="meta"), torch.zeros(VOCAB, RANK, device="meta"),
                                 num_steps=STEPS, max_rows=ROWS)
    finally:
        dist.destroy_process_group()
