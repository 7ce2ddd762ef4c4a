"""``impl="inverse_cdf"`` on the GPU at DeepSeek-V4.1 shapes (V = 129,280, R_k = 256, N = 5).

Bias tolerance: the backend computes the bias with one cuBLAS GEMM in bf16 (fp32 accumulation),
which SPEC.md section 3 allows to differ from the fp32 reference in the last bit. So the cache is
checked (a) bit for bit against a replay whose bias is the same cuBLAS GEMM
(``MarkovHead.bias_fast``, same shapes), and (b) against the fp32 reference bias within one bf16
ulp of the bias plus one ulp of the cache dtype at ``z`` (the bias ulp, then the re-rounding).
Everything after the bias is exact: T = 0 tokens equal ``argmax_first`` of the cache, and each
T > 0 token is the inverse CDF of its uniform under ``softmax(cache / T)``.
"""

import math

import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import reference as ref

pytestmark = pytest.mark.gpu

VOCAB, RANK, STEPS = 129_280, 256, 5
ROWS = [1, 16, 64, 253]
NEG_INF = float("-inf")


def cuda_head(vocab=VOCAB, rank=RANK, zero_head=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    embed = torch.randn(vocab + 64, rank, generator=gen, device="cuda")
    head = torch.zeros(vocab, rank, device="cuda") if zero_head else torch.randn(vocab, rank, generator=gen,
                                                                                device="cuda") * 0.06
    return dm.MarkovHead(embed.bfloat16(), head.bfloat16())


@pytest.fixture(scope="module")
def head():
    return cuda_head()


@pytest.fixture
def fp32_gemm_reduction():
    """SPEC.md section 3 asks for fp32 accumulation: no bf16 split-K reductions in cuBLAS."""
    flag = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    yield
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag


def ulp(x, dtype):
    """One unit in the last place of |x| in ``dtype`` (fp32 tensor)."""
    bits = {torch.bfloat16: 8, torch.float32: 24}[dtype]
    exponent = torch.frexp(x.float().abs().clamp_min(1e-30))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - bits)


def same_bits(a, b):
    ints = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return bool(((a.view(ints) == b.view(ints)) | (torch.isnan(a) & torch.isnan(b))).all())


