"""The sharded chain on the GPU at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5), world size 1.

A one-rank process group (NCCL, ``file://`` store) exercises the whole sharded path: the CUDA shard
step (cuBLAS bias), the packed winner words, every transport (``symm_mem`` where torch and the
driver allow it, else the agreed fallback), both cache layouts. The bias may differ from the CPU
reference in its last bit, so each step is checked against its own inputs: the cache equals
``round(U + bias_fast(previous token))`` exactly, and the token is exactly the reference draw
(:func:`draw_gumbel`) from the sampler's own logits.
"""

import datetime

import pytest
import torch
import torch.distributed as dist

import dspark_markov as dm
from dspark_markov import sharded
from dspark_markov.draft.reference import draw_gumbel, row_keys

pytestmark = pytest.mark.gpu

VOCAB, RANK, STEPS = 129_280, 256, 5


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    init_file = tmp_path_factory.mktemp("sharded") / "rendezvous"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    yield dist.group.WORLD
    dist.destroy_process_group()


def full_problem(rows, cache_dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    embed = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    head_w = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=gen) * 2).bfloat16()
    slots = torch.randperm(rows + 3, device="cuda", generator=gen)[:rows]
    if rows > 1:
        slots[1::3] = -1  # padding rows
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    temperature = torch.tensor([(0.0, 0.6, 1.0)[i % 3] for i in range(rows + 3)], device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (rows + 3,), device="cuda", generator=gen)
    anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=gen)
    return embed, head_w, [base, anchor, idx, positions, temperature, seeds]


def check_chain(sampler, head, args, out, cache_dtype):
    """Exact per-step checks against the sampler's own logits (scratch rows hold padding rows too)."""
    base, anchor, idx, positions, temperature, seeds = args
    rows = base.shape[0]
    slots = idx.view(rows, STEPS)
    pos = positions.view(rows, STEPS)
    prev = anchor.long()
    tokens = out.draft_tokens
    assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
    for step in range(STEPS):
        z = sampler.z_rows[:rows, step, :VOCAB]
        expected = (base[:, step].float() + head.bias_fast(prev).float()).to(cache_dtype)
        assert torch.equal(z, expected), f"step {step}: logits are not round(U + bias)"
        padding, temp, seed, position = row_keys(slots[:, step], pos[:, step], temperature, seeds)
        assert torch.equal(tokens[:, step], draw_gumbel(z, temp, seed, step, position)), f"step {step}: draw"
        live = ~padding
        assert torch.equal(out.logits_cache[slots[live, step].long(), step], z[live]), f"step {step}: cache"
        prev = tokens[:, step]


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
@pytest.mark.parametrize("transport", ["collective", "all_reduce", "symm_mem"])
def test_sharded_world1_full_shape(group, rows, transport):
    cache_dtype = torch.bfloat16
    embed, head_w, args = full_problem(rows, cache_dtype)
    sampler = sharded.ShardedMarkovSampler(embed, head_w, group, STEPS, 253, cache_dtype, transport=transport)
    if transport == "symm_mem":
        # installed, or every rank agreed on the collective fallback and says why
        assert sampler.transport_name == "symm_mem" or sampler.transport_fallback_reason
    else:
        assert sampler.transport_name == transport
    out = sampler.sample(*args)
    torch.cuda.synchronize()
    check_chain(sampler, dm.MarkovHead(embed, head_w), args, out, cache_dtype)
    again = sampler.sample(*args)  # a second call reuses the transport's buffers
    assert torch.equal(again.draft_tokens, out.draft_tokens) and torch.equal(again.logits_cache, out.logits_cache)


@pytest.mark.parametrize("layout", ["sharded", "gathered"])
def test_sharded_world1_fp32_cache_layouts(group, layout):
    embed, head_w, args = full_problem(16, torch.float32, seed=1)
    sampler = sharded.ShardedMarkovSampler(embed, head_w, group, STEPS, 64, torch.float32, cache_layout=layout)
    out = sampler.sample(*args)
    check_chain(sampler, dm.MarkovHead(embed, head_w), args, out, torch.float32)


def test_sharded_world1_replicated_fallback(group):
    embed, head_w, args = full_problem(64, torch.bfloat16, seed=2)
    sampler = sharded.ShardedMarkovSampler(embed, head_w, group, STEPS, 16, torch.bfloat16,
                                              replicated_head_weight=head_w, fallback_impl="reference")
    out = sampler.sample(*args)
    ref = dm.sample_drafts(dm.MarkovHead(embed, head_w), *args, impl="reference")
    assert torch.equal(out.draft_tokens, ref.draft_tokens) and torch.equal(out.logits_cache, ref.logits_cache)


def test_sharded_world1_token_probability(group):
    embed, head_w, args = full_problem(16, torch.bfloat16, seed=3)
    sampler = sharded.ShardedMarkovSampler(embed, head_w, group, STEPS, 16, torch.bfloat16)
    out = sampler.sample(*args)
    rows = args[0].shape[0]
    slots = args[2].view(rows, STEPS)
    live_row, live_step = (slots >= 0).nonzero(as_tuple=True)
    slot = slots[live_row, live_step]
    temp = args[4][slot]
    token = out.draft_tokens[live_row, live_step]
    q = sharded.sharded_token_probability(out.logits_cache[slot, live_step], token, temp, 0, group)
    full = out.logits_cache[slot, live_step].float()
    scaled = full / torch.where(temp == 0, torch.ones_like(temp), temp)[:, None]
    expected = torch.softmax(scaled, dim=-1).gather(1, token[:, None])[:, 0]
    greedy = temp == 0
    assert torch.equal(q[greedy], (token[greedy] == full[greedy].argmax(dim=-1)).float())
    bound = 2 * VOCAB * 2.0**-24  # two fp32 summation orders over V terms
    torch.testing.assert_close(q[~greedy], expected[~greedy], rtol=bound, atol=0.0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_sharded_two_gpus_nccl_all_transports(tmp_path):
    """2 NCCL ranks at full shape: identical tokens on both, exact logits and draws, symm_mem if installable."""
    import os
    import time

    import torch.multiprocessing as mp

    from tests.sharded import gpu_worker as sharded_gpu_worker

    done = tmp_path / "done"
    done.mkdir()
    context = mp.start_processes(sharded_gpu_worker.worker, args=(2, str(tmp_path / "rendezvous"), str(done)),
                                 nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 400
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail("the 2-GPU sharded job did not finish within 400 s (a hang)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    assert sorted(os.listdir(done)) == ["rank0.ok", "rank1.ok"]
    reports = [(done / name).read_text() for name in ("rank0.ok", "rank1.ok")]
    print(reports[0])
    # both ranks installed the same transports (agreement), whatever they are
    assert [line.split(" ")[0] for line in reports[0].splitlines()] == [line.split(" ")[0] for line in reports[1].splitlines()]
