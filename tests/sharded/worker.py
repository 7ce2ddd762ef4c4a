"""Code run inside the processes spawned by ``test_sharded.py`` (one process per rank, gloo).

Every rank builds the same inputs from fixed seeds, runs :class:`ShardedMarkovSampler`, and checks
its tokens and cache against the single-process reference computed in the same process. A failed
check raises, which ``torch.multiprocessing`` reports to the test.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from dspark_markov import MarkovHead, sample_drafts
from dspark_markov.draft.reference import argmax_first, draw_gumbel, row_keys, sample_drafts_reference
from dspark_markov.sharded import (
    ShardedMarkovSampler,
    all_shard_bounds,
    sharded_softmax_stats,
    sharded_token_probability,
)

from tests.helpers import leave_process_group_and_exit

RANK_KEY = 48  # R_k of the test heads


class ShardBiasHead(MarkovHead):
    """The reference head with the sharded sampler's bias rounding: each shard's fp32 GEMM, rounded.

    On the CPU, torch's fp32 GEMM sums in an order that depends on the output width, so a shard's
    bias can differ from the full GEMM in the last fp32 bit (SPEC.md section 3 leaves that order
    free). Concatenating the shards' biases gives the reference the same bias, and then everything
    after it must agree bit for bit.
    """

    def __init__(self, embed_weight, head_weight, scale, world):
        super().__init__(embed_weight, head_weight, scale)
        self.shards = [MarkovHead(embed_weight, head_weight[s:e], scale) for s, e in all_shard_bounds(self.vocab_size, world)]

    def bias(self, prev):
        return torch.cat([shard.bias(prev) for shard in self.shards], dim=1)


def make_problem(seed, vocab, rows, steps, weight_dtype, logit_dtype, slots=None, greedy_special=False):
    gen = torch.Generator().manual_seed(seed)
    embed = (torch.randn(vocab + 7, RANK_KEY, generator=gen) * 0.5).to(weight_dtype)
    head = (torch.randn(vocab, RANK_KEY, generator=gen) * 0.3).to(weight_dtype)
    base = (torch.randn(rows, steps, vocab, generator=gen) * 2.0).to(logit_dtype)
    anchor = torch.randint(0, vocab + 7, (rows,), generator=gen)
    slots = slots if slots is not None else rows + 3
    slot_of_row = torch.randperm(slots, generator=gen)[:rows]
    idx_mapping = slot_of_row[:, None].repeat(1, steps)
    idx_mapping[1::3] = -1  # every third row (from row 1) is padding
    positions = torch.randint(1, 10_000, (rows, 1), generator=gen) + torch.arange(steps)
    temps = torch.tensor([0.0, 0.6, 1.0], dtype=torch.float32)[torch.arange(slots) % 3]
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=gen)
    return dict(embed=embed, head=head, base=base, anchor=anchor, idx_mapping=idx_mapping.reshape(-1),
                positions=positions.reshape(-1), temperature=temps, seeds=seeds)


def reference(problem, cache_dtype, world, scale=1.0, shard_bias=True):
    head_cls = ShardBiasHead(problem["embed"], problem["head"], scale, world) if shard_bias else \
        MarkovHead(problem["embed"], problem["head"], scale)
    rows, steps, vocab = problem["base"].shape
    tokens = torch.empty(rows, steps, dtype=torch.int64)
    cache = torch.zeros(problem["temperature"].shape[0], steps, vocab, dtype=cache_dtype)
    sample_drafts_reference(head_cls, problem["base"], problem["anchor"], problem["idx_mapping"],
                            problem["positions"], problem["temperature"], problem["seeds"], tokens, cache)
    return tokens, cache


def run_sampler(sampler, problem, shard_logits=False):
    base = problem["base"]
    if shard_logits:
        base = base[:, :, sampler.vocab_start:sampler.vocab_end].contiguous()
    return sampler.sample(base, problem["anchor"], problem["idx_mapping"], problem["positions"],
                          problem["temperature"], problem["seeds"])


def check_draws(sampler, problem, ref_tokens, ref_cache, label, shard_logits=False):
    out = run_sampler(sampler, problem, shard_logits)
    assert torch.equal(out.draft_tokens, ref_tokens), f"{label}: tokens differ from the reference"
    if sampler.cache_layout == "sharded":
        expected = ref_cache[:, :, sampler.vocab_start:sampler.vocab_end]
    else:
        expected = ref_cache
    assert out.logits_cache.dtype == ref_cache.dtype
    assert torch.equal(bits(out.logits_cache), bits(expected)), f"{label}: cache differs from the reference"
    return out


def bits(x):
    """The bit pattern of a float tensor (exact comparison that also matches NaNs)."""
    return x.contiguous().view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)


def check_invariant(problem, tokens, full_cache):
    """The drawn token is what the reference draws from the sampler's own cached logits."""
    rows, steps, _ = problem["base"].shape
    slots = problem["idx_mapping"].view(rows, steps)
    pos = problem["positions"].view(rows, steps)
    for step in range(steps):
        padding, temp, seed, position = row_keys(slots[:, step], pos[:, step], problem["temperature"], problem["seeds"])
        live = ~padding
        z = full_cache[slots[live, step], step]
        drawn = draw_gumbel(z, temp[live], seed[live], step, position[live])
        assert torch.equal(drawn, tokens[live, step]), f"step {step}: token is not the draw from the cached logits"


