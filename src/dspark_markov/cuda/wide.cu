// impl="cuda_wide": the large-batch Gumbel sampler (32-256 rows) with the bias on tensor cores, CUDA C++ for sm_90.
//
// One launch per step (dm_wide_step) plus one small launch (dm_wide_finish) that turns the step's words into tokens
// and gathers the next step's codes. In dm_wide_step every warp owns 16-token groups of the vocabulary (group gw,
// gw + all warps, ...) and, per group:
//   - the group's W2 rows [16 tokens x 256] as mma B-fragments in registers (64 per lane), copied from a per-warp
//     shared-memory stage that cp.async filled during the previous group (W2 read once per step from HBM);
//   - for every 16-row m-tile (the codes W1[prev] of all rows sit in shared memory in A-fragment order, loaded
//     once per block and step): bias^T tile [16 rows x 16 tokens] on mma.sync m16n8k16 (fp32 accumulation; the
//     rank permuted identically in A and B so that every lane reads 16-byte chunks), rounded to bf16 (again after
//     `scale`), z = round_cache(float(U) + bias) with U read once (the tokens are permuted so that a lane holds 4
//     consecutive tokens of 2 rows: 8/16-byte loads and stores), the cache row of a live sample written once;
//   - every token ranked by an exact UPPER BOUND of its Gumbel key, z * (1/T) + table[bucket(hash)] (noise.cuh
//     tb_bucket, the per-bucket maximum of the exact noise over all 2^32 hashes; blocks.cu's table), against the
//     best exact key of the row found so far by ANY block (words[row], a packed (key, index) int64 merged with
//     atomicMax); exact keys (div_rn(z, T) + gumbel32, SPEC.md 4) only where a bound can still reach it.
//     A row with no word yet is seeded with the exact key of the m-tile's largest bound (warps start at different
//     m-tiles, so most rows are seeded by one warp before the others reach them).
// The merged word of a row is the torch.argmax of its keys (first NaN, then the first maximum). Greedy rows
// (T = 0, padding) rank z itself. Padding samples never write the cache.
//
// Bytes per step: W2 (V x 512) once, rows * V * (base + cache bytes), codes (rows x 512) per block from L2,
// words (rows x 8) per m-tile and group from L2.
//
// Written 2026-12-04 without a GPU (measured on the H200 2026-12-05: exact, slower than predicted below, 1,079 us per
// call at 253 rows, bf16, T = 1; opt-in, see draft/cuda_wide.py): compiled for sm_90 with
// NVRTC 13.0 (144-152 registers, no stack frame on the 8-warp entry points; the _p2 ones spill 8-32 bytes at 128),
// 430 SASS instructions per 16-row x 16-token m-tile on the bf16 vector path (~54 per logit, of which ~20 the
// bound: hash ~10, bucket + table 4, scale-add, select, compare). Expected, from that count at the H200's 4 issue
// slots per SM and 1.98 GHz: ~55-60 us per step at 253 rows at perfect issue (memory floor ~45 us, the tensor pipe
// ~31 us at 0.5 HMMA per clock per SM), i.e. ~300-420 us per call; at 64 rows ~25 us per step, bound by W2's
// 66 MB read (~15 us) plus base and cache. tools/gpu_plans/issue12_cuda_wide.sh measures it.
// Profiled first in stop 42 (Nsight Compute, H100, one step at 253 rows: 220 us Gumbel, 224 us inverse CDF): 8 warps
// per SM (one block: registers and the codes' shared memory), 0.30 instructions issued per scheduler and cycle, and a
// third (Gumbel) / a quarter (inverse CDF) of the stall samples on the first use of the m-tile's global loads (the row
// word, the base logits), issued right before its mma. They are now issued one m-tile ahead (167 us per step; whole
// calls on the H100: Gumbel 1,119 -> 855 us at 253 rows, 380 -> 327 at 64; inverse CDF 1,185 -> 1,057 / 416 -> 371).
// What stalls now: fixed-latency dependencies (33% of the samples). Two m-tiles computed side by side (stop 42's pair
// loop, run in stop 43 on an H100: exact, but 880 against 867 us at 253 rows, 344 against 329 at 64; Gumbel, T = 1;
// benchmarks/results/NVIDIA-H100-80GB-HBM3_2026-12-06_wide_pairs_table_copy_stop43.txt) did not pay: not kept.
//
// method="inverse_cdf" (icdf5, 2026-12-04; on the H200: exact, 1,171 us at 253 rows against wide's 544): the _icdf step entry points (8 warps, WPG = 1) give
// each block a contiguous run of icdf_gpb groups (64 = 1,024 tokens at V = 129,280 on 132 SMs: 127 blocks); the bias,
// z and the cache exactly as above; per row each 16-token group's partial (max x, sum exp(x - max)), x = z / T (div_rn's
// value from the row's 1 / T and two Markstein FMA corrections, dw_div_rcp; the identity at T = 1; z on greedy rows),
// reduced over the lane quad and merged into a per-(warp, row) partial in
// shared memory (the noise table's place), the block's warps merged in order into part[row][block] at the end. Only
// padding samples (no cache row) keep the word path (z ranks itself), skipped by a uniform branch in m-tiles without
// one. dm_wide_pick then draws each live row in one warp (dw_pick): T > 0 by block masses, u * total and only the
// chosen block's ~1,000 tokens re-read from the cache; greedy rows the first block holding the max, then its first
// such token; NaN / +inf / all -inf rows argmax_first.
// Compiled (NVRTC 13.0): 136-144 registers and no stack frame on the step, 127 on dm_wide_pick; ~347 static SASS
// instructions per 16 x 16 m-tile on the T = 1 bf16 path without padding (~42 per logit, both arms of the two merges
// counted: no hash, bound, table or word; 12 MUFU.EX2 and 8 SHFL per lane and m-tile), ~450 before greedy rows left the
// word path; ~408 with x = z / T (mixed T: +15 per row and token quadruple, ~+18%, where div_rn took ~+40%).
// Expected: issue ~42 us per step at 253 rows (memory floor ~45, tensor pipe ~31) + dm_wide_pick ~3-4 us,
// i.e. ~260-360 us per call; at 64 rows ~25-30 us per step, ~150-180 us per call (tools/gpu_plans/issue12_cuda_wide.sh
// icdf / icdf_time measure it).
#include "wide.cuh"