def problem(rows, steps=STEPS, vocab=VOCAB, base_dtype=torch.bfloat16, seed=1):
    """Mixed temperatures (0 / 0.6 / 1), every 5th sample padding, slots permuted, odd strides."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    big = torch.randn(rows, steps + 1, vocab + 8, generator=gen, device="cuda") * 2
    base = big.to(base_dtype)[:, 1:, 4:vocab + 4]
    slots = rows + 3
    idx = torch.randperm(slots, generator=gen, device="cuda")[:rows].repeat_interleave(steps)
    idx[::5] = -1
    positions = torch.randint(0, 2**40, (rows * steps,), generator=gen, device="cuda")
    temperature = torch.tensor([0.0, 0.6, 1.0], device="cuda").repeat(slots)[:slots]
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=gen, device="cuda")
    anchor = torch.randint(0, vocab + 64, (rows,), generator=gen, device="cuda")
    return base, anchor, idx, positions, temperature, seeds


def replay(head, base, anchor, idx, positions, temperature, seeds, tokens, cache_like, bias_fn):
    rows, steps, _ = base.shape
    cache = cache_like.clone()
    slots, pos = idx.view(rows, steps), positions.view(rows, steps)
    prev, keys = anchor.long(), []
    for step in range(steps):
        padding, temp, seed, position = ref.row_keys(slots[:, step], pos[:, step], temperature, seeds)
        bias = bias_fn(prev)
        z = (base[:, step].float() + bias.float()).to(cache.dtype)
        cache[slots[~padding, step].long(), step] = z[~padding]
        keys.append((z, bias, temp, seed, position))
        prev = tokens[:, step]
    return cache, keys


def check_inverse_cdf(z, temp, seed, step, position, token):
    """T > 0 tokens bracket their uniform in the fp64 CDF of softmax(fp32(z / T)), eps = 4 V 2^-24."""
    eps = 4 * z.shape[-1] * 2.0**-24
    u = rng.inverse_cdf_uniform(seed, step, position).double()
    safe = torch.where(temp > 0, temp, torch.ones_like(temp))
    scaled = (z.float() / safe[:, None]).double()
    weight = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    cumulative = torch.cumsum(weight, dim=-1) / weight.sum(dim=-1, keepdim=True)
    drawn = temp > 0
    t = token.long()
    assert (weight.gather(1, t[:, None])[:, 0][drawn] > 0).all()
    above = cumulative.gather(1, t[:, None])[:, 0]
    below = torch.where(t > 0, cumulative.gather(1, (t - 1).clamp_min(0)[:, None])[:, 0], torch.zeros_like(above))
    assert ((below - eps <= u) & (u <= above + eps))[drawn].all()


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", ROWS)
def test_cache_exact_greedy_identical_draws_inverse_cdf(head, rows, cache_dtype, fp32_gemm_reduction):
    base_dtype = torch.float32 if cache_dtype == torch.float32 else torch.bfloat16
    inputs = problem(rows, base_dtype=base_dtype)
    base, anchor, idx, positions, temperature, seeds = inputs
    sentinel = torch.full((temperature.shape[0], STEPS, VOCAB), 5.0, dtype=cache_dtype, device="cuda")
    cache = sentinel.clone()
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method="inverse_cdf", impl="inverse_cdf")
    tokens = sampler.sample(*inputs, logits_cache=cache).draft_tokens
    assert ((tokens >= 0) & (tokens < VOCAB)).all()
    fast_cache, keys = replay(head, *inputs, tokens, sentinel, head.bias_fast)
    assert same_bits(cache, fast_cache)
    exact_cache, exact_keys = replay(head, *inputs, tokens, sentinel, head.bias)
    tolerance = ulp(exact_cache.float(), cache_dtype)
    for step, (z, bias, *_rest) in enumerate(exact_keys):
        tolerance[:, step] += ulp(bias.float(), torch.bfloat16).amax()  # a bias ulp moves z at most that much
    assert ((cache.float() - exact_cache.float()).abs() <= tolerance).all()
    for step, (z, _bias, temp, seed, position) in enumerate(keys):
        greedy = temp == 0
        assert torch.equal(tokens[greedy, step], ref.argmax_first(z.float())[greedy])
        check_inverse_cdf(z, temp, seed, step, position, tokens[:, step])


def test_special_rows_at_full_vocabulary():
    head = cuda_head(zero_head=True)
    rows = 8
    base = torch.randn(rows, 1, VOCAB, device="cuda")
    z = base[:, 0]
    z[0, [90_000, 4_097]] = float("nan")
    z[1] = NEG_INF
    z[2, [129_279, 70_000]] = float("inf")
    z[3] = torch.randn(VOCAB, device="cuda") * 3e37
    z[3, 100_000] = 3.4e38
    z[4, 1::2] = NEG_INF
    z[5] = NEG_INF
    z[5, 129_279] = -3e38
    z[6, :100_000] = NEG_INF
    z[7] = 0.0
    temperature = torch.tensor([1.0, 1.0, 0.6, 0.6, 1.0, 1.0, 0.6, 1.0], device="cuda")
    out = dm.sample_drafts(head, base, torch.zeros(rows, dtype=torch.long, device="cuda"),
                           torch.arange(rows, device="cuda"), torch.arange(rows, device="cuda") + 9, temperature,
                           torch.arange(rows, device="cuda") * 77, method="inverse_cdf", impl="inverse_cdf",
                           cache_dtype=torch.float32)
    tokens = out.draft_tokens[:, 0].tolist()
    assert tokens[0] == 4_097 and tokens[1] == 0 and tokens[2] == 70_000 and tokens[3] == 100_000
    assert tokens[4] % 2 == 0 and tokens[5] == 129_279 and tokens[6] >= 100_000 and 0 <= tokens[7] < VOCAB
    assert same_bits(out.logits_cache[:, 0], z)


@pytest.mark.parametrize("vocab,block_size", [(64, 16), (4099, None)])
def test_chi_square_on_a_reduced_vocabulary(vocab, block_size):
    """51,200 draws per temperature, one masked token (bins expecting < 5 pooled); threshold df + 10 sqrt(2 df) per temperature."""
    from dspark_markov.draft.triton_inverse_cdf import InverseCdfBackend

    rows, steps, calls = 4096, 5, 5
    head = cuda_head(vocab, 16, zero_head=True)
    gen = torch.Generator(device="cuda").manual_seed(7)
    logits = torch.randn(vocab, generator=gen, device="cuda")
    logits[vocab // 3] = NEG_INF
    base = logits.expand(rows, steps, vocab).to(torch.bfloat16)
    temperature = torch.tensor([1.0, 0.6], device="cuda").repeat(rows // 2)
    backend = InverseCdfBackend(head, steps, rows, method="inverse_cdf", cache_dtype=torch.bfloat16, device=torch.device("cuda"),
                                block_size=block_size)
    counts = {1.0: torch.zeros(vocab, device="cuda"), 0.6: torch.zeros(vocab, device="cuda")}
    cache = torch.empty(rows, steps, vocab, dtype=torch.bfloat16, device="cuda")
    tokens = torch.empty(rows, steps, dtype=torch.int64, device="cuda")
    for call in range(calls):
        seeds = torch.randint(-(2**62), 2**62, (rows,), generator=gen, device="cuda")
        positions = torch.randint(0, 2**31, (rows * steps,), generator=gen, device="cuda")
        backend.run(base, torch.zeros(rows, dtype=torch.long, device="cuda"),
                    torch.arange(rows, device="cuda").repeat_interleave(steps), positions, temperature, seeds,
                    tokens, cache)
        for temp in counts:
            counts[temp] += torch.bincount(tokens[temperature == temp].flatten(), minlength=vocab).float()
    z = logits.bfloat16().float()
    for temp, observed in counts.items():
        assert observed[vocab // 3] == 0
        observed = observed.double()
        expected = torch.softmax((z / temp).double(), dim=0) * observed.sum()
        small = expected < 5  # pooled into one bin, so that every bin expects at least ~5
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
        keep = expected > 0
        chi2 = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
        df = int(keep.sum()) - 1
        assert chi2 < df + 10 * math.sqrt(2 * df), (temp, chi2, df)


@pytest.mark.parametrize("rows", [16, 253])
def test_cuda_graph_replay_with_new_inputs_equals_eager(head, rows):
    static = [t.clone() for t in problem(rows, seed=11)]
    fresh = problem(rows, seed=12)
    slots = static[4].shape[0]
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="inverse_cdf", impl="inverse_cdf")
    tokens = torch.zeros(rows, STEPS, dtype=torch.int64, device="cuda")
    cache = torch.zeros(slots, STEPS, VOCAB, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile the kernels and warm cuBLAS outside the capture
        sampler.sample(*static, draft_tokens=tokens, logits_cache=cache)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(*static, draft_tokens=tokens, logits_cache=cache)
    for target, source in zip(static, fresh):
        target.copy_(source)
    cache.zero_()
    graph.replay()
    torch.cuda.synchronize()
    eager = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="inverse_cdf", impl="inverse_cdf").sample(
        *fresh, logits_cache=torch.zeros_like(cache))
    assert torch.equal(tokens, eager.draft_tokens)
    assert same_bits(cache, eager.logits_cache)
