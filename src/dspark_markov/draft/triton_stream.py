"""``impl="stream"``: a memory-bound large-batch design (32-256 rows), both draw methods.

Per step, :func:`_stream_step_kernel` runs one program per vocabulary tile of ``BLOCK_V`` entries.
It loads its W2 tile ``[BLOCK_V, R_k]`` once and then walks the batch in chunks of ``BLOCK_R``
rows: ``bias = W1[prev] @ W2_tile^T`` on tensor cores (fp32 accumulation, rounded once to the weight
dtype), ``z = round(U + bias)`` written to the cache, and the tile reduced to per-row results in
the same registers. The bias never goes to memory, the base logits are read once, the cache is
written once, and W2 comes from HBM once per step whatever the batch (the next row chunk reuses
the tile the program already holds).

Per-row results (SPEC.md sections 4-5):

- Gumbel-max and every greedy row (T = 0, padding): each row's best exact key lives in one int64
  word ``words[step, row]`` (key, then lower index first, :func:`dspark_markov.ops.numerics.pack_word`),
  raised with ``atomic_max`` by the tiles that beat it. Before hashing, a tile reads the word and
  skips what provably loses against it: a whole row of the tile when ``max z / T + G_MAX`` is below
  the word's key (:data:`G_MAX` bounds every exact noise), and, per token, everything whose
  cheap noise bound ``(clz(h) + 1) ln 2`` (from the hash alone, :func:`noise_upper`) cannot reach
  it. The few survivors are ranked by approximate noise (:mod:`dspark_markov.ops.filter`) and only the
  winner's exact key is computed (all survivors exactly on a near-tie). The word only ever holds
  the exact key of a real token, so a stale read only skips less: the tokens never depend on
  timing. The next step decodes its previous tokens from the words.
- Inverse CDF (T > 0): per (row, tile) the maximum of ``z`` (NaN-propagating) and the mass
  ``sum exp(z/T - max/T)`` in fp32; then :func:`_pick_kernel` (one program per row) combines
  the partials online-softmax style, picks the tile by the prefix sum of tile masses and re-reads
  only that tile from the cache to pick the token (SPEC.md section 5, the pick of
  ``impl="inverse_cdf"``). Rows whose maximum of ``z / T`` is not finite take the first argmax,
  found by re-reading only the first tile holding the maximum (or the first NaN).

Bytes per step: ``V R_k w`` of W2 and ``R V u`` of base logits read, ``R V c`` of cache written
(live samples), plus ``ceil(V / BLOCK_V) R R_k w`` of code rows re-read from L2 and, for inverse
CDF, ``8 R ceil(V / BLOCK_V)`` bytes of partials written and read back and ``BLOCK_V c`` per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import noise as rng_triton  # the device noise (ops.noise)
from ..ops.filter import FILTER_MARGIN, key_slack
from ..ops.noise import INTERPRET, approx_gumbel
from ..ops.numerics import INT64_MAX, INT64_MIN, pack_key, round_to, to_float32, unpack_key
from ..ops.numerics import pack_word as _pack_word, word_token as _word_token
from ..ops.rows import draft_row, draft_rows
from ..validate import check_power_of_two

# Bounds of the exact fp32 noise g = gumbel32(uniform32(h)) over every 32-bit hash h (SPEC.md
# section 4), checked over all 2^32 hashes by tests/gpu/test_stream_gpu.py and argued (plus checked
# over the hashes that reach them) in tests/test_triton_stream.py. u >= 2^-33 (h = 0), so
# g <= -log(2^-33) = 22.8739...; u <= 1 gives -L(u) <= -log(2^-24) and g >= -2.8115...
G_MAX = 22.875
G_MIN = -2.8125
# noise_upper: g <= (clz(h) + 1) ln 2 + NOISE_UPPER_MARGIN for every h (u >= 2^-(clz(h) + 1)).
NOISE_UPPER_MARGIN = 2.0**-10
_G_MAX = tl.constexpr(G_MAX)
_G_MIN = tl.constexpr(G_MIN)
_UPPER_MARGIN = tl.constexpr(NOISE_UPPER_MARGIN)
_LN2_UP = tl.constexpr(0.6931472)  # fp32 rounding of ln 2 upward (0.693147182...)
_BIG = tl.constexpr(2147483647)
_NAN_WORD_HIGH = tl.constexpr(0x7FFFFFFF)  # high half of a NaN word (_pack_word)


@triton.jit
def _round(x, DTYPE: tl.constexpr, NATIVE: tl.constexpr):
    """fp32 ``x`` rounded to ``DTYPE`` to nearest even, as torch rounds (:func:`dspark_markov.ops.numerics.round_to`).

    On the GPU a bf16 target uses the conversion instruction (``cvt.rn.bf16x2.f32``, half an
    instruction per value instead of six integer ones); a NaN then becomes torch's 0x7FC0 too.
    The interpreter truncates native casts, so it always takes the integer form.
    """
    if NATIVE and DTYPE == tl.bfloat16:
        out = tl.where(x != x, 0x7FC0, x.to(tl.bfloat16).to(tl.uint16, bitcast=True))
        out = out.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        out = round_to(x, DTYPE)
    return out


@triton.jit
def _nan_max(a, b):
    """NaN-propagating maximum (a combine function for ``tl.reduce``)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def clz32(h, HARDWARE: tl.constexpr):
    """Leading zeros of uint32 ``h`` (32 for 0), int32: ``clz.b32`` on the GPU, shifts in the interpreter."""
    if HARDWARE:
        out = tl.inline_asm_elementwise("clz.b32 $0, $1;", "=r,r", [h], dtype=tl.int32, is_pure=True, pack=1)
    else:
        x = h
        count = tl.zeros(h.shape, tl.int32)
        top = (x >> 16) == 0
        count += tl.where(top, 16, 0)
        x = tl.where(top, x << 16, x)
        top = (x >> 24) == 0
        count += tl.where(top, 8, 0)
        x = tl.where(top, x << 8, x)
        top = (x >> 28) == 0
        count += tl.where(top, 4, 0)
        x = tl.where(top, x << 4, x)
        top = (x >> 30) == 0
        count += tl.where(top, 2, 0)
        x = tl.where(top, x << 2, x)
        count += tl.where((x >> 31) == 0, 1, 0)
        out = tl.where(h == 0, 32, count)
    return out


