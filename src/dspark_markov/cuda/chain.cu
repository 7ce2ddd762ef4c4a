// impl="cuda_chain": all N draft steps of 1-16 rows in one persistent launch (Gumbel-max).
//
// One block per SM (16 warps of <= 128 registers, or 8 warps of <= 255); block b owns a contiguous
// range of 16-token tiles of W2 and keeps it on chip across the steps: each warp holds its first
// REGS tiles as mma A-fragments in registers, the next tiles go to shared memory while it lasts
// (smem_tiles slots, filled at step 0 by cp.async without registers), the rest is re-read from L2
// at every step (with an L2 evict_last policy; data read once uses evict_first). Step 0 streams
// all of W2 from HBM.
//
// Per step: bias^T [16 tokens x 8*NT rows] = W2_tile [16 x 256] @ codes^T on tensor cores
// (mma.sync m16n8k16 bf16 -> fp32; the rank is permuted identically in A and B so that every lane
// loads 16-byte chunks), rounded once to bf16 (again after `scale`), staged per warp in shared
// memory, then z = round(U + bias) to the cache dtype, the cache write of live rows and an
// approximate Gumbel key per logit (noise.cuh, the filter of draft/gumbel_filter.py); every lane
// keeps the three best packed (key, index) words of its row, merged over the row's lanes. Per
// (warp, row): if the best approximate key beats the third by more than key_slack, the exact
// winner is the first or the second and only their exact keys are computed (z read back from the
// cache the warp wrote); otherwise (a near-tie, NaN, +-inf or zero best) the row's lanes compute
// exact keys over the warp's tokens. Greedy rows (T = 0, padding) rank z itself: exact at once.
// The block's best word goes into the row's step word with atomicMax (the merged word is the
// torch.argmax of the whole row), then a grid barrier (one arrival counter per step, bounded
// spin: on timeout the status flag is set and the block leaves the loop) publishes the token;
// every block gathers W1[token] (prefetched into L2 by the block that found it) into its codes.
// The last block to exit writes draft_tokens and resets the words and counters, so a call is one
// launch (graph capturable).
//
// Bytes per call: V * 256 * 2 of W2 from HBM once (step 0), (N - 1) x the L2-resident part from L2,
// R * N * V * (base bytes + cache bytes), R * N * 512 of W1 rows.
//
// Variants (cuda_chain.VARIANTS; template bits V6 on chain_body, one entry point per variant of the
// 16-warp / one-register-tile shape) and run-time flags (ChainArgs.flags, DM_F_*): see their
// comments below. The defaults (cuda_chain.DEFAULT_VARIANTS: 43 at 1-4 rows, 107 at 5-8, 7275 at
// 9-16; flags 15) change where time goes, never a draw: L2 tiles in two load batches, every step's row
// keys at launch, two base-logit units in flight in phase A, phase B on fp32 triples four keys at a
// time (43) or, from 4 rows, on exact upper bounds of the keys from the per-bucket noise table
// (V6 & 64: no approximate noise), exact keys for every token at 1-2 rows, step 0 in dependency order,
// L2 prefetch of W2 and of the next step's base logits.
#include "common.cuh"  // noise.cuh and dm::mma16816 (the bf16 helpers below stay: common.cuh's changed the SASS)

using dm::i32;
using dm::i64;
using dm::u32;
using dm::u64;
using dm::prefetch_l2_bulk;

#define DM_MAX_ROWS 16
#define DM_RANK 256
#define DM_INT64_MIN (-9223372036854775807ll - 1)
// Run-time options (ChainArgs.flags): hints only, the draws never depend on them.
// DM_F_PF_W2: at launch, lane 0 of every warp asks the copy engine to bring its register tiles and
// its L2-streamed tiles from HBM into L2 (cp.async.bulk.prefetch.L2, one instruction per range),
// so all of W2 is requested at once instead of one tile in flight per warp.
// DM_F_PF_BASE: the base logits of the block's tokens for step s + 1 are prefetched into L2 at the
// start of step s (step 0's at launch): phase A reads them from L2, not HBM.
// DM_F_STEP0_ORDER: step 0 in dependency order: the anchors (and every row key), then the W1 rows of the codes, and only
// then the W2 traffic (with DM_F_PF_W2: the warp's whole W2 range prefetched into L2), so the codes
// do not queue behind 66 MB; the shared-memory tiles are copied (cp.async) when the warp reaches
// them in step 0's tile loop instead of at launch (the issue of those copies stalls the warps).
// DM_F_EXACT_SMALL: at 1-2 rows (16-32 lanes per row, 2-4 tokens per lane) phase B computes the exact
// key of every token directly (no approximate ranking, no merge of triples across 5 shuffle levels):
// fewer dependent steps on the per-step critical path; the keys are the exact path's.
#define DM_F_PF_W2 1
#define DM_F_PF_BASE 2
#define DM_F_STEP0_ORDER 4
#define DM_F_EXACT_SMALL 8
// DM_F_STEP0_SMEM_EARLY (with DM_F_STEP0_ORDER): the shared-memory tiles are copied at launch right
// after the codes (straight from HBM, as without DM_F_STEP0_ORDER) instead of in step 0's tile loop
// (from L2, after the stream: ~200 KB per SM at L2-to-SM bandwidth).
#define DM_F_STEP0_SMEM_EARLY 16
// Phase timestamps for profiling (a.trace != 0): slot 0 kernel start, 1 + 8 s + {0: codes ready,
// 1: step's words merged in the block, 2: barrier passed, 3: next token known; by lane 0 of warp
// WARPS - 2 (a warp with two L2-streamed tiles): 4: its bias tiles done, 5: its phase A done,
// 6: its phase B and exact keys done}, 1 + 8 N: exit. [2 blocks (first, last), DM_TRACE_SLOTS].
#define DM_TRACE_SLOTS 264
#define DM_TRACE_BY(k, thread)                                                                        \
  if (a.trace && threadIdx.x == (thread) && (blockIdx.x == 0 || blockIdx.x == a.num_blocks - 1))     \
    ((long long*)a.trace)[(blockIdx.x == 0 ? 0 : DM_TRACE_SLOTS) + (k)] = clock64();
#define DM_TRACE(k) DM_TRACE_BY(k, 0)

struct ChainArgs {  // every field 8 bytes (matches the ctypes Structure in cuda_chain.py)
  u64 base;      // [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
  u64 anchor;    // [R] int32/int64
  u64 embed;     // [V_t, 256] bf16 (W1)
  u64 head;      // [V, 256] bf16 (W2)
  u64 cache;     // [S, N, V] bf16/fp32, strides (stride_cs, V, 1)
  u64 idx;       // [R * N] int32/int64 slot per (row, step), -1 = padding
  u64 pos;       // [R * N] int32/int64 positions
  u64 temp;      // [S] fp32
  u64 seeds;     // [S] int64
  u64 tokens;    // [R, N] int64, row stride stride_tr
  u64 words;     // [N, 16] int64 scratch (INT64_MIN between calls)
  u64 sync;      // [N + 1] int32 scratch (0 between calls)
  u64 status;    // [1] int32: bit 0 = a barrier timed out
  u64 trace;     // 0, or [2, 264] int64: clock64() of thread 0 at phase boundaries, first and last block
  u64 pub;       // [N, 16, num_blocks] int64 scratch (INT64_MIN between calls): V6 & 16's per-block words
  u64 gtab;      // [DM_TB_SIZE] fp32 noise upper bounds per hash bucket (V6 & 64; noise.cuh tb_bucket), or 0
  i64 rows, vocab, embed_rows, num_slots, num_steps;
  i64 stride_br, stride_bn, stride_cs, stride_tr;
  i64 base_f32, cache_f32, anchor64, idx64, pos64;
  i64 rows_pow2, log2_rows_pow2;  // RP >= rows, a power of two <= 16
  i64 vec_io;                     // base/cache rows 16-byte aligned: 16-byte loads and stores
  i64 num_blocks, num_tiles, smem_tiles, tiles_per_warp;
  i64 barrier_extra, spin_cycles;
  i64 flags;  // DM_F_* bits (0: the v5 behaviour)
  double scale, filter_margin;
};

// ------------------------------------------------------------------ small device helpers
__device__ __forceinline__ float bf16_to_f32(unsigned short b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ unsigned short f32_to_bf16(float f) {  // round to nearest even, NaN -> 0x7FC0
  u32 u = __float_as_uint(f);
  if (f != f) return (unsigned short)0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

__device__ __forceinline__ u64 policy_evict_last() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ u64 policy_evict_first() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ uint4 ld_w2(const uint4* ptr, u64 policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr), "l"(policy));
  return v;
}

