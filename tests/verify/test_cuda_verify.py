"""The CUDA verifier (verify/cuda_verify.py, cuda/verify.cu) on the CPU.

- verify.cu compiles for sm_90 (NVRTC, else nvcc; skipped without either) at <= 128 registers (two 8-warp blocks
  per SM, as its launch bounds and the launcher's grid assume);
- the ctypes argument struct is the kernel's, field for field;
- its work list (``verify_plan.cuh``, built as host C++): every stream piece and every emit piece of every request
  is exactly one ticket, each request's emit pieces come after all of its stream pieces (the order that makes a
  waiting warp wait only for tickets already taken), and the launcher's piece counts are the kernel's;
- the launcher's checks: a CPU device, K + 1 > 8, V not a multiple of 8, the block method, misaligned rows.
The kernel itself runs in tests/gpu/test_cuda_verify_gpu.py (reference equality, raw == pre-divided, graph
replays, chi-square).
"""

import ctypes
import re

import pytest
import torch

from dspark_markov.cuda import build
from dspark_markov.ops import constants
from dspark_markov.verify import cuda_verify as cv
from dspark_markov.verify import keys
from tests.helpers import host_library, sm90_compile_log


def test_kernel_compiles_for_sm90_at_two_blocks_per_sm(tmp_path):
    log, _ = sm90_compile_log("verify.cu", tmp_path)
    registers = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    assert len(registers) == len(cv.KERNELS) and max(registers) <= 128, log


