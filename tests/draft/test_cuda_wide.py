"""``impl="cuda_wide"`` on the CPU: what can be checked without a GPU.

- ``wide.cu`` compiles for sm_90 (the package's NVRTC path, else ``nvcc`` on two entry points; skipped
  without either) with no stack frame;
- the ctypes argument struct matches ``struct WideArgs`` field by field;
- the tensor-core fragment layout: the codes buffer as ``dm_wide_finish`` writes it, the W2 stage as
  ``dm_wide_step`` fills it and the accumulator as its epilogue reads it, run through the documented
  semantics of ``mma.sync m16n8k16`` (emulated in numpy), give ``codes @ W2^T`` at the (row, token) the
  epilogue assigns (the rank permuted alike in A and B, the tokens permuted to 4 per lane);
- the shared memory of 256 rows fits an H100/H200 block; the backend refuses the CPU and bad options.
- method="inverse_cdf": the _icdf partials and dm_wide_pick's pick, emulated in fp32 numpy in the kernel's order of
  operations, draw what ``draw_inverse_cdf`` draws at small shapes (special rows included).
The draws themselves are checked on the H200 (tests/gpu/test_cuda_wide_gpu.py); the skip threshold is
blocks.cu's (``dm::skip_threshold``, tests/draft/test_cuda_gumbel.py proves it).
"""

import ctypes
import re

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov.cuda import build
from dspark_markov.draft import cuda_wide
from tests.helpers import assert_args_struct_matches, host_library, sm90_compile_log


def test_wide_kernels_compile_for_sm90(tmp_path):
    log, nvrtc = sm90_compile_log("wide.cu", tmp_path, ("DW_TWO_ENTRIES",))
    names = cuda_wide.KERNELS if nvrtc else (
        "dm_wide_b0_c0_v1_s0", "dm_wide_b1_c1_v0_s1", "dm_wide_b0_c0_v1_s0_p2", "dm_wide_b0_c0_v1_s0_icdf",
        "dm_wide_b1_c1_v0_s1_icdf", "dm_wide_finish", "dm_wide_pick")
    for name in names:
        assert f"'{name}'" in log, name
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) <= 64, log  # the _p2 variants (128 registers) spill a few words


def tc_compile_log(*defines):
    """ptxas's log of wide_tc.cu built for sm_90a with ``defines`` (skips the test without NVRTC)."""
    try:
        cubin, log = build.compile_cubin("wide_tc.cu", cuda_wide.TC_ARCH, [f"-D{d}" for d in defines], verbose=True)
    except build.BuildError as error:
        if "no NVRTC library" in str(error):
            pytest.skip(str(error))
        raise
    assert cubin
    return log


def test_tensor_core_step_compiles_for_sm90a():
    """wide_tc.cu for sm_90a: every entry point, no stack frame (no spill), and no
    "wgmma ... serialized" advisory from ptxas (its wgmmas would then wait for each other: no overlap with the
    epilogue). Skipped without NVRTC."""
    log = tc_compile_log()
    for name in cuda_wide.TC_KERNELS:
        assert f"'{name}'" in log, name
    assert "serialized" not in log, log
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) == 0, log  # (no spill: ptxas fits the registers under its own cap)


def test_three_warpgroup_tensor_core_step_compiles_for_sm90a():
    """wide_tc.cu with TC_WGS=3 (tc_warpgroups=3): every entry point, 12 warps whose registers fit a scheduler's 16K
    over 3 warps (<= 168) with no spill, no wgmma serialisation, and the threads cuda_wide launches. Skipped without
    NVRTC."""
    log = tc_compile_log("TC_WGS=3")
    for name in cuda_wide.TC_KERNELS:
        assert f"'{name}'" in log, name
    assert "serialized" not in log and "C75" not in log, log
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) == 0, log
    registers = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    assert registers and max(registers) <= 168, log
    assert [cuda_wide.tc_threads(w) for w in cuda_wide.TC_WARPGROUPS] == [288, 384]


@pytest.mark.parametrize("defines", [("TC_FASTDIV=1",), ("TC_FASTDIV=1", "TC_WGS=3")])
def test_fast_division_tensor_core_step_compiles_for_sm90a(defines):
    """wide_tc.cu with TC_FASTDIV=1 (tc_fast_div=True), two and three warpgroups: every entry point, no spill, no
    wgmma serialisation (its first version kept each z pair live beside its quotient for the div_rn redo and spilled
    72-80 bytes in the two-item loop). Skipped without NVRTC."""
    log = tc_compile_log(*defines)
    for name in cuda_wide.TC_KERNELS:
        assert f"'{name}'" in log, name
    assert "serialized" not in log and "C75" not in log, log
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) == 0, log


