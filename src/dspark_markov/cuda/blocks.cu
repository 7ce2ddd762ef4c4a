// impl="cuda_gumbel": the Gumbel block kernel of the large-batch path (32-256 rows), CUDA C++ for sm_90.
//
// The step's bias comes from the same cuBLAS GEMM as gumbel_fused and vLLM's loop (a [rows, V] bf16
// buffer), so the cache is theirs bit for bit. Per work item (row, chunk of DM_CHUNK = 512 tokens) a WARP,
// on its own (no block barrier; many warps per SM hide each other's latencies; measured on the H200: block
// items of 4096 tokens with a block-wide seed step were latency-bound, 167 us per step at 253 rows)
//   phase 1: reads the base logits and the bias once (16-byte loads), forms z = round(U + bias) and
//            writes the cache row of a live sample, and ranks every token by an exact UPPER BOUND of
//            its Gumbel key: add_rn(z * (1/T), table[bucket(hash)]) (noise.cuh tb_bucket; the table
//            holds the largest exact noise of every hash bucket, built once from all 2^32 hashes by
//            dm_blocks_noise_table), kept in registers: ~15 hash + 4 bucket + 1 shared load + 2 per token,
//            no logarithm;
//   seed:    the token of the warp's largest bound gets its exact key (every lane, z recomputed from
//            the inputs) -> a threshold that is a real key of this chunk;
//   phase 2: only tokens whose bound can still reach that key (within key_slack: the z * (1/T) for
//            z / T rounding) get exact keys, div_rn(z, T) + gumbel32(...) (the reference's operations),
//            merged as packed (key, index) words (the first NaN wins, then the first maximum).
// The warp's best word becomes the chunk's partial (block_max fp32, block_token int64), which
// launch_combine (draft/triton_blocks.py) reduces per row with torch.argmax semantics, as for gumbel_fused.
// Greedy rows (T = 0, padding) rank z itself (exact, no hash). A chunk where every bound is NaN / -inf
// falls back to exact keys for every token (correct, slow, only for NaN / all -inf rows and a subnormal T).
//
// Bytes per step: rows * V * (base bytes + 2 bias bytes) read, live * V * cache bytes written,
// rows * chunks * 12 partials; the table (8.4 KB) once per block.
#include "common.cuh"  // noise.cuh, bf16 rounding, the skip threshold, streaming I/O

using dm::i32;
using dm::i64;
using dm::u32;
using dm::u64;

#define DM_BT 256                  // threads per block
#define DM_WARPS (DM_BT / 32)
#define DM_GROUPS 2                // 8-token groups per lane and chunk
#define DM_PER (8 * DM_GROUPS)     // tokens per thread and chunk
#define DM_CHUNK (32 * DM_PER)     // tokens per work item, one warp's (cuda_gumbel.CHUNK)
#define DM_BINT64_MIN DM_WORD_NONE

// DM_BF_PREFETCH: each block asks L2 for its next work item's base and bias lines when it starts an item.
#define DM_BF_PREFETCH 1
// DM_BF_COMBINE: the row's last arriving warp (a per-row counter of work items) merges the row's words into its
// token, writes draft_tokens / prev and gathers W1[token] into the next step's GEMM codes: no combine launch.
// The words go to block_token (packed; INT64_MIN between launches, reset by the merging warp), block_max is
// unused; the counter is reset by that warp too.
#define DM_BF_COMBINE 2

