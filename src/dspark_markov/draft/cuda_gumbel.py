"""``impl="cuda_gumbel"``: ``gumbel_fused`` with its Gumbel block kernel in CUDA C++ (large batches).

Per step (three launches, as ``gumbel_fused``; before step 0 one clamp and one embedding gather):

1. ``bias = W2 @ codes`` (the same cuBLAS GEMM as ``gumbel_fused`` and vLLM's loop, so the cache is
   theirs bit for bit);
2. ``dspark_markov/cuda/blocks.cu`` (NVRTC at first use, cached): one warp per work item (row, chunk
   of :data:`CHUNK` tokens), ``z = round_cache(float(U) + float(bias))``, the cache rows of live samples,
   every token ranked by an exact upper bound of its key from a per-hash-bucket noise table (no
   logarithm), exact keys only for the tokens whose bound can still reach the work item's best;
3. the Triton combine of ``gumbel_fused`` (:func:`.triton_blocks.launch_combine`): the token,
   ``draft_tokens``, ``prev`` and the next step's codes.

Why: ``gumbel_fused``'s Triton block kernel is compute-bound at large batches (Nsight Compute, H200,
253 rows: 182 us per step at 77% SM throughput, 136 M warp instructions, ~133 instructions per logit;
the cuBLAS GEMM 38 us, the combine 3 us). This kernel executes 65.7 M warp instructions per step at
253 rows (~64 per logit, everything included) and takes ~120 us per step (u3, variant 0; latency-bound:
31% of DRAM bandwidth, an eligible warp in 63% of cycles).

Measured (H200, V = 129,280, rank 256, N = 5, CUDA graph, cold L2; benchmarks/results/
NVIDIA-H200_2026-12-04_large4_{bf16,fp32_fp32-logits}.json), us per call at 32 / 64 / 128 / 253 rows:
bf16 cache, T = 1: 254.0 / 303.6 / 468.8 / 742.9 (vLLM's loop 346.6 / 497.4 / 810.0 / 1410.9; gumbel_fused
261.2 / 385.4 / 636.8 / 1128.4; fused 216.2 / 349.0 / 661.4 / 1257.7); mixed T 247.8 / 299.3 / 464.2 / 741.6;
fp32 logits and cache 349.9 / 781.0 at 64 / 253 (vLLM's loop 564.4 / 1663.0). Tokens and cache equal
gumbel_fused's bit for bit in every GPU test (same GEMM).

Requirements (``ValueError`` otherwise): a CUDA device of compute capability 9.0 with NVRTC
(:func:`dspark_markov.cuda.availability`) and bf16 weights. Base logits bf16 or fp32, cache bf16 or
fp32, any mix of temperatures, padding rows. The draws are the reference's from the cached logits.
"""

from __future__ import annotations

import ctypes

import torch

from ..ops.constants import FILTER_MARGIN
from ..validate import check_int
from .bias_gemm import clamp_anchor
from .triton_blocks import GumbelBlocksBackend, launch_combine

CHUNK = 512  # tokens per chunk: 16 per lane of one warp (blocks.cu DM_CHUNK)
# Chunks per work item (one warp, one partial). Default (range_chunks=None): by the call's batch, 8 (4096 tokens)
# when that still gives every resident warp a work item, else 4. Measured on the H200 (u3, variant 13, T = 1):
# 253 rows 750.5 us with 8 against 783.1 with 4; 64 rows 305.9 with 4 against 355.6 with 8 (338.1 with 1).
# u4 (..._large4_u4.txt): 16 chunks took 717.5 us at 253 rows (8: 745.3), 435.5 at 64: not yet the default.
RANGE = None
BASE_RANGE = 4  # the partial buffers' work item (a call's range is this or twice it)
THREADS = 256  # blocks.cu DM_BT
BLOCKS_PER_SM = None  # default: as many as are resident at once (the driver's occupancy of the entry point)
# Run-time hints (blocks.cu DM_BF_*; they never change a draw): the next work item's lines requested into L2.
FLAG_PREFETCH = 1
FLAG_COMBINE = 2  # the row's last work item merges the row (no combine launch; blocks.cu DM_BF_COMBINE)
FLAGS_ALL = FLAG_PREFETCH | FLAG_COMBINE
DEFAULT_FLAGS = 0
# Compile-time variants of the bf16-base / bf16-cache / 16-byte / unscaled path (blocks.cu DM_X_*; never a
# different draw): 1 = bf16 rounding by cvt.rn.bf16x2.f32 (NaN payload fixed to torch's), 2 = the next work
# item's loads in flight during this item's seed and phase 2, 4 = four blocks per SM (<= 64 registers; launch
# with blocks_per_sm=4), 8 = chunks of 256 tokens (8 per lane; 64 registers with bit 4, no spill). Other paths
# run variant 0 (with chunks of 512 tokens: a work item has CHUNK * range_chunks tokens either way).
VARIANTS = (0, 1, 2, 3, 5, 7, 13, 15)
# H200 u3 (N = 5, bf16, T = 1): variant 13 783.1 us at 253 rows and 305.9 at 64 (range 4), against 808.7 / 351.0 for
# variant 1 and 821.4 / 355.7 for 3 (three blocks per SM, 80 registers); 15 (+ pipelined loads) 784.8 / 307.4.
DEFAULT_VARIANT = 13


