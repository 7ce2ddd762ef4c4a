"""prepare_block_inputs: the Triton kernel equals the torch reference exactly (CPU interpreter)."""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.block_inputs import prepare_block_inputs_reference

STEPS = 5
MAX_REQS = 11
MASK_ID = 7
MAX_LEN = 100
NAMES = ("input_ids", "positions", "sample_pos", "sample_idx_mapping", "is_padding")


def buffers(max_reqs=MAX_REQS, steps=STEPS, id_dtype=torch.int64, fill=55):
    """Persistent output buffers, pre-filled with garbage that every call must overwrite."""
    queries = max_reqs * (steps + 1)
    return dict(
        input_ids=torch.full((queries,), fill, dtype=id_dtype),
        positions=torch.full((queries,), fill, dtype=id_dtype),
        sample_pos=torch.full((max_reqs * steps,), fill, dtype=torch.int64),
        sample_idx_mapping=torch.full((max_reqs * steps,), fill, dtype=torch.int64),
        is_padding=torch.tensor([True, False]).repeat(queries // 2 + 1)[:queries].clone(),
    )


def inputs(count=MAX_REQS, seed=0, dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    last_pos = torch.randint(0, MAX_LEN, (count,), generator=gen)
    last_pos[: min(count, 3)] = torch.tensor([MAX_LEN - 1, MAX_LEN - 3, 0])[: min(count, 3)]  # clamped rows
    bonus = torch.randint(0, 50_000, (count,), generator=gen)
    slots = torch.randperm(40, generator=gen)[:count]  # slot 0 may appear: a real slot
    return last_pos.to(dtype), bonus.to(dtype), slots.to(dtype)


def call(last_pos, bonus, slots, out, num_reqs, impl="triton", steps=STEPS):
    dm.prepare_block_inputs(last_pos, bonus, slots, num_steps=steps, mask_token_id=MASK_ID, max_model_len=MAX_LEN,
                            num_reqs=num_reqs, impl=impl, **out)


def assert_equal(a, b):
    for name in NAMES:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("num_reqs", [0, 1, 7, MAX_REQS])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_triton_equals_reference(num_reqs, id_dtype):
    last_pos, bonus, slots = inputs()
    expected, got = buffers(id_dtype=id_dtype), buffers(id_dtype=id_dtype)
    call(last_pos, bonus, slots, expected, num_reqs, impl="reference")
    call(last_pos, bonus, slots, got, num_reqs)
    assert_equal(got, expected)


def test_reference_layout_by_hand():
    last_pos, bonus, slots = torch.tensor([5, MAX_LEN - 2]), torch.tensor([300, 301]), torch.tensor([0, 9])
    ids, pos, sample_pos, mapping, padding = prepare_block_inputs_reference(
        last_pos, bonus, slots, 2, num_steps=3, mask_token_id=MASK_ID, max_model_len=MAX_LEN, max_reqs=3)
    m, top = MASK_ID, MAX_LEN - 1
    assert ids.tolist() == [300, m, m, m, 301, m, m, m, 0, 0, 0, 0]
    assert pos.tolist() == [5, 6, 7, 8, top - 1, top, top, top, 0, 0, 0, 0]
    assert sample_pos.tolist() == [6, 7, 8, top, top, top, 0, 0, 0]
    assert mapping.tolist() == [0, 0, 0, 9, 9, 9, -1, -1, -1]
    assert padding.tolist() == [False] * 8 + [True] * 4


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_num_reqs_as_device_tensor(impl):
    """A device count is read at run time (graph friendly) and clamped to the inputs and buffers."""
    last_pos, bonus, slots = inputs(count=9, dtype=torch.int32)
    for count in (4, 0, 9, 50, -3):
        expected, got = buffers(), buffers()
        call(last_pos, bonus, slots, expected, max(0, min(count, 9)), impl="reference")
        call(last_pos, bonus, slots, got, torch.tensor([count], dtype=torch.int32), impl=impl)
        assert_equal(got, expected)


def test_default_count_and_wide_padding():
    """num_reqs=None uses every input; a large padded batch spans several 1024-element chunks."""
    last_pos, bonus, slots = inputs(count=3)
    expected, got = buffers(max_reqs=400, steps=7), buffers(max_reqs=400, steps=7)
    call(last_pos, bonus, slots, expected, None, impl="reference", steps=7)
    call(last_pos, bonus, slots, got, None, steps=7)
    assert_equal(got, expected)
    assert bool(got["is_padding"][3 * 8:].all()) and bool((got["sample_idx_mapping"][3 * 7:] == -1).all())


@pytest.mark.parametrize("change, name", [
    (dict(num_steps=0), "num_steps"),
    (dict(mask_token_id=-1), "mask_token_id"),
    (dict(max_model_len=0), "max_model_len"),
    (dict(last_pos=torch.zeros(4)), "last_pos"),
    (dict(bonus_tokens=torch.zeros(3, dtype=torch.int64)), "bonus_tokens"),
    (dict(req_slots=torch.zeros(8, dtype=torch.int64)[::2]), "req_slots"),
    (dict(input_ids=torch.zeros(MAX_REQS * (STEPS + 1) - 1, dtype=torch.int64)), "input_ids"),
    (dict(positions=torch.zeros(MAX_REQS * (STEPS + 1), dtype=torch.float32)), "positions"),
    (dict(sample_pos=torch.zeros(MAX_REQS * STEPS, dtype=torch.int32)), "sample_pos"),
    (dict(sample_idx_mapping=torch.zeros(MAX_REQS * STEPS + 1, dtype=torch.int64)), "sample_idx_mapping"),
    (dict(is_padding=torch.zeros(MAX_REQS * (STEPS + 1), dtype=torch.int64)), "is_padding"),
    (dict(num_reqs=5), "num_reqs"),
    (dict(num_reqs=torch.zeros(2, dtype=torch.int64)), "num_reqs"),
    (dict(num_reqs=torch.zeros(1)), "num_reqs"),
    (dict(impl="cuda"), "impl"),
    (dict(max_model_len=2**31 + 1, positions=torch.zeros(MAX_REQS * (STEPS + 1), dtype=torch.int32)), "max_model_len"),
])
def test_bad_input_names_the_argument(change, name):
    last_pos, bonus, slots = inputs(count=4)
    args = dict(last_pos=last_pos, bonus_tokens=bonus, req_slots=slots, num_steps=STEPS, mask_token_id=MASK_ID,
                max_model_len=MAX_LEN, num_reqs=2, **buffers())
    args.update(change)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        dm.prepare_block_inputs(**args)


def test_too_many_requests_for_the_buffers():
    last_pos, bonus, slots = inputs(count=MAX_REQS)
    with pytest.raises(ValueError, match=r"^last_pos\b"):
        call(last_pos, bonus, slots, buffers(max_reqs=MAX_REQS - 1), None)


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("max_len", [2**63 - 1, 2**62, MAX_LEN])
def test_positions_clamp_at_the_end_of_int64(impl, max_len):
    """min(last_pos + j, max_model_len - 1) for last_pos near 2**63 - 1: last_pos + j used to wrap to -2**63 first, so
    the positions came out negative instead of clamped."""
    last_pos = torch.tensor([2**63 - 1, 2**63 - 3, max_len - 1, 7])
    out = buffers(max_reqs=4, steps=3)
    dm.prepare_block_inputs(last_pos, torch.arange(4), torch.arange(4), num_steps=3, mask_token_id=MASK_ID,
                            max_model_len=max_len, impl=impl, **out)
    top = max_len - 1
    want_pos = [[min(int(p) + j, top) for j in range(4)] for p in last_pos]
    want_sample = [[min(int(p) + 1 + i, top) for i in range(3)] for p in last_pos]
    assert out["positions"].view(4, 4).tolist() == want_pos
    assert out["sample_pos"].view(4, 3).tolist() == want_sample


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("case", ["positions over last_pos", "sample_pos over positions", "input_ids over bonus",
                                  "is_padding over num_reqs"])
def test_outputs_sharing_memory_are_refused(impl, case):
    """Stop 50 (helper audit): outputs were not checked against each other or the inputs; the Triton kernel reads
    last_pos again after writing positions, so a positions buffer over last_pos was read after it was written."""
    last_pos, bonus, slots = inputs(count=4)
    out = buffers()
    num_reqs = 2
    if case == "positions over last_pos":
        store = torch.zeros(MAX_REQS * (STEPS + 1), dtype=torch.int64)
        store[:4] = last_pos
        last_pos, out["positions"], name = store[:4], store, "positions"
    elif case == "sample_pos over positions":
        out["sample_pos"] = out["positions"][: MAX_REQS * STEPS]
        name = "positions"
    elif case == "input_ids over bonus":
        bonus = out["input_ids"][:4].clone()
        out["input_ids"][:4] = bonus
        bonus, name = out["input_ids"][5:9], "input_ids"
    else:
        store = torch.zeros(72, dtype=torch.bool)
        out["is_padding"] = store[: MAX_REQS * (STEPS + 1)]  # (66 bytes)
        num_reqs = store[64:].view(torch.int64)  # (a one-element int64 tensor over its last two bytes)
        name = "is_padding"
    with pytest.raises(ValueError, match=rf"^{name}: shares memory with"):
        call(last_pos, bonus, slots, out, num_reqs, impl=impl)
