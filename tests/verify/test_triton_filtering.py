"""The Triton filter (``verify/triton_filtering.py``, issue 16) equals the sort reference
exactly on the CPU interpreter: the edge rows of ``test_filtering`` (and a split layout) and with the
capacity forced down to 16 (the bounded search rounds), scalar k/p, and the paths the GPU takes at
V = 129,280 (early top-k gather + write-only apply, narrowed top-p brackets) at V = 8192."""

import math

import pytest
import torch
import triton
import triton.language as tl

from dspark_markov.verify import triton_filtering as nx
from dspark_markov.verify.filtering_reference import weight_fixed_point
from tests.verify.test_filtering import assert_same, hard_rows, reference

# (block, chunks, capacity); the split layout runs in the allocation test (the interpreter is slow)
LAYOUTS = [pytest.param((1024, 1, None), id="row"), pytest.param((1024, 1, 16), id="row-search")]


def run_next(logits, k, p, layout, out=None):
    block, chunks, capacity = layout
    target = logits if out is None else out
    nx.launch_top_k_top_p(logits, k, p, target, block=block, chunks=chunks, sort_size=capacity)
    return target


@pytest.mark.parametrize("layout", LAYOUTS)
def test_hard_rows_equal_reference(layout):
    x, k, p = hard_rows()
    expected = reference(x, k, p)
    assert_same(run_next(x.clone(), k, p, layout), expected)  # in place
    if layout[1] == 1:
        out = torch.full_like(x, 123.0)
        source = x.clone()
        assert_same(run_next(source, k.to(torch.int32), p, layout, out=out), expected)  # out of place, int32 k
        assert_same(source, x)


# TopKTopPFilter options other than the CPU defaults (issue 16: the previous kernels, the late gather and
# the two-pass narrowing stay selectable for comparisons on the GPU, tools/time_filter.py --compare; the
# approximate top-p masses (opt-in, not run on a GPU yet), also with a band so wide that every row takes
# the exact redo sweep); four of the hard rows (plain, ties, tied maxima, signed zeros) keep the
# interpreter's time small
OPTIONS = [pytest.param({"lean": False, "stats_fast": False, "full_apply": False}, "k+p", id="previous"),
           pytest.param({"late_gather": True, "narrow_tile": 64}, "p", id="late-two-pass"),
           pytest.param({"approx": True}, "p", id="approx"),
           pytest.param({"approx": True, "approx_slack": 1e12}, "p", id="approx-redo"),
           pytest.param({"sweep_raw": True}, "p", id="sweep-raw"),
           pytest.param({"sweep_raw": True, "capacity": 16}, "p", id="sweep-raw-overflow")]  # lower end -> bottom


@pytest.mark.parametrize("options, case", OPTIONS)
def test_other_options_equal_reference(options, case):
    x, k, p = hard_rows()
    rows = [0, 1, 7, 9]
    x, k, p = x[rows].contiguous(), (k[rows] if case == "k+p" else None), p[rows]
    options = dict(options)
    filt = nx.TopKTopPFilter(4, x.shape[1], "cpu", capacity=options.pop("capacity", 256))
    for name, value in options.items():
        setattr(filt, name, value)
    inplace = x.clone()
    assert_same(filt.filter(inplace, k, p, inplace), reference(x, k, p))
    assert int(filt.state.unresolved) == 0
    if options.get("approx_slack", 1.0) > 1.0:  # every open row (all but the p = 1e-7 one) swept again
        assert int(filt.state.redone) == 3


def test_scalar_k_p_and_grid_of_p():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4096, generator=gen) * 2
    p = torch.tensor([0.0, 1e-9, 1e-7, 0.5, 0.9, 1.0])
    layout = (1024, 1, None)
    assert_same(run_next(x.clone(), None, p, layout), reference(x, None, p))
    x2 = x[:2].clone()
    assert_same(run_next(x2.clone(), 40, 0.8, layout), reference(x2, 40, 0.8))
    assert_same(run_next(x2.clone(), 7, None, layout), reference(x2, 7, None))  # early gather, scalar k


