"""``impl="wide"``: the large-batch design (32-256 rows) with the bias on tensor cores, both methods.

Per step one persistent launch of ``programs`` programs. Program ``p`` holds one block of
``BLOCK_R`` rows (the whole batch at up to 256 rows): their codes ``W1[prev]`` ``[BLOCK_R, R_k]``
are gathered once and stay on chip, and the program walks its own run of consecutive vocabulary
tiles (worker ``p // row_blocks`` of ``W`` per row block: vocabulary order, which the inverse-CDF
pick needs; the programs of one run are consecutive, so a W2 tile read by one row block is an L2
hit for the next). Per tile:

- ``bias = codes @ W2_tile^T`` (``tl.dot``: wgmma on Hopper, fp32 accumulation, rounded once to
  the weight dtype, ``scale`` applied and rounded again when ``!= 1``); the W2 tile and the
  base-logit tile are software-pipelined ``STAGES`` deep by Triton (cp.async into shared memory;
  ``PREFETCH`` instead loads the next base tile into registers), so HBM latency hides behind the
  MMA and the epilogue;
- ``z = round_cache(float(U) + bias)`` written to the cache rows of live samples (once), and the
  tile reduced in registers: the bias is never written to memory, the base logits are read once,
  the cache is written once, W2 comes from HBM once per step.

Per-row results (SPEC.md sections 4-5), the same rules as ``impl="stream"``
(:mod:`.triton_stream`, whose tile reductions this module reuses):

- Gumbel-max (and every greedy row): the program keeps each row's best exact word (key, then
  lower index, :func:`dspark_markov.ops.numerics.pack_word`) in registers across its tiles. A tile
  skips a whole row when ``max z / T + G_MAX < best`` (:data:`.triton_stream.G_MAX` bounds every
  exact noise), and inside the tile every token whose hash-only noise bound :func:`log_noise_upper`
  (``(24 - log2(h >> 8)) ln 2``, four instructions) cannot reach ``best``; up to ``gumbel_iters``
  times each row's most promising candidate gets its exact key, the rest are ranked by approximate
  noise and only the winner's exact key is computed (all of them exactly on a near-tie). ``best`` is
  always the exact key of a real token, and a skipped token's key is strictly below it, so no token
  that ``torch.argmax`` would choose is ever skipped. At the end one ``atomic_max`` per row merges
  the programs (``share_words``: also at every tile, read back by the others); the next step
  decodes its previous tokens from these words.
- Inverse CDF (T > 0): per (row, tile) the max of ``z`` (NaN when the row holds one) and
  ``sum exp(z/T - max/T)`` (the division skipped when no row of the block has T != 1), and per
  (row, program) the same combined online over the program's tiles; then :func:`_pick_wide_kernel`
  (one program per row) picks the program by the prefix sum of program masses, the tile among its
  tiles, and re-reads only that tile of the cache for the token (the pick of ``impl="inverse_cdf"``
  with block = tile, in vocabulary order; rows whose max of ``z / T`` is not finite take the first
  argmax through the tile maxima). Greedy rows merge argmax words as above.

Bytes per step: ``V R_k w`` (W2, HBM once; ``row blocks - 1`` more from L2), ``R V u`` base
logits read, ``R V c`` cache written (live samples), ``R R_k w`` codes per program (L2), and for
inverse CDF ``8 R ceil(V / BLOCK_V)`` bytes of tile partials written (``8 (W + V / (W BLOCK_V))``
read back per row) plus ``BLOCK_V c`` per row.

Measured on the H200 (bf16 cache, T = 1, CUDA graph, cold L2; see GPU_LAYOUTS): inverse CDF
543.8 us at 253 rows and 229.4 at 64 (``impl="inverse_cdf"`` 642.0 / 277.4), 43% / 52% of the
HBM floor; mixed T 1117.2 / 284.3 (a correctly rounded division per logit); Gumbel 1504.1 / 505.3,
behind ``gumbel_fused`` / ``fused`` (1130 / 346). Triton 3.6 keeps it issue-bound: one 8-warp
program per SM (212 KB of shared memory), a wgmma waited right after issue, ``z`` computed in two
layouts (notes/large3.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import noise as rng_triton
from ..ops.filter import FILTER_MARGIN, key_slack
from ..ops.noise import INTERPRET, fast_log2
from ..ops.numerics import FLOAT32_MAX, INT64_MIN, pack_word, to_float32
from ..ops.numerics import word_token as _word_token
from ..ops.rows import draft_row, draft_rows
from ..validate import check_power_of_two
from .triton_stream import (_G_MAX, _G_MIN, _LN2_UP, _bound_inv_temp, _finish_gumbel_kernel, _greedy_words,
                            _gumbel_words, _nan_max, _prepare_kernel, _round, _word_value, first_argmax_by_tiles,
                            pick_in_tiles)

# log_noise_upper: g <= (24 - log2(h >> 8)) ln 2 + LOG_UPPER_MARGIN for every hash h (+inf for h < 256);
# checked over all 2^32 hashes with the hardware log2 by tests/gpu/test_wide_gpu.py.
LOG_UPPER_MARGIN = 2.0**-10
_LOG_UPPER_OFFSET = tl.constexpr(24 * 0.6931471805599453 + LOG_UPPER_MARGIN)
_BIG = tl.constexpr(2147483647)
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def log_noise_upper(h, HARDWARE: tl.constexpr):
    """An upper bound on the exact noise ``gumbel32(uniform32(h))`` from the hash alone (fp32), tight to ~2^-12.

    ``u = (h >> 16) 2^-16 + ((h & 0xFFFF) + 1/2) 2^-32 >= h 2^-32 >= (h >> 8) 2^-24`` (exact parts,
    monotone rounding) and ``-L(u) >= u`` (the series is ``u (1 + u p)`` with ``p >= 0``, the log
    branch holds for ``u >= 1/4`` since ``-log(1 - u) >= u + u^2 / 2``), so
    ``g = -log(-L(u)) <= -log(u) <= (24 - log2(h >> 8)) ln 2``. ``h >> 8 < 2^24`` converts to fp32
    exactly; :data:`LOG_UPPER_MARGIN` covers ``lg2.approx`` and the roundings of the fp32 logs and
    of the constants. ``h < 256`` gives ``log2(0) = -inf``, so ``+inf``: such tokens (2^-24 of all)
    always stay candidates. Four instructions (shift, convert, ``lg2``, FMA).
    """
    high = (h >> 8).to(tl.int32).to(tl.float32)
    return tl.fma(fast_log2(high, HARDWARE), -_LN2_UP, _LOG_UPPER_OFFSET)


@triton.jit
def _fast_exp2(x):
    """``2^x`` in one ``ex2.approx.ftz`` (MUFU) instruction: results below 2^-126 flush to 0 (weights that
    small never decide a draw); ``tl.exp2`` adds a denormal range fix-up of three instructions."""
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _candidate_words(z, zmax, temp, safe_temp, prefix, best_word, cols, mask, need, filter_margin,
                     ITERS: tl.constexpr, HARDWARE: tl.constexpr):
    """Best words of the sampled rows ``need`` after this tile, spending exact keys only where a token can win.

    A token is a candidate while ``z / T + log_noise_upper(h)`` reaches the row's best exact key
    (minus the slack of ``z * (1/T)`` against ``div_rn(z, T)``), or ``z`` is NaN. Up to ``ITERS``
    times, each row's candidate of highest bound gets its exact key, the best word is raised and the
    candidates are filtered again; whatever remains (many candidates: a row's first tile, NaN,
    near-ties) goes to :func:`.triton_stream._gumbel_words` (approximate ranking, exact winner).
    Keys of real tokens only ever enter the words, so the result is the exact argmax of the tile's
    tokens and ``best_word``.
    """
    inv_temp = _bound_inv_temp(safe_temp)
    h = rng_triton.hash_finish(prefix[:, None], cols)
    reach = tl.fma(z, inv_temp[:, None], log_noise_upper(h, HARDWARE))  # NaN where z is NaN
    # a lower bound of the tile's own best key: useful before any word exists
    floor = tl.math.div_rn(zmax, safe_temp) + _G_MIN
    best = _word_value(best_word)
    threshold = tl.maximum(best, floor)
    threshold = tl.where(tl.abs(threshold) < float("inf"), threshold - key_slack(threshold, filter_margin), threshold)
    candidate = need[:, None] & mask & ((reach < threshold[:, None]) == 0)  # (a NaN reach stays a candidate)
    nan_row = zmax != zmax
    for _ in tl.static_range(ITERS):
        if tl.max(tl.max(candidate.to(tl.int32), axis=1), axis=0) > 0:
            top = tl.max(tl.where(candidate, reach, float("-inf")), axis=1)
            index = tl.min(tl.where(candidate & (reach == top[:, None]), cols, _BIG), axis=1)
            has = (index != _BIG) & (nan_row == 0)
            index = tl.where(has, index, 0)
            chosen = tl.max(tl.where(cols == index[:, None], z, float("-inf")), axis=1)
            exact = tl.math.div_rn(chosen, safe_temp) + rng_triton.draft_noise(prefix, index)
            best_word = tl.where(has, tl.maximum(best_word, pack_word(exact, index)), best_word)
            best = _word_value(best_word)
            threshold = tl.maximum(best, floor)
            threshold = tl.where(tl.abs(threshold) < float("inf"), threshold - key_slack(threshold, filter_margin),
                                 threshold)
            candidate = candidate & (cols != index[:, None]) & ((reach < threshold[:, None]) == 0)
    if tl.max(tl.max(candidate.to(tl.int32), axis=1), axis=0) > 0:
        rest = need & (tl.max(candidate.to(tl.int32), axis=1) > 0)
        words = _gumbel_words(z, zmax, temp, prefix, _word_value(best_word), cols, mask, rest, filter_margin,
                              HARDWARE)
        best_word = tl.where(rest, tl.maximum(best_word, words), best_word)
    return best_word


@triton.jit
def _tile_product(codes, head_ptr, cols, col_ok, ks, RK: tl.constexpr, UPCAST: tl.constexpr, IEEE_DOT: tl.constexpr):
    """``codes @ W2[cols]^T`` ``[BLOCK_R, BLOCK_V]`` fp32 (rows of W2 outside the vocabulary read as 0)."""
    w_tile = tl.load(head_ptr + cols[:, None].to(tl.int64) * RK + ks[None, :], mask=col_ok[:, None], other=0.0)
    if UPCAST:
        w_tile = w_tile.to(tl.float32)
    if IEEE_DOT:
        acc = tl.dot(codes, tl.trans(w_tile), input_precision="ieee")
    else:
        acc = tl.dot(codes, tl.trans(w_tile))
    return acc


@triton.jit(do_not_specialize=["step", "num_rows", "num_slots", "num_row_blocks"])
def _wide_step_kernel(
    base_ptr, stride_br, stride_bn,  # [R, N, V] bf16/fp32, last stride 1
    embed_ptr,  # [V_t, R_k] weight dtype (W1)
    head_ptr,  # [V, R_k] weight dtype (W2)
    cache_ptr, stride_cs,  # [S, N, V] cache dtype, step stride V
    idx_ptr, pos_ptr,  # [R * N] slot (-1 = padding) and position per (row, step)
    temp_ptr, seed_ptr,  # [S] fp32, [S] int64
    prev_ptr,  # [max_rows] int32: previous tokens (step 0; every step for inverse CDF)
    words_ptr, stride_ws,  # [N, max_rows] int64 per-row best words
    tokens_ptr, stride_tr,  # [R, N] int64 draft tokens (Gumbel: column step - 1, written by worker 0)
    part_max_ptr, part_mass_ptr, stride_part,  # [max_rows, num_tiles] fp32 (inverse CDF)
    worker_max_ptr, worker_mass_ptr,  # [max_rows, num_tiles] fp32 (inverse CDF, columns < workers)
    num_rows, vocab, embed_rows, num_slots, step, num_steps, scale, filter_margin, num_row_blocks, tiles_per_worker,
    RK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_V: tl.constexpr,
    GUMBEL_ITERS: tl.constexpr,
    SHARE_WORDS: tl.constexpr,
    NATIVE_ROUND: tl.constexpr,
    SCALED: tl.constexpr,
    INVERSE_CDF: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    HARDWARE: tl.constexpr,
):
    """One step: row block ``pid % num_row_blocks``, the ``tiles_per_worker`` tiles of worker ``pid // num_row_blocks``.

    Bytes per program: ``BLOCK_R R_k w`` codes (L2) + per tile ``BLOCK_V R_k w`` (W2) +
    ``BLOCK_R BLOCK_V (u + c)`` (logits in, cache out) + ``8 BLOCK_R`` (inverse-CDF partials); one
    atomic per row at the end.
    """
    pid = tl.program_id(0)
    row_block = pid % num_row_blocks
    worker = pid // num_row_blocks
    num_tiles = tl.cdiv(vocab, BLOCK_V)
    first_tile = worker * tiles_per_worker
    end_tile = tl.minimum(first_tile + tiles_per_worker, num_tiles)
    rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    ks = tl.arange(0, RK)
    w_dtype = head_ptr.dtype.element_ty
    cache_dtype = cache_ptr.dtype.element_ty
    words_step = words_ptr + step * stride_ws

    # Row keys (once per program), then the first tile's logits, then the codes (their gather waits
    # on the previous tokens; the logits' HBM latency overlaps it).
    sample = rows * num_steps + step
    live, slot, temp, seed, position = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, row_ok, num_slots)
    greedy = row_ok & (temp == 0.0)
    sampled = row_ok & (temp > 0.0)
    safe_temp = tl.where(sampled, temp, 1.0)
    any_greedy = tl.max(greedy.to(tl.int32), axis=0) > 0
    any_sampled = tl.max(sampled.to(tl.int32), axis=0) > 0
    any_scaled = tl.max((sampled & (temp != 1.0)).to(tl.int32), axis=0) > 0
    base_rows = base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn
    cache_rows = cache_ptr + slot[:, None] * stride_cs + step * vocab
    lanes = tl.arange(0, BLOCK_V)
    if PREFETCH:
        first_cols = first_tile * BLOCK_V + lanes
        next_base = tl.load(base_rows + first_cols[None, :], mask=row_ok[:, None] & (first_cols < vocab)[None, :],
                            other=0.0)
    if INVERSE_CDF:
        prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
    else:
        if step > 0:  # the previous step's tokens, straight from its words
            prev = _word_token(tl.load(words_ptr + (step - 1) * stride_ws + rows, mask=row_ok, other=0), vocab)
            if worker == 0:
                tl.store(tokens_ptr + rows.to(tl.int64) * stride_tr + (step - 1), prev.to(tl.int64), mask=row_ok)
        else:
            prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
    prev = tl.minimum(tl.maximum(prev, 0), embed_rows - 1)
    codes = tl.load(embed_ptr + prev[:, None].to(tl.int64) * RK + ks[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        codes = codes.to(tl.float32)
    prefix = rng_triton.draft_prefix(seed, step, position)
    best_word = tl.full([BLOCK_R], INT64_MIN, tl.int64)
    top_z = tl.full([BLOCK_R], float("-inf"), tl.float32)  # inverse CDF: the worker's max z (NaN-propagating)
    # ... its largest finite tile shift (max z / T), from -FLT_MAX: no finite shift lies below it (a start above
    # some, -3e38 before stop 48, scaled the mass of a row whose every z / T lies below it to 0: token 0 drawn)
    top_shift = tl.full([BLOCK_R], -FLOAT32_MAX, tl.float32)
    top_mass = tl.zeros([BLOCK_R], tl.float32)  # ... and sum exp(z / T - top_shift) over its tiles

    for tile in tl.range(first_tile, end_tile, num_stages=STAGES):
        cols = tile * BLOCK_V + lanes
        if EVEN_V:  # every tile is whole: no column masks (rows past the batch are never stored)
            col_ok = tl.full([BLOCK_V], 1, tl.int1)
            mask = row_ok[:, None]
        else:
            col_ok = cols < vocab
            mask = row_ok[:, None] & col_ok[None, :]
        if PREFETCH:
            base = next_base
            after = cols + BLOCK_V
            next_base = tl.load(base_rows + after[None, :], mask=row_ok[:, None] & (after < vocab)[None, :],
                                other=0.0)
        else:
            base = tl.load(base_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        # (a product issued one tile ahead does not overlap the epilogue: Triton 3.6 waits for a wgmma
        # right after issuing it unless it accumulates into a loop-carried accumulator)
        acc = _tile_product(codes, head_ptr, cols, col_ok, ks, RK, UPCAST, IEEE_DOT)
        if NATIVE_ROUND:  # conversion instructions; a NaN bias makes z NaN, its payload is moot
            bias = acc.to(w_dtype).to(tl.float32)
            if SCALED:
                bias = (bias * scale).to(w_dtype).to(tl.float32)
            total = base.to(tl.float32) + bias
            # one rounding (SPEC.md 3); a NaN is stored again below. (Triton 3.6 computes z twice, in the
            # store's coalesced layout and in the tensor-core layout of the reductions, and converts the
            # bias through shared memory; an opaque identity (inline asm, not pure) does not stop it.)
            z_cache = total.to(cache_dtype)
            z = z_cache.to(tl.float32)
        else:
            bias = to_float32(_round(acc, w_dtype, False))
            if SCALED:
                bias = to_float32(_round(bias * scale, w_dtype, False))
            total = to_float32(base) + bias
            z_cache = _round(total, cache_dtype, False)
            z = to_float32(z_cache)
        tl.store(cache_rows + cols[None, :], z_cache, mask=live[:, None] & col_ok[None, :])
        if not EVEN_V:
            z = tl.where(col_ok[None, :], z, float("-inf"))
        zmax = tl.max(z, axis=1)  # NaN-ignoring; the NaN rows are flagged separately
        if INVERSE_CDF:
            row_nan = zmax != zmax  # (all False; set from the mass / the greedy check below)
            if any_sampled:
                if any_scaled:
                    scaled = tl.math.div_rn(z, safe_temp[:, None])
                else:  # z / 1 == z: the division is the identity
                    scaled = z
                scaled_max = tl.math.div_rn(zmax, safe_temp)
                shift = tl.where(tl.abs(scaled_max) < float("inf"), scaled_max, 0.0)
                if NATIVE_ROUND:  # exp(x - shift) = 2^((x - shift) log2(e)), the difference rounded first as
                    # the reference's: the one-FMA form 2^(x log2(e) - shift log2(e)) scaled a tile's mass by
                    # 2^(the rounding error of shift log2(e)) (~1% at |z / T| ~ 1e5, inf at |z / T| > 2.36e38)
                    weight = _fast_exp2((scaled - shift[:, None]) * _LOG2E)
                else:
                    weight = tl.exp(scaled - shift[:, None])
                if not EVEN_V:
                    weight = tl.where(col_ok[None, :], weight, 0.0)
                mass = tl.sum(weight, axis=1)  # NaN exactly when the row holds a NaN (every other weight <= 1 or inf)
                row_nan = mass != mass
                tile_max = tl.where(row_nan, float("nan"), zmax)
                part = rows * stride_part + tile
                tl.store(part_max_ptr + part, tile_max, mask=sampled)
                tl.store(part_mass_ptr + part, mass, mask=sampled)
                # the worker's partial, online (rows with a NaN or an infinite max go to the argmax anyway)
                # (one exp: the smaller of the two shifts is rescaled to the larger; shifts are finite)
                top_z = _nan_max(top_z, tile_max)
                # (a tile of -inf only has mass 0 and leaves the shift alone)
                tile_shift = tl.where(mass > 0.0, shift, top_shift)
                gap = top_shift - tile_shift
                rescale = tl.exp(-tl.abs(gap))
                top_mass = tl.where(gap >= 0.0, top_mass + mass * rescale, top_mass * rescale + mass)
                top_shift = tl.maximum(top_shift, tile_shift)
            if any_greedy:
                greedy_nan = tl.max((z != z).to(tl.int32), axis=1) > 0
                row_nan = row_nan | greedy_nan
                words = _greedy_words(z, tl.where(greedy_nan, float("nan"), zmax), cols[None, :], mask)
                best_word = tl.where(greedy, tl.maximum(best_word, words), best_word)
        else:
            row_nan = tl.max((z != z).to(tl.int32), axis=1) > 0
        if cache_dtype == tl.bfloat16:
            if NATIVE_ROUND:
                if tl.max(row_nan.to(tl.int32), axis=0) > 0:  # rows with a NaN again, with torch's NaN (0x7FC0)
                    canonical = tl.full(z.shape, 0x7FC0, tl.uint16).to(tl.bfloat16, bitcast=True)
                    tl.store(cache_rows + cols[None, :], tl.where(z != z, canonical, z.to(cache_dtype)),
                             mask=(live & row_nan)[:, None] & col_ok[None, :])
        if not INVERSE_CDF:
            zmax = tl.where(row_nan, float("nan"), zmax)
            if SHARE_WORDS:  # the best keys other programs have published (an L2 read per tile)
                shared_word = tl.load(words_step + rows, mask=row_ok, other=INT64_MIN, volatile=True)
                best_word = tl.maximum(best_word, shared_word)
                known_word = best_word
            best = _word_value(best_word)
            # Whole-row skip: no key of the tile can exceed max z / T + G_MAX (monotone roundings).
            bound = tl.where(greedy, zmax, tl.math.div_rn(zmax, safe_temp) + _G_MAX)
            need = row_ok & ((bound < best) == 0)
            if tl.max((need & greedy).to(tl.int32), axis=0) > 0:
                words = _greedy_words(z, zmax, cols[None, :], mask)
                best_word = tl.where(greedy, tl.maximum(best_word, words), best_word)
            need_sampled = need & sampled
            if tl.max(need_sampled.to(tl.int32), axis=0) > 0:
                gumbel_mask = mask & col_ok[None, :]
                if GUMBEL_ITERS > 0:
                    best_word = _candidate_words(z, zmax, temp, safe_temp, prefix, best_word, cols[None, :], gumbel_mask,
                                                 need_sampled, filter_margin, GUMBEL_ITERS, HARDWARE)
                else:
                    words = _gumbel_words(z, zmax, temp, prefix, best, cols[None, :], gumbel_mask, need_sampled,
                                          filter_margin, HARDWARE)
                    best_word = tl.where(sampled, tl.maximum(best_word, words), best_word)
            if SHARE_WORDS:  # publish what this tile improved (no result read: a reduction, not a round trip)
                tl.atomic_max(words_step + rows, best_word, mask=row_ok & (best_word > known_word), sem="relaxed")
    if INVERSE_CDF:
        tl.atomic_max(words_step + rows, best_word, mask=greedy & (best_word != INT64_MIN), sem="relaxed")
        if any_sampled:
            tl.store(worker_max_ptr + rows * stride_part + worker, top_z, mask=sampled)
            tl.store(worker_mass_ptr + rows * stride_part + worker, top_mass, mask=sampled)
    else:
        tl.atomic_max(words_step + rows, best_word, mask=row_ok & (best_word != INT64_MIN), sem="relaxed")


@triton.jit(do_not_specialize=["step", "num_slots"])
def _pick_wide_kernel(
    part_max_ptr, part_mass_ptr, stride_part,  # [max_rows, num_tiles] fp32 tile partials
    worker_max_ptr, worker_mass_ptr,  # [max_rows, num_tiles] fp32 worker partials (columns < workers)
    words_ptr, stride_ws,  # [N, max_rows] int64 (greedy rows)
    idx_ptr, pos_ptr, temp_ptr, seed_ptr,  # [R * N], [R * N], [S], [S]
    cache_ptr, stride_cs,  # [S, N, V]
    tokens_ptr, stride_tr,  # [R, N] int64 output
    prev_ptr,  # [max_rows] int32 output: the next step's previous tokens
    vocab, num_slots, step, num_steps, num_tiles, workers, tiles_per_worker,
    WORKERS_P2: tl.constexpr,
    PER_WORKER_P2: tl.constexpr,
    TILES_P2: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The inverse-CDF token of one row in three stages: the worker (program) by the prefix sum of the
    workers' masses (workers own consecutive tiles: vocabulary order), the tile among that worker's
    tiles by the prefix sum of their masses, the token inside the tile
    (re-read from the cache). Rows whose max of ``z / T`` is not finite (or with a NaN) take the first
    argmax through the tile maxima. Moves ``8 (W + N_w) + BLOCK_V c + 32`` bytes per sampled row.
    """
    row = tl.program_id(0)
    sample = row * num_steps + step
    live, slot, temp, seed, position = draft_row(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, num_slots)
    token = _word_token(tl.load(words_ptr + step * stride_ws + row), vocab)
    if temp > 0.0:
        base_part = row.to(tl.int64) * stride_part
        ws = tl.arange(0, WORKERS_P2)
        w_ok = ws < workers
        w_max = tl.load(worker_max_ptr + base_part + ws, mask=w_ok, other=float("-inf"))
        w_mass = tl.load(worker_mass_ptr + base_part + ws, mask=w_ok, other=0.0)
        is_nan = w_max != w_max
        has_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
        row_max = tl.max(tl.where(is_nan, float("-inf"), w_max), axis=0)
        scaled_row_max = tl.math.div_rn(row_max, temp)
        row_z = cache_ptr + slot * stride_cs + step * vocab
        if has_nan | (tl.abs(scaled_row_max) == float("inf")):
            tiles = tl.arange(0, TILES_P2)
            in_row = tiles < num_tiles
            tile_max = tl.load(part_max_ptr + base_part + tiles, mask=in_row, other=float("-inf"))
            token = first_argmax_by_tiles(tile_max, in_row, has_nan, row_max, row_z, vocab, TILES_P2, BLOCK_V)
        else:
            w_scale = tl.exp(tl.math.div_rn(w_max, temp) - scaled_row_max)  # 0 for a worker of -inf only
            mass = tl.where(w_ok & (w_mass > 0.0), w_mass * w_scale, 0.0)
            cumulative = tl.cumsum(mass, axis=0)
            u = rng_triton.uniform32(rng_triton.hash_finish(rng_triton.draft_prefix(seed, step, position),
                                                            tl.full([], 0xFFFFFFFF, tl.uint32)))
            target = u * tl.max(cumulative, axis=0)
            hit = (cumulative > target) & (mass > 0.0)
            chosen = tl.min(tl.where(hit, ws, WORKERS_P2), axis=0)
            last_positive = tl.max(tl.where(mass > 0.0, ws, -1), axis=0)
            chosen = tl.maximum(tl.where(chosen < WORKERS_P2, chosen, last_positive), 0)
            remaining = target - tl.sum(tl.where(ws < chosen, mass, 0.0), axis=0)
            own = tl.arange(0, PER_WORKER_P2)
            own_tiles = chosen * tiles_per_worker + own  # that worker's tiles (a name of this branch only:
            t_ok = (own < tiles_per_worker) & (own_tiles < num_tiles)  # Triton 3.6 types both branches' names)
            t_max = tl.math.div_rn(tl.load(part_max_ptr + base_part + own_tiles, mask=t_ok, other=float("-inf")),
                                   temp)
            t_mass = tl.load(part_mass_ptr + base_part + own_tiles, mask=t_ok, other=0.0)
            t_scale = tl.exp(t_max - scaled_row_max)
            t_mass = tl.where(t_ok & (t_mass > 0.0), t_mass * t_scale, 0.0)
            token = pick_in_tiles(t_mass, tl.cumsum(t_mass, axis=0), remaining, t_scale, t_max, own_tiles, row_z,
                                  temp, vocab, PER_WORKER_P2, BLOCK_V)
    token = tl.minimum(tl.maximum(token, 0), vocab - 1)
    tl.store(tokens_ptr + row.to(tl.int64) * stride_tr + step, token.to(tl.int64))
    tl.store(prev_ptr + row, token.to(tl.int32))