def check_token_probability(group, problem, cache_full, cache_shard, tokens, start, world):
    """Sharded q(x) against softmax of the full cache rows, for every live (row, step) sample."""
    rows, steps, vocab = problem["base"].shape
    slots = problem["idx_mapping"].view(rows, steps)
    live_row, live_step = (slots >= 0).nonzero(as_tuple=True)
    slot = slots[live_row, live_step]
    temp = problem["temperature"][slot]
    x = tokens[live_row, live_step]
    # also probe tokens that were not drawn, spread over every shard
    probe = (x * 7919 + 13) % vocab
    for token in (x, probe):
        q = sharded_token_probability(cache_shard[slot, live_step], token, temp, start, group)
        full = cache_full[slot, live_step].float()
        scaled = full / torch.where(temp == 0, torch.ones_like(temp), temp)[:, None]
        expected = torch.softmax(scaled, dim=-1).gather(1, token[:, None])[:, 0]
        greedy = temp == 0
        assert torch.equal(q[greedy], (token[greedy] == full[greedy].argmax(dim=-1)).float())
        # fp32 sums of V terms in two different orders: |error| <= 2 V eps relative (eps = 2^-24)
        bound = 2 * vocab * 2.0**-24
        torch.testing.assert_close(q[~greedy], expected[~greedy], rtol=bound, atol=0.0)
    stats = sharded_softmax_stats(cache_shard[slot, live_step], temp, start, group)
    full = cache_full[slot, live_step].float()
    scaled = full / torch.where(temp == 0, torch.ones_like(temp), temp)[:, None]
    assert torch.equal(stats.row_max, scaled.amax(dim=-1))
    assert torch.equal(stats.argmax, argmax_first(scaled))


