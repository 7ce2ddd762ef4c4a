"""top_k_top_p: the Triton threshold search equals the sort reference exactly (CPU interpreter).

Both Triton layouts run: one program per row, and the split-row path (forced with a small block
and several programs per row), each with the CPU default capacity of 128 candidates (most rows
resolve after the first sweep or the refine round) and with the capacity forced down to 16 (most
rows then run the bounded finish loop). Every comparison is bit for bit on the whole output row.
"""

import math

import pytest
import torch

import dspark_markov as dm
from dspark_markov.verify import filtering
from dspark_markov.verify import triton_filtering as ft

NEG_INF = float("-inf")
# (block, chunks[, capacity]): one program per row; split rows (3 programs of up to 4 blocks of 128).
LAYOUTS = [pytest.param((1024, 1), id="row"), pytest.param((128, 3), id="split")]
TINY = 16  # a capacity that sends most rows into the search rounds and the finish loop
ALL_PATHS = LAYOUTS + [pytest.param((1024, 1, TINY), id="row-search"),
                       pytest.param((128, 3, TINY), id="split-search")]


def run_triton(logits, k, p, layout, out=None):
    block, chunks, *sort_size = layout
    target = logits if out is None else out
    ft.launch_top_k_top_p(logits, k, p, target, block=block, chunks=chunks, sort_size=sort_size[0] if sort_size else None)
    return target


def reference(logits, k, p):
    return dm.top_k_top_p(logits.clone(), k, p, impl="reference")


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def hard_rows(vocab=777, seed=0):
    """Ten rows, each an edge case, with its per-row k and p."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(10, vocab, generator=gen) * 3
    k = torch.zeros(10, dtype=torch.int64)
    p = torch.ones(10, dtype=torch.float32)
    k[0], p[0] = 5, 0.9  # plain
    x[1] = torch.randint(0, 5, (vocab,), generator=gen).float()  # many ties at every boundary
    k[1], p[1] = 10, 0.5
    x[2, 123] = 1e9  # a forced huge logit, p below any resolution
    p[2] = 1e-9
    x[3, ::2] = NEG_INF  # -inf entries; k beyond the finite count
    k[3], p[3] = vocab // 2 + 50, 0.9
    x[4] = NEG_INF  # all -inf
    k[4], p[4] = 3, 0.5
    x[5, 17] = float("nan")  # NaN row: unchanged
    k[5], p[5] = 3, 0.5
    p[6] = 0.0  # p = 0: the first maximum only
    x[7, [40, 3, 500]] = 50.0  # three tied maxima, p = 1e-7
    p[7] = 1e-7
    k[8], p[8] = vocab, 1.0  # both disabled
    x[9] = torch.where(torch.rand(vocab, generator=gen) < 0.5, 0.0, -0.0)  # signed zeros
    x[9, 600:] = torch.randn(vocab - 600, generator=gen) - 10
    k[9], p[9] = 77, 0.07
    return x, k, p


@pytest.mark.parametrize("layout", ALL_PATHS)
def test_hard_rows_equal_reference(layout):
    x, k, p = hard_rows()
    expected = reference(x, k, p)
    split = layout[1] > 1
    if not split or len(layout) == 2:  # the split layouts (slow in the interpreter) run one mode each
        assert_same(run_triton(x.clone(), k, p, layout), expected)  # in place
    if split and len(layout) == 2:
        return
    out = torch.full_like(x, 123.0)
    source = x.clone()
    assert_same(run_triton(source, k.to(torch.int32), p, layout, out=out), expected)  # out of place, int32 k
    assert_same(source, x)  # the input is left unchanged


def test_hard_rows_expected_survivors():
    """The reference's survivors on the edge rows, counted by hand."""
    x, k, p = hard_rows()
    kept = torch.isfinite(reference(x, k, p)) | torch.isnan(x).any(dim=1, keepdim=True)
    counts = kept.sum(dim=1)
    assert counts[0] <= 5 and counts[1] <= 10 and counts[9] <= 77
    assert counts[2] == 1 and kept[2, 123]
    assert counts[4] == 0  # all -inf stays all -inf
    assert counts[5] == x.shape[1]
    assert counts[6] == 1 and kept[6, int(torch.argmax(x[6]))]
    assert counts[7] == 1 and kept[7, 3]  # the first of the tied maxima
    assert counts[8] == x.shape[1]
    # Top-k ties resolved in index order: the kept 4s of row 1 are the lowest-index ones.
    fours = torch.nonzero(x[1] == 4).flatten()
    kept_fours = torch.nonzero(kept[1] & (x[1] == 4)).flatten()
    assert torch.equal(kept_fours, fours[: len(kept_fours)])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scalar_k_p_and_grid_of_p(layout):
    gen = torch.Generator().manual_seed(1)
    vocab = 4096 if layout[1] == 1 else 1531
    x = torch.randn(6, vocab, generator=gen) * 2
    p = torch.tensor([0.0, 1e-9, 1e-7, 0.5, 0.9, 1.0])
    assert_same(run_triton(x.clone(), None, p, layout), reference(x, None, p))
    x2 = x[:2].clone()
    assert_same(run_triton(x2.clone(), 40, 0.8, layout), reference(x2, 40, 0.8))
    assert_same(run_triton(x2.clone(), 33, None, layout), reference(x2, 33, None))


