"""Top-k / top-p filtering of target logits: public function, torch reference, Triton kernels.

Semantics (per row of fp32 logits ``x`` of length ``V``; both implementations agree exactly):

- **Order.** Tokens are ranked by logit descending, then index ascending (``-0.0 == +0.0``).
- **Top-k.** With ``0 < k < V`` the ``k`` best-ranked tokens are kept (ties at the k-th value are
  resolved in index order, so exactly ``k`` survive); ``k <= 0`` or ``k >= V`` disables top-k.
- **Top-p.** With ``p < 1``, among the top-k survivors, a token is kept iff the mass of the
  strictly better-ranked survivors is ``< p``. The mass is order-independent so that a sorted
  reference and the Triton kernels agree bit for bit: each token's fp32 weight
  ``w = exp(x - max)`` (a software ``exp`` with only IEEE fp32 adds and multiplies; ``w = 1`` where
  ``x == max``, which also covers ``+inf``) is truncated to 2^-32 fixed point, ``q = trunc(w 2^32)``
  (int64), and the masses are exact integer sums. "Mass before ``< p``" is the fp64 comparison
  ``float64(sum of q before) < float64(p) * float64(sum of q over survivors)`` (every sum is below
  2^53, so only the product rounds, once, identically everywhere). Weights below 2^-32 of the
  maximum count as zero. ``p >= 1`` (or NaN) disables top-p; ``p <= 0`` keeps the top token only.
- **Never empty.** The best-ranked token (first maximum) always survives, so ``p = 0`` or a ``p``
  below the resolution of the mass (1e-9, 1e-7) keeps exactly that token, and a huge finite or
  ``+inf`` logit survives.
- **NaN rows** (any NaN logit) are left unchanged. An all ``-inf`` row stays all ``-inf``.

Masked entries are set to ``-inf``. The Triton path (``triton_filtering.py``) never sorts a row:
the kept set is a prefix of the ranking, i.e. ``packed >= cut`` for one packed (key, index) cut,
found from exact counts and integer masses at thresholds placed by a model of the row (top-k: an
early gather of ~4 k tokens in the statistics pass; top-p: one two-threshold sweep around the cut
a Gaussian-bulk-plus-exact-head mass model predicts) while gathering the few candidates of the
bracket that holds the cut; narrowed by exact part counts/masses, one sort of at most 256 gives the
cut; a bounded search handles missed predictions. Ties at either boundary are ordered by index
through the packing. A fixed sequence of 4 launches with persistent scratch (a ``TopKTopPFilter``),
so the whole call is CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from .. import registry
from ..validate import check_cpu_or_cuda, check_tensor, check_triton_runs
from .filter_checks import check_arguments
from .filtering_reference import (EXP_COEFFS, EXP_FLOOR, KEY_FLOOR, LOG2E, MASS_ONE,  # noqa: F401  (re-exported)
                                  top_k_top_p_reference, weight_fixed_point)

IMPLS = ("triton", "reference", "cuda")


# --------------------------------------------------------------------------- validation
def _check(logits, k, p, impl, out, temperature=None):
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    k, p, temperature = check_arguments(logits, k, p, out, temperature)
    check_cpu_or_cuda("logits", logits)  # (a meta tensor: the Triton launch would copy values it has not)
    if temperature is not None and impl == "triton":
        raise ValueError("temperature: raw logits divided inside the filter are implemented by impl='cuda' and "
                         "'reference'; with 'triton' divide first (draft.reference.scaled_logits)")
    return k, p, temperature


# --------------------------------------------------------------------------- public function
def _auto_impl(impl, logits, temperature, k=None):
    """``"cuda"`` where ``impl`` is ``"auto"`` and :func:`.cuda_filtering.auto_picks` takes the call, else ``impl``
    (``k``: the call's top-k, None for top-p alone, which the two filters' measurements separate)."""
    if impl == registry.AUTO and isinstance(logits, torch.Tensor) and logits.device.type == "cuda":
        from . import cuda_filtering  # noqa: PLC0415

        if cuda_filtering.auto_picks(logits, temperature, k):
            return "cuda"
    return impl


def top_k_top_p(logits, k=None, p=None, *, impl=registry.DEFAULT_IMPL, out=None, temperature=None):
    """Mask all but the top-k / top-p tokens of each row with ``-inf`` (semantics: module doc).

    Parameters
    ----------
    logits : torch.Tensor
        ``[B, V]`` fp32, last stride 1 (CPU or CUDA). Filtered in place unless ``out`` is given.
    k : int, torch.Tensor or None
        Scalar or per-row ``[B]`` int32/int64; ``k <= 0`` or ``k >= V`` means no top-k.
    p : float, torch.Tensor or None
        Scalar (``>= 0``) or per-row ``[B]`` fp32; ``p >= 1`` means no top-p (a per-row NaN too;
        a negative per-row value acts as 0).
    impl : {"auto", "triton", "reference", "cuda"}
        ``"auto"`` (the default): on CUDA ``"cuda"`` where it runs (sm_90 with NVRTC) with top-k on
        for a batch of at most ``cuda_filtering.AUTO_MAX_ROWS`` rows, with top-p alone at any batch
        (``AUTO_MAX_ROWS_P_ALONE``) and for raw logits with a ``temperature``, else ``"triton"``;
        the reference elsewhere; all give the same result by contract.
        ``"triton"``: threshold-search kernels that sort only a few candidates per row (interpreter
        on CPU); ``"reference"``: a torch sort of every row; ``"cuda"``: one launch with each row
        resident in an 8-block cluster, or re-read from L2 for top-p alone at larger batches
        (:mod:`.cuda_filtering`; sm_90 with NVRTC). An explicit
        ``impl`` never falls back silently.
    out : torch.Tensor, optional
        ``[B, V]`` fp32 output (last stride 1); ``logits`` is then left unchanged.
    temperature : float, torch.Tensor or None
        Raw logits: a scalar (finite, ``>= 0``) or per-row ``[B]`` fp32 temperature (its values are
        not checked, which would synchronise: a NaN gives a NaN row, left as it is, and a negative
        value reverses the row's ranking, in every ``impl`` alike); each row is divided
        by it first (the IEEE ``x / T``, ``T == 0`` unscaled, as ``draft.reference.scaled_logits``)
        and the result is the filter of the divided row, bit for bit, written to ``out`` (or
        ``logits``): the temperature pass fused into the filter (issue 18). ``impl="cuda"`` divides
        as it loads each row (no extra pass); ``"reference"`` divides first; ``"triton"`` refuses it.

    Returns
    -------
    torch.Tensor
        ``out`` if given, else ``logits`` (filtered in place).

    Notes
    -----
    CUDA graphs: the Triton path launches a fixed sequence of 4 kernels with no host
    synchronisation (per-row tensors are read on the device) and allocates nothing after the first
    call of a shape: its scratch (the candidates, ``B * 2048 * 8`` bytes on CUDA, and ~2.6 KB of
    state per row) lives in a cached ``triton_filtering.TopKTopPFilter`` sized for the largest
    batch seen (allocated on the first call, so call once before capturing; a serving engine can
    own one ``TopKTopPFilter(max_rows, V, device)`` itself). The reference path sorts and allocates.
    """
    check_tensor("logits", logits)  # (first: "auto" resolves by the tensor's device)
    impl = _auto_impl(impl, logits, temperature, k)
    impl = registry.resolve("top_k_top_p", impl, logits.device)
    k, p, temperature = _check(logits, k, p, impl, out, temperature)
    registry.check_capturable("top_k_top_p", impl, logits.device)
    target = logits if out is None else out
    if impl == "cuda":
        from . import cuda_filtering  # noqa: PLC0415

        if logits.device.type != "cuda":
            raise ValueError(f"impl: 'cuda' filters CUDA tensors, got logits on {logits.device}")
        cuda_filtering.launch_top_k_top_p(logits, k, p, target, temperature)
        return target
    if temperature is not None:  # (the reference: divide first, then filter the divided rows)
        from ..draft.reference import scaled_logits  # noqa: PLC0415

        rows = logits.shape[0]
        temp = temperature if isinstance(temperature, torch.Tensor) else torch.full((rows,), temperature)
        logits = scaled_logits(logits, temp.to(device=logits.device, dtype=torch.float32))
    if k is None and p is None:
        if target is not logits:
            target.copy_(logits)
        return target
    if impl == "reference":
        rows, vocab = logits.shape
        k_rows = (k if isinstance(k, torch.Tensor) else torch.full((rows,), 0 if k is None else k)).to(
            device=logits.device, dtype=torch.int64)
        p_rows = (p if isinstance(p, torch.Tensor) else torch.full((rows,), 1.0 if p is None else p)).to(
            device=logits.device, dtype=torch.float32)
        keep = top_k_top_p_reference(logits, k_rows, p_rows)
        torch.where(keep, logits, torch.full((), float("-inf"), device=logits.device), out=target)
        return target
    check_triton_runs(impl, logits.device)
    from . import triton_filtering  # noqa: PLC0415  (Triton is imported only when used)

    triton_filtering.launch_top_k_top_p(logits, k, p, target)
    return target
