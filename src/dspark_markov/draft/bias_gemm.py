"""The torch side of the draft step: the bias ``W2 @ W1[prev]`` into persistent buffers."""

from __future__ import annotations

import torch


class BiasGemm:
    """``bias[:R] = W2 @ W1[prev]`` in the weight dtype, into persistent buffers.

    On CUDA one ``torch.matmul`` (cuBLAS, fp32 accumulation) writes the weight-dtype bias
    directly. Elsewhere (the interpreter path) the GEMM runs in fp32 on fp32 copies of the weights
    and is rounded once, exactly as :meth:`MarkovHead.bias` does, so CPU results are bit-identical
    to the reference. ``scale`` is *not* applied here.

    Attributes
    ----------
    codes : ``[max_rows, R_k]`` GEMM input (weight dtype on CUDA, fp32 elsewhere).
    bias : ``[max_rows, V]`` weight-dtype output.
    """

    def __init__(self, head, max_rows: int, device):
        device = torch.device(device)
        self.on_cuda = device.type == "cuda"
        self.embed = head.embed_weight  # [V_t, R_k], contiguous (MarkovHead guarantees it)
        if self.on_cuda or head.dtype == torch.float32:
            self.gemm_embed, self.gemm_head = head.embed_weight, head.head_weight
        else:
            self.gemm_embed, self.gemm_head = head.embed_weight.float(), head.head_weight.float()
        self.codes = torch.zeros(max_rows, head.rank, dtype=self.gemm_embed.dtype, device=device)
        self.bias = torch.zeros(max_rows, head.vocab_size, dtype=head.dtype, device=device)
        self._gemm_out = self.bias if self.gemm_head.dtype == head.dtype else torch.zeros(
            max_rows, head.vocab_size, dtype=torch.float32, device=device)

    def gather(self, prev: torch.Tensor, rows: int) -> None:
        """``codes[:rows] = W1[prev]`` for int64 ``prev`` ``[rows]`` (values in ``[0, V_t)``)."""
        torch.index_select(self.gemm_embed, 0, prev, out=self.codes[:rows])

    def compute(self, rows: int) -> torch.Tensor:
        """The weight-dtype bias ``[rows, V]`` of the current codes (a view of :attr:`bias`)."""
        torch.matmul(self.codes[:rows], self.gemm_head.t(), out=self._gemm_out[:rows])
        if self._gemm_out is not self.bias:
            self.bias[:rows].copy_(self._gemm_out[:rows])  # one rounding to the weight dtype
        return self.bias[:rows]


def clamp_anchor(anchor: torch.Tensor, prev: torch.Tensor, embed_vocab: int) -> None:
    """``prev[:R] = clamp(anchor, 0, V_t - 1)`` as int64 (no out-of-bounds gather, ever)."""
    rows = prev[: anchor.shape[0]]
    rows.copy_(anchor)  # int32 or int64 anchor -> int64 (clamp's out= cannot change the dtype)
    rows.clamp_(0, embed_vocab - 1)
