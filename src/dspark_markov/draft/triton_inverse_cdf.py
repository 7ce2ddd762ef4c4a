"""Inverse-CDF Markov drafting (SPEC.md section 5): per step one bias GEMM and two Triton kernels.

Per draft step ``i``:

1. ``bias = scale * (W2 @ W1[prev])`` through torch: a cuBLAS GEMM in the weight dtype on CUDA
   (fp32 accumulation), or on the CPU an fp32 GEMM rounded once to the weight dtype, exactly as
   :meth:`MarkovHead.bias` computes it. ``scale != 1`` is applied inside kernel 1 (fp32 product,
   rounded to the weight dtype again), so the bias is never re-read for it.
2. :func:`_logits_partials_kernel` (grid ``rows x vocabulary blocks``): ``z = round(U + bias)`` to
   the cache dtype, written to the cache for live samples, and per block the NaN-aware argmax of
   ``z`` (first NaN, else first maximum) and the softmax partials ``m_b = max z/T``,
   ``s_b = sum exp(z/T - m_b)`` in fp32.
3. :func:`_pick_token_kernel` (one program per row): greedy rows (``T == 0``, padding, or a row
   whose maximum of ``z/T`` is not finite) take the combined argmax, bit-identical to
   :func:`~dspark_markov.draft.reference.argmax_first`; the others draw one uniform, pick the
   block by the prefix sum of block masses ``s_b exp(m_b - M)`` and the token inside it by the
   prefix sum of ``exp(z/T - m_b)`` re-read from the cache. It writes the token and gathers the
   next step's code ``W1[token]``.

The tokens follow ``softmax(cache / T)`` in distribution (fp32 rounding aside); they are not the
Gumbel path's tokens. A zero-probability token (``z = -inf`` or ``exp`` underflow to 0) is never
drawn: both scans only stop on entries of positive weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import pick
from ..ops.noise import draft_prefix, inverse_cdf_uniform
from ..ops.numerics import biased_logits, block_argmax, to_float32, weight_bias
from ..ops.rows import gather_code, sample_slot, sample_slots, slot_seed, slot_temperature
from ..validate import check_power_of_two
from .bias_gemm import BiasGemm

# Vocabulary block per device. On the GPU the kernels stream ~6 bytes per logit; 4096-wide blocks
# with 8 warps keep the loads 16-byte vectorised (when V and the strides are multiples of 16), and
# small batches use narrower blocks so that kernel 1 still spreads over the 132 SMs (1 row:
# 127 programs of 1024). The interpreter (CPU) pays per program, not per element, so a modest
# block keeps several blocks per row in the tests.
GPU_BLOCKS = ((4, 1024), (32, 2048))  # (at most this many rows, block); larger batches: 4096
GPU_BLOCK_LARGE = 4096
CPU_BLOCK = 256


@triton.jit
def _prepare_rows_kernel(
    anchor_ptr,  # [R] int32/int64
    idx_ptr, pos_ptr,  # [R*N] int32/int64
    seed_ptr,  # [S] int64
    embed_ptr, stride_embed,  # [V_t, R_k] weight dtype
    codes_ptr, stride_codes,  # [max_rows, R_k] weight dtype (CUDA) or fp32 (CPU)
    uniform_ptr,  # [max_rows, N] fp32
    num_steps, num_slots, embed_vocab, rank,
    STEPS_P2: tl.constexpr,
    RANK_BLOCK: tl.constexpr,
):
    """Per row, once per call: the step-0 code W1[anchor] and the N inverse-CDF uniforms.

    The uniform of step i is ``uniform32(hash(seed ^ (i << 32), (P - 1) + 2^30, 0xFFFFFFFF))``;
    hashing all N keys of the row here, vectorised, keeps the per-step kernels free of it.
    Bytes: reads ``R (8 + 24 N + R_k |w|)``, writes ``R (R_k |codes| + 4 N)``.
    """
    row = tl.program_id(0).to(tl.int64)
    anchor = tl.load(anchor_ptr + row)
    gather_code(embed_ptr, stride_embed, anchor, embed_vocab, codes_ptr + row * stride_codes, rank, RANK_BLOCK)

    steps = tl.arange(0, STEPS_P2)
    sample = row * num_steps + steps
    in_row = steps < num_steps
    live, slot = sample_slots(idx_ptr, sample, in_row, num_slots)
    seed = slot_seed(seed_ptr, slot, live)  # padding: seed 0
    position = tl.load(pos_ptr + sample, mask=in_row, other=0).to(tl.int64)
    uniform = inverse_cdf_uniform(draft_prefix(seed, steps, position))
    tl.store(uniform_ptr + row * num_steps + steps, uniform, mask=in_row)


@triton.jit(do_not_specialize=["step"])
def _logits_partials_kernel(
    base_ptr, stride_base_row, stride_base_step,  # [R, N, V] bf16/fp32, last stride 1
    bias_ptr, stride_bias,  # [max_rows, V] weight dtype
    idx_ptr,  # [R*N] int32/int64 slots, -1 = padding
    temp_ptr,  # [S] fp32
    cache_ptr, stride_cache_slot,  # [S, N, V] bf16/fp32, step stride V
    arg_value_ptr, arg_index_ptr, block_max_ptr, block_mass_ptr, stride_part,  # [max_rows, max_blocks]
    step, num_steps, vocab, num_slots, scale,
    HAS_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """z = round(U + bias) into the cache, plus per-block argmax and softmax partials.

    Bytes: reads ``R V (|U| + |w|)``, writes ``R V |cache|`` (live samples) and ``16 R B`` partials.
    """
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    live, slot = sample_slot(idx_ptr, row * num_steps + step, num_slots)  # out-of-range slots count as padding
    temp = slot_temperature(temp_ptr, slot, live)

    cols = block * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    base = tl.load(base_ptr + row * stride_base_row + step * stride_base_step + cols, mask=in_vocab, other=0.0)
    bias = tl.load(bias_ptr + row * stride_bias + cols, mask=in_vocab, other=0.0)
    bias = weight_bias(bias, scale, bias_ptr.dtype.element_ty, HAS_SCALE)  # MarkovHead.round_scaled
    z = biased_logits(base, bias, cache_ptr.dtype.element_ty)  # one rounding
    write_limit = tl.where(live, vocab, 0)  # padding samples never write the cache
    tl.store(cache_ptr + slot * stride_cache_slot + step * vocab + cols, z, mask=cols < write_limit)
    z = to_float32(z)

    # NaN-aware argmax of the block: (NaN, first NaN index) or (max, first index of the max).
    arg_value, arg_index = block_argmax(z, cols, in_vocab)
    block_top = tl.where(arg_value == arg_value, arg_value, float("-inf"))  # the max of z (NaN rows go greedy)

    # Softmax partials of z / T (division in fp32, correctly rounded); T == 0 rows never use them.
    # A correctly rounded division by T > 0 is monotone, so max(z / T) is block_top / T exactly
    # (a NaN block goes to the argmax anyway).
    safe_temp = tl.where(temp > 0.0, temp, 1.0)
    scaled = tl.where(in_vocab, tl.math.div_rn(z, tl.zeros_like(z) + safe_temp), float("-inf"))
    block_max = tl.math.div_rn(block_top, safe_temp)
    finite_max = (block_max > float("-inf")) & (block_max < float("inf"))
    shift = tl.where(finite_max, block_max, 0.0)
    block_mass = tl.sum(tl.where(in_vocab, tl.exp(scaled - shift), 0.0), axis=0)

    part = row * stride_part + block
    tl.store(arg_value_ptr + part, arg_value)
    tl.store(arg_index_ptr + part, arg_index)
    tl.store(block_max_ptr + part, block_max)
    tl.store(block_mass_ptr + part, block_mass)


@triton.jit(do_not_specialize=["step"])
def _pick_token_kernel(
    arg_value_ptr, arg_index_ptr, block_max_ptr, block_mass_ptr, stride_part,  # [max_rows, max_blocks]
    idx_ptr,  # [R*N] int32/int64
    temp_ptr,  # [S] fp32
    uniform_ptr,  # [max_rows, N] fp32, from _prepare_rows_kernel
    cache_ptr, stride_cache_slot,  # [S, N, V] bf16/fp32
    tokens_ptr, stride_tokens_row, stride_tokens_step,  # [R, N] int64
    embed_ptr, stride_embed,  # [V_t, R_k]
    codes_ptr, stride_codes,  # [max_rows, R_k]
    step, num_steps, vocab, num_slots, num_blocks, embed_vocab, rank,
    BLOCKS_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    RANK_BLOCK: tl.constexpr,
):
    """The row's token (argmax or inverse CDF), written out, and the next step's code W1[token].

    Bytes: reads ``16 R B + R BLOCK |cache| + R R_k |w|`` (the cache block only for T > 0 rows),
    writes ``8 R + R R_k |codes|``.
    """
    row = tl.program_id(0).to(tl.int64)
    sample = row * num_steps + step
    live, slot = sample_slot(idx_ptr, sample, num_slots)
    temp = slot_temperature(temp_ptr, slot, live)

    blocks = tl.arange(0, BLOCKS_P2)
    in_row = blocks < num_blocks
    part = row * stride_part + blocks
    arg_value = tl.load(arg_value_ptr + part, mask=in_row, other=float("-inf"))
    arg_index = tl.load(arg_index_ptr + part, mask=in_row, other=vocab)
    block_max = tl.load(block_max_ptr + part, mask=in_row, other=float("-inf"))
    block_mass = tl.load(block_mass_ptr + part, mask=in_row, other=0.0)

    # Combined argmax_first: the blocks are in vocabulary order, so the smallest index wins ties.
    row_value, token = block_argmax(arg_value, arg_index, in_row)
    row_max = tl.max(block_max, axis=0)  # max of z / T (the division is monotone)
    if pick.draws(live, temp, row_value != row_value, row_max):
        chosen, remaining, chosen_scale, chosen_max = pick.pick_block(block_max, block_mass, in_row, row_max,
                                                                      tl.load(uniform_ptr + sample), BLOCKS_P2)
        cols = chosen * BLOCK + tl.arange(0, BLOCK)
        in_vocab = cols < vocab
        z = to_float32(tl.load(cache_ptr + slot * stride_cache_slot + step * vocab + cols, mask=in_vocab, other=0.0))
        token = pick.pick_token(z, temp, cols, in_vocab, chosen_scale, chosen_max, remaining, vocab)

    tl.store(tokens_ptr + row * stride_tokens_row + step * stride_tokens_step, token.to(tl.int64))
    gather_code(embed_ptr, stride_embed, token, embed_vocab, codes_ptr + row * stride_codes, rank, RANK_BLOCK)


class InverseCdfBackend:
    """Inverse-CDF drafting: per step a torch bias GEMM and two Triton kernels (SPEC.md section 5).

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` (W1 ``[V_t, R_k]``, W2 ``[V, R_k]``), on ``device``.
    num_steps : N. max_rows : the largest batch ``R`` given to :meth:`run`.
    method : ``"inverse_cdf"``. cache_dtype : bf16 or fp32 (the cache passed to :meth:`run`).
    device : the head's device (``cpu`` runs the kernels in Triton's interpreter).
    block_size : vocabulary block (a power of two >= 16); default on CUDA: 1024 / 2048 / 4096 for
        up to 4 / up to 32 / more rows; 256 on the CPU. A fixed value is mainly for tests.

    Scratch allocated here, once: a :class:`~.bias_gemm.BiasGemm` (codes ``[max_rows, R_k]``,
    which kernel 0 and the pick kernel fill, and the weight-dtype bias ``[max_rows, V]``), and four
    per-block partials ``[max_rows, ceil(V / smallest block)]``. :meth:`run` only
    launches work, so it is CUDA-graph capturable: capture once, refill the input tensors, replay.
    """

    METHODS = ("inverse_cdf",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block_size=None):
        if method not in self.METHODS:
            raise ValueError(f"method: impl 'inverse_cdf' supports 'inverse_cdf', got {method!r}")
        device = torch.device(device)
        if block_size is not None:
            block_size = int(block_size)
            check_power_of_two("block_size", block_size, 16)
        self.head = head
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.cache_dtype = cache_dtype
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.block_size = block_size
        vocab, rank = head.vocab_size, head.rank
        smallest = block_size or (GPU_BLOCKS[0][1] if self.on_cuda else CPU_BLOCK)
        self.max_blocks = triton.cdiv(vocab, smallest)
        rows = self.max_rows
        self.gemm = BiasGemm(head, rows, device)  # codes [max_rows, R_k] (filled by kernel 0), bias [max_rows, V]
        self.arg_value = torch.zeros(rows, self.max_blocks, dtype=torch.float32, device=device)
        self.arg_index = torch.zeros(rows, self.max_blocks, dtype=torch.int32, device=device)
        self.block_max = torch.zeros(rows, self.max_blocks, dtype=torch.float32, device=device)
        self.block_mass = torch.zeros(rows, self.max_blocks, dtype=torch.float32, device=device)
        self.uniforms = torch.zeros(rows, self.num_steps, dtype=torch.float32, device=device)
        self.rank_block = triton.next_power_of_2(rank)
        # Stand-ins for the per-slot tensors when S == 0 (never read: every load is masked off).
        self.no_temperature = torch.zeros(1, dtype=torch.float32, device=device)
        self.no_seeds = torch.zeros(1, dtype=torch.int64, device=device)
        self.no_cache = torch.zeros(1, self.num_steps, vocab, dtype=cache_dtype, device=device)

    def _block_for(self, rows: int) -> int:
        if self.block_size is not None:
            return self.block_size
        if not self.on_cuda:
            return CPU_BLOCK
        for most_rows, block in GPU_BLOCKS:
            if rows <= most_rows:
                return block
        return GPU_BLOCK_LARGE

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` int64 and fill ``logits_cache`` ``[S, N, V]``.

        Inputs as validated by :func:`~dspark_markov.validate.check_draft_inputs`: base_logits
        ``[R, N, V]`` bf16/fp32 (last stride 1); anchor ``[R]``; idx_mapping/positions ``[R*N]``
        int32/int64; temperature ``[S]`` fp32; seeds ``[S]`` int64. ``R <= max_rows``. No
        allocation and no host synchronisation (CUDA-graph safe).

        Bytes per step (kernel 1): ``R V (|U| + |w| + |cache|)`` plus 16 bytes per block and row;
        kernel 2: ``R (BLOCK |cache| + 16 blocks + 2 |w| R_k)``. The GEMM reads W2 once (``V R_k |w|``).
        """
        rows, steps, vocab = base_logits.shape
        head = self.head
        block = self._block_for(rows)
        num_blocks = triton.cdiv(vocab, block)
        num_slots = temperature.shape[0]
        if num_slots == 0:  # every row is padding: point the per-slot loads (all masked) at scratch
            temperature, seeds, logits_cache = self.no_temperature, self.no_seeds, self.no_cache
        num_warps = 8 if block >= 4096 else 4  # 16 elements per thread at 4096 and 2048, 8 at 1024
        embed = head.embed_weight
        scale = float(head.scale)
        gemm = self.gemm
        codes = gemm.codes

        _prepare_rows_kernel[(rows,)](
            anchor,  # [R]
            idx_mapping, positions,  # [R*N]
            seeds,  # [S]
            embed, embed.stride(0),  # [V_t, R_k]
            codes, codes.stride(0),  # [max_rows, R_k]
            self.uniforms,  # [max_rows, N]
            steps, num_slots, head.embed_vocab_size, head.rank,
            STEPS_P2=triton.next_power_of_2(steps), RANK_BLOCK=self.rank_block,
            num_warps=1 if self.rank_block <= 128 else 2, enable_fp_fusion=False,
        )
        for step in range(steps):
            gemm.compute(rows)  # scale is applied in kernel 1
            _logits_partials_kernel[(rows, num_blocks)](
                base_logits, base_logits.stride(0), base_logits.stride(1),  # [R, N, V]
                gemm.bias, gemm.bias.stride(0),  # [max_rows, V]
                idx_mapping,  # [R*N]
                temperature,  # [S]
                logits_cache, logits_cache.stride(0),  # [S, N, V]
                self.arg_value, self.arg_index, self.block_max, self.block_mass, self.max_blocks,  # [max_rows, max_blocks]
                step, steps, vocab, num_slots, scale,
                HAS_SCALE=scale != 1.0, BLOCK=block, num_warps=num_warps, enable_fp_fusion=False,
            )
            _pick_token_kernel[(rows,)](
                self.arg_value, self.arg_index, self.block_max, self.block_mass, self.max_blocks,  # [max_rows, max_blocks]
                idx_mapping,  # [R*N]
                temperature,  # [S]
                self.uniforms,  # [max_rows, N]
                logits_cache, logits_cache.stride(0),  # [S, N, V]
                draft_tokens, draft_tokens.stride(0), draft_tokens.stride(1),  # [R, N]
                embed, embed.stride(0),  # [V_t, R_k]
                codes, codes.stride(0),  # [max_rows, R_k]
                step, steps, vocab, num_slots, num_blocks, head.embed_vocab_size, head.rank,
                BLOCKS_P2=triton.next_power_of_2(num_blocks), BLOCK=block, RANK_BLOCK=self.rank_block,
                num_warps=num_warps, enable_fp_fusion=False,
            )
