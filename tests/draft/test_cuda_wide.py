"""``impl="cuda_wide"`` on the CPU: what can be checked without a GPU.

- ``wide.cu`` compiles for sm_90 (the package's NVRTC path, else ``nvcc`` on two entry points; skipped
  without either) with no stack frame;
- the ctypes argument struct matches ``struct WideArgs`` field by field;
- the tensor-core fragment layout: the codes buffer as ``dm_wide_finish`` writes it, the W2 stage as
  ``dm_wide_step`` fills it and the accumulator as its epilogue reads it, run through the documented
  semantics of ``mma.sync m16n8k16`` (emulated in numpy), give ``codes @ W2^T`` at the (row, token) the
  epilogue assigns (the rank permuted alike in A and B, the tokens permuted to 4 per lane);
- the shared memory of 256 rows fits an H100/H200 block; the backend refuses the CPU and bad options.
The draws themselves are checked on the H200 (tests/gpu/test_cuda_wide_gpu.py); the skip threshold is
blocks.cu's (``dm::skip_threshold``, tests/draft/test_cuda_gumbel.py proves it).
"""

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov.cuda import build
from dspark_markov.draft import cuda_wide


def test_wide_kernels_compile_for_sm90(tmp_path):
    try:
        cubin, log = build.compile_cubin("wide.cu", verbose=True)
        assert len(cubin) > 0
        names = cuda_wide.KERNELS
    except build.BuildError as error:
        if "no NVRTC library" not in str(error):
            raise
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            pytest.skip("neither NVRTC (libnvrtc.so) nor nvcc is available to compile wide.cu for sm_90")
        result = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-fmad=false", "-std=c++17", "-Xptxas", "-v",
                                 "-DDW_TWO_ENTRIES", str(build.SOURCE_DIR / "wide.cu"), "-o",
                                 str(tmp_path / "wide.cubin")], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        log = result.stderr
        names = ("dm_wide_b0_c0_v1_s0", "dm_wide_b1_c1_v0_s1", "dm_wide_b0_c0_v1_s0_p2", "dm_wide_finish")
    for name in names:
        assert f"'{name}'" in log, name
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) <= 64, log  # the _p2 variants (128 registers) spill a few words