def scenario_main(rank, world, vocabs):
    """Draws and caches of both layouts, transports, dtypes, padding, mixed T; q(x); fallbacks."""
    group = dist.group.WORLD
    for vocab in vocabs:
        for weight_dtype, cache_dtype, logit_dtype in ((torch.float32, torch.float32, torch.float32),
                                                       (torch.bfloat16, torch.bfloat16, torch.bfloat16),
                                                       (torch.float32, torch.bfloat16, torch.float32)):
            problem = make_problem(1000 + vocab, vocab, 7, 4, weight_dtype, logit_dtype)
            ref_tokens, ref_cache = reference(problem, cache_dtype, world, scale=0.75)
            if weight_dtype == torch.bfloat16:  # bf16 rounding of the bias hides the fp32 GEMM order here
                plain_tokens, plain_cache = reference(problem, cache_dtype, world, scale=0.75, shard_bias=False)
                assert torch.equal(plain_tokens, ref_tokens) and torch.equal(plain_cache, ref_cache)
                plain = sample_drafts(MarkovHead(problem["embed"], problem["head"], 0.75), problem["base"],
                                      problem["anchor"], problem["idx_mapping"], problem["positions"],
                                      problem["temperature"], problem["seeds"], method="gumbel",
                                      impl="reference", cache_dtype=cache_dtype)
                assert torch.equal(plain.draft_tokens, ref_tokens)
            for layout, transport in (("sharded", "collective"), ("gathered", "all_reduce")):
                label = f"V={vocab} world={world} {weight_dtype}/{cache_dtype} {layout} {transport}"
                sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 4, 8, cache_dtype, scale=0.75,
                                               cache_layout=layout, transport=transport)
                assert sampler.transport_name == transport and sampler.transport_fallback_reason is None
                out = check_draws(sampler, problem, ref_tokens, ref_cache, label)
                # the same sampler again, with this rank's logits only and a shard-sized head
                check_draws(sampler, problem, ref_tokens, ref_cache, label + " shard logits", shard_logits=True)
                if layout == "gathered":
                    check_invariant(problem, out.draft_tokens, out.logits_cache)
                else:
                    check_token_probability(group, problem, ref_cache, out.logits_cache, out.draft_tokens,
                                            sampler.vocab_start, world)
        # a head given as this rank's shard (vocab_size=), and the replicated fallback above max_rows
        problem = make_problem(7 + vocab, vocab, 11, 3, torch.bfloat16, torch.bfloat16)
        start, end = all_shard_bounds(vocab, world)[rank]
        for layout in ("sharded", "gathered"):
            sampler = ShardedMarkovSampler(problem["embed"], problem["head"][start:end].clone(), group, 3, 4,
                                           torch.bfloat16, vocab_size=vocab, cache_layout=layout,
                                           replicated_head_weight=problem["head"], fallback_impl="reference")
            plain_tokens, plain_cache = reference(problem, torch.bfloat16, world, shard_bias=False)
            check_draws(sampler, problem, plain_tokens, plain_cache, f"V={vocab} replicated fallback {layout}")
            small = {k: v for k, v in problem.items()}
            small.update(base=problem["base"][:4], anchor=problem["anchor"][:4],
                         idx_mapping=problem["idx_mapping"][:12], positions=problem["positions"][:12])
            ref_tokens, ref_cache = reference(small, torch.bfloat16, world)
            check_draws(sampler, small, ref_tokens, ref_cache, f"V={vocab} sharded path {layout}")
        no_fallback = ShardedMarkovSampler(problem["embed"], problem["head"], group, 3, 4, torch.bfloat16)
        try:
            run_sampler(no_fallback, problem)
        except ValueError as error:
            assert "max_rows" in str(error)
        else:
            raise AssertionError("a batch above max_rows without replicated weights must raise ValueError")


def scenario_special(rank, world):
    """NaN, -inf and ties placed across shard boundaries, at T = 0 and T > 0 (W2 = 0: z = U)."""
    group = dist.group.WORLD
    vocab, steps = 301, 2
    bounds = all_shard_bounds(vocab, world)
    rows = 6
    base = torch.randn(rows, steps, vocab, generator=torch.Generator().manual_seed(5))
    base[0] = float("-inf")  # all -inf: token 0
    base[1] = 3.0  # all equal at T = 0: token 0; at T > 0 the noise decides
    base[2, :, bounds[1][0] + 2] = float("nan")
    base[2, :, vocab - 1] = float("nan")  # the first NaN is in shard 1
    base[3, :, bounds[1][0]] = 50.0
    base[3, :, vocab - 2] = 50.0  # a tie across shards: the smaller global id wins
    base[4, :, vocab - 1] = float("inf")
    base[5, :, 0] = -0.0
    base[5, :, 1:] = float("-inf")
    base[5, :, bounds[1][0]] = 0.0  # -0.0 and +0.0 tie: the first one (token 0)
    embed = torch.randn(vocab, 16)
    head = torch.zeros(vocab, 16)
    for temps in ([0.0] * rows, [1.0] * rows, [0.0, 0.6, 1.0, 0.0, 0.6, 1.0]):
        problem = dict(embed=embed, head=head, base=base, anchor=torch.arange(rows),
                       idx_mapping=torch.arange(rows).repeat_interleave(steps),
                       positions=torch.arange(rows * steps) + 100, temperature=torch.tensor(temps),
                       seeds=torch.arange(rows, dtype=torch.int64) * 977 - 3)
        ref_tokens, ref_cache = reference(problem, torch.float32, world)
        sampler = ShardedMarkovSampler(embed, head, group, steps, rows, torch.float32, cache_layout="gathered")
        check_draws(sampler, problem, ref_tokens, ref_cache, f"special T={temps}")
        assert bool((ref_tokens >= 0).all()) and bool((ref_tokens < vocab).all())
    greedy = ref_tokens  # last loop: mixed T; rows 0, 3 greedy
    assert int(greedy[0, 0]) == 0 and int(greedy[3, 0]) == bounds[1][0] and int(greedy[2, 0]) == bounds[1][0] + 2


