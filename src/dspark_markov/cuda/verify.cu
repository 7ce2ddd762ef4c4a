// Standard verification in one persistent launch (issue 18; verify/cuda_verify.py is the launcher and the
// reference of every formula here is verify/triton_verify_stream.py, whose arithmetic this follows step by step).
//
// Work is a list of tickets that warps take one at a time (DV_STATIC: warp w takes tickets w, w + W, ...; otherwise
// from one atomic counter), so every warp streams until the list is empty and a request's pieces end within about
// one piece of each other, whatever the batch:
//   stream item (request b, row, segment): 16 KB of target row j (4,096 fp32) or of cache row j (8,192 bf16 /
//     4,096 fp32), reduced to (max, sum 2^((x - max) scale)), or to the first argmax for a greedy request's target
//     rows and a T = 0 request's cache rows (all that is read of those), and stored as one partial; the last
//     stream item of a request (an arrival counter) combines the partials, computes p_j(x_j), q_j(x_j), the
//     ratios and acceptance uniforms, the accepted count, and either writes the output row (greedy or padding
//     requests) or publishes the emitted row's statistics and raises the request's ready flag;
//   emit item (request b, segment e) of the emitted row j*: the Gumbel keys of the residual
//     log(max(p - q, 0)) + g (after a rejection) or of the bonus x + g, ranked by the cheap noise with the
//     exact noise for each lane's best (an exact rescan of the segment on a near-tie); the last emit item of a
//     request combines the segments and writes the output row.
// A request's emit items come `lag` requests after its stream items in the list. A warp takes its tickets in
// increasing order and waits only for a request whose stream tickets come before its own, so the smallest
// unfinished ticket can always finish: with the counter, every taken ticket is held by a running warp; with
// DV_STATIC, every block must be resident (as cuda_chain's grid barrier assumes; the launcher checks the occupancy).
// A bounded spin turns a broken assumption into status bit 1, never a hang. Counters are
// reset by their last user, so the launch can be replayed from a CUDA graph.
//
// Bytes per live request: (n + 1) V 4 target + n V c cache read once, the emitted row re-read (normally from L2),
// 16 B per stream item and per emit item of partials. Inputs: V % 8 == 0, 16-byte aligned rows (the launcher
// checks; otherwise the Triton verifier runs). Built with --fmad=false: the keys, uniforms and noise are the
// IEEE operations of rng.py, bit for bit.
#include "common.cuh"
#include "verify_plan.cuh"

#define DV_THREADS 256
#define DV_WARPS (DV_THREADS / 32)
#define DV_SPIN (1 << 22)            // polls (~64 ns apart) before a waiting emit item gives up: status bit 1
#define DV_MAX_ROWS 8                // K + 1 <= 8 (four lanes per row in the decision)