@pytest.mark.parametrize("tiles", [1, 2, 5, 15, 16, 17, 2020])
@pytest.mark.parametrize("mtiles", [1, 2, 3, 4])
def test_three_warpgroup_items_cover_every_tile_once_in_order(tiles, mtiles):
    """The TC_WGS=3 item map of wide_tc.cu (K, tile_of by a multiply-high with ceil(2^32 / mtiles), mtile_of,
    last_of_tile), transcribed: the three warpgroups' items are every (tile, m-tile) of the block once, each
    warpgroup's in tile order, and a warpgroup's last item of a tile is the one that releases it."""
    wgs = 3
    mdiv = {2: 0x80000000, 3: 0x55555556, 4: 0x40000000}.get(mtiles, 0)
    assert mtiles == 1 or mdiv == -(-(2**32) // mtiles)
    total = tiles * mtiles
    seen = []
    for wg in range(wgs):
        count = len(three_warpgroup_items(tiles, mtiles, wg))  # (K)

        def tile_of(k, wg=wg):
            i = wg + wgs * k
            return (i * mdiv) >> 32 if mtiles >= 2 else i

        items = [(tile_of(k), wg + wgs * k - tile_of(k) * mtiles) for k in range(count)]
        assert all(0 <= mt < mtiles and 0 <= tl < tiles for tl, mt in items)
        assert [tl for tl, _ in items] == sorted(tl for tl, _ in items)
        last = [k + 1 >= count or tile_of(k + 1) != tile_of(k) for k in range(count)]
        assert sum(last) == len({tl for tl, _ in items})  # one release per tile holding an item
        seen += items
    assert sorted(seen) == [(tl, mt) for tl in range(tiles) for mt in range(mtiles)]
    # the multiply-high quotient is exact for every item index a block can have (i (mtiles - 1) < 2^32)
    for i in (0, 1, 2, 3, 7, 8079, 2**20 + 1, 2**31 - 1):
        assert (i * mdiv) >> 32 == i // mtiles or mtiles == 1


def three_warpgroup_items(tiles, mtiles, wg, wgs=3):
    """wide_tc.cu's TC_WGS=3 item map, transcribed: warpgroup wg's items (tile, m-tile) in order."""
    total = tiles * mtiles
    count = (total - wg + wgs - 1) // wgs if total > wg else 0
    return [divmod(wg + wgs * k, mtiles) for k in range(count)]


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("mtiles", [1, 2, 3, 4])
def test_three_warpgroup_ring_always_drains(mtiles, stages):
    """The TC_WGS=3 ring (no producer warp), transcribed as a state machine and run to the end for every block size
    from 1 to 40 tiles: warp 0 loads the first `stages` tiles; a warp waits for a tile's full barrier in pass_to
    (every tile in order, releasing at once those without its items), releases its item's tile after the item's
    wgmmas when the item is its last in that tile (finish_mma, before the next item's pass_to); the release that
    completes a stage's count of 12 loads tile + stages (after its wait on the stage's empty mbarrier, which every
    warp arrives on before it counts: complete once the count is). The loop's order per item k: finish_mma(k),
    issue(k + 1) (pass_to), then the epilogue. Every warp must finish (no deadlock), every loaded tile be loaded
    once, and no stage be refilled before all 12 warps released its previous tile."""
    warps = 12
    for tiles in range(1, 41):
        loaded = set(range(min(tiles, stages)))
        count = [0] * tiles
        programs = []
        for warp in range(warps):
            items = three_warpgroup_items(tiles, mtiles, warp // 4)
            ops = []  # ("wait", t) | ("release", t)
            passed = 0

            def pass_to(tl):
                nonlocal passed
                while passed <= tl:
                    ops.append(("wait", passed))
                    if passed < tl:
                        ops.append(("release", passed))
                    passed += 1
            if items:
                pass_to(items[0][0])
            for k, (tl, _) in enumerate(items):
                last = k + 1 >= len(items) or items[k + 1][0] != tl
                if last:
                    ops.append(("release", tl))
                if k + 1 < len(items):
                    pass_to(items[k + 1][0])
            programs.append(ops)
        pcs = [0] * warps
        progress = True
        while progress:
            progress = False
            for warp in range(warps):
                while pcs[warp] < len(programs[warp]):
                    op, tl = programs[warp][pcs[warp]]
                    if op == "wait" and tl not in loaded:
                        break
                    if op == "release":
                        count[tl] += 1
                        assert count[tl] <= warps
                        if count[tl] == warps and tl + stages < tiles:
                            assert tl + stages not in loaded
                            loaded.add(tl + stages)
                    pcs[warp] += 1
                    progress = True
        assert all(pc == len(ops) for pc, ops in zip(pcs, programs)), (tiles, mtiles, stages)
        assert loaded == set(range(tiles))


def test_tensor_core_step_shared_memory_and_options():
    limit = 227 * 1024  # H100 / H200 opt-in maximum per block
    assert [cuda_wide.tc_stages(rows, limit) for rows in (1, 64, 65, 128, 129, 192, 193, 256)] == [4, 4, 4, 4, 2, 2, 2, 2]
    assert cuda_wide.tc_smem_bytes(256, 2) <= limit < cuda_wide.tc_smem_bytes(256, 3)
    assert cuda_wide.tc_stages(256, 150_000) == 0  # fewer than two W2 tiles fit: refused (max_rows)
    assert cuda_wide.tc_smem_bytes(256, 2, gumbel=True) == cuda_wide.tc_smem_bytes(256, 2) + 4 * cuda_wide.TB_SIZE
    assert cuda_wide.tc_stages(256, limit, gumbel=True) == 2
    text = (build.SOURCE_DIR / "wide_tc.cu").read_text()
    for define, value in (("TC_TOK", cuda_wide.TC_TOKENS), ("TC_MROWS", cuda_wide.TC_MROWS),
                          ("TC_MAX_STAGES", cuda_wide.TC_MAX_STAGES),
                          ("TC_OPT_GENERAL", cuda_wide.TC_OPT_GENERAL),
                          ("TC_OPT_NO_W2_PREFETCH", cuda_wide.TC_OPT_NO_W2_PREFETCH)):
        assert re.search(rf"#define {define} {value}\b", text), define
    head = dm.MarkovHead(torch.zeros(300, 256, dtype=torch.bfloat16), torch.zeros(300, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="tensor_cores: expected True or False"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                  tensor_cores=1)
    with pytest.raises(ValueError, match="tc_fast: expected True or False"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                  tensor_cores=True, tc_fast="no")
    with pytest.raises(ValueError, match="tc_fast_div: expected True or False"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                  tensor_cores=True, tc_fast_div=1)
    with pytest.raises(ValueError, match="tc_prefetch_w2: expected True or False"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                  tensor_cores=True, tc_prefetch_w2=0)
    for kwargs in ({"tc_warpgroups": 3}, {"tc_fast_div": True}):
        with pytest.raises(ValueError, match="options of the wgmma step, which needs tensor_cores=True"):
            cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                      **kwargs)
    with pytest.raises(ValueError, match="tc_fast_div: the branch-free division is the inverse-CDF epilogue's"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cuda",
                                  tensor_cores=True, tc_fast_div=True)
    for value in (4, True, "3"):
        with pytest.raises(ValueError, match=r"tc_warpgroups: expected one of \(2, 3\)"):
            cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                      tensor_cores=True, tc_warpgroups=value)


def test_args_struct_matches_the_kernel():
    assert_args_struct_matches("wide.cuh", "WideArgs", cuda_wide.WideArgs._fields_)
    assert ctypes.sizeof(cuda_wide.WideArgs) == 8 * len(cuda_wide.WideArgs._fields_)
    text = (build.SOURCE_DIR / "wide.cuh").read_text()
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
    assert cuda_wide.smem_bytes(cuda_wide.MAX_ROWS, inverse_cdf=True) <= 227 * 1024
    assert cuda_wide.icdf_blocks(129_280, 132) == (64, 127)  # 1,024 tokens per block, the last one 256
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
    with pytest.raises(ValueError, match="method"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="top_k", cache_dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="warps_per_group"):
        cuda_wide.CudaWideBackend(head, 5, 4, method="inverse_cdf", cache_dtype=torch.bfloat16, device="cuda",
                                  warps_per_group=2)
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in cuda_wide.CudaWideBackend.unavailable_reason()


def test_runs_only_when_opted_in(monkeypatch):
    """cuda_wide is exact but slower than what auto picks: without DSPARK_MARKOV_UNVERIFIED listing it, it says so
    (the variable's name, the design's and its status) and does not run."""
    monkeypatch.delenv(cuda_wide.UNVERIFIED_ENV, raising=False)
    why = cuda_wide.CudaWideBackend.opt_in_reason()
    assert cuda_wide.STATUS in why and f"{cuda_wide.UNVERIFIED_ENV}=cuda_wide" in why and "slower" in why
    for value in ("cuda_wide", "1", "filter,cuda_wide"):
        monkeypatch.setenv(cuda_wide.UNVERIFIED_ENV, value)
        assert cuda_wide.CudaWideBackend.opt_in_reason() is None
    monkeypatch.setenv(cuda_wide.UNVERIFIED_ENV, "cuda_gumbel")
    assert cuda_wide.CudaWideBackend.opt_in_reason() is not None
    from dspark_markov.bench import grid
    from dspark_markov.draft import auto

    assert "cuda_wide" not in grid.DESIGNS and "cuda_wide" in grid.KNOWN_DESIGNS
    assert "cuda_wide" not in repr(auto.AUTO_TABLE) and "cuda_wide" not in repr(auto.PORTABLE_TABLE)


def test_refuses_weights_not_16_byte_aligned(monkeypatch):
    """wide.cu reads W2 rows by cp.async and W1 rows as uint4: a weight view at a storage offset that is not a
    multiple of 16 bytes is refused before any launch (a misaligned address would kill the CUDA context)."""
    from dspark_markov import cuda

    monkeypatch.setenv(cuda_wide.UNVERIFIED_ENV, "cuda_wide")
    monkeypatch.setattr(cuda, "availability", lambda *args, **kwargs: None)  # as if on an H200: no launch follows
    flat = torch.zeros(300 * 256 + 1, dtype=torch.bfloat16)
    aligned, shifted = torch.zeros(300, 256, dtype=torch.bfloat16), flat[1:].view(300, 256)  # 2 bytes off
    for embed, weight, name in ((aligned, shifted, "head_weight"), (shifted, aligned, "embed_weight")):
        with pytest.raises(ValueError, match=name):
            cuda_wide.CudaWideBackend(dm.MarkovHead(embed, weight), 5, 4, method="gumbel", cache_dtype=torch.bfloat16,
                                      device="cuda")


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
    inv = torch.where(inv <= 3.402823466e38, inv, float("nan"))  # wide_row: 1 / T overflowed (subnormal T): NaN bounds
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
    z[9] = -z[9].abs() - 0.25  # every z < 0 at a subnormal T (below): the keys are finite, 1 / T is not
    temp = torch.tensor([0.0, 0.6, 1.0, 2.5])[torch.arange(rows) % 4]
    temp[9] = 1e-39
    seed = torch.randint(-(2**62), 2**62, (rows,), generator=gen)
    pos = torch.randint(1, 1 << 20, (rows,), generator=gen)
    for step, teams, margin in ((0, 5, 0.0), (3, 64, 1e-3)):  # interleavings, margins
        keys = gumbel_keys(z, temp, seed, step, pos)
        got = _emulate_step(z, temp, seed, step, pos, teams, margin, table, keys)
        want = argmax_first(keys)  # draw_gumbel
        assert torch.equal(got, want), (step, teams, torch.nonzero(got != want).flatten().tolist())


# --------------------------------------------------------------------------- the inverse-CDF draw, emulated
# method="inverse_cdf": dm_wide_step's _icdf partials and dm_wide_pick's pick replayed in fp32 numpy in the kernel's
# order of operations (group partials per lane quad, per-(warp, row) merges in group order, warps merged in order,
# lane chunks + a Hillis-Steele scan + running prefixes in the pick). exp is np.exp2(d * log2 e) in fp32 where the
# GPU has ex2.approx.ftz (a few ulp apart): the emulation checks the rules, the GPU tests check the CUDA code.
_LOG2E = np.float32(1.4426950408889634)
_NINF = np.float32(-np.inf)


def _ex(d):  # wide.cu dw_exp
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp2(np.float32(d) * _LOG2E).astype(np.float32)


def _merge(m, s, gm, gs):  # wide.cu dw_merge, vectorised over rows
    with np.errstate(invalid="ignore", over="ignore"):
        up = gm > m
        s_up = s * _ex(m - gm) + gs
        s_dn = np.where(gs > 0, s + gs * _ex(gm - m), s)
        return np.where(up | np.isnan(gm), gm, m).astype(np.float32), np.where(up, s_up, s_dn).astype(np.float32)


def _scaled(z, temp):  # wide.cu dw_scaled (fp32 division; T = 1 the identity)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return np.where(temp == 1, z, z / np.where(temp == 0, np.float32(1), temp)).astype(np.float32)


def _block_partials(z, temp, gpb):
    """part[row][b] = (max z/T, mass) of dm_wide_b*_icdf: warp w of block b takes groups b gpb + w, + 8, ..."""
    rows, vocab = z.shape
    groups = -(-vocab // 16)
    blocks = -(-groups // gpb)
    x = np.full((rows, groups * 16), _NINF, np.float32)
    x[:, :vocab] = _scaled(z, temp[:, None])
    x = x.reshape(rows, groups, 4, 4)  # [row, group, lane c, token k]
    with np.errstate(invalid="ignore", over="ignore"):
        gm = x.max(axis=(2, 3))  # NaN sticky
        w = _ex(x - gm[:, :, None, None])
        lane = ((w[..., 0] + w[..., 1]) + w[..., 2]) + w[..., 3]
        gs = (lane[..., 0] + lane[..., 1]) + (lane[..., 2] + lane[..., 3])
    gs = np.where(gm == _NINF, np.float32(0), gs).astype(np.float32)
    part = np.zeros((rows, blocks, 2), np.float32)
    for b in range(blocks):
        m, s = np.full(rows, _NINF, np.float32), np.zeros(rows, np.float32)
        for warp in range(8):
            wm, ws = np.full(rows, _NINF, np.float32), np.zeros(rows, np.float32)
            for grp in range(b * gpb + warp, min(groups, (b + 1) * gpb), 8):
                wm, ws = _merge(wm, ws, gm[:, grp], gs[:, grp])
            m, s = _merge(m, s, wm, ws)
        part[:, b, 0], part[:, b, 1] = m, s
    return part


def _lane_scan(sums):  # Hillis-Steele over 32 lanes (shfl_up d = 1, 2, 4, 8, 16: o + own); exclusive = shfl_up 1
    incl = np.array(sums, np.float32)
    for d in (1, 2, 4, 8, 16):
        incl = np.concatenate([incl[:d], incl[:-d] + incl[d:]]).astype(np.float32)
    return np.concatenate([[np.float32(0)], incl[:-1]]).astype(np.float32), incl[31]


def _pick(z, temp, u, part, gpb):
    """dm_wide_pick's dw_pick for one live row (z its cached row, fp32; greedy rows through their partials too)."""
    vocab, nb = z.shape[0], part.shape[0]
    span = lambda b: (b * gpb * 16, min(vocab, (b + 1) * gpb * 16))  # noqa: E731
    m = part[:, 0].max()  # NaN sticky
    if np.isnan(m):
        lo, hi = span(int(np.flatnonzero(np.isnan(part[:, 0]))[0]))
        return lo + int(np.flatnonzero(np.isnan(z[lo:hi]))[0])
    if m == _NINF and temp == 0:
        return 0
    if temp == 0:  # the first block whose max is the row's, then its first such token
        lo, hi = span(int(np.flatnonzero(part[:, 0] == m)[0]))
        return lo + int(np.flatnonzero(z[lo:hi] == m)[0])
    if m == np.inf or m == _NINF:  # not finite: argmax_first(z) (z itself may be finite: z / T overflowed)
        return int(np.flatnonzero(z == z.max())[0])
    per = -(-nb // 32)
    mass = np.where(part[:, 1] > 0, part[:, 1] * _ex(part[:, 0] - m), np.float32(0)).astype(np.float32)

    def choose(values, size, chunk):
        lanes = [range(lane * chunk, min(lane * chunk + chunk, size)) for lane in range(32)]
        sums = []
        for idx in lanes:
            acc = np.float32(0)
            for i in idx:
                acc = np.float32(acc + values[i])
            sums.append(acc)
        return lanes, _lane_scan(sums)

    lanes, (excl, total) = choose(mass, nb, per)
    target = np.float32(u * total)
    hit = last = None
    for lane, idx in enumerate(lanes):
        run = excl[lane]
        for b in idx:
            nxt = np.float32(run + mass[b])
            if mass[b] > 0:
                last = (b, run)
                if nxt > target and hit is None:
                    hit = (b, run)
            run = nxt
    chosen, before = hit if hit is not None else last
    remaining = np.float32(target - before)
    lo, hi = span(chosen)
    mc, scale = part[chosen, 0], _ex(part[chosen, 0] - m)
    with np.errstate(invalid="ignore", over="ignore"):
        weight = _ex(_scaled(z[lo:hi], temp) - mc)
    lanes, (excl, _) = choose(weight, hi - lo, -(-(hi - lo) // 32))
    hit = last = None
    for lane, idx in enumerate(lanes):
        run = excl[lane]
        for i in idx:
            run = np.float32(run + weight[i])
            if weight[i] > 0:
                last = lo + i
                if hit is None and np.float32(run * scale) > remaining:
                    hit = lo + i
    return hit if hit is not None else last


def test_emulated_inverse_cdf_draws_the_reference():
    """The _icdf partials and the pick, emulated: at V = 8000 (500 groups, 63 blocks of 8: two per lane in the block
    stage, a partial group) and 1000 (16 groups per block), 37 rows of bf16-rounded logits at T = 0 / 0.6 / 1 / 2.5 and
    NaN / +inf / all -inf / huge / sparse rows: every token is draw_inverse_cdf's (greedy and non-finite rows
    argmax_first, greedy rows through their partials: the first block holding the max), every T > 0 token the inverse
    CDF of its uniform (tests.helpers.check_inverse_cdf), and each block partial is (max z / T, sum exp(z / T - max))
    to 1e-5 (z on greedy rows)."""
    from dspark_markov import rng
    from dspark_markov.draft.reference import argmax_first, draw_inverse_cdf
    from tests.helpers import check_inverse_cdf

    gen = torch.Generator().manual_seed(12)
    for vocab, max_blocks in ((8000, 132), (1000, 4)):
        rows = 37
        gpb, blocks = cuda_wide.icdf_blocks(vocab, max_blocks)
        z = (torch.randn(rows, vocab, generator=gen) * 3).bfloat16().float()
        z[1] = float("-inf")
        z[2, vocab // 2], z[2, vocab // 3] = float("nan"), float("nan")
        z[3, 7], z[3, vocab - 1] = float("inf"), float("inf")
        z[5, :] = float("-inf")
        z[5, [vocab - 3, 17]] = 0.0
        z[6, vocab - 5] = 3e38  # z / 0.6 overflows to +inf: the first maximum of z
        z[7, ::2] = float("-inf")
        z[8, : vocab // 2] = float("-inf")
        z[9] = z[9] * 1e-3  # nearly flat: the draw falls deep inside the row
        z[11, [vocab - 40, 40]] = 50.0  # greedy rows (T = 0 at rows 3 mod 4): a tie across blocks, +inf, all -inf
        z[15, [vocab - 2, 3]] = float("inf")
        z[19] = float("-inf")
        z[13] = -3e38  # finite z whose z / 0.01 all overflow to -inf: argmax_first(z) (desk review 2026-12-05)
        z[13, 99] = -1e38
        temp = torch.tensor([1.0, 0.6, 2.5, 0.0])[torch.arange(rows) % 4]
        temp[[1, 2, 3, 5, 6, 7, 9, 13]] = torch.tensor([1.0, 1.0, 0.6, 1.0, 0.6, 2.5, 1.0, 0.01])
        seed = torch.randint(-(2**62), 2**62, (rows,), generator=gen)
        pos = torch.randint(1, 1 << 20, (rows,), generator=gen)
        step = 2
        part = _block_partials(z.numpy(), temp.numpy(), gpb)
        assert part.shape[1] == blocks
        u = rng.inverse_cdf_uniform(seed, step, pos).numpy()
        got = torch.tensor([_pick(z[r].numpy(), temp[r].numpy(), u[r], part[r], gpb) for r in range(rows)])
        want = draw_inverse_cdf(z, temp, seed, step, pos)
        assert torch.equal(got, want), (vocab, torch.nonzero(got != want).flatten().tolist())
        assert torch.equal(got[temp == 0], argmax_first(z[temp == 0]))
        assert got[1] == 0 and got[2] == vocab // 3 and got[3] == 7 and got[6] == vocab - 5
        assert got[11] == 40 and got[15] == 3 and got[19] == 0 and got[13] == 99
        finite = [r for r in range(rows) if temp[r] > 0 and r not in (1, 2, 3, 6, 13)]
        check_inverse_cdf(z[finite], temp[finite], seed[finite], step, pos[finite], got[finite])
        finite = finite + [r for r in range(rows) if temp[r] == 0 and r not in (15, 19)]  # greedy: x = z
        safe = torch.where(temp > 0, temp, torch.ones_like(temp))
        x = (z[finite].double() / safe[finite, None].double()).numpy()  # the partials against fp64 sums
        for b in range(blocks):
            cols = slice(b * gpb * 16, min(vocab, (b + 1) * gpb * 16))
            bm = x[:, cols].max(axis=1)
            np.testing.assert_array_equal(part[finite, b, 0], bm.astype(np.float32))
            with np.errstate(invalid="ignore"):
                mass = np.where(np.isfinite(bm), np.exp(x[:, cols] - bm[:, None]).sum(axis=1), 0.0)
            np.testing.assert_allclose(part[finite, b, 1], mass, rtol=1e-5)


# --------------------------------------------------------------------------- the division by T, as host C++
DIV_HARNESS = r"""
#include <cmath>
#include <cstring>
#include "noise.cuh"
namespace dw {
%s
}
static float from_bits(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static unsigned to_bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
// Mismatches of dw_div_rcp(z, t, rcp) against the IEEE quotient z / t (bit for bit, any NaN equal to any NaN) over
// z = the float of bits lo, lo + step, ... < hi and their negatives; the first one's z into *first.
extern "C" long check_div(float t, unsigned lo, unsigned hi, unsigned step, float* first) {
  const float r = dw::dw_rcp_for(t, 1.0f / t);
  long bad = 0;
  for (unsigned long long u = lo; u < hi; u += step) {
    for (int sign = 0; sign < 2; ++sign) {
      const float z = from_bits((unsigned)u | (sign ? 0x80000000u : 0u));
      const float got = dw::dw_div_rcp(z, t, r), want = z / t;
      if (to_bits(got) != to_bits(want) && !(got != got && want != want)) {
        if (bad == 0) *first = z;
        ++bad;
      }
    }
  }
  return bad;
}
"""


def test_division_by_t_is_ieee_exact_as_host_cpp(tmp_path):
    """wide.cu dw_div_rcp (q0 = z r and two Markstein FMA corrections, div_rn outside its safe range) equals the IEEE
    division z / t bit for bit: every significand of the binades [1, 2) and [2^100, 2^101) (its upper cut) for 3 t,
    a stride of 1999 over every float (zero, subnormals, inf, NaN included) for 24 t (1 / T near 1, tiny and huge T, the
    range ends 2^-16 and 2^16 and beyond). Host C++ (-ffp-contract=off; std::fmaf is the IEEE FMA like __fmaf_rn).
    (One correction passed this too; the second makes it Markstein's theorem: q1 is within one ulp.)"""
    text = (build.SOURCE_DIR / "wide.cuh").read_text()
    part = re.search(r"// BEGIN host-tested[^\n]*\n(.*?)// END host-tested", text, re.S).group(1)
    lib = host_library(tmp_path, DIV_HARNESS % part, "wide.cu's division")
    lib.check_div.restype = ctypes.c_long
    lib.check_div.argtypes = [ctypes.c_float, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                              ctypes.POINTER(ctypes.c_float)]
    first = ctypes.c_float(0.0)
    gen = np.random.default_rng(5)
    near_one = [float(np.float32(1.0) + np.float32(k) * np.float32(2.0**-23)) for k in (-3, -1, 1, 2)]
    some = [0.6, 0.7, 1 / 3, 2.5, 0.01, 100.0, 1.5, 0.9999]
    extremes = [2.0**-16, 2.0**16, 2.0**-17, 2.0**17, 1e-30, 3e30]
    rand = [float(x) for x in np.exp(gen.uniform(np.log(1e-3), np.log(1e3), 6)).astype(np.float32)]
    for t in (0.6, 1 / 3, 0.01):
        for lo in (0x3F800000, 0x71800000):  # [1, 2) and [2^100, 2^101)
            assert lib.check_div(t, lo, lo + (1 << 23), 1, ctypes.byref(first)) == 0, (t, first.value)
    for t in some + near_one + extremes + rand:
        assert lib.check_div(t, 0, 0x7FC00001, 1999, ctypes.byref(first)) == 0, (t, first.value)


def test_inverse_cdf_launch_sequence_and_arguments(monkeypatch):
    """CudaWideBackend.run for method="inverse_cdf" with a recording stand-in for the loaded kernels (no GPU): the
    start launch, then per step the _icdf step kernel over icdf_blocks(V, SMs x resident) blocks and dm_wide_pick,
    with icdf_gpb / icdf_blocks / part_stride / cache32 in the argument struct and the inverse-CDF shared memory."""
    import types

    rows, steps, vocab, sms = 37, 3, 4096, 3
    head = dm.MarkovHead(torch.zeros(vocab, 256, dtype=torch.bfloat16), torch.zeros(vocab, 256, dtype=torch.bfloat16))
    calls = []

    class Recorder:
        def launch(self, name, grid, block, smem, stream, params):
            args = params[0]
            calls.append((name, grid, block, smem, args.step, args.icdf_gpb, args.icdf_blocks, args.part_stride,
                          args.cache32, [int(p.value) for p in params[1:]]))

    backend = object.__new__(cuda_wide.CudaWideBackend)
    backend.__dict__.update(head=head, method="inverse_cdf", num_steps=steps, max_rows=rows, kernels=Recorder(),
                            noise_table=None, filter_margin=0.0, flags=0, warps_per_group=1, num_sms=sms,
                            device=torch.device("cpu"), codes=torch.zeros(48, 256), words=torch.zeros(rows),
                            keys=torch.zeros(1, dtype=torch.uint8), part_stride=sms * 2,
                            part=torch.zeros(48, sms * 2, 2),
                            resident={(n, m): 1 for n in cuda_wide.ICDF_KERNELS for m in range(1, 4)},
                            tensor_cores=True, tc_w2=head.head_weight)  # (an fp32 cache: wide.cu's step all the same)
    monkeypatch.setattr(cuda_wide.torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0))
    base = torch.zeros(rows, steps, vocab, dtype=torch.bfloat16)
    cache = torch.zeros(rows + 2, steps, vocab, dtype=torch.float32)
    zeros = torch.zeros(rows * steps, dtype=torch.int64)
    backend.run(base, torch.zeros(rows, dtype=torch.int64), zeros, zeros, torch.ones(rows + 2),
                torch.zeros(rows + 2, dtype=torch.int64), torch.zeros(rows, steps, dtype=torch.int64), cache)
    gpb, blocks = cuda_wide.icdf_blocks(vocab, sms)
    assert (gpb, blocks) == (88, 3)  # 32 rounds of 8 groups over 3 blocks: 11 rounds each, the last one 10
    smem = cuda_wide.smem_bytes(rows, True)
    want = [("dm_wide_finish", 6, 256, 0, 0, gpb, blocks, sms * 2, 1, [-1, 1])]
    for step in range(steps):
        want += [("dm_wide_b0_c1_v1_s0_icdf", blocks, 256, smem, step, gpb, blocks, sms * 2, 1, []),
                 ("dm_wide_pick", 5, 256, 0, step, gpb, blocks, sms * 2, 1, [step, int(step + 1 < steps)])]
    assert calls == want


def test_tensor_core_launch_sequence_and_arguments(monkeypatch):
    """tensor_cores=True with a bf16 cache (no GPU, recording stand-ins): the start launch, then per step the wgmma step
    dm_wide_tc_icdf_s0 over icdf_blocks(V, SMs) blocks of 288 threads with its shared memory, the TMA map and the
    stage count and the options word (0; TC_OPT_GENERAL with tc_fast=False) as extra parameters, and dm_wide_pick
    from wide.cu; an odd row offset takes wide.cu's step."""
    import types

    rows, steps, vocab, sms = 70, 2, 4096, 3
    head = dm.MarkovHead(torch.zeros(vocab, 256, dtype=torch.bfloat16), torch.zeros(vocab, 256, dtype=torch.bfloat16))
    calls = []

    class Recorder:
        def __init__(self, label):
            self.label = label

        def launch(self, name, grid, block, smem, stream, params):
            args = params[0]
            extra = [p if isinstance(p, ctypes.Array) else int(p.value) for p in params[1:]]
            calls.append((self.label, name, grid, block, smem, args.step, args.icdf_gpb, args.icdf_blocks, extra))

    tc_map = (ctypes.c_uint64 * 16)()
    backend = object.__new__(cuda_wide.CudaWideBackend)
    backend.__dict__.update(head=head, method="inverse_cdf", num_steps=steps, max_rows=rows, kernels=Recorder("wide"),
                            tc_kernels=Recorder("tc"), tc_map=tc_map, tc_stage_count={1: 4, 2: 4},
                            noise_table=None, filter_margin=0.0, flags=0, warps_per_group=1, num_sms=sms,
                            device=torch.device("cpu"), codes=torch.zeros(80, 256), words=torch.zeros(rows),
                            keys=torch.zeros(1, dtype=torch.uint8), part_stride=sms * 2,
                            part=torch.zeros(80, sms * 2, 2), tensor_cores=True, tc_w2=head.head_weight,
                            tc_options=0, tc_warpgroups=2, resident={(n, m): 2 for n in cuda_wide.ICDF_KERNELS + cuda_wide.STEP_KERNELS
                                      for m in range(1, 6)})  # (2 per SM: wide.cu's partition is another one)
    monkeypatch.setattr(cuda_wide.torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0))
    base = torch.zeros(rows, steps, vocab, dtype=torch.bfloat16)
    cache = torch.zeros(rows + 2, steps, vocab, dtype=torch.bfloat16)
    zeros = torch.zeros(rows * steps, dtype=torch.int64)
    inputs = (torch.zeros(rows, dtype=torch.int64), zeros, zeros, torch.ones(rows + 2),
              torch.zeros(rows + 2, dtype=torch.int64), torch.zeros(rows, steps, dtype=torch.int64))
    assert backend.tensor_core_path(base, cache)
    backend.run(base, *inputs, cache)
    gpb, blocks = cuda_wide.icdf_blocks(vocab, sms)
    wide_gpb, wide_blocks = cuda_wide.icdf_blocks(vocab, sms * 2)
    assert (gpb, blocks) != (wide_gpb, wide_blocks)
    smem = cuda_wide.tc_smem_bytes(rows, 4)
    want = [("wide", "dm_wide_finish", 10, 256, 0, 0, wide_gpb, wide_blocks, [-1, 1])]
    for step in range(steps):
        want += [("tc", "dm_wide_tc_icdf_s0", blocks, cuda_wide.TC_THREADS, smem, step, gpb, blocks, [tc_map, 4, 0]),
                 ("wide", "dm_wide_pick", 9, 256, 0, step, gpb, blocks, [step, int(step + 1 < steps)])]
    assert calls == want
    calls.clear()  # tc_fast=False: the general epilogue's option bit
    backend.__dict__.update(tc_options=cuda_wide.TC_OPT_GENERAL)
    backend.run(base, *inputs, cache)
    assert calls[1][-1] == [tc_map, 4, cuda_wide.TC_OPT_GENERAL]
    backend.__dict__.update(tc_options=0)
    calls.clear()  # tc_warpgroups=3: 384 threads (no producer warp), three partials per row, a release count per stage
    backend.__dict__.update(tc_warpgroups=3)
    backend.run(base, *inputs, cache)
    assert calls[1][:5] == ("tc", "dm_wide_tc_icdf_s0", blocks, 384, cuda_wide.tc_smem_bytes(rows, 4, warpgroups=3))
    assert cuda_wide.tc_smem_bytes(rows, 4, warpgroups=3) == cuda_wide.tc_smem_bytes(rows, 4) + 8 * 128 + 4 * 8
    backend.__dict__.update(tc_warpgroups=2)
    calls.clear()  # method="gumbel": the _gumbel entry point with the table's shared memory, then dm_wide_finish
    backend.__dict__.update(method="gumbel")
    backend.run(base, *inputs, cache)
    smem = cuda_wide.tc_smem_bytes(rows, 4, gumbel=True)
    assert [c[:5] for c in calls[1:3]] == [("tc", "dm_wide_tc_gumbel_s0", blocks, cuda_wide.TC_THREADS, smem),
                                           ("wide", "dm_wide_finish", 9, 256, 0)]
    calls.clear()
    backend.__dict__.update(tc_warpgroups=3)
    backend.run(base, *inputs, cache)
    smem = cuda_wide.tc_smem_bytes(rows, 4, gumbel=True, warpgroups=3)
    assert calls[1][:5] == ("tc", "dm_wide_tc_gumbel_s0", blocks, 384, smem)
    backend.__dict__.update(tc_warpgroups=2)
    # 16-byte aligned, but an odd row stride (base) / slot stride (cache): the pairs would straddle
    odd_base = torch.zeros(rows * (steps * vocab + 1), dtype=torch.bfloat16).as_strided(
        (rows, steps, vocab), (steps * vocab + 1, vocab, 1))
    odd_cache = torch.zeros((rows + 2) * (steps * vocab + 1), dtype=torch.bfloat16).as_strided(
        (rows + 2, steps, vocab), (steps * vocab + 1, vocab, 1))
    assert odd_base.data_ptr() % 16 == 0 and odd_cache.data_ptr() % 16 == 0
    assert not backend.tensor_core_path(odd_base, cache)
    assert not backend.tensor_core_path(base, odd_cache)
    assert not backend.tensor_core_path(base, cache.float())
    # a head whose W2 was replaced after the TMA map was encoded: refused by name
    backend.__dict__.update(tc_w2=torch.zeros(vocab, 256, dtype=torch.bfloat16))
    launched = len(calls)
    with pytest.raises(ValueError, match="head_weight: the head's W2 was replaced"):
        backend.run(base, *inputs, cache)
    assert len(calls) == launched  # refused before any launch