def scenario_setup(rank, world):
    """Set-up agreement: one rank failing makes all fall back together, or all raise together."""
    group = dist.group.WORLD
    problem = make_problem(3, 301, 5, 2, torch.float32, torch.float32)
    ref_tokens, ref_cache = reference(problem, torch.float32, world)
    last = rank == world - 1
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32,
                                   transport="all_reduce", _fail_setup_for_test=last)
    assert sampler.transport_name == "collective", "every rank must fall back together"
    assert sampler.transport_fallback_reason is not None
    check_draws(sampler, problem, ref_tokens, ref_cache, "after fallback")
    # symm_mem cannot be installed on the CPU: every rank falls back to the collective transport
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32, transport="symm_mem")
    assert sampler.transport_name == "collective" and "CUDA" in sampler.transport_fallback_reason
    check_draws(sampler, problem, ref_tokens, ref_cache, "symm_mem fallback")
    # the collective transport itself failing on one rank: every rank raises
    try:
        ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32, transport="nccl",
                             _fail_setup_for_test=last)
    except RuntimeError as error:
        assert "collective" in str(error)
    else:
        raise AssertionError("every rank must raise when the collective transport fails on one rank")
    # bad arguments on one rank only: every rank raises ValueError (none waits in a collective)
    try:
        ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32,
                             cache_layout="bogus" if last else "sharded")
    except ValueError as error:
        assert (not last) or "cache_layout" in str(error)
    else:
        raise AssertionError("a bad argument on one rank must raise on every rank")
    # ranks built with different max_rows: every rank raises ValueError
    try:
        ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8 + rank, torch.float32)
    except ValueError as error:
        assert "different" in str(error)
    else:
        raise AssertionError("mismatched construction arguments must raise on every rank")
    # a full head_weight with fewer rows than ranks: ValueError naming head_weight on every rank (it named 'vocab',
    # no argument of the sampler); V = world (one token per shard) draws the reference's tokens
    try:
        ShardedMarkovSampler(problem["embed"], problem["head"][:world - 1], group, 2, 8, torch.float32)
    except ValueError as error:
        assert str(error).startswith("head_weight: expected at least the world size"), str(error)
    else:
        raise AssertionError("a head_weight with fewer rows than ranks must raise ValueError")
    tiny = make_problem(4, world, 5, 2, torch.float32, torch.float32)
    tiny_tokens, tiny_cache = reference(tiny, torch.float32, world)
    for layout in ("sharded", "gathered"):
        sampler = ShardedMarkovSampler(tiny["embed"], tiny["head"], group, 2, 8, torch.float32, cache_layout=layout)
        assert sampler.shard_width == 1
        check_draws(sampler, tiny, tiny_tokens, tiny_cache, f"V = world {layout}")
    # the group still works afterwards
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32)
    check_draws(sampler, problem, ref_tokens, ref_cache, "after failures")