namespace dm {

// Flags (VerifyArgs.flags).
#define DV_HAS_GREEDY 1
#define DV_RAW 2
#define DV_CACHE_BF16 4
#define DV_DRAFTS_I64 8
#define DV_IDX_I64 16
#define DV_ND_I64 32
#define DV_POS_I64 64
#define DV_STATIC 128  // warp w takes tickets w, w + W, w + 2W, ... (no counter; every block must be resident)
#define DV_ROW_ARRIVALS 256  // stream tickets arrive on their row's counter, each row's last on the request's (and
                             // emit tickets on their group's counter, each group's last on the request's)
#define DV_QUEUE 512         // stream tickets from one counter in request order; a request's emit tickets exist only
                             // once it is decided (a ready list), and a warp serves its claimed emit ticket between
                             // stream tickets: no warp ever waits while stream work is left (see run_queue)
#define DV_READY 32          // VerifyArgs.global: the ready list's first word (its own 128-byte lines, away from the
                             // counters' atomics that the waiting warps' polls would otherwise share a line with)
#define DV_EMIT_GROUP 16     // emit tickets per group counter
#define DV_COUNTERS 128      // ints per request: stream arrivals, emit arrivals, ready flag, -, a counter per row
                             // (2K + 1), a counter per emit group (the launcher checks that they fit)

struct VerifyArgs {  // 8-byte fields; cuda_verify.VerifyArgs mirrors it
  const float* target;          // [B, K+1, V] fp32 (raw with DV_RAW)
  const void* drafts;           // [B, K] int32 / int64
  const void* cache;            // [S, N, V] bf16 / fp32
  const void* idx;              // [B] int32 / int64 slots (outside [0, S): padding)
  const void* nd;               // [B] num_drafts
  const void* pos;              // [B] positions
  const float* temp;            // [S] draft temperature
  const i64* seeds;             // [S]
  const unsigned char* greedy;  // [B] target greedy (DV_HAS_GREEDY; else T == 0)
  const float* ttemp;           // [S] target temperature (DV_RAW)
  float4* part;                 // [B, 2K+1, ST] stream partials (max, sum, argmax value, argmax token bits)
  float4* epart;                // [B, E] emit partials (key, token bits, any positive residual, -)
  float* emitp;                 // [B, 8] the emitted row: js, t_max, t_inv, q_cmax, q_inv, q_scale, q_arg, -
  int* counters;                // [B, DV_COUNTERS]: stream arrivals, emit arrivals, ready flag, -, rows', groups' ones
  int* global;                  // [DV_READY + B]: ticket counter, exits, status, then (DV_QUEUE) emit claims, ready
                                //   slots given out, requests decided; from DV_READY the ready list: slot s holds b + 1
  i64* tokens;                  // [B, K+1] output (stride tok_stride)
  i64* num_emitted;             // [B]
  u64* trace;                   // [tickets, 4] or null: per ticket start, end (%globaltimer ns), smid + flags, request
  i64 t_req, t_row, d_req, d_step, c_slot, c_step, tok_stride;
  i64 batch, vocab, num_slots, k, flags, lag, emit_iters, piece_mult;
};

__device__ __forceinline__ i64 load_int(const void* ptr, i64 i, bool wide) {
  return wide ? __ldg((const i64*)ptr + i) : (i64)__ldg((const int*)ptr + i);
}

struct Req {
  bool live, greedy;
  int n;
  i64 slot, seed, position;
  float temp, ttemp;
  // greedy or padding: the decision writes the output row, the emit tickets do nothing
  __device__ __forceinline__ bool direct() const { return greedy || !live; }
};

__device__ __forceinline__ Req request(const VerifyArgs& a, i64 b) {  // _request of the Triton verifier
  Req q;
  const i64 slot = load_int(a.idx, b, a.flags & DV_IDX_I64);
  q.live = slot >= 0 && slot < a.num_slots;
  q.slot = q.live ? slot : 0;
  i64 n = load_int(a.nd, b, a.flags & DV_ND_I64);
  n = n < 0 ? 0 : (n > a.k ? a.k : n);
  q.n = q.live ? (int)n : 0;
  q.position = load_int(a.pos, b, a.flags & DV_POS_I64);
  q.temp = q.live ? __ldg(a.temp + q.slot) : 0.0f;
  q.seed = q.live ? __ldg(a.seeds + q.slot) : 0;
  q.ttemp = (q.live && (a.flags & DV_RAW)) ? __ldg(a.ttemp + q.slot) : 0.0f;
  q.greedy = (a.flags & DV_HAS_GREEDY) ? __ldg(a.greedy + b) != 0 : q.temp == 0.0f;
  return q;
}

__device__ __forceinline__ float ex2(float x) {  // ex2.approx.ftz (the Triton verifier's hardware _exp2)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float scaled(float x, float t) { return t == 0.0f ? x : div_rn(x, t); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Arrival on a counter with release semantics (the arriving warp's stores before it are visible to whoever acquires
// the count); only the last arriver then acquires (fence.acq_rel), so the others skip the L1 invalidation an acquire
// costs. No fence.sc (__threadfence) per piece. (The first version's fences were not what made it slow: the same
// times without them; tools/model_cuda_verify.py puts it on same-word atomics, see cuda_verify.STATIC.)
__device__ __forceinline__ int arrive(int* counter) {
  int old;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ int load_acquire(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
__device__ __forceinline__ int load_relaxed(const int* word) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* flag, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" :: "l"(flag), "r"(v) : "memory");
}
// The last arriver's warp: lane 0 acquired with its arrival; the other lanes acquire the counter themselves.
__device__ __forceinline__ bool last_arrival(int* counter, int expected, int lane) {
  int last = 0;
  if (lane == 0) {
    last = arrive(counter) == expected - 1;
    if (last) fence_acquire();  // (with the release sequence of the arrivals: every arriver's stores visible)
  }
  last = __shfl_sync(0xFFFFFFFFu, last, 0);
  if (last && lane != 0) load_acquire(counter);
  __syncwarp();  // (orders the lanes' acquires before a reset of the counter by lane 0)
  return last;
}

// DV_ROW_ARRIVALS' two levels (same-address atomics serialise): the last of `members` arrivals on `word` resets it
// and arrives on `top`, whose last of `count` returns true.
__device__ __forceinline__ bool last_of_two(int* word, int members, int* top, int count, int lane) {
  if (!last_arrival(word, members, lane)) return false;
  if (lane == 0) *word = 0;  // every ticket counted on this word has arrived
  return last_arrival(top, count, lane);
}

#define DV_LOG2E 1.4426950408889634f
#define DV_LN2 0.6931471805599453f
#define DV_FMAX 3.4028234663852886e38f
// log2(e) / T for a cache row's softmax in the cache values' space (T == 0: 1), at most FLT_MAX: below T ~ 4e-39
// the quotient overflows and (c - max) * inf would be NaN at the row's maximum, where softmax(c / T) is one-hot there
__device__ __forceinline__ float cache_scale(float t) { return fminf(div_rn(DV_LOG2E, t == 0.0f ? 1.0f : t), DV_FMAX); }
#define DV_TINY 1.1754943508222875e-38f
#define DV_ACCEPT_DOMAIN 0x243F6A88u
#define DV_RESAMPLE_DOMAIN 0x85A308D3u
#define DV_FILTER_MARGIN 1e-4f  // ops.constants.FILTER_MARGIN (4 NOISE_BOUND)

// Argmax pairs: a NaN wins (the first NaN), else the larger value, ties to the lower token.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}
__device__ __forceinline__ void warp_argmax(float& v, int& i, int width = 32) {
  for (int off = 1; off < width; off <<= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, i, off);
    if (beats(ov, oi, v, i)) { v = ov; i = oi; }
  }
}
// (max, sum 2^((x - max) scale)) pairs merged.
__device__ __forceinline__ void merge_softmax(float& m, float& s, float om, float os, float scale) {
  const float nm = fmaxf(m, om);
  s = add_rn(mul_rn(s, ex2(mul_rn(sub_rn(m, nm), scale))), mul_rn(os, ex2(mul_rn(sub_rn(om, nm), scale))));
  m = nm;
}

// ------------------------------------------------------------------ stream item
struct Stats {
  float m, s, av;
  int ai;
};

// Eight values of one lane (tokens first..first+3, then second..second+3, increasing) into its running statistics:
// the softmax's (max, sum) for a sampled row, or only the first argmax for a greedy one (a target row of a greedy
// request, a cache row of T = 0: nothing else of those rows is read), ~2/3 and ~1/3 of the work of both.
template <bool ARG>
__device__ __forceinline__ void absorb8(Stats& st, const float* x, int first, int second, float scale) {
  if (ARG) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool better = x[i] > st.av || (x[i] != x[i] && st.av == st.av);
      if (better) { st.av = x[i]; st.ai = (i < 4 ? first : second - 4) + i; }
    }
    return;
  }
  float bm = x[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) bm = fmaxf(bm, x[i]);
  const float nm = fmaxf(st.m, bm);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum = add_rn(sum, ex2(mul_rn(sub_rn(x[i], nm), scale)));
  st.s = add_rn(mul_rn(st.s, ex2(mul_rn(sub_rn(st.m, nm), scale))), sum);
  st.m = nm;
}

