"""``impl="loop"``: the speculator's per-step loop, as fast as it really is (SPEC.md sections 1-4).

Per step, on persistent buffers (nothing is allocated in :meth:`LoopBackend.run`):

1. ``codes = W1[prev]`` (``torch.index_select``);
2. ``bias = W2 @ codes`` (cuBLAS, weight dtype; ``* scale`` in torch when ``scale != 1``);
3. ``z = round_cache(float(U[:, i]) + float(bias))`` (one torch add into ``[max_rows, V]``);
4. a Triton kernel per (row, vocabulary block): keys ``z / T + g``, the cache rows of live
   samples, and each block's ``(max key, first index)``;
5. ``torch.argmax`` over the block maxima (it prefers the first NaN, then the first maximum);
6. ``torch.gather`` of the winning block's index into ``prev``;
7. a copy into ``draft_tokens[:, i]``.

This is the baseline every other design is measured against; its draws and cached logits are
bit-identical to ``impl="gumbel_fused"``.
"""

from __future__ import annotations

import torch

from .bias_gemm import clamp_anchor
from .triton_blocks import GumbelBlocksBackend, launch_gumbel_blocks


class LoopBackend(GumbelBlocksBackend):
    """Backend of ``impl="loop"`` (Gumbel-max only); parameters as
    :class:`~.triton_blocks.GumbelBlocksBackend`. Adds the step's logits buffer ``z``
    ``[max_rows, V]`` and the winning block per row ``[max_rows, 1]``."""

    NAME = "loop"

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block=None):
        super().__init__(head, num_steps, max_rows, method=method, cache_dtype=cache_dtype, device=device, block=block)
        self.z = torch.zeros(self.max_rows, head.vocab_size, dtype=cache_dtype, device=device)  # [max_rows, V]
        self.winner = torch.zeros(self.max_rows, 1, dtype=torch.int64, device=device)  # winning block

    def _logits(self, base_logits, step, rows):
        """``z[:rows] = round_cache(float(U[:, step]) + float(bias))`` with one rounding."""
        bias = self.gemm.compute(rows)
        if self.head.scale != 1.0:
            torch.mul(bias, self.head.scale, out=bias)  # fp32 product, rounded to the weight dtype
        z = self.z[:rows]
        logits = base_logits[:, step]
        if torch.promote_types(logits.dtype, bias.dtype) == torch.float32 or self.cache_dtype != torch.float32:
            # Computed in the promoted dtype: fp32 when either side is fp32; a bf16 + bf16 sum is
            # formed in fp32 and rounded once to bf16.
            torch.add(logits, bias, out=z)
        else:  # bf16 + bf16 into an fp32 cache: the sum must stay fp32, not pass through bf16
            z.copy_(logits)
            z.add_(bias)
        return z

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` and write ``logits_cache`` ``[S, N, V]`` (see the module)."""
        rows = base_logits.shape[0]
        prev = self.prev[:rows]
        clamp_anchor(anchor, self.prev, self.head.embed_vocab_size)
        block_max = self.block_max[:rows]
        block_token = self.block_token[:rows]
        winner = self.winner[:rows]
        for step in range(self.num_steps):
            self.gemm.gather(prev, rows)
            z = self._logits(base_logits, step, rows)
            launch_gumbel_blocks(z, z.stride(0), 0, self.gemm.bias, 1.0, idx_mapping, positions, temperature,
                                 seeds, logits_cache, self.block_max, self.block_token, rows=rows, step=step,
                                 num_steps=self.num_steps, block=self.block, add_bias=False)
            torch.argmax(block_max, dim=1, keepdim=True, out=winner)
            torch.gather(block_token, 1, winner, out=prev.unsqueeze(1))
            draft_tokens[:, step].copy_(prev)
