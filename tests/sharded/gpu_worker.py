"""Code run in the NCCL processes of ``tests/gpu/test_sharded_gpu.py`` (one GPU per rank).

Every rank builds the same full-shape problem on the CPU (so the inputs are identical), samples
with each transport and cache layout, and checks exactly: every rank drew the same tokens; each
step's logits are ``round(U + bias)`` with each shard's own cuBLAS bias; each token is the
reference draw (:func:`draw_gumbel`) from those logits, padding rows included.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from dspark_markov import MarkovHead
from dspark_markov.draft.reference import draw_gumbel, row_keys
from dspark_markov.sharded import ShardedMarkovSampler, all_shard_bounds, sharded_token_probability

VOCAB, RANK, STEPS = 129_280, 256, 5


def full_problem(rows, seed):
    gen = torch.Generator().manual_seed(seed)
    embed = (torch.randn(VOCAB, RANK, generator=gen) * 0.05).bfloat16()
    head = (torch.randn(VOCAB, RANK, generator=gen) * 0.05).bfloat16()
    base = (torch.randn(rows, STEPS, VOCAB, generator=gen) * 2).bfloat16()
    slots = torch.randperm(rows + 3, generator=gen)[:rows]
    if rows > 1:
        slots[1::3] = -1
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), generator=gen)
    temperature = torch.tensor([(0.0, 0.6, 1.0)[i % 3] for i in range(rows + 3)])
    seeds = torch.randint(-(2**62), 2**62, (rows + 3,), generator=gen)
    anchor = torch.randint(0, VOCAB, (rows,), generator=gen)
    return embed.cuda(), head.cuda(), [t.cuda() for t in (base, anchor, idx, positions, temperature, seeds)]


def check(sampler, embed, head, args, out, world):
    base, anchor, idx, positions, temperature, seeds = args
    rows = base.shape[0]
    gathered = [torch.empty_like(out.draft_tokens) for _ in range(world)]
    dist.all_gather(gathered, out.draft_tokens)
    assert all(torch.equal(g, out.draft_tokens) for g in gathered), "ranks drew different tokens"
    bounds = all_shard_bounds(VOCAB, world)
    shard_heads = [MarkovHead(embed, head[s:e]) for s, e in bounds]
    slots = idx.view(rows, STEPS)
    pos = positions.view(rows, STEPS)
    prev = anchor.long()
    for step in range(STEPS):
        z = torch.cat([sampler.z_gathered[p, :rows, step, :e - s] for p, (s, e) in enumerate(bounds)], dim=1)
        bias = torch.cat([h.bias_fast(prev) for h in shard_heads], dim=1)
        assert torch.equal(z, (base[:, step].float() + bias.float()).bfloat16()), f"step {step}: logits"
        padding, temp, seed, position = row_keys(slots[:, step], pos[:, step], temperature, seeds)
        assert torch.equal(out.draft_tokens[:, step], draw_gumbel(z, temp, seed, step, position)), f"step {step}"
        live = ~padding
        assert torch.equal(out.logits_cache[slots[live, step].long(), step], z[live]), f"step {step}: cache"
        prev = out.draft_tokens[:, step]


def worker(rank, world, init_file, done_dir):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    names = []
    try:
        for rows in (1, 16, 64, 253):
            embed, head, args = full_problem(rows, seed=rows)
            for transport in ("collective", "all_reduce", "symm_mem"):
                sampler = ShardedMarkovSampler(embed, head, group, STEPS, 253, torch.bfloat16,
                                               cache_layout="gathered", transport=transport)
                names.append(f"{transport}->{sampler.transport_name} ({sampler.transport_fallback_reason})")
                out = sampler.sample(*args)
                check(sampler, embed, head, args, out, world)
                again = sampler.sample(*args)
                assert torch.equal(again.draft_tokens, out.draft_tokens)
            # the sharded layout: this rank's columns of the same cache, and q(x) without gathering
            sharded = ShardedMarkovSampler(embed, head, group, STEPS, 253, torch.bfloat16)
            part = sharded.sample(*args)
            assert torch.equal(part.draft_tokens, out.draft_tokens)
            assert torch.equal(part.logits_cache, out.logits_cache[:, :, sharded.vocab_start:sharded.vocab_end])
            slots = args[2].view(rows, STEPS)
            live_row, live_step = (slots >= 0).nonzero(as_tuple=True)
            slot = slots[live_row, live_step]
            temp = args[4][slot]
            token = out.draft_tokens[live_row, live_step]
            q = sharded_token_probability(part.logits_cache[slot, live_step], token, temp, sharded.vocab_start, group)
            full = out.logits_cache[slot, live_step].float()
            scaled = full / torch.where(temp == 0, torch.ones_like(temp), temp)[:, None]
            expected = torch.softmax(scaled, dim=-1).gather(1, token[:, None])[:, 0]
            hot = temp > 0
            torch.testing.assert_close(q[hot], expected[hot], rtol=2 * VOCAB * 2.0**-24, atol=0.0)
        torch.cuda.synchronize()
        with open(os.path.join(done_dir, f"rank{rank}.ok"), "w") as handle:
            handle.write("\n".join(names))
    finally:
        dist.destroy_process_group()