__device__ __forceinline__ void widen(const uint4 v, bool bf16_row, float* x, int half) {
  if (bf16_row) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { x[2 * i] = __uint_as_float(w[i] << 16); x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u); }
  } else {
    x[4 * half + 0] = __uint_as_float(v.x); x[4 * half + 1] = __uint_as_float(v.y);
    x[4 * half + 2] = __uint_as_float(v.z); x[4 * half + 3] = __uint_as_float(v.w);
  }
}

// One 16 KB piece of a row (1,024 uint4; len valid tokens, a multiple of 8), each warp-wide load 512 contiguous
// bytes: lane l takes uint4 number (8 bt + i) 32 + l of batch bt; a bf16 uint4 holds 8 tokens, an fp32 one 4 (two
// of them, 32 apart, make the 8 values of one absorb8). Two batches of 8 uint4 (8 KB a warp) in flight. ARG: the
// first argmax only (max -FMAX, sum 0), else the softmax statistics only (argmax -inf at an out-of-range token).
template <bool BF16, bool ARG>
__device__ __forceinline__ Stats stream_piece(const char* row, int start, int len, float scale, bool divide,
                                              float t, int lane) {
  constexpr int PER_TOKEN_SHIFT = BF16 ? 3 : 2;  // tokens per uint4: 8 or 4
  const int vectors = len >> PER_TOKEN_SHIFT;
  Stats st;
  st.m = -DV_FMAX; st.s = 0.0f; st.av = neg_inf();
  st.ai = lane < vectors ? start + (lane << PER_TOKEN_SHIFT) : 0x7FFFFFFF;
  uint4 buf[2][8];
  auto load = [&](uint4* dst, int batch) {
    const uint4 ninf = BF16 ? make_uint4(0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u)
                            : make_uint4(0xff800000u, 0xff800000u, 0xff800000u, 0xff800000u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = (batch * 8 + i) * 32 + lane;
      dst[i] = u < vectors ? __ldcg((const uint4*)(row) + u) : ninf;
    }
  };
  load(buf[0], 0);
  load(buf[1], 1);
#pragma unroll
  for (int bt = 0; bt < 4; ++bt) {
    uint4* cur = buf[bt & 1];
    if (BF16) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int u = (bt * 8 + i) * 32 + lane;
        float x[8];
        widen(cur[i], true, x, 0);
        absorb8<ARG>(st, x, start + 8 * u, start + 8 * u + 4, scale);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int u = (bt * 8 + i) * 32 + lane;
        float x[8];
        widen(cur[i], false, x, 0);
        widen(cur[i + 1], false, x, 1);
        if (divide) {  // raw target logits: x / T correctly rounded (T not 0 or 1; -inf stays -inf)
#pragma unroll
          for (int j = 0; j < 8; ++j) x[j] = div_rn(x[j], t);
        }
        absorb8<ARG>(st, x, start + 4 * u, start + 4 * (u + 32), scale);
      }
    }
    if (bt + 2 < 4) load(buf[bt & 1], bt + 2);
  }
  return st;
}

__device__ __forceinline__ void reduce_stats(Stats& st, float scale) {
  float m = st.m;
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  float s = mul_rn(st.s, ex2(mul_rn(sub_rn(st.m, m), scale)));
  for (int off = 16; off > 0; off >>= 1) s = add_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, off));
  st.m = m;
  st.s = s;
  warp_argmax(st.av, st.ai);
}

// Partials sub, sub + 4, ... of one row (pieces < count) merged into st (its softmax statistics and first argmax;
// a row streams only one of the two, the other is inert: max -FMAX / sum 0, or -inf at the piece's first token).
__device__ __forceinline__ void merge_partials(Stats& st, const float4* part, int sub, int count, float scale) {
#pragma unroll 8
  for (int s = sub; s < count; s += 4) {
    const float4 v = __ldcg(part + s);
    merge_softmax(st.m, st.s, v.x, v.y, scale);
    if (beats(v.z, __float_as_int(v.w), st.av, st.ai)) { st.av = v.z; st.ai = __float_as_int(v.w); }
  }
}

