// The work list of verify.cu (its pieces and the order of its tickets). __host__ __device__, so the CPU tests
// build it as host C++ and check that every piece of every request is one ticket, each request's emit pieces
// after all of its stream pieces (tests/verify/test_cuda_verify.py).
#pragma once

#include "noise.cuh"

#define DV_TARGET_SEG 4096  // fp32 target values per stream piece (16 KB)
#define DV_SEG_BYTES 16384  // bytes per stream piece (a cache row: 8,192 bf16 or 4,096 fp32)

namespace dm {

struct Plan {
  int st, sc;            // 16 KB pieces per target row / cache row (one partial each)
  int mult, stt, sct;    // pieces per stream ticket; stream tickets per target row / cache row
  int si, e, es;         // stream tickets per request; emit tickets per request, tokens per emit ticket
  int lag, rows;
  i64 total;             // tickets
};

DM_HD Plan plan_of(i64 batch, i64 vocab, i64 k_drafts, bool bf16_cache, i64 lag, i64 emit_iters, i64 piece_mult) {
  Plan p;
  const int v = (int)vocab, k = (int)k_drafts;
  p.st = (v + DV_TARGET_SEG - 1) / DV_TARGET_SEG;
  const int c_seg = bf16_cache ? DV_SEG_BYTES / 2 : DV_SEG_BYTES / 4;
  p.sc = (v + c_seg - 1) / c_seg;
  p.mult = (int)piece_mult;
  p.stt = (p.st + p.mult - 1) / p.mult;
  p.sct = (p.sc + p.mult - 1) / p.mult;
  p.si = (k + 1) * p.stt + k * p.sct;
  p.es = 256 * (int)emit_iters;
  p.e = (v + p.es - 1) / p.es;
  p.lag = (int)(lag < batch ? lag : batch);
  p.rows = 2 * k + 1;
  p.total = batch * (i64)(p.si + p.e);
  return p;
}

// Ticket t -> (emit?, request b, index r): the stream tickets of requests 0..lag-1, then for each later request g
// its stream tickets followed by the emit pieces of request g - lag, then the emit pieces of the last lag requests.
DM_HD void decode(i64 t, const Plan& p, i64 batch, bool& emit, i64& b, int& r) {
  const i64 head = (i64)p.lag * p.si;
  if (t < head) {
    emit = false;
    b = t / p.si;
    r = (int)(t % p.si);
    return;
  }
  t -= head;
  const i64 group = p.si + p.e, mid = (batch - p.lag) * group;
  if (t < mid) {
    const i64 g = p.lag + t / group;
    const int q = (int)(t % group);
    emit = q >= p.si;
    b = emit ? g - p.lag : g;
    r = emit ? q - p.si : q;
    return;
  }
  t -= mid;
  emit = true;
  b = batch - p.lag + t / p.e;
  r = (int)(t % p.e);
}

}  // namespace dm
