"""DSparkStep end to end on the CPU (V = 300, N = 3) with a tiny deterministic backbone.

The step must equal the composition of its parts (block inputs, backbone, sample_drafts,
verify_drafts), whatever the implementation chosen for each part.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.block_inputs import prepare_block_inputs_reference
from dspark_markov.step import DSparkStep

VOCAB, N, MAX_REQS, SLOTS, MASK, MAX_LEN = 300, 3, 4, 6, 299, 4096


def _head():
    g = torch.Generator().manual_seed(1)
    return dm.MarkovHead(torch.randn(VOCAB, 8, generator=g) * 0.3, torch.randn(VOCAB, 8, generator=g) * 0.3)


class _Backbone:
    """base_logits[r, i] = table[input id of query row i + 1] + 0.1 * cos(position): deterministic."""

    def __init__(self):
        self.table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(2)) * 1.5
        self.calls = 0

    def __call__(self, input_ids, positions):
        self.calls += 1
        ids = input_ids.view(MAX_REQS, N + 1)[:, 1:]
        pos = positions.view(MAX_REQS, N + 1)[:, 1:, None].float()
        return (self.table[ids] + 0.1 * torch.cos(pos * torch.arange(VOCAB) / 50)).contiguous()


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    last_pos = torch.randint(10, 1000, (3,), generator=g)
    bonus = torch.randint(0, VOCAB, (3,), generator=g)
    slots = torch.randperm(SLOTS, generator=g)[:3]
    temperature = torch.rand(SLOTS, generator=g) + 0.5
    temperature[slots[2]] = 0.0  # a greedy request
    seeds = torch.randint(-(2**62), 2**62, (SLOTS,), generator=g)
    return last_pos, bonus, slots, temperature, seeds


def _expected_draft(head, backbone, last_pos, bonus, slots, temperature, seeds):
    ids, pos, sample_pos, sample_idx, _ = prepare_block_inputs_reference(
        last_pos, bonus, slots, 3, num_steps=N, mask_token_id=MASK, max_model_len=MAX_LEN, max_reqs=MAX_REQS)
    base = backbone(ids, pos)
    anchor = ids.view(MAX_REQS, N + 1)[:, 0].contiguous()
    cache = torch.zeros(SLOTS, N, VOCAB, dtype=torch.bfloat16)
    out = dm.sample_drafts(head, base, anchor, sample_idx, sample_pos, temperature, seeds, logits_cache=cache)
    # contiguous copies: 1-D per-request tensors must be contiguous (README, Inputs)
    return (out.draft_tokens, cache, sample_idx.view(MAX_REQS, N)[:, 0].contiguous(),
            sample_pos.view(MAX_REQS, N)[:, 0].contiguous())


def _target(draft_tokens, cache, req_slots, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    slot = req_slots.clamp_min(0)
    safe_t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    target = torch.randn(MAX_REQS, N + 1, VOCAB, generator=g) * 0.5
    target[:, :N] += cache[slot].float() / safe_t[slot, None, None]
    return target


@pytest.mark.parametrize("draft_impl,verify_impl,block_impl,verify_method", [
    ("reference", "reference", "reference", "standard"),
    ("loop", "triton", "triton", "block"),
])
def test_step_equals_its_parts(draft_impl, verify_impl, block_impl, verify_method):
    head = _head()
    backbone = _Backbone()
    step = DSparkStep(head, backbone, num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                      max_model_len=MAX_LEN, draft_impl=draft_impl, verify_impl=verify_impl,
                      block_inputs_impl=block_impl, verify_method=verify_method)
    for seed in (0, 1):  # the same step object, refilled: no state leaks between calls
        last_pos, bonus, slots, temperature, seeds = _inputs(seed)
        drafts = step.draft(last_pos, bonus, slots, temperature, seeds)
        exp_drafts, exp_cache, req_slots, req_pos = _expected_draft(head, backbone, last_pos, bonus, slots,
                                                                    temperature, seeds)
        assert torch.equal(drafts, exp_drafts)
        for r in range(3):
            assert torch.equal(step.logits_cache[slots[r]], exp_cache[slots[r]])
        assert torch.equal(step.req_slots, req_slots) and torch.equal(step.req_positions, req_pos)
        target = _target(drafts, exp_cache, req_slots, temperature, seed + 10)
        num_drafts = torch.tensor([3, 2, 3, 0])
        out = step.verify(target.clone(), num_drafts, temperature, seeds)
        ref = dm.verify_drafts(target, exp_drafts, exp_cache, num_drafts, req_slots, req_pos, temperature, seeds,
                               method=verify_method)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_emitted, ref.num_emitted)
        assert int(out.num_emitted[3]) == 0  # the padded request
        assert int(out.num_emitted[:3].sum()) > 3  # some drafts accepted


def test_verify_with_top_k_filters_the_target():
    head = _head()
    step = DSparkStep(head, _Backbone(), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                      max_model_len=MAX_LEN, draft_impl="reference", verify_impl="reference",
                      block_inputs_impl="reference", filter_impl="reference")
    assert step.verify_status is None  # reference verification: no device flag
    last_pos, bonus, slots, temperature, seeds = _inputs(3)
    drafts = step.draft(last_pos, bonus, slots, temperature, seeds)
    target = _target(drafts, step.logits_cache, step.req_slots, temperature, 4)
    filtered = target.clone()
    out = step.verify(filtered, torch.full((MAX_REQS,), N), temperature, seeds, top_k=5)
    keep = target.topk(5, dim=-1).indices
    assert bool(torch.isfinite(filtered.gather(-1, keep)).all())
    assert int(torch.isfinite(filtered).sum()) == MAX_REQS * (N + 1) * 5
    ref = dm.verify_drafts(filtered, drafts, step.logits_cache, torch.full((MAX_REQS,), N), step.req_slots,
                           step.req_positions, temperature, seeds)
    assert torch.equal(out.tokens, ref.tokens)
    for b in range(3):  # every emitted token has target mass: it is in its row's top 5
        for j in range(int(out.num_emitted[b])):
            assert int(out.tokens[b, j]) in keep[b, j].tolist()

@pytest.mark.parametrize("verify_impl", ["reference", "triton"])
def test_verify_raw_target_logits_with_temperature(verify_impl):
    """verify(target_temperature=T): raw target logits, divided by each request's slot temperature inside verification
    (no filter) or by the filter as it reads them (top_k / top_p; filter_impl 'reference' here, 'cuda' on the GPU):
    the tokens and the filtered rows are those of passing scale_target's pre-divided logits; the Triton filter refuses
    raw rows."""
    from dspark_markov.verify.reference import scale_target

    head = _head()
    kinds = dict(num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK, max_model_len=MAX_LEN,
                 draft_impl="reference", verify_impl=verify_impl, block_inputs_impl="reference")
    step = DSparkStep(head, _Backbone(), filter_impl="reference", **kinds)
    last_pos, bonus, slots, temperature, seeds = _inputs(5)
    step.draft(last_pos, bonus, slots, temperature, seeds)
    raw = _target(step.draft_tokens, step.logits_cache, step.req_slots, temperature, 6) * 1.7
    target_t = torch.rand(SLOTS, generator=torch.Generator().manual_seed(7)) + 0.4
    target_t[slots[1]] = 0.0  # an unscaled slot
    num_drafts = torch.full((MAX_REQS,), N)
    divided = scale_target(raw, target_t, step.req_slots)
    for top_k, top_p in ((None, None), (7, None), (None, 0.8), (20, 0.7)):
        expected_rows = divided.clone()
        expected = step.verify(expected_rows, num_drafts, temperature, seeds, top_k=top_k, top_p=top_p)
        expected = (expected.tokens.clone(), expected.num_emitted.clone())
        rows = raw.clone()
        out = step.verify(rows, num_drafts, temperature, seeds, top_k=top_k, top_p=top_p, target_temperature=target_t)
        assert torch.equal(out.tokens, expected[0]) and torch.equal(out.num_emitted, expected[1])
        if top_k is not None or top_p is not None:
            assert torch.equal(rows, expected_rows)  # divided (the padding request unscaled), then filtered
    triton_filter = DSparkStep(head, _Backbone(), filter_impl="triton", **kinds)
    with pytest.raises(ValueError, match="target_temperature"):
        triton_filter.verify(raw.clone(), num_drafts, temperature, seeds, top_p=0.8, target_temperature=target_t)


def test_verify_filter_auto_asks_top_k_top_p_auto_on_every_call(monkeypatch):
    """filter_impl="auto" (the default) leaves the choice to top_k_top_p's auto on each call (on sm_90: the cluster
    filter for a small step or raw rows); an explicit filter_impl is used as it is."""
    from dspark_markov.verify import filtering

    head = _head()
    kinds = dict(num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK, max_model_len=MAX_LEN,
                 draft_impl="reference", verify_impl="reference", block_inputs_impl="reference")
    asked = []
    real = filtering._auto_impl
    monkeypatch.setattr(filtering, "_auto_impl", lambda impl, rows, t, k=None: (impl == "auto" and asked.append(
        (tuple(rows.shape), t, k))) or real(impl, rows, t, k))  # (top_k_top_p asks again with the step's answer)
    last_pos, bonus, slots, temperature, seeds = _inputs(5)
    num_drafts = torch.full((MAX_REQS,), N)
    target_t = torch.full((SLOTS,), 0.5)
    for filter_impl, expected in (("auto", 2), ("reference", 0)):
        asked.clear()
        step = DSparkStep(head, _Backbone(), filter_impl=filter_impl, **kinds)
        step.draft(last_pos, bonus, slots, temperature, seeds)
        raw = _target(step.draft_tokens, step.logits_cache, step.req_slots, temperature, 6)
        step.verify(raw.clone(), num_drafts, temperature, seeds, top_p=0.8)
        step.verify(raw.clone(), num_drafts, temperature, seeds, top_k=5, target_temperature=target_t)
        assert len(asked) == expected and step.filter_impl == "reference"  # (the CPU: auto's answer is the reference)
        if expected:
            assert asked[0] == ((MAX_REQS * (N + 1), head.vocab_size), None, None)  # top-p alone: no k
            assert asked[1][1] is target_t and asked[1][2] == 5


def test_bad_arguments():
    head = _head()
    with pytest.raises(ValueError, match="backbone"):
        DSparkStep(head, None, num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                   max_model_len=MAX_LEN)
    with pytest.raises(ValueError, match="verify_impl: expected one of"):
        DSparkStep(head, _Backbone(), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                   max_model_len=MAX_LEN, verify_impl="cuda_verify")
    with pytest.raises(ValueError, match="verify_impl: 'cuda' verifies on a CUDA device"):
        DSparkStep(head, _Backbone(), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                   max_model_len=MAX_LEN, verify_impl="cuda")
    step = DSparkStep(head, lambda ids, pos: torch.zeros(2, 2), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS,
                      mask_token_id=MASK, max_model_len=MAX_LEN, draft_impl="reference", verify_impl="reference",
                      block_inputs_impl="reference")
    last_pos, bonus, slots, temperature, seeds = _inputs(0)
    with pytest.raises(ValueError, match="backbone"):
        step.draft(last_pos, bonus, slots, temperature, seeds)


def test_draft_checks_temperature_and_seeds_per_slot():
    """temperature and seeds are per slot of the step's cache [num_slots, N, V]: a wrong length names them (it named
    the step's own logits_cache buffer, or seeds for a short temperature)."""
    step = DSparkStep(_head(), _Backbone(), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                      max_model_len=MAX_LEN, draft_impl="reference", verify_impl="reference",
                      block_inputs_impl="reference")
    last_pos, bonus, slots, temperature, seeds = _inputs(0)
    for temp, seed, name in ((temperature[:-1], seeds, "temperature"),
                             (torch.ones(SLOTS + 2), torch.zeros(SLOTS + 2, dtype=torch.int64), "temperature"),
                             (torch.ones(0), torch.zeros(0, dtype=torch.int64), "temperature"),
                             (temperature, seeds[:-1], "seeds")):
        with pytest.raises(ValueError, match=rf"^{name}: expected shape \({SLOTS},\)"):
            step.draft(last_pos, bonus, slots, temp, seed)