class BlocksArgs(ctypes.Structure):
    """The kernel's one argument (``struct BlocksArgs`` in blocks.cu): 8-byte fields, in order."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "base", "bias", "cache", "idx", "pos", "temp", "seeds", "block_max", "block_token", "gtab")] + [
        (name, ctypes.c_int64) for name in (
            "rows", "vocab", "num_slots", "num_steps", "step", "chunks", "chunk_lo", "bias_lo", "range", "stride_br",
            "stride_bn", "stride_bias",
            "stride_cs", "stride_part", "idx64", "pos64", "has_scale", "flags")] + [
        (name, ctypes.c_uint64) for name in ("counts", "tokens", "prev", "embed", "codes")] + [
        (name, ctypes.c_int64) for name in ("total_chunks", "tokens_row_stride", "tokens_step_stride", "embed_rows",
                                            "rank", "codes_row_stride", "gather")] + [
        ("scale", ctypes.c_double), ("filter_margin", ctypes.c_double)]


def _aligned16(tensor: torch.Tensor, dims) -> bool:
    return tensor.data_ptr() % 16 == 0 and all(tensor.stride(d) * tensor.element_size() % 16 == 0 for d in dims)


class CudaGumbelBackend(GumbelBlocksBackend):
    """Backend of ``impl="cuda_gumbel"`` (Gumbel-max only, bf16 weights, sm_90 with NVRTC).

    Parameters as :class:`~.triton_blocks.GumbelBlocksBackend`, plus ``blocks_per_sm`` (resident
    blocks per SM of the launch; default: as many as can be resident at once, since every warp takes a
    contiguous run of work items), ``filter_margin`` (the slack of the bound test; a huge value makes every token
    exact), ``range_chunks`` (chunks of :data:`CHUNK` tokens per work item and partial; default :data:`RANGE`:
    by the call's batch),
    ``flags`` (:data:`FLAG_PREFETCH`, :data:`FLAG_COMBINE`), ``slices`` (vocabulary slices per step, each its own GEMM
    and block launch) and ``variant`` (:data:`VARIANTS`). Scratch (the bias GEMM's
    buffers, partials ``[max_rows, cdiv(V, CHUNK * range_chunks)]``, the noise table) is allocated once; ``run``
    only launches (CUDA-graph safe).
    """

    NAME = "cuda_gumbel"
    DEVICES = ("cuda",)

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, blocks_per_sm=BLOCKS_PER_SM,
                 filter_margin=FILTER_MARGIN, flags=DEFAULT_FLAGS, slices=1, variant=DEFAULT_VARIANT, range_chunks=RANGE):
        from .. import cuda

        if blocks_per_sm is not None:
            blocks_per_sm = check_int("blocks_per_sm", blocks_per_sm, 1)
        if range_chunks is not None and (isinstance(range_chunks, bool) or not isinstance(range_chunks, int)
                                         or range_chunks not in (1, 2, 4, 8, 16)):
            raise ValueError(f"range_chunks: expected 1, 2, 4, 8 or 16, got {range_chunks!r}")
        # A negative margin would skip tokens whose exact key can still win (NaN likewise): never a silent wrong draw.
        if isinstance(filter_margin, bool) or not isinstance(filter_margin, (int, float)) or not filter_margin >= 0:
            raise ValueError(f"filter_margin: expected a number >= 0, got {filter_margin!r}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: impl 'cuda_gumbel' runs on CUDA devices, got {device}")
        why = cuda.availability(device, build=False)
        if why is not None:
            raise ValueError(f"impl: 'cuda_gumbel' cannot run here: {why}")
        why = self.head_reason(head)
        if why is not None:
            raise ValueError(f"head_weight: {why}")
        if cache_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"cache_dtype: expected torch.bfloat16 or torch.float32, got {cache_dtype}")
        self.fixed_range = range_chunks is not None
        self.range = int(range_chunks) if self.fixed_range else BASE_RANGE
        super().__init__(head, num_steps, max_rows, method=method, cache_dtype=cache_dtype, device=device,
                         block=CHUNK * self.range)  # one partial per work item (at most)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        from ..cuda import build

        try:
            self.kernels = cuda.blocks_kernels(index)
            self.noise_table = cuda.noise_table(index)
        except build.BuildError as error:
            raise ValueError(f"impl: 'cuda_gumbel' cannot run here: {error}") from error
        self.num_sms = torch.cuda.get_device_properties(index).multi_processor_count
        self.blocks_per_sm = None if blocks_per_sm is None else int(blocks_per_sm)
        # Entry point -> blocks per SM resident at once, queried here for every entry point: never a driver
        # query at a first call inside a CUDA-graph capture.
        self._resident = {name: max(1, self.kernels.blocks_per_sm(name, THREADS, 0))
                          for name in cuda.BLOCKS_KERNELS if name.startswith("dm_blocks_b")}
        self.filter_margin = float(filter_margin)
        if int(flags) < 0 or int(flags) & ~FLAGS_ALL:
            raise ValueError(f"flags: expected a combination of the FLAG_* bits ({FLAGS_ALL} = all), got {flags}")
        self.flags = int(flags)
        self.counts = torch.zeros(self.max_rows, dtype=torch.int32, device=self.device)  # FLAG_COMBINE arrivals
        if self.flags & FLAG_COMBINE:  # packed words; a run of items fills only its first slot
            self.block_token.fill_(-(2**63))
        if int(variant) not in VARIANTS:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant}")
        self.variant = int(variant)
        # Vocabulary slices: per step and slice, the GEMM of the slice's bias into a buffer small enough to
        # stay in L2, then the block kernel on the slice (the bias need not go to HBM and back).
        if not 1 <= int(slices) <= self.num_blocks or (int(slices) > 1 and not self.fixed_range):
            raise ValueError(f"slices: expected 1 to {self.num_blocks} (above 1 with a given range_chunks), got {slices}")
        per = -(-self.num_blocks // int(slices))
        self.slices = [(lo, min(per, self.num_blocks - lo)) for lo in range(0, self.num_blocks, per)]
        self.slice_bias = None
        if len(self.slices) > 1:
            self.slice_bias = torch.zeros(self.max_rows * per * CHUNK * self.range, dtype=head.dtype,
                                          device=self.device)

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why this design cannot run here (no GPU, not sm_90, no NVRTC, ``blocks.cu`` does not build or
        load), or ``None``. Builds ``blocks.cu`` (cached on disk) as ``cuda_chain``'s check builds
        ``chain.cu``, so that ``auto`` falls back to the portable table instead of failing at construction."""
        from .. import cuda

        return cuda.unavailable_reason(cuda.blocks_kernels)

    @staticmethod
    def head_reason(head, num_steps=None) -> str | None:
        """Why this design cannot draft from ``head`` (its weights' dtype; any rank: the bias is a GEMM), or
        ``None``."""
        from .. import cuda

        return cuda.head_reason("cuda_gumbel", head)

    def kernel_name(self, base_logits, logits_cache) -> str:
        vec = (self.head.vocab_size % 8 == 0 and _aligned16(base_logits, (0, 1)) and _aligned16(logits_cache, (0, 1))
               and _aligned16(self.gemm.bias, (0,)) and (self.slice_bias is None or self.slice_bias.data_ptr() % 16 == 0))
        name = (f"dm_blocks_b{int(base_logits.dtype == torch.float32)}_c{int(logits_cache.dtype == torch.float32)}"
                f"_v{int(vec)}_s{int(float(self.head.scale) != 1.0)}")
        return f"{name}_x{self.variant}" if self.variant and name == "dm_blocks_b0_c0_v1_s0" else name

    def resident(self, name) -> int:
        """Blocks per SM of the launch of entry point ``name``: ``blocks_per_sm``, or all that fit at once."""
        if self.blocks_per_sm is not None:
            return self.blocks_per_sm
        return self._resident[name]  # every entry point queried in __init__

    def call_range(self, rows, name) -> int:
        """Chunks per work item of a call of ``rows`` rows through entry point ``name`` (see :data:`RANGE`)."""
        if self.fixed_range:
            return self.range
        wide = 2 * self.range
        items = rows * -(-self.head.vocab_size // (CHUNK * wide))
        return wide if items >= self.num_sms * self.resident(name) * (THREADS // 32) else self.range

    def launch_blocks(self, base_logits, idx_mapping, positions, temperature, seeds, logits_cache, bias, *, rows, step,
                      chunk_lo=0, chunks=None, draft_tokens=None, range_chunks=None, name=None):
        """One step's block kernel on work items ``[chunk_lo, chunk_lo + chunks)`` (of ``CHUNK * range`` tokens
        each) of ``rows`` rows: their cache entries (live samples) and partials. ``bias`` ``[rows, n]`` bf16 holds
        tokens from ``chunk_lo * CHUNK * range``. ``name``: the entry point (default :meth:`kernel_name`).

        Grid: ``min(rows * chunks, SMs * blocks_per_sm)`` blocks of 256 threads, every warp a contiguous run
        of the work items. Bytes: rows*n*(base bytes + 2) read + live*n*cache bytes written + rows*chunks*12.
        """
        vocab = self.head.vocab_size
        name = self.kernel_name(base_logits, logits_cache) if name is None else name
        range_chunks = self.call_range(rows, name) if range_chunks is None else range_chunks
        total = -(-vocab // (CHUNK * range_chunks))  # work items (partials) per row
        chunks = total - chunk_lo if chunks is None else chunks
        args = BlocksArgs(
            base_logits.data_ptr(), bias.data_ptr(), logits_cache.data_ptr(), idx_mapping.data_ptr(),
            positions.data_ptr(), temperature.data_ptr(), seeds.data_ptr(), self.block_max.data_ptr(),
            self.block_token.data_ptr(), self.noise_table.data_ptr(),
            rows, vocab, temperature.shape[0], self.num_steps, step, chunks, chunk_lo, chunk_lo * CHUNK * range_chunks,
            range_chunks,
            base_logits.stride(0), base_logits.stride(1), bias.stride(0), logits_cache.stride(0),
            self.block_max.stride(0), int(idx_mapping.dtype == torch.int64), int(positions.dtype == torch.int64),
            int(float(self.head.scale) != 1.0), self.flags,
            self.counts.data_ptr(), 0 if draft_tokens is None else draft_tokens.data_ptr(), self.prev.data_ptr(),
            self.gemm.gemm_embed.data_ptr(), self.gemm.codes.data_ptr(), total,
            0 if draft_tokens is None else draft_tokens.stride(0), 0 if draft_tokens is None else draft_tokens.stride(1),
            self.gemm.gemm_embed.shape[0], self.gemm.gemm_embed.shape[1], self.gemm.codes.stride(0),
            int(step + 1 < self.num_steps), float(self.head.scale), self.filter_margin)
        if name.endswith(("_x13", "_x15")):  # chunks of 256 tokens: twice as many per work item
            args.range = 2 * range_chunks
        # Every block resident by default: a warp's contiguous run of items starts at once.
        grid = min(rows * chunks, self.num_sms * self.resident(name))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self.kernels.launch(name, grid, THREADS, 0, stream, [args])

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` and write ``logits_cache`` ``[S, N, V]`` (see the module)."""
        rows = base_logits.shape[0]
        clamp_anchor(anchor, self.prev, self.head.embed_vocab_size)
        self.gemm.gather(self.prev[:rows], rows)
        vocab = self.head.vocab_size
        codes, w2 = self.gemm.codes[:rows], self.gemm.gemm_head
        name = self.kernel_name(base_logits, logits_cache)  # once per call (pointer and stride checks)
        range_chunks = self.call_range(rows, name)
        parts = -(-vocab // (CHUNK * range_chunks))  # partials per row of this call
        for step in range(self.num_steps):
            if self.slice_bias is None:
                bias = self.gemm.compute(rows)  # [rows, V] bf16, unscaled
                self.launch_blocks(base_logits, idx_mapping, positions, temperature, seeds, logits_cache, bias,
                                   rows=rows, step=step, draft_tokens=draft_tokens, range_chunks=range_chunks, name=name)
            else:
                for chunk_lo, chunks in self.slices:
                    lo, hi = chunk_lo * self.block, min((chunk_lo + chunks) * self.block, vocab)
                    bias = self.slice_bias[: rows * (hi - lo)].view(rows, hi - lo)
                    torch.matmul(codes, w2[lo:hi].t(), out=bias)
                    self.launch_blocks(base_logits, idx_mapping, positions, temperature, seeds, logits_cache, bias,
                                       rows=rows, step=step, chunk_lo=chunk_lo, chunks=chunks,
                                       draft_tokens=draft_tokens, range_chunks=range_chunks, name=name)
            if not self.flags & FLAG_COMBINE:
                launch_combine(self.block_max[:, :parts], self.block_token[:, :parts], draft_tokens, self.prev,
                               self.gemm.gemm_embed,
                               self.gemm.codes, rows=rows, step=step, vocab=self.head.vocab_size,
                               gather=step + 1 < self.num_steps)