struct BlocksArgs {  // every field 8 bytes (matches cuda_gumbel.BlocksArgs)
  u64 base;         // [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
  u64 bias;         // [>= R, V - bias_lo] bf16, row stride stride_bias: bias[r, v - bias_lo] (unscaled cuBLAS output)
  u64 cache;        // [S, N, V] bf16/fp32, strides (stride_cs, V, 1)
  u64 idx;          // [R * N] int32/int64 slot per (row, step), -1 = padding
  u64 pos;          // [R * N] int32/int64 positions
  u64 temp;         // [S] fp32
  u64 seeds;        // [S] int64
  u64 block_max;    // [>= R, chunks] fp32 partial keys, row stride stride_part
  u64 block_token;  // [>= R, chunks] int64 partial tokens
  u64 gtab;         // [DM_TB_SIZE] fp32 noise upper bounds per hash bucket
  i64 rows, vocab, num_slots, num_steps, step;
  // This launch: ranges [chunk_lo, chunk_lo + chunks) of every row, a range being `range` chunks of DM_CHUNK tokens
  // (one work item, one partial); bias_lo = chunk_lo * range * DM_CHUNK.
  i64 chunks, chunk_lo, bias_lo, range;
  i64 stride_br, stride_bn, stride_bias, stride_cs, stride_part;
  i64 idx64, pos64, has_scale;  // has_scale: scale != 1 (the entry point's S bit must agree)
  i64 flags;                    // DM_BF_* hints (never change a draw)
  // DM_BF_COMBINE only: [max_rows] int32 arrival counters (0 between launches), draft_tokens [R, N] int64,
  // prev [max_rows] int64, W1 [embed_rows, rank] bf16, codes [max_rows, rank] bf16 (written when gather).
  u64 counts, tokens, prev, embed, codes;
  i64 total_chunks, tokens_row_stride, tokens_step_stride, embed_rows, rank, codes_row_stride, gather;
  double scale, filter_margin;
};


__device__ __forceinline__ i64 bl_load_cg64(const i64* ptr) {  // from L2 (another block's word)
  i64 v;
  asm volatile("ld.global.cg.b64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}

__device__ __forceinline__ void bl_prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(ptr));
}


struct RowState {
  bool live, greedy;
  i64 slot;
  float temp, inv_temp;
  u32 prefix;
};

__device__ __forceinline__ RowState row_state(const BlocksArgs& a, i64 row) {
  const i64 sample = row * a.num_steps + a.step;
  i64 slot = a.idx64 ? ((const i64*)a.idx)[sample] : (i64)((const i32*)a.idx)[sample];
  const i64 position = a.pos64 ? ((const i64*)a.pos)[sample] : (i64)((const i32*)a.pos)[sample];
  RowState r;
  r.live = slot >= 0 && slot < a.num_slots;
  r.slot = r.live ? slot : 0;
  r.temp = r.live ? ((const float*)a.temp)[r.slot] : 0.0f;
  const i64 seed = r.live ? ((const i64*)a.seeds)[r.slot] : 0;
  r.greedy = r.temp == 0.0f;
  // (a subnormal T: NaN bounds, every token an exact candidate; a -inf bound could be skipped by another chunk's
  // threshold although div_rn(z, T) + g is finite)
  r.inv_temp = r.greedy ? 1.0f : dm::bound_inv_temp(dm::div_rn(1.0f, r.temp));
  r.prefix = dm::draft_prefix(seed, (int)a.step, position);
  return r;
}

// z of one token from the inputs (SPEC.md 3): round_cache(float(U) + bias), the bias scaled and
// rounded again to bf16 when scale != 1.
template <bool BASE_F32, bool CACHE_F32, bool SCALE>
__device__ __forceinline__ float make_z(float u, u32 bias_bits, float scale) {
  float b = dm::bf16(bias_bits);
  if (SCALE) b = dm::bf16(dm::round_bf16(dm::mul_rn(b, scale)));
  const float s = dm::add_rn(u, b);
  return CACHE_F32 ? s : dm::bf16(dm::round_bf16(s));
}

template <bool BASE_F32, bool CACHE_F32, bool SCALE>
__device__ __forceinline__ float z_at(const BlocksArgs& a, const void* base_row, const unsigned short* bias_row,
                                      i64 v) {
  const float u = BASE_F32 ? ((const float*)base_row)[v] : dm::bf16(((const unsigned short*)base_row)[v]);
  return make_z<BASE_F32, CACHE_F32, SCALE>(u, bias_row[v], (float)a.scale);
}

// The exact key of SPEC.md 4: z on greedy rows, div_rn(z, T) + gumbel32(uniform32(hash)) otherwise.
__device__ __forceinline__ float exact_key(const RowState& r, float z, u32 v) {
  return r.greedy ? z : dm::exact_key(z, r.temp, r.prefix, v);
}