// ------------------------------------------------------------------ the request's decision
// The last stream item's warp: four lanes per row j = lane / 4 (rows 0..K), each merging every fourth partial.
__device__ void decide(const VerifyArgs& a, const Plan& p, i64 b, const Req& q, int lane) {
  const int k = (int)a.k, n = q.n;
  const int j = lane >> 2, sub = lane & 3;
  const bool row = j <= k;
  const float q_scale = cache_scale(q.temp);
  const bool t_ok = row && q.live && j <= n;
  const bool q_ok = row && q.live && j < n && !q.greedy;
  Stats ts, cs;
  ts.m = -DV_FMAX; ts.s = 0.0f; ts.av = neg_inf(); ts.ai = 0x7FFFFFFF;
  cs = ts;
  const float4* tp = a.part + (b * p.rows + j) * p.st;
  const float4* cp = a.part + (b * p.rows + k + 1 + j) * p.st;
  // draft j, its target logit and its cached logit, loaded beside the partials
  const bool d_ok = row && j < n;
  i64 x = d_ok ? load_int(a.drafts, b * a.d_req + j * a.d_step, a.flags & DV_DRAFTS_I64) : 0;
  x = x < 0 ? 0 : (x >= a.vocab ? a.vocab - 1 : x);
  float zx = d_ok ? __ldg(a.target + b * a.t_req + j * a.t_row + x) : 0.0f;
  float cx = 0.0f;
  if (d_ok) {
    const i64 off = q.slot * a.c_slot + j * a.c_step + x;
    cx = (a.flags & DV_CACHE_BF16) ? __uint_as_float((u32)__ldg((const unsigned short*)a.cache + off) << 16)
                                  : __ldg((const float*)a.cache + off);
  }
  if (t_ok) merge_partials(ts, tp, sub, p.st, DV_LOG2E);
  if (q_ok) merge_partials(cs, cp, sub, p.sc, q_scale);
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    merge_softmax(ts.m, ts.s, __shfl_xor_sync(0xFFFFFFFFu, ts.m, off), __shfl_xor_sync(0xFFFFFFFFu, ts.s, off),
                  DV_LOG2E);
    merge_softmax(cs.m, cs.s, __shfl_xor_sync(0xFFFFFFFFu, cs.m, off), __shfl_xor_sync(0xFFFFFFFFu, cs.s, off),
                  q_scale);
  }
  warp_argmax(ts.av, ts.ai, 4);
  warp_argmax(cs.av, cs.ai, 4);
  const int t_arg = ts.ai < 0 ? 0 : (ts.ai >= a.vocab ? (int)a.vocab - 1 : ts.ai);
  const int q_arg = cs.ai < 0 ? 0 : (cs.ai >= a.vocab ? (int)a.vocab - 1 : cs.ai);
  // p_j(x_j), q_j(x_j), the ratio and the uniform (the Triton verifier's epilogue, operation for operation)
  if (a.flags & DV_RAW) zx = scaled(zx, q.ttemp);
  const float p_x = div_rn(exp2f(mul_rn(sub_rn(zx, ts.m), DV_LOG2E)), ts.s);
  const float q_max = scaled(cs.m, q.temp);
  // max(c) / T infinite (c / T overflowing, a +inf or all -inf row): softmax(c / T) is NaN everywhere, as in the
  // reference; a NaN normaliser makes the emit items' q (in the cache values' space) NaN too (the Triton verifier's rule)
  if (q.temp != 0.0f && j < n && fabsf(q_max) == __int_as_float(0x7F800000)) cs.s = __int_as_float(0x7FC00000);
  const float soft = div_rn(exp2f(mul_rn(sub_rn(scaled(cx, q.temp), q_max), DV_LOG2E)), cs.s);
  const float q_x = q.temp == 0.0f ? ((int)x == q_arg ? 1.0f : 0.0f) : soft;
  const float ratio = q_x > 0.0f ? div_rn(p_x, q_x) : 0.0f;
  const u32 prefix = hash_prefix(q.seed, q.position - 1, DV_ACCEPT_DOMAIN);
  const float u = uniform32(hash_finish(prefix, (u32)j));
  const bool accept = d_ok && u < ratio;
  const bool g_accept = d_ok && (int)x == t_arg;
  const u32 lead = 0x11111111u;  // one lane per row
  const u32 acc = __ballot_sync(0xFFFFFFFFu, accept) & lead;
  const u32 gacc = __ballot_sync(0xFFFFFFFFu, g_accept) & lead;
  const int count = (__ffs(~acc & lead) - 1) >> 2;  // the first failing row (rows past n fail)
  const int g_count = (__ffs(~gacc & lead) - 1) >> 2;
  int js = q.greedy ? g_count : count;
  js = js < 0 ? 0 : (js > n ? n : js);
  const int src = 4 * js;
  const float e_tmax = __shfl_sync(0xFFFFFFFFu, ts.m, src), e_tsum = __shfl_sync(0xFFFFFFFFu, ts.s, src);
  const float e_qmax = __shfl_sync(0xFFFFFFFFu, cs.m, src), e_qsum = __shfl_sync(0xFFFFFFFFu, cs.s, src);
  const int e_qarg = __shfl_sync(0xFFFFFFFFu, q_arg, src), e_targ = __shfl_sync(0xFFFFFFFFu, t_arg, src);
  if (q.direct()) {  // the output row now (the emit items of this request do nothing)
    const int xj = __shfl_sync(0xFFFFFFFFu, (int)x, 4 * (lane & 7));
    if (lane <= k) {
      i64 out = lane < js ? (i64)xj : (lane == js ? (i64)e_targ : -1);
      a.tokens[b * a.tok_stride + lane] = q.live ? out : -1;
    }
    if (lane == 0) a.num_emitted[b] = q.live ? js + 1 : 0;
  } else if (lane == 0) {
    // (emit items read e[0..6]; q_cmax / q_inv are meaningful only for T > 0 and e[7] only for greedy requests,
    // which never get here: a stream piece computes only what is read of its row, see stream_item)
    float* e = a.emitp + b * 8;
    e[0] = __int_as_float(js);
    e[1] = e_tmax;
    e[2] = div_rn(1.0f, e_tsum);
    e[3] = e_qmax;
    e[4] = div_rn(1.0f, e_qsum);
    e[5] = q_scale;
    e[6] = __int_as_float(e_qarg);
    e[7] = __int_as_float(e_targ);
    if (a.flags & DV_QUEUE) {  // the next slot of the ready list (its emit tickets can now be served)
      store_release(a.global + DV_READY + atomicAdd(a.global + 4, 1), (int)b + 1);
    } else {
      store_release(a.counters + DV_COUNTERS * b + 2, 1);  // ready
    }
  }
  if (lane == 0) {
    a.counters[DV_COUNTERS * b] = 0;  // every stream item of b has arrived
    if (a.flags & DV_QUEUE) arrive(a.global + 5);  // decided (after the slot: see run_queue's exit)
  }
}

// ------------------------------------------------------------------ emit item
struct EmitRow {
  int js, q_arg;
  float t_max, t_inv, q_cmax, q_inv, q_scale;
  bool rejected;
  u32 prefix;
};

// Key of one token of the emitted row (x: target value, already divided; c: cache value).
__device__ __forceinline__ float emit_key(const EmitRow& r, float x, float c, int token, float temp, float g,
                                          bool& positive) {
  if (r.rejected) {
    const float p = mul_rn(ex2(mul_rn(sub_rn(x, r.t_max), DV_LOG2E)), r.t_inv);
    const float qv = temp == 0.0f ? (token == r.q_arg ? 1.0f : 0.0f)
                                  : mul_rn(ex2(mul_rn(sub_rn(c, r.q_cmax), r.q_scale)), r.q_inv);
    const float d = sub_rn(p, qv);
    const float residual = d >= DV_TINY ? d : 0.0f;  // (NaN: 0)
    positive = residual > 0.0f;
    return add_rn(mul_rn(hw_log2(residual), DV_LN2), g);
  }
  positive = false;
  return add_rn(x, g);
}

