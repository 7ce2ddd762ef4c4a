"""``impl="gumbel_fused"``: the bias add fused into the Gumbel kernel, plus one combine kernel.

Per step (three launches; before step 0 one clamp and one embedding gather):

1. ``bias = W2 @ codes`` (cuBLAS into a persistent weight-dtype buffer);
2. one Triton kernel per (row, vocabulary block): ``z = round_cache(float(U) + float(bias))``
   (``scale`` applied in-kernel), the cache rows of live samples, keys ``z / T + g`` and each
   block's ``(max key, first index)`` — ranked first by approximate noise
   (:mod:`.gumbel_filter`), so exact keys are computed only for each block's winner unless the
   ranking is not conclusive;
3. one Triton kernel per row: the ``torch.argmax``-semantics combine of the block partials,
   ``draft_tokens[r, i]``, ``prev[r]`` and the next step's codes ``W1[token]`` (so no separate
   gather before the next GEMM).

Draws and cached logits are bit-identical to ``impl="loop"`` (same GEMM, same rounding, same keys;
the filter changes the arithmetic, not the result).
"""

from __future__ import annotations

import torch

from .triton_common import BiasGemm, clamp_anchor, default_block, launch_combine, launch_gumbel_blocks, num_blocks


class GumbelFusedBackend:
    """Backend of ``impl="gumbel_fused"`` (Gumbel-max only).

    Parameters
    ----------
    head : MarkovHead on ``device``. num_steps : N. max_rows : the largest R of a call.
    method : ``"gumbel"``. cache_dtype : bf16 or fp32. device : ``cuda`` (or ``cpu`` with
        ``TRITON_INTERPRET=1``).
    block : vocabulary block of the Gumbel kernel (power of two; default 2048 on CUDA, 1024 when
        ``max_rows`` x blocks would not fill the SMs, 256 on CPU).

    :meth:`run` launches kernels only and reads every per-call value from its tensor arguments,
    so it can be captured in a CUDA graph.
    """

    METHODS = ("gumbel",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, method, cache_dtype, device, *, block=None, noise_filter=True):
        if method not in self.METHODS:
            raise ValueError(f"method: impl 'gumbel_fused' supports 'gumbel', got {method!r}")
        block = default_block(device, head.vocab_size, max_rows) if block is None else int(block)
        if block < 16 or block & (block - 1):
            raise ValueError(f"block: expected a power of two >= 16, got {block}")
        self.head = head
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.cache_dtype = cache_dtype
        self.block = block
        self.noise_filter = bool(noise_filter)  # same draws either way; False = exact keys everywhere
        self.num_blocks = num_blocks(head.vocab_size, block)
        self.gemm = BiasGemm(head, self.max_rows, device)
        self.block_max = torch.zeros(self.max_rows, self.num_blocks, dtype=torch.float32, device=device)
        self.block_token = torch.zeros(self.max_rows, self.num_blocks, dtype=torch.int64, device=device)
        self.prev = torch.zeros(self.max_rows, dtype=torch.int64, device=device)

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