@pytest.mark.parametrize("layout", LAYOUTS + [pytest.param((1024, 1, TINY), id="row-search")])
def test_p_exactly_at_a_mass_boundary(layout):
    """p set to (a hair around) the exact mass before a token: the fixed-point masses must agree bit for bit."""
    gen = torch.Generator().manual_seed(2)
    vocab = 999
    row = torch.randn(vocab, generator=gen)
    values, _ = torch.sort(row, descending=True, stable=True)
    q = filtering.weight_fixed_point(values, values[:1])
    before = (torch.cumsum(q, 0) - q).double() / q.sum().double()
    ps = []
    for j in (3, 10, 50):
        at = torch.tensor(before[j].item(), dtype=torch.float32)
        ps += [at, torch.nextafter(at, torch.tensor(0.0)), torch.nextafter(at, torch.tensor(1.0))]
    p = torch.stack(ps)
    x = row.expand(len(ps), vocab).contiguous()
    expected = reference(x, None, p)
    assert len(set(torch.isfinite(expected).sum(dim=1).tolist())) > 3  # the cut does move with p
    if layout[1] > 1:  # the split layout (slow in the interpreter): the three p around j = 10 only
        x, p, expected = x[3:6], p[3:6], expected[3:6]
    assert_same(run_triton(x, None, p, layout), expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_boundary_ties_in_a_late_chunk(layout):
    """Top-k and top-p cuts inside a long run of ties whose earlier members sit in earlier chunks."""
    gen = torch.Generator().manual_seed(4)
    vocab = 777
    row = torch.randint(0, 3, (vocab,), generator=gen).float()
    twos, ones = int((row == 2).sum()), int((row == 1).sum())
    k = torch.tensor([twos + ones - 5, 0])  # the k-th value is 1; its last kept tie is near the end
    q = filtering.weight_fixed_point(torch.tensor([2.0, 1.0]), torch.tensor(2.0)).double()
    mass = twos * q[0] + ones * q[1] + (vocab - twos - ones) * float(filtering.weight_fixed_point(
        torch.tensor(0.0), torch.tensor(2.0)))
    p = torch.tensor([1.0, (twos * q[0] + (ones - 7) * q[1]) / mass], dtype=torch.float32)
    x = row.expand(2, vocab).contiguous()
    expected = reference(x, k, p)
    last_one = int(torch.nonzero(row == 1).flatten()[-1])
    assert last_one > 512 and not torch.isfinite(expected[:, last_one]).any()
    assert torch.isfinite(expected[:, 512:last_one]).any(dim=1).all()  # both cuts fall in the last chunk
    assert_same(run_triton(x, k, p, layout), expected)


@pytest.mark.parametrize("layout", [ALL_PATHS[0], ALL_PATHS[2]])
def test_extreme_values_at_every_k(layout):
    """Radix digits across the sign, the exponent and -0.0/+0.0: infinities, fp32 extremes, subnormals."""
    gen = torch.Generator().manual_seed(5)
    specials = torch.tensor([float("inf"), NEG_INF, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 0.0, -0.0,
                             1.0, -1.0, 1.0000001, 0.99999994, 2.0, -2.0])
    vocab = 333
    row = specials[torch.randint(0, len(specials), (vocab,), generator=gen)]
    row[::7] = torch.randn(len(row[::7]), generator=gen) * 1e3
    ks = torch.tensor([1, 3, 16, 50, 160, 300, 332, 0, 17, 64])
    p = torch.tensor([1.0] * 7 + [0.3, 0.999, 0.5])
    x = row.expand(len(ks), vocab).contiguous()
    assert_same(run_triton(x.clone(), ks, p, layout), reference(x, ks, p))
    finite = torch.where(torch.isinf(x[:5]), 0.0, x[:5])  # finite rows: the masses are not all on one +inf
    ks, p = ks[-5:], p[-5:].flip(0)
    assert_same(run_triton(finite.clone(), ks, p, layout), reference(finite, ks, p))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_top_p_only_inside_and_beyond_the_candidates(layout):
    """Top-p without top-k: a peaked row (the cut inside the sorted candidates) and flat rows (beyond them)."""
    gen = torch.Generator().manual_seed(6)
    vocab = 1100
    x = torch.randn(4, vocab, generator=gen)
    x[0] *= 8  # peaked: p = 0.9 lies within the best 64
    x[1] *= 0.05  # nearly flat: the cut is far below the candidates
    x[2, :100] += 30.0  # 100 near-equal leaders hold almost all the mass
    p = torch.tensor([0.9, 0.9, 0.95, 0.3])
    expected = reference(x, None, p)
    kept = torch.isfinite(expected).sum(dim=1)
    assert kept[0] < 64 and kept[1] > 128 and 64 < kept[2] <= 100
    assert_same(run_triton(x.clone(), None, p, layout), expected)


def test_sort_size_is_checked():
    x = torch.randn(2, 300)
    for bad in (8, 100, 0, True):
        with pytest.raises(ValueError, match=r"^sort_size\b"):
            ft.launch_top_k_top_p(x, 3, None, x, sort_size=bad)


def test_reference_small_cases():
    x = torch.tensor([[0.0, 1.0, 1.0, 2.0, 1.0]])
    kept = torch.isfinite(dm.top_k_top_p(x.clone(), 2, impl="reference"))
    assert kept.tolist() == [[False, True, False, True, False]]
    probs = torch.tensor([[0.5, 0.3, 0.2]]).log()
    for p, expected in ((0.6, [True, True, False]), (0.85, [True, True, True]), (0.4, [True, False, False])):
        assert torch.isfinite(dm.top_k_top_p(probs.clone(), None, p, impl="reference")).tolist() == [expected]


def test_weight_fixed_point_is_exp():
    d = torch.linspace(-30, 0, 3001)
    q = filtering.weight_fixed_point(d, torch.zeros(()))
    exact = torch.exp(d.double()) * 2**32
    assert torch.all((q.double() - exact).abs() <= exact * 2e-7 + 1)  # truncation (1) + a couple of fp32 ulps
    assert filtering.weight_fixed_point(torch.tensor([NEG_INF, 0.0, 5.0]), torch.tensor(5.0)).tolist()[0] == 0
    both_inf = filtering.weight_fixed_point(torch.tensor([float("inf"), 1.0]), torch.tensor(float("inf")))
    assert both_inf.tolist() == [2**32, 0]


def test_public_function_triton_and_noop():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 300, generator=gen)
    out = torch.empty_like(x)
    assert dm.top_k_top_p(x, 7, 0.5, out=out) is out
    assert_same(out, reference(x, 7, 0.5))
    same = x.clone()
    assert dm.top_k_top_p(same) is same and torch.equal(same, x)


