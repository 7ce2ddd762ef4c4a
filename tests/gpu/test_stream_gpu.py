"""``impl="stream"`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5), and its noise bounds.

Every draw is checked against the reference applied to the sampler's own cache (Gumbel bit for
bit, inverse CDF: greedy rows bit for bit and every T > 0 token the inverse CDF of its uniform);
the skip bounds of the Gumbel path are checked over all 2^32 hashes.
"""

import pytest
import torch
import triton
import triton.language as tl

import dspark_markov as dm
from dspark_markov.ops import noise as rng_triton  # the device twins of rng
from dspark_markov.draft import reference as ref
from dspark_markov.draft.triton_stream import G_MAX, G_MIN, noise_upper
from tests.helpers import check_against_reference

pytestmark = pytest.mark.gpu

VOCAB, RANK, STEPS = 129_280, 256, 5


def full_problem(rows, *, temps=(1.0, 0.6, 0.0), seed=0):
    """Inputs at full shape: slot per row (one padding row in the middle), mixed temperatures by default."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    head = dm.MarkovHead((torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16())
    base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=gen) * 2).bfloat16()
    slots = torch.arange(rows, device="cuda")
    slots[rows // 2] = -1
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    temperature = torch.tensor([temps[i % len(temps)] for i in range(rows)], device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=gen)
    return head, [base, anchor, idx, positions, temperature, seeds]


def check_inverse_cdf_tokens(head, args, out):
    """Each T > 0 token is the inverse CDF of its uniform under softmax(own cache / T), within fp32 sums."""
    rows = args[0].shape[0]
    slots = args[2].view(rows, STEPS)
    pos = args[3].view(rows, STEPS)
    eps = 4 * VOCAB * 2.0**-24
    for step in range(STEPS):
        padding, temp, seed, position = ref.row_keys(slots[:, step], pos[:, step], args[4], args[5])
        sampled = (~padding) & (temp > 0)
        z = out.logits_cache[slots[sampled, step].long(), step].double()
        t = temp[sampled].double()
        weight = torch.exp(z / t[:, None] - (z / t[:, None]).amax(dim=-1, keepdim=True))
        cumulative = torch.cumsum(weight, dim=-1) / weight.sum(dim=-1, keepdim=True)
        token = out.draft_tokens[sampled, step]
        u = dm.rng.inverse_cdf_uniform(seed[sampled], step, position[sampled]).double()
        assert bool((weight.gather(1, token[:, None]) > 0).all())
        below = torch.where(token > 0, cumulative.gather(1, (token - 1).clamp_min(0)[:, None])[:, 0], 0.0)
        above = cumulative.gather(1, token[:, None])[:, 0]
        assert bool(((below - eps <= u) & (u <= above + eps)).all()), f"step {step}"


@pytest.mark.parametrize("rows", [32, 64, 253])
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_stream_full_shape(rows, method, cache_dtype):
    head, args = full_problem(rows)
    out = dm.sample_drafts(head, *args, impl="stream", method=method, cache_dtype=cache_dtype)
    check_against_reference(head, *args, out, method=method)
    if method == "inverse_cdf":
        check_inverse_cdf_tokens(head, args, out)


@pytest.mark.parametrize("layout", [(64, 64, 4, 1, 1), (64, 64, 4, 0, 1), (128, 64, 4, 1, 1)],
                         ids=lambda layout: "x".join(map(str, layout)))
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_stream_layouts_full_shape(layout, method):
    """The other launch shapes (tools/sweep_stream.py) draw exactly too: 253 rows, mixed T, padding."""
    rows = 253
    head, args = full_problem(rows, seed=6)
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method=method, impl="stream")
    block_v, block_r, warps, group_chunks, row_stages = layout
    sampler.backend.__init__(head, STEPS, rows, method=method, cache_dtype=torch.bfloat16, device=torch.device("cuda"), block_v=block_v,
                             block_r=block_r, num_warps=warps, group_chunks=group_chunks, row_stages=row_stages)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out, method=method)
    if method == "inverse_cdf":
        check_inverse_cdf_tokens(head, args, out)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_stream_all_t1_and_greedy(method):
    for temps in ((1.0,), (0.0,)):
        head, args = full_problem(64, temps=temps, seed=4)
        out = dm.sample_drafts(head, *args, impl="stream", method=method)
        check_against_reference(head, *args, out, method=method)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_stream_nan_inf_rows(method):
    head, args = full_problem(40, temps=(1.0, 0.6), seed=5)
    base = args[0].float()
    base[0, :, 70_000] = float("nan")
    base[0, :, 90_000] = float("nan")
    base[1] = float("-inf")
    base[2, :, 100_001] = float("inf")
    base[3, :, 5] = 1e30
    args[0] = base
    out = dm.sample_drafts(head, *args, impl="stream", method=method, cache_dtype=torch.float32)
    assert out.draft_tokens[:4].tolist() == [[70_000] * STEPS, [0] * STEPS, [100_001] * STEPS, [5] * STEPS]
    check_against_reference(head, *args, out, method=method)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_stream_cuda_graph_replay(method):
    rows = 64
    head, args = full_problem(rows, seed=1)
    sampler = dm.MarkovSampler(head, STEPS, rows, method=method, impl="stream")
    tokens = torch.empty(rows, STEPS, dtype=torch.int64, device="cuda")
    cache = torch.zeros(rows, STEPS, VOCAB, dtype=torch.bfloat16, device="cuda")
    static = [a.clone() for a in args]
    sampler.sample(*static, draft_tokens=tokens, logits_cache=cache)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(*static, draft_tokens=tokens, logits_cache=cache, check_values=False)
    _, fresh = full_problem(rows, seed=2, temps=(0.6, 1.0, 0.0))
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    eager = sampler.sample(*fresh)
    assert torch.equal(tokens, eager.draft_tokens)
    assert torch.equal(cache, eager.logits_cache)


@triton.jit
def _noise_bounds_kernel(out_ptr, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    h = (start + tl.arange(0, BLOCK)).to(tl.uint32)
    g = rng_triton.gumbel32(rng_triton.uniform32(h))
    # non-negative fp32 values order like their int32 bit patterns
    tl.atomic_max(out_ptr, tl.max(g, axis=0).to(tl.int32, bitcast=True))
    tl.atomic_max(out_ptr + 1, tl.max(-g, axis=0).to(tl.int32, bitcast=True))
    excess = tl.max(g - noise_upper(h, True), axis=0)  # must stay < 0
    tl.atomic_max(out_ptr + 2, (excess > 0.0).to(tl.int32))
    tl.atomic_min(out_ptr + 3, (-excess).to(tl.int32, bitcast=True))


def test_noise_bounds_exhaustive():
    """G_MIN <= g <= G_MAX and g <= noise_upper(h) for every one of the 2^32 hashes."""
    block = 1 << 16
    out = torch.tensor([0, 0, 0, 2**31 - 1], dtype=torch.int32, device="cuda")
    _noise_bounds_kernel[((1 << 32) // block,)](out, BLOCK=block, num_warps=8, enable_fp_fusion=False)
    g_max = float(out[0:1].view(torch.float32))
    g_min = -float(out[1:2].view(torch.float32))
    closest = float(out[3:4].view(torch.float32))
    print(f"noise over all 2^32 hashes: [{g_min!r}, {g_max!r}]; smallest gap below noise_upper {closest:.3g}")
    assert G_MIN <= g_min and g_max <= G_MAX
    assert int(out[2]) == 0
