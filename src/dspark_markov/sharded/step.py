"""One draft step on one vocabulary shard: bias, logits, cache row, local Gumbel winner.

:func:`_shard_step` is the unit a Triton (or CUDA) shard kernel replaces: it reads one step's base
logits of the shard, the previous tokens and the per-row keys, and writes two outputs, the cached
logits of the shard and one packed (key, global id) word per row. Everything after the bias is
elementwise or a row reduction, so the draw is bit-identical to
:func:`dspark_markov.draft.reference.gumbel_keys` / ``argmax_first`` applied to the whole row.
"""

from __future__ import annotations

import torch

from ..draft.reference import argmax_first, gumbel_keys
from .keys import pack_keys


def _shard_bias(shard_head, prev: torch.Tensor) -> torch.Tensor:
    """``[R, V_shard]`` bias in the weight dtype: fp32 accumulation, one rounding, then ``scale``.

    On CUDA, one cuBLAS GEMM in the weight dtype (fp32 accumulate); on the CPU the reference formula
    (:meth:`MarkovHead.bias`). Summation order is free (SPEC.md section 3).
    """
    if shard_head.device.type == "cuda":
        return shard_head.bias_fast(prev)
    return shard_head.bias(prev)


def _shard_step(shard_head, base_step, prev, temp, seed, position, step: int, shard_tokens, z_out, packed_out):
    """Compute one step of the chain on one vocabulary shard.

    Parameters
    ----------
    shard_head : :class:`~dspark_markov.MarkovHead` holding the full W1 ``[V_t, R_k]`` and this
        rank's W2 rows ``[V_shard, R_k]`` (and the head's ``scale``).
    base_step : ``[R, V_shard]`` bf16/fp32 base logits of this step, this shard's columns.
    prev : ``[R]`` int64 previous tokens (global ids in ``[0, V_t)``).
    temp : ``[R]`` fp32 temperatures (0 = greedy; padding rows already 0).
    seed, position : ``[R]`` int64 slot seeds and predicted positions (padding rows: seed 0).
    step : the draft step index ``i`` (keys the noise).
    shard_tokens : ``[V_shard]`` int64 global token ids of the shard's columns (keys the noise).
    z_out : ``[R, V_shard]`` output in the cache dtype, ``round(U + bias)``.
    packed_out : ``[R]`` int64 output, the row's best candidate packed by
        :func:`~dspark_markov.sharded.keys.pack_keys` (NaN-aware, first maximum by global id).

    Bytes (a fused kernel's floor): ``V_shard R_k w`` (W2 shard) ``+ R V_shard (u + c)`` (base
    logits in, cache row out) ``+ 8 R`` (packed word), ``w``/``u``/``c`` the weight, base-logit and
    cache element sizes. This torch version also round-trips the bias and fp32 keys through memory
    and allocates temporaries, so it is not CUDA-graph friendly; the kernel that replaces it must be.
    """
    bias = _shard_bias(shard_head, prev)  # [R, V_shard] weight dtype
    z_out.copy_(base_step.float() + bias.float())  # one rounding into the cache dtype
    keys = gumbel_keys(z_out, temp, seed, step, position, tokens=shard_tokens)  # [R, V_shard] fp32
    local = argmax_first(keys)  # [R] first NaN, else first maximum, all -inf -> 0
    best = keys.gather(1, local[:, None])[:, 0]
    packed_out.copy_(pack_keys(best, shard_tokens[local]))