@pytest.mark.parametrize("call, name", [
    (lambda x: dm.top_k_top_p(x.double(), 3), "logits"),
    (lambda x: dm.top_k_top_p(x[:, ::2], 3), "logits"),
    (lambda x: dm.top_k_top_p(x[0], 3), "logits"),
    (lambda x: dm.top_k_top_p(x, torch.ones(3, dtype=torch.int64)), "k"),
    (lambda x: dm.top_k_top_p(x, torch.ones(2)), "k"),
    (lambda x: dm.top_k_top_p(x, 2.5), "k"),
    (lambda x: dm.top_k_top_p(x, None, -0.1), "p"),
    (lambda x: dm.top_k_top_p(x, None, math.nan), "p"),
    (lambda x: dm.top_k_top_p(x, None, torch.ones(2, dtype=torch.float64)), "p"),
    (lambda x: dm.top_k_top_p(x, 3, out=torch.empty(2, 5)), "out"),
    (lambda x: dm.top_k_top_p(x, 3, impl="sorted"), "impl"),
    (lambda x: dm.top_k_top_p(x[:1].expand(2, 300), 3), "logits"),  # in place, one row written twice
    (lambda x: dm.top_k_top_p(x, 3, out=torch.empty(1, 300).expand(2, 300)), "out"),
])
def test_bad_input_names_the_argument(call, name):
    x = torch.randn(2, 300)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call(x)


def test_expanded_rows_filter_out_of_place():
    """An expanded batch (stride 0: every row the same storage) is refused in place but filtered into separate rows."""
    x = torch.randn(1, 300).expand(3, 300)
    out = torch.empty(3, 300)
    dm.top_k_top_p(x, 5, 0.9, out=out)
    assert torch.equal(out, reference(x.contiguous(), torch.full((3,), 5), torch.full((3,), 0.9)))