// WPG: warps per 16-token group (they share its W2 stage and split its m-tiles); the block has WARPS warps.
// ICDF: method="inverse_cdf" (WPG = 1): block b owns the contiguous groups [b icdf_gpb, (b + 1) icdf_gpb), its warps take
// every WARPS-th of them; every row adds each group's (max x, mass) into a per-(warp, row) partial in shared memory
// (x = z / T, z on greedy rows), merged per row at the end into part[row][b] (vocabulary order: the pick of
// dm_wide_pick, also the first argmax of greedy rows); padding samples (no cache row) keep the word path of the Gumbel
// method (z ranks itself), skipped by a uniform branch in the m-tiles without one.
template <bool BASE_F32, bool CACHE_F32, bool VEC, bool SCALE, int WARPS, int WPG, bool ICDF = false>
__device__ __forceinline__ void wide_body(const WideArgs& a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int THREADS = 32 * WARPS, TEAMS = WARPS / WPG;
  const int rows = (int)a.rows;
  const int mtiles = (rows + 15) >> 4;
  uint4* codes_s = (uint4*)smem;                                  // [mtiles][8][2][32]
  uint4* stage_s = codes_s + (size_t)mtiles * 512;                // [TEAMS][DW_STAGE_U4]
  float* gtab_s = (float*)(stage_s + TEAMS * DW_STAGE_U4);        // [DM_TB_SIZE] (Gumbel only)
  WideRow* rows_s = (WideRow*)(gtab_s + (ICDF ? 0 : DM_TB_SIZE));  // [mtiles * 16]
  float2* part_s = (float2*)(rows_s + mtiles * 16);               // ICDF: [WARPS][mtiles * 16] (max x, mass)
  int* padt_s = (int*)(part_s + WARPS * mtiles * 16);             // ICDF: [16] m-tile holds a padding sample
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int team = warp / WPG, sub = warp - team * WPG;
  const int g = lane >> 2, c = lane & 3;
  const i64 vocab = a.vocab;
  const float margin = (float)a.filter_margin;
  const float scale = (float)a.scale;
  const float ninf = -__int_as_float(0x7f800000);

  const int ngroups = (int)((vocab + DW_GROUP - 1) / DW_GROUP);
  const int gt = blockIdx.x * TEAMS + team, nt_all = gridDim.x * TEAMS;
  // This team's groups: g_first, + g_step, ... below g_end (Gumbel: strided over the grid; ICDF: the block's run).
  const int g_first = ICDF ? (int)(blockIdx.x * a.icdf_gpb) + team : gt;
  const int g_end = ICDF ? (int)min((i64)ngroups, (i64)(blockIdx.x + 1) * a.icdf_gpb) : ngroups;
  const int g_step = ICDF ? TEAMS : nt_all;
  uint4* stage = stage_s + team * DW_STAGE_U4;
  const uint4* head = (const uint4*)a.head;  // 32 uint4 per token
  // The W2 rows of group grp into this team's stage: lane (g, c) of n-tile nt reads token dw_token_of(nt, g),
  // k-chunk j: the 16 bytes j * 64 + 8c .. + 8 of the rank. With WPG = 2 each warp copies one n-tile.
  auto stage_group = [&](int grp) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if (WPG == 2 && nt != sub) continue;
      const i64 t = (i64)grp * DW_GROUP + dw_token_of(nt, g);
      const bool ok = t < vocab;
      const uint4* src = head + (ok ? t : 0) * 32 + c;
#pragma unroll
      for (int j = 0; j < 8; ++j) dm::cp_async16(stage + (nt * 8 + j) * 32 + lane, src + j * 4, ok);
    }
    dm::cp_async_commit();
  };
  if (g_first < g_end) stage_group(g_first);
  if ((a.flags & DW_F_PREFETCH) && g_first < g_end && c == 0) {  // the first group's base lines of this warp's m-tiles
    const i64 t = (i64)g_first * DW_GROUP;
    for (int mt = sub; mt < mtiles; mt += WPG) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const i64 r = mt * 16 + g + 8 * h;
        if (r < rows) {
          const char* np = (const char*)a.base + (r * a.stride_br + a.step * a.stride_bn + t) * (BASE_F32 ? 4 : 2);
          dm::prefetch_l2(np);
          if (BASE_F32 && t + 8 < vocab) dm::prefetch_l2(np + 32);
        }
      }
    }
  }

  // Block set-up, all by cp.async from L2: the codes (every row's A registers), the noise table and this step's row
  // keys (computed once per call by dm_wide_finish before step 0: no dependent loads here).
  {
    const uint4* codes_g = (const uint4*)a.codes;
    for (int i = tid; i < mtiles * 512; i += THREADS) dm::cp_async16(codes_s + i, codes_g + i, true);
    if (!ICDF) {
      const uint4* gtab_g = (const uint4*)a.gtab;
      for (int i = tid; i < DM_TB_SIZE / 4; i += THREADS) dm::cp_async16((uint4*)gtab_s + i, gtab_g + i, true);
    } else {
      for (int i = tid; i < WARPS * mtiles * 16; i += THREADS) part_s[i] = make_float2(ninf, 0.0f);
    }
    const uint4* keys_g = (const uint4*)((const WideRow*)a.keys + a.step * (i64)(mtiles * 16));
    for (int i = tid; i < mtiles * 16 * 2; i += THREADS) dm::cp_async16((uint4*)rows_s + i, keys_g + i, true);
    dm::cp_async_commit();
    dm::cp_async_wait_all();
    __syncthreads();
    if (ICDF) {  // which m-tiles hold a padding sample (no cache row: its argmax comes from the word path)
      if (tid < mtiles) {
        int any = 0;
        for (int r = tid * 16; r < min(rows, tid * 16 + 16); ++r) any |= rows_s[r].cache_off < 0 ? 1 : 0;
        padt_s[tid] = any;
      }
      __syncthreads();
    }
  }

  i64* words = (i64*)a.words;
  // The team's first m-tile (teams start apart, so most rows are seeded once before other teams reach them); its
  // warps take every WPG-th m-tile from there.
  const int moff = mtiles ? (gt * WPG) % mtiles : 0;
  // The global loads of an m-tile (its base logits and its rows' words) are issued one m-tile before its mma (across
  // group boundaries): Nsight Compute (stop 42, H100, 253 rows) found a quarter to a third of the warps' stall samples
  // on the first use of this m-tile's loads, issued right before its mma with two warps per scheduler to hide them.
  // One m-tile ahead measured fastest: two or four in a register shift queue were slower, the queue's moves at the top
  // of each m-tile waiting on the newest load (stop 42: 907 / 887 us against 855 at 253 rows, Gumbel). A word read an
  // m-tile early is at most as large as the current one, so its threshold only keeps more tokens for exact keys (never
  // another draw; a stale DM_WORD_NONE seeds again). The same loads also bring the L2 prefetch of the loaded m-tile's
  // rows of the next group.
  struct Loads {
    uint4 braw[2];
    i64 wread[2];
  };
  auto issue_loads = [&](int lgrp, int li, Loads& o) {
    int mt = li + moff;
    mt = mt >= mtiles ? mt - mtiles : mt;
    const int r0 = mt * 16 + g;
    // Rows ranked by words: every row (Gumbel); ICDF: only padding samples (the others are drawn by dm_wide_pick from
    // the partials and their cache rows), so an m-tile without one skips the word path (a uniform branch).
    const bool words_here = !ICDF || padt_s[mt] != 0;
    const i64 lt0 = (i64)lgrp * DW_GROUP + 4 * c;
    const bool lfull = lt0 + 4 <= vocab;
    // L2 prefetch of the next group's lines of each row as its m-tile comes (one group ahead: a few MB in flight).
    const i64 next_t0 = (i64)(lgrp + g_step) * DW_GROUP;
    const bool prefetch = (a.flags & DW_F_PREFETCH) && lgrp + g_step < g_end;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      o.braw[h] = make_uint4(0, 0, 0, 0);
      o.wread[h] = DM_WORD_NONE;
      if (r < rows) {
        if (words_here) o.wread[h] = dm::load_relaxed_i64(words + r);
        const i64 base_off = rows_s[r].base_off;
        if (prefetch && c == 0) {  // these rows of the team's next group into L2 (lane quad 0: 32 bytes of bf16)
          const char* np = (const char*)a.base + (base_off + next_t0) * (BASE_F32 ? 4 : 2);
          dm::prefetch_l2(np);
          if (BASE_F32 && next_t0 + 8 < vocab) dm::prefetch_l2(np + 32);
        }
        if (VEC && lfull) {
          const char* bp = (const char*)a.base + (base_off + lt0) * (BASE_F32 ? 4 : 2);
          if (BASE_F32) o.braw[h] = dm::load_cs16(bp);
          else {
            const uint2 v = dm::load_cs8(bp);
            o.braw[h].x = v.x;
            o.braw[h].y = v.y;
          }
        }
      }
    }
  };
  // The load cursor (lgrp, li) runs one m-tile ahead of the loop's (grp, i), in the same order; nxt holds its loads.
  Loads nxt;
  int lgrp = g_first, li = sub;
  auto advance = [&]() {
    li += WPG;
    if (li >= mtiles) {
      li = sub;
      lgrp += g_step;
    }
  };
  if (lgrp < g_end && sub < mtiles) {
    issue_loads(lgrp, li, nxt);
    advance();
  }
  for (int grp = g_first; grp < g_end; grp += g_step) {
    // This group's B fragments: stage -> registers, then the next group's rows into the stage.
    dm::cp_async_wait_all();
    if (WPG > 1) dw_bar(1 + team, 32 * WPG);
    else __syncwarp();
    uint4 bw[2][8];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 8; ++j) bw[nt][j] = stage[(nt * 8 + j) * 32 + lane];
    if (WPG > 1) dw_bar(1 + team, 32 * WPG);
    else __syncwarp();
    if (grp + g_step < g_end) stage_group(grp + g_step);
    const i64 t0 = (i64)grp * DW_GROUP + 4 * c;  // this lane's 4 tokens
    const bool full = t0 + 4 <= vocab;            // (VEC: vocab % 4 == 0, so !full means no token at all)

    for (int i = sub; i < mtiles; i += WPG) {
      int mt = i + moff;
      mt = mt >= mtiles ? mt - mtiles : mt;
      const int r0 = mt * 16 + g;  // this lane's rows r0 and r0 + 8
      const bool words_here = !ICDF || padt_s[mt] != 0;
      // This m-tile's loads (issued one m-tile ago), then the next m-tile's.
      uint4 braw[2];
      i64 wread[2];
      bool rin[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        braw[h] = nxt.braw[h];
        wread[h] = nxt.wread[h];
        rin[h] = r0 + 8 * h < rows;
      }
      if (lgrp < g_end) {
        issue_loads(lgrp, li, nxt);
        advance();
      }
      // bias^T [16 rows x 16 tokens]: two n-tiles, even and odd k-tiles in separate accumulators.
      float acc[2][2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][q][e] = 0.0f;
      const uint4* ca = codes_s + (size_t)mt * 512 + lane;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 a0 = ca[(j * 2) * 32], a1 = ca[(j * 2 + 1) * 32];  // the A registers of the two k-halves
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          dm::mma16816(acc[nt][0], a0.x, a0.y, a0.z, a0.w, bw[nt][j].x, bw[nt][j].y);
          dm::mma16816(acc[nt][1], a1.x, a1.y, a1.z, a1.w, bw[nt][j].z, bw[nt][j].w);
        }
      }
      // Epilogue: lane (g, c) holds rows r0 (h = 0) and r0 + 8 (h = 1), tokens t0 .. t0 + 3 (k = 2 nt + e).
      float z[2][4], thr[2];
      u32 mask = 0;
      // The bound of token t0 + k of row half h (greedy: z itself).
      auto bound = [&](int h, int k) -> float {
        const WideRow& rk = rows_s[r0 + 8 * h];
        return (ICDF || rk.temp == 0.0f) ? z[h][k]  // ICDF: only padding samples (greedy) are ranked
                               : dm::add_rn(dm::mul_rn(z[h][k], rk.inv_temp),
                                            gtab_s[dm::tb_bucket(dm::hash_finish(rk.prefix, (u32)(t0 + k)))]);
      };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const WideRow* rkp = rows_s + r0 + 8 * h;
        thr[h] = words_here ? dm::skip_threshold(wread[h], margin) : 0.0f;
        const bool here = rin[h] && (VEC ? full : t0 < vocab);
        // The bias in bf16: one cvt per pair (its NaN payload never reaches the cache: z = U + NaN is NaN and is
        // rounded again below), scaled and rounded again when scale != 1.
        float bias[4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int e = 2 * h;
          u32 p = dm::pack_bf16x2_rn(dm::add_rn(acc[nt][0][e], acc[nt][1][e]),
                                     dm::add_rn(acc[nt][0][e + 1], acc[nt][1][e + 1]));
          if (SCALE) p = dm::pack_bf16x2_rn(dm::mul_rn(__uint_as_float(p << 16), scale),
                                            dm::mul_rn(__uint_as_float(p & 0xFFFF0000u), scale));
          bias[2 * nt] = __uint_as_float(p << 16);
          bias[2 * nt + 1] = __uint_as_float(p & 0xFFFF0000u);
        }
        float s[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float u;
          if (VEC) {
            if (BASE_F32) {
              const u32 q[4] = {braw[h].x, braw[h].y, braw[h].z, braw[h].w};
              u = __uint_as_float(q[k]);
            } else {
              const u32 q = (k < 2) ? braw[h].x : braw[h].y;
              u = (k & 1) ? __uint_as_float(q & 0xFFFF0000u) : __uint_as_float(q << 16);
            }
          } else {
            u = ninf;
            if (rin[h] && t0 + k < vocab) {
              const i64 off = rkp->base_off + t0 + k;
              u = BASE_F32 ? ((const float*)a.base)[off] : dm::bf16(((const unsigned short*)a.base)[off]);
            }
          }
          s[k] = dm::add_rn(u, bias[k]);
        }
        u32 packed[2] = {0u, 0u};  // bf16 cache: z in pairs, as stored
        if (CACHE_F32) {
#pragma unroll
          for (int k = 0; k < 4; ++k) z[h][k] = s[k];
        } else {
          packed[0] = dm::pack_bf16x2_rn(s[0], s[1]);
          packed[1] = dm::pack_bf16x2_rn(s[2], s[3]);
          if ((s[0] != s[0]) | (s[1] != s[1]) | (s[2] != s[2]) | (s[3] != s[3])) {  // torch's NaN, 0x7FC0 (rare)
#pragma unroll
            for (int k = 0; k < 4; ++k)
              if (s[k] != s[k])
                packed[k >> 1] = (k & 1) ? (packed[k >> 1] & 0xFFFFu) | 0x7FC00000u
                                         : (packed[k >> 1] & 0xFFFF0000u) | 0x7FC0u;
          }
#pragma unroll
          for (int k = 0; k < 4; ++k)
            z[h][k] = (k & 1) ? __uint_as_float(packed[k >> 1] & 0xFFFF0000u) : __uint_as_float(packed[k >> 1] << 16);
        }
        const i64 cache_off = rkp->cache_off;
        if (here && cache_off >= 0) {  // the cache row of a live sample
          char* cp = (char*)a.cache + (cache_off + t0) * (CACHE_F32 ? 4 : 2);
          if (VEC) {
            if (CACHE_F32) {
              dm::store_cs16(cp, __float_as_uint(z[h][0]), __float_as_uint(z[h][1]), __float_as_uint(z[h][2]),
                             __float_as_uint(z[h][3]));
            } else {
              dm::store_cs8(cp, packed[0], packed[1]);
            }
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              if (t0 + k < vocab) {
                if (CACHE_F32) ((float*)cp)[k] = z[h][k];
                else ((unsigned short*)cp)[k] = (unsigned short)(__float_as_uint(z[h][k]) >> 16);
              }
            }
          }
        }
        const bool greedy = rkp->temp == 0.0f;
        if (!ICDF) {
          // Every bound computed (no branch per token), kept only as candidate bits.
          const float inv = rkp->inv_temp;
          const u32 prefix = rkp->prefix;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float noisy = dm::add_rn(dm::mul_rn(z[h][k], inv), gtab_s[dm::tb_bucket(dm::hash_finish(prefix, (u32)(t0 + k)))]);
            const float b = greedy ? z[h][k] : noisy;
            const bool in = here && (VEC || t0 + k < vocab);
            mask |= (in && !(b < thr[h]) ? 1u : 0u) << (4 * h + k);
          }
        } else {
          // Padding samples: candidate bits of z against the row's word. Every row: the group's partial of x = z / T
          // (z on greedy rows), its max over the 16 tokens (lane, then the lane quad) and sum exp(x - max) in the
          // order ((w0 + w1) + w2) + w3 per lane, then (lane c + lane c^1) + (the other pair).
          float x[4];
          const bool padrow = rkp->cache_off < 0;
          const float rcp = dw_rcp_for(rkp->temp, rkp->inv_temp);
#pragma unroll
          for (int k = 0; k < 4; ++k) x[k] = z[h][k];
          if (!greedy && rkp->temp != 1.0f) {  // x = z / T (one branch per row and m-tile, div_rn's values)
            const float t = rkp->temp;
            bool ok = true;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float q0 = dm::mul_rn(z[h][k], rcp);
              ok = ok && dw_rcp_ok(q0);
              x[k] = dw_markstein(z[h][k], t, rcp, q0);
            }
            if (!ok) {  // rare: a zero, +-inf, NaN, an extreme quotient or T outside [2^-16, 2^16]
#pragma unroll
              for (int k = 0; k < 4; ++k) x[k] = dm::div_rn(z[h][k], t);
            }
          }
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const bool in = here && (VEC || t0 + k < vocab);
            if (words_here) mask |= (padrow && in && !(z[h][k] < thr[h]) ? 1u : 0u) << (4 * h + k);
            x[k] = in ? x[k] : ninf;
          }
          float gm = dw_nan_max(dw_nan_max(x[0], x[1]), dw_nan_max(x[2], x[3]));
          gm = dw_nan_max(gm, __shfl_xor_sync(0xFFFFFFFFu, gm, 1));
          gm = dw_nan_max(gm, __shfl_xor_sync(0xFFFFFFFFu, gm, 2));
          float gs = dm::add_rn(dm::add_rn(dm::add_rn(dw_exp(dm::sub_rn(x[0], gm)), dw_exp(dm::sub_rn(x[1], gm))),
                                           dw_exp(dm::sub_rn(x[2], gm))), dw_exp(dm::sub_rn(x[3], gm)));
          gs = dm::add_rn(gs, __shfl_xor_sync(0xFFFFFFFFu, gs, 1));
          gs = dm::add_rn(gs, __shfl_xor_sync(0xFFFFFFFFu, gs, 2));
          if (gm == ninf) gs = 0.0f;  // no token above -inf (-inf - -inf is NaN)
          if (c == 0 && rin[h]) {
            float2* ps = part_s + warp * (mtiles * 16) + r0 + 8 * h;
            float2 p = *ps;
            dw_merge(p.x, p.y, gm, gs);
            *ps = p;
          }
        }
      }
      // Seeds: a row without a word gets the exact key of its largest bound in this m-tile (first token among
      // equals; none if every bound is NaN / -inf: then every token is exact).
      const bool need0 = words_here && rin[0] && wread[0] == DM_WORD_NONE && (!ICDF || rows_s[r0].cache_off < 0);
      const bool need1 = words_here && rin[1] && wread[1] == DM_WORD_NONE && (!ICDF || rows_s[r0 + 8].cache_off < 0);
      if (words_here && __any_sync(0xFFFFFFFFu, need0 || need1)) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool here = rin[h] && (VEC ? full : t0 < vocab);
          float ub[4];  // the bounds again (rare path: no registers kept for them in the common one)
