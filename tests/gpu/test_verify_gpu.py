"""verify_drafts on CUDA at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = K = 5), and the demo on CUDA."""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.demo import generate as demo
from dspark_markov.verify import keys

pytestmark = pytest.mark.gpu

VOCAB = 129_280
RANK = 256
STEPS = 5


def _case(rows, temperature, cache_dtype, seed=0):
    """Drafts from sample_drafts(impl="reference") on CUDA, and target logits close to the drafts'."""
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(seed)
    head = dm.MarkovHead((torch.randn(VOCAB, RANK, device=device, generator=g) * 0.05).bfloat16(),
                         (torch.randn(VOCAB, RANK, device=device, generator=g) * 0.05).bfloat16())
    base = (torch.randn(rows, STEPS, VOCAB, device=device, generator=g) * 2).bfloat16()
    anchor = torch.randint(0, VOCAB, (rows,), device=device, generator=g)
    slots = torch.randperm(rows, device=device, generator=g)
    temp = torch.full((rows,), temperature, dtype=torch.float32, device=device)
    seeds = torch.randint(-(2**62), 2**62, (rows,), device=device, generator=g)
    position = torch.randint(1, 100_000, (rows,), device=device, generator=g)
    steps = position[:, None] + torch.arange(STEPS, device=device)
    out = dm.sample_drafts(head, base, anchor, slots.repeat_interleave(STEPS), steps.reshape(-1), temp, seeds,
                           impl="reference", cache_dtype=cache_dtype)
    # Target: the drafter's own logits (temperature applied) plus a perturbation, so some drafts are
    # rejected and some accepted; one extra row for the bonus.
    draft_logits = out.logits_cache[slots].float() / (temperature if temperature > 0 else 1.0)
    noise = torch.randn(rows, STEPS + 1, VOCAB, device=device, generator=g) * 0.7
    target = torch.cat([draft_logits, draft_logits[:, -1:]], dim=1) + noise
    return target.contiguous(), out, slots, position, temp, seeds


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_structure_at_full_shapes(rows, method, cache_dtype):
    target, out, slots, position, temp, seeds = _case(rows, 1.0, cache_dtype)
    num_drafts = torch.arange(rows, device="cuda") % (STEPS + 1)
    idx = slots.clone()
    if rows > 1:
        idx[-1] = -1  # a padding request
    result = dm.verify_drafts(target, out.draft_tokens, out.logits_cache, num_drafts, idx, position, temp, seeds,
                              method=method)
    again = dm.verify_drafts(target, out.draft_tokens, out.logits_cache, num_drafts, idx, position, temp, seeds,
                             method=method)
    assert torch.equal(result.tokens, again.tokens) and torch.equal(result.num_emitted, again.num_emitted)
    tokens, counts = result.tokens.cpu(), result.num_emitted.cpu()
    drafts, n, live = out.draft_tokens.cpu(), num_drafts.cpu(), (idx >= 0).cpu()
    for b in range(rows):
        if not live[b]:
            assert int(counts[b]) == 0 and bool((tokens[b] == -1).all())
            continue
        c = int(counts[b])
        assert 1 <= c <= int(n[b]) + 1
        assert tokens[b, :c - 1].tolist() == drafts[b, :c - 1].tolist()
        assert 0 <= int(tokens[b, c - 1]) < VOCAB and bool((tokens[b, c:] == -1).all())


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
def test_greedy_at_full_shapes_is_torch_argmax(rows):
    target, out, slots, position, temp, seeds = _case(rows, 0.0, torch.bfloat16, seed=1)
    argmax = torch.argmax(target, dim=-1)
    drafts = argmax[:, :STEPS].clone()
    drafts[::2, 3] = (drafts[::2, 3] + 1) % VOCAB  # every other request disagrees at draft 3
    num_drafts = torch.full((rows,), STEPS, device="cuda")
    result = dm.verify_drafts(target, drafts, out.logits_cache, num_drafts, slots, position, temp, seeds)
    expected_counts = torch.where(torch.arange(rows, device="cuda") % 2 == 0, 4, STEPS + 1)
    assert torch.equal(result.num_emitted, expected_counts)
    for b in range(rows):
        c = int(expected_counts[b])
        assert torch.equal(result.tokens[b, :c], argmax[b, :c])


def test_cuda_keys_equal_cpu_keys():
    seeds = torch.randint(-(2**62), 2**62, (253, 1))
    position = torch.randint(1, 2**31, (253, 1))
    tokens = torch.arange(VOCAB)
    cpu_u = keys.accept_uniforms(seeds, position, STEPS)
    cuda_u = keys.accept_uniforms(seeds.cuda(), position.cuda(), STEPS).cpu()
    assert torch.equal(cpu_u, cuda_u)
    cpu_g = keys.resample_noise(seeds[:4], position[:4], tokens)
    cuda_g = keys.resample_noise(seeds[:4].cuda(), position[:4].cuda(), tokens.cuda()).cpu()
    assert torch.equal(cpu_g, cuda_g)  # the fp32 noise is bit-exact across devices (rng.log_f32)


def test_lossless_on_cuda_small_vocab():
    """The multi-round statistical check of tests/test_verify.py, run on the GPU with more trials."""
    device = torch.device("cuda")
    vocab, batch, length = 24, 20000, 6
    language = demo.BigramLanguage(vocab, period=2, rank=3, sharpness=2.0, seed=3, device=device)
    head = demo.fit_markov_head(language, rank=1)
    log_mu = language.marginals().log().float()
    for method in ("standard", "block"):
        anchor = torch.full((batch,), 5, dtype=torch.int64, device=device)
        start = torch.full((batch,), 40, dtype=torch.int64, device=device)
        result = demo.speculative_generate(
            lambda prev, pos: language.logits(prev, pos), lambda pos: log_mu[pos % 2].bfloat16(), head, anchor, start,
            length, num_steps=3, temperature=torch.ones(batch, device=device),
            seeds=torch.arange(batch, device=device) * 7919 + 1, method=method)
        marginals = language.position_marginals(5, 40, length)
        for t in range(length):
            observed = torch.bincount(result.tokens[:, t], minlength=vocab).double()
            statistic, dof = demo.chi_square(observed, marginals[t] * batch)
            assert statistic <= demo.chi_square_threshold(dof), (method, t, statistic, dof)


def test_demo_on_cuda():
    from dspark_markov.demo import cli

    assert cli.main(["--device", "cuda", "--quiet"]) == 0
