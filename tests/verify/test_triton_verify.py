"""verify_drafts(impl="triton") against the reference, on the CPU interpreter at small V.

The Triton path forms ``p`` and ``q`` with its own ``exp`` and summation order, so it equals the
reference exactly except at last-bit ties (see :mod:`dspark_markov.verify.triton_verify_stream`); on these
random inputs no decision is within a few ulps of its threshold, so the outputs must be identical.
The cases mix accepted, rejected (residual) and bonus outcomes, greedy targets and drafts, padding
requests, variable draft counts and several stream-item layouts.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.verify.triton_verify_stream import StreamVerifier as Verifier
from tests.helpers import VERIFY_VOCAB as VOCAB
from tests.helpers import verify_case as _case


def _greedy(args):
    temperature, idx = args[6], args[4]
    return temperature[idx.clamp_min(0)] == 0


def _assert_same(args, target_greedy, method, verifier=None):
    ref = dm.verify_drafts(*args, target_greedy=target_greedy, method=method, impl="reference")
    ref_tokens, ref_count = ref.tokens, ref.num_emitted
    if verifier is None:
        out = dm.verify_drafts(*args, target_greedy=target_greedy, method=method, impl="triton")
        tokens, count = out.tokens, out.num_emitted
    else:
        tokens, count = verifier.run(*args, target_greedy, method=method)
    assert torch.equal(tokens, ref_tokens), (tokens, ref_tokens)
    assert torch.equal(count, ref_count), (count, ref_count)
    return ref_tokens, ref_count


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("method", ["standard", "block"])
def test_equals_reference(method, cache_dtype):
    counts = []
    for seed in range(3):
        args = _case(seed, cache_dtype=cache_dtype)
        _, count = _assert_same(args, None, method)  # target greedy iff T == 0
        counts.append(count[args[4] >= 0])
    counts = torch.cat(counts)
    # The cases exercise acceptances as well as rejections (residual draws) and bonus draws.
    assert int((counts >= 2).sum()) >= 3 and int((counts == 1).sum()) >= 3


def test_equals_reference_explicit_greedy_flags_and_chunks():
    """Greedy targets with probabilistic drafts and vice versa; stream items of one tile."""
    verifier = Verifier(8, 3, VOCAB, "cpu", t1=1)
    for seed in (5, 6):
        args = _case(seed, batch=8)
        target_greedy = torch.zeros(8, dtype=torch.bool)
        target_greedy[2] = True  # greedy target, probabilistic drafts
        target_greedy[5] = True
        for method in ("standard", "block"):
            _assert_same(args, target_greedy, method, verifier)


def test_larger_k_block_method_and_high_acceptance():
    """K = 5 with a target close to the drafts: long accepted prefixes and block masses at every row."""
    args = _case(11, batch=5, k=5, vocab=300, closeness=0.25, greedy_slot=False)
    args[3] = torch.tensor([5, 5, 4, 5, 3])
    for method in ("standard", "block"):
        _, count = _assert_same(args, None, method)
        assert int(count.max()) >= 4


def test_no_drafts_and_padding_only():
    args = _case(3, batch=4, k=0, vocab=300)
    _assert_same(args, None, "standard")
    _assert_same(args, None, "block")
    padding = _case(4, batch=3, vocab=300)
    padding[4] = torch.full((3,), -1)
    tokens, count = _assert_same(padding, None, "standard")
    assert bool((tokens == -1).all()) and bool((count == 0).all())


def test_verifier_is_reusable_with_smaller_batches():
    verifier = Verifier(7, 3, VOCAB, "cpu", t1=3)
    first = _case(7)
    _assert_same(first, None, "standard", verifier)
    second = [x[:5] if i in (0, 1, 3, 4, 5) else x for i, x in enumerate(_case(8))]
    tokens, count = verifier.run(*second, None, method="standard")
    assert tokens.data_ptr() == verifier.tokens.data_ptr() and tokens.shape == (5, 4)
    _assert_same(second, None, "standard", verifier)


def test_masked_and_nan_logits_stay_in_range():
    args = _case(9, vocab=300)
    target = args[0]
    target[:, :, 150:] = float("-inf")  # masked target tokens are never emitted
    out = dm.verify_drafts(*args, impl="triton", method="standard")
    ref = dm.verify_drafts(*args, impl="reference", method="standard")
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_emitted, ref.num_emitted)
    emitted = out.tokens[out.tokens >= 0]
    assert bool((emitted < 300).all())
    last = out.tokens.gather(1, (out.num_emitted - 1).clamp_min(0)[:, None])[:, 0]
    live = args[4] >= 0
    assert bool((last[live] < 150).all())
    target[0, :, 7] = float("nan")
    target[2] = float("nan")
    out = dm.verify_drafts(*args, impl="triton", method="block")
    assert bool(((out.tokens >= -1) & (out.tokens < 300)).all())


def test_validation_and_impl_name():
    args = _case(1, vocab=300)
    with pytest.raises(ValueError, match="impl"):
        dm.verify_drafts(*args, impl="cuda")
    with pytest.raises(ValueError, match="target_logits"):
        Verifier(7, 2, 300, "cpu").run(*args, None)
    with pytest.raises(ValueError, match="max_batch"):
        Verifier(0, 2, 300, "cpu")


def test_greedy_ties_across_blocks_follow_torch_argmax():
    """Greedy targets: the first maximum wins across vocabulary blocks, and a NaN wins over it."""
    args = _case(12, batch=3, k=2, vocab=600, greedy_slot=False)
    target = torch.zeros(3, 3, 600)
    target[:, :, 420] = 5.0
    target[:, :, 300] = 5.0  # equal maximum in an earlier block: token 300 is the argmax
    target[2, 1, 550] = float("nan")  # request 2, row 1: the NaN is the argmax
    args[0] = target
    args[1] = torch.tensor([[300, 300], [300, 7], [300, 300]])
    args[3] = torch.tensor([2, 2, 2])
    args[4] = torch.tensor([0, 1, 2])
    flags = torch.ones(3, dtype=torch.bool)
    tokens, count = _assert_same(args, flags, "standard")
    assert tokens.tolist() == [[300, 300, 300], [300, 300, -1], [300, 550, -1]]
    assert count.tolist() == [3, 2, 2]