@triton.jit
def noise_upper(h, HARDWARE: tl.constexpr):
    """An upper bound on the exact noise ``gumbel32(uniform32(h))`` from the hash alone (fp32).

    ``u >= h 2^-32 >= 2^-(clz(h) + 1)`` and ``-L(u) >= u``, so ``g = -log(-L(u)) <= (clz(h) + 1) ln 2``;
    :data:`NOISE_UPPER_MARGIN` covers the rounding of the fp32 logs (checked for every h).
    The small integer converts exactly through the mantissa of 2^23 (no conversion instruction).
    """
    bits = (clz32(h, HARDWARE) + 1) | 0x4B000000
    count = bits.to(tl.float32, bitcast=True) - 8388608.0
    return count * _LN2_UP + _UPPER_MARGIN


@triton.jit
def _word_value(word):
    """The fp32 key a row's word guarantees: ``-inf`` for the empty word, ``+inf`` once a NaN won.

    A NaN winner can only be beaten by an earlier NaN, which no skip test ever drops.
    """
    value, _ = unpack_key(word)
    value = tl.where(word == INT64_MIN, float("-inf"), value)
    return tl.where((word >> 32) == _NAN_WORD_HIGH, float("inf"), value)


@triton.jit
def _greedy_words(z, zmax, cols, mask):
    """Per-row word of the first argmax of ``z`` (first NaN, else first maximum); ``zmax`` NaN-propagating."""
    first_max = tl.min(tl.where(mask & (z == zmax[:, None]), cols, _BIG), axis=1)
    if tl.max((zmax != zmax).to(tl.int32), axis=0) > 0:  # some row holds a NaN
        first_nan = tl.min(tl.where(mask & (z != z), cols, _BIG), axis=1)
        first_max = tl.where(zmax != zmax, first_nan, first_max)
    first_max = tl.where(first_max == _BIG, 0, first_max)
    return _pack_word(zmax, first_max)


@triton.jit
def _bound_inv_temp(safe_temp):
    """``1 / T`` for the per-token key bounds ``z * (1/T) + noise`` (``safe_temp``: T of sampled rows, 1 elsewhere).

    Below T ~ 2.9e-39 the reciprocal overflows, where ``z * (1/T)`` is no bound of ``div_rn(z, T)`` (0 * inf = NaN,
    -inf): NaN then, which keeps every token a candidate and sends the row to the exact keys.
    """
    inv_temp = 1.0 / safe_temp
    return tl.where(inv_temp < float("inf"), inv_temp, float("nan"))