def test_filter_object_allocates_nothing_per_call(monkeypatch):
    """Issue 14 item 7: the scratch lives in the TopKTopPFilter; a call creates no tensor."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 700, generator=gen) * 2
    filt = ft.TopKTopPFilter(4, 700, "cpu", block=256, chunks=2)
    k, p = torch.tensor([5, 0, 40]), torch.tensor([0.9, 0.8, 1.0])
    expected = reference(x, k, p)

    def refuse(*args, **kwargs):
        raise AssertionError("a filter call allocated a tensor")

    for name in ("empty", "zeros", "full", "ones", "tensor", "empty_like", "zeros_like", "full_like", "arange"):
        monkeypatch.setattr(torch, name, refuse)
    out = x.clone()
    filt.filter(out, k, p, out)
    again = x.clone()
    filt.filter(again, 7, None, again)  # scalar parameters, the same scratch
    monkeypatch.undo()
    assert_same(out, expected)
    assert_same(again, reference(x, 7, None))
    assert int(filt.state.unresolved) == 0


def test_filter_object_checks_its_shape():
    filt = ft.TopKTopPFilter(2, 300, "cpu")
    with pytest.raises(ValueError, match=r"^logits\b"):
        filt.filter(torch.randn(3, 300), 3, None, torch.empty(3, 300))
    with pytest.raises(ValueError, match=r"^logits\b"):
        filt.filter(torch.randn(2, 301), 3, None, torch.empty(2, 301))
    with pytest.raises(ValueError, match=r"^capacity\b"):
        ft.TopKTopPFilter(2, 300, "cpu", capacity=100)


@pytest.mark.parametrize("name, args, options", [
    ("max_rows", (2.5, 300), {}),  # each was a TypeError from torch.zeros
    ("max_rows", (True, 300), {}),
    ("max_rows", (None, 300), {}),
    ("max_rows", ("3", 300), {}),
    ("vocab", (2, 300.5), {}),
    ("vocab", (2, 0), {}),
    ("block", (2, 300), dict(block=100)),  # was accepted, then an error inside Triton at the first call
    ("block", (2, 300), dict(block=True)),
    ("chunks", (2, 300), dict(chunks=2.5)),  # was used as a float
    ("chunks", (2, 300), dict(chunks=-3)),  # was clamped silently
])
def test_filter_object_sizes_are_checked_by_name(name, args, options):
    """README "Inputs": a TopKTopPFilter's sizes are ints (``block`` a power of two), refused by name otherwise."""
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        ft.TopKTopPFilter(*args, "cpu", **options)


def test_filter_object_takes_integer_scalars_and_small_blocks():
    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(4)) * 3
    for options in (dict(block=16, chunks=3), dict(block=4), dict(block=torch.tensor(16), chunks=torch.tensor(2))):
        filt = ft.TopKTopPFilter(torch.tensor(2), 300, "cpu", **options)
        out = torch.empty_like(x)
        filt.filter(x, 5, 0.8, out)
        assert_same(out, reference(x, 5, 0.8))


def test_state_phases_after_a_call():
    """Resolved rows end in PHASE_CUT, rows without filtering in PHASE_COPY; none stays open."""
    x, k, p = hard_rows()
    filt = ft.TopKTopPFilter(10, x.shape[1], "cpu")
    filt.filter(x.clone(), k, p, torch.empty_like(x))
    phases = filt.state.phase.tolist()
    assert ft.PHASE_OPEN not in phases
    assert phases[5] == ft.PHASE_COPY and phases[8] == ft.PHASE_COPY and phases[4] == ft.PHASE_COPY  # NaN, off, -inf
    assert phases[0] == ft.PHASE_CUT and phases[6] == ft.PHASE_CUT


def test_persistent_filter_checks_its_arguments():
    """A serving engine owns a TopKTopPFilter and calls filter() itself: a wrong out (fewer rows, other dtype, a
    strided row), a wrong-length or wrong-dtype k / p or a negative p is refused by name before any launch, and
    nothing is written; out=None filters in place. (Before: filter() trusted its caller, and an out of fewer rows
    than logits was written past its end.)"""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, 300, generator=gen)
    filt = ft.TopKTopPFilter(4, 300, "cpu", block=256, chunks=2)
    backing = torch.full((4, 300), 7.0)
    bad = [
        ("out", dict(out=backing[:2])),  # 2 rows for 3: rows 2.. would land past it
        ("out", dict(out=torch.empty(3, 300, dtype=torch.float64))),
        ("out", dict(out=torch.empty(300, 3).t())),  # last stride 300
        ("k", dict(k=torch.tensor([5, 5]))),
        ("k", dict(k=torch.tensor([5.0, 5.0, 5.0]))),
        ("p", dict(p=torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64))),
        ("p", dict(p=-0.5)),
        ("logits", dict(logits=x.double())),
    ]
    for name, change in bad:
        call = dict(logits=x, k=5, p=0.9, out=torch.empty(3, 300)) | change
        with pytest.raises(ValueError, match=f"^{name}"):
            filt.filter(call["logits"], call["k"], call["p"], call["out"])
    assert torch.equal(backing, torch.full((4, 300), 7.0))
    again = x.clone()
    assert filt.filter(again, 5, 0.9, None) is again
    assert_same(again, reference(x, 5, 0.9))