#pragma unroll
          for (int k = 0; k < 4; ++k) ub[k] = here && (VEC || t0 + k < vocab) ? bound(h, k) : ninf;
          float sb = ninf;
          int si = -1;
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (ub[k] > sb) { sb = ub[k]; si = (int)(t0 + k); }
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1) {
            const float ob = __shfl_xor_sync(0xFFFFFFFFu, sb, off);
            const int oi = __shfl_xor_sync(0xFFFFFFFFu, si, off);
            if (oi >= 0 && (si < 0 || ob > sb || (ob == sb && oi < si))) { sb = ob; si = oi; }
          }
          const bool need = h ? need1 : need0;
          i64 word = DM_WORD_NONE;
          if (need && si >= 0 && si >= t0 && si < t0 + 4) {  // this lane holds the seed token
            const int k = (int)(si - t0);
            float zk = z[h][0];
#pragma unroll
            for (int q = 1; q < 4; ++q) zk = k == q ? z[h][q] : zk;  // no dynamic register index
            const WideRow& rk = rows_s[r0 + 8 * h];
            word = dm::pack_word(dw_exact_key(zk, rk.temp, rk.prefix, (u32)si), si);
            atomicMax((long long*)(words + r0 + 8 * h), (long long)word);
            mask &= ~(1u << (4 * h + k));
          }
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1) {
            const i64 o = dm::shfl_xor_i64(word, off);
            word = o > word ? o : word;
          }
          if (need && word != DM_WORD_NONE) {
            wread[h] = word;
            thr[h] = dm::skip_threshold(word, margin);
#pragma unroll
            for (int k = 0; k < 4; ++k)
              if (ub[k] < thr[h]) mask &= ~(1u << (4 * h + k));
          }
        }
      }
      // Exact keys where a bound can still reach the row's best (rare: lanes diverge here).
      if (mask) {
        i64 best0 = DM_WORD_NONE, best1 = DM_WORD_NONE;
        while (mask) {
          const int bit = __ffs(mask) - 1;
          mask &= mask - 1;
          const int h = bit >> 2, k = bit & 3;
          float zk = z[0][0];
#pragma unroll
          for (int q = 1; q < 8; ++q) zk = bit == q ? z[q >> 2][q & 3] : zk;  // no dynamic register index
          const WideRow& rk = rows_s[r0 + 8 * h];
          const float temp = rk.temp;
          const u32 prefix = rk.prefix;
          const i64 w = dm::pack_word(dw_exact_key(zk, temp, prefix, (u32)(t0 + k)), (i32)(t0 + k));
          if (h) best1 = w > best1 ? w : best1;
          else best0 = w > best0 ? w : best0;
        }
        if (best0 > wread[0]) atomicMax((long long*)(words + r0), (long long)best0);
        if (best1 > wread[1]) atomicMax((long long*)(words + r0 + 8), (long long)best1);
      }
    }
  }
  dm::cp_async_wait_all();
  if (ICDF) {  // the block's partial of each row: its warps' partials merged in warp order
    __syncthreads();
    float2* part = (float2*)a.part;
    for (int r = tid; r < rows; r += THREADS) {
      float m = ninf, s = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float2 p = part_s[w * (mtiles * 16) + r];
        dw_merge(m, s, p.x, p.y);
      }
      part[(i64)r * a.part_stride + blockIdx.x] = make_float2(m, s);
    }
  }
}