// 16-byte global -> shared copy without registers (zero-filled when !ok), L2 policy `policy`.
__device__ __forceinline__ void cp_async16(uint4* dst, const uint4* src, bool ok, u64 policy) {
  u32 addr;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(addr) : "l"(dst));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
               :: "r"(addr), "l"(src), "r"(ok ? 16 : 0), "l"(policy) : "memory");
}

__device__ __forceinline__ void prefetch_l2_bulk_keep(const void* ptr, u32 bytes, u64 policy) {
  if (bytes)
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(ptr), "r"(bytes), "l"(policy)
                 : "memory");
}

__device__ __forceinline__ float ld_stream_f32(const float* ptr) {  // read once: evict first
  float v;
  asm volatile("ld.global.cs.f32 %0, [%1];" : "=f"(v) : "l"(ptr));
  return v;
}
__device__ __forceinline__ unsigned short ld_stream_u16(const unsigned short* ptr) {
  unsigned short v;
  asm volatile("ld.global.cs.u16 %0, [%1];" : "=h"(v) : "l"(ptr));
  return v;
}

__device__ __forceinline__ i64 ld_acquire(const i64* ptr) {
  i64 v;
  asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}

__device__ __forceinline__ i64 ld_relaxed64(const i64* ptr) {
  i64 v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed64(i64* ptr, i64 v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(ptr), "l"(v) : "memory");
}

__device__ __forceinline__ i32 ld_acquire32(const i32* ptr) {
  i32 v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}


// Two k-tiles (2j, 2j+1) of one 16-token tile: A chunks of token rows g and g+8, codes chunk per nt.
// With one n-tile the even and odd k-tiles go to two accumulators (two dependency chains of 8 mma,
// not one of 16; the summation order of the bias is free, SPEC.md section 3); with two n-tiles
// their chains already interleave.
template <int NT>
struct Acc {
  static constexpr int N = NT == 1 ? 2 : 1;
};

