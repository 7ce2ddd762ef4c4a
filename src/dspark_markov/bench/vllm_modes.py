"""The baselines of the drafting modes (issue 17): vLLM 0.33.0's loops with a reduced vocabulary and top-k.

Built as :mod:`.vllm_loop` builds the dense loop: vLLM's lines on the benchmark's buffers, with the
real ``gumbel_sample`` (:func:`.vllm_loop.load_gumbel_sample`). ``DSparkSpeculator`` runs

- a reduced vocabulary (``_sample_sequential`` + ``_sample_logits``), per step: ``W1[prev]``,
  ``F.linear`` bias in draft space, the bf16 add, ``buf.index_copy_(1, d2t_scatter_index, logits)``
  into a target-width scratch that is ``-inf`` once, ``gumbel_sample`` on it;
- top-k drafting (``_sample_sequential_topk``): ``base_logits.topk(k)`` once, ``base_logits.fill_(-inf)``,
  then per step ``W1[prev]``, ``W2[index]`` gathered, ``values.clone().baddbmm_(W2[index], W1[prev],
  alpha=scale)``, ``scatter_`` into the ``-inf`` row, (the d2t ``index_copy_``,) ``gumbel_sample``.

The top-k loop fills a scratch buffer of the base logits' shape instead of the benchmark's input
(vLLM fills its freshly computed logits; same bytes), so the input stays valid across replays.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class VllmModesLoop:
    """vLLM 0.33.0's loop of a reduced-vocabulary head (``head.d2t``) and/or top-k drafting.

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` (``d2t`` optional).
    num_steps, max_rows : N and the largest batch (the scratch buffers' sizes, as vLLM's).
    gumbel_sample : vLLM's function.
    draft_top_k : ``dspark_draft_topk`` or ``None`` (dense).
    logits_dtype : dtype of the base logits (the top-k scratch's).

    :meth:`run` takes the SPEC.md buffers (``base_logits [R, N, V_d]``, the cache ``[S, N, V_t]`` in
    the logits' dtype). CUDA-graph capturable as vLLM's loop is.
    """

    def __init__(self, head, num_steps: int, max_rows: int, gumbel_sample, *, draft_top_k=None,
                 logits_dtype=torch.bfloat16):
        self.embed = head.embed_weight
        self.weight = head.head_weight
        self.scale = head.scale
        self.num_steps = int(num_steps)
        self.gumbel_sample = gumbel_sample
        self.top_k = draft_top_k
        device = head.device
        self.step_cols = torch.arange(self.num_steps, dtype=torch.int32, device=device)
        self.scatter_index = head.d2t_index  # vLLM's _d2t_scatter_index = arange + d2t
        self.scatter_buf = None
        if self.scatter_index is not None:
            self.scatter_buf = torch.full((max_rows, head.cache_vocab_size), float("-inf"), dtype=logits_dtype,
                                          device=device)
        self.topk_scratch = None
        if draft_top_k is not None:
            self.topk_scratch = torch.empty(max_rows, self.num_steps, head.draft_vocab_size, dtype=logits_dtype,
                                            device=device)

    def _sample(self, logits, idx_map, temperature, seeds, sample_pos, step, logits_cache):
        if self.scatter_buf is not None:
            buf = self.scatter_buf[: logits.shape[0]]
            buf.index_copy_(1, self.scatter_index, logits.to(buf.dtype))
            logits = buf
        return self.gumbel_sample(logits, idx_map, temperature, seeds, sample_pos - 1, apply_temperature=True,
                                  is_drafting=True, logits_cache=logits_cache, logits_cache_col=self.step_cols[step],
                                  use_fp64=False)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        rows, n_spec, _ = base_logits.shape
        idx_map = idx_mapping.view(rows, n_spec)
        sample_pos = positions.view(rows, n_spec)
        prev = anchor
        if self.top_k is not None:
            values, index = base_logits.topk(self.top_k, dim=-1)
            dense = self.topk_scratch[:rows]
            dense.fill_(float("-inf"))
        for i in range(n_spec):
            markov_embed = F.embedding(prev, self.embed)
            if self.top_k is not None:
                weight = self.weight[index[:, i]]
                corrected = values[:, i].unsqueeze(-1).clone()
                corrected.baddbmm_(weight, markov_embed.unsqueeze(-1), beta=1.0, alpha=self.scale)
                logits_i = dense[:, i].scatter_(1, index[:, i], corrected.squeeze(-1))
            else:
                bias = F.linear(markov_embed, self.weight)
                if self.scale != 1.0:
                    bias *= self.scale
                logits_i = base_logits[:, i] + bias
            sampled = self._sample(logits_i, idx_map[:, i], temperature, seeds, sample_pos[:, i], i, logits_cache)
            draft_tokens[:rows, i] = sampled
            prev = sampled