def test_draft_last_pos_range():
    """A negative last_pos is rejected by name (it gave negative positions); last_pos at the end of int64 is clamped
    to max_model_len - 1 like any position past the model length."""
    head = _head()
    backbone = _Backbone()
    for block_impl in ("reference", "triton"):
        step = DSparkStep(head, backbone, num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                          max_model_len=MAX_LEN, draft_impl="reference", verify_impl="reference",
                          block_inputs_impl=block_impl)
        last_pos, bonus, slots, temperature, seeds = _inputs(0)
        last_pos[1] = -1
        with pytest.raises(ValueError, match=r"^last_pos: expected values in \[0, "):
            step.draft(last_pos, bonus, slots, temperature, seeds)
        last_pos[1] = 2**63 - 1
        step.draft(last_pos, bonus, slots, temperature, seeds)
        assert step.sample_pos.view(MAX_REQS, N)[1].tolist() == [MAX_LEN - 1] * N
        assert step.positions.view(MAX_REQS, N + 1)[1].tolist() == [MAX_LEN - 1] * (N + 1)
        # a padding request (slot -1) is not read: its last_pos may be anything
        padded = slots.clone()
        padded[1] = -1
        last_pos[1] = -1
        step.draft(last_pos, bonus, padded, temperature, seeds)  # (raised "last_pos: expected values in [0, ...")
        # a float last_pos (NaN too) is named by its dtype, not by a failed int conversion
        with pytest.raises(ValueError, match=r"^last_pos: expected dtype"):
            step.draft(torch.full((3,), float("nan")), bonus, slots, temperature, seeds)