def test_first_pass_paths_at_a_larger_capacity():
    """The paths the GPU takes at V = 129,280 (capacity 2048), at V = 8192 with capacity 1024: top-k
    answered from the early gather and written without being read (signed zeros among the kept
    values keep their bits, in place and out of place), and top-p brackets wide enough to be
    narrowed 16-fold before the sort (Gaussian, bf16-tied, peaked); none of these rows needs search rounds."""
    gen = torch.Generator().manual_seed(11)
    vocab = 8192
    base = torch.randn(4, vocab, generator=gen) * 2
    x = torch.cat([base[:2], base[2:].to(torch.bfloat16).float()])
    x[3, [10, 700, 5000]] += torch.tensor([14.0, 12.0, 11.0])  # a peaked head
    zeros = torch.randn(vocab, generator=gen) - 6.0
    zeros[torch.randperm(vocab, generator=gen)[:10]] = torch.tensor([0.0, -0.0] * 5)  # the best 10: tied zeros
    filt = nx.TopKTopPFilter(5, vocab, "cpu", capacity=1024)
    p = torch.tensor([0.9, 0.5, 0.9, 0.9])
    assert_same(filt.filter(x.clone(), None, p, torch.empty_like(x)), reference(x, None, p))
    assert int(filt.state.searched) == 0
    # the same brackets with approximate masses (opt-in, not run on a GPU yet), resolved from them
    approx = nx.TopKTopPFilter(4, vocab, "cpu", capacity=1024)
    approx.approx = True
    inplace = x.clone()
    assert_same(approx.filter(inplace, None, p, inplace), reference(x, None, p))
    assert int(approx.state.redone) == 0 and int(approx.state.searched) == 0
    assert not approx.state.approx_mass.any()  # zeroed for the next call
    # and with the raw exact sweep (the first narrowing from the part masses the finish computed)
    raw = nx.TopKTopPFilter(4, vocab, "cpu", capacity=1024)
    raw.sweep_raw = True
    inplace = x.clone()
    assert_same(raw.filter(inplace, None, p, inplace), reference(x, None, p))
    assert int(raw.state.searched) == 0 and bool(raw.state.part_sums.any())
    y = torch.cat([x, zeros[None]])
    k, p = torch.tensor([50, 5, 50, 20, 5]), torch.tensor([0.9, 1.0, 0.95, 0.9, 1.0])
    expected = reference(y, k, p)
    assert_same(filt.filter(y.clone(), k, p, torch.full_like(y, 7.0)), expected)  # out of place
    inplace = y.clone()
    filt.filter(inplace, k, p, inplace)
    assert_same(inplace, expected)
    assert torch.equal(inplace[4].view(torch.int32), expected[4].view(torch.int32))  # -0.0 stays -0.0
    assert int(filt.state.searched) == 0 and int(filt.state.unresolved) == 0


def test_candidate_key_spans_beyond_int32():
    """More than 256 candidates (capacity >= 512, as on the GPU) whose ordered keys span more than 2^31: values from
    about +2 to -2 and beyond, or a +inf / -inf among them. Their span was an int32 difference (wrapped negative): the
    narrowing dropped the wrong candidates, rows came back empty, and out of place the dropped ones were written as
    -inf into the input."""
    gen = torch.Generator().manual_seed(0)
    neg = float("-inf")
    x = torch.randn(1, 1200, generator=gen) * 3 - 3
    filt = nx.TopKTopPFilter(1, 1200, "cpu", capacity=2048)
    k = torch.tensor([400])
    assert_same(filt.filter(x.clone(), k, None, torch.empty_like(x)), reference(x, k, None))  # top-k, early gather
    y = torch.full((1, 300), neg)
    y[0, 299], y[0, 0] = float("inf"), 5.0
    small = nx.TopKTopPFilter(1, 300, "cpu", capacity=512)
    k = torch.tensor([2])
    assert_same(small.filter(y.clone(), k, None, torch.empty_like(y)), reference(y, k, None))
    z = torch.randn(4, 2048, generator=gen) * 3 - 3
    z[1] = torch.randn(2048, generator=gen) * 4
    z[2] = torch.randn(2048, generator=gen) * 2 - 4
    z[2, 5] = 12.0
    z[3] = torch.randn(2048, generator=gen) * 2
    z[3, 700:] = neg
    p = torch.tensor([0.9, 0.99, 0.9, 0.999])
    expected = reference(z, None, p)
    wide = nx.TopKTopPFilter(4, 2048, "cpu", capacity=2048)
    source = z.clone()
    assert_same(wide.filter(source, None, p, torch.full_like(z, 7.0)), expected)  # top-p, out of place
    assert_same(source, z)  # the input untouched
    wide.narrow_tile = 64  # the wide narrowing (_narrow_mass_wide)
    assert_same(wide.filter(z.clone(), None, p, torch.empty_like(z)), expected)