@triton.jit
def _gumbel_words(z, zmax, temp, prefix, best, cols, mask, need, filter_margin, HARDWARE: tl.constexpr):
    """Per-row word of the exact Gumbel argmax over the tokens of a tile that can beat ``best``.

    ``need`` marks the sampled rows (T > 0) not skipped as a whole; ``best`` their current keys.
    Returns INT64_MIN where no token of the row can reach ``best``.
    """
    inv_temp = _bound_inv_temp(tl.where(temp > 0.0, temp, 1.0))
    h = rng_triton.hash_finish(prefix[:, None], cols)
    # A lower bound of the tile's own best key (the noise is >= G_MIN), so the threshold is useful
    # even before any word exists; everything at or above the threshold stays a candidate.
    floor = tl.math.div_rn(zmax, tl.where(temp > 0.0, temp, 1.0)) + _G_MIN
    threshold = tl.maximum(best, floor)
    # (an infinite threshold stays as it is: +inf keeps exactly the +inf and NaN logits)
    threshold = tl.where(tl.abs(threshold) < float("inf"), threshold - key_slack(threshold, filter_margin), threshold)
    reach = z * inv_temp[:, None] + noise_upper(h, HARDWARE)
    candidate = need[:, None] & mask & ((reach < threshold[:, None]) == 0)  # (a NaN reach, from z or 1/T, stays one)
    words = tl.full(zmax.shape, INT64_MIN, tl.int64)
    if tl.max(tl.max(candidate.to(tl.int32), axis=1), axis=0) > 0:
        approx = z * inv_temp[:, None] + approx_gumbel(rng_triton.uniform32(h), HARDWARE)
        packed = pack_key(approx, cols)
        packed = tl.where(approx != approx, INT64_MAX, packed)
        packed = tl.where(candidate, packed, INT64_MIN)
        top = tl.max(packed, axis=1)
        runner = tl.max(tl.where(packed == top[:, None], INT64_MIN, packed), axis=1)
        value, index = unpack_key(top)
        second, _ = unpack_key(runner)
        second = tl.where(runner == INT64_MIN, float("-inf"), second)
        some = top != INT64_MIN
        clear = (top != INT64_MAX) & (value != 0.0) & (tl.abs(value) < float("inf"))
        decided = (some == 0) | (clear & (value - second > key_slack(value, filter_margin)))
        decided = decided | (need == 0)
        if tl.min(decided.to(tl.int32), axis=0) > 0:
            winner = tl.max(tl.where(cols == index[:, None], z, float("-inf")), axis=1)
            exact = tl.math.div_rn(winner, tl.where(temp > 0.0, temp, 1.0)) + rng_triton.draft_noise(prefix, index)
            words = tl.where(some & need, _pack_word(exact, index), INT64_MIN)
        else:  # a near-tie, a NaN or a non-finite key: exact keys of every candidate
            key = tl.math.div_rn(z, tl.where(temp > 0.0, temp, 1.0)[:, None]) + \
                rng_triton.gumbel32(rng_triton.uniform32(h))
            key = tl.where(candidate, key, float("-inf"))
            kmax = tl.reduce(key, 1, _nan_max)
            first = tl.min(tl.where(candidate & ((key == kmax[:, None]) | ((key != key) & (kmax != kmax)[:, None])),
                                    cols, _BIG), axis=1)
            any_candidate = tl.max(candidate.to(tl.int32), axis=1) > 0
            words = tl.where(any_candidate, _pack_word(kmax, first), INT64_MIN)
    return words


