"""``top_k_top_p(impl="cuda")`` (verify/cuda_filtering.py, cuda/filter.cu) on the CPU: what can be checked without a GPU.

- ``filter.cu`` compiles for sm_90 (NVRTC, else nvcc; skipped without either) without spills,
  two blocks per SM (registers and shared memory), and its argument struct matches the ctypes one;
- its weight, bucket and packed-word helpers, compiled as host C++ (``-ffp-contract=off``), equal the torch
  reference bit for bit (the weight on every fp32 ``d`` in [-44, -22.5), where the kernel skips the polynomial);
- the kernel's search, emulated in numpy in its order of decisions (:func:`emulate`: eight slices with their
  two-word bins, the level-1 buckets, the 256-way narrowing passes, the sorted candidates, the targets), keeps
  exactly the sort reference's set on hard rows, on the bench's input kinds at full V and with the candidate
  capacity forced down (every search narrows);
- df_thresholds (the gather's compares) decides exactly as df_bucket;
- ``auto``'s choice (:func:`cf.auto_picks`, also under CUDA-graph capture), the registry entry and the argument checks.
The kernel itself is checked on the H200 by tests/gpu/test_cuda_filtering_gpu.py (tools/gpu_plans/issue16_cluster.sh).
"""

import contextlib
import ctypes
import re

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov import registry
from dspark_markov.cuda import build
from dspark_markov.validate import spans_overlap
from dspark_markov.verify import cuda_filtering as cf
from dspark_markov.verify.filtering_reference import top_k_top_p_reference, weight_fixed_point
from tests.helpers import assert_args_struct_matches, host_library, load_tool, sm90_compile_log
from tests.verify.test_filtering import hard_rows

NEG_INF = float("-inf")
CAPACITY = 2048  # filter.cu DF_CAP


def test_filter_kernel_compiles_for_sm90(tmp_path):
    log, _ = sm90_compile_log("filter.cu", tmp_path)
    entry = log[log.index("Function properties for dm_filter"):]
    assert " 0 bytes spill stores" in entry.splitlines()[1], entry  # (the stack frame: df_search's call, no spill)
    registers = int(re.search(r"Used (\d+) registers", entry).group(1))
    static = int(re.search(r"(\d+) bytes smem", entry).group(1))
    assert registers <= 128  # __launch_bounds__(256, 2)
    assert static == cf.STATIC_SMEM
    slice_bytes = cf.smem_bytes(129_280)
    assert slice_bytes == 64_640 and 2 * (static + slice_bytes + 1024) <= 228 * 1024  # two blocks per SM
    assert static + cf.MAX_SLICE * 4 <= cf.SMEM_LIMIT and cf.MAX_SLICE < 2**16


def l2_build_resources(tmp_path, defines):
    """``(spill stores, spill loads, registers, static shared memory)`` of dm_filter built with ``defines`` (ptxas)."""
    log, _ = sm90_compile_log("filter.cu", tmp_path, defines=defines)
    entry = log[log.index("Function properties for dm_filter"):]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", entry)
    return (int(spills.group(1)), int(spills.group(2)), int(re.search(r"Used (\d+) registers", entry).group(1)),
            int(re.search(r"(\d+) bytes smem", entry).group(1)))


def test_l2_row_build_compiles_for_four_blocks_per_sm(tmp_path):
    """The -DDF_L2_ROWS build (FLAG_L2_ROWS): no slice in shared memory, so four blocks per SM (64 registers, the same
    static shared memory), and its cache-hinted loads in the SASS where NVRTC built it."""
    stores, loads, registers, static = l2_build_resources(tmp_path, cf.L2_DEFINES)
    assert stores <= 16 and loads <= 64  # (a few words at the 64-register cap)
    assert registers <= 64 and static <= cf.STATIC_SMEM and 4 * (static + 1024) <= 228 * 1024


@pytest.mark.parametrize("l2", [False, True])
def test_specialized_builds_compile_smaller_and_every_flag_is_read_through_one_macro(tmp_path, l2):
    """FLAG_SPECIALIZE's builds (-DDF_FIXED_FLAGS = the default's kernel flags of the resident / L2-row build): the
    L2-row one at 64 registers for four blocks per SM, no hot loop reloading spilled words, and both with fewer SASS
    instructions than the generic build (the other options' code dropped). Every read of the flags goes through
    DF_FLAGS_OF, the identity without the define (the generic builds' SASS is then the measured one: compared with
    tools/cuda_sass.py-style dumps of all 16 builds in stop 44)."""
    text = (build.SOURCE_DIR / "filter.cu").read_text()
    assert "#ifdef DF_FIXED_FLAGS\n#define DF_FLAGS_OF(x) ((u32)(DF_FIXED_FLAGS))\n#else\n#define DF_FLAGS_OF(x) (x)\n" in text
    # every read of the flags (a.flags, sh.flags) goes through DF_FLAGS_OF, but sh's copy of a's
    reads = [m.end() - len(".flags") for m in re.finditer(r"\b(?:a|sh)\.flags\b", text)]
    copy = text.index("sh.flags = (u32)a.flags;")
    assert len(reads) >= 10 and all(text[:at].endswith("DF_FLAGS_OF(a") or text[:at].endswith("DF_FLAGS_OF(sh")
                                    or copy <= at <= copy + len("sh.flags = (u32)a") for at in reads), [
        text[at - 30:at + 10] for at in reads]
    base = cf.L2_DEFINES if l2 else ()
    fixed = base + (f"DF_FIXED_FLAGS={cf.compiled_flags(cf.DEFAULT_FLAGS, l2)}",)
    if l2:
        stores, loads, registers, static = l2_build_resources(tmp_path, fixed)
        assert stores <= 16 and loads <= 64 and registers <= 64 and 4 * (static + 1024) <= 228 * 1024
    try:
        generic = build.compile_cubin("filter.cu", extra_options=[f"-D{d}" for d in base])[0]
        special = build.compile_cubin("filter.cu", extra_options=[f"-D{d}" for d in fixed])[0]
    except build.BuildError:
        pytest.skip("no NVRTC to list the SASS of both builds")
    sass = [cuobjdump_sass(c) for c in (generic, special)]
    if sass[0] is None:
        pytest.skip("no cuobjdump")
    counts = [len(re.findall(r"/\*[0-9a-f]{4,}\*/", t)) for t in sass]
    assert counts[1] < 0.9 * counts[0], counts
    assert_hot_loops_unspilled(tmp_path, fixed)


@pytest.mark.parametrize("option", ["sparse", "split"])
@pytest.mark.parametrize("l2", [False, True])
def test_fixed_only_builds_compile_within_the_default_builds_resources(tmp_path, l2, option):
    """FLAG_SPARSE_DIGIT's and FLAG_SPLIT_FINAL's specialized builds (the default flags with one of them, stop 49): the
    L2-row one at 64 registers with at most a few spilled words and no hot loop reloading them (four blocks per SM),
    the resident one unspilled within its 128 registers, and the generic builds unaffected by them (compiled into
    DF_FIXED_FLAGS builds only)."""
    bit = cf.FLAG_SPARSE_DIGIT if option == "sparse" else cf.FLAG_SPLIT_FINAL
    base = cf.L2_DEFINES if l2 else ()
    # (the option compiled in even where launches drop it: SPLIT_FINAL in the L2-row build, L2_KERNEL_FLAGS)
    fixed = base + (f"DF_FIXED_FLAGS={cf.compiled_flags(cf.DEFAULT_FLAGS, l2) | bit}",)
    assert cf.compiled_flags(cf.DEFAULT_FLAGS | bit, l2) & bit or (l2 and bit == cf.FLAG_SPLIT_FINAL)
    stores, loads, registers, static = l2_build_resources(tmp_path, fixed)
    if l2:
        assert stores <= 16 and loads <= 64 and registers <= 64 and 4 * (static + 1024) <= 228 * 1024
    else:
        assert stores == 0 and registers <= 128
    assert_hot_loops_unspilled(tmp_path, fixed)
    text = (build.SOURCE_DIR / "filter.cu").read_text()
    assert "#if defined(DF_FIXED_FLAGS)\n#define DF_FIXED_ONLY DF_NEW_FLAGS\n#else\n#define DF_FIXED_ONLY 0\n" in text
    assert text.count("DF_FIXED_ONLY && (") == 2  # (SPARSE_DIGIT's and SPLIT_FINAL's only uses)


@pytest.mark.parametrize("cluster", [4, 5, 6, 7])
def test_smaller_cluster_l2_builds_compile_for_four_blocks_per_sm(tmp_path, cluster):
    """The -DDF_L2_ROWS -DDF_C=N builds (FLAG_L2_CLUSTER4: 4; FLAG_L2_FIT: 4 to 7): 64 registers, static shared memory
    under the 48 KB a static declaration may take, their reduced buckets (DF_RANGE x 12 bytes) as dynamic shared
    memory, four blocks per SM."""
    defines = cf.l2_defines(cluster)
    assert defines == cf.L2_DEFINES + (f"DF_C={cluster}",) and (cluster != 4 or defines == cf.L2_C4_DEFINES)
    stores, loads, registers, static = l2_build_resources(tmp_path, defines)
    assert stores <= 16 and loads <= 64 and registers <= 64
    assert cf.l2_smem(cluster) == cf.L2_C4_SMEM == cf.BUCKETS // 4 * 12 == 6144  # 512 buckets of 12 bytes, 4 to 7
    assert static <= 48 * 1024 and 4 * (static + cf.l2_smem(cluster) + 1024) <= 228 * 1024
    assert cf.slice_len(129_280, cluster) <= cf.slice_len(129_280, 4) == 32_320 <= cf.L2_C4_MAX_SLICE < 2**16


@pytest.mark.parametrize("cluster", [8, 7, 6, 5])
def test_five_block_l2_builds_fit_five_blocks_per_sm(tmp_path, cluster):
    """FLAG_L2_FIVE: the L2-row builds with -DDF_L2_FIVE (each FLAG_L2_FIT size) at 48 registers with at most a few
    spilled words, and five blocks' static + dynamic shared memory (1,024 candidates) within the SM's 228 KB."""
    defines = cf.l2_defines(cluster, five=True)
    assert defines[-1] == "DF_L2_FIVE" and defines[:-1] == cf.l2_defines(cluster)
    stores, loads, registers, static = l2_build_resources(tmp_path, defines)
    assert stores <= 32 and loads <= 32 and registers <= 48  # (stop 41's kernel flags are compiled out of them)
    assert 5 * (static + cf.l2_smem(cluster) + 1024) <= 228 * 1024
    assert_hot_loops_unspilled(tmp_path, defines)


