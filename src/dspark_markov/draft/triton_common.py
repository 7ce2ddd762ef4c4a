"""Building blocks shared by the Triton Gumbel-max samplers (SPEC.md sections 2-4).

Device functions (importable by any design):

- :func:`draft_row` — slot, temperature, seed and position of one (row, step) sample, with
  out-of-range slots treated as padding (T = 0, seed 0, no cache write);
- :func:`draft_rows` — the same for a vector of samples (the tiles of ``fused`` and ``chain``);
- :func:`gumbel_key` — the key ``z / T + g`` (``z`` itself when ``T == 0``), fp32;
- :func:`block_argmax` — ``(max, first index)`` of one vocabulary block with ``torch.argmax``
  semantics (first NaN wins, else the first maximum);
- :func:`combine_blocks` — the same semantics across the per-block partials of a row (an all
  ``-inf`` row gives token 0); the result is always a valid token.

Kernels with launchers:

- :func:`launch_gumbel_blocks` — one program per (row, vocabulary block): ``z`` (either read, or
  formed as ``round(U + bias)``), the cache write of live samples, and the block partials;
- :func:`launch_combine` — one program per row: the token, ``draft_tokens[r, step]``, ``prev[r]``
  and, optionally, the next step's embedding row ``W1[token]`` gathered into the GEMM's codes.

And :class:`BiasGemm`, the torch side of the bias ``W2 @ W1[prev]`` with persistent buffers.

Every launch passes ``enable_fp_fusion=False`` (the noise is bit-exact only without FMA
contraction). Importing this module imports Triton.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import rng_triton
from ..validate import check_power_of_two
from . import gumbel_filter

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # read once: set before any kernel is defined

# The block size on the GPU: 2048 logits per program (8 per thread at 8 warps, 16-byte bf16
# loads), 64 blocks per row at V = 129,280, few partials for the combine. When a whole step has
# fewer such programs than the GPU has SMs (one or two rows), 1024 halves each program's serial
# work so that every SM gets one.
GPU_BLOCK = 2048
GPU_SMALL_BLOCK = 1024
# On the CPU (Triton's interpreter) a small block keeps several blocks per row at test sizes.
CPU_BLOCK = 256
_BIG_INDEX = tl.constexpr(2147483647)  # (constexpr: triton 3.6 jit reads only constexpr globals) larger than any token id; loses every "first index" minimum


def default_block(device, vocab: int | None = None, max_rows: int | None = None) -> int:
    """The vocabulary block size used on ``device`` for batches of up to ``max_rows`` rows."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BLOCK
    if vocab is not None and max_rows is not None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if max_rows * num_blocks(vocab, GPU_BLOCK) < sms:
            return GPU_SMALL_BLOCK
    return GPU_BLOCK


def num_blocks(vocab: int, block: int) -> int:
    """How many blocks of ``block`` tokens cover ``vocab`` (the last one may be ragged)."""
    return triton.cdiv(vocab, block)


def _num_warps(block: int) -> int:
    return 8 if block >= 2048 else 4


# --------------------------------------------------------------------------- device functions
@triton.jit
def round_to_bf16(x):
    """fp32 -> bf16, round to nearest even, in integer arithmetic (NaN -> 0x7FC0, as torch does).

    Triton's interpreter truncates fp32 -> bf16 casts (and its "rtne" mode rounds ties up and
    can overflow the mantissa), so every bf16 rounding that must match torch goes through here.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def to_float32(x):
    """Exact widening of bf16/fp16/fp32 values to fp32 (bf16 by a bit shift)."""
    if x.dtype == tl.bfloat16:
        out = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        out = x.to(tl.float32)
    return out


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (bf16, fp16 or fp32) to nearest even, as torch rounds."""
    if dtype == tl.bfloat16:
        out = round_to_bf16(x)
    else:
        out = x.to(dtype)
    return out


@triton.jit
def draft_row(idx_mapping_ptr, positions_ptr, temperature_ptr, seeds_ptr, sample, num_slots):
    """``(live, slot, temp, seed, position)`` of sample ``sample = row * N + step``.

    ``live`` is False for padding (slot < 0) and for slots outside ``[0, num_slots)``; such
    samples get ``slot = 0`` (never used for a write), T = 0 and seed 0. int64 except ``temp``.
    """
    slot = tl.load(idx_mapping_ptr + sample).to(tl.int64)
    position = tl.load(positions_ptr + sample).to(tl.int64)
    live = (slot >= 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0)
    temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)
    seed = tl.load(seeds_ptr + slot, mask=live, other=0)
    return live, slot, temp, seed, position