@triton.jit(do_not_specialize=["step", "num_rows", "num_slots", "num_groups", "group_chunks"])
def _stream_step_kernel(
    base_ptr, stride_br, stride_bn,  # [R, N, V] bf16/fp32, last stride 1
    embed_ptr,  # [V_t, R_k] weight dtype (W1)
    head_ptr,  # [V, R_k] weight dtype (W2)
    cache_ptr, stride_cs,  # [S, N, V] cache dtype, step stride V
    idx_ptr, pos_ptr,  # [R * N] slot (-1 = padding) and position per (row, step)
    temp_ptr, seed_ptr,  # [S] fp32, [S] int64
    prev_ptr,  # [max_rows] int32: previous tokens (step 0; every step for inverse CDF)
    words_ptr, stride_ws,  # [N, max_rows] int64 per-row best words
    tokens_ptr, stride_tr,  # [R, N] int64 draft tokens (Gumbel: column step - 1 written by tile 0)
    part_max_ptr, part_mass_ptr, stride_part,  # [max_rows, num_tiles] fp32 (inverse CDF)
    num_rows, vocab, embed_rows, num_slots, step, num_steps, scale, filter_margin, num_groups, group_chunks,
    RK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ROW_STAGES: tl.constexpr,
    NATIVE_ROUND: tl.constexpr,
    SCALED: tl.constexpr,
    INVERSE_CDF: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    HARDWARE: tl.constexpr,
):
    """One step for one vocabulary tile and ``group_chunks`` chunks of ``BLOCK_R`` rows per program.

    Program ``p`` takes tile ``p // num_groups`` and row group ``p % num_groups``: the groups of a tile
    are launched together, so all but the first read its W2 tile from L2 (one group: from HBM once).

    Bytes: ``BLOCK_V R_k w`` (W2 tile) + per row ``R_k w`` (codes, L2) + ``BLOCK_V (u + c)`` (logits in,
    cache out) + 8 (inverse CDF partials) or an atomic on the row's word when the tile beats it.
    """
    tile = tl.program_id(0) // num_groups
    group = tl.program_id(0) % num_groups
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
    ks = tl.arange(0, RK)
    w_tile = tl.load(head_ptr + cols[:, None].to(tl.int64) * RK + ks[None, :], mask=col_ok[:, None], other=0.0)
    if UPCAST:
        w_tile = w_tile.to(tl.float32)
    w_dtype = head_ptr.dtype.element_ty
    cache_dtype = cache_ptr.dtype.element_ty
    words_step = words_ptr + step * stride_ws
    first_chunk = group * group_chunks
    for chunk in tl.range(first_chunk, tl.minimum(first_chunk + group_chunks, tl.cdiv(num_rows, BLOCK_R)),
                          num_stages=ROW_STAGES):
        rows = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < num_rows
        if INVERSE_CDF:
            prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
        else:
            if step > 0:  # the previous step's tokens, straight from its words
                prev = _word_token(tl.load(words_ptr + (step - 1) * stride_ws + rows, mask=row_ok, other=0), vocab)
                if tile == 0:
                    tl.store(tokens_ptr + rows.to(tl.int64) * stride_tr + (step - 1), prev.to(tl.int64), mask=row_ok)
            else:
                prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
        prev = tl.minimum(tl.maximum(prev, 0), embed_rows - 1)
        codes = tl.load(embed_ptr + prev[:, None].to(tl.int64) * RK + ks[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST:
            codes = codes.to(tl.float32)
        # The logits and the row keys are loaded before the product so that their latency hides behind it.
        sample = rows * num_steps + step
        live, slot, temp, seed, position = draft_rows(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, row_ok, num_slots)
        mask = row_ok[:, None] & col_ok[None, :]
        base = tl.load(base_ptr + rows[:, None].to(tl.int64) * stride_br + step * stride_bn + cols[None, :],
                       mask=mask, other=0.0)
        if IEEE_DOT:
            acc = tl.dot(codes, tl.trans(w_tile), input_precision="ieee")
        else:
            acc = tl.dot(codes, tl.trans(w_tile))
        bias = to_float32(_round(acc, w_dtype, NATIVE_ROUND))  # (a NaN bias makes z NaN: its payload is moot)
        if SCALED:
            bias = to_float32(_round(bias * scale, w_dtype, NATIVE_ROUND))
        z = _round(to_float32(base) + bias, cache_dtype, NATIVE_ROUND)  # one rounding (SPEC.md 3)
        tl.store(cache_ptr + slot[:, None] * stride_cs + step * vocab + cols[None, :], z,
                 mask=live[:, None] & col_ok[None, :])
        z = tl.where(mask, to_float32(z), float("-inf"))
        zmax = tl.reduce(z, 1, _nan_max)
        greedy = row_ok & (temp == 0.0)
        sampled = row_ok & (temp > 0.0)
        if INVERSE_CDF:
            if tl.max(sampled.to(tl.int32), axis=0) > 0:
                safe_temp = tl.where(sampled, temp, 1.0)
                if tl.max((sampled & (temp != 1.0)).to(tl.int32), axis=0) > 0:
                    scaled = tl.math.div_rn(z, safe_temp[:, None])
                else:  # z / 1 == z: the division is the identity
                    scaled = z
                scaled_max = tl.math.div_rn(zmax, safe_temp)
                shift = tl.where(tl.abs(scaled_max) < float("inf"), scaled_max, 0.0)
                mass = tl.sum(tl.where(mask, tl.exp(scaled - shift[:, None]), 0.0), axis=1)
                part = rows * stride_part + tile
                tl.store(part_max_ptr + part, zmax, mask=sampled)
                tl.store(part_mass_ptr + part, mass, mask=sampled)
            if tl.max(greedy.to(tl.int32), axis=0) > 0:
                best_word = tl.load(words_step + rows, mask=greedy, other=0, volatile=True)
                words = _greedy_words(z, zmax, cols[None, :], mask)
                tl.atomic_max(words_step + rows, words, mask=greedy & (words > best_word))
        else:
            best_word = tl.load(words_step + rows, mask=row_ok, other=0, volatile=True)
            best = _word_value(best_word)
            # Whole-row skip: no key of the tile can exceed max z / T + G_MAX (monotone roundings).
            bound = tl.where(greedy, zmax, tl.math.div_rn(zmax, tl.where(sampled, temp, 1.0)) + _G_MAX)
            need = row_ok & ((bound < best) == 0)
            words = tl.full([BLOCK_R], INT64_MIN, tl.int64)
            if tl.max((need & greedy).to(tl.int32), axis=0) > 0:
                words = tl.where(greedy, _greedy_words(z, zmax, cols[None, :], mask), words)
            need_sampled = need & sampled
            if tl.max(need_sampled.to(tl.int32), axis=0) > 0:
                prefix = rng_triton.draft_prefix(seed, step, position)
                sampled_words = _gumbel_words(z, zmax, temp, prefix, best, cols[None, :], mask, need_sampled,
                                              filter_margin, HARDWARE)
                words = tl.where(sampled, sampled_words, words)
            tl.atomic_max(words_step + rows, words, mask=need & (words > best_word))


@triton.jit
def _prepare_kernel(
    anchor_ptr,  # [R] int32/int64
    prev_ptr,  # [max_rows] int32, output
    words_ptr, stride_ws,  # [N, max_rows] int64, output (reset)
    num_steps,
    STEPS_P2: tl.constexpr,
):
    """prev[r] = anchor[r] (clamped later) and words[:, r] = empty. Moves ``12 + 8 N`` bytes per row."""
    row = tl.program_id(0)
    token = tl.load(anchor_ptr + row).to(tl.int64)
    token = tl.minimum(tl.maximum(token, 0), 2147483647)
    tl.store(prev_ptr + row, token.to(tl.int32))
    steps = tl.arange(0, STEPS_P2)
    tl.store(words_ptr + steps * stride_ws + row, tl.full([STEPS_P2], INT64_MIN, tl.int64), mask=steps < num_steps)


@triton.jit
def _finish_gumbel_kernel(
    words_ptr, stride_ws,  # [N, max_rows] int64
    tokens_ptr, stride_tr,  # [R, N] int64
    step, vocab,
):
    """draft_tokens[r, step] from the row's word (the last step). Moves 16 bytes per row."""
    row = tl.program_id(0)
    token = _word_token(tl.load(words_ptr + step * stride_ws + row), vocab)
    tl.store(tokens_ptr + row.to(tl.int64) * stride_tr + step, token.to(tl.int64))


@triton.jit
def first_argmax_by_tiles(tile_max, in_row, has_nan, row_max, row_z, vocab, TILES_P2: tl.constexpr,
                          BLOCK_V: tl.constexpr):
    """argmax_first of a row from its tile maxima: the first tile holding a NaN (else the maximum),
    then its first such token, re-read from the cache row ``row_z``. int32 token."""
    tiles = tl.arange(0, TILES_P2)
    is_nan = tile_max != tile_max
    hit = tl.where(has_nan, is_nan, tile_max == row_max) & in_row
    chosen = tl.min(tl.where(hit, tiles, TILES_P2), axis=0)
    chosen = tl.where(chosen < TILES_P2, chosen, 0)
    cols = chosen * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
    z = to_float32(tl.load(row_z + cols, mask=col_ok, other=0.0))
    match = tl.where(has_nan, z != z, z == row_max) & col_ok
    first = tl.min(tl.where(match, cols, _BIG), axis=0)
    return tl.where(first < _BIG, first, chosen * BLOCK_V)


@triton.jit
def pick_in_tiles(mass, cumulative, target, tile_scale, scaled_max, tiles, row_z, temp, vocab,
                  TILES_P2: tl.constexpr, BLOCK_V: tl.constexpr):
    """The inverse-CDF token: the first tile (ids ``tiles``) whose mass prefix sum exceeds ``target``
    (clamped to the last tile of positive mass), then the token inside it from the cache row.

    ``mass`` are the tile masses relative to the row's max (0 where not a tile), ``cumulative`` their
    prefix sums, ``tile_scale = exp(max_t / T - M / T)`` and ``scaled_max = max_t / T`` per tile.
    The token's weights are the partials' ``exp(z / T - max_t / T)``, so the two stages agree. int32.
    """
    hit = (cumulative > target) & (mass > 0.0)
    chosen = tl.min(tl.where(hit, tiles, _BIG), axis=0)
    last_positive = tl.max(tl.where(mass > 0.0, tiles, -1), axis=0)
    chosen = tl.where(chosen < _BIG, chosen, last_positive)
    chosen = tl.maximum(chosen, 0)
    remaining = target - tl.sum(tl.where(tiles < chosen, mass, 0.0), axis=0)
    chosen_scale = tl.sum(tl.where(tiles == chosen, tile_scale, 0.0), axis=0)
    chosen_shift = tl.max(tl.where(tiles == chosen, scaled_max, float("-inf")), axis=0)
    cols = chosen * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab
    z = to_float32(tl.load(row_z + cols, mask=col_ok, other=0.0))
    # the same weights as the partials: exp(z / T - max_tile / T)
    weight = tl.where(col_ok, tl.exp(tl.math.div_rn(z, tl.zeros_like(z) + temp) - chosen_shift), 0.0)
    inside = tl.cumsum(weight, axis=0) * chosen_scale
    hit_token = (inside > remaining) & (weight > 0.0)
    picked = tl.min(tl.where(hit_token, cols, _BIG), axis=0)
    last_token = tl.max(tl.where(weight > 0.0, cols, -1), axis=0)
    token = tl.where(picked < _BIG, picked, last_token)
    return tl.where(token >= 0, token, chosen * BLOCK_V)


@triton.jit(do_not_specialize=["step", "num_slots"])
def _pick_kernel(
    part_max_ptr, part_mass_ptr, stride_part,  # [max_rows, num_tiles] fp32
    words_ptr, stride_ws,  # [N, max_rows] int64 (greedy rows)
    idx_ptr, pos_ptr, temp_ptr, seed_ptr,  # [R * N], [R * N], [S], [S]
    cache_ptr, stride_cs,  # [S, N, V]
    tokens_ptr, stride_tr,  # [R, N] int64 output
    prev_ptr,  # [max_rows] int32 output: the next step's previous tokens
    vocab, num_slots, step, num_steps, num_tiles,
    TILES_P2: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The inverse-CDF token of one row from its tile partials; re-reads one tile of the cache.

    Moves ``8 num_tiles + BLOCK_V c + 32`` bytes per sampled row, 24 per greedy row.
    """
    row = tl.program_id(0)
    sample = row * num_steps + step
    live, slot, temp, seed, position = draft_row(idx_ptr, pos_ptr, temp_ptr, seed_ptr, sample, num_slots)
    token = _word_token(tl.load(words_ptr + step * stride_ws + row), vocab)
    if temp > 0.0:
        tiles = tl.arange(0, TILES_P2)
        in_row = tiles < num_tiles
        part = row.to(tl.int64) * stride_part + tiles
        tile_max = tl.load(part_max_ptr + part, mask=in_row, other=float("-inf"))
        tile_mass = tl.load(part_mass_ptr + part, mask=in_row, other=0.0)
        is_nan = tile_max != tile_max
        has_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
        row_max = tl.max(tl.where(is_nan, float("-inf"), tile_max), axis=0)
        scaled_row_max = tl.math.div_rn(row_max, temp)
        row_z = cache_ptr + slot * stride_cs + step * vocab
        if has_nan | (tl.abs(scaled_row_max) == float("inf")):
            token = first_argmax_by_tiles(tile_max, in_row, has_nan, row_max, row_z, vocab, TILES_P2, BLOCK_V)
        else:
            scaled_max = tl.math.div_rn(tile_max, temp)
            tile_scale = tl.exp(scaled_max - scaled_row_max)  # 0 for an all -inf tile
            mass = tl.where(in_row & (tile_mass > 0.0), tile_mass * tile_scale, 0.0)
            cumulative = tl.cumsum(mass, axis=0)
            total = tl.max(cumulative, axis=0)
            u = rng_triton.uniform32(rng_triton.hash_finish(rng_triton.draft_prefix(seed, step, position),
                                                            tl.full([], 0xFFFFFFFF, tl.uint32)))
            token = pick_in_tiles(mass, cumulative, u * total, tile_scale, scaled_max, tiles, row_z, temp, vocab,
                                  TILES_P2, BLOCK_V)
    token = tl.minimum(tl.maximum(token, 0), vocab - 1)
    tl.store(tokens_ptr + row.to(tl.int64) * stride_tr + step, token.to(tl.int64))
    tl.store(prev_ptr + row, token.to(tl.int32))


# GPU launch shapes (block_v, block_r, num_warps, row chunks per program or 0 for all, row-loop
# stages). Measured on the H200 (tools/sweep_stream.py, N = 5, bf16 cache, T = 1, CUDA graph, cold L2):
# 128/64/8/all/2 is the fastest tried: inverse CDF 411 us at 64 rows and 1132 at 253, Gumbel 544 and
# 1687 (64/64/4 and 128/64/4 shapes, one chunk or all chunks per program, 32/64/4: 388-2344 us).
# All far from the targets (150 / 270 / 420 us) and behind impl="inverse_cdf" (272 / 626) and the
# best Gumbel designs: one CTA per SM (147-180 KB shared memory, 166-255 registers at 8 warps),
# 12.5% occupancy, DRAM at 14% and ~70 instructions per logit (Nsight Compute, 253 rows).
GPU_LAYOUT = (128, 64, 8, 0, 2)
CPU_LAYOUT = (64, 16, 4, 0, 1)


class StreamBackend:
    """Large-batch drafting (both methods): per step one tile-streaming launch (+ a pick for inverse CDF).

    Parameters
    ----------
    head : MarkovHead (power-of-two rank >= 16). num_steps : N. max_rows : the largest R of a call.
    method : ``"gumbel"`` or ``"inverse_cdf"``. cache_dtype : bf16 or fp32. device : cuda, or cpu
        (Triton's interpreter).
    block_v, block_r, num_warps : launch shape (powers of two; ``block_r >= 16`` is a tensor-core
        tile); defaults from :data:`GPU_LAYOUT` / :data:`CPU_LAYOUT`.
    group_chunks : row chunks per program (0: the whole batch, W2 read once per tile); smaller
        values split the batch over programs that share the tile through L2.
    row_stages : software-pipeline stages of the row-chunk loop (1: none).
    native_round : round to bf16 with the conversion instruction on the GPU (same values as
        :func:`dspark_markov.ops.numerics.round_to`); the interpreter always rounds in integers.
    filter_margin : the approximate-noise ranking's margin (a huge value forces exact keys, tests).

    Scratch (allocated once): previous tokens ``[max_rows]`` int32, per-row words ``[N, max_rows]``
    int64 and, for inverse CDF, tile partials ``2 x [max_rows, ceil(V / block_v)]`` fp32. ``run``
    allocates nothing and synchronises nothing (CUDA-graph safe).
    """

    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    GRAPH_SAFE = True
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, block_v=None, block_r=None,
                 num_warps=None, group_chunks=None, row_stages=None, native_round=True, filter_margin=FILTER_MARGIN):
        if head.rank & (head.rank - 1) or head.rank < 16:
            raise ValueError(f"head_weight: impl 'stream' needs a power-of-two rank >= 16, got {head.rank}")
        if method not in self.METHODS:
            raise ValueError(f"method: impl 'stream' supports 'gumbel' and 'inverse_cdf', got {method!r}")
        device = torch.device(device)
        self.interpret = INTERPRET or device.type == "cpu"
        default = CPU_LAYOUT if self.interpret else GPU_LAYOUT
        self.block_v = int(block_v or default[0])
        self.block_r = int(block_r or default[1])
        self.num_warps = int(num_warps or default[2])
        self.group_chunks = int(default[3] if group_chunks is None else group_chunks)
        self.row_stages = int(row_stages or default[4])
        self.native_round = bool(native_round) and not self.interpret
        if self.group_chunks < 0 or self.row_stages < 1:
            raise ValueError(f"group_chunks: expected >= 0 (and row_stages >= 1), got {group_chunks}, {row_stages}")
        check_power_of_two("block_v", self.block_v, 16)
        check_power_of_two("block_r", self.block_r, 16)
        check_power_of_two("num_warps", self.num_warps, 1)
        self.head = head
        self.method = method
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        self.filter_margin = float(filter_margin)
        self.upcast = self.interpret or head.dtype == torch.float32
        vocab = head.vocab_size
        self.num_tiles = triton.cdiv(vocab, self.block_v)
        self.tiles_p2 = triton.next_power_of_2(self.num_tiles)
        if method == "inverse_cdf" and self.tiles_p2 > 8192:
            raise ValueError(f"block_v: V = {vocab} needs {self.num_tiles} tiles of {self.block_v}; pass a larger block_v")
        self.prev = torch.zeros(self.max_rows, dtype=torch.int32, device=device)
        self.words = torch.zeros(self.num_steps, self.max_rows, dtype=torch.int64, device=device)
        part = (self.max_rows, self.num_tiles) if method == "inverse_cdf" else (1, 1)
        self.part_max = torch.zeros(part, dtype=torch.float32, device=device)
        self.part_mass = torch.zeros(part, dtype=torch.float32, device=device)
        # Stand-ins for the per-slot tensors when S == 0 (never read or written: every access is masked off).
        self.no_temperature = torch.zeros(1, dtype=torch.float32, device=device)
        self.no_seeds = torch.zeros(1, dtype=torch.int64, device=device)
        self.no_cache = torch.zeros(1, self.num_steps, vocab, dtype=cache_dtype, device=device)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` int64 and write ``logits_cache`` ``[S, N, V]`` (see the module)."""
        head = self.head
        rows, steps, vocab = base_logits.shape
        num_slots = temperature.shape[0]
        inverse = self.method == "inverse_cdf"
        if num_slots == 0:  # every row is padding: point the per-slot loads (all masked off) at scratch
            temperature, seeds, logits_cache = self.no_temperature, self.no_seeds, self.no_cache
        common = dict(enable_fp_fusion=False)
        _prepare_kernel[(rows,)](anchor, self.prev, self.words, self.words.stride(0), steps,
                                 STEPS_P2=triton.next_power_of_2(steps), num_warps=1, **common)
        chunks = triton.cdiv(rows, self.block_r)
        group_chunks = self.group_chunks or chunks
        num_groups = triton.cdiv(chunks, group_chunks)
        for step in range(steps):
            _stream_step_kernel[(self.num_tiles * num_groups,)](
                base_logits, base_logits.stride(0), base_logits.stride(1),  # [R, N, V]
                head.embed_weight, head.head_weight,  # [V_t, R_k], [V, R_k]
                logits_cache, logits_cache.stride(0),  # [S, N, V]
                idx_mapping, positions, temperature, seeds,  # [R*N], [R*N], [S], [S]
                self.prev, self.words, self.words.stride(0),  # [max_rows], [N, max_rows]
                draft_tokens, draft_tokens.stride(0),  # [R, N]
                self.part_max, self.part_mass, self.part_max.stride(0),  # [max_rows, num_tiles]
                rows, vocab, head.embed_vocab_size, num_slots, step, steps, head.scale, self.filter_margin,
                num_groups, group_chunks,
                RK=head.rank, BLOCK_V=self.block_v, BLOCK_R=self.block_r, ROW_STAGES=self.row_stages,
                NATIVE_ROUND=self.native_round,
                SCALED=head.scale != 1.0,
                INVERSE_CDF=inverse, UPCAST=self.upcast, IEEE_DOT=head.dtype == torch.float32,
                HARDWARE=not self.interpret, num_warps=self.num_warps, **common)
            if inverse:
                _pick_kernel[(rows,)](
                    self.part_max, self.part_mass, self.part_max.stride(0),  # [max_rows, num_tiles]
                    self.words, self.words.stride(0),  # [N, max_rows]
                    idx_mapping, positions, temperature, seeds,
                    logits_cache, logits_cache.stride(0),  # [S, N, V]
                    draft_tokens, draft_tokens.stride(0),  # [R, N]
                    self.prev,  # [max_rows]
                    vocab, num_slots, step, steps, self.num_tiles,
                    TILES_P2=self.tiles_p2, BLOCK_V=self.block_v, num_warps=4, **common)
        if not inverse:
            _finish_gumbel_kernel[(rows,)](self.words, self.words.stride(0), draft_tokens, draft_tokens.stride(0),
                                           steps - 1, vocab, num_warps=1, **common)
