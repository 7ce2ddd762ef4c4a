"""The Gumbel-block kernels shared by ``impl="loop"`` and ``impl="gumbel_fused"`` (SPEC.md 2-4).

Kernels with launchers (composed of :mod:`dspark_markov.ops`):

- :func:`launch_gumbel_blocks` — one program per (row, vocabulary block): ``z`` (either read, or
  formed as ``round(U + bias)``), the cache write of live samples, and the block partials;
- :func:`launch_combine` — one program per row: the token, ``draft_tokens[r, step]``, ``prev[r]``
  and, optionally, the next step's embedding row ``W1[token]`` gathered into the GEMM's codes.

And :class:`GumbelBlocksBackend`, the set-up both designs share (the bias GEMM is
:class:`.bias_gemm.BiasGemm`).

Every launch passes ``enable_fp_fusion=False`` (the noise is bit-exact only without FMA
contraction). Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.filter import FILTER_MARGIN, filtered_argmax
from ..ops.noise import draft_prefix, gumbel_key, hardware_log2
from ..ops.numerics import biased_logits, block_argmax, combine_blocks, to_float32, weight_bias
from ..ops.rows import draft_row, gather_code
from ..validate import check_power_of_two
from .bias_gemm import BiasGemm

# The block size on the GPU: 2048 logits per program (8 per thread at 8 warps, 16-byte bf16
# loads), 64 blocks per row at V = 129,280, few partials for the combine. When a whole step has
# fewer such programs than the GPU has SMs (one or two rows), 1024 halves each program's serial
# work so that every SM gets one.
GPU_BLOCK = 2048
GPU_SMALL_BLOCK = 1024
# On the CPU (Triton's interpreter) a small block keeps several blocks per row at test sizes.
CPU_BLOCK = 256


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
    filter_margin,  # ops.filter slack (used only when FILTER)
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
        bias = tl.load(bias_ptr + row.to(tl.int64) * bias_row_stride + token, mask=valid, other=0.0)
        bias = weight_bias(bias, scale, bias_ptr.dtype.element_ty, HAS_SCALE)  # SPEC.md 3: scale, round again
        z = biased_logits(tl.load(src + token, mask=valid, other=0.0), bias, cache_dtype)  # one rounding
    else:  # z already holds the step's logits in the cache dtype
        z = tl.load(src + token, mask=valid, other=0.0)
    # Padding samples write nothing: their store bound is 0 (one comparison, no scalar-block mask).
    store_bound = tl.where(live, vocab, 0)
    tl.store(cache_ptr + slot * cache_slot_stride + step * vocab + token, z, mask=token < store_bound)
    prefix = draft_prefix(seed, step, position)
    if FILTER:  # same result, exact keys only where the approximate ranking is not conclusive
        if temp == 0.0:
            block_max, block_token = block_argmax(to_float32(z), token, valid)
        else:
            block_max, block_token = filtered_argmax(to_float32(z), temp, prefix, token, valid, filter_margin, 0,
                                                     HARDWARE_LOG2)
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
    embed_ptr, embed_vocab, rank,  # [V_t, R_k] contiguous W1
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
        gather_code(embed_ptr, rank, token, embed_vocab, codes_ptr + row.to(tl.int64) * codes_row_stride, rank,
                    RANK_BLOCK)


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
    filter : rank each block by approximate noise first (:mod:`dspark_markov.ops.filter`); bit-identical
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
        step, num_steps, vocab, FILTER_MARGIN,
        BLOCK=block, ADD_BIAS=add_bias, HAS_SCALE=add_bias and float(scale) != 1.0, FILTER=filter,
        HARDWARE_LOG2=hardware_log2(logits.device),
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
        embed_weight, embed_weight.shape[0], rank,
        codes, codes.stride(0),
        step, vocab,
        PARTIALS=triton.next_power_of_2(partials), RANK_BLOCK=triton.next_power_of_2(rank), GATHER=gather,
        num_warps=4 if rank >= 512 or partials >= 512 else 1, enable_fp_fusion=False,
    )


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

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block=None):
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