# Launch shapes (block_v, block_r, num_warps, stages, prefetch, programs per SM) by batch size:
# (at most this many rows, shape). prefetch 0: Triton pipelines the base-logit tile through shared
# memory (cp.async, ``stages`` deep) beside the W2 tile; 1: a register prefetch instead. Static SASS of
# the T = 1 inverse-CDF tile loop (Triton 3.6, sm_90a): 64x128x8 (3 stages) ~19.5 instructions per
# logit, 32x256x8 ~24, the u1 layout (prefetch 1, first epilogue) ~44 (Nsight Compute, u1).
# H200 round u3 (tools/sweep_wide.py; bf16 cache, T = 1, CUDA graph, cold L2; every run checked against
# the reference at full shape): inverse CDF at 253 rows 64x128x8x3 543.8 us (32x256x16x3 600.4,
# 64x64x4x2 618.6, 64x128x16x3 663.0; impl="inverse_cdf" 642.0), at 64 rows 64x64x4x2 (two programs
# per SM) 229.4 (64x64x8x3 240.4, 128x64x8x2 255.4, 64x128x8x3 314.4; inverse_cdf 277.4). Mixed T
# (0 / 0.6 / 1) costs a correctly rounded division per logit: 1117.2 us at 253, 284.3 at 64; the
# fp32 cache 620.0 / 255.1. Gumbel: 1504.1 at 253, 505.3 at 64 (gumbel_fused 1130, fused 346).
GPU_LAYOUTS = ((64, (64, 64, 4, 2, 0, 2)), (128, (64, 128, 8, 3, 0, 1)), (256, (64, 128, 8, 3, 0, 1)))
GPU_LAYOUT_LARGE = (64, 128, 8, 3, 0, 1)  # more rows: several row blocks of 128
# fp32 weights (an fp32 ``tl.dot``, no tensor cores): codes and W2 tiles take twice the shared memory,
# so narrower tiles (compiled for sm_90a with Triton 3.6: 104 KB shared; not timed on the GPU).
GPU_LAYOUT_FP32_WEIGHTS = (32, 64, 4, 2, 0, 2)
CPU_LAYOUT = (64, 16, 4, 1, 1, 1)
CPU_PROGRAMS = 3  # programs per row block in the interpreter (a few tiles each)
GUMBEL_ITERS = 2  # exact keys per row and tile before a tile's candidates go to the approximate ranking