// One entry point per (base fp32, cache fp32, vector I/O, scale != 1), 8 warps of 16-token groups; and the
// variant of 16 warps, two per group (_p2), of every unscaled vector path.
#define DW_ENTRY(B, C, V, S)                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 1) dm_wide_b##B##_c##C##_v##V##_s##S(const WideArgs a) { \
    wide_body<B, C, V, S, 8, 1>(a);                                                                    \
  }
#define DW_ENTRY_P2(B, C)                                                                              \
  extern "C" __global__ void __launch_bounds__(512, 1) dm_wide_b##B##_c##C##_v1_s0_p2(const WideArgs a) { \
    wide_body<B, C, true, false, 16, 2>(a);                                                            \
  }
// method="inverse_cdf": 8 warps, each its own 16-token groups of the block's contiguous run.
#define DW_ENTRY_ICDF(B, C, V, S)                                                                      \
  extern "C" __global__ void __launch_bounds__(256, 1) dm_wide_b##B##_c##C##_v##V##_s##S##_icdf(const WideArgs a) { \
    wide_body<B, C, V, S, 8, 1, true>(a);                                                              \
  }
#ifdef DW_TWO_ENTRIES  // the CPU test's nvcc compile check: every template bit both ways
DW_ENTRY(0, 0, 1, 0)
DW_ENTRY(1, 1, 0, 1)
DW_ENTRY_P2(0, 0)
DW_ENTRY_ICDF(0, 0, 1, 0)
DW_ENTRY_ICDF(1, 1, 0, 1)
#else
DW_ENTRY(0, 0, 1, 0)
DW_ENTRY(0, 0, 1, 1)
DW_ENTRY(0, 0, 0, 0)
DW_ENTRY(0, 0, 0, 1)
DW_ENTRY(0, 1, 1, 0)
DW_ENTRY(0, 1, 1, 1)
DW_ENTRY(0, 1, 0, 0)
DW_ENTRY(0, 1, 0, 1)
DW_ENTRY(1, 0, 1, 0)
DW_ENTRY(1, 0, 1, 1)
DW_ENTRY(1, 0, 0, 0)
DW_ENTRY(1, 0, 0, 1)
DW_ENTRY(1, 1, 1, 0)
DW_ENTRY(1, 1, 1, 1)
DW_ENTRY(1, 1, 0, 0)
DW_ENTRY(1, 1, 0, 1)
DW_ENTRY_P2(0, 0)
DW_ENTRY_P2(0, 1)
DW_ENTRY_P2(1, 0)
DW_ENTRY_P2(1, 1)
DW_ENTRY_ICDF(0, 0, 1, 0)
DW_ENTRY_ICDF(0, 0, 1, 1)
DW_ENTRY_ICDF(0, 0, 0, 0)
DW_ENTRY_ICDF(0, 0, 0, 1)
DW_ENTRY_ICDF(0, 1, 1, 0)
DW_ENTRY_ICDF(0, 1, 1, 1)
DW_ENTRY_ICDF(0, 1, 0, 0)
DW_ENTRY_ICDF(0, 1, 0, 1)
DW_ENTRY_ICDF(1, 0, 1, 0)
DW_ENTRY_ICDF(1, 0, 1, 1)
DW_ENTRY_ICDF(1, 0, 0, 0)
DW_ENTRY_ICDF(1, 0, 0, 1)
DW_ENTRY_ICDF(1, 1, 1, 0)
DW_ENTRY_ICDF(1, 1, 1, 1)
DW_ENTRY_ICDF(1, 1, 0, 0)
DW_ENTRY_ICDF(1, 1, 0, 1)
#endif

