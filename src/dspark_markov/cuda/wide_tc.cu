// impl="cuda_wide", tensor_cores=True: the step kernel on Hopper's asynchronous tensor cores (wgmma + TMA, sm_90a), both
// methods. For inverse CDF it replaces wide.cu's _icdf step entry points and writes exactly their outputs (the cache
// rows, the per-(row, block) partials part[row][b] = (max x, sum exp(x - max)) with x = z / T, and the padding samples'
// words), so dm_wide_finish (before step 0) and dm_wide_pick (after each step) of wide.cu run unchanged around it; for
// Gumbel (below) wide.cu's Gumbel step, with dm_wide_finish after it.
//
// One block per SM, block b owning the contiguous 64-token tiles [b tpb, (b + 1) tpb) of the vocabulary (tpb =
// icdf_gpb / 4: the pick's blocks), 9 warps:
//   - warp 8 (the producer; one lane) streams the block's W2 tiles [64 tokens x 256] from HBM into a ring of
//     `num_stages` shared-memory stages by TMA (four 64 x 64 boxes, 128-byte swizzle), each stage's mbarrier counting
//     its bytes; a stage is refilled once every consumer warp has released it;
//   - warps 0-7, two consumer warpgroups, compute the bias tiles bias^T [64 rows x 64 tokens] = codes [64 x 256] @
//     W2_tile^T on wgmma m64n64k16 (fp32 accumulation; both operands K-major in shared memory); items (tile, m-tile):
//     from 2 m-tiles on each warpgroup takes the m-tiles of its parity in every tile, with one the tiles of its parity.
//     Each warpgroup keeps two accumulators: it issues the next item's 16 wgmmas before the epilogue of the previous
//     one, so the tensor cores run under the epilogue; the base logits of an item are loaded before its wgmmas.
//   - the codes W1[prev] of every row (prev: the anchor at step 0, else draft_tokens[:, step - 1] written by the
//     previous pick) are gathered once per step into shared memory in the same swizzled K-major layout.
// Built with TC_WGS=3 (cuda_wide's tc_warpgroups=3, stop 53): 12 warps, three consumer warpgroups taking the block's
// (tile, m-tile) items in turn and no producer warp (see TC_PRODUCER_THREADS): warp 0 loads the ring's first tiles,
// then the consumer warp whose release completes a stage's count loads the stage's next tile.
// Method "gumbel" (the _gumbel entry points): the same step with wide.cu's ranking instead of the partials: every
// token's exact-key upper bound z / T + table[bucket(hash)] against the row's best word (read with the item's base
// logits; a row without a word is seeded with the exact key of the quad's largest bound), exact keys only where the
// bound reaches it, merged by atomicMax; dm_wide_finish turns the words into tokens.
// Epilogue per (row, token), as wide.cu: bias = round_bf16(acc) (again after `scale`), z = round_bf16(U + bias), the
// cache row of a live sample written once (4-byte pairs), x = z / T (div_rn's value; z on greedy rows); per row and item
// the lane's 16 tokens reduced to (max, sum exp(x - max)) over the lane quad and merged into a per-(warpgroup, row)
// partial in shared memory, the two warpgroups' partials merged into part[row][b] at the end. Padding samples (no cache
// row) merge their packed (z, index) words with atomicMax (dm_wide_pick takes their argmax from it).
//
// Only the bf16 base / bf16 cache path with 4-byte aligned pairs (cuda_wide.CudaWideBackend.tensor_core_path); every
// other call takes wide.cu's step entry points. Bytes per step: W2 (V x 512) once (TMA), rows * V * 4 (base read,
// cache written), the codes (rows x 512) per block from L2, part rows * 8 per block.
//
// Inverse CDF, stop 52: an item whose 64 tokens lie inside the vocabulary and whose warp's rows are all samples with a
// cache row at T in {0, 1} (a warp vote) takes a branch-free copy of that epilogue (the same values; ~7 instructions per
// value before the reductions instead of ~25); options TC_OPT_GENERAL (tc_fast=False) forces the general one (tests).
//
// Written 2026-12-07 (stop 51); exact in its GPU tests on an H100 the same day, slower than wide / cuda_gumbel at T = 1
// (latency-bound: one 288-thread block per SM, 0.28-0.31 instructions per cycle and scheduler at 253 rows): see
// draft/cuda_wide.py and benchmarks/NOTES.md.
#include "wide.cuh"

#define TC_TOK 64                                // tokens per W2 tile (the wgmma N)
#define TC_MROWS 64                              // rows per m-tile (the wgmma M)
#define TC_BOX_BYTES (TC_TOK * 128)              // one TMA box: 64 tokens x 64 rank elements (128 bytes)
#define TC_TILE_BYTES (4 * TC_BOX_BYTES)         // a W2 tile: 32 KB
#ifndef TC_WGS
#define TC_WGS 2                                 // consumer warpgroups (3: cuda_wide's tc_warpgroups=3)
#endif
#if TC_WGS != 2 && TC_WGS != 3
#error "TC_WGS: 2 or 3 consumer warpgroups (the item map and the register budget assume one of them)"
#endif
#define TC_CONSUMER_THREADS (128 * TC_WGS)
// + the producer warp. Three warpgroups have none: 13 warps would leave a scheduler 4 of them, i.e. 128 registers each
// (setmaxnreg moved none in ptxas 13.0's allocation here), so the consumer warp that releases a stage last refills it.
#define TC_PRODUCER_THREADS (TC_WGS == 2 ? 32 : 0)
#define TC_THREADS (TC_CONSUMER_THREADS + TC_PRODUCER_THREADS)
#ifndef TC_FASTDIV
#define TC_FASTDIV 0                             // cuda_wide's tc_fast_div: the branch-free epilogue for any T (below)
#endif
#define TC_MAX_STAGES 4

struct TmaMap {  // CUtensorMap (cuda.h): 128 opaque bytes (64-byte aligned on sm_90; CUDA 13 declares 128)
  alignas(128) u64 opaque[16];
};