class WideBackend:
    """Large-batch drafting (both methods): per step one persistent tensor-core launch (+ a pick for inverse CDF).

    Parameters
    ----------
    head : MarkovHead (power-of-two rank >= 16). num_steps : N. max_rows : the largest R of a call.
    method : ``"gumbel"`` or ``"inverse_cdf"``. cache_dtype : bf16 or fp32. device : cuda, or cpu
        (Triton's interpreter).
    layout : ``(block_v, block_r, num_warps, stages, prefetch, programs_per_sm)``; default by batch
        size from :data:`GPU_LAYOUTS` (``block_r >= 16`` is a tensor-core tile; a batch larger than
        ``block_r`` is split into row blocks). ``programs`` overrides the programs per row block.
    native_round : round to bf16 with the conversion instruction on the GPU (same values).
    gumbel_iters : per tile, how many times each row's most promising candidate gets its exact key
        before the remaining candidates go to the approximate ranking (0: always rank).
    share_words : Gumbel programs read the rows' best words other programs published at every tile
        (a stronger skip threshold) and publish their own improvements. Off by default: on the H200
        (round u2, 253 rows) it cost more in register spills than it saved (1663 vs 1499 us).
    filter_margin : the approximate-noise ranking's margin (a huge value forces exact keys, tests).

    Scratch (allocated once): previous tokens ``[max_rows]`` int32, per-row words ``[N, max_rows]``
    int64 and, for inverse CDF, tile partials ``2 x [max_rows, ceil(V / block_v)]`` fp32 for the
    smallest ``block_v`` a batch size may use. ``run`` allocates nothing and synchronises nothing
    (CUDA-graph safe).
    """

    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, layout=None, programs=None,
                 native_round=True, filter_margin=FILTER_MARGIN, gumbel_iters=GUMBEL_ITERS, share_words=False):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'wide' needs a power-of-two rank >= 16, got {head.rank}")
        if method not in self.METHODS:
            raise ValueError(f"method: impl 'wide' supports 'gumbel' and 'inverse_cdf', got {method!r}")
        device = torch.device(device)
        self.interpret = INTERPRET or device.type == "cpu"
        self.layout = None if layout is None else tuple(int(x) for x in layout)
        if self.layout is not None:
            if len(self.layout) != 6:
                raise ValueError(f"layout: expected (block_v, block_r, num_warps, stages, prefetch, programs_per_sm), "
                                 f"got {layout}")
            check_power_of_two("layout block_v", self.layout[0], 16)
            check_power_of_two("layout block_r", self.layout[1], 16)
            check_power_of_two("layout num_warps", self.layout[2], 1)
        self.programs = None if programs is None else int(programs)
        if self.programs is not None and self.programs < 1:
            raise ValueError(f"programs: expected >= 1, got {programs}")
        self.native_round = bool(native_round) and not self.interpret
        self.gumbel_iters = int(gumbel_iters)
        if not 0 <= self.gumbel_iters <= 8:
            raise ValueError(f"gumbel_iters: expected 0..8, got {gumbel_iters}")
        self.share_words = bool(share_words)
        self.head = head
        self.method = method
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.filter_margin = float(filter_margin)
        self.upcast = self.interpret or head.dtype == torch.float32
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        vocab = head.vocab_size
        smallest = min(self._layout_for(r)[0] for r in {1, 32, 64, 128, 256, max(self.max_rows, 1)})
        num_tiles = triton.cdiv(vocab, smallest)
        if method == "inverse_cdf" and triton.next_power_of_2(triton.cdiv(vocab, self._layout_for(
                max(self.max_rows, 1))[0])) > 8192:
            raise ValueError(f"layout: V = {vocab} needs more than 8192 tiles; pass a larger block_v")
        self.prev = torch.zeros(self.max_rows, dtype=torch.int32, device=device)
        self.words = torch.zeros(self.num_steps, self.max_rows, dtype=torch.int64, device=device)
        part = (self.max_rows, num_tiles) if method == "inverse_cdf" else (1, 1)
        self.part_max = torch.zeros(part, dtype=torch.float32, device=device)
        self.part_mass = torch.zeros(part, dtype=torch.float32, device=device)
        self.worker_max = torch.zeros(part, dtype=torch.float32, device=device)  # columns < workers used
        self.worker_mass = torch.zeros(part, dtype=torch.float32, device=device)
        # Stand-ins for the per-slot tensors when S == 0 (never read or written: every access is masked off).
        self.no_temperature = torch.zeros(1, dtype=torch.float32, device=device)
        self.no_seeds = torch.zeros(1, dtype=torch.int64, device=device)
        self.no_cache = torch.zeros(1, self.num_steps, vocab, dtype=cache_dtype, device=device)

    def _layout_for(self, rows: int, base_dtype: torch.dtype = torch.bfloat16) -> tuple:
        if self.layout is not None:
            return self.layout
        if self.interpret:
            return CPU_LAYOUT
        if self.head.dtype == torch.float32:
            return GPU_LAYOUT_FP32_WEIGHTS
        layout = next((layout for most_rows, layout in GPU_LAYOUTS if rows <= most_rows), GPU_LAYOUT_LARGE)
        if base_dtype == torch.float32 and layout[3] > 2:
            # fp32 base tiles double the base's share of the pipeline: 3 stages of 128 x 64 fp32 base tiles
            # beside the W2 tiles and the codes need 240 KB of shared memory (H200, Triton 3.6: the 253-row
            # fp32 benchmark case raised OutOfResources), 2 stages fit
            layout = layout[:3] + (2,) + layout[4:]
        return layout

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` int64 and write ``logits_cache`` ``[S, N, V]`` (see the module)."""
        head = self.head
        rows, steps, vocab = base_logits.shape
        num_slots = temperature.shape[0]
        inverse = self.method == "inverse_cdf"
        if num_slots == 0:  # every row is padding: point the per-slot loads (all masked off) at scratch
            temperature, seeds, logits_cache = self.no_temperature, self.no_seeds, self.no_cache
        block_v, block_r, num_warps, stages, prefetch, per_sm = self._layout_for(rows, base_logits.dtype)
        num_tiles = triton.cdiv(vocab, block_v)
        row_blocks = triton.cdiv(rows, block_r)
        if self.programs is not None:
            workers = self.programs
        elif self.interpret:
            workers = CPU_PROGRAMS
        else:
            workers = max(1, (self.num_sms * per_sm) // row_blocks)
        tiles_per_worker = triton.cdiv(num_tiles, min(workers, num_tiles))
        workers = triton.cdiv(num_tiles, tiles_per_worker)  # each owns consecutive tiles (vocabulary order)
        common = dict(enable_fp_fusion=False)
        _prepare_kernel[(rows,)](anchor, self.prev, self.words, self.words.stride(0), steps,
                                 STEPS_P2=triton.next_power_of_2(steps), num_warps=1, **common)
        for step in range(steps):
            _wide_step_kernel[(workers * row_blocks,)](
                base_logits, base_logits.stride(0), base_logits.stride(1),  # [R, N, V]
                head.embed_weight, head.head_weight,  # [V_t, R_k], [V, R_k]
                logits_cache, logits_cache.stride(0),  # [S, N, V]
                idx_mapping, positions, temperature, seeds,  # [R*N], [R*N], [S], [S]
                self.prev, self.words, self.words.stride(0),  # [max_rows], [N, max_rows]
                draft_tokens, draft_tokens.stride(0),  # [R, N]
                self.part_max, self.part_mass, self.part_max.stride(0),  # [max_rows, num_tiles]
                self.worker_max, self.worker_mass,  # [max_rows, num_tiles]
                rows, vocab, head.embed_vocab_size, num_slots, step, steps, head.scale, self.filter_margin,
                row_blocks, tiles_per_worker,
                RK=head.rank, BLOCK_V=block_v, BLOCK_R=block_r, STAGES=stages, PREFETCH=bool(prefetch),
                EVEN_V=vocab % block_v == 0, GUMBEL_ITERS=self.gumbel_iters, SHARE_WORDS=self.share_words,
                NATIVE_ROUND=self.native_round, SCALED=head.scale != 1.0, INVERSE_CDF=inverse,
                UPCAST=self.upcast, IEEE_DOT=head.dtype == torch.float32, HARDWARE=not self.interpret,
                num_warps=num_warps, **common)
            if inverse:
                _pick_wide_kernel[(rows,)](
                    self.part_max, self.part_mass, self.part_max.stride(0),  # [max_rows, num_tiles]
                    self.worker_max, self.worker_mass,  # [max_rows, num_tiles]
                    self.words, self.words.stride(0),  # [N, max_rows]
                    idx_mapping, positions, temperature, seeds,
                    logits_cache, logits_cache.stride(0),  # [S, N, V]
                    draft_tokens, draft_tokens.stride(0),  # [R, N]
                    self.prev,  # [max_rows]
                    vocab, num_slots, step, steps, num_tiles, workers, tiles_per_worker,
                    WORKERS_P2=triton.next_power_of_2(workers),
                    PER_WORKER_P2=triton.next_power_of_2(tiles_per_worker),
                    TILES_P2=triton.next_power_of_2(num_tiles), BLOCK_V=block_v, num_warps=4, **common)
        if not inverse:
            _finish_gumbel_kernel[(rows,)](self.words, self.words.stride(0), draft_tokens, draft_tokens.stride(0),
                                           steps - 1, vocab, num_warps=1, **common)