// The draw of one live row of step `step` by its whole warp (every lane returns the token): the first argmax of z for a
// greedy row (T = 0: the first block whose partial max is the row's, then its first such token), else the inverse-CDF
// draw (SPEC.md 5, the rules of ops/pick.py):
// 1. the row's block partials (m_b = max z / T, s_b = sum exp(z / T - m_b), blocks in vocabulary order), lane l taking
//    the contiguous blocks [l P, l P + P): M = max m_b (NaN sticky); a NaN row takes its first NaN (the first block with
//    a NaN partial, then that block's first NaN z), a row with z / T = +inf somewhere its first maximum of z (the whole
//    row scanned: rare), an all -inf row token 0;
// 2. masses s_b exp(m_b - M) (0 where s_b = 0), summed sequentially per lane, a Hillis-Steele scan over the 32 lane
//    sums (shfl_up, o + own), each lane's running prefix from its exclusive sum; target = u * total; the first block
//    whose prefix exceeds the target with positive mass, else the last of positive mass; remaining = target - the
//    prefix before it;
// 3. only that block's tokens re-read from the cache (icdf_gpb * 16, ~1,000): weights exp(z / T - m_b) summed the
//    same way (lane chunks, scan, running prefix), times exp(m_b - M); the first token whose scaled prefix exceeds
//    the remaining target with positive weight, else the block's last of positive weight.
#define DW_PB 16  // block partials per lane held in registers across dw_pick's passes (more: re-read per pass)
#define DW_PT 32  // cached tokens per lane held in registers (more: re-read per pass); all loads of a chunk in flight

