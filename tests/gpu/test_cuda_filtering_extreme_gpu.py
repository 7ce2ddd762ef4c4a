"""The CUDA cluster filter (and the Triton filter beside it) on rows of extreme keys at V = 129,280, bit for bit.

Written by the edge-case audit of filter.cu (2026-12-07, no GPU: not yet run). The Triton filter's int32 key-span
bug (commit be8891f: more than 256 candidates whose ordered int32 keys span more than 2^31, i.e. values from about +2
down to -2 or an infinity among them) was never reachable by the GPU tests, whose candidates lie within ~+-1 of each
other. filter.cu computes its buckets in fp32 (1/64 of a logit below the max) and its narrowing on unsigned 64-bit
words, so the audit found no such wrap there; these rows pin that down on the device: candidate sets that span the
whole key range (bucket 2,047, the open last bucket, holds every token more than 32 below the max; a +inf max puts
every finite token there), signed zeros and subnormals, a single finite token, ties at the cut, x - max overflowing,
k at 1 / V - 1 / V, p at 0 / 1e-45 / one ulp below 1, per-row p of NaN / -inf / negative, subnormal temperatures
(x / T overflowing to +-inf). Every output is compared BITWISE with the sort reference (signed zeros and NaN payloads
included), the input of an out-of-place call must come back unchanged (the Triton bug wrote -inf into it), and no
search may fail (``stats[1]``). The same rows run through the resident build (10 rows), the L2-row build with its
default flags (top-p alone from ``L2_MIN_ROWS`` rows: 40 rows), the other measured flag sets, and impl="triton".
The CPU twin of these rows (the kernel's decisions emulated) is tests/verify/test_cuda_filtering.py
``test_emulated_search_on_extreme_key_rows``.
"""

import numpy as np
import pytest
import torch

import dspark_markov as dm
from tests.gpu.test_cuda_filtering_gpu import opted_in  # noqa: F401  (autouse: skips where the CUDA filter cannot run)
from tests.gpu.test_filtering_gpu import VOCAB

pytestmark = pytest.mark.gpu

NEG_INF = float("-inf")
BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # 1 - 2^-24


def extreme_rows(vocab=VOCAB, seed=0):
    """Ten rows of extreme keys (CPU generator: the same rows as the CPU emulation test), on the GPU."""
    from tests.verify.test_cuda_filtering import extreme_rows as rows

    return rows(vocab, seed).cuda()


def assert_bits(got, expected):
    """Equal bit for bit: -0.0 is not +0.0 here, and a NaN row's values (payloads) are the input's."""
    assert got.shape == expected.shape
    same = got.view(torch.int32) == expected.view(torch.int32)
    if not bool(same.all()):
        rows, cols = torch.nonzero(~same, as_tuple=True)
        raise AssertionError(f"{int((~same).sum())} values differ, first at row {int(rows[0])} column {int(cols[0])}: "
                             f"{float(got[rows[0], cols[0]])} against {float(expected[rows[0], cols[0]])}")


def reference(x, k, p):
    return dm.top_k_top_p(x.clone(), k, p, impl="reference")


def cases(rows):
    """(k, p) pairs: scalars and per-row tensors (int64 and int32 k, fp32 p with NaN / -inf / negative values)."""
    dev = "cuda"
    scalar = [(None, 0.9), (None, BELOW_ONE), (None, 1e-45), (None, 0.0), (1, None), (VOCAB - 1, None), (VOCAB, 0.5),
              (VOCAB // 2, 0.999), (2500, BELOW_ONE), (50, 0.9), (VOCAB - 1, BELOW_ONE), (3000, 0.5), (1, 0.0)]
    out = list(scalar)
    k_cycle = [0, 1, 50, 2500, 3000, VOCAB - 1, VOCAB, -5, 100_000, 7]
    p_cycle = [0.9, BELOW_ONE, 1e-45, 0.0, float("nan"), float("-inf"), -1.0, 1.0, 0.5, 2.0]
    k64 = torch.tensor([k_cycle[r % len(k_cycle)] for r in range(rows)], device=dev)
    p32 = torch.tensor([p_cycle[(r // 3) % len(p_cycle)] for r in range(rows)], device=dev, dtype=torch.float32)
    out += [(k64, p32), (k64.to(torch.int32), None), (None, p32), (k64, None)]
    return out


def check_call(filt, x, k, p):
    """One call out of place (the input must come back unchanged) and one in place, both bitwise the reference."""
    expected = reference(x, k, p)
    source = x.clone()
    out = torch.full_like(x, 123.0)
    filt.filter(source, k, p, out)
    assert_bits(source, x)  # nothing written into the input
    assert_bits(out, expected)
    inplace = x.clone()
    filt.filter(inplace, k, p, inplace)
    assert_bits(inplace, expected)
    assert int(filt.stats[1]) == 0, int(filt.stats[1])  # no search missed its target


@pytest.mark.parametrize("flags", [None, 31, 63, 575, 1599, 16959, 115263, 246335, 508479])
@pytest.mark.parametrize("tiles", [1, 4])  # 10 rows (the resident build); 40 rows (top-p alone: the L2-row build)
def test_extreme_key_rows_equal_the_reference_bitwise(opted_in, flags, tiles):
    x = extreme_rows().repeat(tiles, 1)
    rows = x.shape[0]
    filt = opted_in.CudaTopKTopPFilter(rows, VOCAB, "cuda", flags=flags)
    if tiles > 1 and filt.l2_kernels is not None:
        assert filt.launch_plan(x, None)[0]  # (top-p alone on these rows takes the L2-row build)
    for k, p in cases(rows):
        check_call(filt, x, k, p)


@pytest.mark.parametrize("tiles", [1, 4])
def test_extreme_key_rows_public_function_every_impl(tiles):
    """top_k_top_p(impl=cuda / triton / auto) on the same rows, out of place (input unchanged) and in place."""
    x = extreme_rows(seed=1).repeat(tiles, 1)
    for k, p in cases(x.shape[0]):
        expected = reference(x, k, p)
        for impl in ("cuda", "triton", "auto"):
            source = x.clone()
            out = torch.full_like(x, 123.0)
            dm.top_k_top_p(source, k, p, impl=impl, out=out)
            assert_bits(source, x)
            assert_bits(out, expected)
            assert_bits(dm.top_k_top_p(x.clone(), k, p, impl=impl), expected)


def test_subnormal_and_huge_temperatures_overflow_to_infinities(opted_in):
    """Raw logits divided by per-row temperatures of 1e-40 (subnormal: x / T overflows to +-inf, a +inf row max with
    every finite token in the open bucket), 3e-39, 1e30 (every value near 0) and -1 (the ranking reversed)."""
    from dspark_markov.draft.reference import scaled_logits

    x = extreme_rows(seed=2)
    temps = torch.tensor([1e-40, 3e-39, 1e30, -1.0, 0.7, 1e-40, 0.0, 1.0, 1e-45, 2.0], device="cuda")
    filt = opted_in.CudaTopKTopPFilter(x.shape[0], VOCAB, "cuda")
    divided = scaled_logits(x, temps)
    for k, p in ((None, 0.9), (50, 0.9), (3000, None), (None, BELOW_ONE), (VOCAB - 1, 1e-45)):
        expected = reference(divided, k, p)
        out = torch.full_like(x, 123.0)
        source = x.clone()
        filt.filter(source, k, p, out, temperature=temps)
        assert_bits(source, x)
        assert_bits(out, expected)
        assert int(filt.stats[1]) == 0