// (key, token, any positive residual) of tokens [start, end) of the emitted row; exact: the exact noise for
// every token, else the cheap noise ranks and the exact noise decides among each lane's best (risky: a lane
// whose runner-up is too close, or a NaN: the caller rescans exactly).
template <bool BF16>
__device__ void emit_scan(const EmitRow& r, const float* trow, const void* crow, int start, int end, float temp,
                          float ttemp, bool divide, bool exact, int lane, float& out_key, int& out_tok, bool& out_pos,
                          bool& risky) {
  float best = neg_inf(), runner = neg_inf();
  int best_tok = 0x7FFFFFFF;
  float best_x = 0.0f, best_c = 0.0f;
  bool pos = false, nan = false;
  // Per step of 256 tokens a lane takes tokens base + 4 lane .. + 3 and base + 128 + 4 lane .. + 3 (each warp-wide
  // load contiguous); the next step's values are loaded before this step's keys are computed.
  const uint4 ninf = make_uint4(0xff800000u, 0xff800000u, 0xff800000u, 0xff800000u), zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 nt0 = ninf, nt1 = ninf, nc0 = zero, nc1 = zero;
  auto fetch = [&](int base) {
    const int t0 = base + 4 * lane, t1 = t0 + 128;
    nt0 = t0 < end ? *((const uint4*)(trow + t0)) : ninf;
    nt1 = t1 < end ? *((const uint4*)(trow + t1)) : ninf;
    if (r.rejected) {
      if (BF16) {
        const uint2 c0 = t0 < end ? *((const uint2*)((const unsigned short*)crow + t0)) : make_uint2(0u, 0u);
        const uint2 c1 = t1 < end ? *((const uint2*)((const unsigned short*)crow + t1)) : make_uint2(0u, 0u);
        nc0 = make_uint4(c0.x, c0.y, c1.x, c1.y);
      } else {
        nc0 = t0 < end ? *((const uint4*)((const float*)crow + t0)) : zero;
        nc1 = t1 < end ? *((const uint4*)((const float*)crow + t1)) : zero;
      }
    }
  };
  const bool valid = start + 4 * lane < end;  // the lane holds at least one token
  fetch(start);
#pragma unroll 1
  for (int base = start; base < end; base += 256) {
    float x[8], c[8];
    widen(nt0, false, x, 0);
    widen(nt1, false, x, 1);
    if (r.rejected) {
      if (BF16) {
        widen(nc0, true, c, 0);  // (tokens t0..t0+3, then t1..t1+3)
      } else {
        widen(nc0, false, c, 0);
        widen(nc1, false, c, 1);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = 0.0f;
    }
    if (base + 256 < end) fetch(base + 256);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int token = base + 4 * lane + (i < 4 ? i : 124 + i);  // (i >= 4: base + 128 + 4 lane + i - 4)
      if (token >= end) continue;
      const float xv = divide ? div_rn(x[i], ttemp) : x[i];
      const u32 h = hash_finish(r.prefix, (u32)token);
      const float u = uniform32(h);
      const float g = exact ? gumbel32(u) : approx_gumbel(u);
      bool p_i;
      const float key = emit_key(r, xv, c[i], token, temp, g, p_i);
      pos |= p_i;
      if (exact) {
        if (key > best || (key != key && best == best)) { best = key; best_tok = token; }
      } else {
        nan |= key != key;
        const bool better = key > best;
        runner = better ? best : fmaxf(runner, key);
        if (better) { best = key; best_tok = token; best_x = xv; best_c = c[i]; }
      }
    }
  }
  float value = best;
  int token = best_tok;
  if (!exact) {  // the exact key of the lane's best
    if (valid && best_tok != 0x7FFFFFFF) {
      bool unused;
      value = emit_key(r, best_x, best_c, best_tok, temp,
                       gumbel32(uniform32(hash_finish(r.prefix, (u32)best_tok))), unused);
    } else if (valid) {  // every key -inf: the lane's first token
      token = start + 4 * lane;
    }
  } else if (valid && best_tok == 0x7FFFFFFF) {
    token = start + 4 * lane;
  }
  if (!valid) { value = neg_inf(); token = 0x7FFFFFFF; }
  warp_argmax(value, token);
  out_key = value;
  out_tok = token;
  out_pos = __any_sync(0xFFFFFFFFu, pos);
  if (exact) {
    risky = false;
  } else {
    const float slack = key_slack(value, DV_FILTER_MARGIN);
    const float reach = value > neg_inf() ? value : __int_as_float(0x7f800000);
    const bool close = valid && runner >= sub_rn(best, slack) && add_rn(runner, slack) >= reach;
    risky = __any_sync(0xFFFFFFFFu, close || nan);
  }
}

__device__ __forceinline__ bool wait_ready(const VerifyArgs& a, i64 b, int lane) {
  int seen = 0;
  if (lane == 0) {
    int spins = 0;
    while (true) {  // relaxed polls (an acquire per poll would invalidate the SM's L1 each time), one acquire after
      seen = load_relaxed(a.counters + DV_COUNTERS * b + 2);
      if (seen != 0 || ++spins > DV_SPIN) break;
      __nanosleep(64);
    }
    if (seen == 0) atomicOr(a.global + 2, 1);
    fence_acquire();
  }
  seen = __shfl_sync(0xFFFFFFFFu, seen, 0);
  if (lane != 0) load_acquire(a.counters + DV_COUNTERS * b + 2);  // every lane's own acquire of the flag lane 0 saw
  return seen != 0;
}