def scenario_extremes(rank, world):
    """Legal inputs at the ends of the ranges (W2 = 0: z = U), against the reference, both layouts, fp32 and bf16:
    subnormal temperatures (1 / T overflows fp32, z / T finite), T = fp32 max, T = 0 mixed with sampled rows, a shard
    entirely -inf, +inf tied across a shard boundary, NaNs, seeds and positions at both ends of int64, padding by -1
    and by a slot outside [0, S) (check_values=False), an empty batch and S = 0."""
    group = dist.group.WORLD
    fmax = torch.finfo(torch.float32).max
    for vocab in (301, 10):
        bounds = all_shard_bounds(vocab, world)
        rows, steps = 8, 2
        gen = torch.Generator().manual_seed(vocab)
        base = torch.randn(rows, steps, vocab, generator=gen)
        base[0] = float("-inf")
        base[1, :, bounds[1][0]:bounds[1][1]] = float("-inf")  # shard 1 holds only -inf
        base[2, :, bounds[-1][0]] = float("nan")
        base[3, :, bounds[1][0]] = float("inf")
        base[3, :, bounds[0][1] - 1] = float("inf")  # tied at +inf across the boundary: the smaller id wins
        base[4] = 0.0
        base[5, :, :bounds[1][0]] = float("-inf")
        base[6] *= 1e-3
        idx = torch.arange(rows).repeat_interleave(steps)
        idx[2 * steps:3 * steps] = -1
        idx[7 * steps:] = 99  # outside [0, S): padding (check_values=False)
        positions = torch.tensor([-(2**63), 2**63 - 1, 0, 1, 2**31, 2**32 + 1, -1, 5]).repeat_interleave(steps)
        seeds = torch.tensor([-(2**63), 2**63 - 1, 0, -1, 2**62, 12345, -(2**62), 7, 9, 11])
        for temps in ([0.0, 1e-45, 2e-39, fmax, 1.0, 1e-40, 0.5, 0.0, 1e-45, 2.0], [1e-45] * 10, [fmax] * 10):
            for logit_dtype, cache_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)):
                problem = dict(embed=torch.randn(vocab + 3, 16, generator=gen), head=torch.zeros(vocab, 16),
                               base=base.to(logit_dtype), anchor=torch.arange(rows), idx_mapping=idx,
                               positions=positions, temperature=torch.tensor(temps), seeds=seeds)
                ref_tokens, ref_cache = reference(problem, cache_dtype, world)
                for layout in ("sharded", "gathered"):
                    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, steps, rows, cache_dtype,
                                                   cache_layout=layout)
                    out = sampler.sample(*[problem[name] for name in ("base", "anchor", "idx_mapping", "positions",
                                                                      "temperature", "seeds")], check_values=False)
                    label = f"extremes V={vocab} T={temps[:4]} {cache_dtype} {layout}"
                    assert torch.equal(out.draft_tokens, ref_tokens), f"{label}: {out.draft_tokens} {ref_tokens}"
                    expected = ref_cache if layout == "gathered" else ref_cache[:, :, sampler.vocab_start:sampler.vocab_end]
                    assert torch.equal(bits(out.logits_cache), bits(expected)), f"{label}: cache"
        assert int(ref_tokens[0, 0]) == 0  # (the last loop: T = fp32 max) an all -inf row gives token 0
        # an empty batch, and S = 0 (every row padding)
        sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, steps, rows, torch.float32)
        out = sampler.sample(base[:0], problem["anchor"][:0], idx[:0], positions[:0], problem["temperature"], seeds)
        assert out.draft_tokens.shape == (0, steps)
        empty = dict(problem, base=base, idx_mapping=torch.full_like(idx, -1), temperature=torch.zeros(0),
                     seeds=torch.zeros(0, dtype=torch.int64))
        ref_tokens, _ = reference(empty, torch.float32, world)
        out = sampler.sample(*[empty[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature",
                                                        "seeds")])
        assert torch.equal(out.draft_tokens, ref_tokens) and out.logits_cache.shape[0] == 0


def scenario_cache_overlap(rank, world):
    """A caller's logits_cache whose slots share memory (an expanded view) is rejected with ValueError on every rank,
    as MarkovSampler rejects it, in both layouts; it used to be written silently, each slot over the others."""
    group = dist.group.WORLD
    problem = make_problem(3, 301, 4, 2, torch.float32, torch.float32)
    args = [problem[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]
    slots = problem["temperature"].shape[0]
    for layout in ("sharded", "gathered"):
        sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32,
                                       cache_layout=layout)
        width = sampler.shard_width if layout == "sharded" else 301
        cache = torch.zeros(1, 2, width).expand(slots, 2, width)
        try:
            sampler.sample(*args, logits_cache=cache)
        except ValueError as error:
            assert str(error).startswith("logits_cache: slots overlap"), str(error)
        else:
            raise AssertionError(f"{layout}: an expanded logits_cache must raise ValueError")
    # the group still works
    ref_tokens, ref_cache = reference(problem, torch.float32, world)
    check_draws(sampler, problem, ref_tokens, ref_cache, "after the rejected cache")


SCENARIOS = {"main": scenario_main, "special": scenario_special, "setup": scenario_setup,
             "extremes": scenario_extremes, "cache_overlap": scenario_cache_overlap}


def worker(rank, world, init_file, scenarios, done_dir, vocabs):
    torch.set_num_threads(1)
    # (a generous group timeout: 2 busy CI cores slow every rank; a hang still fails at the test's join deadline)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=180))
    try:
        for name in scenarios:
            if name == "main":
                scenario_main(rank, world, vocabs)
            else:
                SCENARIOS[name](rank, world)
            dist.barrier()
        open(os.path.join(done_dir, f"rank{rank}.ok"), "w").close()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group_and_exit()
