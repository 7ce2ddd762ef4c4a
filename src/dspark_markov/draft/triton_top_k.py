"""``MarkovSampler(draft_top_k=k, impl="fused")``: top-k candidate drafting in three phases per call
(``torch.topk``, one chain kernel, one cache kernel).

The mode (README "Top-k drafting", reference :mod:`.modes_reference`): ``torch.topk(base_logits, k)``
once for all positions; per step only the k candidates get the bias,
``round_cache(values + scale * W2[index] @ W1[prev])`` (fp32 sum, one rounding, as vLLM's
``baddbmm``), the rest of the row is ``-inf``; the Gumbel draw runs on that row. Since every other
entry is ``-inf``, the row's Gumbel argmax is the argmax over the k candidates (keys by target id,
ties to the lowest target id; an all ``-inf`` row gives token 0 as ``torch.argmax`` does), so the
chain never needs the full row:

1. ``torch.topk`` into persistent buffers (the call vLLM's loop makes; CUDA-graph safe with ``out=``);
2. :func:`_top_k_chain_kernel`, one program per row running all N steps: the row's W1[prev] code,
   the k candidates' W2 rows gathered on the fly (CUDA cores; ``k * R_k`` products a step), the
   corrected values, their exact Gumbel keys, the argmax, the next ``prev``; it writes the tokens,
   the corrected candidates and their target ids ``[R, N, k]`` (and, if asked, the Markov
   embeddings ``[R, N, R_k]`` it loaded);
3. :func:`_top_k_cache_kernel`, one program per (sample, column tile) of the cache: the tile of
   ``-inf`` and then, after a barrier, the candidates that fall into the tile -- each cache element
   is written once (plus k candidates), with no separate fill pass; padding samples write nothing.

Bytes per call: topk reads ``R N V_d u``; the chain ``R N (k (R_k w + 8 + u + c + 4) + 2 R_k w)``;
the cache kernel writes ``R N V_t c``. vLLM's loop moves ``R N V_d u`` (topk) ``+ R N V_d u``
(fill) and per step the dense row again (scatter target, ``gumbel_sample`` read, cache write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.constants import MAX_TOP_K
from ..ops.filter import exact_keys
from ..ops.noise import draft_prefix
from ..ops.numerics import block_argmax, round_to, row_token, to_float32
from ..ops.rows import draft_row, sample_slot



@triton.jit(do_not_specialize=["num_steps"])
def _top_k_chain_kernel(
    values_ptr,  # [max_rows, N, K] logit dtype: torch.topk values, contiguous
    index_ptr,  # [max_rows, N, K] int64: their draft ids
    d2t_ptr,  # [V_d] int64 target id of each draft id (D2T only)
    anchor_ptr,  # [R] int32/int64
    embed_ptr,  # [V_t, R_k] weight dtype (W1, target-indexed)
    head_ptr,  # [V_d, R_k] weight dtype (W2, draft-indexed)
    idx_ptr,  # [R * N] slot per (row, step), -1 = padding
    pos_ptr,  # [R * N]
    temp_ptr,  # [S] fp32
    seed_ptr,  # [S] int64
    z_ptr,  # [max_rows, N, KB] cache dtype out: corrected candidates
    ids_ptr,  # [max_rows, N, KB] int32 out: their target ids
    tokens_ptr,  # [R, N] int64 out, row stride stride_tr
    embeds_ptr,  # [R, N, R_k] weight dtype out (EMBEDS only)
    num_steps,
    num_slots,
    embed_rows,
    draft_vocab,
    k,
    stride_tr,
    scale,
    RK: tl.constexpr,
    KB: tl.constexpr,
    BLOCK_RANK: tl.constexpr,
    SCALED: tl.constexpr,
    D2T: tl.constexpr,
    EMBEDS: tl.constexpr,
):
    """All N steps of one row over its k candidates. Moves ``N (k (R_k w + 8 + u + c + 4) + 2 R_k w)`` bytes."""
    row = tl.program_id(0).to(tl.int64)
    cand = tl.arange(0, KB)
    ok = cand < k
    prev = tl.minimum(tl.maximum(tl.load(anchor_ptr + row).to(tl.int64), 0), embed_rows - 1)
    for step in range(num_steps):
        sample = row * num_steps + step
        live, slot, temp, seed, position = draft_row(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, num_slots)
        index = tl.load(index_ptr + sample * k + cand, mask=ok, other=0)
        index = tl.minimum(tl.maximum(index, 0), draft_vocab - 1)
        values = to_float32(tl.load(values_ptr + sample * k + cand, mask=ok, other=0.0))
        acc = tl.zeros([KB], dtype=tl.float32)
        for start in range(0, RK, BLOCK_RANK):
            ranks = start + tl.arange(0, BLOCK_RANK)
            in_rank = ranks < RK
            code = tl.load(embed_ptr + prev * RK + ranks, mask=in_rank, other=0.0)
            if EMBEDS:
                tl.store(embeds_ptr + sample * RK + ranks, code, mask=in_rank)
            weights = tl.load(head_ptr + index[:, None] * RK + ranks[None, :], mask=ok[:, None] & in_rank[None, :],
                              other=0.0)
            acc += tl.sum(to_float32(weights) * to_float32(code)[None, :], axis=1)
        if SCALED:
            acc = acc * scale
        z = round_to(values + acc, z_ptr.dtype.element_ty)  # one rounding (vLLM's baddbmm)
        if D2T:
            target = tl.load(d2t_ptr + index).to(tl.int32)
        else:
            target = index.to(tl.int32)
        tl.store(z_ptr + sample * KB + cand, z, mask=ok)
        tl.store(ids_ptr + sample * KB + cand, target, mask=ok)
        greedy = temp == 0.0
        keys = exact_keys(to_float32(z), greedy, temp, draft_prefix(seed, step, position), target, 0)
        best, token = block_argmax(keys, target, ok)
        token = row_token(best, token).to(tl.int64)
        tl.store(tokens_ptr + row * stride_tr + step, token)
        prev = tl.minimum(tl.maximum(token, 0), embed_rows - 1)


@triton.jit
def _top_k_cache_kernel(
    z_ptr,  # [max_rows, N, KB] cache dtype: corrected candidates
    ids_ptr,  # [max_rows, N, KB] int32: their target ids
    idx_ptr,  # [R * N]
    cache_ptr,  # [S, N, V_t] cache dtype
    num_steps,
    num_slots,
    width,
    k,
    stride_cs,
    KB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One cache tile of one live sample: -inf, then its candidates. Writes ``BLOCK c`` (+ ``k c``) bytes."""
    sample = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    live, slot = sample_slot(idx_ptr, sample, num_slots)
    if live:
        step = sample % num_steps
        row_ptr = cache_ptr + slot * stride_cs + step * width
        start = tile * BLOCK
        cols = start + tl.arange(0, BLOCK)
        tl.store(row_ptr + cols, round_to(tl.full([BLOCK], float("-inf"), tl.float32), cache_ptr.dtype.element_ty), mask=cols < width)
        # The candidates overwrite their -inf: a barrier orders the two stores of one program.
        tl.debug_barrier()
        cand = tl.arange(0, KB)
        ids = tl.load(ids_ptr + sample * KB + cand, mask=cand < k, other=-1)
        in_tile = (cand < k) & (ids >= start) & (ids < start + BLOCK)
        z = tl.load(z_ptr + sample * KB + cand, mask=in_tile, other=0.0)
        tl.store(row_ptr + ids, z, mask=in_tile)