__device__ __forceinline__ i64 dw_pick(const WideArgs& a, i64 row, const WideRow& k, int lane) {
  const float ninf = -__int_as_float(0x7f800000), pinf = __int_as_float(0x7f800000);
  const unsigned FULL = 0xFFFFFFFFu;
  const i64 vocab = a.vocab;
  const int nb = (int)a.icdf_blocks;
  const float2* part = (const float2*)a.part + row * a.part_stride;
  const char* zrow = (const char*)a.cache + k.cache_off * (a.cache32 ? 4 : 2);
  auto zat = [&](i64 t) -> float {
    return a.cache32 ? ((const float*)zrow)[t] : dm::bf16(((const unsigned short*)zrow)[t]);
  };
  // 1. the partials of this lane's blocks [b0, b1), DW_PB at a time (beyond b1: -inf, no mass)
  const int per = (nb + 31) >> 5;
  const int b0 = lane * per, b1 = min(b0 + per, nb);
  const bool held = per <= DW_PB;
  float pm[DW_PB], ps[DW_PB];
  auto load_parts = [&](int c0) {
#pragma unroll
    for (int i = 0; i < DW_PB; ++i) {
      const float2 p = c0 + i < b1 ? part[c0 + i] : make_float2(ninf, 0.0f);
      pm[i] = p.x;
      ps[i] = p.y;
    }
  };
  float m = ninf;
  for (int c0 = b0; c0 < b1; c0 += DW_PB) {
    load_parts(c0);
#pragma unroll
    for (int i = 0; i < DW_PB; ++i) m = dw_nan_max(m, pm[i]);
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = dw_nan_max(m, __shfl_xor_sync(FULL, m, off));
  // The first token of block b with z NaN (nan) or z == zv, by lane-contiguous chunks of DW_PT loaded at once.
  auto first_in_block = [&](int b, bool nan, float zv) -> i64 {
    const i64 lo = (i64)b * a.icdf_gpb * DW_GROUP, hi = min(vocab, lo + a.icdf_gpb * DW_GROUP);
    const i64 pt = (hi - lo + 31) >> 5;
    const i64 t0 = lo + lane * pt, t1 = min(t0 + pt, hi);
    i64 found = -1;
    for (i64 c0 = t0; c0 < t1 && found < 0; c0 += DW_PT) {
      float zc[DW_PT];
#pragma unroll
      for (int i = 0; i < DW_PT; ++i) zc[i] = c0 + i < t1 ? zat(c0 + i) : 0.0f;
#pragma unroll
      for (int i = DW_PT - 1; i >= 0; --i)
        if (c0 + i < t1 && (nan ? zc[i] != zc[i] : zc[i] == zv)) found = c0 + i;
    }
    const unsigned has = __ballot_sync(FULL, found >= 0);
    return has ? __shfl_sync(FULL, found, __ffs(has) - 1) : -1;
  };
  // The first block whose partial max is NaN (nan) or equals mv.
  auto first_block = [&](bool nan, float mv) -> int {
    int fb = 0x7FFFFFFF;
    for (int c0 = b0; c0 < b1 && fb == 0x7FFFFFFF; c0 += DW_PB) {
      if (!held) load_parts(c0);
#pragma unroll
      for (int i = DW_PB - 1; i >= 0; --i)
        if (c0 + i < b1 && (nan ? pm[i] != pm[i] : pm[i] == mv)) fb = c0 + i;
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) fb = min(fb, __shfl_xor_sync(FULL, fb, off));
    return fb;
  };
  const bool greedy = k.temp == 0.0f;  // (a live greedy row: its partials hold max z per block)
  if (m != m) {  // the first NaN of z: in the first block whose partial is NaN
    const i64 t = first_in_block(first_block(true, 0.0f), true, 0.0f);
    return t < 0 ? 0 : t;  // (a NaN partial has a NaN z)
  }
  if (m == ninf && greedy) return 0;  // every z is -inf: argmax_first gives 0
  if (greedy) {  // the first maximum of z: in the first block whose max is the row's
    const i64 t = first_in_block(first_block(false, m), false, m);
    return t < 0 ? 0 : t;
  }
  if (m == pinf || m == ninf) {  // z / T = +inf somewhere (z = +inf, or z / T overflows), or every z / T = -inf (z = -inf,
    // or finite z whose z / T overflows to -inf): not finite, so argmax_first(z), the first maximum of z over the row
    float bz = ninf;
    i64 bi = 0x7FFFFFFFll;
    for (i64 t = lane; t < vocab; t += 32) {
      const float z = zat(t);
      if (bi == 0x7FFFFFFFll || z > bz) { bz = z; bi = t; }
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
      const float oz = __shfl_xor_sync(FULL, bz, off);
      const i64 oi = __shfl_xor_sync(FULL, bi, off);
      if (oz > bz || (oz == bz && oi < bi)) { bz = oz; bi = oi; }
    }
    return bi == 0x7FFFFFFFll ? 0 : bi;
  }
  // 2. the block: masses s_b exp(m_b - M), lane sums, scan, running prefixes (adding the 0 masses past b1 changes nothing)
  auto mass_of = [&](int i) { return ps[i] > 0.0f ? dm::mul_rn(ps[i], dw_exp(dm::sub_rn(pm[i], m))) : 0.0f; };
  float lsum = 0.0f;
  for (int c0 = b0; c0 < b1; c0 += DW_PB) {
    if (!held) load_parts(c0);
#pragma unroll
    for (int i = 0; i < DW_PB; ++i) lsum = dm::add_rn(lsum, mass_of(i));
  }
  float incl = lsum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const float o = __shfl_up_sync(FULL, incl, d);
    if (lane >= d) incl = dm::add_rn(o, incl);
  }
  float run = __shfl_up_sync(FULL, incl, 1);
  if (lane == 0) run = 0.0f;
  const float u = dm::uniform32(dm::hash_finish(k.prefix, 0xFFFFFFFFu));
  const float target = dm::mul_rn(u, __shfl_sync(FULL, incl, 31));
  int hitb = -1, lastb = -1;
  float before = 0.0f, before_last = 0.0f;
  for (int c0 = b0; c0 < b1; c0 += DW_PB) {
    if (!held) load_parts(c0);
#pragma unroll
    for (int i = 0; i < DW_PB; ++i) {
      const float mass = mass_of(i);
      const float next = dm::add_rn(run, mass);
      if (mass > 0.0f) {
        lastb = c0 + i;
        before_last = run;
        if (next > target && hitb < 0) { hitb = c0 + i; before = run; }
      }
      run = next;
    }
  }
  int chosen;
  float remaining;
  {
    const unsigned any_hit = __ballot_sync(FULL, hitb >= 0);
    if (any_hit) {
      const int src = __ffs(any_hit) - 1;
      chosen = __shfl_sync(FULL, hitb, src);
      remaining = dm::sub_rn(target, __shfl_sync(FULL, before, src));
    } else {
      const unsigned any_pos = __ballot_sync(FULL, lastb >= 0);
      if (!any_pos) return 0;  // no positive mass (cannot happen with a finite max: its token weighs 1)
      const int src = 31 - __clz(any_pos);
      chosen = __shfl_sync(FULL, lastb, src);
      remaining = dm::sub_rn(target, __shfl_sync(FULL, before_last, src));
    }
  }
  // 3. the token inside the chosen block, its tokens re-read from the cache: lane l the contiguous [t0, t1), DW_PT
  // weights at a time in registers (all their loads in flight at once; 0 past t1, which changes no sum)
  const float2 pc = part[chosen];
  const float mc = pc.x, scale_c = dw_exp(dm::sub_rn(pc.x, m)), temp = k.temp, rcp = dw_rcp_for(temp, k.inv_temp);
  const i64 lo = (i64)chosen * a.icdf_gpb * DW_GROUP, hi = min(vocab, lo + a.icdf_gpb * DW_GROUP);
  const i64 pt = (hi - lo + 31) >> 5;
  const i64 t0 = lo + lane * pt, t1 = min(t0 + pt, hi);
  const bool held_t = pt <= DW_PT;
  float w[DW_PT];
  auto load_weights = [&](i64 c0) {
    float zc[DW_PT];
#pragma unroll
    for (int i = 0; i < DW_PT; ++i) zc[i] = c0 + i < t1 ? zat(c0 + i) : ninf;
#pragma unroll
    for (int i = 0; i < DW_PT; ++i) w[i] = dw_exp(dm::sub_rn(dw_scaled(zc[i], temp, rcp), mc));
  };
  float wsum = 0.0f;
  for (i64 c0 = t0; c0 < t1; c0 += DW_PT) {
    load_weights(c0);
#pragma unroll
    for (int i = 0; i < DW_PT; ++i) wsum = dm::add_rn(wsum, w[i]);
  }
  incl = wsum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const float o = __shfl_up_sync(FULL, incl, d);
    if (lane >= d) incl = dm::add_rn(o, incl);
  }
  run = __shfl_up_sync(FULL, incl, 1);
  if (lane == 0) run = 0.0f;
  i64 hit = -1, last = -1;
  for (i64 c0 = t0; c0 < t1; c0 += DW_PT) {
    if (!held_t) load_weights(c0);
#pragma unroll
    for (int i = 0; i < DW_PT; ++i) {
      run = dm::add_rn(run, w[i]);
      if (w[i] > 0.0f) {
        last = c0 + i;
        if (hit < 0 && dm::mul_rn(run, scale_c) > remaining) hit = c0 + i;
      }
    }
  }
  const unsigned any_hit = __ballot_sync(FULL, hit >= 0);
  if (any_hit) return __shfl_sync(FULL, hit, __ffs(any_hit) - 1);
  const unsigned any_pos = __ballot_sync(FULL, last >= 0);
  return any_pos ? __shfl_sync(FULL, last, 31 - __clz(any_pos)) : lo;
}

