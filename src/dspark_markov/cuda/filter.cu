// Top-k / top-p filter with each row resident in the shared memory of one 8-block cluster (sm_90): issue 16.
//
// Semantics: verify/filtering.py's module doc, bit for bit (the kept set of the stable sort reference; masses are
// exact integer sums of q = trunc(exp(x - max) 2^32) from the software exp of filtering_reference.weight_fixed_point).
//
// Raw logits (t_ptr / t_value): every value is divided by the row's temperature as it is loaded (x / T, the IEEE
// division; T = 0 unscaled), and the filter works on, and writes, the divided row: the output is bit for bit the
// filter of the pre-divided logits, without a separate temperature pass (issue 18).
//
// One launch, one cluster of DF_C = 8 blocks per row (4 to 8 in the L2-row build: -DDF_C=N); block `rank` holds tokens
// [rank S, rank S + S) of the row in shared memory (S = ceil(V / DF_C) rounded up to 4: 64,640 bytes at V = 129,280,
// two blocks per SM; the -DDF_L2_ROWS build re-reads them from L2 instead):
//   1. load the slice once (16-byte streaming loads), its max and NaN flag; cluster barrier; every block reads the
//      8 partials through distributed shared memory: the row max m (a NaN row, an all -inf row or a row without
//      top-k and top-p is left as it is: written out when out is not logits or the row was divided);
//   2. one pass over the slice: bucket(x) = 0 where x == m, else min(floor((m - x) 64), 2047) (monotone in the
//      ranking: better tokens never fall in a later bucket), and q (top-p only); a local histogram of counts
//      and masses per bucket in three 32-bit words (red.shared, no branch); cluster barrier; block r sums
//      buckets [DF_RANGE r, DF_RANGE r + DF_RANGE) over the DF_C blocks (DF_RANGE = 256 with 8 blocks, else 512);
//   3. a search finds the token at a target of the ranking: the k-th best (top-k), the first whose inclusive
//      mass reaches L = ceil(p * S) (top-p; "mass before < p S" for an integer mass is "before < L"), or the
//      best (p <= 0): the range (DF_C totals), the bucket (DF_RANGE sums, block scans), then, if it holds more
//      than DF_CAP tokens, 256-way narrowing passes on the packed (key, index) word (8 bits per pass), and the
//      bucket's (or the narrowed range's) tokens gathered into every block's candidate array (flags: by two fp32
//      compares against the bucket's exact bounds, df_thresholds, into a register mask per thread), a bucket of
//      more than DF_SMALL narrowed there by 256-way digit passes (df_refine), then sorted (<= DF_SMALL: ranked by
//      counting; else bitonic), descending packed word, their q scanned: the target's word and its inclusive mass;
//      top-k first (its inclusive mass is S for top-p), then top-p. With top-k and top-p together the histogram
//      holds counts only, and when every token of the buckets up to the k-th token's fits in one gather (k = 50:
//      a few hundred), those are gathered and sorted and both cuts come from their inclusive masses (top-p keeps
//      a prefix of the k best): the row's weights are never computed; else the masses are histogrammed after all;
//   4. the row written once: out = packed(x, i) >= cut ? x : -inf (compared as x > cut value, or x equal to it at
//      an index not above the cut's). (With DF_FLAG_FUSED_WRITE, the L2-row build's default for top-p alone since
//      stop 43, the gather of step 3 writes the row instead, and only the gathered bucket's members ranked below the
//      cut are written again here.)
// Every block makes the same decisions from the same integer sums, so a row needs no broadcast; the cluster
// barriers order every exchange (release / acquire), and a last one keeps every block's shared memory alive until
// no other block can read it.
//
// Bytes: the row read once and written once (2 x 4 V per row; DF_FLAG_FUSED_WRITE writes the bucket's members a
// second time, a few KB); the candidate exchanges stay on chip.
// Instructions (NVRTC 13.0 SASS): 49 per logit in step 2 for top-p alone (the weight ~30: the 7-term polynomial
// with IEEE adds and multiplies, floor without conversions, one F2I.U64; bucket 5; three red.shared), ~10 with
// top-k (counts); ~4 in step 1, ~6 in step 4.
// Measured (H200, 2026-12-05; tools/trace_cluster_filter.py reads the DF_MARK phase stamps of a -DDF_TRACE build):
// each row is a chain of ~25 (k + p) to ~37 us (p alone) of latency-bound phases, two blocks per SM (36-45% of
// the issue slots, 30 clusters resident), so 1,518 rows take ~50 waves: 1.2 / 1.6 ms (verify/cuda_filtering.py).
//
// Options (FilterArgs.flags, DF_FLAG_*): ILP (4), ASYNC_LOAD (8) and WARP_THRESHOLDS (16), written from the SASS of
// the first default (3: the histogram loop was one dependent chain per token, the load two round trips, the bounds 32
// serial halvings), measured exact and faster on the H100 and the H200 (2026-12-05): all on by default (31). The
// build with -DDF_L2_ROWS (same source, same decisions; verify/cuda_filtering.py FLAG_L2_ROWS, default for top-p
// alone from 31 rows): no slice in shared memory, every pass re-reads the block's slice from global memory (kept in
// L2 by an evict_last policy; the last read evict_first), four blocks per SM at 64 registers: twice the rows in
// flight, each row slower. With -DDF_C=4 as well (FLAG_L2_CLUSTER4, opt-in: exact, slower) clusters of 4 blocks, two
// level-1 buckets per thread in the reductions; with -DDF_C=5, 6 or 7 (FLAG_L2_FIT, stop 40: the cluster size picked per
// call so that a batch fills the device's clusters in fewer waves) the same: blocks 0-3 reduce all 2,048 buckets
// (512 each, DF_C remote reads per bucket), the ranges of blocks 4 and up lie past the last bucket, empty.
// The resident build's SASS is unchanged by the macros (DF_AT & co.
// expand to the shared-memory reads). Either build with -DDF_PERSIST (FLAG_PERSIST, opt-in: exact, slower on the H200):
// persistent clusters, the next row's slice prefetched into L2, and with -DDF_CARRY as well loaded during a row's
// write (see df_row, DfCarry).
// Verified on the H200 (2026-12-05): its GPU tests (tests/gpu/test_cuda_filtering_gpu.py) and every flags option
// equal the sort reference; compute-sanitizer memcheck / racecheck / synccheck clean. 106 registers (the resident
// build; the L2-row builds 64, with 4-8 bytes of spill stores since stop 43's flags, outside the per-token loops),
// 47,376 bytes of static shared memory (47,344 before stop 43, 47,328 before 41) + the slice. On the CPU: the search
// emulated in its order of decisions, the helpers compiled as host C++ (tests/verify/test_cuda_filtering.py).
#include "noise.cuh"