@triton.jit
def draft_rows(idx_mapping_ptr, positions_ptr, temperature_ptr, seeds_ptr, sample, valid, num_slots):
    """:func:`draft_row` for a vector of samples, of which only those where ``valid`` exist.

    Returns ``(live, slot, temp, seed, position)``; samples that are not live (padding, a slot
    outside ``[0, num_slots)``, or not ``valid``) get ``slot = 0`` (never written), T = 0, seed 0,
    and position 0 where not ``valid``.
    """
    slot = tl.load(idx_mapping_ptr + sample, mask=valid, other=-1).to(tl.int64)
    live = valid & (slot >= 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0)
    temp = tl.where(live, tl.load(temperature_ptr + slot, mask=live, other=0.0), 0.0)
    seed = tl.where(live, tl.load(seeds_ptr + slot, mask=live, other=0), 0)
    position = tl.load(positions_ptr + sample, mask=valid, other=0).to(tl.int64)
    return live, slot, temp, seed, position


@triton.jit
def gumbel_key(z, temp, prefix, token):
    """Keys of fp32 logits ``z`` at token ids ``token``: ``div_rn(z, T) + g``, or ``z`` if T == 0.

    ``prefix`` is ``rng_triton.draft_prefix(seed, step, position)`` of the row. Greedy rows skip
    the noise entirely (a runtime branch on the row's scalar temperature).
    """
    if temp == 0.0:
        key = z
    else:
        key = tl.math.div_rn(z, temp) + rng_triton.draft_noise(prefix, token)
    return key


@triton.jit
def block_argmax(key, token, valid, AXIS: tl.constexpr = 0):
    """``(max, first index)`` of fp32 ``key`` along ``AXIS`` over the lanes where ``valid`` (at least one).

    ``torch.argmax`` semantics: if a valid lane is NaN, the result is (NaN, first NaN token);
    otherwise the maximum and the first token reaching it (an all ``-inf`` block gives its first
    valid token). ``token`` holds the lanes' token ids (increasing along ``AXIS``, broadcast against
    ``key``); returns (fp32, int32). ``AXIS = 1`` reduces each row of a 2-D tile.
    """
    is_nan = (key != key) & valid
    clean = tl.where(valid & (key == key), key, float("-inf"))
    best = tl.max(clean, axis=AXIS)
    best_token = tl.min(tl.where(valid & ~is_nan & (clean == tl.expand_dims(best, AXIS)), token, _BIG_INDEX),
                        axis=AXIS)
    nan_token = tl.min(tl.where(is_nan, token, _BIG_INDEX), axis=AXIS)
    has_nan = nan_token != _BIG_INDEX
    return tl.where(has_nan, float("nan"), best), tl.where(has_nan, nan_token, best_token)


@triton.jit
def combine_blocks(block_max, block_token, valid, vocab):
    """The row's token from per-block ``(max, first index)`` partials (blocks in vocabulary order).

    First NaN block wins, else the first block reaching the maximum (its first index is then the
    row's first maximum), and an all ``-inf`` row gives block 0's first index, 0. The result is
    clamped into ``[0, vocab)`` so no later gather can leave the embedding table. int32 scalar.
    """
    _, token = block_argmax(block_max, block_token, valid)
    return tl.minimum(tl.maximum(token, 0), vocab - 1)