def test_top_k_early_gather_beyond_one_sort_is_narrowed():
    """An early top-k gather of more than SORT_SMALL candidates (~4 k tokens; the GPU capacity,
    2048) is narrowed to the parts that hold the top k, sorted once, and written without being read
    (by the apply's own split of each row into parts)."""
    gen = torch.Generator().manual_seed(12)
    vocab = 8192
    x = torch.randn(6, vocab, generator=gen) * 2
    x[3:] = x[3:].to(torch.bfloat16).float()  # ties
    filt = nx.TopKTopPFilter(6, vocab, "cpu", block=256, capacity=2048)
    assert filt.chunks == 1 and filt.apply_chunks == 4  # the apply's own split (each part re-reads the list)
    k = torch.tensor([100, 100, 120, 100, 90, 110])
    p = torch.tensor([0.9, 1.0, 0.5, 0.95, 1.0, 0.9])
    expected = reference(x, k, p)
    inplace = x.clone()
    filt.filter(inplace, k, p, inplace)
    assert_same(inplace, expected)
    kept_n = filt.state.cursor[:6]  # > 0: the kept set was among the first kept_n (<= SORT_SMALL) candidates
    assert bool(((kept_n > 0) & (kept_n <= nx.SORT_SMALL)).all()), kept_n.tolist()
    assert int(filt.state.searched) == 0 and int(filt.state.unresolved) == 0
    assert_same(filt.filter(x, k, p, torch.full_like(x, 7.0)), expected)  # out of place


def test_rows_resolved_by_the_plan_ignore_their_early_gather():
    """A row the plan resolves (p = 0 or k = 1: the first maximum only) whose early top-k gather
    holds more than SORT_SMALL candidates: the apply must not take the write-only path over the
    gathered list (the H200 graph test of 2026-12-02 u1 lost a row's maximum gathered late)."""
    gen = torch.Generator().manual_seed(13)
    vocab = 8192
    x = torch.randn(4, vocab, generator=gen) * 2
    x[:, -1] = 50.0  # the maximum is the last token gathered
    filt = nx.TopKTopPFilter(4, vocab, "cpu", capacity=2048)
    k = torch.tensor([100, 1, 120, 100])
    p = torch.tensor([0.0, 0.9, 0.0, 1e-9])
    expected = reference(x, k, p)
    inplace = x.clone()
    assert_same(filt.filter(inplace, k, p, inplace), expected)
    assert_same(filt.filter(x, k, p, torch.full_like(x, 7.0)), expected)  # out of place


def test_filter_object_allocates_nothing_per_call(monkeypatch):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 700, generator=gen) * 2
    filt = nx.TopKTopPFilter(4, 700, "cpu", block=256, chunks=2)
    k, p = torch.tensor([5, 0, 40]), torch.tensor([0.9, 0.8, 1.0])
    expected = reference(x, k, p)

    def refuse(*args, **kwargs):
        raise AssertionError("a filter call allocated a tensor")

    for name in ("empty", "zeros", "full", "ones", "tensor", "empty_like", "zeros_like", "full_like", "arange"):
        monkeypatch.setattr(torch, name, refuse)
    out = x.clone()
    filt.filter(out, k, p, out)
    again = x.clone()
    filt.filter(again, 7, None, again)  # scalar parameters, the same scratch (the early gather reset)
    monkeypatch.undo()
    assert_same(out, expected)
    assert_same(again, reference(x, 7, None))
    assert int(filt.state.unresolved) == 0


@triton.jit
def _approx_weights_kernel(x_ptr, out_ptr, row_max, N: tl.constexpr):
    index = tl.arange(0, N)
    tl.store(out_ptr + index, nx._weight_approx(tl.load(x_ptr + index), row_max))


def test_approximate_weight_bounds_the_exact_fixed_point_mass():
    """The approximate masses' bound (``APPROX_WEIGHT_REL``; the interpreter's ``tl.fma`` rounds once,
    as the GPU's does): every exact ``q = trunc(w 2^32)`` lies in ``(w' (1 - e) 2^32 - 1, w' (1 + e) 2^32]``,
    over every exponent of ``x - max`` down to ``q = 0`` and at the reduction's rounding ties."""
    gen = torch.Generator().manual_seed(21)
    n = 8192
    x = torch.cat([-torch.rand(n // 2, generator=gen) * 46.0,
                   -torch.exp2(-torch.rand(n // 4, generator=gen) * 30.0),  # tiny differences
                   (torch.arange(n // 4) - n // 8).float() * 0.5 * math.log(2.0)])  # d log2(e) near k + 1/2
    x = x.clamp(max=0.0).contiguous()
    row_max = torch.tensor(0.0)
    approx = torch.empty_like(x)
    _approx_weights_kernel[(1,)](x, approx, 0.0, N=n)
    q = weight_fixed_point(x, row_max).double()
    w = approx.double() * 2.0**32
    e = nx.APPROX_WEIGHT_REL
    assert bool((q <= w * (1 + e)).all()) and bool((q > w * (1 - e) - 1).all())


def test_options_not_run_on_a_gpu_are_off_by_default():
    """filter5's top-p options (approximate masses, the raw exact sweep) have not run on a GPU: a filter
    built with the defaults takes neither (its kernels are then filter4's H200-verified ones)."""
    filt = nx.TopKTopPFilter(4, 300, "cpu")
    assert filt.approx is False and filt.sweep_raw is False and filt.approx_slack == 1.0
