// Declarations shared by the CUDA C++ large-batch samplers (wide.cu: dm_wide_* step, finish and pick kernels;
// wide_tc.cu: the wgmma + TMA step of both methods): the kernels' argument struct, the per-row keys of a step,
// and the inverse-CDF helpers (exp, NaN-sticky max, the division z / T with div_rn's value, the partial merge).
#pragma once

#include "common.cuh"

using dm::i32;
using dm::i64;
using dm::u32;
using dm::u64;

#define DW_GROUP 16     // tokens per warp work item (2 mma n-tiles)
#define DW_RANK 256
#define DW_MAX_ROWS 256
#define DW_STAGE_U4 (2 * 8 * 32)  // uint4 per warp stage: [n-tile 2][k-chunk 8][lane 32]

struct WideArgs {  // every field 8 bytes (matches cuda_wide.WideArgs)
  u64 base;    // [R, N, V] bf16/fp32, strides (stride_br, stride_bn, 1)
  u64 cache;   // [S, N, V] bf16/fp32, strides (stride_cs, V, 1)
  u64 head;    // W2 [V, 256] bf16 contiguous
  u64 codes;   // [rows16 / 16][8][2][32] uint4: W1[prev] as mma A registers (dm_wide_finish writes it)
  u64 words;   // [>= R] int64 packed (key, index) per row, DM_WORD_NONE between steps
  u64 idx;     // [R * N] int32/int64 slot per (row, step), -1 = padding
  u64 pos;     // [R * N] int32/int64 positions
  u64 temp;    // [S] fp32
  u64 seeds;   // [S] int64
  u64 gtab;    // [DM_TB_SIZE] fp32 noise upper bounds per hash bucket
  i64 rows, vocab, num_slots, num_steps, step;
  i64 stride_br, stride_bn, stride_cs;
  i64 idx64, pos64;
  i64 flags;   // DW_F_* hints (never change a draw)
  double scale, filter_margin;
  // dm_wide_finish only
  u64 anchor;  // [R] int32/int64 (anchor64)
  u64 embed;   // W1 [embed_rows, 256] bf16 contiguous
  u64 tokens;  // draft_tokens [R, N] int64, strides (tokens_row_stride, tokens_step_stride)
  i64 anchor64, embed_rows, tokens_row_stride, tokens_step_stride;
  u64 keys;    // [N][rows16] WideRow: every step's row keys (dm_wide_finish before step 0 writes them)
  // method="inverse_cdf" only (the _icdf step entry points and dm_wide_pick)
  u64 part;    // [rows16][part_stride] float2 (max z / T, sum exp(z / T - max)) per (row, block), written per step
  i64 part_stride, icdf_gpb, icdf_blocks, cache32;  // blocks per row allocated; groups per block; blocks; fp32 cache
};

#define DW_LOG2E 1.4426950408889634f
#define DW_F_PREFETCH 1  // L2 prefetch of the base logits one group ahead (the team's first group at the start)

// Per-row keys of the step, in shared memory: the noise prefix, 1/T, T (0: greedy), the element offset of the row's
// base logits and of its cache row (-1: a padding sample, no write).
struct WideRow {
  i64 base_off;
  i64 cache_off;
  u32 prefix;
  float inv_temp;
  float temp;
  i32 pad;
};

__device__ __forceinline__ WideRow wide_row(const WideArgs& a, i64 row, i64 step) {
  const i64 sample = row * a.num_steps + step;
  i64 slot = a.idx64 ? ((const i64*)a.idx)[sample] : (i64)((const i32*)a.idx)[sample];
  const i64 position = a.pos64 ? ((const i64*)a.pos)[sample] : (i64)((const i32*)a.pos)[sample];
  const bool live = slot >= 0 && slot < a.num_slots;
  const float temp = live ? ((const float*)a.temp)[slot] : 0.0f;
  const i64 seed = live ? ((const i64*)a.seeds)[slot] : 0;
  WideRow r;
  r.prefix = dm::draft_prefix(seed, (int)step, position);
  r.temp = temp;
  // (a subnormal T: NaN bounds, so that every token of such a row gets its exact key; seeding skips NaN bounds)
  r.inv_temp = temp == 0.0f ? 1.0f : dm::bound_inv_temp(dm::div_rn(1.0f, temp));
  r.base_off = row * a.stride_br + step * a.stride_bn;
  r.cache_off = live ? slot * a.stride_cs + step * a.vocab : -1;
  r.pad = 0;
  return r;
}

