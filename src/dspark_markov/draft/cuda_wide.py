"""``impl="cuda_wide"``: large-batch Gumbel drafting (32-256 rows) with the bias on tensor cores, CUDA C++.

Per step two launches (before step 0 one more: the anchors' codes):

1. ``dspark_markov/cuda/wide.cu`` ``dm_wide_step`` (NVRTC at first use, cached on disk): every warp owns
   16-token groups of the vocabulary, holds the group's W2 rows as mma B-fragments in registers (the next
   group's rows arrive by cp.async into a per-warp stage meanwhile: W2 read once per step) and walks all rows
   in 16-row m-tiles (the codes of every row in shared memory): the bias on ``mma.sync`` (never in memory),
   ``z = round_cache(float(U) + bias)`` with ``U`` read once, the cache written once, every token ranked by an
   exact upper bound of its key (``z / T`` plus the largest exact noise of its hash bucket: the noise table
   of ``cuda_gumbel``) against the best exact key of its row found so far by any block (one packed
   (key, index) word per row, merged with ``atomicMax``), exact keys only where a bound can still reach it;
2. ``dm_wide_finish``: one warp per row turns the word into the token (``draft_tokens``) and gathers
   ``W1[token]`` into the next step's codes.

The bias is summed in another order than cuBLAS's (SPEC.md 3 leaves it free), so the cache is not
``gumbel_fused``'s bit for bit; every token is the reference's draw from the cache this sampler wrote.

``method="inverse_cdf"`` (SPEC.md 5, the rules of :mod:`dspark_markov.ops.pick`): the step entry points ``*_icdf``
give each block a contiguous run of 16-token groups (vocabulary order) and, instead of the Gumbel ranking, fold each
row's group partials (``max z / T``, ``sum exp(z / T - max)``; ``z`` itself on greedy rows) into per-(warp, row)
partials in shared memory, merged per row into one partial per block (``part``, ``[rows16, part_stride]`` fp32
pairs); only padding samples (no cache row) keep the word path. ``dm_wide_pick`` (one warp per row) then picks a
T > 0 row's block by the prefix sum of block masses (``u * total``, the first block exceeding it with positive mass,
else the last of positive mass) and re-reads only that block's ~1,000 tokens from the cache for the token; a greedy
row's token is the first maximum of the first block holding the row's maximum (re-read the same way); rows whose max
of ``z / T`` is not finite or that hold a NaN take ``argmax_first``. Greedy and non-finite rows draw the reference's token bit for bit; a T > 0 token is the
inverse CDF of the row's uniform within the fp32 sums (the block order moves rounding boundaries, as for ``wide``).

``tensor_cores=True`` (both methods; opt-in within the opt-in): the step runs ``dspark_markov/cuda/wide_tc.cu``
instead, built for sm_90a: one block per SM owning the pick's contiguous block of 64-token tiles, a producer warp
streaming W2 tiles by TMA (128-byte swizzle) through a ring of 2 or 4 shared-memory stages counted by mbarriers (and
prefetching each tile's base logits into L2), and two consumer warpgroups computing ``bias^T [64 rows x 64 tokens]``
on ``wgmma`` (both operands K-major in shared memory; the codes of every row gathered there once per step) with two
accumulators, so that an item's wgmmas run under the previous item's epilogue. It writes exactly the ``_icdf`` step's
outputs (cache, block partials, padding words) or the Gumbel step's (cache, each row's best word merged by
``atomicMax`` under the same exact-key bound ranking): ``dm_wide_pick`` and ``dm_wide_finish`` are unchanged. It takes
the calls :meth:`CudaWideBackend.tensor_core_path` allows (bf16 base logits and cache, 16-byte aligned, even strides
and vocabulary); any other call of the same sampler runs wide.cu's step, whose bias is summed in another order (so
~1e-4 of the cache entries and the tokens near a rounding boundary can differ between the two paths; both are the
reference's draws from their own caches). ``flags``, ``blocks_per_sm`` and ``warps_per_group`` do not apply to it.
Measured on an H100 (stops 51-52, ``benchmarks/results/NVIDIA-H100-80GB-HBM3_2026-12-07_wide_tc_stop51.txt``): exact in
its 23 GPU tests (``tests/gpu/test_cuda_wide_gpu.py -k tensor_core``); inverse CDF at T = 1 320 / 814 us at 64 / 253
rows (``wide`` 256 / 543; stop 52's branch-free epilogue for items of T in {0, 1} rows, ``tc_fast``), at mixed T 427 /
1,038 (``wide`` 297 / 1,096: faster at 253 rows), Gumbel 417 / 1,189 (``cuda_gumbel`` 345 / 804); latency-bound
(``benchmarks/NOTES.md``: two consumer warpgroups, 0.28 instructions issued per cycle and scheduler).
``tc_warpgroups=3`` (stop 53, both methods, opt-in; exact in its GPU tests on an H100 in stop 54): three consumer
warpgroups (12 warps of 154 registers for inverse CDF, 166-167 for Gumbel, no spill) taking the block's (tile, m-tile)
items in turn, the inverse-CDF loop with one copy of the epilogue, and no producer warp (a 13th warp would cap every
warp at 128 registers: a scheduler's 16K registers over 4 warps; setmaxnreg did not move ptxas 13.0's allocation here):
warp 0 loads the ring's first tiles; each warp's release of a stage is an arrive on its empty mbarrier plus a relaxed
shared-memory count, and the warp that counts last waits for the mbarrier's phase and loads the next tile into it (stop
54: stop 53's fences around the count waited for the warp's outstanding loads; exact in its GPU tests, memcheck /
racecheck clean, H100, stop 55).
``tc_fast_div=True`` (stop 53; exact in its GPU tests on an H100 in stop 54): the branch-free inverse-CDF epilogue also
for items whose rows have other temperatures (mixed T ran the general path: 427 / 1,038 us against 320 / 814 at T = 1),
each quotient by ``dw_div_rcp``'s reciprocal and Markstein corrections with its range test folded into one flag per item
(a warp needing ``div_rn`` redoes its quotients with ``dw_div_rcp``): the general path's values bit for bit. Since stop
54 every build has the one-copy inverse-CDF loop (T = 1: 290 / 709 us at 64 / 253 rows); with both options mixed-T
inverse CDF takes 378 / 816 us (``wide`` 296 / 1,083; H100, same call, ``benchmarks/NOTES.md``). Stop 55 (exact in
the 40 tensor-core GPU tests, H100): each item's 16 wgmma descriptors from two low words, z = U + bias by one
``add.rn.bf16x2`` per pair (the fp32 add's value: double rounding is innocuous there); T = 1 289 / 659 us (two
warpgroups), mixed T with both options 368 / 783 (``wide`` 296 / 1,113, ``cuda_gumbel`` 340 / 804). Then, not yet run on
a GPU: ``tc_prefetch_w2`` (default True) asks L2 for each W2 tile one ring cycle before its TMA.

Requirements (``ValueError`` otherwise): a CUDA device of compute capability 9.0 with NVRTC
(:func:`dspark_markov.cuda.availability`; ``tensor_cores=True`` also an NVRTC that compiles for sm_90a and a driver
with ``cuTensorMapEncodeTiled``), bf16 weights of rank 256, at most :data:`MAX_ROWS` rows, and the opt-in below.
Base logits bf16 or fp32, cache bf16 or fp32, any mix of temperatures, padding rows.

**Measured, and kept opt-in.** Written on 2026-12-04 without a GPU (it compiles for sm_90: no stack frame on the
default entry points, 144-152 registers, 430 SASS instructions per 16-row x 16-token m-tile; its tensor-core
fragment layout and ranking rules are checked on the CPU, tests/draft/test_cuda_wide.py), then run on the H200 on
2026-12-05: exact in its GPU tests (tests/gpu/test_cuda_wide_gpu.py: 26 on the H200, the inverse-CDF ones again on
an H100), but slower than the designs
``auto`` already picks (``benchmarks/results/NVIDIA-H200_2026-12-05_cuda_wide_*``; bf16, T = 1): Gumbel 250 / 352 /
589 / 1,079 us at 32 / 64 / 128 / 253 rows against ``cuda_gumbel``'s 254 / 304 / 468 / 745 (the SASS count had
predicted ~300-420 us at 253 rows), inverse CDF 390 / 1,171 us at 64 / 253 against ``wide``'s 231 / 544. (An
illegal address in one H200 timing sweep at 64 rows was the sweep's: it kept only the CUDA graphs, whose replays
then ran into freed buffers; ``bench.harness.capture_graph`` now keeps the callable alive, and the same sweep ran
clean under compute-sanitizer memcheck.) Profiled in stop 42 (H100; ``NVIDIA-H100-80GB-HBM3_2026-12-06_cuda_wide_stop42.txt``):
its 8 warps per SM waited on each m-tile's global loads, issued right before the m-tile's mma; issued one m-tile
ahead they take Gumbel 1,119 -> 855 us at 253 rows and 380 -> 327 at 64 (``cuda_gumbel`` 796 / 345 on that H100),
inverse CDF 1,185 -> 1,057 / 416 -> 371 (``wide`` 537 / 255), still behind at 253 rows. So it runs only when
``DSPARK_MARKOV_UNVERIFIED`` lists it (``DSPARK_MARKOV_UNVERIFIED=cuda_wide``, or ``1`` for every unverified
design): otherwise constructing it raises ``ValueError`` and :meth:`CudaWideBackend.unavailable_reason` (``dspark-markov
info``) says why. ``auto`` never picks it and ``dspark-markov bench`` times it only when named (``--designs``).
The GPU plan that verifies it is ``tools/gpu_plans/issue12_cuda_wide.sh``.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ..cuda import UNVERIFIED_ENV  # noqa: F401  (re-exported: the opt-in variable)
from ..ops.constants import FILTER_MARGIN

MAX_ROWS = 256  # wide.cu DW_MAX_ROWS: the codes of every row fit in shared memory
RANK = 256
TEAMS = 8  # 16-token groups in flight per block (one W2 stage each): 8 warps, or 16 with two per group
GROUP = 16  # tokens per warp work item (wide.cu DW_GROUP)
TB_SIZE = 33 << 6  # noise.cuh DM_TB_SIZE
INT64_MIN = -(2**63)
FLAG_PREFETCH = 1  # wide.cu DW_F_PREFETCH: L2 prefetch of the base logits one 16-token group ahead
FLAGS_ALL = FLAG_PREFETCH
DEFAULT_FLAGS = FLAG_PREFETCH
# Step entry points: dm_wide_b{base fp32}_c{cache fp32}_v{vector I/O}_s{scale != 1} (8 warps, one per 16-token group)
# and, for the unscaled vector paths, _p2 (16 warps, two per group sharing its W2 stage and splitting its m-tiles).
STEP_KERNELS = tuple(f"dm_wide_b{b}_c{c}_v{v}_s{s}" for b in (0, 1) for c in (0, 1) for v in (0, 1)
                     for s in (0, 1)) + tuple(f"dm_wide_b{b}_c{c}_v1_s0_p2" for b in (0, 1) for c in (0, 1))
# method="inverse_cdf": the same bits with _icdf (8 warps; each block a contiguous run of groups), and dm_wide_pick.
ICDF_KERNELS = tuple(f"dm_wide_b{b}_c{c}_v{v}_s{s}_icdf" for b in (0, 1) for c in (0, 1) for v in (0, 1)
                     for s in (0, 1))
KERNELS = STEP_KERNELS + ICDF_KERNELS + ("dm_wide_finish", "dm_wide_pick")
# tensor_cores=True: wide_tc.cu's wgmma + TMA step, built for sm_90a: dm_wide_tc_{icdf|gumbel}_s{scale != 1}.
TC_KERNELS = ("dm_wide_tc_icdf_s0", "dm_wide_tc_icdf_s1", "dm_wide_tc_gumbel_s0", "dm_wide_tc_gumbel_s1")
TC_ARCH = "sm_90a"  # wgmma and the tensor-memory accelerator need the architecture-specific target
TC_THREADS = 288  # two consumer warpgroups and the producer warp (wide_tc.cu TC_THREADS)
# tc_warpgroups=3: wide_tc.cu built with TC_WGS=3, three consumer warpgroups and no producer warp (12 warps: 154
# registers each for inverse CDF, 166-167 for Gumbel; a 13th warp would cap them at 128).
TC_WARPGROUPS = (2, 3)
TC_TOKENS = 64  # tokens per W2 tile (wide_tc.cu TC_TOK)
TC_MROWS = 64  # rows per m-tile (wide_tc.cu TC_MROWS)
TC_OPT_GENERAL = 1  # wide_tc.cu's options bit: every inverse-CDF item through the general epilogue (tc_fast=False)
TC_OPT_NO_W2_PREFETCH = 2  # wide_tc.cu's options bit: no L2 prefetch of W2 tiles ahead of their TMA (tc_prefetch_w2)
TC_TILE_BYTES = TC_TOKENS * RANK * 2  # one W2 tile: 32 KB
TC_MAX_STAGES = 4


# What `dspark-markov info` says of this design without the opt-in (the module docstring has the figures).
STATUS = ("is opt-in: exact in its GPU tests (H200 and H100, 2026-12-05; tensor_cores=True on an H100, 2026-12-07) but "
          "slower than cuda_gumbel (Gumbel) and wide (inverse CDF) from 64 rows on, so auto never picks it")


def unverified_reason() -> str | None:
    """``None`` when ``DSPARK_MARKOV_UNVERIFIED`` opts in to this design, else why not (:data:`STATUS`)."""
    from .. import cuda

    return cuda.unverified_reason("cuda_wide", "tools/gpu_plans/issue12_cuda_wide.sh", STATUS)


WARPS_PER_GROUP = (1, 2)
DEFAULT_WARPS_PER_GROUP = 1


class WideArgs(ctypes.Structure):
    """The kernels' argument (``struct WideArgs`` in wide.cu): 8-byte fields, in order."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "base", "cache", "head", "codes", "words", "idx", "pos", "temp", "seeds", "gtab")] + [
        (name, ctypes.c_int64) for name in (
            "rows", "vocab", "num_slots", "num_steps", "step", "stride_br", "stride_bn", "stride_cs", "idx64",
            "pos64", "flags")] + [
        ("scale", ctypes.c_double), ("filter_margin", ctypes.c_double)] + [
        (name, ctypes.c_uint64) for name in ("anchor", "embed", "tokens")] + [
        (name, ctypes.c_int64) for name in ("anchor64", "embed_rows", "tokens_row_stride", "tokens_step_stride")] + [
        ("keys", ctypes.c_uint64), ("part", ctypes.c_uint64)] + [
        (name, ctypes.c_int64) for name in ("part_stride", "icdf_gpb", "icdf_blocks", "cache32")]