def test_args_struct_and_constants_match_the_kernel():
    text = (build.SOURCE_DIR / "verify.cu").read_text()
    body = re.sub(r"//[^\n]*", "", re.search(r"struct VerifyArgs \{(.*?)\n\};", text, re.S).group(1))
    fields = []  # (8-byte kind, name): pointers are u64
    for kind, declared in re.findall(r"\b(i64|[A-Za-z0-9_ ]+\*)\s*([^;*]+);", body):
        fields += [("i64" if kind == "i64" else "u64", name.strip()) for name in declared.split(",")]
    kinds = {ctypes.c_uint64: "u64", ctypes.c_int64: "i64"}
    assert [(kinds[kind], name.rstrip("_")) for name, kind in cv.VerifyArgs._fields_] == fields
    assert ctypes.sizeof(cv.VerifyArgs) == 8 * len(cv.VerifyArgs._fields_)
    plan = (build.SOURCE_DIR / "verify_plan.cuh").read_text()
    assert re.search(rf"#define DV_THREADS {cv.THREADS}\b", text)
    assert re.search(rf"__launch_bounds__\(DV_THREADS, {cv.BLOCKS_PER_SM}\)", text)
    assert re.search(rf"#define DV_MAX_ROWS {cv.MAX_ROWS}\b", text)
    assert re.search(rf"#define DV_COUNTERS {cv.COUNTERS}\b", text) and cv.COUNTERS >= 4 + 2 * cv.MAX_ROWS - 1
    assert re.search(rf"#define DV_EMIT_GROUP {cv.EMIT_GROUP}\b", text)
    assert re.search(rf"#define DV_READY {cv.GLOBALS}\b", text)  # the ready list after the GLOBALS counters
    # the default schedules' emit groups fit beside the rows' counters at V = 129,280, K = 7
    for batch in (1, 16, 64, 253):
        _, iters, mult = cv.schedule(batch)
        assert 4 + 15 + -(-cv.pieces(7, 129_280, 2, iters, mult)[3] // cv.EMIT_GROUP) <= cv.COUNTERS
    assert re.search(rf"#define DV_TARGET_SEG {cv.TARGET_SEG}\b", plan)
    assert re.search(rf"#define DV_SEG_BYTES {cv.SEG_BYTES}\b", plan)
    for name, value in cv._FLAGS.items():
        assert re.search(rf"#define DV_{name.upper()} {value}\b", text), name


def test_hash_domains_and_margin_are_the_python_ones():
    # verify.cu spells the verification hash domains and the near-tie margin as literals: the same numbers as
    # keys.py and ops.constants, or the CUDA verifier's uniforms and noise would differ from the Triton verifier's
    text = (build.SOURCE_DIR / "verify.cu").read_text()
    assert int(re.search(r"#define DV_ACCEPT_DOMAIN (0x[0-9A-Fa-f]+)u", text).group(1), 16) == keys.ACCEPT_DOMAIN
    assert int(re.search(r"#define DV_RESAMPLE_DOMAIN (0x[0-9A-Fa-f]+)u", text).group(1), 16) == keys.RESAMPLE_DOMAIN
    margin = float(re.search(r"#define DV_FILTER_MARGIN ([0-9.eE+-]+)f", text).group(1))
    as_fp32 = [torch.tensor(value, dtype=torch.float32).item() for value in (margin, constants.FILTER_MARGIN)]
    assert as_fp32[0] == as_fp32[1]


HARNESS = r"""
#include "verify_plan.cuh"
using namespace dm;
// pieces of the plan, then (emit, b, r) of every ticket
extern "C" long long plan(long long batch, long long vocab, long long k, int bf16, long long lag, long long iters,
                          long long mult, int* counts) {
  const Plan p = plan_of(batch, vocab, k, bf16 != 0, lag, iters, mult);
  counts[0] = p.st; counts[1] = p.sc; counts[2] = p.si; counts[3] = p.e; counts[4] = p.lag;
  return p.total;
}
extern "C" void tickets(long long batch, long long vocab, long long k, int bf16, long long lag, long long iters,
                        long long mult, long long* out) {
  const Plan p = plan_of(batch, vocab, k, bf16 != 0, lag, iters, mult);
  for (long long t = 0; t < p.total; ++t) {
    bool emit; long long b; int r;
    decode(t, p, batch, emit, b, r);
    out[3 * t] = emit; out[3 * t + 1] = b; out[3 * t + 2] = r;
  }
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    lib = host_library(tmp_path_factory.mktemp("verify_plan"), HARNESS, "verify_plan.cuh")
    lib.plan.restype = ctypes.c_longlong
    lib.plan.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int] + [ctypes.c_longlong] * 3 + [ctypes.c_void_p]
    lib.tickets.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int] + [ctypes.c_longlong] * 3 + [ctypes.c_void_p]
    return lib


@pytest.mark.parametrize("batch,vocab,k,bf16,lag,iters,mult", [
    (1, 129_280, 5, 1, 4, 4, 1), (16, 129_280, 5, 1, 4, 4, 2), (5, 129_280, 5, 0, 8, 16, 3), (7, 4096, 3, 1, 0, 1, 1),
    (9, 8200, 7, 0, 3, 2, 5), (3, 304, 0, 1, 40, 32, 1), (253, 129_280, 5, 1, 16, 16, 4)])
def test_every_ticket_is_one_piece_and_emits_follow_their_stream(host, batch, vocab, k, bf16, lag, iters, mult):
    counts = (ctypes.c_int * 5)()
    total = host.plan(batch, vocab, k, bf16, lag, iters, mult, counts)
    st, sc, si, e, lag_used = list(counts)
    assert (st, sc, si, e) == cv.pieces(k, vocab, 2 if bf16 else 4, iters, mult)
    assert lag_used == min(lag, batch) and total == batch * (si + e)
    out = torch.zeros(3 * total, dtype=torch.int64)
    host.tickets(batch, vocab, k, bf16, lag, iters, mult, ctypes.c_void_p(out.data_ptr()))
    emit, b, r = out.view(total, 3).unbind(1)
    assert bool(((b >= 0) & (b < batch)).all())
    for kind, pieces in ((0, si), (1, e)):
        mine = emit == kind
        keys = b[mine] * pieces + r[mine]
        assert bool(((r[mine] >= 0) & (r[mine] < pieces)).all())
        assert torch.equal(torch.sort(keys).values, torch.arange(batch * pieces))  # each exactly once
    ticket = torch.arange(total)
    last_stream = torch.full((batch,), -1, dtype=torch.int64).scatter_reduce(0, b[emit == 0], ticket[emit == 0], "amax")
    first_emit = torch.full((batch,), total, dtype=torch.int64).scatter_reduce(0, b[emit == 1], ticket[emit == 1],
                                                                                "amin")
    assert bool((first_emit > last_stream).all())


def test_launcher_rejects_what_the_kernel_does_not_cover():
    with pytest.raises(ValueError, match="device: CudaVerifier needs a CUDA device"):
        cv.CudaVerifier(4, 5, 129_280, "cpu")
    assert [len(cv.schedule(b)) for b in (1, 16, 64, 253)] == [3] * 4 and cv.SCHEDULE[-1][0] is None

    class Fake:  # unsupported() reads only these
        def __init__(self, ptr, strides, size=4, dtype=torch.float32):
            self.ptr, self.strides, self.size, self.dtype = ptr, strides, size, dtype

        def data_ptr(self):
            return self.ptr

        def stride(self):
            return self.strides

        def element_size(self):
            return self.size

    verifier = object.__new__(cv.CudaVerifier)
    good_t, good_c = Fake(0, (6 * 8, 8, 1)), Fake(0, (5 * 8, 8, 1), 2, torch.bfloat16)
    assert verifier.unsupported(good_t, None, good_c) is None
    assert "standard method only" in verifier.unsupported(good_t, None, good_c, "block")
    assert "target_logits" in verifier.unsupported(Fake(4, (6 * 8, 8, 1)), None, good_c)
    assert "logits_cache" in verifier.unsupported(good_t, None, Fake(0, (5 * 8, 4, 1), 2, torch.bfloat16))
    assert "bf16 or fp32" in verifier.unsupported(good_t, None, Fake(0, (5 * 8, 8, 1), 2, torch.float16))


def test_verify_drafts_impl_cuda_names_the_argument_off_cuda():
    from dspark_markov import verify_drafts

    k, vocab = 2, 64
    args = [torch.zeros(1, k + 1, vocab), torch.zeros(1, k, dtype=torch.int64), torch.zeros(1, k, vocab),
            torch.full((1,), k), torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), torch.ones(1),
            torch.zeros(1, dtype=torch.int64)]
    with pytest.raises(ValueError, match="impl: 'cuda' verifies CUDA tensors"):
        verify_drafts(*args, impl="cuda")
    with pytest.raises(ValueError, match="impl: expected one of .*'cuda'"):
        verify_drafts(*args, impl="cuda_verify")


def test_bench_runs_the_cuda_verifier_only_on_a_gpu_for_the_standard_method():
    from dspark_markov.bench import verify_grid

    cases = verify_grid._cases(verify_grid.VerifyBenchConfig(
        device="cpu", vocab=2048, rows=(1,), kernels=("verify_standard", "verify_block", "verify_raw"),
        impls=("cuda",), temperatures=("1",)))
    assert [kernel for kernel, _, _ in cases] == ["verify_standard", "verify_raw"]
