"""top_k_top_p on the GPU at DeepSeek-V4.1 shapes (V = 129,280): Triton == sort reference, bit for bit.

Both layouts (one program per row; split rows) are checked at every batch size, plus the default
choice, with the default candidate-sort bound and with the bound forced down to 16 (most rows then
take the fallback search); CPU/GPU agreement of the reference (the software exp is bit-identical
across devices) and CUDA-graph replay.
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.verify import triton_filtering as ft

pytestmark = pytest.mark.gpu

VOCAB = 129_280
ROWS = [1, 16, 64, 253]
NEG_INF = float("-inf")
K_CYCLE = [0, 1, 5, 50, 1000, VOCAB, -1, 20, 4000, 5000]  # 5000 > SORT_LARGE: the fallback top-k
P_CYCLE = [0.0, 1e-9, 1e-7, 0.5, 0.9, 0.99, 1.0, 0.95]


def batch(rows, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=gen, device="cuda") * 3
    k = torch.tensor([K_CYCLE[r % len(K_CYCLE)] for r in range(rows)], device="cuda")
    p = torch.tensor([P_CYCLE[(r // 2) % len(P_CYCLE)] for r in range(rows)], device="cuda", dtype=torch.float32)
    edits = [
        lambda r: x[r].copy_(torch.randint(0, 6, (VOCAB,), generator=gen, device="cuda").float()),  # ties
        lambda r: x[r, 77_777].fill_(1e9),  # forced huge logit
        lambda r: x[r, ::2].fill_(NEG_INF),  # -inf entries
        lambda r: x[r].fill_(NEG_INF),  # all -inf
        lambda r: x[r, 100_000].fill_(float("nan")),  # NaN row: unchanged
    ]
    for r, edit in zip(range(1, rows, 3), edits):
        edit(r)
    return x, k, p


def reference(x, k, p):
    return dm.top_k_top_p(x.clone(), k, p, impl="reference")


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("chunks", [None, 1, 16])
@pytest.mark.parametrize("sort_size", [None, 16])
def test_triton_equals_reference(rows, chunks, sort_size):
    x, k, p = batch(rows)
    expected = reference(x, k, p)
    got = x.clone()
    ft.launch_top_k_top_p(got, k, p, got, chunks=chunks, sort_size=sort_size)
    assert_same(got, expected)
    out = torch.empty_like(x)
    ft.launch_top_k_top_p(x, k, p, out, chunks=chunks, sort_size=sort_size)
    assert_same(out, expected)


@pytest.mark.parametrize("chunks", [1, 16])
def test_peaked_top_p_only(chunks):
    """Top-p alone on peaked rows: the cut falls inside the sorted candidates (the fast path)."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(16, VOCAB, generator=gen, device="cuda") * 9
    p = torch.tensor(P_CYCLE * 2, device="cuda", dtype=torch.float32)
    got = x.clone()
    ft.launch_top_k_top_p(got, None, p, got, chunks=chunks)
    assert_same(got, reference(x, None, p))


@pytest.mark.parametrize("rows", [1, 64])
def test_scalar_parameters(rows):
    x, _, _ = batch(rows, seed=1)
    for k, p in ((50, None), (None, 0.9), (1000, 1e-7), (200, 0.5)):
        assert_same(dm.top_k_top_p(x.clone(), k, p), reference(x, k, p))


def test_reference_is_the_same_on_cpu():
    x, k, p = batch(16, seed=2)
    assert_same(reference(x, k, p).cpu(), reference(x.cpu(), k.cpu(), p.cpu()))


@pytest.mark.parametrize("rows", [1, 253])
def test_cuda_graph_replay(rows):
    x, k, p = batch(rows, seed=3)
    static = x.clone()
    ft.launch_top_k_top_p(static, k, p, static)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    static.copy_(x)
    with torch.cuda.graph(graph):
        ft.launch_top_k_top_p(static, k, p, static)
    for seed in (4, 5):
        fresh, fresh_k, fresh_p = batch(rows, seed=seed)
        static.copy_(fresh)
        k.copy_(fresh_k.roll(1))
        p.copy_(fresh_p.roll(1))
        graph.replay()
        assert_same(static, reference(fresh, k, p))