def threads(name: str) -> int:
    """Threads per block of a step entry point: 8 warps, 16 for the two-warps-per-group variant."""
    return 512 if name.endswith("_p2") else 256


def smem_bytes(rows: int, inverse_cdf: bool = False) -> int:
    """Dynamic shared memory of a step launch over ``rows`` rows: codes, W2 stages, noise table (Gumbel) or the
    per-(warp, row) partials (inverse CDF, 8 bytes each) and 16 m-tile flags, row keys (bytes)."""
    mtiles = -(-int(rows) // 16)
    extra = TEAMS * mtiles * 16 * 8 + 64 if inverse_cdf else TB_SIZE * 4
    return mtiles * 16 * 512 + TEAMS * 2 * 8 * 32 * 16 + extra + mtiles * 16 * 32


def tc_threads(warpgroups: int = 2) -> int:
    """Threads per block of a ``wide_tc.cu`` step (TC_THREADS): the consumer warpgroups, plus the producer warp of
    the two-warpgroup build."""
    return 128 * warpgroups + (32 if warpgroups == 2 else 0)


def tc_smem_bytes(rows: int, stages: int, gumbel: bool = False, warpgroups: int = 2) -> int:
    """Dynamic shared memory of a ``wide_tc.cu`` step over ``rows`` rows with ``stages`` W2 tiles in flight (its
    TcLayout): 1,024 bytes of alignment slack, the stages, the codes and row keys (32 bytes) of every row of the
    m-tiles, one partial (8 bytes) per warpgroup and row, two mbarriers per stage (full, empty) and for the
    three-warpgroup build a third 8-byte slot per stage (its release count), the noise table (Gumbel)."""
    rows_alloc = -(-int(rows) // TC_MROWS) * TC_MROWS
    return (1024 + stages * TC_TILE_BYTES + rows_alloc * (4 * 128 + 32 + warpgroups * 8)
            + (2 if warpgroups == 2 else 3) * stages * 8 + (TB_SIZE * 4 if gumbel else 0))


def tc_stages(rows: int, limit: int, gumbel: bool = False, warpgroups: int = 2) -> int:
    """W2 tiles in flight of a ``wide_tc.cu`` step over ``rows`` rows: 4, else 2 (a power of two: the ring's index
    arithmetic is masks and shifts), as shared memory (``limit`` bytes) holds; 0 when 2 do not fit."""
    return next((s for s in (TC_MAX_STAGES, 2) if tc_smem_bytes(rows, s, gumbel, warpgroups) <= limit), 0)


def tc_defines(warpgroups: int = 2, fast_div: bool = False) -> tuple:
    """The macros of a ``wide_tc.cu`` build (``tc_warpgroups``, ``tc_fast_div``): none for the default build."""
    return (() if warpgroups == 2 else (f"TC_WGS={warpgroups}",)) + (("TC_FASTDIV=1",) if fast_div else ())


@functools.lru_cache(maxsize=None)
def wide_tc_kernels(device_index: int, warpgroups: int = 2, fast_div: bool = False):
    """The loaded functions of ``wide_tc.cu`` on one device (compiled for sm_90a, or read from the disk cache): the
    default build, or the ``TC_WGS=3`` build (``warpgroups=3``) and / or the ``TC_FASTDIV=1`` one (``fast_div``)."""
    from .. import cuda

    return cuda.load_kernels("wide_tc.cu", TC_KERNELS, device_index, defines=tc_defines(warpgroups, fast_div),
                             arch=TC_ARCH)


def icdf_blocks(vocab: int, max_blocks: int) -> tuple:
    """``(groups per block, blocks)`` of an inverse-CDF step: each block a contiguous run of whole rounds of its
    ``TEAMS`` warps (``TEAMS`` 16-token groups), as few rounds per block as ``max_blocks`` blocks allow."""
    rounds = -(-(-(-int(vocab) // GROUP)) // TEAMS)  # rounds of TEAMS groups over the vocabulary
    gpb = TEAMS * -(-rounds // max(1, int(max_blocks)))
    return gpb, -(-(-(-int(vocab) // GROUP)) // gpb)


@functools.lru_cache(maxsize=None)
def wide_kernels(device_index: int):
    """The loaded functions of ``wide.cu`` on one device (compiled, or read from the disk cache)."""
    from .. import cuda

    return cuda.load_kernels("wide.cu", KERNELS, device_index)


def _aligned(tensor: torch.Tensor, dims, nbytes: int) -> bool:
    return tensor.data_ptr() % 16 == 0 and all(tensor.stride(d) * tensor.element_size() % nbytes == 0 for d in dims)


class CudaWideBackend:
    """Backend of ``impl="cuda_wide"`` (Gumbel-max or inverse CDF, bf16 weights of rank 256, sm_90 with NVRTC).

    Options: ``filter_margin`` (the slack of the bound test; a huge value makes every token exact),
    ``flags`` (:data:`FLAG_PREFETCH`; never changes a draw), ``blocks_per_sm`` (default: as many as are
    resident at once), ``warps_per_group`` (1: 8 warps per block, each its own 16-token groups; 2: 16 warps,
    two per group, on the unscaled 16-byte paths; never changes a draw; inverse CDF: 1 only) and ``tensor_cores``
    (the wgmma + TMA step of ``wide_tc.cu`` where :meth:`tensor_core_path` allows; see the module; its TMA map
    holds W2's address: a head whose ``head_weight`` was replaced by another tensor raises ``ValueError`` at the
    next call; in-place updates are fine; ``tc_fast=False`` sends every inverse-CDF item of that step through its
    general epilogue instead of the branch-free one for interior items whose rows are samples with a cache row at T in
    {0, 1}: the same outputs bit for bit, for tests; Gumbel has one epilogue; ``tc_warpgroups=3``: the ``TC_WGS=3``
    build, three consumer warpgroups per SM and no producer warp, whose stages are refilled by the warp that releases
    them last; ``tc_fast_div=True``: the ``TC_FASTDIV=1`` build, whose inverse-CDF items of sample rows at any T also
    take the branch-free epilogue (x = z / T by dw_div_rcp's reciprocal and corrections, one range flag per item);
    the same outputs bit for bit; both exact in their GPU tests, H100, stop 54; ``tc_prefetch_w2=False``: no L2
    prefetch of each W2 tile one ring cycle before its TMA, a hint that never changes a value, for timing). Scratch
    (codes in A-fragment order, one word per row, every step's row keys, the noise table; inverse CDF: the block
    partials) is allocated once; ``run`` only launches (CUDA-graph safe). Exact on the H200 but slower than
    ``cuda_gumbel`` / ``wide``: needs the opt-in of the module docstring.
    """

    NAME = "cuda_wide"
    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cuda",)
    GRAPH_SAFE = True
    MAX_ROWS = MAX_ROWS

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, filter_margin=FILTER_MARGIN,
                 flags=DEFAULT_FLAGS, blocks_per_sm=None, warps_per_group=DEFAULT_WARPS_PER_GROUP,
                 tensor_cores=False, tc_fast=True, tc_warpgroups=2, tc_fast_div=False, tc_prefetch_w2=True):
        from .. import cuda
        from ..cuda import build
        from ..validate import check_int

        if isinstance(filter_margin, bool) or not isinstance(filter_margin, (int, float)) or not filter_margin >= 0:
            raise ValueError(f"filter_margin: expected a number >= 0, got {filter_margin!r}")
        if isinstance(flags, bool) or not isinstance(flags, int) or flags < 0 or flags & ~FLAGS_ALL:
            raise ValueError(f"flags: expected a combination of the FLAG_* bits ({FLAGS_ALL} = all), got {flags!r}")
        if blocks_per_sm is not None:
            blocks_per_sm = check_int("blocks_per_sm", blocks_per_sm, 1)
        if isinstance(warps_per_group, bool) or warps_per_group not in WARPS_PER_GROUP:
            raise ValueError(f"warps_per_group: expected one of {WARPS_PER_GROUP}, got {warps_per_group!r}")
        if method not in self.METHODS:
            raise ValueError(f"method: impl 'cuda_wide' supports 'gumbel' and 'inverse_cdf', got {method!r}")
        if not isinstance(tensor_cores, bool):
            raise ValueError(f"tensor_cores: expected True or False, got {tensor_cores!r}")
        if not isinstance(tc_fast, bool):
            raise ValueError(f"tc_fast: expected True or False, got {tc_fast!r}")
        if not isinstance(tc_fast_div, bool):
            raise ValueError(f"tc_fast_div: expected True or False, got {tc_fast_div!r}")
        if not isinstance(tc_prefetch_w2, bool):
            raise ValueError(f"tc_prefetch_w2: expected True or False, got {tc_prefetch_w2!r}")
        if isinstance(tc_warpgroups, bool) or tc_warpgroups not in TC_WARPGROUPS:
            raise ValueError(f"tc_warpgroups: expected one of {TC_WARPGROUPS}, got {tc_warpgroups!r}")
        if (tc_warpgroups != 2 or tc_fast_div) and not tensor_cores:
            raise ValueError("tc_warpgroups / tc_fast_div: options of the wgmma step, which needs tensor_cores=True")
        if tc_fast_div and method != "inverse_cdf":
            raise ValueError(f"tc_fast_div: the branch-free division is the inverse-CDF epilogue's, got method "
                             f"{method!r}")
        if method == "inverse_cdf" and warps_per_group != 1:
            raise ValueError(f"warps_per_group: method 'inverse_cdf' runs with 1 (8 warps per block), "
                             f"got {warps_per_group!r}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: impl 'cuda_wide' runs on CUDA devices, got {device}")
        if not 1 <= int(max_rows) <= MAX_ROWS:
            raise ValueError(f"max_rows: impl 'cuda_wide' takes 1 to {MAX_ROWS} rows, got {max_rows}")
        if cache_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"cache_dtype: expected torch.bfloat16 or torch.float32, got {cache_dtype}")
        why = cuda.availability(device, build=False) or unverified_reason()
        if why is not None:
            raise ValueError(f"impl: 'cuda_wide' cannot run here: {why}")
        why = self.head_reason(head)
        if why is not None:
            raise ValueError(f"head_weight: {why}")
        for name, weight in (("head_weight", head.head_weight), ("embed_weight", head.embed_weight)):
            if weight.data_ptr() % 16:  # wide.cu reads 16-byte chunks (cp.async of W2 rows, uint4 of W1 rows)
                raise ValueError(f"{name}: impl 'cuda_wide' needs a 16-byte aligned tensor (its rows are read in "
                                 f"16-byte chunks), got one at address {weight.data_ptr():#x} (a view at a storage "
                                 f"offset): pass a copy")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.head = head
        self.method = method
        self.num_steps = int(num_steps)
        self.max_rows = int(max_rows)
        try:
            self.kernels = wide_kernels(index)
            # the Gumbel bounds' table (a 2^32-hash sweep on a fresh machine); inverse CDF never reads it
            self.noise_table = cuda.noise_table(index) if method == "gumbel" else None
        except build.BuildError as error:
            raise ValueError(f"impl: 'cuda_wide' cannot run here: {error}") from error
        self.filter_margin = float(filter_margin)
        self.flags = int(flags)
        self.warps_per_group = int(warps_per_group)
        rows16 = -(-self.max_rows // 16) * 16
        self.codes = torch.zeros(rows16, RANK, dtype=torch.bfloat16, device=self.device)  # A-fragment order
        self.words = torch.full((self.max_rows,), INT64_MIN, dtype=torch.int64, device=self.device)
        # Every step's row keys (wide.cu WideRow, 32 bytes): [N, rows16 (of the call), 32] bytes, written before step 0.
        self.keys = torch.zeros(self.num_steps * rows16 * 32, dtype=torch.uint8, device=self.device)
        self.num_sms = torch.cuda.get_device_properties(index).multi_processor_count
        limit = build.max_dynamic_smem(index)
        inverse = method == "inverse_cdf"
        if smem_bytes(self.max_rows, inverse) > limit:
            need = smem_bytes(self.max_rows, inverse)
            raise ValueError(f"max_rows: {self.max_rows} rows need {need} bytes of shared memory, this GPU allows {limit}")
        # Blocks per SM of every entry point and m-tile count, queried now (no driver call inside a capture).
        self.resident = {}
        for name in ICDF_KERNELS if inverse else STEP_KERNELS:
            self.kernels.set_dynamic_smem(name, limit)
            for mtiles in range(1, rows16 // 16 + 1):
                fit = self.kernels.blocks_per_sm(name, threads(name), smem_bytes(16 * mtiles, inverse))
                self.resident[name, mtiles] = max(1, fit if blocks_per_sm is None else int(blocks_per_sm))
        # Inverse CDF: per (row, block) partials (max z / T, mass) in fp32 pairs, [rows16, part_stride], written by
        # every step launch and read by dm_wide_pick (at most one launch's blocks per row).
        self.part_stride = self.num_sms * max(self.resident.values()) if inverse else 1
        self.part = torch.zeros(rows16 if inverse else 1, self.part_stride, 2, dtype=torch.float32, device=self.device)
        self.tensor_cores = tensor_cores
        self.tc_options = (0 if tc_fast else TC_OPT_GENERAL) | (0 if tc_prefetch_w2 else TC_OPT_NO_W2_PREFETCH)
        self.tc_warpgroups = int(tc_warpgroups)
        self.tc_map = None
        if tensor_cores:
            w2 = head.head_weight  # (MarkovHead keeps it contiguous: [V, 256] rows 512 bytes apart, as the map reads)
            try:
                self.tc_kernels = wide_tc_kernels(index, self.tc_warpgroups, tc_fast_div)
                # [V, 256] bf16 in boxes of 64 tokens x 64 rank (128 bytes: the 128-byte swizzle), zeros past V
                self.tc_map = build.tensor_map_bf16_2d(w2.data_ptr(), RANK, w2.shape[0], RANK * 2, 64, TC_TOKENS)
                self.tc_w2 = w2  # (the map's storage: kept alive; run() checks the head still holds it)
            except build.BuildError as error:
                raise ValueError(f"tensor_cores: the wgmma step cannot run here: {error}") from error
            gumbel = method == "gumbel"
            wgs = self.tc_warpgroups
            self.tc_stage_count = {mtiles: tc_stages(mtiles * TC_MROWS, limit, gumbel, wgs)
                                   for mtiles in range(1, -(-self.max_rows // TC_MROWS) + 1)}
            if not all(self.tc_stage_count.values()):
                raise ValueError(f"max_rows: the wgmma step over {self.max_rows} rows needs "
                                 f"{tc_smem_bytes(self.max_rows, 2, gumbel, wgs)} bytes of shared memory, this GPU "
                                 f"allows {limit}")
            for name in TC_KERNELS:
                self.tc_kernels.set_dynamic_smem(name, limit)

    @staticmethod
    def opt_in_reason() -> str | None:
        """Why this design does not run without the opt-in (:data:`STATUS`), or ``None``; no build."""
        return unverified_reason()

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why this design cannot run here (no GPU, not sm_90, no NVRTC, not opted in (:data:`STATUS`),
        ``wide.cu`` does not build or load), or ``None``. Builds ``wide.cu`` (cached on disk)."""
        from .. import cuda

        return cuda.unavailable_reason(wide_kernels, unverified_reason)

    @staticmethod
    def head_reason(head, num_steps=None) -> str | None:
        """Why this design cannot draft from ``head`` (its weights' dtype or rank), or ``None``."""
        from .. import cuda

        return cuda.head_reason("cuda_wide", head, RANK)

    def kernel_name(self, base_logits, logits_cache) -> str:
        vocab = self.head.vocab_size
        vec = (vocab % 4 == 0 and _aligned(base_logits, (0, 1), 4 * base_logits.element_size())
               and _aligned(logits_cache, (0,), 4 * logits_cache.element_size()))
        name = (f"dm_wide_b{int(base_logits.dtype == torch.float32)}_c{int(logits_cache.dtype == torch.float32)}"
                f"_v{int(vec)}_s{int(float(self.head.scale) != 1.0)}")
        if self.method == "inverse_cdf":
            return f"{name}_icdf"
        return f"{name}_p2" if self.warps_per_group == 2 and name.endswith("_v1_s0") else name

    def tensor_core_path(self, base_logits, logits_cache) -> bool:
        """Whether this call runs ``wide_tc.cu`` (``tensor_cores=True``, bf16 base logits and cache whose row offsets
        and bases allow 4-byte pairs, an even vocabulary); else wide.cu's step."""
        return (self.tensor_cores and base_logits.dtype == torch.bfloat16 and logits_cache.dtype == torch.bfloat16
                and self.head.vocab_size % 2 == 0 and _aligned(base_logits, (0, 1), 4)
                and _aligned(logits_cache, (0,), 4))

    def arguments(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                  logits_cache) -> WideArgs:
        head = self.head
        rows, steps, vocab = base_logits.shape  # [R, N, V]
        return WideArgs(
            base_logits.data_ptr(), logits_cache.data_ptr(), head.head_weight.data_ptr(), self.codes.data_ptr(),
            self.words.data_ptr(), idx_mapping.data_ptr(), positions.data_ptr(), temperature.data_ptr(),
            seeds.data_ptr(), 0 if self.noise_table is None else self.noise_table.data_ptr(),
            rows, vocab, temperature.shape[0], steps, 0, base_logits.stride(0), base_logits.stride(1),
            logits_cache.stride(0), int(idx_mapping.dtype == torch.int64), int(positions.dtype == torch.int64),
            self.flags, float(head.scale), self.filter_margin,
            anchor.data_ptr(), head.embed_weight.data_ptr(), draft_tokens.data_ptr(),
            int(anchor.dtype == torch.int64), head.embed_vocab_size, draft_tokens.stride(0), draft_tokens.stride(1),
            self.keys.data_ptr(), self.part.data_ptr(), self.part_stride, 0, 0,
            int(logits_cache.dtype == torch.float32))

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        """Draw ``draft_tokens`` ``[R, N]`` and write ``logits_cache`` ``[S, N, V]`` (see the module).

        Launches per call: 1 + 2 N. Bytes per step: V * 512 of W2, R * V * (base + cache bytes), the codes
        (R * 512) once per block, R * 8 per m-tile and 16-token group (the words, from L2). Inverse CDF: no words
        for T > 0 rows; 8 R blocks of partials written and read back, and ~2 * 16 * icdf_gpb cache bytes (the chosen
        block: ~1,000 tokens at V = 129,280 on 132 SMs) re-read per T > 0 row.
        """
        rows, steps, vocab = base_logits.shape
        if rows == 0:
            return
        if rows > self.max_rows or steps != self.num_steps:
            raise ValueError(f"base_logits: this backend was built for <= {self.max_rows} rows and "
                             f"{self.num_steps} steps, got shape {tuple(base_logits.shape)}")
        if self.tensor_cores and self.head.head_weight.data_ptr() != self.tc_w2.data_ptr():
            raise ValueError("head_weight: the head's W2 was replaced by another tensor after this backend encoded its "
                             "TMA map (tensor_cores=True); build a new sampler (in-place updates are fine)")
        args = self.arguments(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                              logits_cache)
        name = self.kernel_name(base_logits, logits_cache)
        mtiles = -(-rows // 16)
        groups = -(-vocab // GROUP)
        inverse = self.method == "inverse_cdf"
        grid = min(self.num_sms * self.resident[name, mtiles], -(-groups // TEAMS))
        if inverse:  # each block a contiguous run of groups (vocabulary order for the pick)
            args.icdf_gpb, grid = icdf_blocks(vocab, min(grid, self.part_stride))
            args.icdf_blocks = grid
        smem = smem_bytes(rows, inverse)
        finish_grid = -(-rows // 8)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        launch = self.kernels.launch
        # Before step 0 (one warp per row of the last m-tile too): every step's row keys, the anchors' codes.
        launch("dm_wide_finish", 2 * mtiles, 256, 0, stream, [args, ctypes.c_int64(-1), ctypes.c_int64(1)])
        if self.tensor_core_path(base_logits, logits_cache):  # one block per SM, blocks of whole 64-token tiles
            args.icdf_gpb, grid = icdf_blocks(vocab, self.num_sms)
            args.icdf_blocks = grid
            stages = self.tc_stage_count[-(-rows // TC_MROWS)]
            name = f"dm_wide_tc_{'icdf' if inverse else 'gumbel'}_s{int(float(self.head.scale) != 1.0)}"
            tc_params = [self.tc_map, ctypes.c_int64(stages), ctypes.c_int64(self.tc_options)]
            smem = tc_smem_bytes(rows, stages, not inverse, self.tc_warpgroups)
            step_threads, launch_step = tc_threads(self.tc_warpgroups), self.tc_kernels.launch
        else:
            tc_params, launch_step, step_threads = [], launch, threads(name)
        for step in range(steps):
            args.step = step
            launch_step(name, grid, step_threads, smem, stream, [args] + tc_params)
            launch("dm_wide_pick" if inverse else "dm_wide_finish", finish_grid, 256, 0, stream,
                   [args, ctypes.c_int64(step), ctypes.c_int64(int(step + 1 < steps))])