// Between steps (one warp per row): the step's token (the merged word: torch.argmax of the row's keys, in [0, V))
// into draft_tokens[row, step] (step >= 0), the word reset, and the next step's codes W1[token] (or W1[anchor]
// for step = -1, before step 0) gathered into the codes buffer in A-fragment order (gather != 0).
// The codes buffer holds, per (m-tile mt, k-chunk j, k-half e, lane g * 4 + c), the 4 A registers of one mma as a
// uint4: {lo.x, hi.x, lo.y, hi.y} (e = 0) or {lo.z, hi.z, lo.w, hi.w} (e = 1), where lo / hi are the 16-byte chunks
// q = 4j + c (rank 8q .. 8q + 7) of rows 16 mt + g and 16 mt + g + 8: one LDS.128 per mma operand, no register moves.
// dm_wide_pick (method="inverse_cdf"): the same, with each T > 0 row's token from dw_pick.
template <bool ICDF>
__device__ __forceinline__ void wide_finish(const WideArgs& a, i64 step, i64 gather) {
  const int lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
  const i64 rows16 = (a.rows + 15) & ~15ll;
  if (step < 0 && row < rows16) {  // before step 0: every step's keys of this row (lane s: step s)
    for (i64 s = lane; s < a.num_steps; s += 32) {
      WideRow k;
      if (row < a.rows) {
        k = wide_row(a, row, s);
      } else {  // the rows of the last m-tile past R: greedy, no cache row
        k.prefix = 0u; k.inv_temp = 1.0f; k.temp = 0.0f; k.base_off = 0; k.cache_off = -1; k.pad = 0;
      }
      ((WideRow*)a.keys)[s * rows16 + row] = k;
    }
  }
  if (row >= a.rows) return;
  i64 token;
  if (step < 0) {
    token = a.anchor64 ? ((const i64*)a.anchor)[row] : (i64)((const i32*)a.anchor)[row];
  } else {
    i64* wp = (i64*)a.words + row;
    const i64 w = *wp;
    token = w == DM_WORD_NONE ? 0 : (i64)dm::word_index(w);
    if (ICDF) {
      const WideRow k = ((const WideRow*)a.keys)[step * ((a.rows + 15) & ~15ll) + row];
      if (k.temp != 0.0f || k.cache_off >= 0) token = dw_pick(a, row, k, lane);  // padding samples: the word
    }
    token = token < 0 ? 0 : (token >= a.vocab ? a.vocab - 1 : token);
    __syncwarp();
    if (lane == 0) {
      ((i64*)a.tokens)[row * a.tokens_row_stride + step * a.tokens_step_stride] = token;
      *wp = DM_WORD_NONE;
    }
  }
  if (step < 0 && lane == 0) ((i64*)a.words)[row] = DM_WORD_NONE;
  if (gather) {  // lane q: the 16-byte chunk q (rank 8q .. 8q + 7) of the row, as 4 words of two uint4 slots
    const i64 t = token < 0 ? 0 : (token >= a.embed_rows ? a.embed_rows - 1 : token);
    const uint4 v = ((const uint4*)a.embed)[t * 32 + lane];
    const int q = lane, h = (int)((row >> 3) & 1);
    u32* slot0 = (u32*)((uint4*)a.codes + (((row >> 4) * 8 + (q >> 2)) * 2) * 32 + (row & 7) * 4 + (q & 3));
    u32* slot1 = slot0 + 32 * 4;  // the next k-half's slot: 32 uint4 further
    slot0[h] = v.x;
    slot0[2 + h] = v.y;
    slot1[h] = v.z;
    slot1[2 + h] = v.w;
  }
}

extern "C" __global__ void __launch_bounds__(256) dm_wide_finish(const WideArgs a, i64 step, i64 gather) {
  wide_finish<false>(a, step, gather);
}
extern "C" __global__ void __launch_bounds__(256) dm_wide_pick(const WideArgs a, i64 step, i64 gather) {
  wide_finish<true>(a, step, gather);
}