namespace dm {

#ifndef DF_C
#define DF_C 8            // blocks per cluster (one row); -DDF_C=4 to 7 with -DDF_L2_ROWS: L2-row builds of N blocks
#endif
#define DF_T 256          // threads per block
#define DF_NB 2048        // level-1 buckets: 1/64 of a logit wide below the max, the last one open
// Buckets reduced by each thread (DF_PER) and block (DF_RANGE): 1 and 256 with 8 blocks, 2 and 512 with 4 to 7 (adjacent
// buckets, better first). With 5, 6 or 7 blocks DF_C DF_RANGE exceeds DF_NB: the ranges of blocks 4 and up lie past
// the last bucket, and those reduced buckets are empty (count and mass 0: never selected; see df_histogram).
#define DF_PER ((DF_NB + DF_C * DF_T - 1) / (DF_C * DF_T))
#define DF_RANGE (DF_PER * DF_T)
static_assert(DF_C >= 4 && DF_C <= 8, "DF_C: 4 to 8 blocks per cluster");
#if DF_C != 8 && !defined(DF_L2_ROWS)
#error "DF_C < 8 is the L2-row build's option (-DDF_L2_ROWS): a resident slice of V / DF_C leaves one block per SM"
#endif
#ifdef DF_L2_FIVE         // (stop 40, FLAG_L2_FIVE) the L2-row build at five blocks per SM: 48 registers, and 1,024
#ifndef DF_L2_ROWS        // candidates (s_cand 8 KB: five blocks' static shared memory fits the SM's 228 KB)
#error "DF_L2_FIVE is an option of the L2-row build (-DDF_L2_ROWS)"
#endif
#define DF_CAP 1024
#else
#define DF_CAP 2048       // most candidates gathered and sorted at once
#endif
#define DF_SCALE 64.0f
#define DF_LOADS 8        // 16-byte loads in flight per thread while the slice is read
// A histogram bin of one block is three 32-bit words, each added by one red.shared (a 64-bit shared add would be a
// CAS loop, and a carry between two words would make the add wait for the first's result): the count, the sum
// of q & 0xFFFF and the sum of q >> 16 (a slice has <= 65,535 tokens and q <= 2^32: no word overflows).

// ----------------------------------------------------------------- helpers (host C++ too: the CPU test)
// filtering_reference.weight_fixed_point, bit for bit: q = trunc(exp(x - m) 2^32) by the software exp (Cody-Waite,
// degree-7 Taylor, IEEE fp32 adds and multiplies in the reference's order), without a branch. d < -22.5: q = 0
// (exp(-22.5) 2^32 = 0.72; the test checks every fp32 d in [-44, -22.5) against the reference), so d is clamped at
// -23 instead of -44 (n >= -34 keeps 2^(n + 32) normal); x == m (also +inf == +inf, where d is NaN): 2^32.
// floor(y) without conversions (1/4 of the FP32 rate on sm_90): y + 1.5 2^23 rounds y (|y| < 2^22) to the nearest
// integer f, whose bits are 0x4B400000 + f; floor(y) = f, or f - 1 where f > y.
// poly 2^n 2^32 for the reduced dc (>= -23) and n = floor(dc log2(e) + 0.5) (n_int: the same as an int): the Cody-Waite
// reduction and the degree-7 Taylor polynomial of df_weight, shared with df_weight_finite
DM_HD float df_exp_scaled(float dc, float n, i32 n_int) {
  const float r = sub_rn(sub_rn(dc, mul_rn(n, 0x1.63p-1f)), mul_rn(n, -0x1.bd0106p-13f));
  float poly = 0x1.a01a02p-13f;
  poly = add_rn(mul_rn(poly, r), 0x1.6c16c2p-10f);
  poly = add_rn(mul_rn(poly, r), 0x1.111112p-7f);
  poly = add_rn(mul_rn(poly, r), 0x1.555556p-5f);
  poly = add_rn(mul_rn(poly, r), 0x1.555556p-3f);
  poly = add_rn(mul_rn(poly, r), 0.5f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  // poly 2^n 2^32 in one exact product (a normal power of two)
  return mul_rn(poly, as_float((u32)(n_int + 159) << 23));
}

// n = floor(dc log2(e) + 0.5) for dc in [-23, 0], as a float and (n_int) an int, without conversions (see above)
DM_HD float df_exp_n(float dc, i32& n_int) {
  const float y = add_rn(mul_rn(dc, 0x1.715476p+0f), 0.5f);
  const float shifted = add_rn(y, 12582912.0f);
  const float f = sub_rn(shifted, 12582912.0f);
  const bool down = f > y;
  n_int = (i32)as_u32(shifted) - 0x4B400000 - (down ? 1 : 0);
  return down ? sub_rn(f, 1.0f) : f;
}

DM_HD u64 df_weight(float x, float m) {
  const float d = sub_rn(x, m);
  const float dc = d >= -23.0f ? d : -23.0f;
  i32 n_int;
  const float n = df_exp_n(dc, n_int);
  const float w = df_exp_scaled(dc, n, n_int);  // selected, then truncated toward zero
  return (u64)(x == m ? 4294967296.0f : (d >= -22.5f ? w : 0.0f));
}

// df_weight for a FINITE row max m, with fewer instructions (stop 41, DF_FLAG_FINITE_WEIGHT: the histogram loop's
// weight was ~30 of its ~50 instructions per token); the same q for every x <= m, x not NaN (the host test compares
// the two on every 7th fp32 d in [-24, 0] and the bands around them; every d once, stop 41): the clamp is one FMNMX,
// and neither select is needed: d = 0 (x == m, a finite m) reduces to n = 0, r = 0, poly = 1, w = 2^32 exactly;
// d < -22.5 (also -inf, clamped to -23) gives w < exp(-22.5) 2^32 (1 + 2^-20) < 1, which truncates to 0. A row max
// of +inf keeps df_weight (its d is NaN there). (The floor by one FRND instead of df_exp_n measured slower at 1,518
// rows on the H100, stop 41: 1,434 against 1,388 us.)
DM_HD u64 df_weight_finite(float x, float m) {
  const float d = sub_rn(x, m);
  const float dc = fmaxf(d, -23.0f);
  i32 n_int;
  const float n = df_exp_n(dc, n_int);
  return (u64)df_exp_scaled(dc, n, n_int);
}

// Level-1 bucket: 0 for the max itself (also +inf == +inf), else floor((m - x) 64) capped at DF_NB - 1. m - x is
// rounded monotonically, so x1 >= x2 gives bucket(x1) <= bucket(x2).
DM_HD u32 df_bucket(float x, float m) {  // (no branch: selects; RN(x - m) (-64) = RN(m - x) 64, as df_weight's d)
  const float e = mul_rn(sub_rn(x, m), -DF_SCALE);
  const u32 b = e < (float)(DF_NB - 1) ? (u32)e : (u32)(DF_NB - 1);
  return x == m ? 0u : b;
}

// df_bucket for a FINITE row max m (DF_FLAG_FINITE_WEIGHT): x == m gives e = 0, bucket 0, without the select; e >= 2047
// (also x = -inf: e = +inf) is capped by the min before the conversion truncates.
DM_HD u32 df_bucket_finite(float x, float m) {
  return (u32)fminf(mul_rn(sub_rn(x, m), -DF_SCALE), (float)(DF_NB - 1));
}

// Order-preserving 32-bit keys of floats (larger float, larger key; -0.0 just below +0.0) and back.
DM_HD u32 df_fkey(float x) { const u32 u = as_u32(x); return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }
DM_HD float df_fkey_value(u32 k) { return as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

// The smallest float t (in key order, from -inf up to m) with df_bucket(t, m) <= b, for two bucket bounds at once
// (two interleaved binary searches on the key: df_bucket is monotone, non-increasing in x, and bucket(m) = 0).
// Then for every x <= m of the row, df_bucket(x, m) <= b  <=>  x >= t (an fp32 compare: x >= t holds exactly for
// the keys from t's up, as -0.0 and +0.0 share a bucket); t = -inf when every x qualifies. A bound b < 0 gives +inf
// (the gather never compares with it).
DM_HD void df_thresholds(float m, i32 b1, i32 b2, float& t1, float& t2) {
  const u32 bottom = df_fkey(-as_float(0x7f800000u)), top = df_fkey(m);
  u32 lo1 = bottom, hi1 = top, lo2 = bottom, hi2 = top;  // invariant: bucket(hi) <= b; lo's only if lo == bottom
  const bool all1 = b1 >= 0 && (i32)df_bucket(df_fkey_value(bottom), m) <= b1;
  const bool all2 = b2 >= 0 && (i32)df_bucket(df_fkey_value(bottom), m) <= b2;
  for (int it = 0; it < 32; ++it) {  // each halves (hi - lo): < 2^32 to start
    const u32 mid1 = lo1 + ((hi1 - lo1) >> 1), mid2 = lo2 + ((hi2 - lo2) >> 1);
    const bool ok1 = (i32)df_bucket(df_fkey_value(mid1), m) <= b1, ok2 = (i32)df_bucket(df_fkey_value(mid2), m) <= b2;
    if (hi1 - lo1 > 1) { if (ok1) hi1 = mid1; else lo1 = mid1; }
    if (hi2 - lo2 > 1) { if (ok2) hi2 = mid2; else lo2 = mid2; }
  }
  const float inf = as_float(0x7f800000u);
  t1 = b1 < 0 ? inf : (all1 ? -inf : df_fkey_value(hi1));
  t2 = b2 < 0 ? inf : (all2 ? -inf : df_fkey_value(hi2));
}

// One round of a 16-way threshold search (df_thresholds_warp: a half-warp per bound, stop 27): probe j (0..14) of the
// key range (lo, hi] is lo + (j + 1) step, step = (hi - lo) / 16 (at least 1; a probe at or past hi is hi, which
// qualifies); `ok` has bit j set where probe j qualifies (bucket <= b: a suffix of the bits, the bucket being
// monotone). The range then shrinks to (the last failing probe, the first qualifying one]: about 16 times per round,
// ~8 rounds over 2^32 keys instead of df_thresholds' 32 dependent halvings. The invariant is df_thresholds' (hi
// qualifies; lo does not, unless it is the bottom key, which the caller checks), so both end at the same hi.
DM_HD u32 df_probe(u32 lo, u32 hi, u32 j) {
  const u32 step = (hi - lo) >> 4 ? (hi - lo) >> 4 : 1u;
  return (j + 1) * step < hi - lo ? lo + (j + 1) * step : hi;
}
DM_HD void df_narrow(u32& lo, u32& hi, u32 ok) {
  const u32 step = (hi - lo) >> 4 ? (hi - lo) >> 4 : 1u;
  if (ok == 0) {  // only when step = (hi - lo) / 16 >= 1: 15 step < hi - lo
    lo += 15u * step;
    return;
  }
#if defined(__CUDA_ARCH__)
  const u32 first = (u32)__ffs((int)ok) - 1u;  // (stop 40: one FLO where the loop below took ~70 iterations a warp in all at
                                               // 96 rows, ~4% of the filter's instructions; the same bit)
#else
  u32 first = 0;
  while (!((ok >> first) & 1u)) ++first;  // (the device passes a ballot's bits; <= 14 iterations)
#endif
  const u32 new_hi = df_probe(lo, hi, first);
  lo = first ? df_probe(lo, hi, first - 1) : lo;
  hi = new_hi;
}

// The packed (key, index) word with its sign bit flipped: unsigned order = ranking order (larger = better).
DM_HD u64 df_word(float x, i64 index) { return (u64)pack_word(x, (i32)index) ^ (1ull << 63); }
DM_HD float df_word_value(u64 word) { return word_key((i64)(word ^ (1ull << 63))); }
DM_HD i64 df_word_index(u64 word) { return (i64)(0x7FFFFFFF - (i32)(word & 0x7FFFFFFFull)); }  // df_word's index

DM_HD int df_top_bit(u64 x) {  // the highest set bit of x != 0
#if defined(__CUDA_ARCH__)
  return 63 - __clzll((long long)x);
#else
  return 63 - __builtin_clzll(x);
#endif
}

// DF_FLAG_SPARSE_DIGIT's digit: the bits of a word at the 8 highest bits where the candidates' words differ
// (diff = OR ^ AND of their words), the highest first (the digit's most significant bit); where fewer than 8 differ,
// the rest are bit 31, 0 in every word (df_word's low half is 0x7FFFFFFF - index). For words that agree outside diff,
// w1 > w2 gives digit(w1) >= digit(w2): the highest bit where they differ lies in diff, and the picked bits above it
// are equal. Picks that are 8 adjacent bits give the contiguous digit, (w >> lowest) & 255.
struct DfPicks {
  u64 b;  // bit positions, descending, 6 bits each: position j in bits [6 j, 6 j + 6) (one register pair)
};

DM_HD int df_pick(const DfPicks& picks, int j) { return (int)(picks.b >> (6 * j)) & 63; }

DM_HD DfPicks df_sparse_picks(u64 diff) {
  DfPicks picks = {0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int bit = diff != 0 ? df_top_bit(diff) : 31;
    if (diff != 0) diff ^= 1ull << bit;
    picks.b |= (u64)bit << (6 * j);
  }
  return picks;
}

DM_HD u32 df_sparse_digit(u64 w, const DfPicks& picks) {
  u32 digit = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) digit = (digit << 1) | ((u32)(w >> df_pick(picks, j)) & 1u);
  return digit;
}

}  // namespace dm

#if defined(__CUDACC__)
#include "common.cuh"

namespace dm {

// The row's values: in shared memory (the default build: s_x is the block's slice), or, in the build with
// -DDF_L2_ROWS (kernel dm_filter from the same source, verify/cuda_filtering.py FLAG_L2_ROWS), re-read from global
// memory at every pass (s_x is then the row's slice in global memory), kept in L2 by an evict_last policy between the
// passes: no slice in shared memory, four blocks per SM instead of two (64 registers), so twice the rows in flight.
// Rows must then be 16-byte aligned and not divided by a temperature (the launcher sends those to the default build).
#ifdef DF_L2_ROWS
#ifdef DF_L2_FIVE
#define DF_MIN_BLOCKS 5
#else
#define DF_MIN_BLOCKS 4
#endif
#define DF_ROW_POLICY const u64 df_policy = df_keep_policy()
#define DF_AT(i) df_ldg(s_x + (i), df_policy)
#define DF_AT4(v) df_ldg4(s_x + 4 * (v), df_policy)
#define DF_AT4_PART(v, n) df_ldg4_part(s_x, (v), (n), df_policy)
#else
#define DF_MIN_BLOCKS 2
#define DF_ROW_POLICY do { } while (0)
#define DF_AT(i) s_x[i]
#define DF_AT4(v) reinterpret_cast<const float4*>(s_x)[v]
#define DF_AT4_PART(v, n) reinterpret_cast<const float4*>(s_x)[v]
#endif
__device__ __forceinline__ u64 df_keep_policy() {  // L2: keep these lines (the row is read again)
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ u64 df_drop_policy() {  // L2: the row's last read
  u64 policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// No "memory" clobber and not volatile (the compiler may merge or reorder these reads): safe because every read of
// the row gives the same decisions whether it sees a value before or after this thread's own stores to it. Without
// DF_FLAG_FUSED_WRITE nothing writes the row before its last read (each element's one store, step 4, uses the value
// read by the same thread). With it, in place, the gather stores x for every token at or above its bucket (later
// reads of those see x either way) and -inf below it (the later readers, narrowing passes, a second gather and the
// write pass of an overflowing bucket, drop such a token whether they read x or -inf). A store whose later read
// could change a decision would need these loads to become volatile. (-DDF_PERSIST reads row i + G after
// writing row i: other addresses, as the launcher refuses overlapping rows, so reordering them is harmless too.)
__device__ __forceinline__ float df_ldg(const float* ptr, u64 policy) {
  float v;
  asm("ld.global.L1::no_allocate.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(ptr), "l"(policy));
  return v;
}
__device__ __forceinline__ float4 df_ldg4(const float* ptr, u64 policy) {  // 16-byte aligned
  float4 v;
  asm("ld.global.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(ptr), "l"(policy));
  return v;
}
// Group v of four tokens of a slice of n when the group may run past n (the last group of the row's last block):
// the tokens past n are not read (0 instead; the caller masks them out).
__device__ __forceinline__ float4 df_ldg4_part(const float* row, int v, int n, u64 policy) {
  if (4 * v + 4 <= n) return df_ldg4(row + 4 * v, policy);
  float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  f.x = df_ldg(row + 4 * v, policy);
  if (4 * v + 1 < n) f.y = df_ldg(row + 4 * v + 1, policy);
  if (4 * v + 2 < n) f.z = df_ldg(row + 4 * v + 2, policy);
  return f;
}

struct FilterArgs {  // 8-byte fields (verify/cuda_filtering.py FilterArgs)
  u64 logits, out, k_ptr, p_ptr, stats;  // stats: [2] int32: searches that narrowed (running total), 1 = a search failed
  i64 rows, vocab, in_stride, out_stride, slice, k_value, k_per_row, k64, p_per_row;
  double p_value;  // the fp32 value of a scalar p (1: no top-p)
  u64 t_ptr;       // [rows] fp32 temperatures (t_per_row), or a scalar t_value: the logits are RAW, divided first
  i64 t_per_row;
  double t_value;  // the fp32 value of a scalar temperature (1: none; 0: unscaled)
  i64 flags;       // DF_FLAG_* (stop 26): 0 = the stop-25 gather and bitonic sort
};

// Options (FilterArgs.flags; verify/cuda_filtering.py FLAGS), every one drawing the same kept set:
#define DF_FLAG_MASK_GATHER 1  // candidates marked in a 64-bit register mask per thread first (no vote per token),
                               // one cluster atomic per warp, then only the members stored
#define DF_FLAG_REFINE 2       // a search's gathered bucket narrowed in shared memory (256-way digit passes on the
                               // bits where its words differ, no cluster barrier) to <= DF_SMALL, then candidates
                               // ranked by counting instead of the bitonic sort (also the prefix path's <= DF_SMALL)
#define DF_SMALL 256           // candidates ranked by counting: one per thread
#define DF_FLAG_ILP 4          // (stop 27; measured 2026-12-05) the level-1 histogram four tokens per step (one 16-byte
                               // shared load, four independent weight chains): the SASS of the one-token loop is a
                               // single dependent chain of ~45 instructions per token (~150-200 cycles with two
                               // warps per scheduler), which is the ~8-10 us "histogram" phase of the trace
#define DF_FLAG_ASYNC_LOAD 8   // (stop 27; measured 2026-12-05) the slice read with cp.async (16 bytes each, every copy
                               // of the thread in flight at once, no registers held) instead of two rounds of eight
                               // register loads; the max, NaN flag and the division by T then read shared memory
#define DF_FLAG_WARP_THRESHOLDS 16  // (stop 27; measured 2026-12-05) the gather's bucket bounds by 16-way rounds across
                               // the lanes (df_thresholds_warp, ~8 rounds) instead of 32 dependent halvings per thread
// Stop 41's kernel flags (DEEP_REFINE, SHARED_BOUNDS, FINITE_WEIGHT, UNCOUNTED, BATCHED_GATHER) are compiled
// out of the opt-in persistent (-DDF_PERSIST) and five-block (-DDF_L2_FIVE) builds, where they are inert: their code at
// those builds' register caps spilled words into the per-token loops, and those builds were measured slower anyway.
#if defined(DF_PERSIST) || defined(DF_L2_FIVE)
#define DF_NEW_FLAGS 0
#else
#define DF_NEW_FLAGS 1
#endif
#define DF_FLAG_DEEP_REFINE 2048  // (stop 41) with REFINE: a top-p search's (by mass: the row's last search, whose
                               // bucket no later search reuses) candidates refined down to <= DF_DEEP, not DF_SMALL: a
                               // digit pass over <= 256 candidates (one per thread) costs a few hundred instructions a
                               // thread where ranking 256 by counting cost ~1,000 (256 dependent 64-bit compares; 10% of
                               // the filter's instructions at 16 requests of p alone, Nsight Compute, stop 40)
#define DF_DEEP 32             // ... candidates left for ranking by counting: one warp's worth
#define DF_FLAG_SHARED_BOUNDS 4096  // (stop 41) with WARP_THRESHOLDS: the gather's bucket bounds searched by warp 0
                               // alone and shared through shared memory (every warp of every block of the cluster ran
                               // the same ~8 rounds: 64 times per row)
#define DF_FLAG_FINITE_WEIGHT 8192  // (stop 41) with ILP, top-p's level-1 histogram of a row with a finite max by
                               // df_weight_finite / df_bucket_finite (the same q and bucket, ~5 fewer instructions a token)
#define DF_FLAG_UNCOUNTED 16384  // (stop 41) with ILP and MASK_GATHER, top-p alone (p > 0: its one search is by mass):
                               // the level-1 histogram adds masses only (two shared adds a token, not three; an H100
                               // experiment without the count's add ran 8-12% faster, this flag ~1%), and the search
                               // learns its bucket's count from the gather (rank 0's slot counter), narrowing after it
                               // if the bucket held more than DF_CAP tokens
#define DF_GATHER_BATCH 4      // ... reads in flight per thread (8 spilled in the 4- to 7-block and five-block builds)
#define DF_FLAG_BATCHED_GATHER 32768  // (stop 41) with MASK_GATHER, a gather's 16-byte reads four at a time, all in flight
                               // before any is compared (the partial last group of a slice apart): the loop before
                               // read one group, compared it, then read the next (its SASS: one L2 round trip per
                               // group, as the group's one load sat in a branch of DF_AT4_PART), ~14% of a row's time
                               // at 16 requests of p alone in the phase trace
#define DF_FLAG_FUSED_WRITE 65536  // (stop 43) the L2-row build, top-p alone (with UNCOUNTED and BATCHED_GATHER, 16-byte
                               // aligned output): the row written by its one gather instead of a pass of its own after
                               // the search. The gather reads every token of the slice anyway and the cut lies in the
                               // gathered bucket, so it stores x for a token at or above the bucket's lower bound and
                               // -inf below it; once the cut is known only the bucket's members ranked below it are
                               // set to -inf (their indices kept beside the candidates before refinement reorders them:
                               // s_hist past DF_CAP, free then). A bucket of more than DF_CAP members (narrowed after
                               // the gather) takes the write pass, which reads the row as the gather left it (only
                               // tokens below the bucket changed, all dropped anyway) and stores only the 16-byte
                               // groups holding a member of the bucket. The write pass was ~12% of
                               // a row's time at 16 requests of top-p alone (phase trace, H100, stop 41). A failed
                               // search (stats[1], a broken invariant) then leaves the tokens below the bucket at -inf
                               // where the write pass would keep every token. Default since stop 43 (with
                               // PREFETCH_SLICE: p alone 2-4% / 9-12% / 14-16% faster at 16 / 64 / 253 requests, H100).
static_assert(3 * DF_NB / 2 - DF_CAP >= DF_CAP / 2, "FUSED_WRITE: DF_CAP member indices fit in s_hist past DF_CAP");
#define DF_FLAG_PREFETCH_SLICE 131072  // (stop 43) the L2-row build: thread 0 of each block asks the copy engine for its
                               // whole slice (cp.async.bulk.prefetch.L2) before the first read, whose eight loads in
                               // flight per thread then wait about one HBM round trip instead of two (the first read
                               // was ~26% of a row's time at 16 requests of top-p alone, phase trace, stop 41).
                               // Level alone, faster with FUSED_WRITE (verify/cuda_filtering.py): default since stop 43
#define DF_FLAG_SPARSE_DIGIT 524288  // (stop 48; stop 49 with DF_FIXED_FLAGS) with REFINE: a refinement pass's digit is
                               // the 8 highest bits where the candidates' words differ (df_sparse_digit; monotone in
                               // the word, so digits still rank better first) where those bits are not adjacent, not the
                               // 8 contiguous bits from the highest. A bucket of bf16-rounded logits holds a few distinct
                               // values with ~150 tied tokens each: the contiguous digit splits it by value only (its low
                               // bits are constant key bits), leaving ~150 to rank by counting (every thread ~150
                               // dependent compares, in every block); the sparse digit takes the index's high bits as
                               // well and leaves a few. Compiled into the DF_FIXED_FLAGS builds only (FLAG_SPECIALIZE;
                               // the generic builds keep their measured SASS: inert there, and the host refuses it
                               // without FLAG_SPECIALIZE), and df_refine<false> is the source without it, so that a build
                               // whose flags are compiled in without it keeps its SASS too (tools/cuda_sass.py).
#define DF_FLAG_SPLIT_FINAL 1048576  // (stop 49; with DF_FIXED_FLAGS) the row's last cluster barrier split: each block
                               // arrives after its last remote access (its search) and waits only before it leaves, so
                               // the write phase (its own shared memory read, global memory written) runs while the
                               // cluster's slower blocks finish; no block exits or reuses its shared memory before every
                               // block has arrived. Not in the persistent or five-block builds (DF_NEW_FLAGS 0 there);
                               // compiled into the specialized L2-row build too, but the host launches it in the
                               // resident build only (cuda_filtering.L2_KERNEL_FLAGS: measured slower in the other).
// The options compiled into the DF_FIXED_FLAGS builds only (SPARSE_DIGIT, SPLIT_FINAL): inert in the generic builds,
// which keep their measured SASS (the host refuses them without FLAG_SPECIALIZE).
#if defined(DF_FIXED_FLAGS)
#define DF_FIXED_ONLY DF_NEW_FLAGS
#else
#define DF_FIXED_ONLY 0
#endif
// -DDF_FIXED_FLAGS=F (verify/cuda_filtering.py FLAG_SPECIALIZE, stop 44): the build for launches whose kernel flags
// are F, with F compiled in (every test of FilterArgs.flags / FilterShared.flags folded to a constant, the code of the
// other options dropped: a smaller kernel); the host launches it with exactly F. (Reading FilterArgs' flags into one
// local in the kernel, instead of its reads through DF_FLAGS_OF, changes the generic builds' SASS: not done.)
// Without it every option's code is in the one kernel and the flags are read at run time (the same source:
// DF_FLAGS_OF is the identity).
#ifdef DF_FIXED_FLAGS
#define DF_FLAGS_OF(x) ((u32)(DF_FIXED_FLAGS))
#else
#define DF_FLAGS_OF(x) (x)
#endif
#define DF_UNCOUNTED 0xFFFFFFFFu   // df_collect's `count` when the histogram held no counts
#define DF_OVERFLOW 0xFFFFFFFEu    // df_collect: an uncounted gather found more than DF_CAP members (none sorted)

struct FilterShared {
  float part_max;    // this block's slice max and NaN flag (read by the others)
  u32 part_nan;
  float m;           // the row max
  u32 nan_row;
  u32 counter;       // rank 0's: gather slots, claimed from counter_base on (never reset within a row)
  u32 counter_base;  // where the next gather's slots start: the slots of the row's earlier gathers (every block alike)
  u32 gather_count;  // an uncounted gather's members (DF_FLAG_UNCOUNTED)
  u32 uncounted;     // DF_FLAG_UNCOUNTED applies to this row: its histogram holds no counts, its search gathers first
  u32 tot_cnt;       // this block's reduced range: count and mass
  u64 tot_mass;
  u64 warp_sum[DF_T / 32];
  u64 warp_sum2[DF_T / 32];
  // a search's state (every block alike)
  u32 sel;           // the selected range / bucket / digit
  u32 sel_cnt;       // its count
  u64 base_cnt, base_mass;  // count and mass of every better token
  u64 found_word, found_mass;
  i32 cached_bucket; // the bucket whose sorted candidates s_cand holds (-1: none)
  u32 gathered;      // a search has gathered candidates before
  u32 flags;         // FilterArgs.flags
  u32 refine_n;      // a refinement pass's kept candidates
  float t_lo, t_hi;  // the gather's bucket bounds (DF_FLAG_SHARED_BOUNDS: warp 0's)
  u64 write_dst;     // DF_FLAG_FUSED_WRITE: this block's output slice, which the next gather writes (0: none)
  u32 fused;         // ... 0: the row takes the write pass; 1: written by the gather, members to fix (mine_n); 2: the
  u32 mine_n;        //     gather wrote but its bucket overflowed (the write pass follows); this block's members
  float f_lo, f_hi;  // ... that gather's bucket bounds (a member: x >= f_lo, and below f_hi if f_bounded): an
  u32 f_bounded;     //     overflowing bucket's write pass stores only groups holding a member
#ifdef DF_TRACE
  long long* trace;  // this block's DF_TRACE_SLOTS clock64() marks, or null (an untraced row)
#endif
};

// Phase timestamps for tools/trace_cluster_filter.py (compiled with -DDF_TRACE only; the default build has none):
// thread 0 of every block of rows 0 and rows / 2 records clock64() at each mark into the stats buffer after its two
// words, [2 rows][DF_C blocks][DF_TRACE_SLOTS] int64 (the tool allocates it).
#define DF_TRACE_SLOTS 24
#ifdef DF_TRACE
#define DF_MARK(k) do { if (threadIdx.x == 0 && sh.trace) sh.trace[k] = clock64(); } while (0)
#else
#define DF_MARK(k) do { } while (0)
#endif

__device__ __forceinline__ u32 df_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void df_cluster_arrive() {  // df_cluster_sync's first half (DF_FLAG_SPLIT_FINAL)
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void df_cluster_wait() {  // ... and its second half
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void df_cluster_sync() {
#ifdef DF_RELAXED_EXPERIMENT  // timing experiment only (tools/trace_cluster_filter.py): no release, so no GPU fence
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ u32 df_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 df_map(u32 addr, u32 rank) {  // the same variable in block `rank`'s shared memory
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ u64 df_ld64(u32 addr) {
  u64 v;
  asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ u32 df_ld32(u32 addr) {
  u32 v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void df_st64(u32 addr, u64 v) {
  asm volatile("st.shared::cluster.u64 [%0], %1;" :: "r"(addr), "l"(v) : "memory");
}
__device__ __forceinline__ u32 df_atom_add(u32 addr, u32 v) {
  u32 old;
  asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}

// Shared-memory add, no result. No "memory" clobber: the histogram loops' loads of s_x may then be scheduled ahead of
// the adds (with it, each load waited for the previous add); every read of the bins follows a barrier.
__device__ __forceinline__ void df_red(u32 addr, u32 v) {
  asm volatile("red.shared.add.u32 [%0], %1;" :: "r"(addr), "r"(v));
}
// One token into bin `bin` of a three-word histogram whose words start at shared address `base` (count, then
// mass & 0xFFFF, then mass >> 16, `stride` bytes apart): three adds without a branch (q = 0 adds 0).
__device__ __forceinline__ void df_add(u32 base, u32 stride, u32 bin, u64 q) {
  const u32 a = base + 4u * bin;
  df_red(a, 1u);
  df_red(a + stride, (u32)q & 0xFFFFu);
  df_red(a + 2u * stride, (u32)(q >> 16));
}
// The mass words alone (DF_FLAG_UNCOUNTED): `base` the shared address of the mass & 0xFFFF words. (df_add keeps its
// own three adds: written through this, its address arithmetic compiled differently from the measured SASS.)
__device__ __forceinline__ void df_add_mass(u32 base, u32 stride, u32 bin, u64 q) {
  const u32 a = base + 4u * bin;
  df_red(a, (u32)q & 0xFFFFu);
  df_red(a + stride, (u32)(q >> 16));
}
// The count and mass of bin `bin` of a three-word histogram (words from `words`, `stride` words apart) summed over
// the cluster's blocks.
__device__ __forceinline__ void df_bin_sum(const u32* words, u32 stride, u32 bin, u64& cnt, u64& mass) {
  cnt = 0;
  mass = 0;
  const u32 a = df_addr(words + bin);
#pragma unroll
  for (u32 r = 0; r < DF_C; ++r) {
    const u32 ra = df_map(a, r);
    cnt += df_ld32(ra);
    mass += df_ld32(ra + 4u * stride) + ((u64)df_ld32(ra + 8u * stride) << 16);
  }
}

__device__ __forceinline__ u64 df_shfl_up64(u64 v, int off) {
  const u32 lo = __shfl_up_sync(0xFFFFFFFFu, (u32)v, off), hi = __shfl_up_sync(0xFFFFFFFFu, (u32)(v >> 32), off);
  return ((u64)hi << 32) | lo;
}

// Inclusive prefix sums over the block's threads (thread order) of two values at once; every thread calls it.
__device__ __forceinline__ void df_scan2(u64& a, u64& b, FilterShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const u64 ta = df_shfl_up64(a, off), tb = df_shfl_up64(b, off);
    if (lane >= off) { a += ta; b += tb; }
  }
  if (lane == 31) { sh.warp_sum[warp] = a; sh.warp_sum2[warp] = b; }
  __syncthreads();
  u64 add_a = 0, add_b = 0;
  for (int w = 0; w < warp; ++w) { add_a += sh.warp_sum[w]; add_b += sh.warp_sum2[w]; }
  __syncthreads();
  a += add_a;
  b += add_b;
}

// Thread t holds (count, mass) of the t-th item in ranking order (better first); selects the item where the target
// falls: the count reaches `target` (by_mass false) or the mass does; it becomes sh.sel with sh.sel_cnt, and its
// better items' count and mass are added to sh.base_cnt / base_mass. The caller guarantees the target is reached
// within the items; if no item holds it (a broken invariant), sh.sel is DF_NONE. Ends with a block barrier.
#define DF_NONE 0xFFFFFFFFu
__device__ __forceinline__ void df_select(u64 cnt, u64 mass, bool by_mass, u64 target, FilterShared& sh) {
  __syncthreads();  // every thread has read the previous selection (sh.sel, sel_cnt) before it is reset below
  const u64 base_cnt = sh.base_cnt, base_mass = sh.base_mass;
  if (threadIdx.x == 0) sh.sel = DF_NONE;  // (df_scan2's barriers order it before the selecting thread's write)
  u64 c = cnt, s = mass;
  df_scan2(c, s, sh);  // inclusive
  const u64 before = by_mass ? base_mass + s - mass : base_cnt + c - cnt;
  const u64 upto = by_mass ? base_mass + s : base_cnt + c;
  if (before < target && target <= upto) {  // exactly one item (an empty one has before == upto)
    sh.sel = threadIdx.x;
    sh.sel_cnt = (u32)cnt;
    sh.base_cnt = base_cnt + c - cnt;
    sh.base_mass = base_mass + s - mass;
  }
  __syncthreads();
}

// A search whose target no item held (never, unless an invariant broke: the sums are exact): the row keeps every
// token (found_word 0; with DF_FLAG_FUSED_WRITE, whose gather has written the row, every token at or above the
// gathered bucket, the others -inf) and stats[1] records it; every block of the cluster fails at the same selection,
// so the cluster barrier here is matched (it also stands for the pass's barrier that would have followed).
__device__ __noinline__ void df_fail(FilterShared& sh, u32* stats, u32 rank) {
  if (threadIdx.x == 0) {
    sh.found_word = 0;
    sh.found_mass = 0;
    if (rank == 0) atomicOr(stats + 1, 1u);
  }
  df_cluster_sync();
}

// The level-1 bucket holding a target (module doc, step 3): the range (the DF_C blocks' totals), then the bucket (its
// block's DF_RANGE reduced sums); sh.base_cnt / base_mass the count and mass of every better bucket, sh.sel_cnt the
// bucket's count. Returns the bucket, or DF_NONE (a broken invariant: the caller fails the search).
__device__ __forceinline__ u32 df_locate(bool by_mass, u64 target, const u32* s_rcnt, const u64* s_rmass,
                                         FilterShared& sh) {
  const int tid = threadIdx.x;
  if (tid == 0) { sh.base_cnt = 0; sh.base_mass = 0; }
  __syncthreads();
  {
    u64 cnt = 0, mass = 0;
    if (tid < DF_C) {  // block r's totals, in rank order
      cnt = df_ld32(df_map(df_addr(&sh.tot_cnt), tid));
      mass = df_ld64(df_map(df_addr(&sh.tot_mass), tid));
    }
    df_select(cnt, mass, by_mass, target, sh);
  }
  if (sh.sel == DF_NONE) return DF_NONE;
  const u32 range = sh.sel;
  {  // thread t: the block's buckets [DF_PER t, DF_PER t + DF_PER), summed
    u64 cnt = 0, mass = 0;
#pragma unroll
    for (int e = 0; e < DF_PER; ++e) {
      cnt += df_ld32(df_map(df_addr(&s_rcnt[DF_PER * tid + e]), range));
      mass += df_ld64(df_map(df_addr(&s_rmass[DF_PER * tid + e]), range));
    }
    df_select(cnt, mass, by_mass, target, sh);
  }
#if DF_PER > 1
  if (sh.sel == DF_NONE) return DF_NONE;
  const u32 group = sh.sel;
  {  // the bucket within the selected thread's group (threads 0 .. DF_PER - 1; the base moved to the group's start)
    u64 cnt = 0, mass = 0;
    if (tid < DF_PER) {
      cnt = df_ld32(df_map(df_addr(&s_rcnt[DF_PER * group + tid]), range));
      mass = df_ld64(df_map(df_addr(&s_rmass[DF_PER * group + tid]), range));
    }
    df_select(cnt, mass, by_mass, target, sh);
  }
  return sh.sel == DF_NONE ? DF_NONE : range * DF_RANGE + DF_PER * group + sh.sel;
#else
  return sh.sel == DF_NONE ? DF_NONE : range * DF_RANGE + sh.sel;
#endif
}

// df_thresholds by 16-way rounds (df_probe / df_narrow), lanes 0-15 searching for b1 and lanes 16-31 for b2 at once
// (DF_FLAG_WARP_THRESHOLDS; every lane of the warp calls it and gets both results; same values as df_thresholds).
__device__ __forceinline__ void df_thresholds_warp(float m, i32 b1, i32 b2, float& t1, float& t2) {
  const u32 lane = threadIdx.x & 31u, half = lane >> 4, j = lane & 15u;
  const i32 b = half ? b2 : b1;
  const u32 bottom = df_fkey(-as_float(0x7f800000u)), top = df_fkey(m);
  u32 lo = bottom, hi = top;
  while (__any_sync(0xFFFFFFFFu, hi - lo > 1)) {
    const u32 probe = df_probe(lo, hi, j);
    const bool ok = j == 15u || probe == hi || (i32)df_bucket(df_fkey_value(probe), m) <= b;
    const u32 bits = (__ballot_sync(0xFFFFFFFFu, ok) >> (16u * half)) & 0x7FFFu;
    if (hi - lo > 1) df_narrow(lo, hi, bits);
  }
  const u32 hi1 = __shfl_sync(0xFFFFFFFFu, hi, 0), hi2 = __shfl_sync(0xFFFFFFFFu, hi, 16);
  const u32 bottom_bucket = df_bucket(df_fkey_value(bottom), m);
  const float inf = as_float(0x7f800000u);
  t1 = b1 < 0 ? inf : ((i32)bottom_bucket <= b1 ? -inf : df_fkey_value(hi1));
  t2 = b2 < 0 ? inf : ((i32)bottom_bucket <= b2 ? -inf : df_fkey_value(hi2));
}

// Narrow `count` (> limit: DF_SMALL, or DF_DEEP for a top-p search with DF_FLAG_DEEP_REFINE) unsorted candidates at
// the front of s_cand to those of the 256-way digit where the target falls, pass after pass, until <= limit remain (at
// the front of s_cand). Every block of the cluster does
// the same on the same words (no cluster barrier). A pass's digit is the 8 bits below and including the highest bit
// where the candidates' words differ, so it keeps one value of that bit (progress); digits descending (better first);
// df_select moves sh.base_cnt / base_mass past the better digits, as df_search's narrowing passes do. Returns the
// remaining count; 0 if no digit held the target (a broken invariant: the caller fails the search). SPARSE
// (DF_FLAG_SPARSE_DIGIT): a pass whose 8 highest differing bits are not adjacent takes them as its digit
// (df_sparse_digit, the same for every thread: the pass's OR / AND); SPARSE = false is the contiguous digit alone.
template <bool SPARSE>
__device__ __noinline__ u32 df_refine(u32 count, u32 limit, bool masses, bool by_mass, u64 target, float m,
                                      u64* s_cand, u32* s_dig, FilterShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const u32 dig = df_addr(s_dig);
  while (count > limit) {
    u64 w_or = 0, w_and = ~0ull;
    for (int i = tid; i < (int)count; i += DF_T) {
      const u64 w = s_cand[i];
      w_or |= w;
      w_and &= w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      w_or |= (u64)shfl_xor_i64((i64)w_or, off);  // (common.cuh)
      w_and &= (u64)shfl_xor_i64((i64)w_and, off);
    }
    if (lane == 0) { sh.warp_sum[warp] = w_or; sh.warp_sum2[warp] = w_and; }
    for (int i = tid; i < 3 * 256; i += DF_T) s_dig[i] = 0;
    if (tid == 0) sh.refine_n = 0;
    __syncthreads();
    w_or = 0;
    w_and = ~0ull;
#pragma unroll
    for (int w = 0; w < DF_T / 32; ++w) { w_or |= sh.warp_sum[w]; w_and &= sh.warp_sum2[w]; }
    const int top = 63 - __clzll((long long)(w_or ^ w_and));  // the words are unique and count > 1: they differ
    const int shift = top >= 7 ? top - 7 : 0;
    DfPicks picks = {0};
    bool sparse = false;  // (block-uniform)
    if (SPARSE) {
      picks = df_sparse_picks(w_or ^ w_and);
      sparse = df_pick(picks, 0) - df_pick(picks, 7) != 7;  // (adjacent picks: the contiguous digit, the same values)
    }
    for (int i = tid; i < (int)count; i += DF_T) {
      const u64 w = s_cand[i];
      const u32 digit = SPARSE && sparse ? df_sparse_digit(w, picks) : (u32)(w >> shift) & 255u;
      df_add(dig, 4u * 256u, digit, masses ? df_weight(df_word_value(w), m) : 0ull);
    }
    __syncthreads();
    const u32 d = 255u - (u32)tid;  // descending digits: better first
    const u64 cnt = s_dig[d], mass = (u64)s_dig[256 + d] + ((u64)s_dig[512 + d] << 16);
    // (without masses sh.base_mass stays as it was: only searches whose mass nothing reads run so, top-k without
    // top-p and the p <= 0 search)
    df_select(cnt, mass, by_mass, target, sh);  // (its first barrier: every read of warp_sum above is done)
    if (sh.sel == DF_NONE) return 0;
    const u32 want = 255u - sh.sel;
    u64 keep[DF_CAP / DF_T];
    bool kept[DF_CAP / DF_T];
#pragma unroll
    for (int e = 0; e < DF_CAP / DF_T; ++e) {
      const int i = tid + e * DF_T;
      keep[e] = i < (int)count ? s_cand[i] : 0ull;
      kept[e] = i < (int)count
                && (SPARSE && sparse ? df_sparse_digit(keep[e], picks) : (u32)(keep[e] >> shift) & 255u) == want;
    }
    __syncthreads();  // every candidate read before the kept ones move to the front
#pragma unroll
    for (int e = 0; e < DF_CAP / DF_T; ++e) {
      if (kept[e]) s_cand[atomicAdd(&sh.refine_n, 1u)] = keep[e];
    }
    __syncthreads();
    count = sh.sel_cnt;
  }
  return count;
}

// Membership bits of a group of four tokens (bit e: token e): x >= t_lo, and below t_hi where `bounded`.
__device__ __forceinline__ u32 df_member_bits(float4 f, float t_lo, float t_hi, bool bounded) {
  return (u32)(f.x >= t_lo && !(bounded && f.x >= t_hi)) | ((u32)(f.y >= t_lo && !(bounded && f.y >= t_hi)) << 1)
         | ((u32)(f.z >= t_lo && !(bounded && f.z >= t_hi)) << 2) | ((u32)(f.w >= t_lo && !(bounded && f.w >= t_hi)) << 3);
}

// A gather's members of this thread, bit b of `mask` (vec: token 4 ((c0 + b / 4) DF_T + tid) + b % 4, else token
// (c0 + b) DF_T + tid of the slice): slots claimed with one cluster atomic per warp on rank 0's counter, and the
// members' words stored into every block's s_cand at slot - `base` (only those below DF_CAP: an uncounted gather may
// find more, then only counted). Every lane of the warp calls it.
__device__ __forceinline__ void df_store_members(u64 mask, bool vec, int c0, const float* s_x, i64 lo, u32 counter,
                                                 u32 base, u64* s_cand) {
  const int tid = threadIdx.x, lane = tid & 31;
  const u32 mine = (u32)__popcll(mask);
  u32 incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const u32 t = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= off) incl += t;
  }
  const u32 total = __shfl_sync(0xFFFFFFFFu, incl, 31);
  if (total == 0) return;  // warp-uniform
  DF_ROW_POLICY;
  u32 slot = 0;
  if (lane == 0) slot = df_atom_add(counter, total);
  slot = __shfl_sync(0xFFFFFFFFu, slot, 0) - base + incl - mine;
  while (mask != 0 && slot < DF_CAP) {
    const int b = __ffsll((long long)mask) - 1;
    mask &= mask - 1;
    const int i = vec ? 4 * ((c0 + (b >> 2)) * DF_T + tid) + (b & 3) : (c0 + b) * DF_T + tid;
    const u64 w = df_word(DF_AT(i), lo + i);
#pragma unroll
    for (u32 r = 0; r < DF_C; ++r) df_st64(df_map(df_addr(&s_cand[slot]), r), w);
    ++slot;
  }
}

// DF_FLAG_BATCHED_GATHER's gather loop (df_collect): a slice's 16-byte groups read DF_GATHER_BATCH at a time, all in
// flight before any is compared (the partial last group of a slice apart), members marked in 64-bit masks and stored
// by df_store_members. WRITE (DF_FLAG_FUSED_WRITE, the L2-row build): each group also stored to `wdst` as x where
// x >= t_lo (the bucket and every better token), else -inf (a template, so the loop without the stores compiles
// as before).
template <bool WRITE>
__device__ __forceinline__ void df_gather_batched(const float* s_x, int n, i64 lo, u64 policy, float t_lo, float t_hi,
                                                  bool bounded, u32 counter, u32 base, u64* s_cand, float* wdst) {
  const int tid = threadIdx.x;
  const u64 df_policy = policy;  // (DF_AT4: the L2-row build's loads)
  (void)df_policy;
  const int n4 = (n + 3) / 4;  // groups of four tokens, a partial last one (n % 4 != 0: the row's last slice) included
  const int rounds4 = (n4 + DF_T - 1) / DF_T;
  const float ninf = -__int_as_float(0x7f800000);
  const int whole = n / 4;  // groups of four tokens; a last partial one (n % 4 tokens) after the loop
  for (int c0 = 0; c0 < rounds4; c0 += 16) {
    u64 mask = 0;
#pragma unroll
    for (int j = 0; j < 16; j += DF_GATHER_BATCH) {
      float4 f[DF_GATHER_BATCH];
#pragma unroll
      for (int u = 0; u < DF_GATHER_BATCH; ++u) {  // (predicated reads, no branch between them: all in flight)
        const int v = (c0 + j + u) * DF_T + tid;
        f[u] = v < whole ? DF_AT4(v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < DF_GATHER_BATCH; ++u) {
        const int v = (c0 + j + u) * DF_T + tid;
        if (v < whole) {
          mask |= (u64)df_member_bits(f[u], t_lo, t_hi, bounded) << (4 * (j + u));
          if (WRITE) {
            store_cs16(wdst + 4 * v, __float_as_uint(f[u].x >= t_lo ? f[u].x : ninf),
                       __float_as_uint(f[u].y >= t_lo ? f[u].y : ninf), __float_as_uint(f[u].z >= t_lo ? f[u].z : ninf),
                       __float_as_uint(f[u].w >= t_lo ? f[u].w : ninf));
          }
        }
      }
    }
    df_store_members(mask, true, c0, s_x, lo, counter, base, s_cand);
  }
  if (whole < n4) {  // the partial group, by its thread (every warp calls df_store_members: a warp collective)
    u64 mask = 0;
    if (tid == whole % DF_T) {
      const float4 f = DF_AT4_PART(whole, n);
      mask = df_member_bits(f, t_lo, t_hi, bounded) & ((1u << (n - 4 * whole)) - 1u);
      if (WRITE) {
        const int rest = n - 4 * whole;  // 1 to 3 tokens
        wdst[4 * whole] = f.x >= t_lo ? f.x : ninf;
        if (rest > 1) wdst[4 * whole + 1] = f.y >= t_lo ? f.y : ninf;
        if (rest > 2) wdst[4 * whole + 2] = f.z >= t_lo ? f.z : ninf;
      }
    }
    df_store_members(mask, true, whole / DF_T, s_x, lo, counter, base, s_cand);
  }
}

// Gather the `count` tokens of the cluster's row that are in `bucket` (upto: in any bucket <= `bucket`; else also
// with the word's bits above `shift` equal to `prefix`, shift 64: none) into every block's s_cand, sort them there
// (descending words), and write their inclusive masses (q when `masses`, else 0) to s_hist. With DF_FLAG_REFINE and
// `refine` (a search: `by_mass`, `target`, sh.base_cnt / base_mass as df_select leaves them), a bucket of more than
// DF_SMALL tokens is first narrowed to the digit holding the target (df_refine), which moves the bases; returns the
// count of sorted candidates (0: a refinement found no digit at the target, a broken invariant). `count` DF_UNCOUNTED
// (DF_FLAG_UNCOUNTED; shift 64, not upto): the gather counts the bucket itself (sh.gather_count), and one of more than
// DF_CAP members returns DF_OVERFLOW unsorted (the caller narrows, then gathers again). Ends with a block barrier;
// the next gather must follow a cluster barrier (df_search's, or the caller's).
__device__ __noinline__ u32 df_collect(const float* s_x, int n, i64 lo, float m, u32 bucket, bool upto, int shift,
                                       u64 prefix, u32 count, bool masses, u64* s_hist, u64* s_cand,
                                       FilterShared& sh, u32 rank, bool refine, bool by_mass, u64 target,
                                       u32* s_dig) {
  const int tid = threadIdx.x, lane = tid & 31;
  if (sh.gathered) df_cluster_sync();  // every block is done with its previous candidates and counts
  const u32 counter = df_map(df_addr(&sh.counter), 0);
  const u32 base = sh.counter_base;
  const int rounds = (n + DF_T - 1) / DF_T;
  const u32 flags = DF_FLAGS_OF(sh.flags);
  DF_ROW_POLICY;
  if ((flags & DF_FLAG_MASK_GATHER) && shift == 64) {
    // membership by two fp32 compares against the bucket's bounds (df_thresholds: exactly df_bucket's decision), 4
    // tokens per 16-byte load, 64 tokens per mask; members: x >= t_lo, and below t_hi unless `upto` or bucket 0
    float t_lo, t_hi;
    if (DF_NEW_FLAGS && (flags & (DF_FLAG_WARP_THRESHOLDS | DF_FLAG_SHARED_BOUNDS))
                            == (DF_FLAG_WARP_THRESHOLDS | DF_FLAG_SHARED_BOUNDS)) {
      if (tid < 32) {  // (sh.t_lo / t_hi: last read by the previous gather, behind this gather's cluster barrier)
        df_thresholds_warp(m, (i32)bucket, upto ? -1 : (i32)bucket - 1, t_lo, t_hi);
        if (tid == 0) { sh.t_lo = t_lo; sh.t_hi = t_hi; }
      }
      __syncthreads();
      t_lo = sh.t_lo;
      t_hi = sh.t_hi;
    } else if (flags & DF_FLAG_WARP_THRESHOLDS) {
      df_thresholds_warp(m, (i32)bucket, upto ? -1 : (i32)bucket - 1, t_lo, t_hi);
    } else {
      df_thresholds(m, (i32)bucket, upto ? -1 : (i32)bucket - 1, t_lo, t_hi);
    }
    const bool bounded = !upto && bucket != 0;
    const int n4 = (n + 3) / 4;  // the slice is a multiple of 4 tokens: the last group's loads stay inside it
    const int rounds4 = (n4 + DF_T - 1) / DF_T;
    if (DF_NEW_FLAGS && (flags & DF_FLAG_BATCHED_GATHER)) {
#ifdef DF_L2_ROWS
      if (sh.write_dst != 0) {  // DF_FLAG_FUSED_WRITE (block-uniform): the same gather, storing the row as it goes
        df_gather_batched<true>(s_x, n, lo, df_policy, t_lo, t_hi, bounded, counter, base, s_cand,
                                reinterpret_cast<float*>(sh.write_dst));
        if (tid == 0) {  // the bucket's bounds, for the members-only write pass of an overflowing bucket
          sh.f_lo = t_lo;
          sh.f_hi = t_hi;
          sh.f_bounded = bounded;
        }
      } else {
        df_gather_batched<false>(s_x, n, lo, df_policy, t_lo, t_hi, bounded, counter, base, s_cand, nullptr);
      }
#else
      df_gather_batched<false>(s_x, n, lo, 0, t_lo, t_hi, bounded, counter, base, s_cand, nullptr);
#endif
    } else {  // (df_member_bits's expression written out: the measured SASS of this loop; calling it compiles differently)
      for (int c0 = 0; c0 < rounds4; c0 += 16) {
        u64 mask = 0;
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          const int v = (c0 + j) * DF_T + tid;
          if (v < n4) {
            const float4 f = DF_AT4_PART(v, n);
            u32 bits = (u32)(f.x >= t_lo && !(bounded && f.x >= t_hi)) | ((u32)(f.y >= t_lo && !(bounded && f.y >= t_hi)) << 1)
                       | ((u32)(f.z >= t_lo && !(bounded && f.z >= t_hi)) << 2)
                       | ((u32)(f.w >= t_lo && !(bounded && f.w >= t_hi)) << 3);
            if (4 * v + 4 > n) bits &= (1u << (n - 4 * v)) - 1u;  // tokens past the slice's end
            mask |= (u64)bits << (4 * j);
          }
        }
        df_store_members(mask, true, c0, s_x, lo, counter, base, s_cand);
      }
    }
  } else if (flags & DF_FLAG_MASK_GATHER) {
    // membership of up to 64 of this thread's tokens at a time in a register mask (independent iterations: the
    // loads and bucket arithmetic overlap), then one cluster atomic per warp and the members' words stored
    for (int c0 = 0; c0 < rounds; c0 += 64) {
      u64 mask = 0;
#pragma unroll 8
      for (int j = 0; j < 64; ++j) {
        const int i = (c0 + j) * DF_T + tid;
        if (i < n) {
          const float x = DF_AT(i);
          const u32 b = df_bucket(x, m);
          bool member = upto ? b <= bucket : b == bucket;
          if (member && shift != 64) member = (df_word(x, lo + i) >> shift) == prefix;
          mask |= (u64)member << j;
        }
      }
      df_store_members(mask, false, c0, s_x, lo, counter, base, s_cand);
    }
  } else {
    for (int it = 0; it < rounds; ++it) {  // warp-uniform trip count: ballots below
      const int i = it * DF_T + tid;
      bool member = false;
      u64 w = 0;
      if (i < n) {
        const float x = DF_AT(i);
        const u32 b = df_bucket(x, m);
        if (upto ? b <= bucket : b == bucket) {
          w = df_word(x, lo + i);
          member = shift == 64 || (w >> shift) == prefix;
        }
      }
      const u32 ballot = __ballot_sync(0xFFFFFFFFu, member);
      if (ballot == 0) continue;
      const int leader = __ffs(ballot) - 1;
      u32 slot = 0;
      if (lane == leader) slot = df_atom_add(counter, __popc(ballot));
      slot = __shfl_sync(0xFFFFFFFFu, slot, leader) - base + __popc(ballot & ((1u << lane) - 1u));
      if (member && slot < DF_CAP) {
#pragma unroll
        for (u32 r = 0; r < DF_C; ++r) df_st64(df_map(df_addr(&s_cand[slot]), r), w);
      }
    }
  }
  DF_MARK(13);
  df_cluster_sync();  // every block's candidates complete
  DF_MARK(14);
  if (DF_NEW_FLAGS && count == DF_UNCOUNTED) {  // the bucket's members: rank 0's counter, complete behind the barrier
    if (tid == 0) sh.gather_count = df_ld32(counter) - base;
    __syncthreads();
    count = sh.gather_count;
  }
#ifdef DF_L2_ROWS
  if (DF_NEW_FLAGS && sh.write_dst != 0) {  // (block-uniform) the gather wrote the row: keep this block's members'
    // slice indices (s_cand holds all members, unsorted, until refinement and sorting reorder it; s_hist past
    // DF_CAP is free behind the gather's cluster barrier: every block has reduced its level-1 bins)
    u32* const mine = reinterpret_cast<u32*>(s_hist + DF_CAP);
    if (count <= DF_CAP) {
      for (int i = tid; i < (int)count; i += DF_T) {
        const i64 index = df_word_index(s_cand[i]);
        if (index >= lo && index < lo + n) mine[atomicAdd(&sh.mine_n, 1u)] = (u32)(index - lo);
      }
    }
    __syncthreads();  // every thread has read write_dst
    if (tid == 0) {
      sh.fused = count <= DF_CAP ? 1u : 2u;
      sh.write_dst = 0;  // (no later gather of the row writes)
    }
  }
#endif
  if (tid == 0) {
    sh.counter_base = base + count;  // (no block adds to the counter again before the next gather's cluster barrier)
    sh.gathered = 1;
  }
  if (DF_NEW_FLAGS && count > DF_CAP) {  // (uncounted only: the slots past DF_CAP were counted, not stored)
    __syncthreads();
    return DF_OVERFLOW;
  }
  const bool small_sort = (flags & DF_FLAG_REFINE) != 0;
  const u32 limit = DF_NEW_FLAGS && by_mass && (flags & DF_FLAG_DEEP_REFINE) ? DF_DEEP : DF_SMALL;
  if (small_sort && refine && count > limit) {
    count = DF_FIXED_ONLY && (flags & DF_FLAG_SPARSE_DIGIT)
                ? df_refine<true>(count, limit, masses, by_mass, target, m, s_cand, s_dig, sh)
                : df_refine<false>(count, limit, masses, by_mass, target, m, s_cand, s_dig, sh);
    if (count == 0) return 0;
  }
  const int size = count <= 32 ? 32 : 1 << (32 - __clz(count - 1));  // a power of two >= count
  if (small_sort && count <= DF_SMALL) {
    // rank by counting: thread t's candidate goes where the number of better candidates says (words are unique)
    u64 w = 0;
    u32 better = 0;
    if (tid < (int)count) {
      w = s_cand[tid];
#pragma unroll 4
      for (u32 j = 0; j < count; ++j) better += s_cand[j] > w ? 1u : 0u;
    }
    __syncthreads();
    if (tid < (int)count) s_cand[better] = w;
    __syncthreads();
  } else {
    for (int i = (int)count + tid; i < size; i += DF_T) s_cand[i] = 0;  // pads sort last
    __syncthreads();
    for (int k = 2; k <= size; k <<= 1) {  // bitonic sort, descending
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = tid; i < size; i += DF_T) {
          const int l = i ^ j;
          if (l > i) {
            const u64 x = s_cand[i], y = s_cand[l];
            if (((i & k) == 0) ? (x < y) : (x > y)) { s_cand[i] = y; s_cand[l] = x; }
          }
        }
        __syncthreads();
      }
    }
  }
  DF_MARK(15);
  // inclusive masses of the sorted candidates into s_hist (free after the level-1 reduction)
  const int per = size / DF_T > 0 ? size / DF_T : 1;
  u64 local = 0;
  if (tid * per < size) {
    for (int e = 0; e < per; ++e) {
      const int i = tid * per + e;
      const u64 q = (masses && i < (int)count) ? df_weight(df_word_value(s_cand[i]), m) : 0ull;
      local += q;
      s_hist[i] = local;
    }
  }
  u64 incl = local, unused = 0;
  df_scan2(incl, unused, sh);
  if (tid * per < size) {
    for (int e = 0; e < per; ++e) s_hist[tid * per + e] += incl - local;
  }
  __syncthreads();
  DF_MARK(16);
  return count;
}

// The candidate where a target falls among `count` sorted candidates whose better tokens count base_cnt and weigh
// base_mass (inclusive masses in s_hist): the (target - base_cnt)-th (by count) or the first whose inclusive mass
// reaches the target (by mass); sh.found_word / found_mass (0 / stats[1] if none: a broken invariant).
__device__ __forceinline__ void df_find(bool by_mass, u64 target, u32 count, u64 base_cnt, u64 base_mass,
                                        const u64* s_hist, const u64* s_cand, FilterShared& sh, u32 rank,
                                        u32* stats) {
  const int tid = threadIdx.x;
  if (tid == 0) sh.found_word = 0;  // (a real word is > 0: 0 after the search means nothing matched)
  __syncthreads();
  if (!by_mass) {
    if (tid == 0) {
      const int i = (int)(target - base_cnt) - 1;
      sh.found_word = s_cand[i];
      sh.found_mass = base_mass + s_hist[i];
    }
  } else {
    for (int i = tid; i < (int)count; i += DF_T) {
      const u64 upto = base_mass + s_hist[i], before = i == 0 ? base_mass : base_mass + s_hist[i - 1];
      if (before < target && target <= upto) {
        sh.found_word = s_cand[i];
        sh.found_mass = upto;
      }
    }
  }
  __syncthreads();
  if (tid == 0 && rank == 0 && sh.found_word == 0) atomicOr(stats + 1, 2u);
}

// The token at a target of the row's ranking (module doc, step 3): sh.found_word and sh.found_mass (the inclusive
// mass of every token up to it). Called by every thread of every block of the cluster alike. A search by mass after
// a histogram of masses only (sh.uncounted, DF_FLAG_UNCOUNTED): the bucket is gathered first, which counts it; the
// narrowing passes follow only if it held more than DF_CAP tokens.
__device__ __noinline__ void df_search(bool by_mass, u64 target, bool masses, const float* s_x, int n, i64 lo, float m,
                          u64* s_hist, u64* s_cand, u32* s_rcnt, u64* s_rmass, u32* s_dig, FilterShared& sh,
                          u32 rank, u32* stats) {
  const int tid = threadIdx.x;
  const bool counted = !DF_NEW_FLAGS || !(by_mass && sh.uncounted);
  const u32 bucket = df_locate(by_mass, target, s_rcnt, s_rmass, sh);
  DF_MARK(7);
  if (bucket == DF_NONE) return df_fail(sh, stats, rank);
  u32 count = sh.sel_cnt;
  if (!counted) {
    const u32 sorted = df_collect(s_x, n, lo, m, bucket, false, 64, 0, DF_UNCOUNTED, masses, s_hist, s_cand, sh,
                                  rank, true, by_mass, target, s_dig);
    if (sorted == 0) return df_fail(sh, stats, rank);
    if (sorted != DF_OVERFLOW) {
      DF_MARK(9);
      df_find(by_mass, target, sorted, sh.base_cnt, sh.base_mass, s_hist, s_cand, sh, rank, stats);
      DF_MARK(10);
      return;
    }
    count = sh.gather_count;  // more than DF_CAP: narrowed below, then gathered again
  }
  // narrowing passes on the word's bits while the range is too large to sort
  int shift = 64;
  u64 prefix = 0;
  const bool narrowed = count > DF_CAP;
  while (count > DF_CAP) {
    shift -= 8;
    for (int i = tid; i < 3 * 256; i += DF_T) s_dig[i] = 0;
    __syncthreads();
    const u32 dig = df_addr(s_dig);
    DF_ROW_POLICY;
    for (int i = tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      if (df_bucket(x, m) != bucket) continue;
      const u64 w = df_word(x, lo + i);
      if (shift < 56 && (w >> (shift + 8)) != prefix) continue;
      df_add(dig, 4u * 256u, (u32)(w >> shift) & 255u, masses ? df_weight(x, m) : 0ull);
    }
    df_cluster_sync();
    u64 cnt, mass;
    df_bin_sum(s_dig, 256u, 255u - (u32)tid, cnt, mass);  // descending digits: better first
    df_select(cnt, mass, by_mass, target, sh);
    if (sh.sel == DF_NONE) return df_fail(sh, stats, rank);
    prefix = (prefix << 8) | (255u - sh.sel);
    count = sh.sel_cnt;
    df_cluster_sync();  // every block has read every s_dig before the next pass clears its own
  }
  DF_MARK(8);
  // gather (unless s_cand already holds this bucket, sorted), sort, scan
  if (narrowed || sh.cached_bucket != (i32)bucket) {
    const u32 sorted = df_collect(s_x, n, lo, m, bucket, false, shift, prefix, count, masses, s_hist, s_cand, sh,
                                  rank, true, by_mass, target, s_dig);
    if (sorted == 0) return df_fail(sh, stats, rank);
    if (tid == 0) {
      sh.cached_bucket = narrowed || sorted != count ? -1 : (i32)bucket;  // a refined bucket is only part of it
      if (narrowed && rank == 0) atomicAdd(stats, 1u);
    }
    count = sorted;
  }
  DF_MARK(9);
  df_find(by_mass, target, count, sh.base_cnt, sh.base_mass, s_hist, s_cand, sh, rank, stats);
  DF_MARK(10);
}

// One token into the level-1 bins at `base`: its count (where `counts`; else the count words stay 0) and mass.
__device__ __forceinline__ void df_hist_add(u32 base, u32 bin, u64 q, bool counts) {
  if (counts) df_add(base, 4u * DF_NB, bin, q);
  else df_add_mass(base + 4u * DF_NB, 4u * DF_NB, bin, q);
}

// df_histogram's loop with masses, four tokens per step from group `tid` on (`next`: its first group, read): the
// weights and buckets of df_weight_finite / df_bucket_finite where FINITE (a finite row max), else the general ones;
// the counts too where COUNTS.
template <bool FINITE, bool COUNTS>
__device__ __forceinline__ void df_hist_masses(const float* s_x, int n4, float m, u32 base, float4 next) {
  DF_ROW_POLICY;
  for (int v = threadIdx.x; v < n4; v += DF_T) {
    const float4 f = next;
    if (v + DF_T < n4) next = DF_AT4(v + DF_T);
    u64 q0, q1, q2, q3;
    u32 b0, b1, b2, b3;
    if (FINITE) {
      q0 = df_weight_finite(f.x, m); q1 = df_weight_finite(f.y, m); q2 = df_weight_finite(f.z, m);
      q3 = df_weight_finite(f.w, m);
      b0 = df_bucket_finite(f.x, m); b1 = df_bucket_finite(f.y, m); b2 = df_bucket_finite(f.z, m);
      b3 = df_bucket_finite(f.w, m);
    } else {
      q0 = df_weight(f.x, m); q1 = df_weight(f.y, m); q2 = df_weight(f.z, m); q3 = df_weight(f.w, m);
      b0 = df_bucket(f.x, m); b1 = df_bucket(f.y, m); b2 = df_bucket(f.z, m); b3 = df_bucket(f.w, m);
    }
    df_hist_add(base, b0, q0, COUNTS);
    df_hist_add(base, b1, q1, COUNTS);
    df_hist_add(base, b2, q2, COUNTS);
    df_hist_add(base, b3, q3, COUNTS);
  }
}

// The level-1 histogram of this block's slice (module doc, step 2): counts, and q with `masses` (without the counts
// where sh.uncounted, DF_FLAG_UNCOUNTED: the count words stay 0), into the zeroed bins; then, after a cluster
// barrier, this block's DF_RANGE buckets summed over the cluster into s_rcnt / s_rmass and its totals into
// sh.tot_cnt / tot_mass. Ends with a cluster barrier (the sums complete everywhere; the bins free).
__device__ __noinline__ void df_histogram(const float* s_x, int n, float m, bool masses, u32* bins, u32* s_rcnt,
                                          u64* s_rmass, FilterShared& sh, u32 rank) {
  const int tid = threadIdx.x;
  const u32 base = df_addr(bins);
  const bool counts = !DF_NEW_FLAGS || !sh.uncounted;
  DF_ROW_POLICY;
  if (DF_FLAGS_OF(sh.flags) & DF_FLAG_ILP) {
    // four tokens per step: independent chains the scheduler interleaves (then 4 or 12 adds); the ragged tail of the
    // last block's slice one token at a time (the order of integer adds does not matter)
    const int n4 = n / 4;
    // the next group read before this one is used (the L2-row build's reads then wait behind a group's arithmetic,
    // not before it)
    float4 next = tid < n4 ? DF_AT4(tid) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const bool finite = DF_NEW_FLAGS && (DF_FLAGS_OF(sh.flags) & DF_FLAG_FINITE_WEIGHT)
                        && m < __int_as_float(0x7f800000);  // (m > -inf)
    if (masses && counts) {
      if (finite) df_hist_masses<true, true>(s_x, n4, m, base, next);
      else df_hist_masses<false, true>(s_x, n4, m, base, next);
    } else if (masses) {
      if (finite) df_hist_masses<true, false>(s_x, n4, m, base, next);
      else df_hist_masses<false, false>(s_x, n4, m, base, next);
    } else {
#pragma unroll 2
      for (int v = tid; v < n4; v += DF_T) {
        const float4 f = next;
        if (v + DF_T < n4) next = DF_AT4(v + DF_T);
        const u32 b0 = df_bucket(f.x, m), b1 = df_bucket(f.y, m), b2 = df_bucket(f.z, m), b3 = df_bucket(f.w, m);
        df_red(base + 4u * b0, 1u);
        df_red(base + 4u * b1, 1u);
        df_red(base + 4u * b2, 1u);
        df_red(base + 4u * b3, 1u);
      }
    }
    for (int i = 4 * n4 + tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      if (masses && counts) df_add(base, 4u * DF_NB, df_bucket(x, m), df_weight(x, m));
      else if (masses) df_add_mass(base + 4u * DF_NB, 4u * DF_NB, df_bucket(x, m), df_weight(x, m));
      else df_red(base + 4u * df_bucket(x, m), 1u);
    }
  } else if (masses) {
#pragma unroll 4
    for (int i = tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      df_add(base, 4u * DF_NB, df_bucket(x, m), df_weight(x, m));
    }
  } else {
#pragma unroll 4
    for (int i = tid; i < n; i += DF_T) df_red(base + 4u * df_bucket(DF_AT(i), m), 1u);
  }
  DF_MARK(18);
  df_cluster_sync();
  DF_MARK(19);
  u64 cnt = 0, mass = 0;
#pragma unroll
  for (int e = 0; e < DF_PER; ++e) {  // thread t: buckets [DF_PER t, DF_PER t + DF_PER) of the block's range
    u64 c, s;
#if DF_C * DF_RANGE > DF_NB  // (5 to 7 blocks: the last block's range ends past the last bucket; those stay empty)
    const u32 bucket = rank * DF_RANGE + DF_PER * tid + e;
    c = 0;
    s = 0;
    if (bucket < DF_NB) df_bin_sum(bins, DF_NB, bucket, c, s);
#else
    df_bin_sum(bins, DF_NB, rank * DF_RANGE + DF_PER * tid + e, c, s);
#endif
    s_rcnt[DF_PER * tid + e] = (u32)c;
    s_rmass[DF_PER * tid + e] = s;
    cnt += c;
    mass += s;
  }
  df_scan2(cnt, mass, sh);
  if (tid == DF_T - 1) { sh.tot_cnt = (u32)cnt; sh.tot_mass = mass; }
  df_cluster_sync();
}

__device__ __forceinline__ void df_copy(const float* s_x, float* dst, int n, bool vec) {
  DF_ROW_POLICY;
  if (vec) {
    for (int i = threadIdx.x; i < n / 4; i += DF_T) reinterpret_cast<float4*>(dst)[i] = DF_AT4(i);
    for (int i = (n / 4) * 4 + threadIdx.x; i < n; i += DF_T) dst[i] = DF_AT(i);
  } else {
    for (int i = threadIdx.x; i < n; i += DF_T) dst[i] = DF_AT(i);
  }
}

__device__ __forceinline__ void df_track(float x, float& mx, u32& nan) {
  mx = x > mx ? x : mx;
  nan |= x != x;
}

// -DDF_PERSIST (verify/cuda_filtering.py FLAG_PERSIST): persistent clusters. Cluster c filters rows c, c + G,
// c + 2 G, ... of the G launched clusters (as many as fit at once: no cluster waits for a launch, no wave of clusters
// waits for its slowest row), and this block's slice of the cluster's next row is prefetched into L2 while a row is
// filtered (the resident build at the row's start, the L2-row build when its row is read a last time), so a row's
// first read comes from L2. The row's body is then a function, df_row (inlined into the loop: 0 / 32 bytes of spill
// in the resident / L2-row build, none in the hot loops; not inlined it spilled in them), made of the one-row kernel's
// text, whose preprocessed source, and SASS, stay the measured ones (tools/cuda_sass.py). Written without a GPU
// (2026-12-05); run on the H200 later that day: equal to the sort reference in every GPU test, memcheck and racecheck
// clean in the DF_CARRY builds (flags 415 / 447, persistent loop included), and slower than the one-row launches for top-p alone (verify/cuda_filtering.py).
#if defined(DF_CARRY) && !defined(DF_PERSIST)
#error "DF_CARRY is an option of the persistent builds (-DDF_PERSIST)"
#endif
#ifdef DF_PERSIST
// This block's slice of row `next` into L2, one bulk prefetch: a hint (a row that does not start on 16 bytes is left
// out, and so are the slice's last n % 4 tokens).
__device__ __forceinline__ void df_prefetch_next(const FilterArgs& a, i64 next, i64 lo, int n) {
  const float* p = reinterpret_cast<const float*>(a.logits) + next * a.in_stride + lo;
  if ((reinterpret_cast<u64>(p) & 15) == 0) prefetch_l2_bulk(p, (u32)(4 * n) & ~15u);
}

// -DDF_CARRY (with -DDF_PERSIST; verify/cuda_filtering.py FLAG_CARRY, builds of their own: the carry's registers
// spill words of the row's body at the 64-register cap, which the persist-only builds should not pay): what a row's
// write (step 4) leaves for the cluster's next row. The resident build: this thread's 16-byte groups of the next
// row's slice copied (cp.async, each into the slot its own write just read: the same groups, the same thread) into
// shared memory, so the next row's load only waits for them; the L2-row build: the next row's groups read from HBM
// (kept in L2) and this thread's max and NaN flag over them, so the next row starts with them. Only where the write
// took the 16-byte path and the next row is 16-byte aligned (the resident build: and FLAG_ASYNC_LOAD); a row that
// leaves early (unfiltered) carries nothing. The ragged tail (n % 4) is loaded as usual.
struct DfCarry {
  bool on;    // the groups are loaded (resident) / read and tracked (L2-row build)
  float mx;   // (L2-row build) this thread's max over them
  u32 nan;    // (L2-row build) ... and NaN flag
};

// One row by this block of the row's cluster; `next`: the row the cluster filters after it (-1: none). Every remote
// access of the row's shared memory is behind a cluster barrier when it returns (its last df_cluster_sync, or the
// one before the unfiltered copy; the L2-row build's misaligned exit reaches none, in every block alike).
__device__ __forceinline__ void df_row(const FilterArgs& a, const i64 the_row, const i64 next, DfCarry& carry) {
#else
extern "C" __global__ void __cluster_dims__(DF_C, 1, 1) __launch_bounds__(DF_T, DF_MIN_BLOCKS) dm_filter(const FilterArgs a) {
#endif
#ifndef DF_L2_ROWS
  extern __shared__ __align__(16) float s_x[];  // [slice]: this block's tokens of the row
#endif
  __shared__ u64 s_hist[3 * DF_NB / 2];          // level-1 bins (3 x DF_NB words); then the candidates' masses
  __shared__ u64 s_cand[DF_CAP];                 // the gathered candidates (packed words), sorted
#if DF_C == 8
  __shared__ u64 s_rmass[DF_RANGE];              // this block's reduced buckets
  __shared__ u32 s_rcnt[DF_RANGE];
#else  // (static shared memory stops at 48 KB: the 4- to 7-block builds' 512 reduced buckets are their dynamic shared
       // memory, DF_RANGE x 12 bytes; verify/cuda_filtering.l2_smem)
  extern __shared__ __align__(16) u64 s_dyn[];
  u64* const s_rmass = s_dyn;
  u32* const s_rcnt = reinterpret_cast<u32*>(s_dyn + DF_RANGE);
#endif
  __shared__ u32 s_dig[3 * 256];                 // a narrowing pass's bins (3 x 256 words)
  __shared__ FilterShared sh;
  u32* bins = reinterpret_cast<u32*>(s_hist);  // the level-1 bins (three words each, DF_NB words apart)
  const u32 rank = df_rank();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  u32* stats = reinterpret_cast<u32*>(a.stats);
#ifdef DF_PERSIST
  const i64 row = the_row, vocab = a.vocab, lo = (i64)rank * a.slice;
#else
  const i64 row = blockIdx.x / DF_C, vocab = a.vocab, lo = (i64)rank * a.slice;
#endif
  const int n = (int)(lo < vocab ? (vocab - lo < a.slice ? vocab - lo : a.slice) : 0);
  const float* src = reinterpret_cast<const float*>(a.logits) + row * a.in_stride + lo;
  float* dst = reinterpret_cast<float*>(a.out) + row * a.out_stride + lo;
#ifdef DF_PERSIST
  __builtin_assume(__isGlobal(src) && __isGlobal(dst));  // (as the kernel's own pointer arguments: STG, not ST)
#endif
#ifdef DF_CARRY
  const bool carried = carry.on;  // the last row's write loaded this row's groups
  carry.on = false;
  const float* const next_src = reinterpret_cast<const float*>(a.logits) + (next >= 0 ? next : 0) * a.in_stride + lo;
  const bool carry_next = next >= 0 && (reinterpret_cast<u64>(next_src) & 15) == 0;
#endif
  // raw logits: x / T (IEEE division, as torch's z / T) where T is neither 0 (unscaled) nor 1 (x / 1 = x)
  const float t = a.t_per_row ? reinterpret_cast<const float*>(a.t_ptr)[row] : (float)a.t_value;
  const bool divide = t != 0.0f && t != 1.0f;
  const bool copy = divide || a.out != a.logits || a.out_stride != a.in_stride;  // the output differs from the input
  const bool vec_in = ((reinterpret_cast<u64>(src)) & 15) == 0, vec_out = ((reinterpret_cast<u64>(dst)) & 15) == 0;
#ifdef DF_L2_ROWS
  const float* const s_x = src;  // the row's slice, read at every pass (DF_AT)
  if (DF_NEW_FLAGS && (DF_FLAGS_OF(a.flags) & DF_FLAG_PREFETCH_SLICE) && tid == 0 && vec_in && !divide) {
    prefetch_l2_bulk(src, (u32)(n / 4) * 16u);  // the whole slice requested from HBM at once (the copy engine)
  }
#endif

  const i64 k = a.k_per_row ? (a.k64 ? reinterpret_cast<const i64*>(a.k_ptr)[row]
                                     : (i64) reinterpret_cast<const i32*>(a.k_ptr)[row]) : a.k_value;
  const float p = a.p_per_row ? reinterpret_cast<const float*>(a.p_ptr)[row] : (float)a.p_value;
  const bool use_k = k > 0 && k < vocab, use_p = p < 1.0f;

  for (int i = tid; i < 3 * DF_NB / 2; i += DF_T) s_hist[i] = 0;
  if (tid == 0) {
    sh.counter = 0;
    sh.counter_base = 0;
    sh.cached_bucket = -1;
    sh.gathered = 0;
    sh.flags = (u32)a.flags;
    // DF_FLAG_UNCOUNTED: top-p alone with p > 0 (its one search is by mass, target >= 1) histograms masses only
    sh.uncounted = (DF_FLAGS_OF(a.flags) & DF_FLAG_UNCOUNTED) && (DF_FLAGS_OF(a.flags) & DF_FLAG_ILP)
                   && (DF_FLAGS_OF(a.flags) & DF_FLAG_MASK_GATHER) && use_p
                   && !use_k && p > 0.0f;
#ifdef DF_L2_ROWS
    // DF_FLAG_FUSED_WRITE: the uncounted search's gather (the row's only one unless its bucket overflows) writes
    sh.write_dst = DF_NEW_FLAGS && sh.uncounted && (DF_FLAGS_OF(a.flags) & DF_FLAG_FUSED_WRITE)
                   && (DF_FLAGS_OF(a.flags) & DF_FLAG_BATCHED_GATHER)
                   && vec_out ? reinterpret_cast<u64>(dst) : 0ull;
    sh.fused = 0;
    sh.mine_n = 0;
#endif
  }
#ifdef DF_TRACE
  if (tid == 0) {
    const bool traced = row == 0 || row == a.rows / 2;
    sh.trace = traced ? reinterpret_cast<long long*>(a.stats + 8) + ((row == 0 ? 0 : DF_C) + rank) * DF_TRACE_SLOTS
                      : nullptr;
  }
#endif
  DF_MARK(0);
#if defined(DF_PERSIST) && !defined(DF_L2_ROWS)
  if (next >= 0 && tid == 0) df_prefetch_next(a, next, lo, n);  // (its load then comes from L2)
#endif
  // 1. the slice into shared memory, its max and NaN flag
  float mx = -__int_as_float(0x7f800000);
  u32 nan = 0;
#ifdef DF_L2_ROWS
  if (!vec_in || divide) {  // never sent here (verify/cuda_filtering.py: aligned rows, no temperature): unfiltered
    if (tid == 0 && rank == 0) atomicOr(stats + 1, 4u);
    for (int i = tid; i < n && copy; i += DF_T) dst[i] = divide ? __fdiv_rn(src[i], t) : src[i];
    return;  // (every block of the cluster: the row's base decides both; no cluster barrier was reached)
  }
  {  // the first read (from HBM), kept in L2 for the passes
    const u64 df_policy = df_keep_policy();
    const int n4 = n / 4;
#ifdef DF_CARRY
    if (carried) {  // read by the last row's write: its max and NaN flag
      mx = carry.mx;
      nan = carry.nan;
    } else {
#endif
#pragma unroll 8
    for (int i = tid; i < n4; i += DF_T) {
      const float4 f = DF_AT4(i);
      df_track(f.x, mx, nan); df_track(f.y, mx, nan); df_track(f.z, mx, nan); df_track(f.w, mx, nan);
    }
#ifdef DF_CARRY
    }
#endif
    for (int i = 4 * n4 + tid; i < n; i += DF_T) df_track(DF_AT(i), mx, nan);
  }
#else
  if (vec_in && (DF_FLAGS_OF(a.flags) & DF_FLAG_ASYNC_LOAD)) {
    // every 16-byte copy of the thread in flight at once (cp.async, no registers held), then this thread's own
    // copies read back (visible to it after the wait: no block barrier), divided in place, their max and NaN flag
    const int n4 = n / 4;
#ifdef DF_CARRY
    if (!carried) {  // (the last row's write issued these copies)
#endif
#pragma unroll 4
    for (int i = tid; i < n4; i += DF_T) cp_async16(s_x + 4 * i, src + 4 * i, true);  // (common.cuh: .cg, L2 only)
#ifdef DF_CARRY
    }
#endif
    cp_async_commit();
    cp_async_wait_all();
    for (int i = tid; i < n4; i += DF_T) {
      float4 f = reinterpret_cast<const float4*>(s_x)[i];
      if (divide) {
        f = make_float4(__fdiv_rn(f.x, t), __fdiv_rn(f.y, t), __fdiv_rn(f.z, t), __fdiv_rn(f.w, t));
        reinterpret_cast<float4*>(s_x)[i] = f;
      }
      df_track(f.x, mx, nan); df_track(f.y, mx, nan); df_track(f.z, mx, nan); df_track(f.w, mx, nan);
    }
    for (int i = 4 * n4 + tid; i < n; i += DF_T) {
      s_x[i] = divide ? __fdiv_rn(src[i], t) : src[i];
      df_track(s_x[i], mx, nan);
    }
  } else if (vec_in) {
    // DF_LOADS 16-byte loads in flight per thread (32 KB per block) before any is used: the slice arrives in two
    // round trips of HBM latency instead of one per 8 KB
    const int n4 = n / 4;
    for (int first = 0; first < n4; first += DF_LOADS * DF_T) {
      uint4 v[DF_LOADS];
#pragma unroll
      for (int u = 0; u < DF_LOADS; ++u) {
        const int i = first + u * DF_T + tid;
        if (i < n4) v[u] = load_cs16(src + 4 * i);
      }
#pragma unroll
      for (int u = 0; u < DF_LOADS; ++u) {
        const int i = first + u * DF_T + tid;
        if (i < n4) {
          float4 f = make_float4(__uint_as_float(v[u].x), __uint_as_float(v[u].y), __uint_as_float(v[u].z),
                                 __uint_as_float(v[u].w));
          if (divide) f = make_float4(__fdiv_rn(f.x, t), __fdiv_rn(f.y, t), __fdiv_rn(f.z, t), __fdiv_rn(f.w, t));
          reinterpret_cast<float4*>(s_x)[i] = f;
          df_track(f.x, mx, nan); df_track(f.y, mx, nan); df_track(f.z, mx, nan); df_track(f.w, mx, nan);
        }
      }
    }
    for (int i = (n / 4) * 4 + tid; i < n; i += DF_T) {
      s_x[i] = divide ? __fdiv_rn(src[i], t) : src[i];
      df_track(s_x[i], mx, nan);
    }
  } else {
    for (int i = tid; i < n; i += DF_T) {
      s_x[i] = divide ? __fdiv_rn(src[i], t) : src[i];
      df_track(s_x[i], mx, nan);
    }
  }
#endif
  DF_MARK(1);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xFFFFFFFFu, mx, off);
    mx = o > mx ? o : mx;
    nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, off);
  }
  if (lane == 0) { sh.warp_sum[warp] = __float_as_uint(mx); sh.warp_sum2[warp] = nan; }
  __syncthreads();
  if (tid == 0) {
    float bm = -__int_as_float(0x7f800000);
    u32 bn = 0;
    for (int w = 0; w < DF_T / 32; ++w) {
      const float o = __uint_as_float((u32)sh.warp_sum[w]);
      bm = o > bm ? o : bm;
      bn |= (u32)sh.warp_sum2[w];
    }
    sh.part_max = bm;
    sh.part_nan = bn;
  }
  df_cluster_sync();
  if (warp == 0) {
    float o = -__int_as_float(0x7f800000);
    u32 on = 0;
    if (lane < DF_C) {
      o = __uint_as_float(df_ld32(df_map(df_addr(&sh.part_max), lane)));
      on = df_ld32(df_map(df_addr(&sh.part_nan), lane));
    }
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) {
      const float t = __shfl_xor_sync(0xFFFFFFFFu, o, off);
      o = t > o ? t : o;
      on |= __shfl_xor_sync(0xFFFFFFFFu, on, off);
    }
    if (lane == 0) { sh.m = o; sh.nan_row = on; }
  }
  __syncthreads();
  DF_MARK(2);
  const float m = sh.m;
  if (sh.nan_row || m == -__int_as_float(0x7f800000) || !(use_k || use_p)) {  // left as it is
    df_cluster_sync();  // the other blocks have read part_max / part_nan: no remote access after this
    if (copy) df_copy(s_x, dst, n, vec_out);
    return;
  }
  // 2. the level-1 histogram: masses for top-p alone; counts for top-k (with top-p too: see 3.)
  df_histogram(s_x, n, m, use_p && !use_k, bins, s_rcnt, s_rmass, sh, rank);
  DF_MARK(3);
  // 3. the cut: top-k, then top-p among its survivors
  u64 cut = 0;  // keep every token
  u64 total = 0;
  bool done = false;
  if (use_k && use_p) {
    // top-k and top-p: when every token of the buckets up to the k-th token's fits in one gather (k = 50: ~50-500
    // tokens), those are gathered and sorted, and both cuts come from their inclusive masses (top-p only ever
    // keeps a prefix of the k best): no mass histogram of the row. Else the masses are histogrammed after all.
    const u32 bucket = df_locate(false, (u64)k, s_rcnt, s_rmass, sh);
    DF_MARK(4);
    if (bucket == DF_NONE) {
      df_fail(sh, stats, rank);
      done = true;
    } else if (sh.base_cnt + sh.sel_cnt <= DF_CAP) {
      const u32 count = (u32)(sh.base_cnt + sh.sel_cnt);
      df_collect(s_x, n, lo, m, bucket, true, 64, 0, count, true, s_hist, s_cand, sh, rank, false, false, 0, s_dig);
      DF_MARK(5);
      total = s_hist[k - 1];  // the mass of the k best
      const double limit = (double)(p > 0.0f ? p : 0.0f) * (double)total;
      const u64 target = (u64)ceil(limit);
      df_find(target != 0, target == 0 ? 1ull : target, count, 0, 0, s_hist, s_cand, sh, rank, stats);
      DF_MARK(6);
      cut = sh.found_word;  // at or above the k-th word: the top-p cut is the tighter one
      done = true;
    } else {
      df_cluster_sync();  // every block has read the count sums before they are replaced
      for (int i = tid; i < 3 * DF_NB / 2; i += DF_T) s_hist[i] = 0;
      __syncthreads();
      df_histogram(s_x, n, m, true, bins, s_rcnt, s_rmass, sh, rank);  // (use_k: counted)
    }
  }
  if (!done && use_k) {
    df_search(false, (u64)k, use_p, s_x, n, lo, m, s_hist, s_cand, s_rcnt, s_rmass, s_dig, sh, rank, stats);
    cut = sh.found_word;
    total = sh.found_mass;
    done = cut == 0;  // a failed search (stats[1]): the row keeps every token, top-p included (df_fail)
  } else if (!done && use_p) {
    if (tid < DF_C) sh.warp_sum[tid] = df_ld64(df_map(df_addr(&sh.tot_mass), tid));
    __syncthreads();
    for (int r = 0; r < DF_C; ++r) total += sh.warp_sum[r];
    __syncthreads();
  }
  if (!done && use_p) {
    const double limit = (double)(p > 0.0f ? p : 0.0f) * (double)total;  // every sum < 2^53: exact in fp64
    const u64 target = (u64)ceil(limit);  // mass before < limit  <=>  mass before < ceil(limit)
    if (target == 0) {
      df_search(false, 1ull, false, s_x, n, lo, m, s_hist, s_cand, s_rcnt, s_rmass, s_dig, sh, rank, stats);
    } else {
      df_search(true, target, true, s_x, n, lo, m, s_hist, s_cand, s_rcnt, s_rmass, s_dig, sh, rank, stats);
    }
    cut = sh.found_word > cut ? sh.found_word : cut;
  }
  DF_MARK(11);
  // the last remote access of the row is behind: the blocks may write and leave (SPLIT_FINAL: write, then wait for
  // every block's arrival before leaving; the write reads this block's shared memory, writes none of it)
  const bool split_final = DF_FIXED_ONLY && (DF_FLAGS_OF(a.flags) & DF_FLAG_SPLIT_FINAL);
  if (split_final) {
    df_cluster_arrive();
  } else {
    df_cluster_sync();
  }
  DF_MARK(12);
#if defined(DF_PERSIST) && defined(DF_L2_ROWS)
  if (next >= 0 && tid == 0) df_prefetch_next(a, next, lo, n);  // (this row's lines are read a last time now)
#endif
  // 4. the row written once: kept iff (x, index) ranks at or above the cut, i.e. x > cut value, or x equal to it
  // (-0.0 == +0.0, as the keys) at an index not above the cut's (no cut: everything)
  const float ninf = -__int_as_float(0x7f800000);
  const float cut_x = cut == 0 ? ninf : df_word_value(cut);
  const i64 cut_i = cut == 0 ? vocab : (i64)(0x7FFFFFFF - (i32)(cut & 0x7FFFFFFFull));
#ifdef DF_L2_ROWS
  const u64 df_policy = df_drop_policy();  // the row's last read
  if (DF_NEW_FLAGS && sh.fused == 1) {
    // DF_FLAG_FUSED_WRITE: the gather stored every token (x at or above the bucket, -inf below); of the bucket's
    // members (this block's, from the gather) those ranked below the cut become -inf. (In place the gather stored
    // a member's own x, so reading it back gives x; this block's threads wrote it, behind block barriers.)
    const u32* const mine = reinterpret_cast<const u32*>(s_hist + DF_CAP);
    for (int j = tid; j < (int)sh.mine_n; j += DF_T) {
      const int i = (int)mine[j];
      const float x = DF_AT(i);
      if (!(x > cut_x || (x == cut_x && lo + i <= cut_i))) dst[i] = ninf;
    }
  } else if (vec_out) {  // four 16-byte reads in flight before the first store (a store waits for nothing, a read does)
    // (DF_FLAG_FUSED_WRITE with an overflowing bucket: the gather stored every token, final but for the bucket's
    // members: only groups holding one are stored again)
    const bool members_only = DF_NEW_FLAGS && sh.fused == 2;
    const float f_lo = sh.f_lo, f_hi = sh.f_hi;
    const bool f_bounded = sh.f_bounded != 0;
#ifdef DF_CARRY
    float cmx = -__int_as_float(0x7f800000);  // the next row's groups: this thread's max, NaN flag
    u32 cnan = 0;
    const u64 keep = df_keep_policy();
#endif
    for (int first = tid; first < n / 4; first += 4 * DF_T) {
      float4 f[4];
#ifdef DF_CARRY
      float4 g[4];  // the next row's same groups, read with this row's (kept in L2 for its passes)
      if (carry_next) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (first + u * DF_T < n / 4) g[u] = df_ldg4(next_src + 4 * (first + u * DF_T), keep);
        }
      }
#endif
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (first + u * DF_T < n / 4) f[u] = DF_AT4(first + u * DF_T);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = first + u * DF_T;
        if (i < n / 4 && !(members_only && df_member_bits(f[u], f_lo, f_hi, f_bounded) == 0)) {
          const i64 t0 = lo + 4 * i;
          f[u].x = (f[u].x > cut_x || (f[u].x == cut_x && t0 <= cut_i)) ? f[u].x : ninf;
          f[u].y = (f[u].y > cut_x || (f[u].y == cut_x && t0 + 1 <= cut_i)) ? f[u].y : ninf;
          f[u].z = (f[u].z > cut_x || (f[u].z == cut_x && t0 + 2 <= cut_i)) ? f[u].z : ninf;
          f[u].w = (f[u].w > cut_x || (f[u].w == cut_x && t0 + 3 <= cut_i)) ? f[u].w : ninf;
          store_cs16(dst + 4 * i, __float_as_uint(f[u].x), __float_as_uint(f[u].y), __float_as_uint(f[u].z),
                     __float_as_uint(f[u].w));
#ifdef DF_CARRY
          if (carry_next) {
            df_track(g[u].x, cmx, cnan); df_track(g[u].y, cmx, cnan); df_track(g[u].z, cmx, cnan);
            df_track(g[u].w, cmx, cnan);
          }
#endif
        }
      }
    }
#ifdef DF_CARRY
    if (carry_next) carry = DfCarry{true, cmx, cnan};
#endif
    for (int i = (n / 4) * 4 + tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      dst[i] = (x > cut_x || (x == cut_x && lo + i <= cut_i)) ? x : ninf;
    }
  } else
#endif
  if (vec_out) {
#if defined(DF_CARRY) && !defined(DF_L2_ROWS)
    // (with the load's cp.async path) each group's slot refilled with the next row's group once its value is stored
    // (the store waits for the read of the slot; no other thread reads this thread's slots now)
    // (the load's path that waits for cp.async)
    const bool refill = carry_next && (DF_FLAGS_OF(a.flags) & DF_FLAG_ASYNC_LOAD);
#endif
    for (int i = tid; i < n / 4; i += DF_T) {
      float4 f = DF_AT4(i);
      const i64 t0 = lo + 4 * i;
      f.x = (f.x > cut_x || (f.x == cut_x && t0 <= cut_i)) ? f.x : ninf;
      f.y = (f.y > cut_x || (f.y == cut_x && t0 + 1 <= cut_i)) ? f.y : ninf;
      f.z = (f.z > cut_x || (f.z == cut_x && t0 + 2 <= cut_i)) ? f.z : ninf;
      f.w = (f.w > cut_x || (f.w == cut_x && t0 + 3 <= cut_i)) ? f.w : ninf;
      store_cs16(dst + 4 * i, __float_as_uint(f.x), __float_as_uint(f.y), __float_as_uint(f.z), __float_as_uint(f.w));
#if defined(DF_CARRY) && !defined(DF_L2_ROWS)
      if (refill) cp_async16(s_x + 4 * i, next_src + 4 * i, true);
#endif
    }
#if defined(DF_CARRY) && !defined(DF_L2_ROWS)
    if (refill) {
      cp_async_commit();
      carry.on = true;
    }
#endif
    for (int i = (n / 4) * 4 + tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      dst[i] = (x > cut_x || (x == cut_x && lo + i <= cut_i)) ? x : ninf;
    }
  } else {
    for (int i = tid; i < n; i += DF_T) {
      const float x = DF_AT(i);
      dst[i] = (x > cut_x || (x == cut_x && lo + i <= cut_i)) ? x : ninf;
    }
  }
  DF_MARK(17);
  if (split_final) df_cluster_wait();
}

#ifdef DF_PERSIST
extern "C" __global__ void __cluster_dims__(DF_C, 1, 1) __launch_bounds__(DF_T, DF_MIN_BLOCKS) dm_filter(const FilterArgs a) {
  const i64 clusters = gridDim.x / DF_C;
  DfCarry carry{false, 0.0f, 0u};
  for (i64 row = blockIdx.x / DF_C; row < a.rows; row += clusters) {
    df_row(a, row, row + clusters < a.rows ? row + clusters : -1, carry);
    __syncthreads();  // this block's reads of the row's shared memory are done before the next row writes it
  }
}
#endif

}  // namespace dm
#endif