// slot: DV_QUEUE's ready-list slot of b (the caller acquired it), else -1 (wait for b's ready flag here).
template <bool BF16>
__device__ void emit_item(const VerifyArgs& a, const Plan& p, i64 b, int e, const Req& q, int slot, int lane) {
  if (slot < 0) wait_ready(a, b, lane);
  const float* ep = a.emitp + b * 8;
  EmitRow r;
  r.js = __float_as_int(__ldcg(ep + 0));
  r.t_max = __ldcg(ep + 1);
  r.t_inv = __ldcg(ep + 2);
  r.q_cmax = __ldcg(ep + 3);
  r.q_inv = __ldcg(ep + 4);
  r.q_scale = __ldcg(ep + 5);
  r.q_arg = __float_as_int(__ldcg(ep + 6));
  r.rejected = r.js < q.n;
  r.prefix = hash_prefix(q.seed, q.position + r.js - 1, DV_RESAMPLE_DOMAIN);
  const float* trow = a.target + b * a.t_req + r.js * a.t_row;
  const char* crow = (const char*)a.cache + (q.slot * a.c_slot + (i64)(r.rejected ? r.js : 0) * a.c_step) * (BF16 ? 2 : 4);
  const bool divide = (a.flags & DV_RAW) && q.ttemp != 0.0f && q.ttemp != 1.0f;
  const int start = e * p.es;
  const int end = (int)(start + p.es < a.vocab ? start + p.es : a.vocab);
  float key;
  int tok;
  bool pos, risky;
  emit_scan<BF16>(r, trow, crow, start, end, q.temp, q.ttemp, divide, false, lane, key, tok, pos, risky);
  if (risky) {
    bool unused;
    emit_scan<BF16>(r, trow, crow, start, end, q.temp, q.ttemp, divide, true, lane, key, tok, pos, unused);
  }
  if (lane == 0) a.epart[b * p.e + e] = make_float4(key, __int_as_float(tok), pos ? 1.0f : 0.0f, 0.0f);
  int* counters = a.counters + DV_COUNTERS * b;
  if (a.flags & DV_ROW_ARRIVALS) {  // two levels: groups of DV_EMIT_GROUP emit tickets, then the groups' last ones
    const int group = e / DV_EMIT_GROUP, groups = (p.e + DV_EMIT_GROUP - 1) / DV_EMIT_GROUP;
    const int members = p.e - group * DV_EMIT_GROUP < DV_EMIT_GROUP ? p.e - group * DV_EMIT_GROUP : DV_EMIT_GROUP;
    if (!last_of_two(counters + 4 + p.rows + group, members, counters + 1, groups, lane)) return;
  } else if (!last_arrival(counters + 1, p.e, lane)) {
    return;
  }
  // The last emit item of b: combine the segments (in token order) and write the output row.
  float v = neg_inf();
  int t = 0x7FFFFFFF;
  bool any = false;
  for (int s = lane; s < p.e; s += 32) {
    const float4 w = __ldcg(a.epart + b * p.e + s);
    if (beats(w.x, __float_as_int(w.y), v, t)) { v = w.x; t = __float_as_int(w.y); }
    any |= w.z != 0.0f;
  }
  warp_argmax(v, t);
  any = __any_sync(0xFFFFFFFFu, any);
  if (r.rejected && !any) {  // the residual is all zero in fp32: the bonus keys of row js (rare), one warp
    EmitRow bonus = r;
    bonus.rejected = false;
    v = neg_inf();
    t = 0x7FFFFFFF;
    for (int s = 0; s < a.vocab; s += p.es) {
      const int stop = (int)(s + p.es < a.vocab ? s + p.es : a.vocab);
      float kk;
      int tt;
      bool pp, rr;
      emit_scan<BF16>(bonus, trow, crow, s, stop, q.temp, q.ttemp, divide, false, lane, kk, tt, pp, rr);
      if (rr) emit_scan<BF16>(bonus, trow, crow, s, stop, q.temp, q.ttemp, divide, true, lane, kk, tt, pp, rr);
      if (beats(kk, tt, v, t)) { v = kk; t = tt; }
    }
  }
  const int sampled = t < 0 ? 0 : (t >= a.vocab ? (int)a.vocab - 1 : t);
  if (lane <= a.k) {
    i64 out = -1;
    if (lane < r.js) {
      i64 x = load_int(a.drafts, b * a.d_req + lane * a.d_step, a.flags & DV_DRAFTS_I64);
      out = x < 0 ? 0 : (x >= a.vocab ? a.vocab - 1 : x);
    } else if (lane == r.js) {
      out = sampled;
    }
    a.tokens[b * a.tok_stride + lane] = out;
  }
  if (lane == 0) {
    a.num_emitted[b] = r.js + 1;
    a.counters[DV_COUNTERS * b + 1] = 0;  // every emit item of b has arrived (and passed its wait)
    a.counters[DV_COUNTERS * b + 2] = 0;
    if (slot >= 0) a.global[DV_READY + slot] = 0;  // (every claim of the slot has been served)
  }
}