@pytest.mark.parametrize("variant", ["persist", "carry"])
@pytest.mark.parametrize("defines", [(), cf.L2_DEFINES, cf.L2_C4_DEFINES], ids=["resident", "l2", "l2_c4"])
def test_persistent_builds_compile_without_spills_in_their_loops(tmp_path, defines, variant):
    """FLAG_PERSIST's builds (-DDF_PERSIST with each build's defines) and FLAG_CARRY's (and -DDF_CARRY): the row's body
    inlined into the loop over the cluster's rows (a called df_row spilled hundreds of bytes inside the per-token
    loops) keeps the one-row build's registers and static shared memory. The persist builds spill at most a few words,
    as the one-row L2-row build may (NVRTC 13.0: 0 / 32 / 32 bytes in the resident / L2 / 4-block L2 builds; nvcc
    13.0: 0 / 36 / 36); the carry builds a few hundred in the L2-row builds (their write loop holds two sets of four
    16-byte groups; NVRTC 13.0 144 / 166, nvcc 13.0 ~240-270). Where the SASS can be listed, no loop without a
    barrier of up to 500 instructions (the per-token loops: load, histogram, gather, write, and the carry's fused
    write loop of ~390) reloads more than one spilled word per iteration: the spills are outside them. The loop and
    the next row's bulk prefetch are in the source."""
    extra = cf.CARRY_DEFINES if variant == "carry" else cf.PERSIST_DEFINES
    base, _ = sm90_compile_log("filter.cu", tmp_path, defines=defines)
    log, _ = sm90_compile_log("filter.cu", tmp_path, defines=defines + extra)

    def properties(text):
        entry = text[text.index("Function properties for dm_filter"):]
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", entry)
        registers = int(re.search(r"Used (\d+) registers", entry).group(1))
        return registers, int(re.search(r"(\d+) bytes smem", entry).group(1)), int(spills.group(1)), int(spills.group(2))

    (_, base_smem, _, _), (regs, smem, stores, loads) = properties(base), properties(log)
    assert regs <= (128 if not defines else 64) and smem == base_smem, log
    bound = 64 if variant == "persist" or not defines else 512  # (stop 41's kernel flags are compiled out of them)
    assert stores <= bound and loads <= bound, log
    assert "df_row" not in log  # (inlined)
    text = (build.SOURCE_DIR / "filter.cu").read_text()
    assert "for (i64 row = blockIdx.x / DF_C; row < a.rows; row += clusters)" in text
    assert text.count("df_prefetch_next(a, next, lo, n)") == 2
    assert_hot_loops_unspilled(tmp_path, defines + extra)


def assert_hot_loops_unspilled(tmp_path, defines):
    """Where the SASS of filter.cu's build with ``defines`` can be listed (NVRTC's cubin, else the one the last
    ``sm90_compile_log`` of those defines left in ``tmp_path``), no loop without a barrier of up to 500 instructions
    (the per-token loops: load, histogram, gather, write) reloads more than one spilled word per iteration."""
    try:
        cubin = build.compile_cubin("filter.cu", extra_options=[f"-D{d}" for d in defines])[0]
    except build.BuildError:
        cubin = (tmp_path / "filter.cubin").read_bytes()
    sass = cuobjdump_sass(cubin)
    if sass is None:
        return  # (no cuobjdump: the log's totals only)
    hot = [body for body in sass_loops(sass) if len(body) <= 500 and not any("BAR" in op for op in body)]
    assert len(hot) >= 10, len(hot)  # (the listing was parsed: the kernel has dozens of such loops)
    spilled = [sum("LDL" in op or "STL" in op for op in body) for body in hot]
    assert max(spilled) <= 1, spilled


def cuobjdump_sass(cubin):
    """``cuobjdump -sass`` of a cubin (tools/filter_sass.py's: Triton's copy of the tool; None where it is absent)."""
    import os

    sass = load_tool("filter_sass")
    return sass.cuobjdump(cubin) if os.path.exists(sass.cuobjdump_tool()) else None


