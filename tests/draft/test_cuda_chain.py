"""``impl="cuda_chain"`` on the CPU: the noise of noise.cuh bit for bit, a compile check, argument checks.

The kernel itself needs an sm_90 GPU (tests/gpu/test_cuda_chain_gpu.py). Here:

- ``noise.cuh`` is compiled as host C++ (``g++ -ffp-contract=off``, skipped without a compiler) and
  its hash, uniform, bit-exact log, Gumbel noise, exact keys and packed words are compared bit for
  bit with :mod:`dspark_markov.rng` over millions of inputs (random hashes, and every hash near the
  branch points of the noise);
- ``chain.cu`` is compiled for sm_90 with the package's own NVRTC path, else with ``nvcc``, and
  skipped cleanly when neither is present;
- the ctypes argument struct matches ``struct ChainArgs`` of chain.cu field by field;
- the backend's argument checks raise ``ValueError`` before anything runs.
"""

import ctypes
import re

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import cuda_chain
from tests.helpers import assert_args_struct_matches, host_library, sm90_compile_log

HOST_WRAPPER = r"""
#include "noise.cuh"
extern "C" {
void hash4(const long long* seed, const long long* pos, const unsigned* token, unsigned domain, unsigned* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = dm::hash_finish(dm::hash_prefix(seed[i], pos[i], domain), token[i]);
}
void prefix(const long long* seed, int step, const long long* pos, unsigned* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = dm::draft_prefix(seed[i], step, pos[i]);
}
void noise(const unsigned* h, float* u, float* g, long n) {
  for (long i = 0; i < n; ++i) { u[i] = dm::uniform32(h[i]); g[i] = dm::gumbel32(u[i]); }
}
void log32(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = dm::log_f32(x[i]); }
void keys(const float* z, const float* t, unsigned prefix, const unsigned* tok, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = dm::exact_key(z[i], t[i], prefix, tok[i]);
}
void words(const float* key, const int* index, long long* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = dm::pack_word(key[i], index[i]);
}
void tb(const unsigned* h, unsigned* b, long n) { for (long i = 0; i < n; ++i) b[i] = dm::tb_bucket(h[i]); }
void tb_order(const float* g, unsigned* o, float* back, long n) {
  for (long i = 0; i < n; ++i) { o[i] = dm::tb_order(g[i]); back[i] = dm::tb_unorder(o[i]); }
}
void slack(const float* x, float margin, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = dm::add_rn(x[i], dm::key_slack(x[i], margin));
}
}
"""


@pytest.fixture(scope="module")
def host_noise(tmp_path_factory):
    return host_library(tmp_path_factory.mktemp("noise"), HOST_WRAPPER, "noise.cuh")


def ptr(array: np.ndarray):
    return array.ctypes.data_as(ctypes.c_void_p)


def host_hash(lib, seed, pos, token, domain=0):
    seed, pos = np.ascontiguousarray(seed, np.int64), np.ascontiguousarray(pos, np.int64)
    token = np.ascontiguousarray(token, np.uint32)
    out = np.empty(len(seed), np.uint32)
    lib.hash4(ptr(seed), ptr(pos), ptr(token), ctypes.c_uint(domain), ptr(out), ctypes.c_long(len(seed)))
    return out


def test_hash_known_answers_and_random_keys(host_noise):
    # SPEC.md section 4's table.
    table = [(0, 0, 0, 0x8134CDF8, 0xD28AD962), (1, 2, 3, 0x23B53F91, 0xE3AAF818),
             (-1, 17, 1023, 0xC8C13C14, 0xD223C51C), (0x123456789ABCDEF, 123456789, 199999, 0x5DDE974F, 0x0547D2FE),
             (-(2**63), 2**30, 4096, 0xF1A9355B, 0x3AED160F), (2**63 - 1, 2**30 + 7, 0xFFFFFFFF, 0xD952F9AA, 0x49E8EA7F)]
    seed = np.array([t[0] for t in table], np.int64)
    pos = np.array([t[1] for t in table], np.int64)
    token = np.array([t[2] for t in table], np.uint32)
    assert host_hash(host_noise, seed, pos, token).tolist() == [t[3] for t in table]
    assert host_hash(host_noise, seed, pos, token, rng.GOLDEN_DOMAIN).tolist() == [t[4] for t in table]
    gen = np.random.default_rng(0)
    n = 1 << 18
    seed = gen.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    pos = gen.integers(-(2**40), 2**40, n, dtype=np.int64)
    token = gen.integers(0, 2**32, n, dtype=np.uint32)
    want = rng.murmur3_hash32(torch.from_numpy(seed), torch.from_numpy(pos), torch.from_numpy(token.astype(np.int64)))
    assert np.array_equal(host_hash(host_noise, seed, pos, token), want.numpy().astype(np.uint32))
    # The draft prefix (step XOR, position salt) then the token word.
    out = np.empty(n, np.uint32)
    host_noise.prefix(ptr(seed), ctypes.c_int(3), ptr(pos), ptr(out), ctypes.c_long(n))
    key_seed, key_pos = rng.draft_step_seed(torch.from_numpy(seed), 3), rng.draft_key_pos(torch.from_numpy(pos))
    assert np.array_equal(out, rng.hash_prefix(key_seed, key_pos).numpy().astype(np.uint32))