// The exact key of SPEC.md 4 (z on greedy rows). Not inlined: its ~200 instructions exist once in the binary.
__device__ __noinline__ float dw_exact_key(float z, float temp, u32 prefix, u32 token) {
  return temp == 0.0f ? z : dm::exact_key(z, temp, prefix, token);
}

// Token offset inside a group of the mma column n of n-tile nt: lane quad c of the accumulator holds the columns
// 2c, 2c + 1 of both n-tiles, i.e. the 4 consecutive tokens 4c .. 4c + 3.
__device__ __forceinline__ int dw_token_of(int nt, int n) { return (n >> 1) * 4 + nt * 2 + (n & 1); }

__device__ __forceinline__ void dw_bar(int id, int threads) {  // named barrier of the warps sharing a stage
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Inverse CDF (SPEC.md 5; ops/pick.py's rules): 2^x by one ex2.approx.ftz (MUFU). exp(d) = ex2(d log2 e) for d <= 0:
// 1 at d = 0, 0 at d = -inf, results below 2^-126 flushed to 0 (weights that small never decide a draw; impl="wide"
// does the same), NaN stays NaN.
__device__ __forceinline__ float dw_exp(float d) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(dm::mul_rn(d, DW_LOG2E)));
  return y;
}
// max with NaN sticky (torch.amax): a NaN in either argument gives NaN.
__device__ __forceinline__ float dw_nan_max(float a, float b) { return (a > b || a != a) ? a : b; }
// BEGIN host-tested (tests/draft/test_cuda_wide.py compiles this part as host C++ against noise.cuh)
#if defined(__CUDA_ARCH__)
#define DW_HD __device__ __forceinline__
DW_HD float dw_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
#define DW_HD static inline
DW_HD float dw_fma(float a, float b, float c) { return std::fmaf(a, b, c); }
#endif
// The reciprocal dw_div_rcp divides by: div_rn(1, t) for t in [2^-16, 2^16], else 0 (always div_rn).
DW_HD float dw_rcp_for(float t, float inv_t) { return t >= 0x1p-16f && t <= 0x1p16f ? inv_t : 0.0f; }
// z / t rounded to nearest, div_rn's value, from r = dw_rcp_for(t, div_rn(1, t)): q0 = z r, then two Markstein
// corrections q <- q + (z - q t) r (each residual by one FMA) give the correctly rounded quotient while nothing
// underflows or overflows: |q0| in [2^-80, 2^100) (so |z| >= 2^-97, every residual a normal number); zero, +-inf, NaN,
// r = 0 and the extremes take div_rn. 5 FP instructions where div_rn's fast path takes ~15 (MUFU.RCP, FCHK, the
// branch to its slow path); checked against IEEE division over every significand of several binades of z and many t.
DW_HD bool dw_rcp_ok(float q0) {  // q0 = z r in the range where the corrections are exact
  const float a = q0 < 0.0f ? -q0 : q0;
  return a >= 0x1p-80f && a < 0x1p100f;
}
DW_HD float dw_markstein(float z, float t, float r, float q0) {
  const float q1 = dw_fma(dw_fma(-q0, t, z), r, q0);
  return dw_fma(dw_fma(-q1, t, z), r, q1);
}
DW_HD float dw_div_rcp(float z, float t, float r) {
  const float q0 = dm::mul_rn(z, r);
  return dw_rcp_ok(q0) ? dw_markstein(z, t, r, q0) : dm::div_rn(z, t);
}
// END host-tested
// z / T of SPEC.md 5 (the IEEE division's value; T = 1 is the identity, T = 0 rows are greedy and never use it); r from
// dw_rcp_for.
__device__ __forceinline__ float dw_scaled(float z, float temp, float r) {
  return temp == 1.0f ? z : dw_div_rcp(z, temp, r);
}
// A partial (shift, mass: sum exp(x - shift) over its tokens, shift their max x = z / T) merged into (m, s) in place:
// the larger shift stays and the other mass is rescaled by exp(smaller - larger). A NaN shift is sticky (the row goes
// to the argmax); a partial without mass (every token -inf) changes nothing but the max.
__device__ __forceinline__ void dw_merge(float& m, float& s, float gm, float gs) {
  if (gm > m) {
    s = dm::add_rn(dm::mul_rn(s, dw_exp(dm::sub_rn(m, gm))), gs);
    m = gm;
  } else {
    if (gs > 0.0f) s = dm::add_rn(s, dm::mul_rn(gs, dw_exp(dm::sub_rn(gm, m))));
    if (gm != gm) m = gm;
  }
}
