"""Processes of ``test_sharded_agreement.py``: per-call checks of ShardedMarkovSampler agreed by all ranks.

One rank gets a bad argument (or a different batch size); every rank must raise the same
``ValueError`` from the same call, and the group must still work afterwards. Without the agreement
the good ranks wait in the step's collective until the process group's timeout (30 s here), so a
regression fails by timing out instead of passing.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

from dspark_markov.draft.reference import argmax_first
from dspark_markov.sharded import ShardedMarkovSampler, all_shard_bounds, sharded_softmax_stats, sharded_token_probability
from dspark_markov.verify.reference import draft_distribution
from tests.helpers import leave_process_group_and_exit
from tests.sharded.worker import make_problem, reference

GROUP_TIMEOUT_S = 30


def expect_error(sampler, args, kwargs, match, label):
    started = time.monotonic()
    try:
        sampler.sample(*args, **kwargs)
    except ValueError as error:
        message = str(error)
        assert message.startswith(match), f"{label}: expected '{match}...', got {message!r}"
        assert "rank" in message, f"{label}: the message should say which rank rejected the call: {message!r}"
    else:
        raise AssertionError(f"{label}: every rank must raise")
    assert time.monotonic() - started < GROUP_TIMEOUT_S / 2, f"{label}: the ranks waited for the group timeout"


def scenario(rank, world):
    group = dist.group.WORLD
    last = rank == world - 1
    problem = make_problem(3, 301, 4, 2, torch.float32, torch.float32)
    ref_tokens, _ = reference(problem, torch.float32, world)
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32)
    args = [problem[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]

    def bad(index, value):
        call = list(args)
        if last:
            call[index] = value
        return call

    seeds = args[5]
    strided_seeds = torch.stack([seeds, seeds], dim=1).reshape(-1)[::2]
    expect_error(sampler, bad(5, strided_seeds), {}, "seeds: expected a contiguous", "strided seeds on one rank")
    anchor = args[1].clone()
    anchor[0] = 10**6
    expect_error(sampler, bad(1, anchor), {}, "anchor: expected values in", "anchor out of range on one rank")
    expect_error(sampler, bad(0, args[0][:, :1]), {}, "idx_mapping: expected shape (4,)", "wrong N on one rank")
    # a different batch size on one rank (each call is valid on its own)
    call = list(args)
    if last:
        call = [args[0][:3], args[1][:3], args[2][:6], args[3][:6], args[4], args[5]]
    expect_error(sampler, call, {}, "base_logits: ranks were called with different batch sizes",
                 "different R per rank")
    # rows above max_rows without replicated weights: every rank rejects it, one rank alone too
    big = [torch.cat([a] * 3) if i < 4 else a for i, a in enumerate(args)]
    big[2] = torch.arange(12).repeat_interleave(2)
    big[4], big[5] = torch.ones(12), torch.arange(12, dtype=torch.int64)
    expect_error(sampler, big, {}, "base_logits: expected at most max_rows", "too many rows on every rank")
    # the group still works, and the draws are the reference's
    out = sampler.sample(*args)
    assert torch.equal(out.draft_tokens, ref_tokens)
    sampler.check()  # collective; nothing failed on the device
    # without value checks an anchor outside [0, V_t) is clamped and a slot outside [0, S) is padding, on every rank
    # as in the reference (stop 45: both raised IndexError)
    loose = dict(problem, anchor=problem["anchor"].clone(), idx_mapping=problem["idx_mapping"].clone())
    loose["anchor"][0] = 10**6
    loose["idx_mapping"][4:6] = 99
    loose_tokens, _ = reference(loose, torch.float32, world)
    call = [loose[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]
    assert torch.equal(sampler.sample(*call, check_values=False).draft_tokens, loose_tokens)
    # agree_checks=False keeps the old, collective-free behaviour: a good call still works
    quiet = ShardedMarkovSampler(problem["embed"], problem["head"], group, 2, 8, torch.float32, agree_checks=False)
    assert torch.equal(quiet.sample(*args).draft_tokens, ref_tokens)


def expect_construction_error(kwargs, match, label):
    """Building a sampler with ``kwargs`` raises ValueError starting with ``match`` on every rank, quickly."""
    problem = make_problem(3, 301, 4, 2, torch.float32, torch.float32)
    started = time.monotonic()
    try:
        ShardedMarkovSampler(problem["embed"], problem["head"], dist.group.WORLD, 2, 8, torch.float32, **kwargs)
    except ValueError as error:
        assert str(error).startswith(match), f"{label}: expected '{match}...', got {str(error)!r}"
    else:
        raise AssertionError(f"{label}: every rank must raise")
    assert time.monotonic() - started < GROUP_TIMEOUT_S / 2, f"{label}: the ranks waited for the group timeout"


def scenario_config(rank, world):
    """Construction arguments that decide which collectives a call runs must agree across ranks: a rank built with
    another transport or another agree_checks used to construct fine, then the first call's collectives did not
    match (gloo: both ranks timed out after the group timeout). Now every rank raises ValueError at construction.
    Sizes go through check_int (a float vocab_size / fallback_max_rows was truncated)."""
    last = rank == world - 1
    expect_construction_error({"transport": "all_reduce" if last else "collective"}, "group: ranks were built with",
                              "a different transport on one rank")
    expect_construction_error({"agree_checks": not last}, "group: ranks were built with",
                              "a different agree_checks on one rank")
    # (stop 50) a per-rank scale constructed fine and drew other tokens than the reference's
    expect_construction_error({"scale": 0.5 if last else 0.5000001}, "group: ranks were built with",
                              "a different scale on one rank")
    # sizes are ints, never truncated: vocab_size=301.7 built a V = 301 sampler, fallback_max_rows=2.5 a limit of 2
    expect_construction_error({"vocab_size": 301.7}, "vocab_size: expected an int", "a float vocab_size")
    expect_construction_error({"fallback_max_rows": 2.5}, "fallback_max_rows: expected an int", "a float limit")
    expect_construction_error({"fallback_max_rows": 0}, "fallback_max_rows: expected an int >= 1", "a zero limit")
    # "nccl" is the collective transport's alias: the same transport
    problem = make_problem(3, 301, 4, 2, torch.float32, torch.float32)
    ref_tokens, _ = reference(problem, torch.float32, world)
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], dist.group.WORLD, 2, 8, torch.float32,
                                   transport="nccl" if last else "collective")
    args = [problem[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]
    assert torch.equal(sampler.sample(*args).draft_tokens, ref_tokens)


def scenario_fallback_impl(rank, world):
    """fallback_impl is checked when the sampler is built, and the replicated sampler it names is built inside the
    call's agreed checks. A bad name used to be accepted until the first batch above max_rows; a design that cannot run
    here on one rank only (cuda_chain with CPU weights) raised on that rank alone while the others went on into
    check()'s collective and waited for the group timeout."""
    expect_construction_error({"fallback_impl": "bogus"}, "fallback_impl: expected one of", "an unknown fallback_impl")
    last = rank == world - 1
    problem = make_problem(5, 301, 6, 2, torch.float32, torch.float32)
    args = [problem[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]
    sampler = ShardedMarkovSampler(problem["embed"], problem["head"], dist.group.WORLD, 2, 4, torch.float32,
                                   replicated_head_weight=problem["head"],
                                   fallback_impl="cuda_chain" if last else "reference")
    expect_error(sampler, args, {}, "fallback_impl: impl: 'cuda_chain' runs on cuda", "a fallback design that cannot run on one rank")
    # the group still works: a batch within max_rows takes the sharded path
    small = dict(problem, base=problem["base"][:4], anchor=problem["anchor"][:4],
                 idx_mapping=problem["idx_mapping"][:8], positions=problem["positions"][:8])
    ref_tokens, _ = reference(small, torch.float32, world)
    call = [small[name] for name in ("base", "anchor", "idx_mapping", "positions", "temperature", "seeds")]
    assert torch.equal(sampler.sample(*call).draft_tokens, ref_tokens)


def scenario_verify(rank, world):
    """sharded_softmax_stats / sharded_token_probability agree their argument checks and row count M across ranks: a
    rank whose arguments were rejected raised alone while its peers waited in the first all-reduce until the group
    timeout, and a different M on one rank aborted a gloo process (SIGABRT). Now every rank raises the same ValueError."""
    group = dist.group.WORLD
    last = rank == world - 1
    start, end = all_shard_bounds(301, world)[rank]
    full = torch.randn(6, 301, generator=torch.Generator().manual_seed(9))
    rows, tokens, temp = full[:, start:end], torch.arange(6) * 50, torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 1.0])
    calls = {"stats": lambda r, t, T: sharded_softmax_stats(r, T, start, group),
             "probability": lambda r, t, T: sharded_token_probability(r, t, T, start, group)}
    for name, call in calls.items():
        for label, args, match in (
                ("fp64 temperature on one rank", (rows, tokens, temp.double() if last else temp),
                 "temperature: expected dtype float32"),
                ("another M on one rank", (rows[:5], tokens[:5], temp[:5]) if last else (rows, tokens, temp),
                 "cache_rows: ranks were called with different row counts M")):
            started = time.monotonic()
            try:
                call(*args)
            except ValueError as error:
                assert str(error).startswith(match), f"{name}, {label}: {str(error)!r}"
            else:
                raise AssertionError(f"{name}, {label}: every rank must raise")
            assert time.monotonic() - started < GROUP_TIMEOUT_S / 2, f"{name}, {label}: waited for the group timeout"
    # the group still works, with the full softmax's values
    q = sharded_token_probability(rows, tokens, temp, start, group)
    expected = draft_distribution(full[:, None], temp)[:, 0].gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(q, expected, rtol=2 * 301 * 2.0**-24, atol=0.0)
    assert torch.equal(sharded_softmax_stats(rows, temp, start, group).argmax, argmax_first(full))


SCENARIOS = {"calls": scenario, "config": scenario_config, "fallback_impl": scenario_fallback_impl,
             "verify": scenario_verify}


def worker(rank, world, init_file, done_dir, names=("calls",)):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        for name in names:
            SCENARIOS[name](rank, world)
            dist.barrier()
        dist.barrier()
        open(os.path.join(done_dir, f"rank{rank}.ok"), "w").close()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group_and_exit()
