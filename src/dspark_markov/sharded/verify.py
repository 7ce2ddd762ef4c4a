"""Verification quantities from a vocabulary-sharded cache, without gathering it.

``verify_drafts`` (SPEC.md section 6) needs ``q_i(x_i) = softmax(cache[slot, i] / T)[x_i]`` for each
draft. With the cache sharded by vocabulary, each rank holds ``[M, V_shard]`` of the rows. The
softmax splits into per-rank partial results combined by two small all-reduces over ``[M]``:

1. ``MAX`` of one packed (key, global id) word per row (:mod:`~dspark_markov.sharded.keys`): the
   global row maximum of ``cache / T``, whether the row has a NaN, and (for ``T = 0`` rows) the
   global argmax, all in one int64;
2. ``SUM`` of ``[2, M]`` fp32: ``sum_v exp(cache_v / T - max)`` over the shard, and
   ``exp(cache_x / T - max)`` from the rank that owns token ``x`` (0 elsewhere).

Bytes over the link: ``8 M + 8 M`` per rank and hop instead of ``M V c`` for gathering the rows.
The only difference from computing the softmax of the full row is the order of the fp32 sum.
Before them (``agree_checks``, the default) one all-reduce of three int64 agrees every rank's argument
checks and M, so a call rejected on one rank raises on all of them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ..draft.reference import argmax_first, scaled_logits
from ..validate import check_tensor
from .keys import pack_keys, unpack_key, unpack_token, INT32_MAX
from .transport import agree_call, flag_device


class ShardedSoftmaxStats(NamedTuple):
    row_max: torch.Tensor  # [M] fp32, global max of cache / T (NaN if the row has a NaN)
    row_sumexp: torch.Tensor  # [M] fp32, global sum of exp(cache / T - row_max)
    argmax: torch.Tensor  # [M] int64, global torch.argmax of the row (NaN-aware)


def _check(cache_rows, temperature, tokens, group, agree_checks):
    """This rank's argument checks, then (``agree_checks``) one all-reduce that makes every rank raise together if
    any rank rejected its arguments or the ranks' M differ (a rank raising alone leaves its peers in the next
    all-reduce until the group's timeout; different M abort gloo)."""
    error = None
    try:
        check_tensor("cache_rows", cache_rows, dim=2, dtypes=(torch.bfloat16, torch.float32))
        rows = cache_rows.shape[0]
        check_tensor("temperature", temperature, shape=(rows,), dtypes=(torch.float32,), device=cache_rows.device)
        if tokens is not None:
            check_tensor("tokens", tokens, shape=(rows,), dtypes=(torch.int32, torch.int64), device=cache_rows.device)
    except Exception as caught:  # noqa: BLE001 - voted on, then raised on every rank
        error = caught
    if not agree_checks:
        if error is not None:
            raise error
        return
    device = cache_rows.device if isinstance(cache_rows, torch.Tensor) else None  # (None: the backend's device)
    agree_call(error, cache_rows.shape[0] if error is None else -1, group,
               flag_device(group if group is not None else dist.group.WORLD, device),
               "cache_rows: ranks were called with different row counts M")


def _global_max_word(scaled, vocab_start: int, group):
    local = argmax_first(scaled)  # [M]
    best = scaled.gather(1, local[:, None])[:, 0]
    word = pack_keys(best, local + vocab_start)
    dist.all_reduce(word, op=dist.ReduceOp.MAX, group=group)
    return word


def sharded_softmax_stats(cache_rows, temperature, vocab_start: int, group=None, *,
                          agree_checks: bool = True) -> ShardedSoftmaxStats:
    """Global max, sum-exp and argmax of ``cache / T`` from this rank's shard of each row.

    Parameters
    ----------
    cache_rows : ``[M, V_shard]`` bf16/fp32, this rank's columns ``[vocab_start, vocab_start +
        V_shard)`` of M cached rows (e.g. ``cache_shard[slots, steps]``).
    temperature : ``[M]`` fp32 per row (0 = greedy: the stats are of the unscaled row).
    vocab_start : the global id of this shard's first column. group : the process group.

    agree_checks : agree the argument checks and M across ranks first (default ``True``): one more
        all-reduce of three int64 (a host sync on NCCL), after which arguments rejected on any rank, or
        a different M on some rank, raise the same ``ValueError`` on every rank. ``False`` saves it; the
        checks are then local: a rank that raises leaves its peers in the next all-reduce until the
        group's timeout, so every rank must pass valid arguments with the same M.

    Collective: every rank of ``group`` must call it with the same M. Two all-reduces (three with
    ``agree_checks``); allocates, so not for CUDA-graph capture as written.
    """
    _check(cache_rows, temperature, None, group, agree_checks)
    scaled = scaled_logits(cache_rows, temperature)
    word = _global_max_word(scaled, vocab_start, group)
    row_max = unpack_key(word)
    sumexp = torch.exp(scaled - row_max[:, None]).sum(dim=-1)
    dist.all_reduce(sumexp, op=dist.ReduceOp.SUM, group=group)
    return ShardedSoftmaxStats(row_max, sumexp, unpack_token(word))


def sharded_token_probability(cache_rows, tokens, temperature, vocab_start: int, group=None, *,
                              agree_checks: bool = True) -> torch.Tensor:
    """``q(x) = softmax(cache / T)[x]`` per row from vocabulary shards, via two ``[M]`` all-reduces.

    Parameters
    ----------
    cache_rows : ``[M, V_shard]`` bf16/fp32 shard columns of M cached rows (see
        :func:`sharded_softmax_stats`).
    tokens : ``[M]`` int32/int64 global token ids ``x`` (owned by whichever rank).
    temperature : ``[M]`` fp32. ``T = 0`` rows give the greedy distribution: 1.0 if ``x`` is the
        row's ``torch.argmax``, else 0.0.
    vocab_start : global id of this rank's first column. group : the process group.
    agree_checks : as for :func:`sharded_softmax_stats` (default ``True``: one more small all-reduce).

    Returns
    -------
    ``[M]`` fp32 on every rank (identical everywhere). A row with a NaN gives NaN at ``T > 0``, as
    ``torch.softmax`` does. Collective; allocates (not CUDA-graph safe as written).
    """
    _check(cache_rows, temperature, tokens, group, agree_checks)
    scaled = scaled_logits(cache_rows, temperature)
    width = scaled.shape[1]
    word = _global_max_word(scaled, vocab_start, group)
    row_max = unpack_key(word)
    weights = torch.exp(scaled - row_max[:, None])  # [M, V_shard]
    local_token = tokens.long() - vocab_start
    owned = (local_token >= 0) & (local_token < width)
    picked = weights.gather(1, local_token.clamp(0, width - 1)[:, None])[:, 0]
    sums = torch.stack([weights.sum(dim=-1), torch.where(owned, picked, torch.zeros_like(picked))])  # [2, M]
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    probability = sums[1] / sums[0]
    has_nan = (word >> 32) == INT32_MAX
    probability = torch.where(has_nan, torch.full_like(probability, float("nan")), probability)
    greedy = (tokens.long() == unpack_token(word)).float()
    return torch.where(temperature == 0, greedy, probability)