template <int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[Acc<NT>::N][NT][4], uint4 lo, uint4 hi,
                                          const uint4* codes_s, int j, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    uint4 b = codes_s[(nt * 8 + j) * 32 + lane];
    dm::mma16816(acc[0][nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    dm::mma16816(acc[Acc<NT>::N - 1][nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
  }
}

__device__ __forceinline__ i64 shfl_xor64(i64 v, int offset) {
  int lo = __shfl_xor_sync(0xFFFFFFFFu, (int)(v & 0xFFFFFFFFll), offset);
  int hi = __shfl_xor_sync(0xFFFFFFFFu, (int)(v >> 32), offset);
  return (i64)(((u64)(u32)hi << 32) | (u64)(u32)lo);
}

__device__ __forceinline__ i64 max64(i64 a, i64 b) { return a > b ? a : b; }
__device__ __forceinline__ i64 min64(i64 a, i64 b) { return a < b ? a : b; }

// Merge two descending triples of distinct words (sentinels aside): the top three of the union.
__device__ __forceinline__ void merge3(i64& a1, i64& a2, i64& a3, i64 b1, i64 b2, i64 b3) {
  i64 c2 = max64(max64(a2, b2), min64(a1, b1));
  i64 c3 = max64(max64(a3, b3), max64(min64(a1, b2), min64(a2, b1)));
  a1 = max64(a1, b1);
  a2 = c2;
  a3 = c3;
}

__device__ __forceinline__ void insert3(i64& t1, i64& t2, i64& t3, i64 w) {
  if (w > t3) {
    if (w > t2) {
      t3 = t2;
      if (w > t1) {
        t2 = t1;
        t1 = w;
      } else {
        t2 = w;
      }
    } else {
      t3 = w;
    }
  }
}

struct RowKeys {
  bool live;
  bool greedy;
  i64 slot;  // a valid slot (0 for padding)
  float temp, inv_temp;
  u32 prefix;
};

__device__ __forceinline__ RowKeys row_keys(const ChainArgs& a, int row, int step) {
  RowKeys k;
  i64 sample = (i64)row * a.num_steps + step;
  i64 slot = a.idx64 ? ((const i64*)a.idx)[sample] : (i64)((const i32*)a.idx)[sample];
  i64 position = a.pos64 ? ((const i64*)a.pos)[sample] : (i64)((const i32*)a.pos)[sample];
  k.live = slot >= 0 && slot < a.num_slots;  // out-of-range slots are padding (never written)
  k.slot = k.live ? slot : 0;
  k.temp = k.live ? ((const float*)a.temp)[slot] : 0.0f;
  i64 seed = k.live ? ((const i64*)a.seeds)[slot] : 0;
  k.greedy = !(k.temp > 0.0f);
  k.inv_temp = k.greedy ? 1.0f : dm::bound_inv_temp(1.0f / k.temp);  // (subnormal T: NaN keys, the row goes exact)
  k.prefix = dm::draft_prefix(seed, step, position);
  return k;
}


__device__ __forceinline__ float staged_z(const unsigned char* zrow, i64 cache_f32, int vi) {
  return cache_f32 ? *(const float*)(zrow + vi * 4) : bf16_to_f32(*(const unsigned short*)(zrow + vi * 2));
}

// Read once, not kept in L1 (V6 & 4096: L1 keeps the register spills instead): evict first in L2.
__device__ __forceinline__ uint4 ld_once_v4(const void* ptr) {
  uint4 v;
  asm("{ .reg .b64 p; createpolicy.fractional.L2::evict_first.b64 p, 1.0;\n"
      "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], p; }"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint4 ld_noalloc_v4(const void* ptr) {  // not kept in L1
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint4 ld_stream_v4(const void* ptr) {  // read once: evict first
  uint4 v;
  asm("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}

// Phase A of a warp's epilogue: for every (row, 8-token unit) of the warp's tokens, z = round(U +
// bias) in the cache dtype, written to the cache (live rows) and in place of the bias in the stage.
template <bool BASE_F32, bool CACHE_F32>
__device__ __forceinline__ void stage_z(const ChainArgs& a, unsigned char* stage, int pitch, i64 v_w0, int valid,
                                        int step, const i64* slot_s, const int* live_s, int lane) {
  constexpr int ES = CACHE_F32 ? 4 : 2;
  const int units = (valid + 7) >> 3;  // per row
  const int total = (int)a.rows * units;
  for (int u = lane; u < total; u += 32) {
    const int row = u / units, vi = (u - row * units) * 8;
    const i64 v = v_w0 + vi;
    unsigned char* srow = stage + row * pitch + vi * ES;
    const i64 boff = (i64)row * a.stride_br + (i64)step * a.stride_bn + v;
    const bool live = live_s[row] != 0;
    const i64 coff = slot_s[row] * a.stride_cs + (i64)step * a.vocab + v;
    float z[8];
    const int n = valid - vi < 8 ? valid - vi : 8;
    if (a.vec_io && n == 8) {
      float uval[8];
      if (BASE_F32) {
        uint4 p = ld_stream_v4((const float*)a.base + boff), q = ld_stream_v4((const float*)a.base + boff + 4);
        uval[0] = __uint_as_float(p.x); uval[1] = __uint_as_float(p.y); uval[2] = __uint_as_float(p.z);
        uval[3] = __uint_as_float(p.w); uval[4] = __uint_as_float(q.x); uval[5] = __uint_as_float(q.y);
        uval[6] = __uint_as_float(q.z); uval[7] = __uint_as_float(q.w);
      } else {
        uint4 p = ld_stream_v4((const unsigned short*)a.base + boff);
        u32 w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          uval[2 * e] = __uint_as_float(w[e] << 16);
          uval[2 * e + 1] = __uint_as_float(w[e] & 0xFFFF0000u);
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) z[e] = dm::add_rn(uval[e], bf16_to_f32(*(const unsigned short*)(srow + e * ES)));
      if (CACHE_F32) {
        uint4 p = make_uint4(__float_as_uint(z[0]), __float_as_uint(z[1]), __float_as_uint(z[2]), __float_as_uint(z[3]));
        uint4 q = make_uint4(__float_as_uint(z[4]), __float_as_uint(z[5]), __float_as_uint(z[6]), __float_as_uint(z[7]));
        *(uint4*)srow = p;
        *(uint4*)(srow + 16) = q;
        if (live) {
          *(uint4*)((float*)a.cache + coff) = p;
          *(uint4*)((float*)a.cache + coff + 4) = q;
        }
      } else {
        u32 w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = (u32)f32_to_bf16(z[2 * e]) | ((u32)f32_to_bf16(z[2 * e + 1]) << 16);
        uint4 p = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4*)srow = p;
        if (live) *(uint4*)((unsigned short*)a.cache + coff) = p;
      }
    } else {
      for (int e = 0; e < n; ++e) {
        float uv = BASE_F32 ? ((const float*)a.base)[boff + e] : bf16_to_f32(((const unsigned short*)a.base)[boff + e]);
        float ze = dm::add_rn(uv, bf16_to_f32(*(const unsigned short*)(srow + e * ES)));
        if (CACHE_F32) {
          *(float*)(srow + e * 4) = ze;
          if (live) ((float*)a.cache)[coff + e] = ze;
        } else {
          unsigned short zb = f32_to_bf16(ze);
          *(unsigned short*)(srow + e * 2) = zb;
          if (live) ((unsigned short*)a.cache)[coff + e] = zb;
        }
      }
    }
  }
}

// Phase A for bf16 base logits in whole 8-token units (16-byte aligned rows): two units of a lane
// loaded before either's stores (stage_z's loop waits one base-logit round trip per unit: the
// compiler cannot move a load above the previous unit's cache store). Same values as stage_z,
// which handles every other case.
template <bool BASE_F32, bool CACHE_F32, bool L1N = false>
__device__ __forceinline__ void stage_z_batched(const ChainArgs& a, unsigned char* stage, int pitch, i64 v_w0,
                                                int valid, int step, const i64* slot_s, const int* live_s, int lane) {
  if (!a.vec_io || BASE_F32 || (valid & 7)) {
    stage_z<BASE_F32, CACHE_F32>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
    return;
  }
  constexpr int ES = CACHE_F32 ? 4 : 2;
  const int units = valid >> 3;  // per row, all full
  const int total = (int)a.rows * units;
  const unsigned short* base = (const unsigned short*)a.base + (i64)step * a.stride_bn + v_w0;
  for (int u0 = lane; u0 < total; u0 += 64) {
    const int u1 = u0 + 32;
    const int row0 = u0 / units, vi0 = (u0 - row0 * units) * 8;
    const int row1 = u1 / units, vi1 = (u1 - row1 * units) * 8;
    const uint4 p0 = L1N ? ld_once_v4(base + (i64)row0 * a.stride_br + vi0) : ld_stream_v4(base + (i64)row0 * a.stride_br + vi0);
    uint4 p1 = make_uint4(0, 0, 0, 0);
    if (u1 < total) p1 = L1N ? ld_once_v4(base + (i64)row1 * a.stride_br + vi1) : ld_stream_v4(base + (i64)row1 * a.stride_br + vi1);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k == 1 && u1 >= total) break;
      const int row = k ? row1 : row0, vi = k ? vi1 : vi0;
      const uint4 p = k ? p1 : p0;
      unsigned char* srow = stage + row * pitch + vi * ES;
      const i64 coff = slot_s[row] * a.stride_cs + (i64)step * a.vocab + v_w0 + vi;
      const u32 w[4] = {p.x, p.y, p.z, p.w};
      // The unit's 8 staged bf16 biases in one or two 16-byte shared loads (bf16 cache: packed pairs;
      // fp32 cache: one per 4-byte slot, in its low half).
      u32 bias[8];
      if (CACHE_F32) {
        const uint4 b0 = *(const uint4*)srow, b1 = *(const uint4*)(srow + 16);
        bias[0] = b0.x << 16; bias[1] = b0.y << 16; bias[2] = b0.z << 16; bias[3] = b0.w << 16;
        bias[4] = b1.x << 16; bias[5] = b1.y << 16; bias[6] = b1.z << 16; bias[7] = b1.w << 16;
      } else {
        const uint4 b = *(const uint4*)srow;
        const u32 bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          bias[2 * e] = bw[e] << 16;
          bias[2 * e + 1] = bw[e] & 0xFFFF0000u;
        }
      }
      float z[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        z[2 * e] = dm::add_rn(__uint_as_float(w[e] << 16), __uint_as_float(bias[2 * e]));
        z[2 * e + 1] = dm::add_rn(__uint_as_float(w[e] & 0xFFFF0000u), __uint_as_float(bias[2 * e + 1]));
      }
      if (CACHE_F32) {
        uint4 q0 = make_uint4(__float_as_uint(z[0]), __float_as_uint(z[1]), __float_as_uint(z[2]), __float_as_uint(z[3]));
        uint4 q1 = make_uint4(__float_as_uint(z[4]), __float_as_uint(z[5]), __float_as_uint(z[6]), __float_as_uint(z[7]));
        *(uint4*)srow = q0;
        *(uint4*)(srow + 16) = q1;
        if (live_s[row]) {
          *(uint4*)((float*)a.cache + coff) = q0;
          *(uint4*)((float*)a.cache + coff + 4) = q1;
        }
      } else {
        u32 o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = (u32)f32_to_bf16(z[2 * e]) | ((u32)f32_to_bf16(z[2 * e + 1]) << 16);
        const uint4 q = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4*)srow = q;
        if (live_s[row]) *(uint4*)((unsigned short*)a.cache + coff) = q;
      }
    }
  }
}

// Phase B: the three best packed approximate keys (z itself for greedy rows) of tokens [lo, hi).
template <bool CACHE_F32>
__device__ __forceinline__ void rank_chunk(const unsigned char* zrow, int lo, int hi, i64 v_w0, bool greedy,
                                           float inv_temp, u32 prefix, i64& t1, i64& t2, i64& t3) {
  // A key below the third kept key (as fp32) cannot enter; `!(key < thr)` lets NaN and ties through.
  float thr = -__int_as_float(0x7f800000);
#pragma unroll 4
  for (int vi = lo; vi < hi; ++vi) {
    const float z = CACHE_F32 ? *(const float*)(zrow + vi * 4) : bf16_to_f32(*(const unsigned short*)(zrow + vi * 2));
    const u32 v = (u32)(v_w0 + vi);
    const float key = greedy ? z : dm::add_rn(dm::mul_rn(z, inv_temp), dm::approx_noise(prefix, v));
    if (!(key < thr)) {
      insert3(t1, t2, t3, dm::pack_word(key, (i32)v));
      if (t3 != DM_INT64_MIN) thr = dm::word_key(t3);
    }
  }
}

// rank_chunk with the lane's top three kept as (fp32 key, index) pairs instead of packed words, the
// keys of four tokens computed before any of their insertions (four independent hash / noise
// chains for the scheduler instead of one between two branches). Same triple as rank_chunk: in
// increasing-index order a strictly larger key (or an empty slot, which takes -inf too) enters,
// which is the packed-word order (key, then the lower index) for every non-NaN key; -0.0 and +0.0
// compare equal in both. After a NaN key the lane re-ranks its chunk with rank_chunk (NaN logits
// only). ~10 instructions per entering key instead of ~45 of 64-bit compares and selects.
struct Top3 {
  float k1, k2, k3;
  int i1, i2, i3;  // -1: empty (below every key, -inf included)
  __device__ __forceinline__ void insert(float key, int v) {
    if (i3 < 0 || key > k3) {
      if (i2 < 0 || key > k2) {
        k3 = k2;
        i3 = i2;
        if (i1 < 0 || key > k1) {
          k2 = k1;
          i2 = i1;
          k1 = key;
          i1 = v;
        } else {
          k2 = key;
          i2 = v;
        }
      } else {
        k3 = key;
        i3 = v;
      }
    }
  }
};

template <bool CACHE_F32>
__device__ __forceinline__ void rank_chunk_f4(const unsigned char* zrow, int lo, int hi, i64 v_w0, bool greedy,
                                              float inv_temp, u32 prefix, i64& t1, i64& t2, i64& t3) {
  Top3 t;
  t.k1 = t.k2 = t.k3 = -__int_as_float(0x7f800000);
  t.i1 = t.i2 = t.i3 = -1;
  bool nan = false;
  auto key_of = [&](int vi) {
    const float z = CACHE_F32 ? *(const float*)(zrow + vi * 4) : bf16_to_f32(*(const unsigned short*)(zrow + vi * 2));
    return greedy ? z : dm::add_rn(dm::mul_rn(z, inv_temp), dm::approx_noise(prefix, (u32)(v_w0 + vi)));
  };
  int vi = lo;
  for (; vi + 4 <= hi; vi += 4) {
    float key[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) key[k] = key_of(vi + k);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      nan |= key[k] != key[k];
      t.insert(key[k], (int)(v_w0 + vi + k));
    }
  }
  for (; vi < hi; ++vi) {
    const float key = key_of(vi);
    nan |= key != key;
    t.insert(key, (int)(v_w0 + vi));
  }
  if (nan) {
    rank_chunk<CACHE_F32>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, t1, t2, t3);
    return;
  }
  t1 = t.i1 < 0 ? DM_INT64_MIN : dm::pack_word(t.k1, t.i1);
  t2 = t.i2 < 0 ? DM_INT64_MIN : dm::pack_word(t.k2, t.i2);
  t3 = t.i3 < 0 ? DM_INT64_MIN : dm::pack_word(t.k3, t.i3);
}

