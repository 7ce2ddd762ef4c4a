// Draft keys and Gumbel noise of SPEC.md section 4, bit-identical to dspark_markov/rng.py.
//
// Every function is __host__ __device__: the device build (NVRTC, --fmad=false) and a host C++
// build (tests/test_cuda_chain.py, -ffp-contract=off) evaluate the same IEEE fp32 operations in
// the same order as rng.py. On the device the additions, multiplications and the division are
// the round-to-nearest intrinsics, which are never contracted into an FMA whatever the flags.
// The approximate noise (dm::approx_gumbel) is the one of draft/gumbel_filter.py: the same
// operations and the hardware lg2.approx.ftz, so its bound (NOISE_BOUND, checked over all 2^32
// hashes) holds here too. No header is included: NVRTC compiles this without a toolkit.
#pragma once

#if defined(__CUDACC__)
#define DM_HD __host__ __device__ __forceinline__
#else
#define DM_HD static inline
#include <cmath>
#include <cstring>
#endif

namespace dm {

typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#if defined(__CUDA_ARCH__)
DM_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
DM_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
DM_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
DM_HD float as_float(u32 x) { return __uint_as_float(x); }
DM_HD u32 as_u32(float x) { return __float_as_uint(x); }
DM_HD float hw_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#else
DM_HD float add_rn(float a, float b) { return a + b; }
DM_HD float mul_rn(float a, float b) { return a * b; }
DM_HD float div_rn(float a, float b) { return a / b; }
DM_HD float as_float(u32 x) { float f; std::memcpy(&f, &x, 4); return f; }
DM_HD u32 as_u32(float x) { u32 u; std::memcpy(&u, &x, 4); return u; }
DM_HD float hw_log2(float x) { return std::log2(x); }  // host stand-in (not bit-compared)
#endif
DM_HD float sub_rn(float a, float b) { return add_rn(a, -b); }
DM_HD float max_f(float a, float b) { return a > b ? a : b; }  // torch.clamp_min on non-NaN input

// ----------------------------------------------------------------- MurmurHash3_x86_32 (4 words)
DM_HD u32 rotl32(u32 x, int r) { return (x << r) | (x >> (32 - r)); }

DM_HD u32 mix_word(u32 h, u32 k) {
  k *= 0xCC9E2D51u;
  k = rotl32(k, 15);
  k *= 0x1B873593u;
  h ^= k;
  h = rotl32(h, 13);
  return h * 5u + 0xE6546B64u;
}

// State after [seed_lo, seed_hi, pos_lo] (rng.hash_prefix).
DM_HD u32 hash_prefix(i64 seed, i64 pos, u32 domain) {
  u64 s = (u64)seed;
  u32 h = mix_word(domain, (u32)(s & 0xFFFFFFFFull));
  h = mix_word(h, (u32)(s >> 32));
  return mix_word(h, (u32)((u64)pos & 0xFFFFFFFFull));
}

// Add the token word and finalise (rng.hash_finish).
DM_HD u32 hash_finish(u32 prefix, u32 token) {
  u32 h = mix_word(prefix, token);
  h ^= 16u;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// Prefix of draft step `step` predicting position P: seed ^ (step << 32), (P - 1) + 2^30.
DM_HD u32 draft_prefix(i64 seed, int step, i64 position) {
  u64 key_seed = (u64)seed ^ ((u64)(u32)step << 32);
  i64 key_pos = position - 1 + (1ll << 30);
  return hash_prefix((i64)key_seed, key_pos, 0u);
}

// ----------------------------------------------------------------- uniform and bit-exact log
// (h >> 16) 2^-16 + ((h & 0xFFFF) + 0.5) 2^-32: both parts exact, one rounding (rng.uniform32).
// A 16-bit integer k converts exactly as bits(2^23 + k) - 2^23 (the same value as (float)k, without
// the quarter-rate conversion instruction), as rng_triton.uniform32 does.
DM_HD float uniform32(u32 h) {
  float high = mul_rn(sub_rn(as_float((h >> 16) | 0x4B000000u), 8388608.0f), 0x1p-16f);
  float low = mul_rn(add_rn(sub_rn(as_float((h & 0xFFFFu) | 0x4B000000u), 8388608.0f), 0.5f), 0x1p-32f);
  return add_rn(high, low);
}

// rng.log_f32: natural log of positive normal fp32, the same operations in the same order.
DM_HD float log_f32(float x) {
  i32 bits = (i32)as_u32(x);
  i32 exponent = ((bits >> 23) & 0xFF) - 126;
  float mantissa = as_float((u32)((bits & 0x7FFFFF) | 0x3F000000));
  bool low = mantissa < 0x1.6a09e6p-1f;  // SQRT_HALF
  exponent -= low ? 1 : 0;
  float f = sub_rn(low ? add_rn(mantissa, mantissa) : mantissa, 1.0f);
  float f2 = mul_rn(f, f);
  float p = 0x1.204376p-4f;
  p = add_rn(mul_rn(p, f), -0x1.d7a37p-4f);
  p = add_rn(mul_rn(p, f), 0x1.de4a34p-4f);
  p = add_rn(mul_rn(p, f), -0x1.fcba9ep-4f);
  p = add_rn(mul_rn(p, f), 0x1.23d37ep-3f);
  p = add_rn(mul_rn(p, f), -0x1.555ca0p-3f);
  p = add_rn(mul_rn(p, f), 0x1.999d58p-3f);
  p = add_rn(mul_rn(p, f), -0x1.fffff8p-3f);
  p = add_rn(mul_rn(p, f), 0x1.555554p-2f);
  float e = (float)exponent;
  float y = mul_rn(mul_rn(f, f2), p);
  y = add_rn(y, mul_rn(e, -0x1.bd0106p-13f));  // LN2_LOW
  y = sub_rn(y, mul_rn(f2, 0.5f));
  return add_rn(add_rn(f, y), mul_rn(e, 0x1.63p-1f));  // LN2_HIGH
}

// rng.gumbel32: -log(-L(u)), L(u) = log(1 - u) (Horner series below 1/4).
DM_HD float gumbel32(float u) {
  float p = 0.125f;
  p = add_rn(mul_rn(u, p), 0x1.24924ap-3f);
  p = add_rn(mul_rn(u, p), 0x1.555556p-3f);
  p = add_rn(mul_rn(u, p), 0x1.99999ap-3f);
  p = add_rn(mul_rn(u, p), 0.25f);
  p = add_rn(mul_rn(u, p), 0x1.555556p-2f);
  p = add_rn(mul_rn(u, p), 0.5f);
  float log1m;
  if (u < 0.25f) {
    log1m = -mul_rn(u, add_rn(mul_rn(u, p), 1.0f));
  } else {
    log1m = log_f32(max_f(sub_rn(1.0f, u), 0x1p-24f));
  }
  return -log_f32(-log1m);
}

// Exact noise of one token under a draft_prefix state (rng.draft_noise).
DM_HD float draft_noise(u32 prefix, u32 token) { return gumbel32(uniform32(hash_finish(prefix, token))); }

// Exact key z / T + g (division correctly rounded; SPEC.md section 4), T > 0.
DM_HD float exact_key(float z, float temp, u32 prefix, u32 token) {
  return add_rn(div_rn(z, temp), draft_noise(prefix, token));
}

// ----------------------------------------------------------------- approximate noise (filter)
// gumbel_filter.approx_gumbel: -log(-log(1 - u)) through the hardware log2, within NOISE_BOUND.
DM_HD float approx_gumbel(float u) {
  const float ln2 = 0x1.62e430p-1f;
  float minus_log1m;
  if (u < 0.0625f) {
    minus_log1m = mul_rn(u, add_rn(mul_rn(u, add_rn(mul_rn(u, add_rn(mul_rn(u, 0.25f), 0x1.555556p-2f)), 0.5f)), 1.0f));
  } else {
    minus_log1m = mul_rn(-hw_log2(max_f(sub_rn(1.0f, u), 0x1p-24f)), ln2);
  }
  return mul_rn(-hw_log2(minus_log1m), ln2);
}

DM_HD float approx_noise(u32 prefix, u32 token) { return approx_gumbel(uniform32(hash_finish(prefix, token))); }

// ----------------------------------------------------------------- noise upper-bound table (chain V6 & 64)
// Bucket of a hash: the fp32 exponent and the top DM_TB_BITS mantissa bits of (float)(h | 1), a
// non-decreasing function of h (u32 -> fp32 rounds monotonically). uniform32 is non-decreasing in h,
// so every bucket is an interval of u, and buckets are finer where the noise is steep and large
// (small h: u near 0, g = -log(-log(1 - u)) large; relative width 2^-DM_TB_BITS in u there).
// The table holds, per bucket, the largest gumbel32(uniform32(h)) over every h of the bucket
// (dm_noise_table evaluates all 2^32 hashes), so add_rn(q, table[bucket(h)]) >= add_rn(q, noise(h))
// for every q: an upper bound of the exact key, with no approximation error at all.
#define DM_TB_BITS 6
#define DM_TB_SIZE (33 << DM_TB_BITS)  // exponents 127 .. 159 (h | 1 in [1, 2^32), rounded up to 2^32)
DM_HD u32 tb_bucket(u32 h) {
  return (as_u32((float)(h | 1u)) >> (23 - DM_TB_BITS)) - (127u << DM_TB_BITS);
}
// fp32 -> u32 in the order of the floats (NaN aside): one unsigned max merges two.
DM_HD u32 tb_order(float g) {
  u32 u = as_u32(g);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
DM_HD float tb_unorder(u32 o) {  // 0 (an empty bucket) -> -inf
  if (o == 0u) return as_float(0xFF800000u);
  return as_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

// ----------------------------------------------------------------- packed (key, index) words
// int64 ordered by (fp32 key, then the lower index): NaN keys share the largest code (the first
// NaN wins, as torch.argmax), -0.0 is +0.0. One signed max merges two words.
DM_HD i64 pack_word(float key, i32 index) {
  i32 bits = key == 0.0f ? 0 : (i32)as_u32(key);
  if (key != key) bits = 0x7FFFFFFF;
  i32 ordered = bits >= 0 ? bits : (bits ^ 0x7FFFFFFF);
  return (i64)(((u64)(u32)ordered << 32) | (u64)(u32)(0x7FFFFFFF - index));
}

DM_HD float word_key(i64 word) {
  i32 ordered = (i32)(word >> 32);
  i32 bits = ordered >= 0 ? ordered : (ordered ^ 0x7FFFFFFF);
  return as_float((u32)bits);
}

DM_HD i32 word_index(i64 word) { return 0x7FFFFFFF - (i32)(word & 0x7FFFFFFF); }

// gumbel_filter.key_slack: above this gap the approximate best is certainly the exact best.
DM_HD float key_slack(float value, float margin) {
  float mag = value < 0.0f ? -value : value;
  return add_rn(margin, mul_rn(add_rn(mag, 64.0f), 0x1p-20f));
}

}  // namespace dm