// The exact key of token t recomputed from the inputs. Not inlined: its ~200 instructions exist once in the
// binary, not once per unrolled call site (the seed and every token slot of phase 2: 17 copies made the kernel
// large and its rare exact paths cold in the instruction cache).
template <bool BASE_F32, bool CACHE_F32, bool SCALE>
__device__ __noinline__ float bl_exact_at(const BlocksArgs& a, const RowState r, const void* base_row,
                                          const unsigned short* bias_row, i64 t) {
  return exact_key(r, z_at<BASE_F32, CACHE_F32, SCALE>(a, base_row, bias_row, t), (u32)t);
}


// The 16-byte loads of chunk `chunk` (global, DM_CHUNK tokens) of row `row` (VEC path): groups of 8 tokens per lane.
template <bool BASE_F32, int G>
__device__ __forceinline__ void load_chunk(const BlocksArgs& a, i64 row, i64 chunk, int lane,
                                           uint4 (&braw)[G][2], uint4 (&wraw)[G]) {
  const i64 v0 = chunk * (256 * G);
  const char* base_row = (const char*)a.base + (row * a.stride_br + a.step * a.stride_bn) * (BASE_F32 ? 4 : 2);
  const unsigned short* bias_row = (const unsigned short*)a.bias + (row * a.stride_bias - a.bias_lo);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const i64 t0 = v0 + (i64)g * 256 + lane * 8;
    if (t0 < a.vocab) {  // vocab % 8 == 0 on this path: a group is in or out whole
      if (BASE_F32) {
        braw[g][0] = dm::load_cs16(base_row + t0 * 4);
        braw[g][1] = dm::load_cs16(base_row + t0 * 4 + 16);
      } else {
        braw[g][0] = dm::load_cs16(base_row + t0 * 2);
      }
      wraw[g] = dm::load_cs16(bias_row + t0);
    }
  }
}


// bf16 pair {lo, hi} of fp32 values rounded to nearest even (torch's NaN 0x7FC0): the integer rounding, or
// (HW) one cvt.rn.bf16x2.f32 with the NaN payload fixed afterwards.
template <bool HW>
__device__ __forceinline__ u32 bl_pack_bf16(float lo, float hi) {
  if (!HW) return dm::round_bf16(lo) | (dm::round_bf16(hi) << 16);
  u32 p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  if (lo != lo) p = (p & 0xFFFF0000u) | 0x7FC0u;
  if (hi != hi) p = (p & 0xFFFFu) | 0x7FC00000u;
  return p;
}

// X: variant bits of the 16-byte path. 1 = bf16 rounding by cvt.rn.bf16x2.f32; 2 = the next work item's
// loads issued right after this item's phase 1 (in flight during the seed and phase 2).
#define DM_X_HWCVT 1
#define DM_X_PIPE 2
#define DM_X_NARROW 8  // chunks of 256 tokens (one group of 8 per lane): fewer registers, more warps per SM