// V6 & 64, phase B at 4-16 rows: the lane's two best (upper bound, index) and the third-largest upper
// bound of tokens [lo, hi), branch-free. The bound of a sampled token is add_rn(z * (1/T), gtab[bucket(h)])
// (noise.cuh: the table's entry bounds the exact noise of every hash of the bucket, so the bound is
// within key_slack of an upper bound of the exact key, the mul-for-div rounding included); a greedy
// row ranks z itself (exact). Strictly larger enters, in increasing index order: the first of equal
// keys stays ahead, the packed-word order for every non-NaN key. A NaN key sets `nan` (never ranked).
// About 35 instructions per token (hash 15, bucket 3, one shared load, 2 for the key, 10 to rank)
// instead of ~70 with the approximate noise and the top-3 insertion.
struct Top2 {
  float k1, k2, m3;
  int i1, i2;  // -1: empty (below every entry: an entry's key is > -inf)
  bool nan;
  __device__ __forceinline__ void init() {
    k1 = k2 = m3 = -__int_as_float(0x7f800000);
    i1 = i2 = -1;
    nan = false;
  }
  __device__ __forceinline__ void add(float key, int v) {
    nan |= key != key;
    const bool c1 = key > k1, c2 = key > k2;
    m3 = fmaxf(m3, c2 ? k2 : key);
    const float n2 = c1 ? k1 : (c2 ? key : k2);
    const int j2 = c1 ? i1 : (c2 ? v : i2);
    k1 = c1 ? key : k1;
    i1 = c1 ? v : i1;
    k2 = n2;
    i2 = j2;
  }
  // (a, i) ahead of (b, j) in (key descending, index ascending) order; an empty entry is behind all.
  __device__ __forceinline__ static bool ahead(float a, int i, float b, int j) {
    return i >= 0 && (j < 0 || a > b || (a == b && i < j));
  }
  // Merge with another lane's state (the same result on both lanes of an xor pair).
  __device__ __forceinline__ void merge_xor(int off) {
    const float b1 = __shfl_xor_sync(0xFFFFFFFFu, k1, off), b2 = __shfl_xor_sync(0xFFFFFFFFu, k2, off);
    const float bm = __shfl_xor_sync(0xFFFFFFFFu, m3, off);
    const int j1 = __shfl_xor_sync(0xFFFFFFFFu, i1, off), j2 = __shfl_xor_sync(0xFFFFFFFFu, i2, off);
    const bool bn = __shfl_xor_sync(0xFFFFFFFFu, (int)nan, off) != 0;
    float a1 = k1, a2 = k2, c1 = b1, c2 = b2;
    int x1 = i1, x2 = i2, y1 = j1;
    if (ahead(b1, j1, k1, i1)) {  // the other lane's best leads: swap roles
      a1 = b1; a2 = b2; x1 = j1; x2 = j2;
      c1 = k1; c2 = k2; y1 = i1;
    }
    // The union's best is (a1, x1); its second is the better of (a2, x2) and (c1, y1); every other
    // entry is at most max(the worse of those two, c2, both thirds).
    const bool s = ahead(c1, y1, a2, x2);
    m3 = fmaxf(fmaxf(m3, bm), fmaxf(s ? a2 : c1, c2));
    k1 = a1;
    i1 = x1;
    k2 = s ? c1 : a2;
    i2 = s ? y1 : x2;
    nan |= bn;
  }
};

template <bool GREEDY>
__device__ __forceinline__ float tb_key(float z, float inv_temp, u32 prefix, u32 v, const float* gtab) {
  if (GREEDY) return z;
  return dm::add_rn(dm::mul_rn(z, inv_temp), gtab[dm::tb_bucket(dm::hash_finish(prefix, v))]);
}

template <bool CACHE_F32, bool GREEDY>
__device__ __forceinline__ void rank_chunk_tb_(const unsigned char* zrow, int lo, int hi, i64 v_w0, float inv_temp,
                                               u32 prefix, const float* gtab, Top2& t) {
  int vi = lo;
  for (; vi < hi && (vi & 3); ++vi) {  // (lo is a multiple of 4 unless tiles_per_warp is odd)
    const float z = CACHE_F32 ? *(const float*)(zrow + vi * 4) : bf16_to_f32(*(const unsigned short*)(zrow + vi * 2));
    t.add(tb_key<GREEDY>(z, inv_temp, prefix, (u32)(v_w0 + vi), gtab), (int)(v_w0 + vi));
  }
  for (; vi + 4 <= hi; vi += 4) {  // vi a multiple of 4: one 8- (bf16) or 16-byte (fp32) shared load
    float z[4];
    if (CACHE_F32) {
      const float4 q = *(const float4*)(zrow + vi * 4);
      z[0] = q.x; z[1] = q.y; z[2] = q.z; z[3] = q.w;
    } else {
      const uint2 q = *(const uint2*)(zrow + vi * 2);
      z[0] = __uint_as_float(q.x << 16); z[1] = __uint_as_float(q.x & 0xFFFF0000u);
      z[2] = __uint_as_float(q.y << 16); z[3] = __uint_as_float(q.y & 0xFFFF0000u);
    }
    float key[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) key[k] = tb_key<GREEDY>(z[k], inv_temp, prefix, (u32)(v_w0 + vi + k), gtab);
#pragma unroll
    for (int k = 0; k < 4; ++k) t.add(key[k], (int)(v_w0 + vi + k));
  }
  for (; vi < hi; ++vi) {
    const float z = CACHE_F32 ? *(const float*)(zrow + vi * 4) : bf16_to_f32(*(const unsigned short*)(zrow + vi * 2));
    t.add(tb_key<GREEDY>(z, inv_temp, prefix, (u32)(v_w0 + vi), gtab), (int)(v_w0 + vi));
  }
}

// One loop per kind of row (no per-token branch on `greedy`).
template <bool CACHE_F32>
__device__ __forceinline__ void rank_chunk_tb(const unsigned char* zrow, int lo, int hi, i64 v_w0, bool greedy,
                                              float inv_temp, u32 prefix, const float* gtab, Top2& t) {
  t.init();
  if (greedy) rank_chunk_tb_<CACHE_F32, true>(zrow, lo, hi, v_w0, inv_temp, prefix, gtab, t);
  else rank_chunk_tb_<CACHE_F32, false>(zrow, lo, hi, v_w0, inv_temp, prefix, gtab, t);
}