template <bool BF16>
__device__ void stream_item(const VerifyArgs& a, const Plan& p, i64 b, int r, const Req& q, int lane) {
  // stream ticket r of request b: pieces s0 .. s0 + mult - 1 of target row j (r < (K+1) stt) or of cache row j
  const int k = (int)a.k;
  const bool is_target = r < (k + 1) * p.stt;
  const int rr = is_target ? r : r - (k + 1) * p.stt;
  const int per_row = is_target ? p.stt : p.sct;
  const int j = rr / per_row;
  const int row_pieces = is_target ? p.st : p.sc;
  const int s0 = (rr % per_row) * p.mult;
  const int s1 = s0 + p.mult < row_pieces ? s0 + p.mult : row_pieces;
  const bool work = q.live && (is_target ? j <= q.n : (j < q.n && !q.greedy));
  // (partial rows and their counters: targets 0..K, caches K+1..2K; recomputed after the pieces, not kept live
  // across them: one more register there spills in the bf16 kernel)
  auto partial_row = [&] { return is_target ? j : k + 1 + j; };
  if (work) {
    const int row_index = partial_row();
    const bool divide = (a.flags & DV_RAW) && q.ttemp != 0.0f && q.ttemp != 1.0f;
    const float q_scale = cache_scale(q.temp);
    // a greedy request's target rows and a T = 0 request's cache rows: the first argmax is all decide() and the emit
    // items read of them (a greedy request is direct; q of T = 0 is one-hot at the argmax); other rows: the softmax
    const bool arg_only = is_target ? q.greedy : q.temp == 0.0f;
#pragma unroll 1
    for (int s = s0; s < s1; ++s) {
      Stats st;
      if (is_target) {
        const int start = s * DV_TARGET_SEG;
        const int len = (int)(a.vocab - start < DV_TARGET_SEG ? a.vocab - start : DV_TARGET_SEG);
        const float* row = a.target + b * a.t_req + j * a.t_row + start;
        st = arg_only ? stream_piece<false, true>((const char*)row, start, len, DV_LOG2E, divide, q.ttemp, lane)
                      : stream_piece<false, false>((const char*)row, start, len, DV_LOG2E, divide, q.ttemp, lane);
        reduce_stats(st, DV_LOG2E);
      } else {
        const int seg = BF16 ? DV_SEG_BYTES / 2 : DV_SEG_BYTES / 4;
        const int start = s * seg;
        const int len = (int)(a.vocab - start < seg ? a.vocab - start : seg);
        const char* row = (const char*)a.cache + (q.slot * a.c_slot + (i64)j * a.c_step + start) * (BF16 ? 2 : 4);
        st = arg_only ? stream_piece<BF16, true>(row, start, len, q_scale, false, 1.0f, lane)
                      : stream_piece<BF16, false>(row, start, len, q_scale, false, 1.0f, lane);
        reduce_stats(st, q_scale);
      }
      if (lane == 0) a.part[(b * p.rows + row_index) * p.st + s] = make_float4(st.m, st.s, st.av, __int_as_float(st.ai));
    }
  }
  int* counters = a.counters + DV_COUNTERS * b;
  if (a.flags & DV_ROW_ARRIVALS) {  // a counter per row, each row's last on the request's
    if (last_of_two(counters + 4 + partial_row(), per_row, counters, p.rows, lane)) decide(a, p, b, q, lane);
  } else if (last_arrival(counters, p.si, lane)) {
    decide(a, p, b, q, lane);
  }
}

__device__ __forceinline__ void trace_ticket(const VerifyArgs& a, i64 index, u64 start, bool emit, bool direct, i64 b) {
  // tools/trace_cuda_verify.py: [start, end, smid + 2^8 emit + 2^9 direct, b] (lane 0)
  u32 smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  u64* t = a.trace + 4 * index;
  t[0] = start;
  t[1] = now_ns();
  t[2] = smid + (emit ? 256u : 0u) + (direct ? 512u : 0u);
  t[3] = (u64)b;
}

// Ready-list slot s's request + 1 (0: not yet set), the same in every lane; when set, lane 0 has acquired it and the
// warp barrier orders the other lanes' reads after that (the decision's emitp words are visible). seen: lane 0's
// relaxed read of the slot issued earlier (during the last stream piece), or -1 to read it now.
__device__ __forceinline__ int poll_slot(const VerifyArgs& a, int slot, int seen, int lane) {
  int v = 0;
  if (lane == 0) {
    v = seen >= 0 ? seen : load_relaxed(a.global + DV_READY + slot);
    if (v != 0) fence_acquire();
  }
  v = __shfl_sync(0xFFFFFFFFu, v, 0);
  __syncwarp();
  return v;
}

// DV_QUEUE: stream tickets t = b SI + r from global[0], in request order (a request's pieces are taken together, so
// they end together); a request's emit tickets exist only once its last stream ticket has decided it and set the
// next ready slot. Emit claims c = s E + e (global[3]) name slot s's ticket e: each warp holds one claim and, between
// stream tickets, serves it once its slot is set (else takes the next stream ticket). A warp waits only when no
// stream ticket is left, i.e. when every undecided request's pieces are held by running warps, which never wait
// before finishing them: no residency assumption, no deadlock. It leaves once its slot can no longer be set (every
// request decided, the slot past the last one given out).
template <bool BF16>
__device__ void run_queue(const VerifyArgs& a, const Plan& p, int lane) {
  const i64 stream_total = a.batch * (i64)p.si;
  auto take = [&](int* counter) {  // lane 0's fetch-and-add, in every lane
    unsigned int v = 0;
    if (lane == 0) v = atomicAdd((unsigned int*)counter, 1u);
    return __shfl_sync(0xFFFFFFFFu, v, 0);
  };
  // DV_STATIC: warp w's stream tickets are w, w + W, ... and its claims w, w + W, ... (no fetch-and-add on a shared
  // word, which serialise at ~15-20 ns each: H100 traces of stop 37); every block must then be resident.
  const bool fixed = (a.flags & DV_STATIC) != 0;
  const unsigned int warps = gridDim.x * DV_WARPS, warp = blockIdx.x * DV_WARPS + (threadIdx.x >> 5);
  int claim = fixed ? (int)warp : (int)take(a.global + 3);
  i64 t = fixed ? warp : take(a.global);  // the stream ticket held
  bool streaming = true;
  int seen = -1;  // lane 0: the claim's slot as read during the last stream piece (-1: read it now)
#pragma unroll 1
  while (true) {
    const int slot = claim / p.e;
    const int v = slot < a.batch ? poll_slot(a, slot, seen, lane) : 0;
    seen = -1;
    if (v > a.batch) {  // a slot left set by a launch that timed out (status bit 1: check() resets): never index by it
      if (lane == 0) atomicOr(a.global + 2, 1);
      return;
    }
    if (v != 0) {  // serve the claim (the stream ticket stays held)
      const i64 b = v - 1;
      const int e = claim - slot * p.e;
      const Req q = request(a, b);
      const u64 t0 = a.trace ? now_ns() : 0;
      emit_item<BF16>(a, p, b, e, q, slot, lane);
      if (a.trace && lane == 0) trace_ticket(a, stream_total + claim, t0, true, false, b);
      claim = fixed ? claim + (int)warps : (int)take(a.global + 3);
      continue;
    }
    if (streaming) {
      if (t < stream_total) {
        // the next stream ticket's fetch-and-add in flight while this one streams (its result is read after)
        unsigned int next = (unsigned int)t + warps;
        if (lane == 0 && !fixed) next = atomicAdd((unsigned int*)a.global, 1u);
        // the claim's slot read while this piece streams (no round trip of its own between pieces; a slot set during
        // the piece is served after the next one)
        if (lane == 0) seen = slot < a.batch ? load_relaxed(a.global + DV_READY + slot) : 0;
        const i64 b = t / p.si;
        const Req q = request(a, b);
        const u64 t0 = a.trace ? now_ns() : 0;
        stream_item<BF16>(a, p, b, (int)(t - b * p.si), q, lane);
        if (a.trace && lane == 0) trace_ticket(a, t, t0, false, q.direct(), b);
        t = __shfl_sync(0xFFFFFFFFu, next, 0);
        continue;
      }
      streaming = false;
    }
    // No stream ticket left: wait for the claim's slot, or leave once it can no longer be set.
    if (slot >= a.batch) return;  // (at most B slots are ever set)
    int state = 0;  // 1: set, 2: never
    if (lane == 0) {
      int spins = 0;
      while (true) {
        if (load_relaxed(a.global + DV_READY + slot) != 0) { state = 1; break; }
        // every request decided (acquire: every slot given out is counted in global[4]) and this slot past them
        if (load_acquire(a.global + 5) >= a.batch && load_relaxed(a.global + 4) <= slot) { state = 2; break; }
        if (++spins > DV_SPIN) { atomicOr(a.global + 2, 1); state = 2; break; }
        __nanosleep(64);
      }
    }
    state = __shfl_sync(0xFFFFFFFFu, state, 0);
    if (state == 2) return;  // (state 1: the next iteration acquires the slot and serves the claim)
  }
}