template <bool BASE_F32, bool CACHE_F32, bool VEC, bool SCALE, int X = 0>
__device__ __forceinline__ void blocks_body(const BlocksArgs& a) {
  __shared__ float gtab_s[DM_TB_SIZE];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < DM_TB_SIZE; i += DM_BT) gtab_s[i] = ((const float*)a.gtab)[i];
  __syncthreads();  // the only block-wide barrier: every warp then works alone
  const float ninf = -__int_as_float(0x7f800000);
  const i64 items = a.rows * a.chunks;  // work items: (row, range of a.range chunks)
  const i64 vocab = a.vocab;
  const float scale = (float)a.scale;
  const float margin = (float)a.filter_margin;
  const bool combine = (a.flags & DM_BF_COMBINE) != 0;
  constexpr bool PIPE = VEC && (X & DM_X_PIPE);
  constexpr bool HWCVT = X & DM_X_HWCVT;
  constexpr int G = (X & DM_X_NARROW) ? 1 : DM_GROUPS;  // 8-token groups per lane: a chunk of 256 G tokens
  constexpr int CH = 256 * G;
  constexpr int PER = 8 * G;
  const i64 nchunks = (vocab + CH - 1) / CH;
  // Each warp takes a contiguous run of work items (mostly of one row: its row state is loaded once).
  const i64 warps_total = (i64)gridDim.x * DM_WARPS;
  const i64 per_warp = (items + warps_total - 1) / warps_total;
  const i64 first = ((i64)blockIdx.x * DM_WARPS + warp) * per_warp;
  const i64 item_end = first + per_warp < items ? first + per_warp : items;
  const i64 stride_items = 1;
  uint4 braw[G][2];
  uint4 wraw[G];
  if (PIPE && first < item_end) {
    const i64 row0 = first / a.chunks;
    load_chunk<BASE_F32, G>(a, row0, (a.chunk_lo + first - row0 * a.chunks) * a.range, lane, braw, wraw);
  }
  RowState r;
  i64 state_row = -1;
  i64 run_best = DM_BINT64_MIN, run_items = 0, run_slot = -1;  // DM_BF_COMBINE: the warp's run of one row
  for (i64 item = first; item < item_end; item += stride_items) {
    const i64 row = item / a.chunks;
    const i64 range = a.chunk_lo + item - row * a.chunks;  // global range index
    if (row != state_row) {
      r = row_state(a, row);
      state_row = row;
    }
    const char* base_row = (const char*)a.base + (row * a.stride_br + a.step * a.stride_bn) * (BASE_F32 ? 4 : 2);
    const unsigned short* bias_row = (const unsigned short*)a.bias + (row * a.stride_bias - a.bias_lo);
    char* cache_row = (char*)a.cache + (r.slot * a.stride_cs + a.step * vocab) * (CACHE_F32 ? 4 : 2);
    const i64 chunk_end = (range + 1) * a.range < nchunks ? (range + 1) * a.range : nchunks;
    if ((a.flags & DM_BF_PREFETCH) && item + stride_items < item_end && (lane & 7) == 0) {
      // The next item's first chunk into L2: one lane per 128-byte line of bf16; fp32 base: the next line too.
      const i64 nitem = item + stride_items;
      const i64 nrow = nitem / a.chunks;
      const i64 nv0 = (a.chunk_lo + nitem - nrow * a.chunks) * a.range * CH;
      const char* nbase = (const char*)a.base + (nrow * a.stride_br + a.step * a.stride_bn) * (BASE_F32 ? 4 : 2);
      const unsigned short* nbias = (const unsigned short*)a.bias + (nrow * a.stride_bias - a.bias_lo);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const i64 t0 = nv0 + (i64)g * 256 + lane * 8;
        if (t0 < vocab) {
          bl_prefetch_l2(nbase + t0 * (BASE_F32 ? 4 : 2));
          if (BASE_F32) bl_prefetch_l2(nbase + t0 * 4 + 128);
          bl_prefetch_l2(nbias + t0);
        }
      }
    }
    i64 best = DM_BINT64_MIN;  // this lane's best packed (exact key, token) word of the range
    float thr = ninf;          // a bound below thr cannot reach the best exact key found so far
    for (i64 chunk = range * a.range; chunk < chunk_end; ++chunk) {  // warp-uniform
      const i64 v0 = chunk * CH;
      // ---- phase 1: z, the cache, the key bounds
      float ub[PER];
      float sb = ninf, sz = 0.0f;  // the lane's largest bound, its token and its z (the seed needs no reload)
      int si = -1;
      if (VEC) {
        if (!PIPE) load_chunk<BASE_F32, G>(a, row, chunk, lane, braw, wraw);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const i64 t0 = v0 + (i64)g * 256 + lane * 8;
          if (t0 < vocab) {
            float z[8];
            const u32 w[4] = {wraw[g].x, wraw[g].y, wraw[g].z, wraw[g].w};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              float u;
              if (BASE_F32) {
                const uint4 q = braw[g][e >> 2];
                const u32 qs[4] = {q.x, q.y, q.z, q.w};
                u = __uint_as_float(qs[e & 3]);
              } else {
                const u32 qs[4] = {braw[g][0].x, braw[g][0].y, braw[g][0].z, braw[g][0].w};
                u = dm::bf16((qs[e >> 1] >> ((e & 1) * 16)) & 0xFFFFu);
              }
              if (HWCVT && !CACHE_F32) {  // the fp32 sum here, rounded in pairs below
                float b = dm::bf16((w[e >> 1] >> ((e & 1) * 16)) & 0xFFFFu);
                if (SCALE) b = dm::bf16(dm::round_bf16(dm::mul_rn(b, scale)));
                z[e] = dm::add_rn(u, b);
              } else {
                z[e] = make_z<BASE_F32, CACHE_F32, SCALE>(u, (w[e >> 1] >> ((e & 1) * 16)) & 0xFFFFu, scale);
              }
            }
            u32 packed[4];
            if (!CACHE_F32) {
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                if (HWCVT) {
                  packed[k] = bl_pack_bf16<true>(z[2 * k], z[2 * k + 1]);
                  z[2 * k] = __uint_as_float(packed[k] << 16);
                  z[2 * k + 1] = __uint_as_float(packed[k] & 0xFFFF0000u);
                } else {  // z already rounded: its high halves
                  packed[k] = (__float_as_uint(z[2 * k]) >> 16) | (__float_as_uint(z[2 * k + 1]) & 0xFFFF0000u);
                }
              }
            }
            if (r.live) {
              if (CACHE_F32) {
                dm::store_cs16(cache_row + t0 * 4, __float_as_uint(z[0]), __float_as_uint(z[1]), __float_as_uint(z[2]),
                           __float_as_uint(z[3]));
                dm::store_cs16(cache_row + t0 * 4 + 16, __float_as_uint(z[4]), __float_as_uint(z[5]),
                           __float_as_uint(z[6]), __float_as_uint(z[7]));
              } else {
                dm::store_cs16(cache_row + t0 * 2, packed[0], packed[1], packed[2], packed[3]);
              }
            }
            // The greedy test outside the token loop: straight-line code for the 8 tokens.
            if (r.greedy) {
#pragma unroll
              for (int e = 0; e < 8; ++e) ub[g * 8 + e] = z[e];
            } else {
#pragma unroll
              for (int e = 0; e < 8; ++e)
                ub[g * 8 + e] = dm::add_rn(dm::mul_rn(z[e], r.inv_temp),
                                           gtab_s[dm::tb_bucket(dm::hash_finish(r.prefix, (u32)(t0 + e)))]);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              if (ub[g * 8 + e] > sb) {
                sb = ub[g * 8 + e];
                si = (int)(t0 + e);
                sz = z[e];
              }
            }
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) ub[g * 8 + e] = ninf;
          }
        }
        if (PIPE) {  // the next chunk's loads in flight during this chunk's seed and phase 2
          if (chunk + 1 < chunk_end) {
            load_chunk<BASE_F32, G>(a, row, chunk + 1, lane, braw, wraw);
          } else if (item + stride_items < item_end) {
            const i64 nitem = item + stride_items;
            const i64 nrow = nitem / a.chunks;
            load_chunk<BASE_F32, G>(a, nrow, (a.chunk_lo + nitem - nrow * a.chunks) * a.range, lane, braw, wraw);
          }
        }
      } else {
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const i64 t = v0 + (i64)g * 256 + lane * 8 + e;
            float b = ninf;
            if (t < vocab) {
              const float z = z_at<BASE_F32, CACHE_F32, SCALE>(a, base_row, bias_row, t);
              if (r.live) {
                if (CACHE_F32) ((float*)cache_row)[t] = z;
                else ((unsigned short*)cache_row)[t] = (unsigned short)(__float_as_uint(z) >> 16);
              }
              b = r.greedy ? z
                           : dm::add_rn(dm::mul_rn(z, r.inv_temp),
                                        gtab_s[dm::tb_bucket(dm::hash_finish(r.prefix, (u32)t))]);
              if (b > sb) {
                sb = b;
                si = (int)t;
                sz = z;
              }
            }
            ub[g * 8 + e] = b;
          }
        }
      }

      // ---- seed (first chunk of the range): the warp's largest bound, first token among equals; every lane
      // computes its exact key -> the threshold. Later chunks use the best exact key found so far.
      int seed = -1;
      if (chunk == range * a.range) {
#pragma unroll
        for (int off = 16; off; off >>= 1) {
          const float ob = __shfl_xor_sync(0xFFFFFFFFu, sb, off);
          const int oi = __shfl_xor_sync(0xFFFFFFFFu, si, off);
          const float oz = __shfl_xor_sync(0xFFFFFFFFu, sz, off);
          if (oi >= 0 && (si < 0 || ob > sb || (ob == sb && oi < si))) {
            sb = ob;
            si = oi;
            sz = oz;
          }
        }
        if (si >= 0) {
          const float k = exact_key(r, sz, (u32)si);
          const i64 word = dm::pack_word(k, si);
          if (lane == 0) best = word;
          thr = dm::skip_threshold(word, margin);
          seed = si;
        }
      }

      // ---- phase 2: exact keys where the bound can still reach the best key (rare: lanes diverge here)
      // The candidates as a bit mask (unrolled compares), then one exact-key call site in a loop.
      u32 mask = 0;
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const i64 t = v0 + (i64)(j >> 3) * 256 + lane * 8 + (j & 7);
        if (!(ub[j] < thr) && t < vocab && (int)t != seed) mask |= 1u << j;
      }
      const bool found = mask != 0;
      while (mask) {
        const int j = __ffs(mask) - 1;
        mask &= mask - 1;
        const i64 t = v0 + (i64)(j >> 3) * 256 + lane * 8 + (j & 7);
        const i64 word = dm::pack_word(bl_exact_at<BASE_F32, CACHE_F32, SCALE>(a, r, base_row, bias_row, t), (i32)t);
        best = word > best ? word : best;
      }
      if (__any_sync(0xFFFFFFFFu, found)) {  // a new exact key: the warp's best -> a higher threshold
        i64 w = best;
#pragma unroll
        for (int off = 16; off; off >>= 1) {
          const i64 o = dm::shfl_xor_i64(w, off);
          w = o > w ? o : w;
        }
        thr = dm::skip_threshold(w, margin);
      }
    }