def test_draft_checks_live_requests_with_a_device_num_reqs():
    """With value checks, a one-element tensor num_reqs is read (clamped as the kernels clamp it) so that the live
    requests' req_slots, last_pos and bonus_tokens are checked under their own names, as with an int num_reqs: a
    negative last_pos was accepted silently (negative positions), the others were named by the step's own buffers
    (idx_mapping, anchor)."""
    step = DSparkStep(_head(), _Backbone(), num_steps=N, max_reqs=MAX_REQS, num_slots=SLOTS, mask_token_id=MASK,
                      max_model_len=MAX_LEN, draft_impl="reference", verify_impl="reference",
                      block_inputs_impl="reference")
    last_pos, bonus, slots, temperature, seeds = _inputs(0)
    for count in (3, torch.tensor([3]), torch.tensor(7, dtype=torch.int32)):
        bad_pos = last_pos.clone()
        bad_pos[1] = -7
        with pytest.raises(ValueError, match=r"^last_pos: expected values in \[0, "):
            step.draft(bad_pos, bonus, slots, temperature, seeds, num_reqs=count)
        bad_slots = slots.clone()
        bad_slots[1] = -5
        with pytest.raises(ValueError, match=r"^req_slots: expected values in \[-1, "):
            step.draft(last_pos, bonus, bad_slots, temperature, seeds, num_reqs=count)
        bad_bonus = bonus.clone()
        bad_bonus[2] = VOCAB + 100
        with pytest.raises(ValueError, match=r"^bonus_tokens: expected values in \[0, "):
            step.draft(last_pos, bad_bonus, slots, temperature, seeds, num_reqs=count)
    # requests past the device count are not read; without value checks nothing is read back
    bad_pos = last_pos.clone()
    bad_pos[2] = -7
    step.draft(bad_pos, bonus, slots, temperature, seeds, num_reqs=torch.tensor([2]))
    step.draft(bad_pos, bonus, slots, temperature, seeds, num_reqs=torch.tensor([-4]))
    assert step.sample_idx_mapping.tolist() == [-1] * (MAX_REQS * N)