# --------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["step", "num_slots"])
def _gumbel_blocks_kernel(
    logits_ptr, logits_row_stride, logits_step_stride,  # [R, N, V] base logits, or [max_rows, V] z
    bias_ptr, bias_row_stride,  # [max_rows, V] weight dtype (read only when ADD_BIAS)
    scale,  # fp32 bias multiplier (used only when HAS_SCALE)
    idx_mapping_ptr, positions_ptr,  # [R*N] int32/int64
    temperature_ptr, seeds_ptr, num_slots,  # [S] fp32, [S] int64
    cache_ptr, cache_slot_stride,  # [S, N, V] bf16/fp32; step stride V
    block_max_ptr, block_token_ptr, partial_row_stride,  # [max_rows, num_blocks] fp32, int64
    step, num_steps, vocab,
    filter_margin,  # gumbel_filter slack (used only when FILTER)
    BLOCK: tl.constexpr,
    ADD_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    FILTER: tl.constexpr,
    HARDWARE_LOG2: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    sample = row * num_steps + step
    live, slot, temp, seed, position = draft_row(idx_mapping_ptr, positions_ptr, temperature_ptr, seeds_ptr,
                                                 sample, num_slots)
    token = block * BLOCK + tl.arange(0, BLOCK)
    valid = token < vocab
    src = logits_ptr + row.to(tl.int64) * logits_row_stride + step * logits_step_stride
    cache_dtype = cache_ptr.dtype.element_ty
    if ADD_BIAS:
        bias = to_float32(tl.load(bias_ptr + row.to(tl.int64) * bias_row_stride + token, mask=valid, other=0.0))
        if HAS_SCALE:  # SPEC.md section 3: scale after the weight-dtype rounding, rounded again
            bias = to_float32(round_to(bias * scale, bias_ptr.dtype.element_ty))
        logits = to_float32(tl.load(src + token, mask=valid, other=0.0))
        z = round_to(logits + bias, cache_dtype)  # one rounding of the fp32 sum
    else:  # z already holds the step's logits in the cache dtype
        z = tl.load(src + token, mask=valid, other=0.0)
    # Padding samples write nothing: their store bound is 0 (one comparison, no scalar-block mask).
    store_bound = tl.where(live, vocab, 0)
    tl.store(cache_ptr + slot * cache_slot_stride + step * vocab + token, z, mask=token < store_bound)
    prefix = rng_triton.draft_prefix(seed, step, position)
    if FILTER:  # same result, exact keys only where the approximate ranking is not conclusive
        if temp == 0.0:
            block_max, block_token = block_argmax(to_float32(z), token, valid)
        else:
            block_max, block_token = gumbel_filter.filtered_block_argmax(to_float32(z), temp, prefix, token, valid,
                                                                        filter_margin, block_argmax, HARDWARE_LOG2)
    else:
        key = gumbel_key(to_float32(z), temp, prefix, token)
        block_max, block_token = block_argmax(key, token, valid)
    partial = row.to(tl.int64) * partial_row_stride + block
    tl.store(block_max_ptr + partial, block_max)
    tl.store(block_token_ptr + partial, block_token.to(tl.int64))


@triton.jit(do_not_specialize=["step"])
def _combine_kernel(
    block_max_ptr, block_token_ptr, partial_row_stride, num_partials,  # [max_rows, num_blocks]
    tokens_ptr, tokens_row_stride, tokens_step_stride,  # [R, N] int64 draft_tokens
    prev_ptr,  # [max_rows] int64
    embed_ptr, rank,  # [V_t, R_k] contiguous W1
    codes_ptr, codes_row_stride,  # [max_rows, R_k] the GEMM's input (written when GATHER)
    step, vocab,
    PARTIALS: tl.constexpr,
    RANK_BLOCK: tl.constexpr,
    GATHER: tl.constexpr,
):
    row = tl.program_id(0)
    index = tl.arange(0, PARTIALS)
    valid = index < num_partials
    base = row.to(tl.int64) * partial_row_stride
    block_max = tl.load(block_max_ptr + base + index, mask=valid, other=float("-inf"))
    block_token = tl.load(block_token_ptr + base + index, mask=valid, other=0).to(tl.int32)
    token = combine_blocks(block_max, block_token, valid, vocab).to(tl.int64)
    tl.store(tokens_ptr + row.to(tl.int64) * tokens_row_stride + step * tokens_step_stride, token)
    tl.store(prev_ptr + row, token)
    if GATHER:
        k = tl.arange(0, RANK_BLOCK)
        code = tl.load(embed_ptr + token * rank + k, mask=k < rank, other=0.0)
        tl.store(codes_ptr + row.to(tl.int64) * codes_row_stride + k, code, mask=k < rank)


# --------------------------------------------------------------------------- launchers
def launch_gumbel_blocks(logits, logits_row_stride, logits_step_stride, bias, scale, idx_mapping, positions,
                         temperature, seeds, logits_cache, block_max, block_token, *, rows, step, num_steps,
                         block, add_bias, filter=False):
    """One Gumbel step for ``rows`` rows: cache write of live samples and per-block partials.

    Parameters
    ----------
    logits : with ``add_bias``, the base logits ``[R, N, V]`` (bf16/fp32, last stride 1, row and
        step strides given); without, the step's logits ``z`` ``[max_rows, V]`` already in the
        cache dtype (step stride 0).
    bias : ``[max_rows, V]`` weight-dtype bias (read only with ``add_bias``), contiguous rows.
    scale : float; with ``add_bias`` and ``scale != 1`` the bias is scaled and rounded again.
    idx_mapping, positions : ``[R*N]`` int32/int64. temperature ``[S]`` fp32, seeds ``[S]`` int64.
    logits_cache : ``[S, N, V]`` bf16/fp32 output (rows of live samples of this step).
    block_max, block_token : ``[max_rows, num_blocks]`` fp32 / int64 partials (outputs).
    filter : rank each block by approximate noise first (:mod:`.gumbel_filter`); bit-identical
        partials at a fraction of the arithmetic.

    Grid ``(rows, cdiv(V, block))``; launches only (CUDA-graph safe).
    Bytes: rows*V*(logit bytes [+ bias bytes]) read + live*V*cache bytes + rows*blocks*12 written.
    """
    vocab = logits_cache.shape[2]
    grid = (rows, num_blocks(vocab, block))
    _gumbel_blocks_kernel[grid](
        logits, logits_row_stride, logits_step_stride,
        bias, bias.stride(0),
        float(scale),
        idx_mapping, positions,
        temperature, seeds, temperature.shape[0],
        logits_cache, logits_cache.stride(0),
        block_max, block_token, block_max.stride(0),
        step, num_steps, vocab, gumbel_filter.FILTER_MARGIN,
        BLOCK=block, ADD_BIAS=add_bias, HAS_SCALE=add_bias and float(scale) != 1.0, FILTER=filter,
        HARDWARE_LOG2=logits.device.type == "cuda" and not INTERPRET,
        num_warps=_num_warps(block), enable_fp_fusion=False,
    )


def launch_combine(block_max, block_token, draft_tokens, prev, embed_weight, codes, *, rows, step, vocab,
                   gather):
    """Reduce the block partials of ``rows`` rows into their tokens (``torch.argmax`` semantics).

    Parameters
    ----------
    block_max, block_token : ``[max_rows, num_blocks]`` fp32 / int64 partials.
    draft_tokens : ``[R, N]`` int64 output; column ``step`` is written. prev : ``[max_rows]`` int64.
    embed_weight : ``[V_t, R_k]`` contiguous W1. codes : ``[max_rows, R_k]`` (weight dtype or
        fp32), row ``r`` receives ``W1[token_r]`` when ``gather`` (the next step's GEMM input).

    Grid ``(rows,)``; launches only (CUDA-graph safe).
    Bytes: rows*(num_blocks*12 read + 16 written [+ 2*R_k*weight bytes gathered]).
    """
    partials = block_max.shape[1]
    rank = embed_weight.shape[1]
    _combine_kernel[(rows,)](
        block_max, block_token, block_max.stride(0), partials,
        draft_tokens, draft_tokens.stride(0), draft_tokens.stride(1),
        prev,
        embed_weight, rank,
        codes, codes.stride(0),
        step, vocab,
        PARTIALS=triton.next_power_of_2(partials), RANK_BLOCK=triton.next_power_of_2(rank), GATHER=gather,
        num_warps=4 if rank >= 512 or partials >= 512 else 1, enable_fp_fusion=False,
    )


# --------------------------------------------------------------------------- the bias GEMM
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


class GumbelBlocksBackend:
    """Shared set-up of the two Gumbel-block designs (``loop`` and ``gumbel_fused``).

    Parameters
    ----------
    head : MarkovHead on ``device``. num_steps : N. max_rows : the largest R of a call.
    method : ``"gumbel"``. cache_dtype : bf16 or fp32. device : ``cuda`` (or ``cpu`` with
        ``TRITON_INTERPRET=1``).
    block : vocabulary block of the Gumbel kernel (power of two; default 2048 on CUDA, 1024 when
        ``max_rows`` x blocks would not fill the SMs, 256 on CPU).

    Allocates the bias GEMM's buffers, the per-block partials ``[max_rows, num_blocks]`` and the
    previous tokens ``[max_rows]`` once; subclasses' ``run`` launches kernels only and reads every
    per-call value from its tensor arguments, so it can be captured in a CUDA graph.
    """

    NAME = ""
    METHODS = ("gumbel",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, method, cache_dtype, device, *, block=None):
        if method not in self.METHODS:
            raise ValueError(f"method: impl {self.NAME!r} supports 'gumbel', got {method!r}")
        block = default_block(device, head.vocab_size, max_rows) if block is None else int(block)
        check_power_of_two("block", block, 16)
        self.head = head
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.cache_dtype = cache_dtype
        self.block = block
        self.num_blocks = num_blocks(head.vocab_size, block)
        self.gemm = BiasGemm(head, self.max_rows, device)
        self.block_max = torch.zeros(self.max_rows, self.num_blocks, dtype=torch.float32, device=device)
        self.block_token = torch.zeros(self.max_rows, self.num_blocks, dtype=torch.int64, device=device)
        self.prev = torch.zeros(self.max_rows, dtype=torch.int64, device=device)
