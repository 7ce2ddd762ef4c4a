// Device helpers shared by the CUDA C++ samplers (wide.cu; the rules of SPEC.md section 3 and the
// tensor-core fragment of chain.cu). No header is included: NVRTC compiles this without a toolkit.
//
// - dm::bf16 / dm::round_bf16: widen a bf16 and round fp32 to bf16 to nearest even, NaN -> 0x7FC0
//   (torch's payload), the integer rounding of blocks.cu / chain.cu;
// - dm::mma16816: mma.sync m16n8k16 bf16 x bf16 -> fp32 (chain.cu's; the rank may be permuted
//   identically in A and B so that every lane loads 16-byte chunks);
// - dm::skip_threshold: blocks.cu's exact-bound skip test (a bound below it cannot reach the key);
// - dm::bound_inv_temp: 1 / T of the key bounds, NaN (every token exact) where it overflows;
// - dm::shfl_xor_i64, streaming loads and stores;
// - dm::tb_sweep: the sweep of all 2^32 hashes that builds the noise upper-bound table (chain.cu, blocks.cu).
#pragma once

#include "noise.cuh"

namespace dm {

__device__ __forceinline__ float bf16(u32 b) { return __uint_as_float(b << 16); }

__device__ __forceinline__ u32 round_bf16(float f) {  // round to nearest even, NaN -> 0x7FC0 (torch)
  u32 u = __float_as_uint(f);
  if (f != f) return 0x7FC0u;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bf16 pair {lo, hi} of two fp32 values by one cvt.rn.bf16x2.f32 (round to nearest even, as round_bf16, except
// that a NaN becomes 0x7FFF: use it where the payload cannot reach an output, or fix NaNs afterwards).
__device__ __forceinline__ u32 pack_bf16x2_rn(float lo, float hi) {
  u32 p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  return p;
}

#define DM_WORD_NONE (-9223372036854775807ll - 1)  // no packed (key, index) word yet

// The threshold of a best exact key word: a bound b below k - margin - 2 (|k| + 64) 2^-20 has
// b + key_slack(b) < k (tests/draft/test_cuda_gumbel.py), so the token cannot reach k. -inf without a
// word; NaN (every token goes exact) for k = +inf or NaN.
__device__ __forceinline__ float skip_threshold(i64 best, float margin) {
  if (best == DM_WORD_NONE) return -__int_as_float(0x7f800000);
  const float k = word_key(best);
  const float mag = k < 0.0f ? -k : k;
  return sub_rn(sub_rn(k, margin), mul_rn(add_rn(mag, 64.0f), 0x1p-19f));
}

// 1 / T for the key bounds z * (1/T) + noise (chain.cu, blocks.cu, wide.cu): NaN where it overflows (T below
// ~2.9e-39, +-inf), since z * inf is no bound of div_rn(z, T) (z < 0: -inf against a finite exact key, z = 0: NaN).
// A NaN bound sends every token of the row to its exact key (tests/gpu/test_extreme_values_gpu.py).
__device__ __forceinline__ float bound_inv_temp(float inv_temp) {
  const float mag = __int_as_float(__float_as_int(inv_temp) & 0x7fffffff);
  return mag <= 3.402823466e38f ? inv_temp : __int_as_float(0x7fffffff);
}

__device__ __forceinline__ i64 shfl_xor_i64(i64 x, int off) {
  const u32 lo = __shfl_xor_sync(0xFFFFFFFFu, (u32)((u64)x & 0xFFFFFFFFull), off);
  const u32 hi = __shfl_xor_sync(0xFFFFFFFFu, (u32)((u64)x >> 32), off);
  return (i64)(((u64)hi << 32) | lo);
}

// Streaming accesses (read or written once per step: evict first).
__device__ __forceinline__ uint2 load_cs8(const void* ptr) {
  uint2 v;
  asm("ld.global.cs.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint4 load_cs16(const void* ptr) {
  uint4 v;
  asm("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}
__device__ __forceinline__ void store_cs8(void* ptr, u32 x, u32 y) {
  asm volatile("st.global.cs.v2.u32 [%0], {%1,%2};" :: "l"(ptr), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ void store_cs16(void* ptr, u32 x, u32 y, u32 z, u32 w) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(ptr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(ptr));
}
// Bulk prefetch of [ptr, ptr + bytes) into L2 (sm_90 copy engine; ptr 16-byte aligned, bytes % 16 == 0).
__device__ __forceinline__ void prefetch_l2_bulk(const void* ptr, u32 bytes) {
  if (bytes) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(ptr), "r"(bytes) : "memory");
}
__device__ __forceinline__ i64 load_relaxed_i64(const i64* ptr) {  // another block's word (from L2)
  i64 v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}

// 16-byte global -> shared copy without registers (zero-filled when !ok).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const u32 addr = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(addr), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// The noise upper-bound table's sweep (chain.cu dm_noise_table, blocks.cu dm_blocks_noise_table):
// words[b] = the largest gumbel32(uniform32(h)) over every hash h with tb_bucket(h) == b, as tb_order
// words (the caller zero-fills; an empty bucket stays 0). Every thread scans 4096 consecutive hashes (a
// bucket is an interval of h) and merges each bucket it met with one atomicMax. Grid: 2^20 threads in all
// (e.g. 4096 blocks of 256).
__device__ __forceinline__ void tb_sweep(u32* words) {
  const u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 4096ull;
  if (first >= (1ull << 32)) return;
  u32 bucket = tb_bucket((u32)first), best = 0;
  for (u32 i = 0; i < 4096u; ++i) {
    const u32 h = (u32)first + i;
    const u32 b = tb_bucket(h);
    if (b != bucket) {
      atomicMax(&words[bucket], best);
      bucket = b;
      best = 0;
    }
    const u32 o = tb_order(gumbel32(uniform32(h)));
    best = o > best ? o : best;
  }
  atomicMax(&words[bucket], best);
}

}  // namespace dm