def sass_loops(sass):
    """The instruction lists of the loops of a SASS listing: from a backward branch's target to the branch."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = []
    for address, op in ins:
        target = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", op)
        if target and int(target.group(1), 16) < address:
            loops.append([o for a, o in ins if int(target.group(1), 16) <= a <= address])
    return loops


def test_one_row_builds_are_the_measured_text():
    """The one-row builds (no DF_PERSIST) keep the kernel's measured text: the row from the block index where it was
    always computed, every exit a return (DF_PERSIST's changes are all behind its macro)."""
    text = (build.SOURCE_DIR / "filter.cu").read_text()
    assert "#else\n  const i64 row = blockIdx.x / DF_C, vocab = a.vocab, lo = (i64)rank * a.slice;\n#endif" in text
    # the body's opening line: df_row's with DF_PERSIST, else the kernel's own
    opening = ("\n__device__ __forceinline__ void df_row(const FilterArgs& a, const i64 the_row, const i64 next, "
               "DfCarry& carry) {\n#else\nextern \"C\" __global__ void __cluster_dims__(DF_C, 1, 1) "
               "__launch_bounds__(DF_T, DF_MIN_BLOCKS) dm_filter(const FilterArgs a) {\n#endif\n")
    assert opening in text
    assert "continue" not in text[text.index("void df_row("):text.index("#ifdef DF_PERSIST\nextern")]


def test_filter_kernels_builds_each_variant_with_its_defines(monkeypatch):
    """filter_kernels: the resident build raises its dynamic shared memory to the largest slice, the L2-row build
    keeps none, the 4-block one raises it to L2_C4_SMEM; each with its defines (a recording loader)."""
    from dspark_markov import cuda

    calls = []

    class Loaded:
        def __init__(self, defines):
            self.defines = defines

        def set_dynamic_smem(self, name, nbytes):
            calls.append((self.defines, "smem", nbytes))

        def set_attribute(self, name, attribute, value):
            calls.append((self.defines, "attribute", value))

    monkeypatch.setattr(cuda, "load_kernels", lambda source, names, index, defines=(): Loaded(tuple(defines)))
    cf._load_filter.cache_clear()
    try:
        cf.filter_kernels(7)
        cf.filter_kernels(7, True)
        cf.filter_kernels(7, True, 4)
        cf.filter_kernels(7, True, 8)  # (the same build as (7, True): loaded once)
        cf.filter_kernels(7, False, 4)  # (the cluster is the L2-row build's option: the resident build again)
        cf.filter_kernels(7, True, 5)  # (FLAG_L2_FIT's sizes: -DDF_C=N, 6 KB of reduced buckets)
        cf.filter_kernels(7, False, 8, five=True)  # (FLAG_L2_FIVE is the L2-row build's: the resident build again)
        assert calls == [((), "smem", cf.MAX_SLICE * 4), ((), "attribute", 100), (cf.L2_DEFINES, "attribute", 100),
                         (cf.L2_C4_DEFINES, "smem", cf.L2_C4_SMEM), (cf.L2_C4_DEFINES, "attribute", 100),
                         (cf.L2_DEFINES + ("DF_C=5",), "smem", 6144), (cf.L2_DEFINES + ("DF_C=5",), "attribute", 100)]
        calls.clear()
        cf.filter_kernels(7, persist=True)  # FLAG_PERSIST: each build again with -DDF_PERSIST
        cf.filter_kernels(7, True, 8, True)
        cf.filter_kernels(7, True, 4, True)
        persist = cf.PERSIST_DEFINES
        assert calls == [(persist, "smem", cf.MAX_SLICE * 4), (persist, "attribute", 100),
                         (cf.L2_DEFINES + persist, "attribute", 100),
                         (cf.L2_C4_DEFINES + persist, "smem", cf.L2_C4_SMEM),
                         (cf.L2_C4_DEFINES + persist, "attribute", 100)]
        calls.clear()
        cf.filter_kernels(7, persist=True, carry=True)  # FLAG_CARRY: and -DDF_CARRY
        cf.filter_kernels(7, True, 8, True, True)
        cf.filter_kernels(7, True, 8, False, True)  # (carry without persist: the L2-row build, loaded already)
        carry = cf.CARRY_DEFINES
        assert calls == [(carry, "smem", cf.MAX_SLICE * 4), (carry, "attribute", 100),
                         (cf.L2_DEFINES + carry, "attribute", 100)]
        calls.clear()
        cf.filter_kernels(7, fixed=cf.DEFAULT_FLAGS & cf.RESIDENT_KERNEL_FLAGS)  # FLAG_SPECIALIZE: the flags compiled in
        cf.filter_kernels(7, True, 5, fixed=cf.DEFAULT_FLAGS & cf.L2_KERNEL_FLAGS)
        fixed = (f"DF_FIXED_FLAGS={cf.DEFAULT_FLAGS & cf.RESIDENT_KERNEL_FLAGS}",)
        fixed_l2 = cf.L2_DEFINES + ("DF_C=5", f"DF_FIXED_FLAGS={cf.DEFAULT_FLAGS & cf.L2_KERNEL_FLAGS}")
        assert calls == [(fixed, "smem", cf.MAX_SLICE * 4), (fixed, "attribute", 100), (fixed_l2, "smem", 6144),
                         (fixed_l2, "attribute", 100)]
        calls.clear()
        cf._default_kernels(7)  # what auto's availability check loads: the default flags' builds (FLAG_L2_FIT: 8, 7,
        # 6; the resident one and size 5 are loaded above), each specialized (FLAG_SPECIALIZE since stop 49)
        assert cf.DEFAULT_FLAGS & cf.FLAG_SPECIALIZE
        fx = (f"DF_FIXED_FLAGS={cf.DEFAULT_FLAGS & cf.L2_KERNEL_FLAGS}",)
        assert calls == [(cf.L2_DEFINES + fx, "attribute", 100)] + [
            (cf.L2_DEFINES + (f"DF_C={c}",) + fx, what, value) for c in (7, 6)
            for what, value in (("smem", 6144), ("attribute", 100))]
        calls.clear()
        cf._default_kernels(7)  # (every one cached now)
        assert calls == []
    finally:
        cf._load_filter.cache_clear()


def test_fit_cluster_takes_one_wave_of_the_largest_cluster_that_holds_the_batch():
    """FLAG_L2_FIT's rule (cf.fit_cluster) with an H100's resident clusters of the L2-row builds (62 / 69 / 79 / 94 of 8
    / 7 / 6 / 5 blocks, measured 2026-12-06): one wave of 8 when it holds the batch, else one wave of the largest
    smaller cluster that does (66 rows: 7; 84: 5), else 8 (a batch beyond one wave of 5 takes waves of 8)."""
    fits = {8: 62, 7: 69, 6: 79, 5: 94}
    picks = {rows: cf.fit_cluster(rows, fits) for rows in (1, 6, 31, 62, 63, 66, 69, 70, 79, 80, 84, 94, 95, 96, 384,
                                                           1518)}
    assert picks == {1: 8, 6: 8, 31: 8, 62: 8, 63: 7, 66: 7, 69: 7, 70: 6, 79: 6, 80: 5, 84: 5, 94: 5, 95: 8, 96: 8,
                     384: 8, 1518: 8}
    assert cf.fit_cluster(66, {8: 62}) == 8  # (only the 8-block build: it)
    assert cf.fit_cluster(66, {8: 62, 5: 94}) == 5  # (a size the device did not report is not a candidate)
    assert cf.L2_FIT_SIZES == (8, 7, 6, 5) and 4 not in cf.L2_FIT_SIZES  # (one wave of 4 measured no faster)


def test_args_struct_and_constants_match_the_kernel():
    assert_args_struct_matches("filter.cu", "FilterArgs", cf.FilterArgs._fields_)
    assert ctypes.sizeof(cf.FilterArgs) == 8 * len(cf.FilterArgs._fields_)
    text = (build.SOURCE_DIR / "filter.cu").read_text()
    for define, value in (("DF_C", cf.CLUSTER), ("DF_T", cf.THREADS), ("DF_NB", cf.BUCKETS), ("DF_CAP", cf.CAPACITY),
                          ("DF_FLAG_MASK_GATHER", cf.FLAG_MASK_GATHER), ("DF_FLAG_REFINE", cf.FLAG_REFINE),
                          ("DF_FLAG_ILP", cf.FLAG_ILP), ("DF_FLAG_ASYNC_LOAD", cf.FLAG_ASYNC_LOAD),
                          ("DF_FLAG_WARP_THRESHOLDS", cf.FLAG_WARP_THRESHOLDS),
                          ("DF_FLAG_DEEP_REFINE", cf.FLAG_DEEP_REFINE), ("DF_FLAG_SHARED_BOUNDS", cf.FLAG_SHARED_BOUNDS),
                          ("DF_FLAG_FINITE_WEIGHT", cf.FLAG_FINITE_WEIGHT), ("DF_FLAG_UNCOUNTED", cf.FLAG_UNCOUNTED),
                          ("DF_FLAG_BATCHED_GATHER", cf.FLAG_BATCHED_GATHER), ("DF_FLAG_FUSED_WRITE", cf.FLAG_FUSED_WRITE),
                          ("DF_FLAG_PREFETCH_SLICE", cf.FLAG_PREFETCH_SLICE),
                          ("DF_FLAG_SPARSE_DIGIT", cf.FLAG_SPARSE_DIGIT), ("DF_FLAG_SPLIT_FINAL", cf.FLAG_SPLIT_FINAL)):
        assert re.search(rf"#define {define} {value}\b", text), define
    assert cf.KERNEL_FLAGS == 1832991 and cf.FLAGS_ALL == 2097151 and cf.DEFAULT_FLAGS & ~cf.FLAGS_ALL == 0
    assert not cf.DEFAULT_FLAGS & (cf.FLAG_PERSIST | cf.FLAG_CARRY) and cf.PERSIST_DEFINES == ("DF_PERSIST",)
    assert cf.CARRY_DEFINES == ("DF_PERSIST", "DF_CARRY")
    # (opt-in: not measured)
    assert re.search(r"#ifdef DF_L2_ROWS\n#ifdef DF_L2_FIVE\n#define DF_MIN_BLOCKS 5\n#else\n#define DF_MIN_BLOCKS 4\n", text)
    assert cf.L2_DEFINES == ("DF_L2_ROWS",) and cf.FIVE_DEFINES == ("DF_L2_FIVE",)
    assert re.search(r"#ifdef DF_L2_FIVE .*\n(.*\n){3}#define DF_CAP 1024\n#else\n#define DF_CAP 2048 ", text)
    assert cf.slice_len(129_280) == 16_160 and cf.slice_len(300) == 40 and cf.slice_len(7) == 4


# --------------------------------------------------------------------------- the helpers as host C++
HARNESS = r"""
#include "filter.cu"
using namespace dm;
extern "C" void weights(const float* x, const float* m, unsigned long long* q, long n) {
  for (long i = 0; i < n; ++i) q[i] = df_weight(x[i], m[i]);
}
extern "C" long finite_mismatches(unsigned first, unsigned last, unsigned step, float m) {  // d = x - m over bits
  long bad = 0;                                                                               // first..last (negative)
  for (unsigned long long bits = first; bits <= last; bits += step) {
    const float x = as_float((unsigned)bits) + m;
    bad += df_weight_finite(x, m) != df_weight(x, m) || df_bucket_finite(x, m) != df_bucket(x, m);
  }
  return bad;
}
extern "C" void weights_finite(const float* x, const float* m, unsigned long long* q, unsigned* b, long n) {
  for (long i = 0; i < n; ++i) { q[i] = df_weight_finite(x[i], m[i]); b[i] = df_bucket_finite(x[i], m[i]); }
}
extern "C" void buckets(const float* x, const float* m, unsigned* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = df_bucket(x[i], m[i]);
}
extern "C" void thresholds(float m, const int* b1, const int* b2, float* t1, float* t2, long n) {
  for (long i = 0; i < n; ++i) df_thresholds(m, b1[i], b2[i], t1[i], t2[i]);
}
extern "C" void thresholds16(float m, const int* b, float* t, int* rounds, long n) {  // df_thresholds_warp's rounds
  for (long i = 0; i < n; ++i) {                                                       // (one half-warp, its lanes
    u32 lo = df_fkey(-as_float(0x7f800000u)), hi = df_fkey(m);                         // as a loop)
    rounds[i] = 0;
    while (hi - lo > 1) {
      u32 ok = 0;
      for (u32 j = 0; j < 15; ++j) {
        const u32 probe = df_probe(lo, hi, j);
        if (probe == hi || (i32)df_bucket(df_fkey_value(probe), m) <= b[i]) ok |= 1u << j;
      }
      df_narrow(lo, hi, ok);
      ++rounds[i];
    }
    const float inf = as_float(0x7f800000u);
    t[i] = b[i] < 0 ? inf : ((i32)df_bucket(-inf, m) <= b[i] ? -inf : df_fkey_value(hi));
  }
}
extern "C" void words(const float* x, const long long* index, unsigned long long* w, float* back, long n) {
  for (long i = 0; i < n; ++i) { w[i] = df_word(x[i], index[i]); back[i] = df_word_value(w[i]); }
}
extern "C" void sparse_digits(const unsigned long long* w, unsigned* digit, long n) {  // df_refine's, of one set
  u64 w_or = 0, w_and = ~0ull;
  for (long i = 0; i < n; ++i) { w_or |= w[i]; w_and &= w[i]; }
  const DfPicks picks = df_sparse_picks(w_or ^ w_and);
  for (long i = 0; i < n; ++i) digit[i] = df_sparse_digit(w[i], picks);
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return host_library(tmp_path_factory.mktemp("filter_host"), HARNESS, "filter.cu's helpers")


def ptr(a):
    """The address of ``a``'s data (the caller keeps ``a`` alive during the call)."""
    return ctypes.c_void_p(a.ctypes.data)


def host_weights(lib, x, m):
    x, m = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(np.broadcast_to(m, x.shape), np.float32)
    q = np.zeros(x.shape, np.uint64)
    lib.weights(ptr(x), ptr(m), ptr(q), ctypes.c_long(x.size))
    return q


def all_floats(lo, hi):
    """Every fp32 value in [lo, hi) for lo < hi <= 0 (negative floats: the bits grow with the magnitude)."""
    first = 0x80000000 if hi == 0 else int(np.float32(hi).view(np.uint32))
    return np.arange(first + 1, int(np.float32(lo).view(np.uint32)) + 1, dtype=np.uint32).view(np.float32)


def test_weight_is_the_reference_bit_for_bit(host):
    below = all_floats(-44.0, -22.5)  # every d the kernel skips: the reference's q is 0 there too
    assert below.min() == -44.0 and below.max() < -22.5 and len(below) > 5_000_000
    assert not weight_fixed_point(torch.from_numpy(below), torch.zeros(())).any()
    assert not host_weights(host, below, np.float32(0)).any()
    gen = np.random.default_rng(1)
    d = np.concatenate([all_floats(-22.5, -22.0), -np.logspace(-40, 1.36, 200_000).astype(np.float32),
                        gen.uniform(-23, 0, 2_000_000).astype(np.float32), -np.arange(0, 23, 2**-10, dtype=np.float32)])
    m = gen.choice(np.array([0.0, 1.0, -7.25, 13.5, 3e4, -1e-3], np.float32), len(d))
    x = (m + d).astype(np.float32)  # x - m is then d or a neighbour of it
    want = weight_fixed_point(torch.from_numpy(x), torch.from_numpy(m)).numpy().astype(np.uint64)
    assert np.array_equal(host_weights(host, x, m), want)
    specials = np.array([np.inf, -np.inf, 3.4e38, -3.4e38, 0.0, -0.0, 1e-45, 1.0, -1.0], np.float32)
    xs, ms = np.meshgrid(specials, specials)
    xs, ms = xs.ravel(), ms.ravel()
    keep = (ms >= xs) & ~((ms == -np.inf) & (xs == -np.inf))  # m is a row max (an all -inf row is left alone)
    xs, ms = xs[keep], ms[keep]
    with np.errstate(invalid="ignore", over="ignore"):
        want = weight_fixed_point(torch.from_numpy(xs), torch.from_numpy(ms)).numpy().astype(np.uint64)
    assert np.array_equal(host_weights(host, xs, ms), want)


def test_finite_max_weight_and_bucket_equal_the_general_ones(host):
    """FLAG_FINITE_WEIGHT's df_weight_finite / df_bucket_finite (no select for x == m or d < -22.5)
    against df_weight / df_bucket (themselves the reference, above) for a finite row max: every 7th fp32 d in
    [-24, 0] (~1.5e8 values; every one was compared once, in stop 41: no difference), every d of
    the bands around the cut-offs, the ties of floor's argument and the specials (x = m, -inf, signed zeros)."""
    host.finite_mismatches.restype = ctypes.c_long
    first, last = 0x80000000, int(np.float32(-24.0).view(np.uint32))  # -0.0 .. -24 (bit patterns grow with |d|)
    assert host.finite_mismatches(first, last, 7, ctypes.c_float(0.0)) == 0
    for m in (1.0, -7.25, 13.5, 3e4, -1e-3, 3.4e38, -3.4e38):  # another max: d = RN(x - m), x = RN(d + m)
        assert host.finite_mismatches(first, last, 9973, ctypes.c_float(m)) == 0, m
    for lo, hi in ((-24.0, -22.0), (-1.0, -0.25)):
        bits = all_floats(lo, hi).view(np.uint32)
        assert host.finite_mismatches(int(bits.min()), int(bits.max()), 1, ctypes.c_float(0.0)) == 0, (lo, hi)
    half = (np.arange(-33, 1, dtype=np.float32) - np.float32(0.5)) / np.float32(1.4426950216293334961)  # y near k
    d = np.concatenate([np.nextafter(half, np.float32(-np.inf)), half, np.nextafter(half, np.float32(0))])
    specials = np.array([0.0, -0.0, -np.inf, -3.4e38, -1e-45], np.float32)
    for m in np.array([0.0, -0.0, 2.5, -1e30, 3.4e38, -3.4e38], np.float32):
        with np.errstate(over="ignore"):
            x = np.concatenate([(d[d <= 0] + m).astype(np.float32), m + specials]).astype(np.float32)
        x = x[x <= m]
        ms = np.full(x.shape, m, np.float32)
        q, b = np.zeros(x.shape, np.uint64), np.zeros(x.shape, np.uint32)
        host.weights_finite(ptr(x), ptr(ms), ptr(q), ptr(b), ctypes.c_long(x.size))
        assert np.array_equal(q, host_weights(host, x, ms)) and np.array_equal(b, np_bucket(x, ms)), m


def np_bucket(x, m):
    """filter.cu df_bucket in numpy fp32."""
    x = np.asarray(x, np.float32)
    m = np.broadcast_to(np.asarray(m, np.float32), x.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        e = (m - x).astype(np.float32) * np.float32(64.0)
    b = np.full(x.shape, 2047, np.int64)
    small = e < np.float32(2047.0)
    b[small] = e[small].astype(np.int64)  # e >= 0: the conversion truncates, as the kernel's
    b[x == m] = 0
    return b


def np_words(x, index):
    """filter.cu df_word: the packed (key, index) word with its sign bit flipped, uint64."""
    bits = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
    bits = np.where((bits & 0x7FFFFFFF) == 0, 0, bits)
    ordered = np.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    word = (ordered << 32) | (0x7FFFFFFF - np.asarray(index, np.int64))
    return word.view(np.uint64) ^ np.uint64(1 << 63)


def test_bucket_and_word_helpers(host):
    gen = np.random.default_rng(2)
    x = np.concatenate([gen.normal(0, 3, 100_000), gen.uniform(-40, 5, 50_000), [np.inf, -np.inf, 0.0, -0.0, 5.0, 1e30,
                                                                                 -1e30]]).astype(np.float32)
    for m in (np.float32(5.0), np.float32(np.inf), np.float32(1e30)):
        xs = np.minimum(x, m)
        b, ms = np.zeros(len(xs), np.uint32), np.full(len(xs), m, np.float32)
        host.buckets(ptr(xs), ptr(ms), ptr(b), ctypes.c_long(len(xs)))
        assert np.array_equal(b.astype(np.int64), np_bucket(xs, m))
        order = np.argsort(-xs.astype(np.float64), kind="stable")
        assert (np.diff(b[order].astype(np.int64)) >= 0).all()  # better tokens never in a later bucket
    index = gen.integers(0, 2**31 - 1, len(x))
    w, back, index = np.zeros(len(x), np.uint64), np.zeros(len(x), np.float32), index.astype(np.int64)
    host.words(ptr(x), ptr(index), ptr(w), ptr(back), ctypes.c_long(len(x)))
    assert np.array_equal(w, np_words(x, index))
    assert np.array_equal(back, np.where(x == 0, np.float32(0.0), x))  # -0.0 comes back as +0.0
    pairs = np_words(np.array([1.0, 1.0, -0.0, 0.0, -np.inf, -3.0], np.float32), np.array([3, 4, 9, 2, 0, 0]))
    assert pairs[0] > pairs[1] and pairs[3] > pairs[2] and pairs[5] > pairs[4] > 0  # value desc, then index asc


def test_sparse_digit_is_monotone_and_splits(host):
    """FLAG_SPARSE_DIGIT's digit (df_sparse_picks / df_sparse_digit, host C++) equals the emulation's, never ranks a
    worse word's digit above a better one's, and splits every set (at least two digits: a refinement pass makes
    progress); sets: bf16 ties (two values, many indices), a Gaussian bucket, words differing in 1 to 7 bits only,
    words differing in the index's lowest bit."""
    gen = np.random.default_rng(5)
    index = gen.choice(129_280, 400, replace=False)
    tied = np.where(np.arange(400) % 2 == 0, np.float32(1.4453125), np.float32(1.453125))
    sets = [np_words(tied, index), np_words(gen.uniform(1.44, 1.4556, 400).astype(np.float32), index),
            np_words(np.full(2, np.float32(-3.0)), np.array([6, 7]))]
    base = int(np_words(np.array([2.5], np.float32), np.array([0]))[0])
    for bits in range(1, 8):
        sets.append(np.array([base ^ int(v) << 20 for v in gen.integers(0, 1 << bits, 50)] + [base, base ^ 1 << 20],
                             np.uint64))
    for words in sets:
        words = np.unique(words)
        digit = np.zeros(len(words), np.uint32)
        host.sparse_digits(ptr(words), ptr(digit), ctypes.c_long(len(words)))
        assert np.array_equal(digit.astype(np.int64), sparse_digits(words))
        order = np.argsort(words)  # ascending words: non-decreasing digits
        assert (np.diff(digit[order].astype(np.int64)) >= 0).all()
        assert len(np.unique(digit)) >= 2 and digit.max() < 256
    tied_digits = sparse_digits(np.unique(sets[0]))
    assert np.bincount(tied_digits).max() <= 16  # the ties spread over the index's high bits
    window = np.unique(np.array([base ^ int(v) << 20 for v in gen.integers(0, 256, 300)] + [base, base ^ 255 << 20],
                                np.uint64))  # 8 adjacent differing bits: df_refine's contiguous digit, the same
    assert np.array_equal(sparse_digits(window), ((window >> np.uint64(20)) & np.uint64(255)).astype(np.int64))


def test_thresholds_decide_exactly_as_the_bucket(host):
    """df_thresholds (the gather's two fp32 compares) against df_bucket itself: for every bound b and row max m, the
    tokens x <= m with bucket(x) <= b are exactly those with x >= t, on Gaussian values, the 64 floats on either side
    of each threshold, signed zeros, -inf and m."""
    gen = np.random.default_rng(5)
    base = np.concatenate([gen.normal(0, 3, 20_000), gen.uniform(-60, 8, 5_000), [-np.inf, 0.0, -0.0, -1e30]])
    host.thresholds.argtypes = [ctypes.c_float] + [ctypes.c_void_p] * 4 + [ctypes.c_long]
    bounds = np.array([-1, 0, 1, 2, 63, 64, 500, 1023, 2045, 2046, 2047, 2048], np.int32)
    for m in (np.float32(4.25), np.float32(0.0), np.float32(-7.3), np.float32(1e30), np.float32(np.inf),
              np.float32(0.015625)):
        b1, b2 = bounds, bounds[::-1].copy()
        t1, t2 = np.zeros(len(bounds), np.float32), np.zeros(len(bounds), np.float32)
        host.thresholds(m, ptr(b1), ptr(b2), ptr(t1), ptr(t2), ctypes.c_long(len(bounds)))
        near = [np.float32(t).view(np.uint32).astype(np.int64) for t in np.concatenate([t1, t2]) if np.isfinite(t)]
        steps = np.arange(-64, 65)
        keys = np.concatenate([(k + steps) % 2**32 for k in near] + [steps[:0]]).astype(np.uint32).view(np.float32)
        x = np.concatenate([base.astype(np.float32), keys[np.isfinite(keys)], [m]]).astype(np.float32)
        x = x[x <= m]
        bx, ms = np.zeros(len(x), np.uint32), np.full(len(x), m, np.float32)
        host.buckets(ptr(x), ptr(ms), ptr(bx), ctypes.c_long(len(x)))
        for b, t in list(zip(b1, t1)) + list(zip(b2, t2)):
            if b >= 0:  # (b < 0 gives +inf; the gather never compares with it: `bounded` is false then)
                assert np.array_equal(bx.astype(np.int64) <= b, x >= t), (m, b, t)
        assert t1[0] == np.inf and t1[-1] == t1[-2] == -np.inf  # b < 0: nothing; b >= 2047: everything


def test_sixteen_way_threshold_rounds_equal_the_binary_search(host):
    """df_thresholds_warp (DF_FLAG_WARP_THRESHOLDS): its rounds (df_probe / df_narrow, the lanes of a half-warp as a
    loop) end at df_thresholds' threshold for every bound and row max, in at most 9 rounds instead of 32."""
    host.thresholds.argtypes = [ctypes.c_float] + [ctypes.c_void_p] * 4 + [ctypes.c_long]
    host.thresholds16.argtypes = [ctypes.c_float] + [ctypes.c_void_p] * 3 + [ctypes.c_long]
    gen = np.random.default_rng(8)
    bounds = np.concatenate([np.arange(-1, 2050), gen.integers(0, 2048, 200)]).astype(np.int32)
    maxima = [4.25, 0.0, -0.0, -7.3, 1e30, -1e30, np.inf, 0.015625, 3e-39, -3e-39, 1e-45, 16777216.0, 1024.5]
    maxima += list(gen.normal(0, 10, 40)) + list(gen.uniform(-1e6, 1e6, 10))
    worst = 0
    for m in np.array(maxima, np.float32):
        binary, unused, warp = (np.zeros(len(bounds), np.float32) for _ in range(3))
        rounds = np.zeros(len(bounds), np.int32)
        host.thresholds(m, ptr(bounds), ptr(bounds), ptr(binary), ptr(unused), ctypes.c_long(len(bounds)))
        host.thresholds16(m, ptr(bounds), ptr(warp), ptr(rounds), ctypes.c_long(len(bounds)))
        assert np.array_equal(binary.view(np.uint32), warp.view(np.uint32)), m
        worst = max(worst, int(rounds.max()))
    assert 1 <= worst <= 9


# --------------------------------------------------------------------------- the search, emulated
def sparse_digits(cand):
    """FLAG_SPARSE_DIGIT's digits of the candidate words ``cand`` (uint64): their bits at the 8 highest bits where
    they differ, the highest first, then zeros where fewer than 8 differ (filter.cu df_sparse_picks / df_sparse_digit:
    bit 31, 0 in every word)."""
    diff = int(np.bitwise_or.reduce(cand)) ^ int(np.bitwise_and.reduce(cand))
    picks = []
    while diff and len(picks) < 8:
        picks.append(diff.bit_length() - 1)
        diff ^= 1 << picks[-1]
    digit = np.zeros(len(cand), np.int64)
    for b in picks:
        digit = (digit << 1) | ((cand >> np.uint64(b)) & np.uint64(1)).astype(np.int64)
    return digit << (8 - len(picks))


def emulate(logits, k, p, capacity=CAPACITY, stats=None, paths=None, refine=True, small=256, refined=None,
            cluster=cf.CLUSTER, small_p=None, sparse=False, ranked=None):
    """filter.cu's decisions for ``logits [B, V]`` fp32 (CPU tensor), per-row ``k`` int64 and ``p`` fp32; returns
    the filtered rows. Mirrors dm_filter step by step (module doc of filter.cu); ``stats`` collects the searches
    that narrowed, ``paths`` the rows that took top-k + top-p's prefix path. ``refine`` (DF_FLAG_REFINE): a
    search's gathered bucket of more than ``small`` (DF_SMALL) tokens is narrowed by df_refine's digit passes
    (``refined`` collects the passes per search, ``ranked`` the candidates left to rank); ``small_p``
    (FLAG_DEEP_REFINE: 32) that limit for the search by mass (top-p's), ``small`` for the others; ``sparse``
    (FLAG_SPARSE_DIGIT): each pass's digit from the 8 highest bits where the candidates differ. ``cluster`` 4 to 7: the -DDF_C=N builds (FLAG_L2_CLUSTER4,
    FLAG_L2_FIT), whose bucket location selects the block, then a pair of adjacent buckets (one per thread), then the
    bucket of the pair; with 5 to 7 blocks the last block's range of 512 runs past the 2,048 buckets (empty ones)."""
    out = logits.clone()
    rows, vocab = logits.shape
    width = cf.slice_len(vocab, cluster)
    for row in range(rows):
        x = logits[row].numpy()
        kr, pr = int(k[row]), np.float32(p[row])
        use_k, use_p = 0 < kr < vocab, bool(pr < 1)
        if np.isnan(x).any() or not (use_k or use_p):
            continue
        m = np.float32(x.max())
        if m == -np.inf:
            continue
        index = np.arange(vocab)
        bucket = np_bucket(x, m)
        word = np_words(x, index)
        with np.errstate(invalid="ignore", over="ignore"):
            q = weight_fixed_point(torch.from_numpy(x), torch.tensor(m)).numpy().astype(np.uint64)
        qm = q if use_p else np.zeros(vocab, np.uint64)
        for r in range(cluster):  # each block's two-word bins: count < 2^16 and mass < 2^48 (no field overflows)
            part = slice(r * width, min((r + 1) * width, vocab))
            if part.start < vocab:
                per = np.zeros(cf.BUCKETS, np.uint64)
                np.add.at(per, bucket[part], qm[part])
                assert np.bincount(bucket[part]).max() < 2**16 and per.max() < 2**48
        cnt = np.bincount(bucket, minlength=cf.BUCKETS).astype(np.int64)

        def select(cnts, masses, by_mass, target, base_cnt, base_mass):
            c, s = np.cumsum(cnts).astype(np.int64), np.cumsum(masses.astype(np.uint64))
            before = (base_mass + s - masses) if by_mass else (base_cnt + c - cnts)
            upto = (base_mass + s) if by_mass else (base_cnt + c)
            hit = np.nonzero((before < target) & (target <= upto))[0]
            assert len(hit) == 1, (target, hit)
            j = int(hit[0])
            return j, int(cnts[j]), base_cnt + int(c[j] - cnts[j]), base_mass + int(s[j] - masses[j])

        def search(by_mass, target, masses):
            qv = qm if masses else np.zeros(vocab, np.uint64)
            mass_b = np.zeros(cf.BUCKETS, np.uint64)
            np.add.at(mass_b, bucket, qv)
            per = -(-cf.BUCKETS // (cluster * cf.THREADS))  # buckets per thread (DF_PER): 1 (8 blocks) or 2 (4-7)
            ranges = per * cf.THREADS  # per block (DF_RANGE): with 5-7 blocks the last ranges run past the last bucket
            pad = cluster * ranges - cf.BUCKETS  # (... as empty buckets: df_histogram leaves them 0)
            cnt_p = np.concatenate([cnt, np.zeros(pad, cnt.dtype)])
            mass_p = np.concatenate([mass_b, np.zeros(pad, mass_b.dtype)])
            r, _, base_cnt, base_mass = select(cnt_p.reshape(cluster, ranges).sum(1),
                                               mass_p.reshape(cluster, ranges).sum(1), by_mass, target, 0, 0)
            c_r, m_r = cnt_p[r * ranges:(r + 1) * ranges], mass_p[r * ranges:(r + 1) * ranges]
            g, count, base_cnt, base_mass = select(c_r.reshape(-1, per).sum(1), m_r.reshape(-1, per).sum(1), by_mass,
                                                   target, base_cnt, base_mass)
            j = g
            if per > 1:  # the bucket within the selected thread's group, its base moved to the group's start
                e, count, base_cnt, base_mass = select(c_r[per * g:per * g + per], m_r[per * g:per * g + per],
                                                       by_mass, target, base_cnt, base_mass)
                j = per * g + e
            b = r * ranges + j
            shift, prefix = 64, 0
            member = bucket == b
            if count > capacity and stats is not None:
                stats.append(row)
            while count > capacity:
                shift -= 8
                digit = ((word >> np.uint64(shift)) & np.uint64(255)).astype(np.int64)
                dig_cnt = np.bincount(255 - digit[member], minlength=256)  # descending digits: better first
                dig_mass = np.zeros(256, np.uint64)
                np.add.at(dig_mass, 255 - digit[member], qv[member])
                t, count, base_cnt, base_mass = select(dig_cnt, dig_mass, by_mass, target, base_cnt, base_mass)
                prefix = (prefix << 8) | (255 - t)
                member = member & (digit == 255 - t)
            cand, qc = word[member], qv[member]
            assert len(cand) == count
            passes = 0
            limit = small_p if by_mass and small_p is not None else small
            while refine and count > limit:  # df_refine: the digit below the top bit where the words differ
                diff = int(np.bitwise_or.reduce(cand)) ^ int(np.bitwise_and.reduce(cand))
                shift = max(diff.bit_length() - 1 - 7, 0)
                # (SPARSE_DIGIT: the kernel keeps the contiguous digit where its picks span 8 adjacent positions,
                # padding bit 31 included, as df_refine's `sparse` test does)
                picks = [b for b in range(63, -1, -1) if diff >> b & 1][:8]
                picks += [31] * (8 - len(picks))
                digit = (sparse_digits(cand) if sparse and picks[0] - picks[7] != 7
                         else ((cand >> np.uint64(shift)) & np.uint64(255)).astype(np.int64))
                dig_cnt = np.bincount(255 - digit, minlength=256)
                dig_mass = np.zeros(256, np.uint64)
                np.add.at(dig_mass, 255 - digit, qc)
                t, count, base_cnt, base_mass = select(dig_cnt, dig_mass, by_mass, target, base_cnt, base_mass)
                keep = digit == 255 - t
                cand, qc = cand[keep], qc[keep]
                assert len(cand) == count and 0 < count
                passes += 1
            if refined is not None:
                refined.append(passes)
            if ranked is not None:
                ranked.append(count)
            order = np.argsort(cand)[::-1]  # descending words (unique: the index is in them)
            cand, qc = cand[order], qc[order]
            incl = np.cumsum(qc)
            if not by_mass:
                i = target - base_cnt - 1
                return int(cand[i]), base_mass + int(incl[i])
            hit = np.nonzero((base_mass + incl - qc < target) & (target <= base_mass + incl))[0]
            assert len(hit) == 1
            return int(cand[hit[0]]), base_mass + int(incl[hit[0]])

        cut, total = 0, int(qm.sum())
        if use_k and use_p:  # the prefix path: every token of the buckets up to the k-th's fits in one gather
            ranges = cf.BUCKETS // cf.CLUSTER
            zero = np.zeros(cf.BUCKETS, np.uint64)
            r, _, base_cnt, _ = select(cnt.reshape(cf.CLUSTER, ranges).sum(1), zero[:cf.CLUSTER], False, kr, 0, 0)
            j, count, base_cnt, _ = select(cnt[r * ranges:(r + 1) * ranges], zero[:ranges], False, kr, base_cnt, 0)
            if base_cnt + count <= capacity:
                member = bucket <= r * ranges + j
                order = np.argsort(word[member])[::-1]
                cand, incl = word[member][order], np.cumsum(q[member][order])
                assert len(cand) == base_cnt + count
                target = int(np.ceil(float(max(pr, np.float32(0))) * float(incl[kr - 1])))
                i = 0 if target == 0 else int(np.nonzero(incl >= target)[0][0])
                assert i <= kr - 1
                if paths is not None:
                    paths.append("prefix")
                out[row] = torch.where(torch.from_numpy(word >= cand[i]), logits[row], NEG_INF)
                continue
        if use_k:
            cut, total = search(False, kr, use_p)
        if use_p:
            limit = float(max(pr, np.float32(0))) * float(total)
            target = int(np.ceil(limit))
            found, _ = search(False, 1, False) if target == 0 else search(True, target, True)
            cut = max(cut, found)
        keep = word >= np.uint64(cut)
        out[row] = torch.where(torch.from_numpy(keep), logits[row], NEG_INF)
    return out


def reference(logits, k, p):
    keep = top_k_top_p_reference(logits, k, p)
    return torch.where(keep, logits, torch.full((), NEG_INF))


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("cluster", [8, 7, 6, 5, 4])
@pytest.mark.parametrize("capacity", [CAPACITY, 16, 1])
@pytest.mark.parametrize("refine", [(False, 256), (True, 256), (True, 2), (True, 256, 32), (True, 2, None, True)],
                         ids=["bitonic", "refine", "refine-2", "refine-deep", "refine-2-sparse"])
def test_emulated_search_on_hard_rows(capacity, refine, cluster):
    """The ten edge rows of the Triton filter's tests (ties, huge and -inf logits, NaN, p = 0 and below resolution,
    signed zeros), with capacity 2,048 (the kernel's), 16 and 1 (every search narrows to a single word); without
    df_refine, with it, and with it down to 2 candidates (refinement passes in almost every search); clusters of 8
    blocks and of 4 to 7 (the L2-row builds of FLAG_L2_CLUSTER4 / FLAG_L2_FIT: two buckets per thread in the bucket
    location, and with 5-7 blocks ranges past the last bucket)."""
    refined = []
    for vocab, seed in ((777, 0), (1001, 1), (4099, 2)):
        x, k, p = hard_rows(vocab, seed)
        stats, paths = [], []
        assert_same(emulate(x, k, p, capacity, stats, paths, refine[0], refine[1], refined, cluster, *refine[2:]),
                    reference(x, k, p))
        if capacity == 1:
            assert len(stats) >= 6 and not paths  # every k + p row takes the mass histogram after all
        if capacity == CAPACITY:
            assert 2 <= len(paths) < int(((k > 0) & (k < vocab) & (p < 1)).sum())  # row 3's top-k does not fit
    if refine[:2] == (True, 2) and capacity == CAPACITY:
        assert sum(refined) >= 3, refined


def test_emulated_search_on_the_bench_inputs_at_full_vocab():
    """Gaussian N(0, 2^2), peaked (LLM-like) and bf16-rounded rows of V = 129,280, top-k 50 with top-p 0.9, top-p
    0.9 alone, and a spread of p; no search of these narrows at the kernel's capacity."""
    from dspark_markov.bench.verify_grid import filter_logits

    gen = torch.Generator().manual_seed(3)
    gaussian = torch.randn(4, 129_280, generator=gen) * 2
    for kind in ("gaussian", "peaked", "bf16"):
        x = filter_logits(kind, gaussian, gen)
        for k, p in ((50, 0.9), (0, 0.9), (0, 0.5), (1000, 0.99), (0, 0.999), (50, 0.0)):
            stats, paths, refined = [], [], []
            kk, pp = torch.full((4,), k, dtype=torch.int64), torch.full((4,), p)
            assert_same(emulate(x, kk, pp, stats=stats, paths=paths, refined=refined), reference(x, kk, pp))
            assert not stats, (kind, k, p)
            if (kind, k, p) == ("gaussian", 0, 0.9):  # the bench's p-alone bucket (~300-1,000 tokens) is refined
                assert refined and min(refined) >= 1, refined
            if k == 0 and p in (0.9, 0.5):  # FLAG_DEEP_REFINE: top-p's candidates refined down to 32
                deep = []
                assert_same(emulate(x, kk, pp, refined=deep, small_p=32), reference(x, kk, pp))
                assert max(deep) <= 3 and (kind != "gaussian" or min(deep) >= 1), (kind, p, deep)
            if k == 0 and p == 0.9:  # FLAG_SPARSE_DIGIT: a refined bucket of bf16 ties leaves a few to rank
                plain, sparse, passes = [], [], []
                emulate(x, kk, pp, ranked=plain)
                assert_same(emulate(x, kk, pp, ranked=sparse, refined=passes, sparse=True), reference(x, kk, pp))
                assert all(n <= 16 for n, r in zip(sparse, passes) if r), (kind, sparse, passes)
                assert kind != "bf16" or min(plain) >= 100, plain  # (without it: one value's ~150 ties)
            assert len(paths) == (4 if k > 0 else 0), (kind, k, p, paths)  # k and p: the prefix path


def test_emulated_search_on_flat_and_tied_rows():
    """Rows whose target bucket holds more than the capacity: all equal, two values, a narrow Gaussian, bf16 ties of
    a narrow Gaussian; k and p across them; the narrowing passes resolve by index within ties."""
    gen = torch.Generator().manual_seed(4)
    vocab = 20_000
    rows = torch.stack([torch.zeros(vocab), torch.randint(0, 2, (vocab,), generator=gen).float(),
                        torch.randn(vocab, generator=gen) * 0.01,
                        (torch.randn(vocab, generator=gen) * 0.05).to(torch.bfloat16).float(),
                        torch.full((vocab,), -3.5)])
    for k, p in ((0, 0.5), (7000, 1.0), (12345, 0.3), (0, 1e-9), (3, 0.999), (0, 0.0)):
        for refine, sparse in ((False, False), (True, False), (True, True)):
            stats = []
            kk, pp = torch.full((5,), k, dtype=torch.int64), torch.full((5,), p)
            assert_same(emulate(rows, kk, pp, stats=stats, refine=refine, sparse=sparse), reference(rows, kk, pp))
            assert stats, (k, p)


def extreme_rows(vocab, seed=0):
    """Ten rows of extreme keys (the audit of the Triton filter's int32 key spans, commit be8891f, carried over to
    filter.cu): uniform in [-2, 2] (ordered int32 keys spanning more than 2^31), with +inf ties (a +inf max: every
    finite token in the open bucket 2,047), one +inf among -inf, signed zeros with +-1e-45, subnormal and tiny normal
    values, a single finite token among -inf, [-80, 0] (most masses 0, a wide open bucket), a tie of ~all tokens at
    -40 in the open bucket, +-3e38 (x - max overflows), a Gaussian with a 1e9 logit. CPU, fp32 [10, vocab]; also the
    rows of tests/gpu/test_cuda_filtering_extreme_gpu.py."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(lo, hi):
        return torch.rand(vocab, generator=gen) * (hi - lo) + lo

    rows = [uniform(-2.0, 2.0)]
    row = uniform(-2.0, 2.0)
    row[::97] = float("inf")
    rows.append(row)
    row = uniform(-2.0, 2.0)
    row[::5] = NEG_INF
    row[3] = float("inf")
    rows.append(row)
    row = torch.zeros(vocab)
    row[1::2] = -0.0
    row[::7] = 1e-45
    row[::11] = -1e-45
    rows.append(row)
    rows.append(uniform(-1e-38, 1e-38))
    row = torch.full((vocab,), NEG_INF)
    row[vocab // 3] = 0.5
    rows.append(row)
    rows.append(uniform(-80.0, 0.0))
    row = torch.full((vocab,), -40.0)
    head = min(3000, vocab // 2)
    row[:head] = uniform(-40.0, 0.0)[:head]
    rows.append(row)
    rows.append(uniform(-3e38, 3e38))
    row = torch.randn(vocab, generator=gen) * 2
    row[vocab - 1] = 1e9
    rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("vocab", [1001, 4099])
def test_emulated_search_on_extreme_key_rows(vocab):
    """filter.cu's decisions (emulated) on the extreme-key rows equal the sort reference: candidate sets spanning the
    whole key range, infinities, signed zeros, subnormals, k at 1 / V - 1 / V, p at 0 / 1e-45 / one ulp below 1; the
    kernel's capacity and capacity 16 (every search narrows), with and without df_refine, clusters of 8 and 5."""
    x = extreme_rows(vocab)
    rows = x.shape[0]
    below_one = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    cases = [(0, 0.9), (0, below_one), (0, 1e-45), (0, 0.0), (1, 1.0), (vocab - 1, 1.0), (vocab, 0.5),
             (vocab // 2, 0.999), (vocab // 3, below_one), (50, 0.9), (vocab - 1, below_one), (1, 0.0)]
    for k, p in cases:
        kk, pp = torch.full((rows,), k, dtype=torch.int64), torch.full((rows,), p, dtype=torch.float32)
        expected = reference(x, kk, pp)
        for capacity in (CAPACITY, 16):
            for refine in (False, True):
                for cluster in (8, 5):
                    got = emulate(x, kk, pp, capacity, refine=refine, cluster=cluster)
                    assert (got.view(torch.int32) == expected.view(torch.int32)).all(), (k, p, capacity, refine)


# --------------------------------------------------------------------------- gate, registry, checks
def test_runs_only_on_cuda_and_auto_picks_it_for_one_wave(monkeypatch):
    from dspark_markov import cuda

    assert registry.resolve("top_k_top_p", "cuda", "cuda") == "cuda"
    with pytest.raises(ValueError, match="impl"):
        dm.top_k_top_p(torch.randn(2, 300), 5, 0.9, impl="cuda")  # CPU tensors
    with pytest.raises(ValueError, match="device"):
        cf.CudaTopKTopPFilter(2, 300, "cpu")
    assert not cf.auto_picks(torch.randn(2, 300), None)  # a CPU tensor: the reference
    monkeypatch.setattr(cuda, "availability", lambda *args, **kwargs: None)  # as if on an H200: only the checks
    for rows, vocab, name in ((0, 300, "max_rows"), (2, 0, "vocab"), (2, 8 * cf.MAX_SLICE + 1, "vocab"),
                              (True, 300, "max_rows")):
        with pytest.raises(ValueError, match=name):
            cf.CudaTopKTopPFilter(rows, vocab, "cuda")
    for flags in (cf.FLAGS_ALL + 1, -1, True, 3.0, cf.FLAG_L2_CLUSTER4, cf.FLAG_L2_CLUSTER4 | cf.KERNEL_FLAGS,
                  cf.FLAG_CARRY, cf.FLAG_CARRY | cf.KERNEL_FLAGS | cf.FLAG_L2_ROWS, cf.FLAG_L2_FIT,
                  cf.FLAG_L2_FIT | cf.KERNEL_FLAGS, cf.FLAG_L2_FIT | cf.FLAG_L2_ROWS | cf.FLAG_L2_CLUSTER4,
                  cf.FLAG_L2_FIT | cf.FLAG_L2_ROWS | cf.FLAG_PERSIST, cf.FLAG_L2_FIVE, cf.FLAG_L2_FIVE | 31,
                  cf.FLAG_L2_FIVE | cf.FLAG_L2_ROWS | cf.FLAG_PERSIST, cf.FLAG_L2_FIVE | cf.FLAG_L2_ROWS | cf.FLAG_L2_CLUSTER4,
                  cf.FLAG_SPECIALIZE | cf.FLAG_L2_ROWS | cf.FLAG_PERSIST, cf.FLAG_SPECIALIZE | cf.FLAG_L2_ROWS | cf.FLAG_L2_FIVE,
                  cf.FLAG_SPECIALIZE | cf.FLAG_PERSIST, cf.FLAG_SPARSE_DIGIT | 31,  # (SPARSE_DIGIT, SPLIT_FINAL:
                  (cf.DEFAULT_FLAGS & ~cf.FLAG_SPECIALIZE) | cf.FLAG_SPARSE_DIGIT,  # specialized builds only)
                  cf.FLAG_SPLIT_FINAL | 31, (cf.DEFAULT_FLAGS & ~cf.FLAG_SPECIALIZE) | cf.FLAG_SPLIT_FINAL):
        with pytest.raises(ValueError, match="flags"):
            cf.CudaTopKTopPFilter(2, 300, "cuda", flags=flags)

    class Meta:  # a [rows, V] CUDA tensor's shape, dtype, strides and device, nothing allocated
        def __init__(self, rows, vocab, dtype=torch.float32, last_stride=1):
            self.shape, self.device, self.dtype = (rows, vocab), torch.device("cuda", 0), dtype
            self.last_stride = last_stride

        def dim(self):
            return 2

        def stride(self, dim):
            return self.last_stride

    from dspark_markov.verify import filtering

    monkeypatch.setattr(torch, "Tensor", Meta)  # (auto_picks checks isinstance(logits, torch.Tensor))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(cf, "_RUNS_ON", {0: True})
    assert cf.auto_picks(Meta(cf.AUTO_MAX_ROWS, 129_280), None, 50) and cf.auto_picks(Meta(6, 300), None, 50)
    assert filtering._auto_impl("auto", Meta(6, 300), None, 50) == "cuda"  # top_k_top_p's routing
    assert filtering._auto_impl("triton", Meta(6, 300), None, 50) == "triton"  # an explicit impl is kept
    over = cf.AUTO_MAX_ROWS + 1
    assert filtering._auto_impl("auto", Meta(over, 300), None, 50) == "auto"  # (registry.resolve: the Triton filter)
    assert not cf.auto_picks(Meta(over, 129_280), None, 50)  # top-k on, beyond: the Triton filter
    assert not cf.auto_picks(Meta(over, 129_280), None, torch.zeros(1))  # a per-row k counts as on
    assert cf.auto_picks(Meta(1518, 129_280), 0.7, 50)  # raw logits with a temperature: only this filter divides them
    assert cf.AUTO_MAX_ROWS_P_ALONE is None  # top-p alone: measured faster at every batch
    for off in (None, 0, -3, 129_280, 10**9):  # top-k absent or disabled: top-p alone
        assert cf.auto_picks(Meta(1518, 129_280), None, off)
    assert filtering._auto_impl("auto", Meta(1518, 300), None) == "cuda"
    assert filtering._auto_impl("auto", Meta(1518, 300), None, 50) == "auto"
    assert not cf.auto_picks(Meta(over, 129_280), None, "5")  # not an int: top-k on (the checks then raise)
    monkeypatch.setattr(cf, "AUTO_MAX_ROWS_P_ALONE", 2000)  # a bound, when one is set
    assert cf.auto_picks(Meta(2000, 129_280), None) and not cf.auto_picks(Meta(2001, 129_280), None)
    monkeypatch.setattr(cf, "AUTO_MAX_ROWS_P_ALONE", None)
    assert not cf.auto_picks(Meta(6, 8 * cf.MAX_SLICE + 1), 0.7)  # a row too large for a cluster
    assert cf.auto_picks(Meta(6, 50_257), None)  # a ragged last slice (run on the H100: every option exact)
    assert not cf.auto_picks(Meta(6, 300, torch.bfloat16), None)  # the checks' ValueError, not a compile first
    assert not cf.auto_picks(Meta(6, 300, last_stride=2), None)
    # under graph capture: only a filter already built for this shape (no build, load or allocation in a capture)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(cf, "_FILTERS", {})
    assert not cf.auto_picks(Meta(6, 300), None)
    built = type("Built", (), {"max_rows": 4})()
    cf._FILTERS[(torch.device("cuda", 0), 300)] = built
    assert cf.auto_picks(Meta(4, 300), None) and not cf.auto_picks(Meta(5, 300), None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(cf, "_RUNS_ON", {0: False})  # no sm_90 / NVRTC: never
    assert not cf.auto_picks(Meta(6, 129_280), 0.7)

    def broken():
        raise PermissionError("cache file")

    monkeypatch.setattr(cf, "_RUNS_ON", {})
    monkeypatch.setattr(cf, "unavailable_reason", broken)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    assert not cf.auto_picks(Meta(6, 129_280), None) and cf._RUNS_ON == {}  # the Triton filter; asked again later
    monkeypatch.setattr(cf, "unavailable_reason", lambda: None)
    assert cf.auto_picks(Meta(6, 129_280), None) and cf._RUNS_ON == {0: True}


def test_resident_clusters_from_the_driver_or_none():
    """FLAG_PERSIST's grid: the driver's cuOccupancyMaxActiveClusters, else (it fails, or answers 0) None, one cluster
    per row (a count that ignores how clusters pack into GPCs would leave clusters waiting for a whole share of rows)."""

    class Loaded:
        def __init__(self, answer, per_sm):
            self.answer, self.asked = answer, []

        def max_active_clusters(self, name, cluster, threads, smem):
            self.asked.append((name, cluster, threads, smem))
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    driver = Loaded(30, 2)
    assert cf.resident_clusters(driver, 8, 64_640) == 30
    assert driver.asked == [("dm_filter", 8, cf.THREADS, 64_640)]
    assert cf.resident_clusters(Loaded(build.BuildError("no cuOccupancyMaxActiveClusters"), 4), 8, 0) is None
    assert cf.resident_clusters(Loaded(AttributeError("cuOccupancyMaxActiveClusters"), 4), 8, 0) is None
    assert cf.resident_clusters(Loaded(0, 4), 4, cf.L2_C4_SMEM) is None


def test_launch_config_struct_is_the_drivers():
    """The ctypes CUlaunchConfig of cuOccupancyMaxActiveClusters: seven 32-bit fields, the stream and attribute
    pointers at 8-byte alignment, the attribute count (56 bytes on a 64-bit host, as cuda.h's struct)."""
    fields = [name for name, _ in build._LaunchConfig._fields_]
    assert fields == ["gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes",
                      "hStream", "attrs", "numAttrs"]
    assert build._LaunchConfig.hStream.offset == 32 and build._LaunchConfig.numAttrs.offset == 48
    assert ctypes.sizeof(build._LaunchConfig) == 56


def test_overlap_of_logits_and_out():
    x = torch.zeros(4, 300)
    assert spans_overlap(x, x) and spans_overlap(x, x[1:]) and spans_overlap(x[:, 5:], x[:, :5])
    assert not spans_overlap(x[:2], x[2:]) and not spans_overlap(x, torch.zeros(4, 300))
    assert not spans_overlap(x[:0], x)


def test_raw_logits_with_temperature_equal_the_filter_of_the_divided_rows():
    """top_k_top_p(raw, k, p, temperature=T): the reference divides first (x / T, T = 0 unscaled) and filters; the
    result is the filter of scaled_logits(raw, T), in and out of place, scalar and per-row T (the CUDA filter, which
    divides as it loads, is compared with this on the H200). The Triton filter refuses it (ValueError)."""
    from dspark_markov.draft.reference import scaled_logits

    x, k, p = hard_rows(1001, 3)
    temp = torch.tensor([0.6, 0.0, 1.0, 2.5, 0.7, 0.3, 1.3, 0.0, 0.9, 1.7])
    expected = reference(scaled_logits(x, temp), k, p)
    assert_same(dm.top_k_top_p(x.clone(), k, p, impl="reference", temperature=temp), expected)
    out = torch.full_like(x, 5.0)
    assert_same(dm.top_k_top_p(x, k, p, impl="reference", out=out, temperature=temp), expected)
    assert_same(out, expected)
    ones = torch.full((10,), 0.7)
    assert_same(dm.top_k_top_p(x.clone(), None, None, impl="reference", temperature=0.7), scaled_logits(x, ones))
    assert_same(dm.top_k_top_p(x.clone(), 50, 0.9, impl="reference", temperature=0.7),
                reference(scaled_logits(x, ones), torch.full((10,), 50), torch.full((10,), 0.9)))
    with pytest.raises(ValueError, match="temperature"):
        dm.top_k_top_p(x.clone(), k, p, impl="triton", temperature=temp)
    for bad in (-1.0, float("nan"), torch.ones(3), torch.ones(10, dtype=torch.float64), "hot"):
        with pytest.raises(ValueError, match="temperature"):
            dm.top_k_top_p(x.clone(), k, p, impl="reference", temperature=bad)


@pytest.mark.parametrize("flags", [cf.DEFAULT_FLAGS | cf.FLAG_SPECIALIZE, 127 | cf.FLAG_SPECIALIZE,
                                   cf.DEFAULT_FLAGS & ~(cf.FLAG_SPECIALIZE | cf.FIXED_ONLY_FLAGS)])
def test_specialized_builds_are_launched_with_the_flags_compiled_into_them(monkeypatch, flags):
    """FLAG_SPECIALIZE: every build the filter loads (resident, L2-row, each FLAG_L2_FIT size, force_cluster's, the
    4-block build of 127) was compiled with -DDF_FIXED_FLAGS equal to the FilterArgs.flags of each of its launches
    (a kernel built for other flags would silently run other options); without it no build is specialized. The
    constructor runs with recording loaders and an H100's resident cluster counts (no GPU)."""
    from dspark_markov import cuda

    launches = []

    class Build:
        def __init__(self, l2, cluster, fixed):
            self.l2, self.cluster, self.fixed = l2, cluster, fixed

        def launch(self, name, grid, threads, smem, stream, params):
            launches.append((self, grid, params[0].flags))

    monkeypatch.setattr(cuda, "availability", lambda *args, **kwargs: None)
    monkeypatch.setattr(cf, "filter_kernels", lambda index, l2_rows=False, cluster=8, persist=False, carry=False,
                        five=False, fixed=None: Build(l2_rows, cluster if l2_rows else 8, fixed))
    monkeypatch.setattr(cf, "resident_clusters", lambda kernels, cluster, smem: {8: 62, 7: 69, 6: 79, 5: 94, 4: 124}[cluster])
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *args, device=None, **kwargs: zeros(*args, **kwargs))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    monkeypatch.setattr(cf, "L2_MIN_ROWS", 5)
    filt = cf.CudaTopKTopPFilter(100, 1001, "cuda:0", flags=flags)
    filt.device = torch.device("cpu")  # (CPU tensors below)
    padded = torch.zeros(100, 1004)[:, :1001]  # 16-byte aligned rows: top-p alone takes the L2-row build
    for rows in (6, 66, 80, 100):  # FLAG_L2_FIT: 8 / 7 / 5 / 8 blocks per row
        filt.filter(padded[:rows], None, 0.9, padded[:rows])
        filt.filter(padded[:rows], 50, 0.9, padded[:rows])  # top-k on: the resident build
    if flags & cf.FLAG_L2_FIT:
        filt.force_cluster(6)
        filt.filter(padded[:90], None, 0.9, padded[:90])
    special = bool(flags & cf.FLAG_SPECIALIZE)
    assert {(b.l2, b.cluster) for b, _, _ in launches} == (
        {(False, 8), (True, 4)} if flags & cf.FLAG_L2_CLUSTER4 else {(False, 8), (True, 8), (True, 7), (True, 5), (True, 6)})
    for build_, grid, launched in launches:
        assert launched == (flags & (cf.L2_KERNEL_FLAGS if build_.l2 else cf.RESIDENT_KERNEL_FLAGS))
        assert build_.fixed == (launched if special else None)


def test_launch_arguments(monkeypatch):
    """filter() builds the kernel's argument struct from scalars and per-row tensors (CPU tensors and a recording
    launcher stand in for the GPU): one launch of rows x 8 blocks, the slice's shared memory, every field."""
    launches = []

    class Recorder:
        def launch(self, name, grid, threads, smem, stream, params):
            launches.append((name, grid, threads, smem, params[0]))

    filt = cf.CudaTopKTopPFilter.__new__(cf.CudaTopKTopPFilter)
    filt.max_rows, filt.vocab, filt.device, filt.flags = 6, 1001, torch.device("cpu"), cf.FLAG_REFINE
    filt.slice, filt.smem, filt.kernels = cf.slice_len(1001), cf.smem_bytes(1001), Recorder()
    filt.l2_kernels, filt.l2_cluster, filt.l2_slice, filt.l2_smem = None, 8, cf.slice_len(1001), 0
    filt.clusters = filt.l2_clusters = None  # (FLAG_PERSIST off: a cluster per row)
    filt.l2_fits = {}  # (FLAG_L2_FIT off)
    filt.stats = torch.zeros(2, dtype=torch.int32)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    x, out = torch.randn(5, 1001), torch.empty(5, 1001)
    k32, p, temp = torch.full((5,), 7, dtype=torch.int32), torch.full((5,), 0.5), torch.ones(5)
    filt.filter(x, k32, 0.1, out, temperature=temp)
    filt.filter(x, 50, p, x)
    filt.filter(x, None, None, x)  # nothing to do in place: no launch
    (name, grid, threads, smem, a), (_, _, _, _, b) = launches
    assert len(launches) == 2 and name == "dm_filter" and grid == 5 * 8 and threads == 256 and smem == 128 * 4
    assert (a.logits, a.out, a.k_ptr, a.p_ptr, a.t_ptr) == (x.data_ptr(), out.data_ptr(), k32.data_ptr(), 0,
                                                            temp.data_ptr())
    assert (a.rows, a.vocab, a.in_stride, a.out_stride, a.slice) == (5, 1001, 1001, 1001, 128)
    assert (a.k_per_row, a.k64, a.p_per_row, a.t_per_row) == (1, 0, 0, 1)
    assert a.p_value == float(torch.tensor(0.1)) != 0.1  # the fp32 value of p
    assert (b.k_value, b.k_per_row, b.p_per_row, b.p_ptr, b.t_per_row, b.t_value) == (50, 0, 1, p.data_ptr(), 0, 1.0)
    assert b.out == b.logits == x.data_ptr() and a.stats == b.stats == filt.stats.data_ptr()
    assert a.flags == b.flags == cf.FLAG_REFINE
    # FLAG_L2_ROWS: the L2-row build (no dynamic shared memory) for 16-byte aligned rows without a temperature, the
    # kernel's flags without the bit; misaligned rows and raw logits go to the default build
    class L2Recorder(Recorder):
        def launch(self, name, grid, threads, smem, stream, params):
            launches.append(("l2", grid, threads, smem, params[0]))

    launches.clear()
    filt.flags, filt.l2_kernels = cf.FLAG_L2_ROWS | cf.DEFAULT_FLAGS, L2Recorder()
    padded = torch.zeros(5, 1004)[:, :1001]  # 16-byte aligned rows (CPU tensors: 64-byte aligned storage)
    monkeypatch.setattr(cf, "L2_MIN_ROWS", 5)
    filt.filter(padded, None, 0.9, padded)
    filt.filter(padded, 0, 0.9, padded)  # top-k disabled: top-p alone
    filt.filter(padded, 50, 0.9, padded)  # top-k on: the resident build (faster with counts-only histograms)
    filt.filter(padded, k32, 0.9, padded)  # (a per-row k counts as on)
    filt.filter(x, None, 0.9, x)  # stride 1001: rows not aligned
    filt.filter(padded, None, 0.9, padded, temperature=temp)
    monkeypatch.setattr(cf, "L2_MIN_ROWS", 6)  # (a threshold by rows: 5 rows then run the resident build)
    filt.filter(padded, None, 0.9, padded)
    assert [(w, s) for w, _, _, s, _ in launches] == [("l2", 0)] * 2 + [("dm_filter", 128 * 4)] * 5
    assert all(a.flags == cf.DEFAULT_FLAGS & (cf.L2_KERNEL_FLAGS if w.startswith("l2") else cf.RESIDENT_KERNEL_FLAGS)
               for w, *_, a in launches)
    assert cf.DEFAULT_FLAGS & cf.FLAG_BATCHED_GATHER and not cf.RESIDENT_KERNEL_FLAGS & cf.FLAG_BATCHED_GATHER
    assert cf.DEFAULT_FLAGS & cf.FLAG_SPLIT_FINAL and not cf.L2_KERNEL_FLAGS & cf.FLAG_SPLIT_FINAL
    assert all((g, a.slice) == (5 * 8, 128) for _, g, _, _, a in launches)
    # FLAG_L2_CLUSTER4: the 4-block build, slices of ceil(V / 4) rounded up to 4 tokens
    launches.clear()
    filt.l2_cluster, filt.l2_slice, filt.l2_smem = 4, cf.slice_len(1001, 4), cf.L2_C4_SMEM
    monkeypatch.setattr(cf, "L2_MIN_ROWS", 5)
    filt.filter(padded, None, 0.9, padded)
    filt.filter(padded, 50, 0.9, padded)
    assert [(w, g, sm, a.slice) for w, g, _, sm, a in launches] == [("l2", 5 * 4, 6144, 252),
                                                                    ("dm_filter", 5 * 8, 128 * 4, 128)]
    # FLAG_PERSIST: at most the clusters that fit at once, every row's arguments as before (the kernel loops)
    launches.clear()
    filt.clusters, filt.l2_clusters = 2, 3
    filt.filter(padded, None, 0.9, padded)  # (the 4-block L2 build: 3 clusters of 4)
    filt.filter(padded, 50, 0.9, padded)  # (the resident build: 2 clusters of 8)
    filt.clusters = 9
    filt.filter(padded, 50, 0.9, padded)  # (fewer rows than clusters: one per row)
    assert [(w, g, a.rows) for w, g, _, _, a in launches] == [("l2", 3 * 4, 5), ("dm_filter", 2 * 8, 5),
                                                             ("dm_filter", 5 * 8, 5)]
    # FLAG_L2_FIT: 5 rows, two clusters of 8 or five of 5 at once: one wave of 5 (its build, shared memory and
    # slice); top-k keeps the resident build
    launches.clear()
    persistent = filt.clusters, filt.l2_clusters
    filt.clusters = filt.l2_clusters = None
    filt.l2_cluster, filt.l2_slice, filt.l2_smem = 8, cf.slice_len(1001), 0
    class C5Recorder(Recorder):
        def launch(self, name, grid, threads, smem, stream, params):
            launches.append(("l2c5", grid, threads, smem, params[0]))

    filt.l2_fits = {8: (filt.l2_kernels, 2), 5: (C5Recorder(), 5)}
    filt.filter(padded, None, 0.9, padded)
    filt.filter(padded, 50, 0.9, padded)
    # launch_plan (what the bench labels its layouts with) says the same without launching
    assert [filt.launch_plan(padded, k)[::2] for k in (None, 50)] == [(True, 5, 204), (False, 8, 128)]
    assert filt.launch_plan(x, None)[:3:2] == (False, 8)  # (rows not 16-byte aligned: the resident build)
    filt.l2_fits[8] = (filt.l2_kernels, 5)  # (one wave of 8 now: the larger cluster)
    filt.filter(padded, None, 0.9, padded)
    assert [(w, g, sm, a.slice) for w, g, _, sm, a in launches] == [("l2c5", 5 * 5, 6144, 204),
                                                                    ("dm_filter", 5 * 8, 128 * 4, 128),
                                                                    ("l2", 5 * 8, 0, 128)]
    filt.l2_fits = {}
    filt.clusters, filt.l2_clusters = persistent
    # the build bits (L2_ROWS, L2_CLUSTER4, PERSIST, CARRY) stay out of FilterArgs.flags
    launches.clear()
    filt.flags = cf.FLAGS_ALL
    filt.filter(padded, 50, 0.9, padded)
    assert launches[0][4].flags == cf.RESIDENT_KERNEL_FLAGS  # (k + p: the resident build, without BATCHED_GATHER)
    filt.cap_clusters(4)  # (a test knob: a cap where a persistent grid exists, none added elsewhere)
    assert (filt.clusters, filt.l2_clusters) == (4, 4)
    filt.clusters = None
    filt.cap_clusters(2)
    assert (filt.clusters, filt.l2_clusters) == (None, 2)
    filt.clusters = filt.l2_clusters = None
    filt.flags, filt.l2_kernels = cf.FLAG_REFINE, None
    with pytest.raises(ValueError, match="out"):
        filt.filter(x, 5, None, x[1:])  # overlapping without being it
    with pytest.raises(ValueError, match="out: rows overlap"):
        filt.filter(x[:3], 5, None, torch.empty(1, 1001).expand(3, 1001))
    with pytest.raises(ValueError, match="logits"):
        filt.filter(torch.randn(7, 1001), 5, None, torch.empty(7, 1001))  # more rows than max_rows
    # the arguments checked by name before a launch (filter_checks.check_arguments): an out of fewer rows was written past
    launched = len(launches)
    for name, args in (("out", (x, 5, None, torch.empty(4, 1001))), ("out", (x, 5, None, torch.empty(5, 1001).half())),
                       ("k", (x, torch.full((4,), 7), None, x)), ("p", (x, None, p.double(), x)),
                       ("temperature", (x, None, 0.9, x, torch.ones(5, dtype=torch.float64)))):
        with pytest.raises(ValueError, match=f"^{name}"):
            filt.filter(*args)
    assert len(launches) == launched
    filt.filter(x, 5, None, None)  # None: in place
    assert launches[-1][4].out == x.data_ptr()