class TopKFusedBackend:
    """torch.topk + the chain kernel + the cache kernel (Gumbel; with or without ``d2t``).

    Scratch (allocated once): topk values ``[max_rows, N, k]`` (bf16 and fp32) and indices, the
    corrected candidates ``[max_rows, N, KB]`` and their target ids. ``run`` allocates nothing and is
    CUDA-graph safe (``torch.topk(..., out=)``).
    """

    METHODS = ("gumbel",)
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None
    D2T = True
    MARKOV_EMBEDS = True

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, draft_top_k, block=None,
                 num_warps=4):
        if draft_top_k > MAX_TOP_K:
            raise ValueError(f"draft_top_k: impl 'fused' takes at most {MAX_TOP_K} candidates, got {draft_top_k}; "
                             "use impl='reference'")
        self.head = head
        self.k = int(draft_top_k)
        self.kb = max(16, triton.next_power_of_2(self.k))
        self.block_rank = max(16, min(triton.next_power_of_2(head.rank), 8192 // self.kb))
        interpret = torch.device(device).type == "cpu"
        self.block = block or (512 if interpret else 2048)
        self.num_warps = num_warps
        shape = (max_rows, num_steps, self.k)
        self.values = {dtype: torch.empty(shape, dtype=dtype, device=device) for dtype in (torch.bfloat16, torch.float32)}
        self.index = torch.empty(shape, dtype=torch.int64, device=device)
        self.z = torch.empty(max_rows, num_steps, self.kb, dtype=cache_dtype, device=device)
        self.ids = torch.empty(max_rows, num_steps, self.kb, dtype=torch.int32, device=device)
        self.d2t = head.d2t_index if head.d2t_index is not None else self.index  # a placeholder pointer without d2t

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache,
            markov_embeds=None):
        self.select(base_logits)
        self.chain(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, markov_embeds)
        self.write_cache(base_logits, idx_mapping, temperature, logits_cache)

    # The three phases (separately timed by tools/bench_modes.py --breakdown).
    def select(self, base_logits):
        """torch.topk of every position into the persistent buffers. Reads ``R N V_d u`` bytes."""
        rows = base_logits.shape[0]
        torch.topk(base_logits, self.k, dim=-1, out=(self.values[base_logits.dtype][:rows], self.index[:rows]))

    def chain(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, markov_embeds=None):
        """The N steps of every row over its candidates (:func:`_top_k_chain_kernel`)."""
        head = self.head
        rows, steps, _ = base_logits.shape
        values, index = self.values[base_logits.dtype][:rows], self.index[:rows]  # [R, N, k]
        embeds = markov_embeds if markov_embeds is not None else self.z
        _top_k_chain_kernel[(rows,)](
            values, index, self.d2t, anchor, head.embed_weight, head.head_weight, idx_mapping, positions,
            temperature, seeds, self.z, self.ids, draft_tokens, embeds,
            steps, temperature.shape[0], head.embed_vocab_size, head.draft_vocab_size, self.k,
            draft_tokens.stride(0), head.scale,
            RK=head.rank, KB=self.kb, BLOCK_RANK=self.block_rank, SCALED=head.scale != 1.0,
            D2T=head.d2t_index is not None, EMBEDS=markov_embeds is not None, num_warps=self.num_warps,
            enable_fp_fusion=False)

    def write_cache(self, base_logits, idx_mapping, temperature, logits_cache):
        """The -inf rows with their candidates (:func:`_top_k_cache_kernel`). Writes ``R N V_t c`` bytes."""
        rows, steps, _ = base_logits.shape
        width = self.head.cache_vocab_size
        _top_k_cache_kernel[(rows * steps, triton.cdiv(width, self.block))](
            self.z, self.ids, idx_mapping, logits_cache, steps, temperature.shape[0], width, self.k,
            logits_cache.stride(0), KB=self.kb, BLOCK=self.block, num_warps=self.num_warps, enable_fp_fusion=False)