def test_args_struct_matches_the_kernel():
    text = (build.SOURCE_DIR / "wide.cu").read_text()
    body = re.search(r"struct WideArgs \{(.*?)\n\};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for kind, fields in re.findall(r"\b(u64|i64|double)\s+([^;]+);", body):
        names += [(kind, f.strip()) for f in fields.split(",")]
    ctypes_kind = {ctypes.c_uint64: "u64", ctypes.c_int64: "i64", ctypes.c_double: "double"}
    assert [(ctypes_kind[t], n) for n, t in cuda_wide.WideArgs._fields_] == names
    assert ctypes.sizeof(cuda_wide.WideArgs) == 8 * len(names)
    for define, value in (("DW_GROUP", cuda_wide.GROUP), ("DW_MAX_ROWS", cuda_wide.MAX_ROWS)):
        assert re.search(rf"#define {define} {value}\b", text), define


def _token_of(nt, n):  # wide.cu dw_token_of
    return (n >> 1) * 4 + nt * 2 + (n & 1)


def test_fragment_layout_gives_the_bias_at_the_epilogue_positions():
    rng = np.random.default_rng(0)
    rows, rank = 32, 256  # two m-tiles, one 16-token group
    codes = rng.integers(-4, 5, (rows, rank)).astype(np.float64)
    w2 = rng.integers(-4, 5, (16, rank)).astype(np.float64)
    # dm_wide_finish: (row, 16-byte chunk q = 4 words of 2 values) -> words h, 2 + h of slot 0 and of slot 1 (32 uint4
    # further) of ((row / 16 * 8 + q / 4) * 2) * 32 + row % 8 * 4 + q % 4, h = row / 8 % 2: the 4 A registers of an mma
    buf = np.full((rows // 16 * 512, 4, 2), np.nan)  # [uint4 slot][word][value]
    for row in range(rows):
        h = (row >> 3) & 1
        for q in range(32):
            words = codes[row, q * 8:(q + 1) * 8].reshape(4, 2)
            slot0 = (((row >> 4) * 8 + (q >> 2)) * 2) * 32 + (row & 7) * 4 + (q & 3)
            buf[slot0, h], buf[slot0, 2 + h] = words[0], words[1]
            buf[slot0 + 32, h], buf[slot0 + 32, 2 + h] = words[2], words[3]
    assert not np.isnan(buf).any()
    # dm_wide_step stage_group: stage[(nt * 8 + j) * 32 + lane] = W2[token_of(nt, g)][(j * 4 + c) * 8 : + 8]
    stage = np.zeros((512, 8))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for nt in range(2):
            for j in range(8):
                stage[(nt * 8 + j) * 32 + lane] = w2[_token_of(nt, g), (j * 4 + c) * 8:(j * 4 + c + 1) * 8]
    got = np.full((rows, 16), np.nan)
    for mt in range(rows // 16):
        acc = np.zeros((2, 16, 8))  # [nt] D[16 rows][8 columns] (both k accumulators summed)
        for j in range(8):
            for half in range(2):  # the .x/.y and the .z/.w mma of the k-chunk
                for nt in range(2):
                    a = np.zeros((16, 16))
                    b = np.zeros((16, 8))
                    for lane in range(32):
                        g, c = lane >> 2, lane & 3
                        regs = buf[mt * 512 + (j * 2 + half) * 32 + lane]  # the A registers a0..a3 of this mma
                        w = stage[(nt * 8 + j) * 32 + lane].reshape(4, 2)  # B: words (x, y) or (z, w)
                        # mma.m16n8k16 .row.col fragments (PTX ISA): a0 A[g][2c..], a1 A[g+8][2c..], a2 A[g][2c+8..],
                        # a3 A[g+8][2c+8..]; b0 B[2c..][g], b1 B[2c+8..][g]
                        a[g, 2 * c:2 * c + 2] = regs[0]
                        a[g + 8, 2 * c:2 * c + 2] = regs[1]
                        a[g, 2 * c + 8:2 * c + 10] = regs[2]
                        a[g + 8, 2 * c + 8:2 * c + 10] = regs[3]
                        b[2 * c:2 * c + 2, g] = w[2 * half]
                        b[2 * c + 8:2 * c + 10, g] = w[2 * half + 1]
                    d = a @ b  # [16, 8]
                    acc[nt] += d
        for lane in range(32):  # the epilogue: acc[nt][e] -> row g + 8 (e >> 1), token 4c + 2 nt + (e & 1)
            g, c = lane >> 2, lane & 3
            for nt in range(2):
                for e in range(4):
                    row, col = g + 8 * (e >> 1), 2 * c + (e & 1)
                    got[mt * 16 + row, 4 * c + 2 * nt + (e & 1)] = acc[nt][row, col]
    np.testing.assert_array_equal(got, codes @ w2.T)


def test_shared_memory_fits_and_the_backend_refuses_cpu_and_bad_options():
    assert cuda_wide.smem_bytes(cuda_wide.MAX_ROWS) <= 227 * 1024
    head = dm.MarkovHead(torch.zeros(300, 256, dtype=torch.bfloat16), torch.zeros(300, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="impl"):
        dm.MarkovSampler(head, 5, 4, impl="cuda_wide")
    for option, value in (("filter_margin", -1e-3), ("filter_margin", float("nan")), ("flags", 8), ("flags", True),
                          ("blocks_per_sm", 0), ("warps_per_group", 3), ("warps_per_group", True)):
        with pytest.raises(ValueError, match=option):
            cuda_wide.CudaWideBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cpu",
                                      **{option: value})
    with pytest.raises(ValueError, match="max_rows"):
        cuda_wide.CudaWideBackend(head, 5, 257, method="gumbel", cache_dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="device"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cpu")
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in cuda_wide.CudaWideBackend.unavailable_reason()


def test_runs_only_when_opted_in_until_its_gpu_tests_pass(monkeypatch):
    """cuda_wide has never run on a GPU: without DSPARK_MARKOV_UNVERIFIED listing it, it says so and does not run."""
    monkeypatch.delenv(cuda_wide.UNVERIFIED_ENV, raising=False)
    assert "has not run on a GPU" in cuda_wide.CudaWideBackend.opt_in_reason()
    for value in ("cuda_wide", "1", "filter,cuda_wide"):
        monkeypatch.setenv(cuda_wide.UNVERIFIED_ENV, value)
        assert cuda_wide.CudaWideBackend.opt_in_reason() is None
    monkeypatch.setenv(cuda_wide.UNVERIFIED_ENV, "cuda_gumbel")
    assert cuda_wide.CudaWideBackend.opt_in_reason() is not None
    from dspark_markov.bench import grid
    from dspark_markov.draft import auto

    assert "cuda_wide" not in grid.DESIGNS and "cuda_wide" in grid.KNOWN_DESIGNS
    assert "cuda_wide" not in repr(auto.AUTO_TABLE) and "cuda_wide" not in repr(auto.PORTABLE_TABLE)


# --------------------------------------------------------------------------- the ranking, emulated
# dm_wide_step's decision logic replayed on the CPU in one legal interleaving of its warps (round robin over teams,
# each in its own m-tile order): bounds z * (1/T) + table[bucket(hash)], one word per row merged with max, a seed
# (the exact key of the tile's first largest bound) for a row without a word, exact keys where !(bound < thr). The
# tokens must be draw_gumbel's (argmax_first for greedy rows) whatever the interleaving; this checks the rules, the
# CUDA code is checked on the GPU (tools/gpu_plans/issue12_cuda_wide.sh).
NONE = -(2**63)


def _bucket(h):  # noise.cuh tb_bucket: exponent and 6 mantissa bits of float(h | 1)
    return ((h | 1).to(torch.float32).view(torch.int32).to(torch.int64) >> 17) - (127 << 6)


def _bound_table():
    """Per bucket the noise of its smallest hash (uniform32 and gumbel32 are monotone in h) plus 1e-3: an upper
    bound of every hash of the bucket (the test asserts it for every hash it uses)."""
    from dspark_markov import rng

    size = 33 << 6
    lo = torch.zeros(size, dtype=torch.int64)
    hi = torch.full((size,), 1 << 32, dtype=torch.int64)
    target = torch.arange(size)
    for _ in range(34):  # smallest h with bucket(h) >= b
        mid = (lo + hi) // 2
        ge = _bucket(mid.clamp(max=(1 << 32) - 1)) >= target
        hi = torch.where(ge, mid, hi)
        lo = torch.where(ge, lo, mid + 1)
    return rng.gumbel32(rng.uniform32(lo.clamp(max=(1 << 32) - 1))) + 1e-3


def _pack(key, index):  # noise.cuh pack_word
    bits = int(np.float32(key).view(np.int32))
    if key == 0.0:
        bits = 0
    if key != key:
        bits = 0x7FFFFFFF
    ordered = bits if bits >= 0 else bits ^ 0x7FFFFFFF
    return (ordered << 32) | (0x7FFFFFFF - int(index))


def _threshold(word, margin):  # common.cuh skip_threshold, fp32 operations
    if word == NONE:
        return np.float32(-np.inf)
    ordered = word >> 32
    bits = ordered if ordered >= 0 else ordered ^ 0x7FFFFFFF
    k = np.int32(bits).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (k - np.float32(margin)) - (np.abs(k) + np.float32(64.0)) * np.float32(2.0**-19)


def _emulate_step(z, temp, seed, step, pos, teams, margin, table, exact):
    """``exact``: the reference's keys (draft.reference.gumbel_keys), which the kernel computes where it must."""
    from dspark_markov import rng

    rows, vocab = z.shape
    tokens = torch.arange(vocab)
    h = rng.murmur3_hash32(rng.draft_step_seed(seed[:, None], step), rng.draft_key_pos(pos[:, None]), tokens)
    greedy = temp == 0
    inv = torch.where(greedy, torch.ones_like(temp), 1.0 / temp)
    bound = torch.where(greedy[:, None], z, z * inv[:, None] + table[_bucket(h)])
    with np.errstate(invalid="ignore"):  # the table bounds every key used here (NaN keys aside)
        assert bool(((bound >= exact) | torch.isnan(exact) | torch.isnan(bound) | greedy[:, None]).all())
    bound, exact = bound.numpy(), exact.numpy()
    mtiles, groups = -(-rows // 16), -(-vocab // 16)
    words = [NONE] * rows
    queues = [[(grp, (i + gt) % mtiles) for grp in range(gt, groups, teams) for i in range(mtiles)]
              for gt in range(teams)]  # team gt starts at m-tile gt % mtiles (WPG = 1)
    while any(queues):
        for queue in queues:
            if not queue:
                continue
            grp, mt = queue.pop(0)
            cols = slice(grp * 16, min(grp * 16 + 16, vocab))
            for r in range(mt * 16, min(mt * 16 + 16, rows)):
                b, seen = bound[r, cols], words[r]
                cand = ~(b < _threshold(seen, margin))
                if seen == NONE:
                    valid = np.where(b > -np.inf, b, -np.inf)  # NaN and -inf bounds are never seeds
                    if (valid > -np.inf).any():
                        s = int(np.argmax(valid))
                        t = grp * 16 + s
                        seen = _pack(float(exact[r, t]), t)
                        words[r] = max(words[r], seen)
                        cand[s] = False
                        cand &= ~(b < _threshold(seen, margin))
                best = max([_pack(float(exact[r, grp * 16 + i]), grp * 16 + i) for i in np.flatnonzero(cand)],
                           default=NONE)
                if best > seen:
                    words[r] = max(words[r], best)
    out = [0 if w == NONE else 0x7FFFFFFF - (w & 0x7FFFFFFF) for w in words]
    return torch.tensor([min(max(t, 0), vocab - 1) for t in out])


def test_emulated_ranking_draws_the_reference():
    from dspark_markov.draft.reference import argmax_first, gumbel_keys

    table = _bound_table()
    gen = torch.Generator().manual_seed(11)
    rows, vocab = 37, 1000  # a partial m-tile and a partial 16-token group
    z = (torch.randn(rows, vocab, generator=gen) * 4).bfloat16().float()  # bf16: ties between tokens
    z[1] = float("-inf")
    z[2, 500], z[2, 300] = float("nan"), float("nan")
    z[3, 7] = float("inf")
    z[4, :] = 2.5  # a row of ties
    z[5, 999] = 3e38
    temp = torch.tensor([0.0, 0.6, 1.0, 2.5])[torch.arange(rows) % 4]
    seed = torch.randint(-(2**62), 2**62, (rows,), generator=gen)
    pos = torch.randint(1, 1 << 20, (rows,), generator=gen)
    for step, teams, margin in ((0, 5, 0.0), (3, 64, 1e-3)):  # interleavings, margins
        keys = gumbel_keys(z, temp, seed, step, pos)
        got = _emulate_step(z, temp, seed, step, pos, teams, margin, table, keys)
        want = argmax_first(keys)  # draw_gumbel
        assert torch.equal(got, want), (step, teams, torch.nonzero(got != want).flatten().tolist())