#pragma unroll
    for (int off = 16; off; off >>= 1) {
      const i64 o = dm::shfl_xor_i64(best, off);
      best = o > best ? o : best;
    }
    const i64 part = row * a.stride_part + range;
    if (!combine) {
      if (lane == 0) {
        ((float*)a.block_max)[part] = dm::word_key(best);
        ((i64*)a.block_token)[part] = (i64)dm::word_index(best);
      }
      continue;
    }
    // DM_BF_COMBINE: the warp merges its consecutive items of one row and publishes once per run (one word in the
    // run's first slot, one fence, one arrival counting the run's items): a fence per item waited for the item's
    // cache stores (H200 u2: +15 us per step at 253 rows).
    run_best = best > run_best ? best : run_best;
    run_items += 1;
    if (run_slot < 0) run_slot = part;
    if (item + 1 < item_end && (item + 1) / a.chunks == row) continue;  // the run goes on
    int last = 0;
    if (lane == 0) {
      ((i64*)a.block_token)[run_slot] = run_best;
      __threadfence();  // the word before the arrival
      last = atomicAdd(&((int*)a.counts)[row], (int)run_items) + (int)run_items == (int)a.total_chunks;
    }
    run_best = DM_BINT64_MIN;
    run_items = 0;
    run_slot = -1;
    if (__shfl_sync(0xFFFFFFFFu, last, 0)) {  // this warp saw every other item's arrival: merge the row
      __threadfence();
      i64 w = DM_BINT64_MIN;
      for (int c = lane; c < (int)a.total_chunks; c += 32) {
        i64* slot = (i64*)a.block_token + row * a.stride_part + c;
        const i64 o = bl_load_cg64(slot);
        w = o > w ? o : w;
        *slot = DM_BINT64_MIN;  // the slots start empty at the next launch (runs fill only their first)
      }
#pragma unroll
      for (int off = 16; off; off >>= 1) {
        const i64 o = dm::shfl_xor_i64(w, off);
        w = o > w ? o : w;
      }
      i64 token = (i64)dm::word_index(w);  // torch.argmax over the row: the first NaN, else the first max
      token = token < 0 ? 0 : (token >= vocab ? vocab - 1 : token);
      if (lane == 0) {
        ((i64*)a.tokens)[row * a.tokens_row_stride + a.step * a.tokens_step_stride] = token;
        ((i64*)a.prev)[row] = token;
        ((int*)a.counts)[row] = 0;
      }
      if (a.gather) {
        const i64 t = token < a.embed_rows ? token : a.embed_rows - 1;
        const unsigned short* src = (const unsigned short*)a.embed + t * a.rank;
        unsigned short* dst = (unsigned short*)a.codes + row * a.codes_row_stride;
        for (int k = lane; k < (int)a.rank; k += 32) dst[k] = src[k];
      }
    }
  }
}

