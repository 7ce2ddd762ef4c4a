"""``impl="gumbel_fused"``: the bias add fused into the Gumbel kernel, plus one combine kernel.

Per step (three launches; before step 0 one clamp and one embedding gather):

1. ``bias = W2 @ codes`` (cuBLAS into a persistent weight-dtype buffer);
2. one Triton kernel per (row, vocabulary block): ``z = round_cache(float(U) + float(bias))``
   (``scale`` applied in-kernel), the cache rows of live samples, keys ``z / T + g`` and each
   block's ``(max key, first index)`` — ranked first by approximate noise
   (:mod:`dspark_markov.ops.filter`), so exact keys are computed only for each block's winner unless the
   ranking is not conclusive;
3. one Triton kernel per row: the ``torch.argmax``-semantics combine of the block partials,
   ``draft_tokens[r, i]``, ``prev[r]`` and the next step's codes ``W1[token]`` (so no separate
   gather before the next GEMM).

Draws and cached logits are bit-identical to ``impl="loop"`` (same GEMM, same rounding, same keys;
the filter changes the arithmetic, not the result).
"""

from __future__ import annotations

import torch

from .bias_gemm import clamp_anchor
from .triton_blocks import GumbelBlocksBackend, launch_combine, launch_gumbel_blocks


class GumbelFusedBackend(GumbelBlocksBackend):
    """Backend of ``impl="gumbel_fused"`` (Gumbel-max only); parameters as
    :class:`~.triton_blocks.GumbelBlocksBackend`, plus ``noise_filter`` (rank each block by
    approximate noise first, :mod:`dspark_markov.ops.filter`; the draws are the same either way)."""

    NAME = "gumbel_fused"

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block=None, noise_filter=True):
        super().__init__(head, num_steps, max_rows, method=method, cache_dtype=cache_dtype, device=device,
                         block=block)
        self.noise_filter = bool(noise_filter)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` and write ``logits_cache`` ``[S, N, V]`` (see the module)."""
        rows = base_logits.shape[0]
        clamp_anchor(anchor, self.prev, self.head.embed_vocab_size)
        self.gemm.gather(self.prev[:rows], rows)
        for step in range(self.num_steps):
            bias_rows = self.gemm.compute(rows)  # [rows, V] weight dtype, unscaled
            launch_gumbel_blocks(base_logits, base_logits.stride(0), base_logits.stride(1), bias_rows,
                                 self.head.scale, idx_mapping, positions, temperature, seeds, logits_cache,
                                 self.block_max, self.block_token, rows=rows, step=step,
                                 num_steps=self.num_steps, block=self.block, add_bias=True,
                                 filter=self.noise_filter)
            # The combine writes the codes of the fp32 (CPU) or weight-dtype (CUDA) GEMM input.
            launch_combine(self.block_max, self.block_token, draft_tokens, self.prev, self.gemm.gemm_embed,
                           self.gemm.codes, rows=rows, step=step, vocab=self.head.vocab_size,
                           gather=step + 1 < self.num_steps)