// ------------------------------------------------------------------ the kernel
// Shared memory: [smem_tiles][8 j][2 halves][32 lanes] uint4 of W2, codes [NT*8 rows][8 j][32] uint4,
// staging [16 warps][RP rows][tiles_per_warp * 16] bf16, per-warp triples, per-row results.
// V6 (compile-time variant bits, 0 = the v5 kernel): 1 = an L2-streamed tile's 16 loads per lane in
// two batches of 8 into a register buffer (ahead of their mma); 2 = phase A through stage_z_batched;
// 8 = the per-row keys of every step loaded at launch (shared memory [N][16]), none before a barrier;
// 16 = the grid agreement without a counter: every block stores its best word of each row into its
// own slot pub[step][row][block] (relaxed, no fence) and polls all blocks' slots until none is
// INT64_MIN (bounded), merging them into its shared best word: one L2 round trip after the last
// block's store instead of fence + arrival + counter poll + word read; 32 = phase B through
// rank_chunk_f4 (fp32 triples, four keys computed before their insertions); 64 = phase B at 4-16 rows
// ranked by the noise table's exact upper bounds (rank_chunk_tb, Top2), the exact keys of each
// (warp, row)'s best two, a warp-wide exact fallback; 1024 = the register tiles loaded once before the
// step loop (the `step == 0` load inside it made the allocator keep 8-32 bytes of the tile in local
// memory, reloaded from L2 at the top of every step: 92,928 spill requests per 1-row call in Nsight
// Compute); 2048 = L2-streamed tiles in four load batches of 4 k-chunks instead of two of 8 (8
// registers less at the peak); 4096 = base logits and W1 rows read with L1::no_allocate (L1, 28 KB
// beside 227 KB of shared memory, then keeps the spilled words); 8192 = the block's barrier arrival by
// its last thread instead of thread 0 (no logits-cache stores of its own to wait for at 1-3 rows).
template <int NT, int WARPS, int REGS, int V6>
__device__ __forceinline__ void chain_body(const ChainArgs& a) {
  constexpr int THREADS = WARPS * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int block = blockIdx.x;
  const int rows = (int)a.rows;
  const int RP = (int)a.rows_pow2;
  const int LRP = (int)a.log2_rows_pow2;
  const int tpw = (int)a.tiles_per_warp;
  const i64 vocab = a.vocab;

  const int es = a.cache_f32 ? 4 : 2;              // bytes per staged element (the cache dtype)
  const int span = tpw * 16;                        // tokens per warp
  const int pitch = span * es + 16;                 // bytes per staged row (padded: fewer bank conflicts)
  uint4* w2_s = (uint4*)smem;
  uint4* codes_s = w2_s + a.smem_tiles * 512;
  unsigned char* stage_s = (unsigned char*)(codes_s + NT * 8 * 32);  // [WARPS][RP][pitch]
  i64* triple_s = (i64*)(stage_s + WARPS * RP * pitch);  // [WARPS][RP] words
  i64* best_s = triple_s + WARPS * RP * 3;               // [16] block word per row
  // Per-row keys: [N][16] (V6 & 8: every step's, loaded at launch) or [16] (the current step's);
  // the layout always reserves [N][16] (cuda_chain.fixed_smem_bytes).
  const int KA = (int)a.num_steps * DM_MAX_ROWS;
  i64* slot_all = best_s + DM_MAX_ROWS;                  // [KA]
  float* temp_all = (float*)(slot_all + KA);             // [KA]
  float* inv_all = temp_all + KA;                        // [KA]
  u32* prefix_all = (u32*)(inv_all + KA);                // [KA]
  int* live_all = (int*)(prefix_all + KA);               // [KA]
  int* prev_s = live_all + KA;                           // [16]
  int* flag_s = prev_s + DM_MAX_ROWS;                    // [16] unused, [16] = stop, [17] = last block
  float* gtab_s = (float*)(flag_s + DM_MAX_ROWS + 2);    // [DM_TB_SIZE] (V6 & 64 at RP >= 4 only)
  const bool use_tb = (V6 & 64) && RP >= 4;

  // This block's tiles [t0, t1) and this warp's [wt0, wt0 + ntw).
  DM_TRACE(0);
  const i64 t0 = (i64)block * a.num_tiles / a.num_blocks;
  const i64 t1 = (i64)(block + 1) * a.num_tiles / a.num_blocks;
  const i64 wt0 = t0 + (i64)warp * tpw;
  int ntw = (int)(t1 - wt0);
  ntw = ntw < 0 ? 0 : (ntw > tpw ? tpw : ntw);
  const i64 v_w0 = wt0 * 16;  // first token of this warp
  const int g = lane >> 2, c = lane & 3;
  // This warp's W2 tiles by residence: [0, REGS) registers, then n_smem shared-memory tiles, the
  // rest [REGS + n_smem, ntw) streamed from L2 at every step.
  int n_smem = ntw > REGS ? (int)((a.smem_tiles - warp + WARPS - 1) / WARPS) : 0;
  n_smem = n_smem < 0 ? 0 : (n_smem > ntw - REGS ? (ntw > REGS ? ntw - REGS : 0) : n_smem);
  auto prefetch_base = [&](int step) {  // the block's tokens [vb0, vb1), one bulk prefetch per row (aligned rows)
    const i64 vb0 = (i64)blockIdx.x * a.num_tiles / a.num_blocks * 16;
    i64 vb1 = (i64)(blockIdx.x + 1) * a.num_tiles / a.num_blocks * 16;
    vb1 = vb1 < a.vocab ? vb1 : a.vocab;
    if ((a.flags & DM_F_PF_BASE) && a.vec_io && threadIdx.x < a.rows && vb1 > vb0) {
      const int eb = a.base_f32 ? 4 : 2;
      const unsigned char* p = (const unsigned char*)a.base +
                               ((i64)threadIdx.x * a.stride_br + (i64)step * a.stride_bn + vb0) * eb;
      prefetch_l2_bulk(p, (u32)(((vb1 - vb0) * eb) & ~15ll));
    }
  };

  const u64 keep = policy_evict_last();
  const u64 once = policy_evict_first();
  const uint4* head = (const uint4*)a.head;  // 32 uint4 per token row
  i64* words = (i64*)a.words;
  i32* sync = (i32*)a.sync;
  i32* status = (i32*)a.status;

  uint4 areg[REGS > 0 ? 16 * REGS : 1];
  const int rr = lane & (RP - 1);  // this lane's row in the epilogue
  const int sub = lane >> LRP;
  const int lanes_per_row = 32 >> LRP;

  i64 anchor_tok = 0;
  if (threadIdx.x < rows)
    anchor_tok = a.anchor64 ? ((const i64*)a.anchor)[threadIdx.x] : (i64)((const i32*)a.anchor)[threadIdx.x];
  // Per-row keys of a step (slot, temperature, noise prefix) into shared memory; they do not depend
  // on the tokens, so step s + 1's are loaded before step s's barrier (their latency hides in it).
  auto store_row_keys = [&](int row, int step, int at) {
    RowKeys k = row_keys(a, row, step);
    slot_all[at] = k.slot;
    temp_all[at] = k.temp;
    inv_all[at] = k.greedy ? 0.0f : k.inv_temp;  // 0: greedy
    prefix_all[at] = k.prefix;
    live_all[at] = k.live;
  };
  auto load_row_keys = [&](int step) {
    if (!(V6 & 8) && threadIdx.x < rows) store_row_keys(threadIdx.x, step, threadIdx.x);
  };
  if (V6 & 8) {  // every step's keys now: thread t -> (row t / N, step t % N)
    for (int t = threadIdx.x; t < rows * (int)a.num_steps; t += THREADS) {
      const int r = t / (int)a.num_steps, st = t - r * (int)a.num_steps;
      store_row_keys(r, st, st * DM_MAX_ROWS + r);
    }
  }
  const bool step0_order = (a.flags & DM_F_STEP0_ORDER) != 0;
  const bool smem_early = !step0_order || (a.flags & DM_F_STEP0_SMEM_EARLY);  // smem tiles copied at launch
  auto prefetch_w2 = [&]() {
    if (!(a.flags & DM_F_PF_W2) || lane != 0 || ntw <= 0) return;
    const i64 ve = vocab;
    if (!smem_early) {  // the warp's whole range (its shared-memory tiles are copied from L2 later)
      const i64 end = v_w0 + (i64)ntw * 16 < ve ? v_w0 + (i64)ntw * 16 : ve;
      prefetch_l2_bulk(head + v_w0 * 32, (u32)((end - v_w0) * 512));
      return;
    }
    // Everything this warp reads from HBM at step 0 except its shared-memory tiles (cp.async):
    // the register tiles first (used first), then the L2-streamed tiles (kept: evict_last).
    const i64 reg_end = v_w0 + (i64)(REGS < ntw ? REGS : ntw) * 16;
    const i64 l2_beg = v_w0 + (i64)(REGS + n_smem) * 16, l2_end = v_w0 + (i64)ntw * 16;
    if (REGS > 0) prefetch_l2_bulk(head + v_w0 * 32, (u32)(((reg_end < ve ? reg_end : ve) - v_w0) * 512));
    if (l2_end > l2_beg && l2_beg < ve)
      prefetch_l2_bulk_keep(head + l2_beg * 32, (u32)(((l2_end < ve ? l2_end : ve) - l2_beg) * 512), keep);
  };
  if (!step0_order) prefetch_w2();
  if (!step0_order) prefetch_base(0);
  if (threadIdx.x < DM_MAX_ROWS) {
    i64 prev = anchor_tok;
    prev = prev < 0 ? 0 : (prev >= a.embed_rows ? a.embed_rows - 1 : prev);
    prev_s[threadIdx.x] = (int)prev;
  }
  if (threadIdx.x == 0) flag_s[DM_MAX_ROWS] = 0;
  if (use_tb)
    for (int i = threadIdx.x; i < DM_TB_SIZE; i += THREADS) gtab_s[i] = ((const float*)a.gtab)[i];
  __syncthreads();

  // Step 0's copies of this warp's shared-memory tiles from HBM: asynchronous (cp.async, no
  // registers), so the whole of them is in flight at once; waited for before their first use.
  auto copy_smem_tiles = [&]() {
  for (int lt = REGS; lt < ntw; ++lt) {
    const int slot = (lt - REGS) * WARPS + warp;
    if (slot >= a.smem_tiles) break;
    const i64 tok0 = v_w0 + lt * 16;
    uint4* dst = w2_s + (i64)slot * 512;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 row = tok0 + g + 8 * h;
      const bool ok = row < vocab;
      const uint4* src = head + (ok ? row : 0) * 32 + c;
#pragma unroll
      for (int j = 0; j < 8; ++j) cp_async16(dst + (j * 2 + h) * 32 + lane, src + j * 4, ok, once);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  };
  // step0_order: step 0's codes gathered now (their W1 loads issued before any W2 request), the
  // warp's W2 range prefetched into L2, the shared-memory tiles copied in the tile loop.
  if (step0_order) {
    for (int i = threadIdx.x; i < NT * 8 * 32; i += THREADS) {
      int r = i >> 5, q = i & 31;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows) v = (V6 & 4096) ? ld_noalloc_v4((const uint4*)a.embed + (i64)prev_s[r] * 32 + q)
                                    : ((const uint4*)a.embed)[(i64)prev_s[r] * 32 + q];
      int nt = r >> 3, gg = r & 7, j = q >> 2, cc = q & 3;
      codes_s[(nt * 8 + j) * 32 + gg * 4 + cc] = v;
    }
    prefetch_w2();
    prefetch_base(0);
  }
  if (smem_early) copy_smem_tiles();
  load_row_keys(0);  // (V6 & 8: loaded above, before any W2 request)
  // V6 & 1024: the register tiles are loaded here, once, before the step loop (not under `step == 0`
  // inside it): no merge of a loaded and a kept register tile at the top of every step, which made
  // the register allocator keep part of the tile in local memory and reload it at every step.
  if (V6 & 1024) {
#pragma unroll
    for (int rt = 0; rt < REGS; ++rt) {
      const i64 r_lo = v_w0 + rt * 16 + g, r_hi = r_lo + 8;
      const bool ok = rt < ntw;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        areg[rt * 16 + 2 * j] = ok && r_lo < vocab ? ld_w2(head + r_lo * 32 + j * 4 + c, once) : make_uint4(0, 0, 0, 0);
        areg[rt * 16 + 2 * j + 1] = ok && r_hi < vocab ? ld_w2(head + r_hi * 32 + j * 4 + c, once) : make_uint4(0, 0, 0, 0);
      }
    }
  }


  const int steps = (int)a.num_steps;
  for (int step = 0; step < steps; ++step) {
    const int ko = (V6 & 8) ? step * DM_MAX_ROWS : 0;  // this step's row keys
    const i64* slot_s = slot_all + ko;
    const float* temp_s = temp_all + ko;
    const float* inv_s = inv_all + ko;
    const u32* prefix_s = prefix_all + ko;
    const int* live_s = live_all + ko;
    // Codes of this step: W1[prev] per row, in mma B-fragment order; rows >= R are zero.
    for (int i = threadIdx.x; i < (step0_order && step == 0 ? 0 : NT * 8 * 32); i += THREADS) {
      int r = i >> 5, q = i & 31;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows) v = (V6 & 4096) ? ld_noalloc_v4((const uint4*)a.embed + (i64)prev_s[r] * 32 + q)
                                    : ((const uint4*)a.embed)[(i64)prev_s[r] * 32 + q];
      int nt = r >> 3, gg = r & 7, j = q >> 2, cc = q & 3;
      codes_s[(nt * 8 + j) * 32 + gg * 4 + cc] = v;
    }
    __syncthreads();
    DM_TRACE(1 + 8 * step);
    if (step + 1 < steps) prefetch_base(step + 1);

    // Bias of this warp's tiles, staged as bf16 [RP rows][ntw * 16 tokens].
    unsigned char* stage = stage_s + warp * RP * pitch;
    // acc[nt]: tokens g (0, 1) and g + 8 (2, 3) of tile lt, rows nt * 8 + 2c (+1) -> bf16 bias.
    auto stage_tile = [&](float (&acc)[Acc<NT>::N][NT][4], int lt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int row = nt * 8 + 2 * c + (e & 1);
          int tok = lt * 16 + g + ((e >> 1) << 3);
          if (row < RP) {
            const float sum = Acc<NT>::N == 2 ? dm::add_rn(acc[0][nt][e], acc[Acc<NT>::N - 1][nt][e]) : acc[0][nt][e];
            unsigned short b = f32_to_bf16(sum);
            if (a.scale != 1.0) b = f32_to_bf16(dm::mul_rn(bf16_to_f32(b), (float)a.scale));
            *(unsigned short*)(stage + row * pitch + tok * es) = b;
          }
        }
      }
    };
    // Order: the register tiles, the L2 tiles, then the shared-memory tiles (at step 0 their async
    // copies, issued before the loop, land meanwhile).