def noise_hashes() -> np.ndarray:
    """4M random hashes plus every hash around u = 0, 1/16, 1/4 and 1 (the branch points)."""
    gen = np.random.default_rng(1)
    parts = [gen.integers(0, 2**32, 1 << 22, dtype=np.uint64)]
    for center in (0, 1 << 28, 1 << 30, 1 << 32):
        parts.append(np.arange(max(center - (1 << 17), 0), min(center + (1 << 17), 1 << 32), dtype=np.uint64))
    return np.concatenate(parts).astype(np.uint32)


def test_uniform_and_gumbel_noise_bit_exact(host_noise):
    h = noise_hashes()
    u = np.empty(len(h), np.float32)
    g = np.empty(len(h), np.float32)
    host_noise.noise(ptr(h), ptr(u), ptr(g), ctypes.c_long(len(h)))
    want_u = rng.uniform32(torch.from_numpy(h.astype(np.int64)))
    assert np.array_equal(u.view(np.uint32), want_u.numpy().view(np.uint32))
    want_g = rng.gumbel32(want_u)
    assert np.array_equal(g.view(np.uint32), want_g.numpy().view(np.uint32))


def test_log_bit_exact_over_positive_normal_floats(host_noise):
    gen = np.random.default_rng(2)
    bits = gen.integers(0x00800000, 0x7F800000, 1 << 22, dtype=np.uint32)
    bits = np.concatenate([bits, np.arange(0x3F000000, 0x3F000000 + (1 << 18), dtype=np.uint32),  # around 1/2..
                           np.arange(0x3F800000 - (1 << 17), 0x3F800000 + (1 << 17), dtype=np.uint32)])  # and 1
    x = bits.view(np.float32)
    y = np.empty_like(x)
    host_noise.log32(ptr(x), ptr(y), ctypes.c_long(len(x)))
    assert np.array_equal(y.view(np.uint32), rng.log_f32(torch.from_numpy(x.copy())).numpy().view(np.uint32))


def test_exact_keys_and_packed_words(host_noise):
    gen = np.random.default_rng(3)
    n = 1 << 20
    z = (gen.standard_normal(n) * 8).astype(np.float32)
    z[:64] = [np.inf, -np.inf, 0.0, -0.0] * 16
    temp = gen.choice(np.array([1.0, 0.6, 0.7, 1.3, 1e-3, 3.0e-38], np.float32), n)
    tokens = gen.integers(0, 129_280, n, dtype=np.uint32)
    prefix = int(rng.hash_prefix(rng.draft_step_seed(torch.tensor(12345), 2), rng.draft_key_pos(torch.tensor(77))))
    out = np.empty(n, np.float32)
    host_noise.keys(ptr(z), ptr(temp), ctypes.c_uint(prefix), ptr(tokens), ptr(out), ctypes.c_long(n))
    noise = rng.gumbel32(rng.uniform32(rng.hash_finish(torch.tensor(prefix), torch.from_numpy(tokens.astype(np.int64)))))
    want = torch.from_numpy(z) / torch.from_numpy(temp) + noise
    assert np.array_equal(out.view(np.uint32), want.numpy().view(np.uint32))
    # Words order like torch.argmax: key, then the lower index; NaN above +inf; -0.0 == +0.0.
    keys = np.array([1.0, 1.0, np.nan, np.inf, -0.0, 0.0, -np.inf, np.nan, -2.5], np.float32)
    index = np.array([5, 3, 9, 1, 2, 4, 0, 8, 6], np.int32)
    words = np.empty(len(keys), np.int64)
    host_noise.words(ptr(keys), ptr(index), ptr(words), ctypes.c_long(len(keys)))
    order = [int(index[i]) for i in np.argsort(-words, kind="stable")]
    assert order == [8, 9, 1, 3, 5, 2, 4, 6, 0]


def test_chain_kernels_compile_for_sm90(tmp_path):
    """NVRTC (the path the backend uses) if a libnvrtc is found, else nvcc; skipped without either."""
    log, _ = sm90_compile_log("chain.cu", tmp_path)
    from dspark_markov.cuda import CHAIN_KERNELS

    for name in CHAIN_KERNELS:
        assert f"'{name}'" in log, name
    # No kernel may keep more than a few words on the stack (a register array indexed at run time).
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) <= 64, log