// The last block out resets the launch's words for the next launch: the ticket counter and the exit count, and the
// ready list's claims, slots given out and decisions (zero, unused, in the lag-ordered list).
__device__ __forceinline__ void reset_at_exit(const VerifyArgs& a) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();  // (the block's fetch-and-adds ordered before its exit count)
  if (atomicAdd(a.global + 1, 1) == (int)gridDim.x - 1) {
    __threadfence();  // (the reset after every block's fetch-and-adds, not only by their control dependence)
    a.global[0] = 0;
    a.global[1] = 0;
    a.global[3] = 0;
    a.global[4] = 0;
    a.global[5] = 0;
  }
}

// QUEUE: the entry points with the ready-list schedule (DV_QUEUE set by the launcher), a kernel of their own so that
// neither schedule's registers constrain the other's stream loops.
template <bool BF16, bool QUEUE>
__device__ __forceinline__ void run(const VerifyArgs& a) {
  const int lane = threadIdx.x & 31;
  const Plan p = plan_of(a.batch, a.vocab, a.k, (a.flags & DV_CACHE_BF16) != 0, a.lag, a.emit_iters, a.piece_mult);
  if (QUEUE) {
    run_queue<BF16>(a, p, lane);
    reset_at_exit(a);
    return;
  }
  // With the counter (a block takes its warps' first tickets in one atomic) a ticket is only ever held by a running
  // warp: a waiting emit item never waits for a block that has not started. DV_STATIC: no atomics at all.
  const bool fixed = (a.flags & DV_STATIC) != 0;
  const unsigned int warps = gridDim.x * DV_WARPS;
  __shared__ unsigned int first;
  if (threadIdx.x == 0) first = fixed ? blockIdx.x * DV_WARPS : atomicAdd((unsigned int*)a.global, (unsigned int)DV_WARPS);
  __syncthreads();
  i64 ticket = (i64)first + (threadIdx.x >> 5);
#pragma unroll 1
  while (ticket < p.total) {
    unsigned int taken = 0;
    bool emit;
    i64 b;
    int r;
    decode(ticket, p, a.batch, emit, b, r);
    const Req q = request(a, b);
    const u64 t_start = a.trace ? now_ns() : 0;
    if (emit) {
      // the next ticket only after this one: a warp waiting for a decision holds no other ticket (a stream ticket
      // taken ahead would delay its request's decision by this wait, and so on down the list)
      if (!q.direct()) emit_item<BF16>(a, p, b, r, q, -1, lane);
      if (lane == 0) taken = fixed ? (unsigned int)ticket + warps : atomicAdd((unsigned int*)a.global, 1u);
    } else {
      if (lane == 0) taken = fixed ? (unsigned int)ticket + warps : atomicAdd((unsigned int*)a.global, 1u);
      stream_item<BF16>(a, p, b, r, q, lane);
    }
    if (a.trace && lane == 0) trace_ticket(a, ticket, t_start, emit, q.direct(), b);
    ticket = (i64)__shfl_sync(0xFFFFFFFFu, taken, 0);
  }
  if (fixed) return;  // (no counter to reset: no block-exit atomics on one word either)
  reset_at_exit(a);
}

}  // namespace dm

extern "C" __global__ void __launch_bounds__(DV_THREADS, 2) dm_verify_bf16(const dm::VerifyArgs a) {
  dm::run<true, false>(a);
}
extern "C" __global__ void __launch_bounds__(DV_THREADS, 2) dm_verify_f32(const dm::VerifyArgs a) {
  dm::run<false, false>(a);
}
extern "C" __global__ void __launch_bounds__(DV_THREADS, 2) dm_verify_bf16_q(const dm::VerifyArgs a) {
  dm::run<true, true>(a);
}
extern "C" __global__ void __launch_bounds__(DV_THREADS, 2) dm_verify_f32_q(const dm::VerifyArgs a) {
  dm::run<false, true>(a);
}