__device__ __forceinline__ u32 tc_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void tc_bar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(tc_smem(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void tc_bar_expect(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(tc_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_bar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(tc_smem(bar)) : "memory");
}
__device__ __forceinline__ bool tc_bar_try(u64* bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n" : "=r"(done) : "r"(tc_smem(bar)), "r"(parity) : "memory");
  return done != 0;
}
__device__ __forceinline__ u64 tc_now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Wait for the phase of parity `parity` to complete. Bounded: a phase that never completes (a TMA that never lands:
// a bug, not an input) traps after 10 s of the global timer (a real wait is microseconds), so the launch fails
// instead of hanging the stream.
__device__ __forceinline__ void tc_bar_wait(u64* bar, u32 parity) {
  if (tc_bar_try(bar, parity)) return;
  const u64 start = tc_now_ns();
  for (u32 polls = 1; !tc_bar_try(bar, parity); ++polls)
    if ((polls & 1023u) == 0u && tc_now_ns() - start > 10000000000ull) __trap();
}

// W2 box (rank elements x0 .. x0 + 63, tokens y0 .. y0 + 63; zero-filled past V) into shared memory, counted on bar.
__device__ __forceinline__ void tc_tma_load(void* dst, const TmaMap* map, int x0, int y0, u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :: "r"(tc_smem(dst)), "l"((u64)map), "r"(x0), "r"(y0), "r"(tc_smem(bar)) : "memory");
}

// W2 tile `tile` (64 tokens x 512 bytes, contiguous in W2; fewer past V) asked of L2 by the copy engine, one ring
// cycle before its TMA (stop 55: Nsight Compute put 11.7% of a three-warpgroup step's stall samples at 253 rows on
// the full barrier's wait, i.e. on TMA loads of W2 from HBM with two stages in flight). A hint: never changes a value.
__device__ __forceinline__ void tc_prefetch_tile(const WideArgs& a, i64 tile) {
  const i64 t0 = tile * TC_TOK;
  if (t0 < a.vocab)
    dm::prefetch_l2_bulk((const unsigned char*)a.head + t0 * (TC_TILE_BYTES / TC_TOK),
                          (u32)(min((i64)TC_TOK, a.vocab - t0) * (TC_TILE_BYTES / TC_TOK)));
}

// wgmma shared-memory descriptor of a K-major operand in the 128-byte swizzle layout (8-row groups of 1,024 bytes), as
// its two words: the low one (start address >> 4 in bits 0-13, leading offset 1 at bit 16) and the constant high one
// (stride 1,024 >> 4, swizzle mode 1 at bit 62).
__device__ __forceinline__ u32 tc_desc_lo(u32 addr) { return ((addr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ u64 tc_desc_of(u32 lo) { return ((u64)((1024u >> 4) | (1u << 30)) << 32) | lo; }

__device__ __forceinline__ void tc_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void tc_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tc_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }

// Keep the compiler from moving accesses of an accumulator across the wgmma issue / wait asm (CUTLASS's
// warpgroup_fence_operand): an empty asm that "reads and writes" every register of d.
__device__ __forceinline__ void tc_fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d += A (64 x 16, descriptor da) @ B (16 x 64, descriptor db); scale_d = 0 ignores d's old value.
__device__ __forceinline__ void tc_mma(float* d, u64 da, u64 db, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

// Shared memory (from a 1,024-byte aligned base): [stages][4 boxes][64 tokens][128 bytes] W2, then the codes
// [4 k-blocks][rows_alloc][128 bytes] (swizzled as TMA would), the row keys [rows_alloc], the partials
// [TC_WGS warpgroups][rows_alloc] float2, the full / empty mbarriers [stages] each, with TC_WGS=3 the release counts
// ([stages] 8-byte slots, a u32 each), and for the Gumbel method the noise table [DM_TB_SIZE] fp32.
// cuda_wide.tc_smem_bytes mirrors it.
struct TcLayout {
  unsigned char* stages;
  unsigned char* codes;
  WideRow* rows;
  float2* part;
  u64* full;
  u64* empty;
  u32* count;   // TC_WGS=3: the stages' release counts (a u32 in each of [stages] 8-byte slots after `empty`)
  float* gtab;  // GUMBEL: the noise table [DM_TB_SIZE]
};

__device__ __forceinline__ TcLayout tc_layout(unsigned char* raw, int stages, int rows_alloc) {
  const u32 base = tc_smem(raw);
  TcLayout l;
  l.stages = raw + (((base + 1023u) & ~1023u) - base);
  l.codes = l.stages + stages * TC_TILE_BYTES;
  l.rows = (WideRow*)(l.codes + 4 * rows_alloc * 128);
  l.part = (float2*)(l.rows + rows_alloc);
  l.full = (u64*)(l.part + TC_WGS * rows_alloc);
  l.empty = l.full + stages;
  l.count = (u32*)(l.empty + stages);
  l.gtab = (float*)(l.empty + (TC_WGS == 2 ? 1 : 2) * stages);
  return l;
}

// A bf16 pair of global memory (4-byte aligned).
__device__ __forceinline__ u32 tc_load_pair(const unsigned short* p) { return *(const u32*)p; }
// A z pair with torch's NaN payload (0x7FC0) in each NaN half (a bf16 half is NaN exactly where its fp32 sum was:
// cvt.rn never makes a NaN of a number); the fast epilogue patches a thread's pairs once where one of them has a NaN.
__device__ __forceinline__ u32 tc_torch_nan(u32 z) {
  return ((z & 0x7FFFu) > 0x7F80u ? 0x7FC0u : z & 0xFFFFu) |
         (((z >> 16) & 0x7FFFu) > 0x7F80u ? 0x7FC00000u : z & 0xFFFF0000u);
}
// z = round_bf16(U + round_bf16(bias)) of a pair (the bias scaled first where SCALE), without the NaN payload fix-up;
// `nan` gains whether a half is NaN.
template <bool SCALE>
__device__ __forceinline__ u32 tc_z_pair(float b0, float b1, u32 ubase, float scale, bool& nan) {
  u32 bp = dm::pack_bf16x2_rn(b0, b1);
  if (SCALE)
    bp = dm::pack_bf16x2_rn(dm::mul_rn(__uint_as_float(bp << 16), scale),
                            dm::mul_rn(__uint_as_float(bp & 0xFFFF0000u), scale));
  // round_bf16(fp32 U + fp32 bias) in one bf16x2 add: the fp32 sum of two bf16 values rounded to bf16 is their
  // correctly rounded bf16 sum (double rounding is innocuous for + when the wider precision has p' >= 2p + 1
  // significand bits: 24 >= 17; same exponent range, subnormals exact in fp32), which add.rn.bf16x2 computes (sm_90).
  // Its NaN halves are NaN exactly where the fp32 sums were (payloads aside: fixed up by the caller).
  u32 zp;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(zp) : "r"(ubase), "r"(bp));
  const float z0 = __uint_as_float(zp << 16), z1 = __uint_as_float(zp & 0xFFFF0000u);
  nan |= (z0 != z0) | (z1 != z1);
  return zp;
}

template <bool SCALE, bool GUMBEL>
__device__ __forceinline__ void tc_body(const WideArgs& a, const TmaMap* w2, int num_stages, bool fast_ok,
                                        bool pf_w2) {
  extern __shared__ unsigned char smem_raw[];
  const int rows = (int)a.rows;
  const int mtiles = (rows + TC_MROWS - 1) / TC_MROWS;
  const int rows_alloc = mtiles * TC_MROWS;
  const int rows16 = (rows + 15) & ~15;
  const TcLayout L = tc_layout(smem_raw, num_stages, rows_alloc);
  const int log2_stages = num_stages == 4 ? 2 : 1;  // num_stages: 2 or 4 (cuda_wide.tc_stages)
  const int tid = threadIdx.x, lane = tid & 31;
  // warp index broadcast from lane 0: provably warp-uniform for ptxas (else it serialises the wgmmas behind branches on
  // it, as CUTLASS's canonical_warp_group_idx avoids)
  const int warp = __shfl_sync(0xFFFFFFFFu, tid >> 5, 0);
  const i64 vocab = a.vocab;
  const i64 ntiles = (vocab + TC_TOK - 1) / TC_TOK;
  const i64 tpb = a.icdf_gpb / 4;  // whole tiles per block (icdf_gpb is a multiple of 8 groups)
  const i64 tile0 = (i64)blockIdx.x * tpb;
  const int my_tiles = (int)max((i64)0, min(ntiles, tile0 + tpb) - tile0);
  const float ninf = -__int_as_float(0x7f800000);

  if (tid == 0) {
    for (int s = 0; s < num_stages; ++s) {
      tc_bar_init(L.full + s, 1);
      tc_bar_init(L.empty + s, TC_CONSUMER_THREADS / 32);  // each consumer warp releases every tile once
#if TC_WGS != 2
      L.count[s] = 0u;  // the stage's release count (below: release_tile)
#endif
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // W2 tile tl into its stage by TMA (the `lead` lane), then the L2 prefetch of the base logits of that tile (128 bytes
  // of every row, the lanes of the warp taking every 32nd row): the consumers' base loads then hit L2. Without it they
  // came from HBM one item ahead (8 KB per warpgroup in flight): the first H100 run (stop 51) took 2x wide's time,
  // latency-bound on those loads. By the producer warp (two warpgroups), or (three) by warp 0 for the ring's first
  // tiles and then by the warp that releases a stage last.
  auto load_tile = [&](int tl, bool lead, const unsigned char* base_step) {  // base_step: the step's base logits
    if (lead) {
      const int s = tl & (num_stages - 1);
      tc_bar_expect(L.full + s, TC_TILE_BYTES);
      unsigned char* dst = L.stages + s * TC_TILE_BYTES;
      const int y0 = (int)((tile0 + tl) * TC_TOK);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) tc_tma_load(dst + kb * TC_BOX_BYTES, w2, kb * 64, y0, L.full + s);
      if (pf_w2 && tl + num_stages < my_tiles) tc_prefetch_tile(a, tile0 + tl + num_stages);
    }
    __syncwarp();
    const i64 t0 = (tile0 + tl) * TC_TOK;
    const i64 bytes = min((i64)TC_TOK, vocab - t0) * 2;
    for (int r = lane; r < rows; r += 32) {
      const unsigned char* row = base_step + (r * a.stride_br + t0) * 2;
      dm::prefetch_l2(row);
      dm::prefetch_l2(row + bytes - 2);  // (the segment may straddle two 128-byte lines)
    }
  };
#if TC_WGS == 2
  if (warp == TC_CONSUMER_THREADS / 32) {  // the producer: W2 tiles through the ring (needs no codes: starts at once)
    if (lane == 0) asm volatile("prefetch.tensormap [%0];" :: "l"((u64)w2) : "memory");
    const unsigned char* base_step = (const unsigned char*)a.base + a.step * a.stride_bn * 2;
    for (int tl = 0; tl < my_tiles; ++tl) {
      const int s = tl & (num_stages - 1), use = tl >> log2_stages;
      if (lane == 0 && use > 0) tc_bar_wait(L.empty + s, (u32)((use - 1) & 1));
      load_tile(tl, lane == 0, base_step);
    }
    return;
  }
#else
  const unsigned char* base_step = (const unsigned char*)a.base + a.step * a.stride_bn * 2;
  if (warp == 0) {  // the ring's first tiles (then each stage is refilled by the warp that releases it last)
    if (lane == 0) asm volatile("prefetch.tensormap [%0];" :: "l"((u64)w2) : "memory");
    for (int tl = 0; tl < min(my_tiles, num_stages); ++tl) load_tile(tl, lane == 0, base_step);
  }
#endif

  // Consumers (TC_CONSUMER_THREADS): the step's row keys, empty partials, the codes W1[prev] in the swizzled layout.
  auto prev_token = [&](int r) -> i64 {  // row r's previous token, clamped as dm_wide_finish's gather (0 past the rows)
    if (r >= rows) return 0;
    const i64 t = a.step == 0 ? (a.anchor64 ? ((const i64*)a.anchor)[r] : (i64)((const i32*)a.anchor)[r])
                              : ((const i64*)a.tokens)[r * a.tokens_row_stride + (a.step - 1) * a.tokens_step_stride];
    return t < 0 ? 0 : (t >= a.embed_rows ? a.embed_rows - 1 : t);
  };
  {
    const WideRow* keys = (const WideRow*)a.keys + a.step * (i64)rows16;
    for (int r = tid; r < rows_alloc; r += TC_CONSUMER_THREADS) {
      WideRow k;
      if (r < rows16) {
        k = keys[r];
      } else {  // rows of the last m-tile past the keys: greedy, no cache row (never stored nor merged)
        k.prefix = 0u; k.inv_temp = 1.0f; k.temp = 0.0f; k.base_off = 0; k.cache_off = -1; k.pad = 0;
      }
      if (!GUMBEL) k.pad = (i32)prev_token(r);  // (the key's spare word: the codes' row below)
      L.rows[r] = k;
#pragma unroll
      for (int g = 0; g < TC_WGS; ++g) L.part[g * rows_alloc + r] = make_float2(ninf, 0.0f);
    }
    if (GUMBEL)
      for (int i = tid; i < DM_TB_SIZE; i += TC_CONSUMER_THREADS) L.gtab[i] = ((const float*)a.gtab)[i];
    // The codes W1[token]. Inverse CDF: by cp.async, every chunk of the thread in flight at once (one round trip; the
    // first version loaded the token and the chunk in turn, ~2 dependent round trips per chunk and 32 chunks per
    // thread at 256 rows). Gumbel keeps that loop (with this one ptxas spills 20 bytes of its 168 registers).
    const uint4* embed = (const uint4*)a.embed;
    if (!GUMBEL) asm volatile("bar.sync 1, %0;" :: "n"(TC_CONSUMER_THREADS) : "memory");  // (the tokens in L.rows)
    for (int i = tid; i < rows_alloc * 32; i += TC_CONSUMER_THREADS) {
      const int r = i >> 5, q = i & 31;  // row, 16-byte chunk of its 512 bytes (rank 8q .. 8q + 7)
      const int kb = q >> 3, ch = q & 7;
      unsigned char* dst = L.codes + (kb * rows_alloc + r) * 128 + ((ch ^ (r & 7)) << 4);
      if (GUMBEL)
        *(uint4*)dst = r < rows ? embed[prev_token(r) * 32 + q] : make_uint4(0u, 0u, 0u, 0u);
      else
        dm::cp_async16(dst, embed + (i64)L.rows[r].pad * 32 + q, r < rows);  // (zeros past the rows)
    }
    if (!GUMBEL) {
      dm::cp_async_commit();
      dm::cp_async_wait_all();
    }
    // the codes are read by wgmma (the async proxy): make the generic-proxy stores visible to it
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync 1, %0;" :: "n"(TC_CONSUMER_THREADS) : "memory");
  }

  const int wg = warp >> 2, w = warp & 3;  // warpgroup, warp in it
  const int gq = lane >> 2, cq = lane & 3;  // lane row (of 8) and column pair (of 4) in the accumulator fragment
  const float scale = (float)a.scale;
  const unsigned short* base = (const unsigned short*)a.base;
  unsigned short* cache = (unsigned short*)a.cache;
  i64* words = (i64*)a.words;
  const float margin = (float)a.filter_margin;
  const u32 codes_addr = tc_smem(L.codes), stages_addr = tc_smem(L.stages);

  // This warpgroup's items k = 0 .. K - 1, (tile, m-tile) in tile order. Two warpgroups: from 2 m-tiles on each takes
  // the m-tiles of its parity in every tile; with one m-tile, the tiles of its parity. Every warpgroup waits for every
  // tile's full barrier in order (a skipped tile is released at once), so that each barrier's phases are observed in
  // order, and releases each tile once after its last item: a stage's empty barrier counts the consumer warps. (A
  // warpgroup releases its item's tile before it waits for a later one, so every tile is released in the end.)
#if TC_WGS == 2
  const int per_tile = mtiles >= 2 ? (mtiles - wg + 1) / 2 : 1;  // 1 or 2 (shifts below, no integer division)
  const int K = mtiles >= 2 ? my_tiles * per_tile : (my_tiles - wg + 1) / 2;
  auto tile_of = [&](int k) { return mtiles >= 2 ? (per_tile == 2 ? k >> 1 : k) : 2 * k + wg; };
  auto mtile_of = [&](int k) { return mtiles >= 2 ? wg + (per_tile == 2 ? 2 * (k & 1) : 0) : 0; };
  auto last_of_tile = [&](int k) { return mtiles >= 2 ? (per_tile == 1 || (k & 1)) : true; };
#else
  // TC_WGS warpgroups: the block's items i = tile * mtiles + m-tile in order, warpgroup wg taking i = wg + TC_WGS k.
  // i / mtiles by a multiply-high with ceil(2^32 / mtiles) (mtiles 2 .. 4: exact while i (mtiles - 1) < 2^32, i.e. for
  // every item count a block can have; mtiles = 1 selects i itself).
  const u32 total = (u32)(my_tiles * mtiles);
  const int K = total > (u32)wg ? (int)((total - (u32)wg + TC_WGS - 1) / TC_WGS) : 0;
  const u32 mdiv = mtiles == 2 ? 0x80000000u : (mtiles == 3 ? 0x55555556u : 0x40000000u);  // (rows <= 256: mtiles <= 4)
  auto tile_of = [&](int k) {
    const u32 i = (u32)(wg + TC_WGS * k);
    return (int)(mtiles >= 2 ? __umulhi(i, mdiv) : i);
  };
  auto mtile_of = [&](int k) { return wg + TC_WGS * k - tile_of(k) * mtiles; };
  auto last_of_tile = [&](int k) { return k + 1 >= K || tile_of(k + 1) != tile_of(k); };
#endif
#if TC_WGS == 2
  auto release_tile = [&](int tl) {
    __syncwarp();
    if (lane == 0) tc_bar_arrive(L.empty + (tl & (num_stages - 1)));
  };
#else
  // Each consumer warp releases every tile once, in tile order, after its wgmmas of it completed: an arrive on the
  // stage's empty mbarrier (release, as the two-warpgroup build's) and a relaxed shared-memory count that names the
  // warp refilling the stage, the last one to count; that warp waits for the mbarrier's phase (acquire: every warp's
  // release) and loads tile tl + num_stages into it, so no other warp waits on a release. (Stop 53's version ordered
  // the count by two __threadfence_block, MEMBAR.SC.CTA in SASS: a fence that waits for the warp's outstanding memory
  // operations, here the next item's base logits issued just before; stop 54's profile of that build put 1.94 of its
  // 8.7 cycles per issued instruction on long-scoreboard waits.)
  auto release_tile = [&](int tl) {
    __syncwarp();
    const int s = tl & (num_stages - 1);
    u32 done = 0u;
    if (lane == 0) {
      tc_bar_arrive(L.empty + s);
      done = atomicAdd(L.count + s, 1u) % (TC_CONSUMER_THREADS / 32) == TC_CONSUMER_THREADS / 32 - 1;
    }
    if (__shfl_sync(0xFFFFFFFFu, done, 0) && tl + num_stages < my_tiles) {
      if (lane == 0) tc_bar_wait(L.empty + s, (u32)((tl >> log2_stages) & 1));
      load_tile(tl + num_stages, lane == 0, base_step);
    }
  };
#endif
  int passed = 0;  // tiles whose full barrier this warpgroup has waited for
  auto pass_to = [&](int tl) {
    for (; passed <= tl; ++passed) {
      tc_bar_wait(L.full + (passed & (num_stages - 1)), (u32)((passed >> log2_stages) & 1));
      if (passed < tl) release_tile(passed);  // no item of this warpgroup in it
    }
  };
  // The 16 wgmmas of item k into d. An item k >= K (a dummy: see the loop below) multiplies the codes by themselves
  // (shared memory nobody writes during the loop) and its result is never stored.
  auto issue = [&](int k, float* d) {
    const bool real = k < K;
    const int tl = real ? tile_of(k) : 0, mt = real ? mtile_of(k) : 0;
    if (real) pass_to(tl);
    const u32 b_addr = real ? stages_addr + (tl & (num_stages - 1)) * TC_TILE_BYTES : codes_addr;
    const int b_kblock = real ? TC_BOX_BYTES : rows_alloc * 128;
    // The 16 descriptors from two low words: every address here is below 2^18 (shared memory) and a multiple of 16, so
    // tc_desc_lo(addr + off) = tc_desc_lo(addr) + (off >> 4) with no carry out of the start-address field (stop 54
    // computed each descriptor from its address: ~14 instructions a wgmma, now ~8).
    const u32 da0 = tc_desc_lo(codes_addr + mt * TC_MROWS * 128), db0 = tc_desc_lo(b_addr);
    const u32 da_kb = (u32)rows_alloc * 8u, db_kb = (u32)b_kblock >> 4;  // (one k-block further, in 16-byte units)
    tc_fence_acc(d);
    tc_fence();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const u32 kb = (u32)kk >> 2, ko = (u32)(kk & 3) * 2u;  // (32 bytes per k-step: 2 units)
      tc_mma(d, tc_desc_of(da0 + kb * da_kb + ko), tc_desc_of(db0 + kb * db_kb + ko), kk > 0);
    }
    tc_commit();
    tc_fence_acc(d);
  };
  // The base logit pairs of item k: bv[h * 8 + j] holds tokens 8j + 2cq, + 1 of row 16w + gq + 8h of its m-tile.
  // Where item k's values of this thread lie: its first token t0 (of 8j + 2cq, + 1) and, per h, its row r; an item
  // k >= K (a dummy) maps to tile 0 / m-tile 0 with every row out (rv false: every store, merge and word skipped).
  struct Place {
    i64 t0;
    int r[2];
    bool rv[2];
  };
  auto place_of = [&](int k) {
    const bool real = k < K;
    const int tl = real ? tile_of(k) : 0, mt = real ? mtile_of(k) : 0;
    Place pl;
    pl.t0 = (tile0 + tl) * TC_TOK + 2 * cq;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pl.r[h] = mt * TC_MROWS + 16 * w + gq + 8 * h;
      pl.rv[h] = real && pl.r[h] < rows;
    }
    return pl;
  };
  auto load_base = [&](int k, u32* bv, i64* wv) {
    const Place pl = place_of(k);
    const i64 t0 = pl.t0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = pl.r[h];
      const i64 off = L.rows[r].base_off;
      const bool rv = pl.rv[h];
      if (GUMBEL) wv[h] = rv ? dm::load_relaxed_i64(words + r) : DM_WORD_NONE;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const i64 t = t0 + 8 * j;
        bv[h * 8 + j] = rv && t < vocab ? tc_load_pair(base + off + t) : 0u;
      }
    }
  };
  // Epilogue of item k from its accumulator d (its wgmmas complete) and base pairs bv.
  // Gumbel: the epilogue measured in stop 51 (row by row; the two-row version below spilled registers here).
  auto epilogue_gumbel = [&](int k, const float* d, const u32* bv, const i64* wv) {
    const Place pl = place_of(k);
    const i64 t0 = pl.t0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = pl.r[h];
      const bool rv = pl.rv[h];  // (a dummy item: every store and word skipped)
      const WideRow rk = L.rows[r];
      const bool greedy = rk.temp == 0.0f;
      float zf[16], bnd[16];  // z and the key bound
      u32 inmask = 0u;
      i64 best = DM_WORD_NONE;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const i64 t = t0 + 8 * j;
        const bool in = rv && t < vocab;  // (V even: t + 1 < V too)
        // bias pair and z pair each by one cvt.rn.bf16x2 (round to nearest even); a NaN bias only makes z NaN, and a
        // NaN z gets torch's payload 0x7FC0 before it is stored (the rare fix-up below)
        u32 bp = dm::pack_bf16x2_rn(d[j * 4 + h * 2], d[j * 4 + h * 2 + 1]);
        if (SCALE)
          bp = dm::pack_bf16x2_rn(dm::mul_rn(__uint_as_float(bp << 16), scale),
                                  dm::mul_rn(__uint_as_float(bp & 0xFFFF0000u), scale));
        const u32 ubase = bv[h * 8 + j];
        const float s0 = dm::add_rn(__uint_as_float(ubase << 16), __uint_as_float(bp << 16));
        const float s1 = dm::add_rn(__uint_as_float(ubase & 0xFFFF0000u), __uint_as_float(bp & 0xFFFF0000u));
        u32 zp = dm::pack_bf16x2_rn(s0, s1);
        if ((s0 != s0) | (s1 != s1))  // torch's NaN (rare)
          zp = (s0 != s0 ? 0x7FC0u : zp & 0xFFFFu) | (s1 != s1 ? 0x7FC00000u : zp & 0xFFFF0000u);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const float z = b ? __uint_as_float(zp & 0xFFFF0000u) : __uint_as_float(zp << 16);
          // the exact key's upper bound (wide.cu's): z / T plus the bucket's largest exact noise
          zf[j * 2 + b] = z;
          bnd[j * 2 + b] = greedy ? z : dm::add_rn(dm::mul_rn(z, rk.inv_temp),
                                                   L.gtab[dm::tb_bucket(dm::hash_finish(rk.prefix, (u32)(t + b)))]);
          inmask |= (in ? 1u : 0u) << (j * 2 + b);
        }
        if (in && rk.cache_off >= 0) *(u32*)(cache + rk.cache_off + t) = zp;
      }
      {  // wide.cu's ranking: exact keys only where a bound can still reach the row's best word
        // the row's word as lane cq = 0 read it (one value per quad)
        i64 word = (i64)(((u64)(u32)__shfl_sync(0xFFFFFFFFu, (u32)((u64)wv[h] >> 32), lane & ~3) << 32) |
                         (u32)__shfl_sync(0xFFFFFFFFu, (u32)((u64)wv[h] & 0xFFFFFFFFull), lane & ~3));
        // seed: a row without a word gets the exact key of the quad's largest bound (first token among equals); the
        // shuffles run on every lane of the warp whenever one of its rows needs a seed (uniform over a quad)
        const bool seed_row = rv && word == DM_WORD_NONE;
        if (__any_sync(0xFFFFFFFFu, seed_row)) {
          float sb = ninf;
          i32 si = -1;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const i32 ti = (i32)(t0 + 8 * (i >> 1) + (i & 1));
            if (seed_row && ((inmask >> i) & 1u) && bnd[i] > sb) { sb = bnd[i]; si = ti; }
          }
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1) {
            const float ob = __shfl_xor_sync(0xFFFFFFFFu, sb, off);
            const i32 oi = __shfl_xor_sync(0xFFFFFFFFu, si, off);
            if (oi >= 0 && (si < 0 || ob > sb || (ob == sb && oi < si))) { sb = ob; si = oi; }
          }
          i64 seed = DM_WORD_NONE;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const i32 ti = (i32)(t0 + 8 * (i >> 1) + (i & 1));
            if (seed_row && si >= 0 && ti == si) {  // this lane holds the seed token
              seed = dm::pack_word(dw_exact_key(zf[i], rk.temp, rk.prefix, (u32)ti), ti);
              atomicMax((long long*)(words + r), (long long)seed);
              inmask &= ~(1u << i);
            }
          }
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1) {
            const i64 o = dm::shfl_xor_i64(seed, off);
            seed = o > seed ? o : seed;
          }
          if (seed_row) word = seed;
        }
        if (rv) {
          const float thr = dm::skip_threshold(word, margin);
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if (((inmask >> i) & 1u) && !(bnd[i] < thr)) {  // rare: a token whose bound reaches the best key
              const i32 ti = (i32)(t0 + 8 * (i >> 1) + (i & 1));
              const i64 w = dm::pack_word(dw_exact_key(zf[i], rk.temp, rk.prefix, (u32)ti), ti);
              best = w > best ? w : best;
            }
          }
          if (best > word) atomicMax((long long*)(words + r), (long long)best);
        }
      }
    }
  };
  auto epilogue_icdf = [&](int k, const float* d, const u32* bv, const i64* wv) {
    const Place pl = place_of(k);
    const i64 t0 = pl.t0;
    // The thread's two rows side by side in every phase (their chains interleave: 8 warps per SM hide little latency;
    // the first version, row by row with a vote between them, issued 0.31 instructions per cycle and scheduler).
    int rr[2];
    bool rv[2], greedy[2];
    WideRow rk[2];
    float rcp[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rr[h] = pl.r[h];
      rv[h] = pl.rv[h];
      rk[h] = L.rows[rr[h]];
      greedy[h] = rk[h].temp == 0.0f;
      rcp[h] = dw_rcp_for(rk[h].temp, rk[h].inv_temp);
    }
    // x = z on greedy and T = 1 rows; the division only where a row of the warp needs it (one vote for both rows)
    const bool ident0 = greedy[0] || rk[0].temp == 1.0f, ident1 = greedy[1] || rk[1].temp == 1.0f;
    const bool all_ident = __all_sync(0xFFFFFFFFu, ident0 && ident1);
    float x[2][16];  // x = z / T
    i64 best[2] = {DM_WORD_NONE, DM_WORD_NONE};
    // Phase 1: bias, z, the cache write and x of all 32 values (independent chains).
    // The common item (stop 52): its 64 tokens inside the vocabulary, the warp's rows all samples with a cache row and
    // T in {0, 1} (x = z): the same values with no per-value predicate, division branch or padding word (the general
    // path below compiles to ~25 instructions per value, mostly those), and torch's NaN payload patched once per item
    // where a NaN appears (tc_torch_nan, once for the thread's 32 values).
    const bool interior = pl.t0 - 2 * cq + TC_TOK <= vocab;  // (the item's tile start: uniform over the warp)
    const bool fast = fast_ok && __all_sync(0xFFFFFFFFu, rv[0] && rv[1] && interior && rk[0].cache_off >= 0 &&
                                                        rk[1].cache_off >= 0 && ident0 && ident1);
    // TC_FASTDIV (stop 53, tc_fast_div; exact in its GPU tests, H100, stop 54): the same branch-free copy for an item
    // whose rows are samples with a cache row at any T, x = z / T by dw_div_rcp's reciprocal and two Markstein
    // corrections for every value (its range test folded into one flag, no per-value branch; where a row of the warp
    // needs div_rn, the quotients are redone with dw_div_rcp: the same values), instead of the general path's ~25
    // instructions per value.
    const bool fast_div = TC_FASTDIV && !fast && fast_ok &&
                          __all_sync(0xFFFFFFFFu, rv[0] && rv[1] && interior && rk[0].cache_off >= 0 &&
                                                  rk[1].cache_off >= 0);
    bool nan = true;  // whether an x of this thread may be NaN (the fast path knows)
    if (fast || fast_div) {
      u32 zp[2][8];
      nan = false;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          zp[h][j] = tc_z_pair<SCALE>(d[j * 4 + h * 2], d[j * 4 + h * 2 + 1], bv[h * 8 + j], scale, nan);
      if (nan)  // torch's NaN (rare)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 8; ++j) zp[h][j] = tc_torch_nan(zp[h][j]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned short* crow = cache + rk[h].cache_off + t0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *(u32*)(crow + 8 * j) = zp[h][j];
          x[h][2 * j] = __uint_as_float(zp[h][j] << 16);
          x[h][2 * j + 1] = __uint_as_float(zp[h][j] & 0xFFFF0000u);
        }
      }
      if (TC_FASTDIV && fast_div) {
        const bool id[2] = {ident0, ident1};
        bool slow = false;  // a zero, infinite or NaN z, or a T outside [2^-16, 2^16]: div_rn's value needed (rare)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < 16; ++i) slow |= !id[h] && !dw_rcp_ok(dm::mul_rn(x[h][i], rcp[h]));
        if (__any_sync(0xFFFFFFFFu, slow)) {
          nan = true;  // (x may be NaN where z is not: the NaN-sticky max below)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 16; ++i) x[h][i] = id[h] ? x[h][i] : dw_div_rcp(x[h][i], rk[h].temp, rcp[h]);
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 16; ++i)
              x[h][i] = id[h] ? x[h][i] : dw_markstein(x[h][i], rk[h].temp, rcp[h], dm::mul_rn(x[h][i], rcp[h]));
        }
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ident = all_ident || (h ? ident1 : ident0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const i64 t = t0 + 8 * j;
          const bool in = rv[h] && t < vocab;  // (V even: t + 1 < V too)
          // bias pair and z pair each by one cvt.rn.bf16x2 (round to nearest even); a NaN bias only makes z NaN, and
          // a NaN z gets torch's payload 0x7FC0 before it is stored
          bool nan_pair = false;
          u32 zp = tc_z_pair<SCALE>(d[j * 4 + h * 2], d[j * 4 + h * 2 + 1], bv[h * 8 + j], scale, nan_pair);
          if (nan_pair) zp = tc_torch_nan(zp);
          if (in && rk[h].cache_off >= 0) *(u32*)(cache + rk[h].cache_off + t) = zp;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const float z = b ? __uint_as_float(zp & 0xFFFF0000u) : __uint_as_float(zp << 16);
            const int i = j * 2 + b;
            x[h][i] = in ? (ident ? z : dw_div_rcp(z, rk[h].temp, rcp[h])) : ninf;
            if (in && rk[h].cache_off < 0) {
              const i64 word = dm::pack_word(z, (i32)(t + b));
              best[h] = word > best[h] ? word : best[h];
            }
          }
        }
      }
    }
    // Phase 2: each row's max over the quad's 64 tokens (a tree per lane, then the quad), both rows. Without a NaN in
    // the lane's values, fmaxf (one FMNMX) has the NaN-sticky max's value (a +-0 tie may keep the other zero: equal
    // in every later comparison, and exp(x - m) does not see the sign of a zero m).
    float m[2];
    if (!nan) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float t8[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) t8[i] = fmaxf(x[h][2 * i], x[h][2 * i + 1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) t8[i] = fmaxf(t8[2 * i], t8[2 * i + 1]);
        m[h] = fmaxf(fmaxf(t8[0], t8[1]), fmaxf(t8[2], t8[3]));
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float t8[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) t8[i] = dw_nan_max(x[h][2 * i], x[h][2 * i + 1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) t8[i] = dw_nan_max(t8[2 * i], t8[2 * i + 1]);
        m[h] = dw_nan_max(dw_nan_max(t8[0], t8[1]), dw_nan_max(t8[2], t8[3]));
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      const float o0 = __shfl_xor_sync(0xFFFFFFFFu, m[0], off), o1 = __shfl_xor_sync(0xFFFFFFFFu, m[1], off);
      m[0] = dw_nan_max(m[0], o0);
      m[1] = dw_nan_max(m[1], o1);
    }
    // Phase 3: sum exp(x - max), a tree per lane, then the quad; the partials merged per (warpgroup, row).
    float sm[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float e[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) e[i] = dw_exp(dm::sub_rn(x[h][i], m[h]));
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = dm::add_rn(e[2 * i], e[2 * i + 1]);
#pragma unroll
      for (int i = 0; i < 4; ++i) e[i] = dm::add_rn(e[2 * i], e[2 * i + 1]);
      sm[h] = dm::add_rn(dm::add_rn(e[0], e[1]), dm::add_rn(e[2], e[3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      const float o0 = __shfl_xor_sync(0xFFFFFFFFu, sm[0], off), o1 = __shfl_xor_sync(0xFFFFFFFFu, sm[1], off);
      sm[0] = dm::add_rn(sm[0], o0);
      sm[1] = dm::add_rn(sm[1], o1);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (m[h] == ninf) sm[h] = 0.0f;  // no token above -inf (-inf - -inf is NaN)
      if (cq == 0 && rv[h]) {
        float2* ps = L.part + wg * rows_alloc + rr[h];
        float2 pp = *ps;
        dw_merge(pp.x, pp.y, m[h], sm[h]);
        *ps = pp;
      }
    }
    // Padding samples: their argmax through the row's word (the quad's tokens merged first; the shuffles run on every
    // lane of the warp whenever one of its rows needs them: best is DM_WORD_NONE on the others).
    const bool pad0 = rv[0] && rk[0].cache_off < 0, pad1 = rv[1] && rk[1].cache_off < 0;
    if (__any_sync(0xFFFFFFFFu, pad0 || pad1)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        i64 o = dm::shfl_xor_i64(best[h], 1);
        best[h] = o > best[h] ? o : best[h];
        o = dm::shfl_xor_i64(best[h], 2);
        best[h] = o > best[h] ? o : best[h];
        if ((h ? pad1 : pad0) && cq == 0 && best[h] != DM_WORD_NONE)
          atomicMax((long long*)(words + rr[h]), (long long)best[h]);
      }
    }
  };
  auto epilogue = [&](int k, const float* d, const u32* bv, const i64* wv) {
    if (GUMBEL) epilogue_gumbel(k, d, bv, wv);
    else epilogue_icdf(k, d, bv, wv);
  };
  auto finish_mma = [&](int k) {  // item k's wgmmas complete (the only group in flight): release its tile if last
    tc_wait<0>();
    if (k < K && last_of_tile(k)) release_tile(tile_of(k));
  };

  // Two accumulators: item k + 1's wgmmas are issued before item k's epilogue, so the tensor cores run under it (item
  // k's wgmmas, issued one epilogue earlier, are complete by then: the wait costs nothing in steady state). The loop
  // body issues both accumulators' wgmmas unconditionally (items past K are dummies, their epilogues store nothing):
  // a wgmma issued under a branch while the other accumulator is read makes ptxas serialise every wgmma
  // (advisory C7518, checked by tests/draft/test_cuda_wide.py).
  float d0[32], d1[32];
  u32 b0[16], b1[16];
  i64 w0[2], w1[2];  // GUMBEL: the rows' words, read with the base logits
  if (!GUMBEL && K > 0) {
    // Inverse CDF: one copy of the epilogue in the loop (the two-item loop below inlines it twice: 7,848 instructions
    // in dm_wide_tc_icdf_s0 with both epilogue paths, against 4,848 here, and 14% of the stall cycles of a 253-row step
    // were instruction-cache misses; 156 registers instead of 168, which three warpgroups need; H100, stop 54: 319.5 ->
    // 289.5 us at 64 rows and 817 -> 709 at 253, T = 1, same call). Item k + 1's wgmmas always accumulate in d1; item
    // k's finished accumulator is moved to d0 (32 moves) before they are issued. The fence on d0 after the moves keeps
    // ptxas from serialising the wgmmas (without it: advisory C7518, a warpgroup wait in a divergent path).
    load_base(0, b0, w0);
    issue(0, d1);
#pragma unroll 1
    for (int k = 0; k < K; ++k) {
      load_base(k + 1, b1, w1);
      finish_mma(k);
      tc_fence_acc(d1);
#pragma unroll
      for (int i = 0; i < 32; ++i) d0[i] = d1[i];
      tc_fence_acc(d0);
      issue(k + 1, d1);
      epilogue(k, d0, b0, w0);
#pragma unroll
      for (int i = 0; i < 16; ++i) b0[i] = b1[i];
    }
    tc_wait<0>();
    tc_fence_acc(d1);
  } else if (K > 0) {  // Gumbel: two items per iteration, the accumulators taking turns
    load_base(0, b0, w0);
    issue(0, d0);
    for (int k = 0; k < K; k += 2) {
      load_base(k + 1, b1, w1);
      finish_mma(k);
      tc_fence_acc(d0);
      issue(k + 1, d1);
      epilogue(k, d0, b0, w0);
      load_base(k + 2, b0, w0);
      finish_mma(k + 1);
      tc_fence_acc(d1);
      issue(k + 2, d0);
      epilogue(k + 1, d1, b1, w1);
    }
    tc_wait<0>();
    tc_fence_acc(d0);
  }

  if (GUMBEL) return;  // (the words are merged; dm_wide_finish turns them into tokens)
  // The block's partial of each row: the warpgroups' partials merged in order.
  asm volatile("bar.sync 1, %0;" :: "n"(TC_CONSUMER_THREADS) : "memory");
  float2* part = (float2*)a.part;
  for (int r = tid; r < rows; r += TC_CONSUMER_THREADS) {
    float m = ninf, s = 0.0f;
    float2 pg[TC_WGS];
#pragma unroll
    for (int g = 0; g < TC_WGS; ++g) pg[g] = L.part[g * rows_alloc + r];
#pragma unroll
    for (int g = 0; g < TC_WGS; ++g) dw_merge(m, s, pg[g].x, pg[g].y);
    part[(i64)r * a.part_stride + blockIdx.x] = make_float2(m, s);
  }
}

// num_stages: W2 tiles in flight (cuda_wide.tc_stages: as many as shared memory holds, at most TC_MAX_STAGES);
// options: TC_OPT_GENERAL (1) sends every inverse-CDF item through the general epilogue (tests: the fast one must
// equal it); the Gumbel epilogue has one path (stop 52's branch-free Gumbel path was slower: NOTES.md);
// TC_OPT_NO_W2_PREFETCH (2): no L2 prefetch of W2 tiles ahead of their TMA (tc_prefetch_tile; for timing).
#define TC_OPT_GENERAL 1
#define TC_OPT_NO_W2_PREFETCH 2
#define TC_ENTRY(NAME, SCALE, GUMBEL)                                                                      \
  extern "C" __global__ void __launch_bounds__(TC_THREADS, 1)                                             \
      NAME(const WideArgs a, const __grid_constant__ TmaMap w2, const i64 num_stages, const i64 options) { \
    tc_body<SCALE, GUMBEL>(a, &w2, (int)num_stages, (options & TC_OPT_GENERAL) == 0,                      \
                           (options & TC_OPT_NO_W2_PREFETCH) == 0);                                        \
  }
TC_ENTRY(dm_wide_tc_icdf_s0, false, false)
TC_ENTRY(dm_wide_tc_icdf_s1, true, false)
TC_ENTRY(dm_wide_tc_gumbel_s0, false, true)
TC_ENTRY(dm_wide_tc_gumbel_s1, true, true)