// One entry point per (base fp32, cache fp32, 16-byte I/O, scale != 1).
#define DM_BLOCKS_ENTRY(B, C, V, S)                                                                  \
  extern "C" __global__ void __launch_bounds__(DM_BT, 3) dm_blocks_b##B##_c##C##_v##V##_s##S(const BlocksArgs a) { \
    blocks_body<B, C, V, S>(a);                                                                      \
  }
#define DM_BLOCKS_ENTRIES(B, C) \
  DM_BLOCKS_ENTRY(B, C, 0, 0)   \
  DM_BLOCKS_ENTRY(B, C, 0, 1)   \
  DM_BLOCKS_ENTRY(B, C, 1, 0)   \
  DM_BLOCKS_ENTRY(B, C, 1, 1)
// Variants of the bf16 / bf16 / 16-byte / unscaled path (cuda_gumbel VARIANTS; X bits above).
// X & 4: 4 blocks per SM (<= 64 registers) instead of 3; X & 8: chunks of 256 tokens (the launcher halves
// `range` for the other entry points, so a work item has the same tokens whichever entry runs it).
#define DM_BLOCKS_VARIANT(X)                                                                         \
  extern "C" __global__ void __launch_bounds__(DM_BT, (X & 4) ? 4 : 3) dm_blocks_b0_c0_v1_s0_x##X(const BlocksArgs a) { \
    blocks_body<false, false, true, false, X & 11>(a);                                               \
  }
