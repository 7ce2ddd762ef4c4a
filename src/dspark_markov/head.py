"""The low-rank Markov head: ``bias(prev) = scale * (W2 @ W1[prev])`` (SPEC.md sections 1 and 3)."""

from __future__ import annotations

import math
import numbers

import torch

WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class MarkovHead:
    """Weights of the Markov head.

    Parameters
    ----------
    embed_weight : ``[V_t, R_k]`` tensor, W1 ("embed"); row ``t`` is the code of previous token t.
    head_weight : ``[V, R_k]`` tensor, W2 ("head"), same dtype and device as ``embed_weight``.
        ``V_t >= V`` so that every drafted token has an embedding row.
    scale : float multiplier of the bias (rounded to the weight dtype again when ``!= 1``).

    Both weights are kept as given (made contiguous if they were not): no copy on the hot path.
    """

    def __init__(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, scale: float = 1.0):
        for name, weight in (("embed_weight", embed_weight), ("head_weight", head_weight)):
            if not isinstance(weight, torch.Tensor):
                raise ValueError(f"{name}: expected a torch.Tensor, got {type(weight).__name__}")
            if weight.dim() != 2:
                raise ValueError(f"{name}: expected a 2-D tensor, got shape {tuple(weight.shape)}")
            if weight.dtype not in WEIGHT_DTYPES:
                raise ValueError(f"{name}: expected dtype bfloat16, float16 or float32, got {weight.dtype}")
            if weight.numel() == 0:
                raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(weight.shape)}")
        if head_weight.dtype != embed_weight.dtype:
            raise ValueError(
                f"head_weight: expected the dtype of embed_weight ({embed_weight.dtype}), got {head_weight.dtype}"
            )
        if head_weight.device != embed_weight.device:
            raise ValueError(
                f"head_weight: expected the device of embed_weight ({embed_weight.device}), got {head_weight.device}"
            )
        if head_weight.shape[1] != embed_weight.shape[1]:
            raise ValueError(
                f"head_weight: expected rank {embed_weight.shape[1]} (embed_weight.shape[1]), "
                f"got shape {tuple(head_weight.shape)}"
            )
        if embed_weight.shape[0] < head_weight.shape[0]:
            raise ValueError(
                f"embed_weight: expected at least V = {head_weight.shape[0]} rows (one per draftable token), "
                f"got shape {tuple(embed_weight.shape)}"
            )
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
            raise ValueError(f"scale: expected a finite float, got {scale!r} ({type(scale).__name__})")
        scale = float(scale)
        self.embed_weight = embed_weight.contiguous()
        self.head_weight = head_weight.contiguous()
        self.scale = scale

    @property
    def vocab_size(self) -> int:
        return self.head_weight.shape[0]

    @property
    def embed_vocab_size(self) -> int:
        return self.embed_weight.shape[0]

    @property
    def rank(self) -> int:
        return self.head_weight.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.head_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.head_weight.device

    def to(self, device) -> "MarkovHead":
        return MarkovHead(self.embed_weight.to(device), self.head_weight.to(device), self.scale)

    def round_scaled(self, bias: torch.Tensor) -> torch.Tensor:
        """Apply ``scale`` to a bias already rounded to the weight dtype (SPEC.md section 3)."""
        if self.scale == 1.0:
            return bias
        return (bias.float() * self.scale).to(self.dtype)

    def bias(self, prev: torch.Tensor) -> torch.Tensor:
        """Reference bias ``[R, V]`` in the weight dtype for previous tokens ``prev`` ``[R]``.

        fp32 accumulation over the rank, one rounding to the weight dtype, then ``scale``.
        """
        codes = self.embed_weight.index_select(0, prev.long()).float()  # [R, R_k]
        acc = codes @ self.head_weight.float().t()  # [R, V] fp32
        return self.round_scaled(acc.to(self.dtype))

    def bias_fast(self, prev: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The same bias through one GEMM in the weight dtype (cuBLAS on CUDA, fp32 accumulate).

        May differ from :meth:`bias` in the last bit (SPEC.md section 3 leaves summation free).
        """
        codes = self.embed_weight.index_select(0, prev.long())  # [R, R_k]
        if self.dtype == torch.float32 or codes.device.type != "cuda":
            return self.round_scaled((codes.float() @ self.head_weight.float().t()).to(self.dtype))
        return self.round_scaled(torch.matmul(codes, self.head_weight.t(), out=out))
