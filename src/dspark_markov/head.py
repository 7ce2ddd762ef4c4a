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
    d2t : optional ``[V_d]`` int32/int64 offsets of a reduced draft vocabulary (EAGLE-3 / vLLM's
        ``draft_id_to_target_id``): draft id ``j`` is target id ``j + d2t[j]``. ``head_weight`` and
        the base logits are then in draft space (``V_d = head_weight.shape[0]`` columns) while
        ``embed_weight`` stays target-indexed; the cache rows, the Gumbel keys, the drafted tokens and
        the next step's previous token are target ids (README "Id spaces"). The target ids must be
        distinct and in ``[0, target_vocab_size)``; checked here once (one host read of ``d2t``).
    target_vocab_size : the target vocabulary (the cache width with ``d2t``); default
        ``embed_weight.shape[0]``, at most that (every drafted token needs an embedding row). Only
        with ``d2t``.

    Both weights are kept as given (made contiguous if they were not): no copy on the hot path. They are
    kept detached from autograd (``nn.Parameter`` weights with ``requires_grad`` are taken as their values).
    """

    def __init__(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, scale: float = 1.0, *,
                 d2t: torch.Tensor | None = None, target_vocab_size: int | None = None):
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
        try:  # (an int beyond the float range overflows: not finite either)
            finite = not isinstance(scale, bool) and isinstance(scale, numbers.Real) and math.isfinite(float(scale))
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError(f"scale: expected a finite float, got {scale!r:.40} ({type(scale).__name__})")
        scale = float(scale)
        # detach(): drafting is inference only, and weights taken from a model (nn.Parameter, requires_grad) would make
        # the torch ops with out= (bias GEMM, markov_embeds gather) raise autograd's RuntimeError; same storage, no copy
        self.embed_weight = embed_weight.detach().contiguous()
        self.head_weight = head_weight.detach().contiguous()
        self.scale = scale
        self.d2t = None  # [V_d] offsets as given
        self.d2t_index = None  # [V_d] int64 target id of each draft id
        self.target_vocab_size = None
        if d2t is not None or target_vocab_size is not None:
            self.d2t, self.d2t_index, self.target_vocab_size = _check_d2t(d2t, target_vocab_size, self.head_weight,
                                                                          self.embed_weight)

    @property
    def vocab_size(self) -> int:
        return self.head_weight.shape[0]

    @property
    def draft_vocab_size(self) -> int:
        """``V_d``: the columns of the base logits and rows of W2 (``vocab_size``)."""
        return self.head_weight.shape[0]

    @property
    def cache_vocab_size(self) -> int:
        """The width of a cache row and the token range: the target vocabulary with ``d2t``, else ``V``."""
        return self.target_vocab_size if self.d2t_index is not None else self.head_weight.shape[0]

    def with_d2t(self, d2t: torch.Tensor, target_vocab_size: int | None = None) -> "MarkovHead":
        """This head (same weights, no copy) with a reduced-vocabulary table ``d2t``."""
        if self.d2t is not None:
            raise ValueError("d2t: the head already has a d2t table; pass it once (MarkovHead(..., d2t=))")
        return MarkovHead(self.embed_weight, self.head_weight, self.scale, d2t=d2t,
                          target_vocab_size=target_vocab_size)

    def id_tables(self, device) -> tuple:
        """``(d2t, fill)`` int32 tables of the kernels on ``device``: each draft id's target id ``[V_d]`` and
        the target ids no draft id maps to ``[V_t - V_d]`` (their cache entries are ``-inf``); a one-element
        placeholder each without ``d2t``. Built once, at a backend's construction (one nonzero: a host sync)."""
        if self.d2t_index is None:
            placeholder = torch.zeros(1, dtype=torch.int32, device=device)
            return placeholder, placeholder
        mapped = torch.zeros(self.cache_vocab_size, dtype=torch.bool, device=device)
        mapped[self.d2t_index.to(device)] = True
        return self.d2t_index.to(device=device, dtype=torch.int32), torch.nonzero(~mapped).flatten().to(torch.int32)

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
        d2t = None if self.d2t is None else self.d2t.to(device)
        return MarkovHead(self.embed_weight.to(device), self.head_weight.to(device), self.scale, d2t=d2t,
                          target_vocab_size=self.target_vocab_size)

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


def _check_d2t(d2t, target_vocab_size, head_weight, embed_weight):
    """``(d2t, target ids [V_d] int64, target vocabulary)`` of a valid table, else ``ValueError``."""
    if d2t is None:
        raise ValueError("target_vocab_size: only meaningful with a d2t table (a reduced draft vocabulary)")
    if not isinstance(d2t, torch.Tensor):
        raise ValueError(f"d2t: expected a torch.Tensor, got {type(d2t).__name__}")
    draft_vocab = head_weight.shape[0]
    if d2t.dim() != 1 or d2t.shape[0] != draft_vocab:
        raise ValueError(f"d2t: expected shape ({draft_vocab},) (one offset per head_weight row), got {tuple(d2t.shape)}")
    if d2t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"d2t: expected dtype int32 or int64, got {str(d2t.dtype).replace('torch.', '')}")
    if d2t.device != head_weight.device:
        raise ValueError(f"d2t: expected a tensor on the weights' device {head_weight.device}, got one on {d2t.device}")
    if d2t.device.type not in ("cpu", "cuda"):  # (its ids are read below: a meta tensor has none; as validate.py)
        raise ValueError(f"d2t: expected a CPU or CUDA tensor, got one on {d2t.device}")
    embed_rows = embed_weight.shape[0]
    if target_vocab_size is None:
        target_vocab_size = embed_rows
    if isinstance(target_vocab_size, bool) or not isinstance(target_vocab_size, numbers.Integral) \
            or not draft_vocab <= target_vocab_size <= embed_rows:
        raise ValueError(f"target_vocab_size: expected an int in [{draft_vocab}, {embed_rows}] (V_d to the "
                         f"embed_weight rows), got {target_vocab_size!r}")
    target_vocab_size = int(target_vocab_size)
    ids = torch.arange(draft_vocab, device=d2t.device, dtype=torch.int64) + d2t.to(torch.int64)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= target_vocab_size:
        raise ValueError(f"d2t: expected target ids j + d2t[j] in [0, {target_vocab_size}), got ids in [{low}, {high}]")
    if torch.unique(ids).numel() != draft_vocab:
        sorted_ids = torch.sort(ids).values
        dup = int(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0])
        raise ValueError(f"d2t: expected distinct target ids, got target id {dup} for two draft ids")
    return d2t.contiguous(), ids.contiguous(), target_vocab_size