#pragma unroll
    for (int rt = 0; rt < REGS; ++rt) {
      if (rt < ntw) {
        float acc[Acc<NT>::N][NT][4] = {};
        const i64 r_lo = v_w0 + rt * 16 + g, r_hi = r_lo + 8;
        if (!(V6 & 1024) && step == 0) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            areg[rt * 16 + 2 * j] = r_lo < vocab ? ld_w2(head + r_lo * 32 + j * 4 + c, once) : make_uint4(0, 0, 0, 0);
            areg[rt * 16 + 2 * j + 1] = r_hi < vocab ? ld_w2(head + r_hi * 32 + j * 4 + c, once) : make_uint4(0, 0, 0, 0);
          }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) mma_chunk<NT>(acc, areg[rt * 16 + 2 * j], areg[rt * 16 + 2 * j + 1], codes_s, j, lane);
        stage_tile(acc, rt);
      }
    }
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1 && step == 0) {
        if (!smem_early) copy_smem_tiles();
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
      }
      for (int lt = REGS; lt < ntw; ++lt) {
        const int slot = (lt - REGS) * WARPS + warp;
        const bool in_smem = slot < a.smem_tiles;
        if (in_smem != (pass == 1)) continue;
        float acc[Acc<NT>::N][NT][4] = {};
        if (in_smem) {
          const uint4* src = w2_s + (i64)slot * 512;
#pragma unroll
          for (int j = 0; j < 8; ++j) mma_chunk<NT>(acc, src[(j * 2) * 32 + lane], src[(j * 2 + 1) * 32 + lane], codes_s, j, lane);
        } else {
          const i64 r_lo = v_w0 + lt * 16 + g, r_hi = r_lo + 8;
          if (V6 & 1) {
            constexpr int BATCH = (V6 & 2048) ? 2 : 4;  // k-chunks per load batch (V6 & 2048: 8 registers less)
#pragma unroll
            for (int half = 0; half < 8 / BATCH; ++half) {
              uint4 buf[2 * BATCH];
#pragma unroll
              for (int jj = 0; jj < BATCH; ++jj) {
                const int j = half * BATCH + jj;
                buf[2 * jj] = r_lo < vocab ? ld_w2(head + r_lo * 32 + j * 4 + c, keep) : make_uint4(0, 0, 0, 0);
                buf[2 * jj + 1] = r_hi < vocab ? ld_w2(head + r_hi * 32 + j * 4 + c, keep) : make_uint4(0, 0, 0, 0);
              }
#pragma unroll
              for (int jj = 0; jj < BATCH; ++jj) mma_chunk<NT>(acc, buf[2 * jj], buf[2 * jj + 1], codes_s, half * BATCH + jj, lane);
            }
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              uint4 lo = r_lo < vocab ? ld_w2(head + r_lo * 32 + j * 4 + c, keep) : make_uint4(0, 0, 0, 0);
              uint4 hi = r_hi < vocab ? ld_w2(head + r_hi * 32 + j * 4 + c, keep) : make_uint4(0, 0, 0, 0);
              mma_chunk<NT>(acc, lo, hi, codes_s, j, lane);
            }
          }
        }
        stage_tile(acc, lt);
      }
    }
    __syncwarp();
    DM_TRACE_BY(5 + 8 * step, 32 * (WARPS - 2));

    // Phase A (coalesced): z = round(U + bias) for every row in 8-token units, the cache write of
    // live rows, z staged in place of the bias.
    const int valid = (int)(vocab - v_w0 < (i64)ntw * 16 ? vocab - v_w0 : (i64)ntw * 16);  // tokens of this warp
    if (V6 & 2) {
      if (a.base_f32) {
        if (a.cache_f32) stage_z_batched<true, true>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
        else stage_z_batched<true, false>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
      } else {
        if (a.cache_f32) stage_z_batched<false, true, (V6 & 4096) != 0>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
        else stage_z_batched<false, false, (V6 & 4096) != 0>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
      }
    } else if (a.base_f32) {
      if (a.cache_f32) stage_z<true, true>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
      else stage_z<true, false>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
    } else {
      if (a.cache_f32) stage_z<false, true>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
      else stage_z<false, false>(a, stage, pitch, v_w0, valid, step, slot_s, live_s, lane);
    }
    __syncwarp();
    DM_TRACE_BY(6 + 8 * step, 32 * (WARPS - 2));
    // Phase B: lane (rr, sub) ranks a contiguous chunk of its row rr by approximate keys.
    const int chunk = span >> (5 - LRP);  // span / lanes_per_row
    const bool greedy = rr < rows ? inv_s[rr] == 0.0f : true;
    const float inv_temp = rr < rows ? inv_s[rr] : 1.0f;
    const u32 prefix = rr < rows ? prefix_s[rr] : 0u;
    const unsigned char* zrow = stage + rr * pitch;
    i64 exact = DM_INT64_MIN;
    if (use_tb) {
      // V6 & 64 (4-16 rows): rank by the table's upper bounds, the exact keys of the row's best two
      // (lanes sub 0 and 1); decided when their best beats every other token's bound (the third
      // largest, plus key_slack). Otherwise (a near-tie, NaN, +-inf) the whole warp computes the
      // row's exact keys, two tokens per lane, one row at a time.
      Top2 t;
      t.init();
      if (rr < rows) {
        int lo = sub * chunk, hi = lo + chunk;
        hi = hi < valid ? hi : valid;
        if (a.cache_f32) rank_chunk_tb<true>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, gtab_s, t);
        else rank_chunk_tb<false>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, gtab_s, t);
      }
      for (int off = RP; off < 32; off <<= 1) t.merge_xor(off);
      const bool ranked = rr < rows && !t.nan && t.i1 >= 0;
      if (ranked && greedy) {
        exact = dm::pack_word(t.k1, t.i1);  // z itself: exact (every lane of the row holds it)
      } else if (ranked) {
        const int mine = sub == 0 ? t.i1 : (sub == 1 ? t.i2 : -1);
        if (mine >= 0)
          exact = dm::pack_word(dm::exact_key(staged_z(zrow, a.cache_f32, (int)(mine - v_w0)), temp_s[rr], prefix, (u32)mine),
                                mine);
      }
      for (int off = RP; off < 32; off <<= 1) exact = max64(exact, shfl_xor64(exact, off));
      bool decided = rr >= rows;
      if (ranked) {
        const float ninf = -__int_as_float(0x7f800000);
        const float bound = t.m3 == ninf ? ninf : dm::add_rn(t.m3, dm::key_slack(t.m3, (float)a.filter_margin));
        decided = greedy || dm::word_key(exact) > bound;
      }
      u32 undecided = __ballot_sync(0xFFFFFFFFu, !decided && sub == 0);  // bit r: row r (lane r = (r, 0))
      while (undecided) {
        const int r = __ffs(undecided) - 1;
        undecided &= undecided - 1;
        const unsigned char* zr = stage + r * pitch;
        const bool greedy_r = inv_s[r] == 0.0f;
        const float temp_r = temp_s[r];
        const u32 prefix_r = prefix_s[r];
        i64 w = DM_INT64_MIN;
        for (int vi = lane; vi < valid; vi += 32) {
          const float z = staged_z(zr, a.cache_f32, vi);
          const i64 v = v_w0 + vi;
          w = max64(w, dm::pack_word(greedy_r ? z : dm::exact_key(z, temp_r, prefix_r, (u32)v), (i32)v));
        }
        for (int off = 1; off < 32; off <<= 1) w = max64(w, shfl_xor64(w, off));
        if (rr == r) exact = w;
      }
    } else {
      i64 t1w = DM_INT64_MIN, t2w = DM_INT64_MIN, t3w = DM_INT64_MIN;
      const bool all_exact = (a.flags & DM_F_EXACT_SMALL) && RP <= 2;
      if (rr < rows && !all_exact) {
        int lo = sub * chunk, hi = lo + chunk;
        hi = hi < valid ? hi : valid;
        if (V6 & 32) {
          if (a.cache_f32) rank_chunk_f4<true>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, t1w, t2w, t3w);
          else rank_chunk_f4<false>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, t1w, t2w, t3w);
        } else if (a.cache_f32) {
          rank_chunk<true>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, t1w, t2w, t3w);
        } else {
          rank_chunk<false>(zrow, lo, hi, v_w0, greedy, inv_temp, prefix, t1w, t2w, t3w);
        }
      }
      for (int off = RP; off < 32 && !all_exact; off <<= 1) {  // every lane of row rr ends with the warp's triple
        i64 b1 = shfl_xor64(t1w, off), b2 = shfl_xor64(t2w, off), b3 = shfl_xor64(t3w, off);
        merge3(t1w, t2w, t3w, b1, b2, b3);
      }
      // Per (warp, row): the exact best word of the warp's tokens. Greedy rows ranked z itself (exact).
      // Sampled rows: if the approximate best beats the third by more than key_slack, the exact
      // winner is the first or the second (one exact key each, on two lanes of the row); otherwise
      // (a near-tie, NaN, +-inf or zero best) every lane of the row computes exact keys over the
      // warp's tokens. z is read back from the cache (sampled rows are live).
      exact = t1w;
      const float temp = rr < rows ? temp_s[rr] : 0.0f;
      if (all_exact) {  // every token's exact key (z itself for greedy rows), two per iteration
        exact = DM_INT64_MIN;
        if (rr < rows) {
          int vi = sub;
          for (; vi + lanes_per_row < valid; vi += 2 * lanes_per_row) {
            const int vj = vi + lanes_per_row;
            const float z0 = staged_z(zrow, a.cache_f32, vi), z1 = staged_z(zrow, a.cache_f32, vj);
            const float k0 = greedy ? z0 : dm::exact_key(z0, temp, prefix, (u32)(v_w0 + vi));
            const float k1 = greedy ? z1 : dm::exact_key(z1, temp, prefix, (u32)(v_w0 + vj));
            exact = max64(exact, max64(dm::pack_word(k0, (i32)(v_w0 + vi)), dm::pack_word(k1, (i32)(v_w0 + vj))));
          }
          if (vi < valid) {
            const float z0 = staged_z(zrow, a.cache_f32, vi);
            exact = max64(exact, dm::pack_word(greedy ? z0 : dm::exact_key(z0, temp, prefix, (u32)(v_w0 + vi)),
                                               (i32)(v_w0 + vi)));
          }
        }
      } else if (rr < rows && !greedy) {
        const float value = dm::word_key(t1w);
        const float third = t3w == DM_INT64_MIN ? -__int_as_float(0x7f800000) : dm::word_key(t3w);
        const bool finite = t1w != DM_INT64_MIN && value == value && value != 0.0f &&
                            fabsf(value) < __int_as_float(0x7f800000);
        const bool decided = finite && dm::sub_rn(value, third) > dm::key_slack(value, (float)a.filter_margin);
        if (decided) {
          const i64 mine = sub == 0 ? t1w : t2w;
          exact = DM_INT64_MIN;
          if (sub < 2 && mine != DM_INT64_MIN) {
            const i32 i = dm::word_index(mine);
            exact = dm::pack_word(dm::exact_key(staged_z(zrow, a.cache_f32, (int)(i - v_w0)), temp, prefix, (u32)i), i);
          }
        } else {
          exact = DM_INT64_MIN;
          for (int vi = sub; vi < valid; vi += lanes_per_row) {
            const i64 v = v_w0 + vi;
            exact = max64(exact, dm::pack_word(dm::exact_key(staged_z(zrow, a.cache_f32, vi), temp, prefix, (u32)v),
                                               (i32)v));
          }
        }
      }
      for (int off = RP; off < 32; off <<= 1) exact = max64(exact, shfl_xor64(exact, off));
    }
    if (sub == 0) triple_s[warp * RP + rr] = exact;
    DM_TRACE_BY(7 + 8 * step, 32 * (WARPS - 2));
    __syncthreads();
    DM_TRACE(2 + 8 * step);
    if (threadIdx.x < rows) {
      i64 best = DM_INT64_MIN;
      for (int w = 0; w < WARPS; ++w) best = max64(best, triple_s[w * RP + threadIdx.x]);
      best_s[threadIdx.x] = best;
      // The winner's W1 row is gathered by every block after the barrier: warm it in L2 now.
      const i64 t = dm::word_index(best);
      if (t >= 0 && t < a.embed_rows) {
        const char* row = (const char*)a.embed + t * (DM_RANK * 2);
        asm volatile("prefetch.global.L2 [%0];" :: "l"(row));
        asm volatile("prefetch.global.L2 [%0];" :: "l"(row + 128));
        asm volatile("prefetch.global.L2 [%0];" :: "l"(row + 256));
        asm volatile("prefetch.global.L2 [%0];" :: "l"(row + 384));
      }
    }
    if (threadIdx.x < rows) atomicMax((long long*)&words[step * DM_MAX_ROWS + threadIdx.x], (long long)best_s[threadIdx.x]);
    if (step + 1 == steps) break;  // the last step needs no barrier: the exit counter orders it
    if (V6 & 16) {
      // Publish (a real word is never INT64_MIN: index < 2^31 - 1), then poll every block's slot.
      i64* pub = (i64*)a.pub + (i64)step * DM_MAX_ROWS * a.num_blocks;
      load_row_keys(step + 1);  // (no-op with V6 & 8)
      if (threadIdx.x < rows) st_relaxed64(pub + threadIdx.x * a.num_blocks + block, max64(best_s[threadIdx.x], DM_INT64_MIN + 1));
      __syncthreads();  // best_s written before the merges below
      constexpr int K = (DM_MAX_ROWS * 132 + THREADS - 1) / THREADS;  // pairs per thread and pass (132 SMs)
      const int pairs = rows * (int)a.num_blocks;
      const long long start = clock64();
      int stop = 0;
      for (int p0 = 0; p0 < pairs && !stop; p0 += K * THREADS) {
        u32 pending = 0;
#pragma unroll
        for (int k = 0; k < K; ++k) pending |= (p0 + k * THREADS + (int)threadIdx.x < pairs ? 1u : 0u) << k;
        while (pending) {
          i64 w[K];
#pragma unroll
          for (int k = 0; k < K; ++k) w[k] = (pending >> k & 1) ? ld_relaxed64(pub + p0 + k * THREADS + threadIdx.x) : 0;
#pragma unroll
          for (int k = 0; k < K; ++k) {
            if ((pending >> k & 1) && w[k] != DM_INT64_MIN && a.barrier_extra == 0) {
              atomicMax((long long*)&best_s[(p0 + k * THREADS + (int)threadIdx.x) / (int)a.num_blocks], (long long)w[k]);
              pending &= ~(1u << k);
            }
          }
          if (pending && clock64() - start > a.spin_cycles) {
            stop = 1;
            break;
          }
        }
      }
      if (stop) {
        atomicOr(status, 1);
        flag_s[DM_MAX_ROWS] = 1;
      }
      __syncthreads();
      DM_TRACE(3 + 8 * step);
      if (flag_s[DM_MAX_ROWS]) break;
      if (threadIdx.x < rows) {
        i64 t = dm::word_index(best_s[threadIdx.x]);
        t = t < 0 ? 0 : (t >= vocab ? vocab - 1 : t);
        t = t >= a.embed_rows ? a.embed_rows - 1 : t;
        prev_s[threadIdx.x] = (int)t;
      }
      __syncthreads();
      DM_TRACE(4 + 8 * step);
      continue;
    }

    // Grid barrier (bounded), then every block reads the step's words. (Every read of this step's
    // row keys is behind the __syncthreads above.)
    load_row_keys(step + 1);
    __syncthreads();
    // V6 & 8192: the last thread of the block arrives (at 1-3 rows it wrote no logits cache in phase A,
    // so its fence need not wait for those stores; the words' atomics of threads < rows are ordered
    // before it by the __syncthreads, as they are for thread 0).
    const int bt = (V6 & 8192) ? THREADS - 1 : 0;
    if (threadIdx.x == bt) {
      __threadfence();
      atomicAdd(&sync[step], 1);
      const i32 target = (i32)(a.num_blocks + a.barrier_extra);
      const long long start = clock64();
      int stop = 0;
      while (ld_acquire32(&sync[step]) < target) {
        if (clock64() - start > a.spin_cycles) {
          atomicOr(status, 1);
          stop = 1;
          break;
        }
      }
      __threadfence();
      flag_s[DM_MAX_ROWS] = stop;
      DM_TRACE_BY(3 + 8 * step, bt);
    }
    __syncthreads();
    if (flag_s[DM_MAX_ROWS]) break;
    if (threadIdx.x < rows) {
      i64 w = ld_acquire(&words[step * DM_MAX_ROWS + threadIdx.x]);
      i64 t = dm::word_index(w);
      t = t < 0 ? 0 : (t >= vocab ? vocab - 1 : t);
      t = t >= a.embed_rows ? a.embed_rows - 1 : t;
      prev_s[threadIdx.x] = (int)t;
    }
    __syncthreads();
    DM_TRACE(4 + 8 * step);
  }

  // Exit: the last block writes the tokens of every step and resets the scratch for the next call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    int done = atomicAdd(&sync[steps], 1);
    flag_s[DM_MAX_ROWS + 1] = done == (int)a.num_blocks - 1;
    DM_TRACE(1 + 8 * steps);
  }
  __syncthreads();
  if (flag_s[DM_MAX_ROWS + 1]) {
    __threadfence();
    i64 tok = 0;
    int r = threadIdx.x / steps, s = threadIdx.x % steps;
    bool mine = threadIdx.x < rows * steps;
    if (mine) {
      i64 w = ld_acquire(&words[s * DM_MAX_ROWS + r]);
      tok = dm::word_index(w);
      tok = tok < 0 ? 0 : (tok >= vocab ? vocab - 1 : tok);
    }
    __syncthreads();
    if (mine) ((i64*)a.tokens)[r * a.stride_tr + s] = tok;
    if (threadIdx.x < steps * DM_MAX_ROWS) words[threadIdx.x] = DM_INT64_MIN;
    if (V6 & 16)
      for (i64 i = threadIdx.x; i < (i64)(steps - 1) * DM_MAX_ROWS * a.num_blocks; i += THREADS)
        ((i64*)a.pub)[i] = DM_INT64_MIN;
    if (threadIdx.x <= steps) sync[threadIdx.x] = 0;
  }
}

extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r0_nt1(const ChainArgs a) { chain_body<1, 16, 0, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r0_nt2(const ChainArgs a) { chain_body<2, 16, 0, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r1_nt1(const ChainArgs a) { chain_body<1, 16, 1, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r1_nt2(const ChainArgs a) { chain_body<2, 16, 1, 0>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) dm_chain_w8_r3_nt1(const ChainArgs a) { chain_body<1, 8, 3, 0>(a); }
extern "C" __global__ void __launch_bounds__(256, 1) dm_chain_w8_r3_nt2(const ChainArgs a) { chain_body<2, 8, 3, 0>(a); }
// Variants of the 16-warp, one-register-tile shape (suffix _v<V6 bits>).
#define DM_V6_ENTRY(V)                                                                                           \
  extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r1_nt1_v##V(const ChainArgs a) {          \
    chain_body<1, 16, 1, V>(a);                                                                                 \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(512, 1) dm_chain_w16_r1_nt2_v##V(const ChainArgs a) {          \
    chain_body<2, 16, 1, V>(a);                                                                                 \
  }
DM_V6_ENTRY(11)
DM_V6_ENTRY(43)
DM_V6_ENTRY(107)
DM_V6_ENTRY(7275)
// Not built (measured on the H200, benchmarks/results/..._cuda_chain_cuda3_u2.json): 1067, 3115, 5163, 7211
// (43 + 1024 / 2048 / 4096: 0.7-2.7 us slower at 1-8 rows, equal at 16), 13355 / 15467 (+ 8192: no change),
// 1131, 3179, 5227 (107 + those bits: within 1 us of 7275 at 16 rows, slower at 1-8).
// Not built (measured on the H200, benchmarks/results/..._cuda_chain_variants_r{1,2}.json): 1 and 9
// (subsumed by 11), 25 / 27 = 9 / 11 + V6 & 16 (the counter-free agreement: 0.2-4 us slower than the
// counter barrier). DM_V6_ENTRY(V) builds any of them again (add V to cuda_chain.VARIANTS).

// Largest |approximate - exact| Gumbel noise over the hashes [h0, h0 + count) (as fp32 bits of a
// non-negative float, merged with atomicMax); the GPU test runs it over all 2^32 hashes.
extern "C" __global__ void dm_noise_bound(u32 h0, u64 count, u32* worst) {
  u32 local = 0;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
    float u = dm::uniform32(h0 + (u32)i);
    float d = fabsf(dm::approx_gumbel(u) - dm::gumbel32(u));
    u32 bits = __float_as_uint(d);
    local = bits > local ? bits : local;
  }
  for (int off = 16; off > 0; off >>= 1) {
    u32 o = __shfl_xor_sync(0xFFFFFFFFu, local, off);
    local = o > local ? o : local;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(worst, local);
}


// The noise upper-bound table of V6 & 64: table[b] = the largest gumbel32(uniform32(h)) over every
// hash h with tb_bucket(h) == b (common.cuh dm::tb_sweep). Grid: 2^20 threads in all (e.g. 4096 blocks of 256).
extern "C" __global__ void dm_noise_table(u32* table) { dm::tb_sweep(table); }