#ifdef DM_BLOCKS_TWO_ENTRIES  // the CPU test's nvcc compile check: every template bit both ways, in 1/8 of the time
DM_BLOCKS_ENTRY(0, 0, 1, 0)
DM_BLOCKS_ENTRY(1, 1, 0, 1)
#else
DM_BLOCKS_ENTRIES(0, 0)
DM_BLOCKS_ENTRIES(0, 1)
DM_BLOCKS_ENTRIES(1, 0)
DM_BLOCKS_ENTRIES(1, 1)
DM_BLOCKS_VARIANT(1)
DM_BLOCKS_VARIANT(2)
DM_BLOCKS_VARIANT(3)
DM_BLOCKS_VARIANT(5)
DM_BLOCKS_VARIANT(7)
DM_BLOCKS_VARIANT(13)
DM_BLOCKS_VARIANT(15)
#endif

// The noise upper-bound table: words[b] = the largest gumbel32(uniform32(h)) over every hash h with
// tb_bucket(h) == b, as tb_order words (common.cuh dm::tb_sweep, also chain.cu's dm_noise_table).
extern "C" __global__ void dm_blocks_noise_table(u32* words) { dm::tb_sweep(words); }

// words (tb_order) -> fp32 bounds in place (an empty bucket -> -inf).
extern "C" __global__ void dm_blocks_table_floats(u32* words) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < DM_TB_SIZE) words[i] = __float_as_uint(dm::tb_unorder(words[i]));
}
