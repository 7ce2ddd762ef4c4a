"""top_k_top_p on the GPU at DeepSeek-V4.1 shapes (V = 129,280): Triton == sort reference, bit for bit.

Every benchmark input kind (Gaussian, peaked LLM-like, bf16-rounded with runs of ties) plus a
batch of edge rows (ties, a huge logit, -inf halves, all -inf, NaN), every case (top-k and top-p
together, top-p alone, top-k alone, per-row cycles of k and p that include k beyond the capacity
and p at 0 / 1e-9 / 0.99), at 6 and 1518 rows (1 and 253 requests of K + 1 = 6 rows), in both
layouts (one program per row; split rows) and with the capacity forced down to 16 (every row then
takes the bounded search rounds); the bench's cases in the default layout (per-row ``p`` alone);
CUDA-graph replay with fresh values and a check that a call allocates nothing.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.bench.verify_grid import filter_logits
from dspark_markov.verify import triton_filtering as ft

pytestmark = pytest.mark.gpu

VOCAB = 129_280
NEG_INF = float("-inf")
K_CYCLE = [0, 1, 5, 50, 1000, VOCAB, -1, 20, 4000, 5000]  # 5000 > the capacity (2048; 4096 above 128 rows)
P_CYCLE = [0.0, 1e-9, 1e-7, 0.5, 0.9, 0.99, 1.0, 0.95]
KINDS = ["gaussian", "peaked", "bf16", "edge"]
CASES = ["k+p", "p", "k", "mixed"]


def logits(kind, rows, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=gen, device="cuda") * 2
    if kind != "edge":
        return filter_logits(kind, x, gen).contiguous()
    edits = [
        lambda r: x[r].copy_(torch.randint(0, 6, (VOCAB,), generator=gen, device="cuda").float()),  # ties
        lambda r: x[r, 77_777].fill_(1e9),  # forced huge logit
        lambda r: x[r, ::2].fill_(NEG_INF),  # -inf entries
        lambda r: x[r].fill_(NEG_INF),  # all -inf
        lambda r: x[r, 100_000].fill_(float("nan")),  # NaN row: unchanged
    ]
    for r, edit in zip(range(1, rows, 3), edits):
        edit(r)
    return x


def parameters(case, rows):
    if case == "k+p":
        return (torch.full((rows,), 50, device="cuda"), torch.full((rows,), 0.9, device="cuda"))
    if case == "p":
        return None, 0.9
    if case == "k":
        return 50, None
    k = torch.tensor([K_CYCLE[r % len(K_CYCLE)] for r in range(rows)], device="cuda")
    p = torch.tensor([P_CYCLE[(r // 2) % len(P_CYCLE)] for r in range(rows)], device="cuda", dtype=torch.float32)
    return k, p


def reference(x, k, p):
    return dm.top_k_top_p(x.clone(), k, p, impl="reference")


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def run(filt, x, k, p, in_place):
    out = x.clone() if in_place else torch.full_like(x, 123.0)
    filt.filter(out if in_place else x, k, p, out)
    assert int(filt.state.unresolved) == 0
    return out


@pytest.mark.parametrize("rows", [6, 1518])
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_and_case_equals_reference(kind, rows):
    x = logits(kind, rows)
    layouts = [None, 1, 16] if rows <= 96 else [None, 2]
    filters = {chunks: ft.TopKTopPFilter(rows, VOCAB, "cuda", chunks=chunks) for chunks in layouts}
    for case in CASES:
        k, p = parameters(case, rows)
        expected = reference(x, k, p)
        for index, (chunks, filt) in enumerate(filters.items()):
            got = run(filt, x, k, p, in_place=index % 2 == 0)
            assert_same(got, expected)
        assert_same(dm.top_k_top_p(x.clone(), k, p, impl="triton"), expected)  # the public function (cached filter)
        # auto (on sm_90 the cluster filter with top-k up to 30 rows, with p alone always)
        assert_same(dm.top_k_top_p(x.clone(), k, p), expected)


@pytest.mark.parametrize("rows", [6, 1518])
@pytest.mark.parametrize("kind", KINDS)
def test_bench_shapes_in_the_default_layout(kind, rows):
    """The bench's cases (per-row [B] k = 50 and p = 0.9; per-row p = 0.9 alone) and the mixed
    cycles in the default layout (split at 6 rows, one program per row at 1518), in and out of place."""
    x = logits(kind, rows)
    filt = ft.TopKTopPFilter(rows, VOCAB, "cuda")
    k = torch.full((rows,), 50, device="cuda")
    p = torch.full((rows,), 0.9, device="cuda")
    for index, (kk, pp) in enumerate(((k, p), (None, p), parameters("mixed", rows))):
        assert_same(run(filt, x, kk, pp, in_place=index != 0), reference(x, kk, pp))


@pytest.mark.parametrize("chunks", [1, 16])
@pytest.mark.parametrize("kind", ["edge", "bf16", "peaked"])
def test_search_rounds_with_a_tiny_capacity(kind, chunks):
    """Capacity 16: the first bracket rarely fits, so the bounded search rounds run."""
    rows = 96
    x = logits(kind, rows, seed=1)
    filt = ft.TopKTopPFilter(rows, VOCAB, "cuda", chunks=chunks, capacity=16)
    for case in ("mixed", "p"):
        k, p = parameters(case, rows)
        assert_same(run(filt, x, k, p, in_place=True), reference(x, k, p))


def test_reference_is_the_same_on_cpu():
    x = logits("edge", 16, seed=2)
    k, p = parameters("mixed", 16)
    assert_same(reference(x, k, p).cpu(), reference(x.cpu(), k.cpu(), p.cpu()))


def check_graph_replay_and_no_allocation(filt, rows):
    """A filter object (``filter(logits, k, p, out)``) allocates nothing per call, and a CUDA graph of one in-place
    call replays exactly on fresh edge / peaked / bf16 rows with fresh per-row k and p."""
    x = logits("edge", rows, seed=3)
    k, p = parameters("mixed", rows)
    static = x.clone()
    filt.filter(static, k, p, static)  # compile outside the capture
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    filt.filter(static, k, p, static)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before  # no scratch per call
    graph = torch.cuda.CUDAGraph()
    static.copy_(x)
    with torch.cuda.graph(graph):
        filt.filter(static, k, p, static)
    for seed, kind in ((4, "edge"), (5, "peaked"), (6, "bf16")):
        fresh = logits(kind, rows, seed=seed)
        fresh_k, fresh_p = parameters("mixed", rows)
        static.copy_(fresh)
        k.copy_(fresh_k.roll(seed))
        p.copy_(fresh_p.roll(seed))
        graph.replay()
        assert_same(static, reference(fresh, k, p))


@pytest.mark.parametrize("rows", [6, 1518])
def test_cuda_graph_replay_and_no_allocation(rows):
    filt = ft.TopKTopPFilter(rows, VOCAB, "cuda")
    check_graph_replay_and_no_allocation(filt, rows)
    assert int(filt.state.unresolved) == 0


@pytest.mark.parametrize("rows", [6, 1518])
@pytest.mark.parametrize("options", [{"sweep_raw": True}, {"approx": True}, {"approx": True, "approx_slack": 1e12}],
                         ids=["sweep_raw", "approx", "approx-redo"])
def test_top_p_options_equal_reference(options, rows):
    """The opt-in top-p-alone options (filter5, 2026-12-04, written without device time): every bench
    input kind and the edge rows, per-row p = 0.9 and the mixed p cycle without k, in place and out of
    place; approx also with a band so wide that every open row takes the exact redo sweep."""
    for kind in KINDS:
        x = logits(kind, rows, seed=7)
        filt = ft.TopKTopPFilter(rows, VOCAB, "cuda")
        for name, value in options.items():
            setattr(filt, name, value)
        for index, p in enumerate((torch.full((rows,), 0.9, device="cuda"), parameters("mixed", rows)[1])):
            assert_same(run(filt, x, None, p, in_place=index == 0), reference(x, None, p))