def test_args_struct_matches_the_kernel():
    assert_args_struct_matches("chain.cu", "ChainArgs", cuda_chain.ChainArgs._fields_)
    assert ctypes.sizeof(cuda_chain.ChainArgs) == 8 * len(cuda_chain.ChainArgs._fields_)


def test_filter_margin_is_the_filter_s():
    ops_filter = pytest.importorskip("dspark_markov.ops.filter")
    assert cuda_chain.FILTER_MARGIN == ops_filter.FILTER_MARGIN


def test_backend_refuses_cpu_and_bad_arguments():
    head = dm.MarkovHead(torch.zeros(300, 256, dtype=torch.bfloat16), torch.zeros(300, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="impl"):
        dm.MarkovSampler(head, 5, 4, impl="cuda_chain")
    with pytest.raises(ValueError, match="device"):
        cuda_chain.CudaChainBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            cuda_chain.CudaChainBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cuda")


def test_availability_says_why_not():
    from dspark_markov.cuda import availability

    why = availability(build=False)
    if not torch.cuda.is_available():
        assert why is not None and "no CUDA GPU" in why


def test_noise_table_bucket_is_monotone_and_in_range(host_noise):
    """noise.cuh tb_bucket (chain.cu V6 & 64): non-decreasing in the hash, within the table, and the
    fp32 exponent / top mantissa bits of (float)(h | 1) (u32 -> fp32 rounded to nearest)."""
    h = np.unique(np.concatenate([noise_hashes(), np.arange(0, 1 << 16, dtype=np.uint32),
                                  np.array([2**32 - 1, 2**32 - 2, 2**31, 2**31 - 1], dtype=np.uint32)]))
    b = np.empty(len(h), np.uint32)
    host_noise.tb(ptr(h), ptr(b), ctypes.c_long(len(h)))
    assert bool(np.all(np.diff(b.astype(np.int64)) >= 0))
    assert int(b.max()) < cuda_chain.TB_SIZE
    want = ((h | 1).astype(np.float64).astype(np.float32).view(np.uint32) >> 17) - (127 << 6)
    assert np.array_equal(b, want)
    g = np.empty(len(h), np.float32)
    u = np.empty(len(h), np.float32)
    host_noise.noise(ptr(h), ptr(u), ptr(g), ctypes.c_long(len(h)))
    order = np.empty(len(h), np.uint32)
    back = np.empty(len(h), np.float32)
    host_noise.tb_order(ptr(g), ptr(order), ptr(back), ctypes.c_long(len(h)))
    assert np.array_equal(back.view(np.uint32), g.view(np.uint32))
    by_value = np.argsort(g, kind="stable")
    assert bool(np.all(np.diff(order[by_value].astype(np.int64)) >= 0))


def test_noise_table_bound_covers_the_mul_for_div_rounding(host_noise):
    """V6 & 64 ranks add_rn(z * fl(1/T), G) with G >= the exact noise; the exact key add_rn(z / T, g)
    must stay below that bound plus key_slack (what the decision compares against), and the bound
    plus its slack must be non-decreasing (so one threshold covers every lower-ranked token)."""
    gen = np.random.default_rng(3)
    n = 1 << 20
    z = np.concatenate([gen.normal(0, 4, n // 2), gen.normal(0, 3e4, n // 4), gen.uniform(-1e6, 1e6, n // 4)])
    z = z.astype(np.float32)
    temp = np.exp(gen.uniform(np.log(1e-3), np.log(1e3), n)).astype(np.float32)
    temp[: n // 8] = 1.0
    h = gen.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    u = np.empty(n, np.float32)
    g = np.empty(n, np.float32)
    host_noise.noise(ptr(h), ptr(u), ptr(g), ctypes.c_long(n))
    exact = (z / temp).astype(np.float32) + g
    inv = (np.float32(1.0) / temp).astype(np.float32)
    bound = (z * inv).astype(np.float32) + g
    covered = np.empty(n, np.float32)
    host_noise.slack(ptr(bound), ctypes.c_float(0.0), ptr(covered), ctypes.c_long(n))
    finite = np.isfinite(exact)
    assert bool(np.all(exact[finite] < covered[finite]))
    grid = np.sort(np.concatenate([bound[finite], np.linspace(-1e4, 1e4, 1 << 16, dtype=np.float32)]))
    out = np.empty(len(grid), np.float32)
    host_noise.slack(ptr(grid), ctypes.c_float(0.0), ptr(out), ctypes.c_long(len(grid)))
    assert bool(np.all(np.diff(out.astype(np.float64)) >= 0))
