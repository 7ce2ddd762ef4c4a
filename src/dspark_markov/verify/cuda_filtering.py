"""``top_k_top_p(impl="cuda")``: the top-k / top-p filter with each row resident in one 8-block cluster, CUDA C++.

``dspark_markov/cuda/filter.cu`` (NVRTC at first use, cached on disk), one launch per call: every row is read
from memory once into the shared memory of a cluster of 8 blocks (64.6 KB per block at V = 129,280), its max,
a 2,048-bucket histogram of exact counts and integer masses over ``m - x`` (1/64 of a logit per bucket), then the
cut of top-k and of top-p from the histogram and the sorted candidates of the one bucket that holds each target
(narrowing passes on the packed (key, index) word when a bucket holds more than 2,048 tokens: flat or heavily tied
rows), and the row written once. Semantics: :mod:`.filtering`'s, bit for bit (the kept set of the sort reference).
(With top-p alone from :data:`L2_MIN_ROWS` rows the default flags run the L2-row build instead: no row in shared
memory, every pass re-reads it from L2, and since stop 43 the row is written by the gather of its target bucket, not by
a pass of its own; see the options below.)

Why (issue 16): the Triton filter makes three whole-row passes (statistics, sweep, apply); at small batches its
launches and passes dominate. Here the row crosses HBM twice (read, write) and every phase runs from shared memory.

Measured on the H200 (2026-12-05, ``benchmarks/results/NVIDIA-H200_2026-12-05_cluster_filter_v3_verify.*``;
1 / 16 / 64 / 253 requests of 6 rows, Gaussian, flags 3): k = 50 + p = 0.9 24.2 / 96.8 / 321.5 / 1,219 us, p = 0.9
alone 32.9 / 125.4 / 415.7 / 1,585 us (the Triton filter: 29.7 / 63.6 / 180.3 / 579 and 44.1 / 129.2 / 436.5 /
1,484). Each row is a chain of ~25-40 us of latency-bound phases (phase trace: ``tools/trace_cluster_filter.py``),
two blocks per SM, so beyond one wave of clusters time grows as waves x one row's latency.

The options (``flags``; :data:`DEFAULT_FLAGS` = the kernel flags of stop 27, ``FLAG_UNCOUNTED`` and
``FLAG_BATCHED_GATHER`` (stop 41; the latter for the L2-row build's launches), ``FLAG_L2_ROWS``, since stop 40
``FLAG_L2_FIT``, and since stop 43 ``FLAG_FUSED_WRITE`` and ``FLAG_PREFETCH_SLICE`` (the L2-row build's top-p alone: p
alone 2-4% / 9-12% / 14-16% faster at 16 / 64 / 253 requests on the H100), since stop 49 ``FLAG_SPECIALIZE`` (each build
compiled for the flags its launches pass: p alone 10% / 2.5% / 0.7% faster at 1 / 16 / 64 requests on the H100, 0.5%
slower at 253) and with it ``FLAG_DEEP_REFINE`` (bf16 rows, the slowest kind of p alone, 2-6% faster) and, for the
resident build, ``FLAG_SPLIT_FINAL`` (its write overlapped with the row's last cluster barrier: 0.2-2.5%); the other
options are opt-in; H100
measurements of 2026-12-05,
``..._NVIDIA-H100..._filter_flags.*``): ``FLAG_ILP``, ``FLAG_ASYNC_LOAD``, ``FLAG_WARP_THRESHOLDS``
shorten a row's phases (k + p 1,355 -> 1,165 us, p alone 1,766 -> 1,527 at 1,518 rows on the H100), and
``FLAG_L2_ROWS`` (the ``-DDF_L2_ROWS`` build: the row re-read from L2 at every pass instead of held in shared
memory, four blocks per SM, twice the rows in flight) takes top-p alone beyond :data:`L2_MIN_ROWS` rows (1,527 ->
1,388 us); ``FLAG_L2_FIT`` (stop 40) runs a batch a little larger than one wave of the L2-row build's 8-block
clusters in one wave of 7-, 6- or 5-block clusters (66 rows: 94.4-103.9 -> 82.5-88.2 us on the H100). So ``impl="auto"`` picks this filter with top-k on up to :data:`AUTO_MAX_ROWS` rows, with top-p alone at
every batch, and for raw logits with a temperature (the Triton filter has none).

Requirements (``ValueError`` otherwise): a CUDA device of compute capability 9.0 with NVRTC, fp32 logits with
``V <= 8 * MAX_SLICE``. CUDA-graph safe: one launch, no allocation after construction (``stats`` is the only
state). ``temperature=``: raw logits divided as each row is read (issue 18).

Verified on the H200 (2026-12-05): tests/gpu/test_cuda_filtering_gpu.py (every input kind and case at 6 / 96 /
1,518 rows, flat and tied rows, strides, graph replay, temperatures, DSparkStep.verify), every ``flags`` option
equal to the reference, compute-sanitizer memcheck / racecheck / synccheck clean; on the CPU its search is emulated
in the kernel's order of decisions (tests/verify/test_cuda_filtering.py) and its helpers run as host C++.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .. import cuda
from ..rng import f32
from .filter_checks import check_arguments

CLUSTER = 8  # filter.cu DF_C: blocks per row
THREADS = 256  # filter.cu DF_T
BUCKETS = 2048  # filter.cu DF_NB
CAPACITY = 2048  # filter.cu DF_CAP: candidates sorted at once
STATIC_SMEM = 47_376  # ptxas: the kernel's static shared memory (NVRTC 13.0; 47,344 before stop 43, 47,328 before 41)
SMEM_LIMIT = 227 * 1024  # an sm_90 block's shared memory
MAX_SLICE = 46_000  # tokens per block: below (SMEM_LIMIT - STATIC_SMEM) / 4 = 46,276 (and 2^16, the bins' counts)
KERNELS = ("dm_filter",)
# top_k_top_p(impl="auto") runs this filter up to this many rows with top-k on: measured faster than the Triton filter
# at 6 / 12 / 30 rows (1 / 2 / 5 requests of K + 1 = 6; H100 2026-12-05, k = 50 + p = 0.9: 24.1 / 25.8 / 34.6 us
# against 29.6 / 32.2 / 39.8), slower at 96 (100-101 against 72). 30 rows is about one wave of clusters (the H200
# holds 30 at once, ncu "Max Active Clusters").
AUTO_MAX_ROWS = 30
# ... and with top-p alone (no top-k) at every batch (None: no bound): the default flags (the L2-row build beyond
# L2_MIN_ROWS) measured faster than the Triton filter at every size on the H100 (2026-12-05, p = 0.9, Gaussian /
# peaked / bf16 rows): 6 rows 30.0-33.8 us against 42.7-44.2, 96 rows 114.7-124.4 against 141.6-143.5, 384 rows
# 375-416 against 484-502, 1,518 rows 1,335-1,458 against 1,684-1,695.
AUTO_MAX_ROWS_P_ALONE = None


class FilterArgs(ctypes.Structure):
    """The kernel's argument (``struct FilterArgs`` in filter.cu): 8-byte fields, in order."""

    _fields_ = ([(name, ctypes.c_uint64) for name in ("logits", "out", "k_ptr", "p_ptr", "stats")]
                + [(name, ctypes.c_int64) for name in ("rows", "vocab", "in_stride", "out_stride", "slice", "k_value",
                                                       "k_per_row", "k64", "p_per_row")]
                + [("p_value", ctypes.c_double), ("t_ptr", ctypes.c_uint64), ("t_per_row", ctypes.c_int64),
                   ("t_value", ctypes.c_double), ("flags", ctypes.c_int64)])

# filter.cu DF_FLAG_*: how the kernel schedules its work (every option keeps the same set). MASK_GATHER: each thread
# marks its members in a register mask first (the stop-25 loop voted per token: ~9-12 us a row on the H200); REFINE: a
# search's bucket of > 256 tokens narrowed by 256-way digit passes in shared memory, then <= 256 candidates ranked by
# counting (the stop-25 bitonic sort of up to 2,048: 4-13 us a row). Written in stop 27, measured in stop 28 (H100 and
# H200: exact, faster; in DEFAULT_FLAGS): ILP, the level-1 histogram four tokens per step (the one-token loop compiled
# to a single dependent chain of ~45 instructions per token: the histogram phase with masses 9.0 -> 5.3 us on the
# H100); ASYNC_LOAD, the slice read with cp.async, every copy in flight at once; WARP_THRESHOLDS, the gather's bucket
# bounds by 16-way rounds across a warp's lanes (~8 rounds instead of 32 dependent halvings).
# L2_ROWS (this module, not a kernel flag): the build of filter.cu with -DDF_L2_ROWS, which keeps no slice in shared
# memory and re-reads the row at every pass from L2 (an evict_last policy between the passes, evict_first at the last
# read): four blocks per SM (64 registers) instead of two, twice the rows in flight at large batches (each row's
# ~25-35 us of latency-bound phases is what limits the resident design: 1,518 rows take ~50 waves of 30 clusters).
# Used for the calls of top-p alone of at least L2_MIN_ROWS rows whose rows are 16-byte aligned and not divided by a
# temperature (the others run the resident build). ASYNC_LOAD has no effect in it (no slice is loaded).
# L2_CLUSTER4 (with L2_ROWS; this module): that build with clusters of 4 blocks (-DDF_C=4; each block 1/4 of the row,
# two adjacent level-1 buckets per thread in the reductions), so twice its rows in flight again (~130 on an H100 or
# H200), each row slower; for V <= 4 x L2_C4_MAX_SLICE. Measured (H100, 2026-12-05): exact but slower at every size
# (a row's passes take twice as long): opt-in.
FLAG_MASK_GATHER, FLAG_REFINE, FLAG_ILP, FLAG_ASYNC_LOAD, FLAG_WARP_THRESHOLDS, FLAG_L2_ROWS = 1, 2, 4, 8, 16, 32
FLAG_L2_CLUSTER4 = 64
# PERSIST (this module; written 2026-12-05 without a GPU, measured later: opt-in, see below): every build compiled with
# -DDF_PERSIST: persistent clusters. As many clusters as the device holds at once are launched (the driver's
# cuOccupancyMaxActiveClusters) and cluster c filters rows c, c + G, c + 2 G, ...; while one row is filtered each block
# prefetches its slice of the cluster's next row into L2 (one bulk prefetch: the resident build at the row's start, the
# L2-row build once its row is read a last time), so every row after a cluster's first is read from L2, not HBM. Why:
# the H100 phase trace at 1,518 rows (L2-row build, 2026-12-05) spends 4-11 us of a row's ~65 us loading the slice
# from HBM and 6-12 us at the barrier after it waiting for the cluster's slowest block; beyond one wave every cluster
# also waits for eight free block slots of a GPC. The one-row builds' SASS is unchanged (tools/cuda_sass.py).
# Measured on the H200 (2026-12-05, `..._filter_persist_verify.*`): exact (the GPU tests, 105 persist / carry cases)
# and sanitizer clean (415 / 447), but SLOWER than 63 for top-p alone at every batch (253 requests: 1,215-1,340 us with 63 against
# 1,365-1,518 with 191 = 63 + PERSIST and 1,407-1,571 with 447 = + CARRY; k + p 0-7% slower, within 1% with CARRY from
# 64 requests on): opt-in. Not profiled;
# a guess to check first: the one-row launch already overlaps a new cluster's loads with the running clusters'
# latency-bound searches, which the prefetch then only moves earlier while adding its own L2 traffic.
FLAG_PERSIST = 128
# CARRY (with PERSIST; this module: the persistent builds with -DDF_CARRY as well, builds of their own so that PERSIST
# alone does not pay the carry's registers; written 2026-12-05 without a GPU, measured: opt-in): a row's write (step 4) also
# loads the cluster's next row: the resident build refills each 16-byte slot of the slice with the next
# row's group as soon as its value is stored (cp.async; with FLAG_ASYNC_LOAD), the L2-row build reads the next row's
# groups beside its own and tracks their max, so the next row starts with its slice arriving or its max known: its
# load phase (and in the L2-row build its whole first pass over the slice) leaves the row's chain of phases.
FLAG_CARRY = 256
# L2_FIT (this module, with L2_ROWS; stop 40): a batch of top-p alone a little larger than one wave of 8-block clusters
# of the L2-row build runs in one wave of smaller clusters instead (fit_cluster: the largest of L2_FIT_SIZES whose
# resident clusters hold every row), each block reading a longer slice, rather than a second wave of 8 for the last
# few rows. Builds -DDF_C=5, 6 and 7 (blocks 0-3 reduce the 2,048 buckets, the others' ranges are empty), loaded with the filter.
# Measured (H100, 2026-12-06, `..._filter_fit_stop40.txt`; resident clusters 62 / 69 / 79 / 94 / 124 of 8 / 7 / 6 / 5
# / 4 blocks): 66 rows (11 requests) one wave of 7 in 82.5-88.2 us against 94.4-103.9 for two waves of 8, 84 rows one
# wave of 5 in 100.1-104.4 against 105.6-114.0; beyond one wave the smaller clusters lose (384 rows, five waves of 6:
# 420-453 against 371-414 for seven of 8: a row's time grows faster than its slice), and one wave of 4 did not beat two
# of 8 (96 rows, 2026-12-05: FLAG_L2_CLUSTER4). Not with FLAG_L2_CLUSTER4 (a fixed size) or FLAG_PERSIST.
FLAG_L2_FIT = 512
L2_FIT_SIZES = (8, 7, 6, 5)  # cluster sizes FLAG_L2_FIT chooses from (each a build of its own)
# L2_FIVE (this module, with L2_ROWS; stop 40): the L2-row builds compiled with -DDF_L2_FIVE, five blocks per SM instead
# of four (48 registers: ~24 bytes of scattered single-word spills, none in the histogram loop; 1,024 candidates per
# gather instead of 2,048, so the static shared memory of five blocks fits: a target bucket of more than 1,024 tokens
# takes a narrowing pass over the row first, where the bench's rows hold at most ~400 per bucket): a quarter more rows
# in flight (the guess: a row's chain of latency-bound phases limits the L2-row build), and with FLAG_L2_FIT more rows
# in one wave (96 rows, 16 requests: one wave of 6-block clusters, 101 resident). Measured (H100, 2026-12-06,
# `..._filter_fit_stop40.txt`): exact, but slower or level at every size, p alone 16 requests 121.8-127.7 us against
# 114.1-124.8 (one wave of 6 no faster than two of 8), 253 requests 1,426-1,554 against 1,327-1,454: beyond one wave
# the SM's issue, not the rows in flight, limits it. Opt-in.
FLAG_L2_FIVE = 1024
FIVE_DEFINES = ("DF_L2_FIVE",)
# SPECIALIZE (this module; stop 44, written without device time; measured in stop 49 and default since): each build compiled
# with -DDF_FIXED_FLAGS=<the kernel flags its launches pass> (filter.cu DF_FLAGS_OF: every test of the flags folded to a
# constant, the other options' code dropped; the resident build's SASS 12,136 -> 8,856 instructions, the L2-row build's
# 12,400 -> 10,552, NVRTC 13.0, default flags). The same decisions, so the same kept set. Why: at 1 request the default
# resident build slowed 4-7% when only code it never runs was added (stop 44's MASS_CARRY,
# `..._filter_carry_stop44.txt`), a sign that code size or layout costs time in this ~200 KB kernel. Not with
# FLAG_PERSIST or FLAG_L2_FIVE (builds whose stop-41 flags are compiled out). Measured (H100, stop 49, two alternating
# rounds in one call, 246335 against 508479 = it with SPECIALIZE, `..._2026-12-07_filter_special_stop49.txt`; exact in
# its 30 GPU tests, memcheck / racecheck clean): p alone, us Gaussian / peaked / bf16, 1 request 33.7 / 31.8 / 37.1 ->
# 29.9 / 29.7 / 33.5, 16 requests 112.8 / 106.2 / 119.2 -> 109.9 / 104.8 / 116.6, 64 requests 343.3 / 309.8 / 361.6 ->
# 341.0 / 309.3 / 359.0, 253 requests 1,099.2 / 1,037.0 / 1,181.4 -> 1,103.2 / 1,043.6 / 1,183.3 (0.2-0.6% slower);
# k + p level everywhere (within 1%). So the default: a build's SASS then holds only the code its flags run, and an
# option compiled into other builds cannot move the default's registers (what undid stop 48's SPARSE_DIGIT).
FLAG_SPECIALIZE = 262144
# DEEP_REFINE (kernel flag, with REFINE; stop 41): a top-p search's candidates refined by digit passes down to 32, not
# 256, before they are ranked by counting. Why: ranking ~256 candidates by counting (every thread 256 dependent 64-bit
# compares, in every block of the cluster) was 10% of the filter's instructions at 16 requests of top-p alone (Nsight
# Compute, stop 40: `..._filter_ncu96_stop40.txt`); one more digit pass over <= 256 candidates (one per thread) costs
# a few hundred instructions a thread. Only the search by mass: it is a row's last, so no later search loses the
# cached bucket that a refined gather gives up. SHARED_BOUNDS (kernel flag, with WARP_THRESHOLDS; stop 41): a gather's
# bucket bounds searched by one warp per block and shared (every warp of the cluster ran the same search before).
# DEEP_REFINE measured level in the generic builds (stop 41) and faster for bf16 rows in the specialized ones: default
# since stop 49 (DEFAULT_FLAGS' note).
FLAG_DEEP_REFINE = 2048
FLAG_SHARED_BOUNDS = 4096
# FINITE_WEIGHT (kernel flag, with ILP; stop 41): top-p's level-1 histogram of a row whose max is finite computes each
# token's q and bucket by filter.cu's df_weight_finite / df_bucket_finite: the same values (the host test compares
# them with df_weight / df_bucket) in ~45 instructions a token instead of ~50 (the selects for x == max and for
# d < -22.5 dropped, which a finite max makes redundant). Why: that loop is the issue-bound phase of
# a wave of clusters (Nsight Compute at 16 requests: 40% of the instructions, warps waiting to be selected).
FLAG_FINITE_WEIGHT = 8192
# UNCOUNTED (kernel flag, with ILP and MASK_GATHER; stop 41): top-p alone with p > 0 histograms the masses only, two
# shared-memory adds a token instead of three (the count's); its one search (by mass) learns the count of its bucket
# from the gather, which counts every member and stores the first CAPACITY, and narrows after it only when the bucket
# held more (flat or heavily tied rows). Why: an H100 experiment without the count's add (wrong counts, timing only)
# ran 8-12% faster at 16 / 64 / 253 requests of p alone (96 rows 118.4 -> 108.9 us; 1,518 rows 1,355 -> 1,251), but
# that experiment also skipped the search's refinement and sort (its counts were 0); the flag itself measured ~1%.
FLAG_UNCOUNTED = 16384
# BATCHED_GATHER (kernel flag, with MASK_GATHER; stop 41): a gather's 16-byte reads four at a time, all in flight
# before any is compared; the loop before read one group and compared it before the next read (its SASS: the one load
# sat in a branch of the partial-group read), one L2 round trip per group: the gather took ~14% of a row's time at 16
# requests of top-p alone (the phase trace, tools/trace_cluster_filter.py, H100, stop 41).
FLAG_BATCHED_GATHER = 32768
# FUSED_WRITE (kernel flag, the L2-row build, with UNCOUNTED and BATCHED_GATHER; stop 43): top-p alone writes the row
# in its one gather instead of a write pass after the search. The gather reads every token anyway and the cut lies in
# the gathered bucket, so it stores x for a token at or above the bucket's lower bound and -inf below it; once the cut
# is known only the bucket's members ranked below it (this block's, indices kept before refinement reorders the
# candidates) are set to -inf. A bucket of more than CAPACITY members (narrowed after the gather) takes the write pass,
# which stores only the 16-byte groups holding a member. Why: the write pass (one more read of the row from L2, its
# stores behind the search's tail) was ~12% of a row's time at 16 requests of top-p alone (phase trace, H100, stop
# 41). A failed search (stats[1], a broken invariant) then leaves the tokens below the bucket at -inf instead of
# keeping the whole row. Default since stop 43 (with
# PREFETCH_SLICE; measurements at DEFAULT_FLAGS).
FLAG_FUSED_WRITE = 65536
# PREFETCH_SLICE (kernel flag, the L2-row build; stop 43): thread 0 of each block requests its whole slice into L2
# (cp.async.bulk.prefetch.L2, one instruction) before the first read, so the slice's HBM traffic starts at once and
# the first read's loads (eight 16-byte loads in flight per thread, two rounds) wait on L2 rather than on HBM twice.
# Alone it measured level (H100, stop 43: p alone 16 / 64 / 253 requests 114-128 / 346-401 / 1,227-1,371 us against
# 110-122 / 349-406 / 1,240-1,373 before); with FUSED_WRITE it pays (below). Default since stop 43.
FLAG_PREFETCH_SLICE = 131072
# SPARSE_DIGIT (kernel flag, with REFINE; stop 48, measured then and removed; back in stop 49 with FLAG_SPECIALIZE, whose
# builds compile only the code their flags use: opt-in): a refinement pass (filter.cu df_refine) takes as its 256-way
# digit the 8 highest bits where the gathered candidates' words differ, not 8 contiguous bits from the highest (the
# same target, so the same kept set: the digit is monotone in the word). Why: a bucket of bf16-rounded logits holds
# two distinct values of ~150 tied tokens each at p = 0.9 (V = 129,280); the contiguous digit splits it by value only
# (the bits below the values' difference are constant), and ~150 candidates are then ranked by counting (every thread
# ~150 dependent 64-bit compares, in every block of the cluster), where the sparse digit also takes the index's high
# bits and leaves a few (tests/verify: the emulation counts them). bf16 rows are the slowest kind of top-p alone at
# every batch (H100, stop 43: 119.4 / 362.5 / 1,178.5 us at 16 / 64 / 253 requests against 113.5 / 343.4 / 1,098.4
# Gaussian, whose refined bucket keeps ~2). Only with FLAG_SPECIALIZE (filter.cu compiles it into those builds alone:
# the generic builds keep the SASS measured without it). Measured in stop 49: slower for Gaussian rows (DEFAULT_FLAGS).
FLAG_SPARSE_DIGIT = 524288
# SPLIT_FINAL (kernel flag, the resident build; stop 49): the row's last cluster barrier split into its arrive (after
# the block's last read of another block's shared memory) and its wait (before the block leaves), so that the write
# phase runs while the cluster's slower blocks finish their search, instead of after every block has arrived. Why:
# Nsight Compute at 1,518 rows (`..._filter_ncu1518_stop49.txt`) puts 14% of the stall samples on cluster-barrier
# waits. Only with FLAG_SPECIALIZE, as SPARSE_DIGIT. Measured (H100, stop 49, two alternating rounds beside 510527,
# `..._filter_special_stop49.txt`; exact in its 21 GPU tests, memcheck / racecheck clean): in the resident build, whose
# write phase is the whole row, k + p up to 1% (0.2% on average at 64 requests) and p alone at one request 1.7-2.5% faster; in the L2-row build, whose
# write (with FUSED_WRITE) is a few of the bucket's members, p alone 0.1-1.6% slower from 64 requests on (level at 16).
# So L2-row launches drop it (L2_KERNEL_FLAGS) and the default takes it for the resident build.
FLAG_SPLIT_FINAL = 1048576
FIXED_ONLY_FLAGS = FLAG_SPARSE_DIGIT | FLAG_SPLIT_FINAL  # compiled into the FLAG_SPECIALIZE builds only
# (SPARSE_DIGIT's history: stop 48 measured it in the generic builds, exact and bf16 p alone 2-5% faster at 64 / 253
# requests, but every version slowed the default (H100, beside the tree before in one call: Gaussian p alone at 16
# requests 113 -> 120-123 us with the flag off; the whole kernel's registers moved), and removed it
# (`..._2026-12-07_filter_sparse_stop48.txt`). Stop 49 brought it back in the specialized builds only, where the
# default's SASS cannot move (tools/cuda_sass.py), and measured it slower for Gaussian rows there too (DEFAULT_FLAGS'
# note): opt-in. The refinement and ranking ("sorted", DF_MARK 15) is ~13% of a row at 16 requests of p alone
# (Gaussian 17, bf16 24 of ~135 trace-us); DEEP_REFINE, specialized, is what now takes bf16 ties down.)
# (Stop 44, measured and removed: MASS_CARRY, top-p alone's uncounted histogram adding each token's mass with one 32-bit
# shared atom and a predicated carry add, half its shared-memory atomics: exact, but p alone 0.4-2% slower at 16 / 64 /
# 253 requests on an H100, and its branch in df_histogram slowed the default's resident build at one request by 4-7%:
# `..._2026-12-06_filter_carry_stop44.txt`, where bit 262144 / flags 508479 mean MASS_CARRY, not FLAG_SPECIALIZE.
# The histogram's time is not its shared-atomic count.)
# The kernel flags a launch of the resident build receives: not BATCHED_GATHER, measured slower there (H100, stop 41,
# 1 request of p alone: 36.6 / 33.2 / 40.2 us against 34.1 / 31.8 / 37.3 without it; its gather reads shared memory).
KERNEL_FLAGS = (FLAG_MASK_GATHER | FLAG_REFINE | FLAG_ILP | FLAG_ASYNC_LOAD | FLAG_WARP_THRESHOLDS | FLAG_DEEP_REFINE
                | FLAG_SHARED_BOUNDS | FLAG_FINITE_WEIGHT | FLAG_UNCOUNTED | FLAG_BATCHED_GATHER
                | FLAG_FUSED_WRITE | FLAG_PREFETCH_SLICE | FLAG_SPARSE_DIGIT | FLAG_SPLIT_FINAL)  # FilterArgs.flags
RESIDENT_KERNEL_FLAGS = KERNEL_FLAGS & ~FLAG_BATCHED_GATHER
# ... and a launch of the L2-row build: not SPLIT_FINAL, measured slower there (its paragraph above)
L2_KERNEL_FLAGS = KERNEL_FLAGS & ~FLAG_SPLIT_FINAL
FLAGS_ALL = (KERNEL_FLAGS | FLAG_L2_ROWS | FLAG_L2_CLUSTER4 | FLAG_PERSIST | FLAG_CARRY | FLAG_L2_FIT | FLAG_L2_FIVE
             | FLAG_SPECIALIZE)
L2_DEFINES = ("DF_L2_ROWS",)
L2_C4_DEFINES = ("DF_L2_ROWS", "DF_C=4")
PERSIST_DEFINES = ("DF_PERSIST",)
CARRY_DEFINES = ("DF_PERSIST", "DF_CARRY")
L2_C4_MAX_SLICE = 65_532  # a build of fewer than 8 blocks: its slice (the bins' 16-bit mass words hold <= 65,535 tokens)
L2_C4_SMEM = BUCKETS // 4 * 12  # the 4-block build's dynamic shared memory: its 512 reduced buckets (u64 mass, u32 count)
# FLAG_L2_ROWS applies to calls of top-p alone of at least this many rows (smaller ones, and top-k, the resident build):
# one wave of the resident build holds ~30 rows, the L2-row build twice as many, each slower (H100 2026-12-05, p = 0.9
# alone: 30 rows 40.5-44.1 us resident against 47.2-50.0 in L2; 96 rows 117-137 against 115-124; 1,518 rows
# 1,426-1,630 against 1,335-1,458); with top-k on the resident build is faster at every size (1,518 rows: 1,161-1,168
# against 1,347-1,355), its histogram holding counts only.
L2_MIN_ROWS = 31
# Every option but FLAG_L2_CLUSTER4: exact on the H100 (2026-12-05: the GPU tests of every flags value, memcheck and
# racecheck
# with 31 and 63) and faster than the stop-26 default 3 at every size (k + p 1,355 -> 1,165 us at 1,518 rows, p alone
# 1,766 -> 1,388; 6 rows 26.2 -> 24.0 and 37.2 -> 33.9 us; tools/time_filter.py --cuda-flags 3,31,63).
# FLAG_L2_FIT since stop 40 (H100: faster at 66-90 rows, the same kernel elsewhere; exact, memcheck and racecheck
# clean with 5 blocks, memcheck with 7). FLAG_UNCOUNTED since stop 41 (H100, `..._filter_flags_stop41.txt`: p alone
# ~1% faster at 1 / 16 / 64 / 253 requests in two alternating rounds, e.g. 253 requests 1,341.6 / 1,297.1 / 1,440.2 us
# against 1,352.8 / 1,308.7 / 1,452.6 Gaussian / peaked / bf16; exact in its GPU tests, flat rows included, memcheck
# and racecheck clean). FLAG_BATCHED_GATHER since stop 41 (the L2-row build only, RESIDENT_KERNEL_FLAGS; H100, one
# call, `..._filter_batched41_r*`: p alone against 575, stop 40's default, us Gaussian / peaked / bf16: 16 requests
# 117.7 / 110.8 / 124.9 against 120.3 / 114.6 / 127.0, 64 requests 381.4 / 352.4 / 409.2 against 392.7 / 367.9 /
# 430.4, 253 requests 1,278.7 / 1,234.3 / 1,368.8 against 1,357.5 / 1,308.7 / 1,461.8: 2-6% faster; exact in its GPU
# tests, memcheck and racecheck clean). The other stop-41 flags stayed opt-in (DEEP_REFINE until stop 49, below): DEEP_REFINE and SHARED_BOUNDS level,
# FINITE_WEIGHT faster at 1-16 requests but 2-7% slower from 64 on (same files). (A sixth, the L2-row write pass with
# eight reads in flight instead of four, measured level or 1% slower in the batched call: removed.)
# FLAG_FUSED_WRITE and FLAG_PREFETCH_SLICE since stop 43 (DEFAULT_FLAGS 49727 -> 246335; H100, three alternating rounds
# against the tree before, `..._filter_fused_stop43.txt`, p alone Gaussian / peaked / bf16, us: 16 requests 113.5 /
# 105.7 / 119.4 against 115.6 / 109.9 / 122.0; 64 requests 343.4 / 309.0 / 362.5 against 376.9 / 349.3 / 406.0; 253
# requests 1,098.4 / 1,035.9 / 1,178.5 against 1,278.6 / 1,239.5 / 1,373.1: 2-4%, 9-12%, 14-16% faster; k + p and
# one request (the resident build) unchanged; exact in the filter's GPU tests, memcheck / racecheck clean).
# FLAG_SPECIALIZE since stop 49 (DEFAULT_FLAGS 246335 -> 508479; its paragraph above), and with it FLAG_DEEP_REFINE
# (508479 -> 510527): specialized, the deeper refinement takes bf16 rows' ~150 ties down to <= 32 before the rank by
# counting. H100, stop 49, two alternating rounds in one call (`..._2026-12-07_filter_special_stop49.txt`), p alone, us
# Gaussian / peaked / bf16, 508479 -> 510527: 1 request 30.3 / 29.7 / 33.6 -> 30.4 / 29.3 / 31.7; 16 requests 108.8 /
# 105.2 / 115.4 -> 108.4 / 105.8 / 112.9; 64 requests 337.0 / 309.4 / 355.6 -> 337.5 / 317.8 / 349.1; 253 requests
# 1,096.8 / 1,040.1 / 1,177.4 -> 1,101.7 / 1,044.7 / 1,148.0: the slowest kind (bf16) 1.8-6% faster at every batch,
# the others within 1.2% but peaked rows at 64 requests (+2.7%; they never refine: the build's schedule); k + p level.
# The next call (plan part deep49: its GPU tests, the default's, the extreme rows', memcheck / racecheck clean) timed
# the same: bf16 33.6 -> 31.5, 116.3 -> 113.2, 360.7 -> 350.4, 1,183.2 -> 1,150.0 us; peaked at 64 requests +2.6%.
# In the same call, not kept: SPARSE_DIGIT (1032767: bf16 -4 / -0.5 / -1.5 / -3.5%, Gaussian +6 / +6 / +4 / +3% at 1 / 16 /
# 64 / 253 requests) and FINITE_WEIGHT (516671: level to 16 requests, Gaussian +7.5% at 253).
# And FLAG_SPLIT_FINAL for the resident build (510527 -> 1559103; its paragraph above; the L2-row build's compiled flags
# stay 510527's).
DEFAULT_FLAGS = ((KERNEL_FLAGS & ~(FLAG_SHARED_BOUNDS | FLAG_FINITE_WEIGHT | FLAG_SPARSE_DIGIT))
                 | FLAG_L2_ROWS | FLAG_L2_FIT | FLAG_SPECIALIZE)


def slice_len(vocab: int, cluster: int = CLUSTER) -> int:
    """Tokens per block: ``ceil(V / cluster)`` rounded up to a multiple of 4 (16-byte rows in shared memory)."""
    per_block = -(-vocab // cluster)
    return -(-per_block // 4) * 4


def l2_defines(cluster: int, five: bool = False) -> tuple:
    """The compile-time defines of the L2-row build with ``cluster`` blocks per row (4 to 8); ``five``: at five blocks
    per SM (:data:`FLAG_L2_FIVE`)."""
    defines = L2_DEFINES if cluster == CLUSTER else L2_DEFINES + (f"DF_C={cluster}",)
    return defines + FIVE_DEFINES if five else defines


def l2_smem(cluster: int) -> int:
    """Dynamic shared memory of a block of the L2-row build with ``cluster`` blocks: none with 8 (its reduced buckets
    are static), else its reduced buckets, ``DF_RANGE`` x 12 bytes (filter.cu DF_PER: buckets per thread)."""
    if cluster == CLUSTER:
        return 0
    per = -(-BUCKETS // (cluster * THREADS))
    return per * THREADS * 12


def fit_cluster(rows: int, fits: dict) -> int:
    """FLAG_L2_FIT's cluster size for a call of ``rows`` rows, from ``fits`` (cluster size -> resident clusters; 8 at
    least): 8 when one wave of it holds the rows or no size does, else the largest size whose one wave does."""
    if rows <= fits[CLUSTER]:
        return CLUSTER
    return max((c for c in fits if rows <= fits[c]), default=CLUSTER)


def smem_bytes(vocab: int) -> int:
    """Dynamic shared memory of one block: its slice of the row in fp32."""
    return slice_len(vocab) * 4


def filter_kernels(device_index: int, l2_rows: bool = False, cluster: int = CLUSTER, persist: bool = False,
                   carry: bool = False, five: bool = False, fixed: int | None = None):
    """The loaded ``filter.cu`` on one device (compiled with NVRTC or read from the disk cache; loaded once per
    device and build), its dynamic shared memory limit raised once to the largest slice (a per-filter value would
    break the filters of larger V, which share the function) and its carveout to all shared memory (two blocks per
    SM need ~219 KB). ``l2_rows``: the -DDF_L2_ROWS build (:data:`FLAG_L2_ROWS`; no dynamic shared memory, four
    blocks per SM need ~189 KB; ``cluster`` 4 to 7: with -DDF_C=N, :data:`FLAG_L2_CLUSTER4` /
    :data:`FLAG_L2_FIT`, 6 KB of dynamic shared memory, :func:`l2_smem`). ``persist``: that build with -DDF_PERSIST (:data:`FLAG_PERSIST`); ``carry`` (with
    it): and -DDF_CARRY (:data:`FLAG_CARRY`). ``five`` (``l2_rows``): with -DDF_L2_FIVE (:data:`FLAG_L2_FIVE`).
    ``fixed`` (:data:`FLAG_SPECIALIZE`): the kernel flags its launches pass, compiled in (-DDF_FIXED_FLAGS); None: read
    at run time."""
    return _load_filter(int(device_index), bool(l2_rows), int(cluster) if l2_rows else CLUSTER, bool(persist),
                        bool(persist and carry), bool(l2_rows and five), -1 if fixed is None else int(fixed))


@functools.lru_cache(maxsize=None)
def _load_filter(device_index: int, l2_rows: bool, cluster: int, persist: bool = False, carry: bool = False,
                 five: bool = False, fixed: int = -1):
    from ..cuda import build

    defines = l2_defines(cluster, five) if l2_rows else ()
    defines += (CARRY_DEFINES if carry else PERSIST_DEFINES) if persist else ()
    defines += (f"DF_FIXED_FLAGS={fixed}",) if fixed >= 0 else ()
    kernels = cuda.load_kernels("filter.cu", KERNELS, device_index, defines=defines)
    if not l2_rows:
        kernels.set_dynamic_smem(KERNELS[0], MAX_SLICE * 4)
    elif cluster != CLUSTER:  # (static + dynamic above 48 KB needs the limit raised, even for 6 KB of dynamic)
        kernels.set_dynamic_smem(KERNELS[0], l2_smem(cluster))
    kernels.set_attribute(KERNELS[0], build.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    return kernels


def resident_clusters(kernels, cluster: int, smem: int) -> int | None:
    """How many clusters of ``cluster`` blocks (``smem`` bytes of dynamic shared memory each) of a loaded filter build
    the device holds at once: the driver's ``cuOccupancyMaxActiveClusters``; None where the driver cannot say (then a
    cluster per row, as without FLAG_PERSIST: a count that ignores how clusters pack into a GPU's GPCs, e.g. the SMs'
    blocks over the cluster size, 33 where 30 fit, would leave the clusters that do not fit waiting for a whole share
    of rows)."""
    try:
        count = int(kernels.max_active_clusters(KERNELS[0], cluster, THREADS, smem))
    except Exception:  # noqa: BLE001 - a missing symbol (older driver) or a driver error: no persistent grid
        return None
    return count if count >= 1 else None


def kernel_flags(flags: int, l2: bool) -> int:
    """FilterArgs.flags of a launch of the L2-row build (``l2``) or of the resident build by a filter of ``flags``: the
    kernel's bits only (the resident build without BATCHED_GATHER, the L2-row build without SPLIT_FINAL); with
    :data:`FLAG_SPECIALIZE` the value compiled
    into that build."""
    return flags & (L2_KERNEL_FLAGS if l2 else RESIDENT_KERNEL_FLAGS)


def compiled_flags(flags: int, l2: bool) -> int | None:
    """The kernel flags compiled into the L2-row (``l2``) or resident builds a filter of ``flags`` loads: with
    :data:`FLAG_SPECIALIZE` those its launches pass (:func:`kernel_flags`), else None (read at run time)."""
    return kernel_flags(flags, l2) if flags & FLAG_SPECIALIZE else None


def _default_kernels(device_index: int):
    """Every build a filter with :data:`DEFAULT_FLAGS` loads (the resident one, and the L2-row one it takes for top-p
    alone), so that ``auto`` never picks a filter whose construction would then fail."""
    kernels = filter_kernels(device_index, fixed=compiled_flags(DEFAULT_FLAGS, False))
    if DEFAULT_FLAGS & FLAG_L2_ROWS:
        sizes = L2_FIT_SIZES if DEFAULT_FLAGS & FLAG_L2_FIT else (4 if DEFAULT_FLAGS & FLAG_L2_CLUSTER4 else CLUSTER,)
        for size in sizes:
            filter_kernels(device_index, True, size, five=bool(DEFAULT_FLAGS & FLAG_L2_FIVE),
                           fixed=compiled_flags(DEFAULT_FLAGS, True))
    return kernels


def unavailable_reason() -> str | None:
    """``None`` if the filter can run on the current GPU, else why not (for ``dspark-markov info`` and ``auto``)."""
    return cuda.unavailable_reason(_default_kernels)


def auto_picks(logits, temperature, k=None) -> bool:
    """Whether ``top_k_top_p(impl="auto")`` runs this filter for ``logits [B, V]``: fp32 CUDA rows (last stride 1) on a
    device where it can run, when top-k is on and the batch is small (``B <= AUTO_MAX_ROWS``), with top-p alone
    (``k`` None or a scalar outside ``(0, V)``: up to ``AUTO_MAX_ROWS_P_ALONE`` rows, None: any batch; faster than
    the Triton filter there, measured) or when the logits are raw with a temperature (only this filter divides them
    on the GPU; with top-k and top-p at hundreds of rows dividing first and the Triton filter would be faster, but
    allocate). Under CUDA-graph capture only a filter this shape already built (nothing compiled, loaded or allocated
    inside the capture)."""
    if not isinstance(logits, torch.Tensor) or logits.device.type != "cuda" or logits.dim() != 2:
        return False
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        return False  # (the usual ValueError comes from the filter's checks)
    rows, vocab = logits.shape
    bound = AUTO_MAX_ROWS_P_ALONE if _top_k_off(k, vocab) else AUTO_MAX_ROWS
    if vocab > CLUSTER * MAX_SLICE or (temperature is None and bound is not None and rows > bound):
        return False
    if torch.cuda.is_current_stream_capturing():
        built = _FILTERS.get((logits.device, vocab))
        return built is not None and built.max_rows >= rows
    index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    if index not in _RUNS_ON:
        try:
            with torch.cuda.device(index):
                _RUNS_ON[index] = unavailable_reason() is None
        except Exception:  # noqa: BLE001 - anything else (a cache file, the driver): Triton this time, ask again later
            return False
    return _RUNS_ON[index]


_RUNS_ON: dict = {}  # device index -> whether the filter builds and loads there (a definite answer, kept)


class CudaTopKTopPFilter:
    """The cluster-resident filter for batches of up to ``max_rows`` rows of ``vocab`` (module doc).

    ``filter(logits, k, p, out)`` has :class:`.triton_filtering.TopKTopPFilter`'s interface: ``logits`` ``[B, V]``
    fp32 CUDA (last stride 1), ``k`` / ``p`` None, Python scalars or ``[B]`` tensors (int32 / int64, fp32), ``out``
    ``[B, V]`` fp32 (``logits`` itself or None: in place; any other overlap is refused), all checked by
    ``filter_checks.check_arguments``.
    One launch of ``B * 8`` blocks (``B * 4`` in the 4-block L2-row build, ``B * fit_cluster(B)`` with
    :data:`FLAG_L2_FIT`; with :data:`FLAG_PERSIST` at most as many clusters as fit at once); nothing allocated per call (CUDA-graph safe). ``stats`` (``[2]`` int32, CUDA):
    ``[0]`` counts the searches that needed narrowing passes (flat or heavily tied buckets), a running total;
    ``[1]`` is non-zero if a search ever found no token at its target (bits 1 / 2: a broken invariant, that row
    kept every token) or a row reached the L2-row build misaligned or to be divided (bit 4: left unfiltered; the
    launcher never sends one); the GPU tests require 0. ``flags``: None (:data:`DEFAULT_FLAGS`) or a combination of
    the ``FLAG_*`` bits (the options above; every one keeps the same set).
    """

    def __init__(self, max_rows: int, vocab: int, device, flags: int | None = None):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: the CUDA filter needs a CUDA device, got {device}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows: expected an int >= 1, got {max_rows!r}")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or not 1 <= vocab <= CLUSTER * MAX_SLICE:
            raise ValueError(f"vocab: expected 1 <= V <= {CLUSTER * MAX_SLICE} (a row must fit in the shared memory "
                             f"of {CLUSTER} blocks), got {vocab!r}")
        if flags is None:
            flags = DEFAULT_FLAGS
        if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags <= FLAGS_ALL:
            raise ValueError(f"flags: expected None (DEFAULT_FLAGS) or a combination of the FLAG_* bits, an int in "
                             f"[0, {FLAGS_ALL}], got {flags!r}")
        if flags & FLAG_CARRY and not flags & FLAG_PERSIST:
            raise ValueError(f"flags: FLAG_CARRY ({FLAG_CARRY}) is an option of the persistent builds: set "
                             f"FLAG_PERSIST ({FLAG_PERSIST}) with it, got {flags}")
        for option, name in ((FLAG_L2_CLUSTER4, "FLAG_L2_CLUSTER4"), (FLAG_L2_FIT, "FLAG_L2_FIT"),
                             (FLAG_L2_FIVE, "FLAG_L2_FIVE")):
            if flags & option and not flags & FLAG_L2_ROWS:
                raise ValueError(f"flags: {name} ({option}) is an option of the L2-row build: set FLAG_L2_ROWS "
                                 f"({FLAG_L2_ROWS}) with it, got {flags}")
        if flags & FLAG_L2_FIT and flags & (FLAG_L2_CLUSTER4 | FLAG_PERSIST):
            raise ValueError(f"flags: FLAG_L2_FIT ({FLAG_L2_FIT}) picks the cluster size per call: not with "
                             f"FLAG_L2_CLUSTER4 ({FLAG_L2_CLUSTER4}) or FLAG_PERSIST ({FLAG_PERSIST}), got {flags}")
        if flags & FLAG_L2_FIVE and flags & (FLAG_PERSIST | FLAG_L2_CLUSTER4):
            raise ValueError(f"flags: FLAG_L2_FIVE ({FLAG_L2_FIVE}) is not built with FLAG_PERSIST ({FLAG_PERSIST}) or "
                             f"FLAG_L2_CLUSTER4 ({FLAG_L2_CLUSTER4}), got {flags}")
        if flags & FIXED_ONLY_FLAGS and not flags & FLAG_SPECIALIZE:
            raise ValueError(f"flags: FLAG_SPARSE_DIGIT ({FLAG_SPARSE_DIGIT}) and FLAG_SPLIT_FINAL ({FLAG_SPLIT_FINAL}) "
                             f"are compiled into the FLAG_SPECIALIZE ({FLAG_SPECIALIZE}) builds only, got {flags}")
        if flags & FLAG_SPECIALIZE and flags & (FLAG_PERSIST | FLAG_L2_FIVE):
            raise ValueError(f"flags: FLAG_SPECIALIZE ({FLAG_SPECIALIZE}) is not built with FLAG_PERSIST ({FLAG_PERSIST}) "
                             f"or FLAG_L2_FIVE ({FLAG_L2_FIVE}), got {flags}")
        why = cuda.availability(device, build=False)
        if why is not None:
            raise ValueError(f"impl: 'cuda' top-k / top-p cannot run here: {why}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.max_rows, self.vocab, self.device, self.flags = max_rows, vocab, device, flags
        self.slice = slice_len(vocab)
        self.smem = smem_bytes(vocab)
        persist, carry = bool(flags & FLAG_PERSIST), bool(flags & FLAG_CARRY)
        self.kernels = filter_kernels(device.index, persist=persist, carry=carry, fixed=self.compiled_flags(False))
        self.l2_cluster = 4 if flags & FLAG_L2_CLUSTER4 and slice_len(vocab, 4) <= L2_C4_MAX_SLICE else CLUSTER
        self.l2_slice = slice_len(vocab, self.l2_cluster)
        self.l2_smem = l2_smem(self.l2_cluster)
        self.l2_kernels = self._l2_build(self.l2_cluster, persist, carry) if flags & FLAG_L2_ROWS else None
        # FLAG_PERSIST: the clusters launched at most (a grid of min(rows, these)); None: one cluster per row
        self.clusters = resident_clusters(self.kernels, CLUSTER, self.smem) if persist else None
        self.l2_clusters = (resident_clusters(self.l2_kernels, self.l2_cluster, self.l2_smem)
                            if persist and self.l2_kernels is not None else None)
        # FLAG_L2_FIT: cluster size -> (build, resident clusters) of the sizes the device reports (8 always: the
        # fallback, counted as one cluster per row when the driver cannot say); only where a batch can take more than
        # one wave of 8-block clusters
        self.l2_fits = {}
        if flags & FLAG_L2_FIT and max_rows >= L2_MIN_ROWS:
            count = resident_clusters(self.l2_kernels, CLUSTER, 0)
            self.l2_fits[CLUSTER] = (self.l2_kernels, count if count is not None else max_rows)
            for size in L2_FIT_SIZES if count is not None and max_rows > count else ():
                if size == CLUSTER or slice_len(vocab, size) > L2_C4_MAX_SLICE:
                    continue
                kernels = self._l2_build(size)
                count = resident_clusters(kernels, size, l2_smem(size))
                if count is not None:
                    self.l2_fits[size] = (kernels, count)
        self.stats = torch.zeros(2, dtype=torch.int32, device=device)

    def launch_plan(self, logits, k=None, temperature=None):
        """``(l2, kernels, cluster, smem, slice, clusters)`` of a call of :meth:`filter` on ``logits [B, V]`` with this
        ``k`` and ``temperature``: whether it takes the L2-row build (top-p alone, no temperature, at least
        :data:`L2_MIN_ROWS` rows, 16-byte aligned rows), the loaded build, blocks per row (FLAG_L2_FIT: per batch),
        dynamic shared memory, tokens per block, and the persistent grid's clusters (None: a cluster per row). Host
        only (no launch); the bench labels its layouts with ``cluster``."""
        rows, vocab = logits.shape
        l2 = (self.l2_kernels is not None and temperature is None and rows >= L2_MIN_ROWS and _top_k_off(k, vocab)
              and _aligned_rows(logits))
        kernels, cluster, smem, width, fit = (
            (self.l2_kernels, self.l2_cluster, self.l2_smem, self.l2_slice, self.l2_clusters) if l2
            else (self.kernels, CLUSTER, self.smem, self.slice, self.clusters))
        if l2 and self.l2_fits:  # FLAG_L2_FIT: the cluster size of this batch
            cluster = self.fit_cluster(rows)
            kernels, smem, width = self.l2_fits[cluster][0], l2_smem(cluster), slice_len(vocab, cluster)
        return l2, kernels, cluster, smem, width, fit

    def filter(self, logits, k, p, out, temperature=None):
        """Filter ``logits [B <= max_rows, vocab]`` into ``out`` (may be ``logits``; None: in place); see the class
        doc.

        ``temperature`` (None, a Python float or a ``[B]`` fp32 tensor): the logits are RAW; each row is
        divided by its temperature first (the IEEE ``x / T``; ``T == 0`` unscaled) and ``out`` receives the filter
        of the divided row, bit for bit what filtering ``draft.reference.scaled_logits(logits, T)`` gives. The
        arguments are checked first (``filter_checks.check_arguments``: host only, no synchronisation).
        """
        k, p, temperature = check_arguments(logits, k, p, out, temperature)
        return self._run(logits, k, p, logits if out is None else out, temperature)

    def _run(self, logits, k, p, out, temperature=None):
        """:meth:`filter` on arguments already checked (``top_k_top_p``)."""
        rows, vocab = logits.shape
        if rows > self.max_rows or vocab != self.vocab or logits.device != self.device:
            raise ValueError(f"logits: expected [<= {self.max_rows}, {self.vocab}] on {self.device}, got "
                             f"{list(logits.shape)} on {logits.device}")
        same = out.data_ptr() == logits.data_ptr()
        if rows == 0 or (k is None and p is None and temperature is None):
            if not same:
                out.copy_(logits)
            return out
        l2, kernels, cluster, smem, width, fit = self.launch_plan(logits, k, temperature)
        k_per_row, p_per_row = isinstance(k, torch.Tensor), isinstance(p, torch.Tensor)
        t_per_row = isinstance(temperature, torch.Tensor)
        args = FilterArgs(
            logits=logits.data_ptr(), out=out.data_ptr(), k_ptr=k.data_ptr() if k_per_row else 0,
            p_ptr=p.data_ptr() if p_per_row else 0, stats=self.stats.data_ptr(), rows=rows, vocab=vocab,
            in_stride=logits.stride(0), out_stride=out.stride(0), slice=width,
            k_value=0 if k_per_row or k is None else max(min(int(k), 2**62), -(2**62)),
            k_per_row=int(k_per_row), k64=int(k_per_row and k.dtype == torch.int64), p_per_row=int(p_per_row),
            # scalars as the fp32 values the reference compares (torch.full(..., p) is fp32)
            p_value=1.0 if p_per_row or p is None else f32(p),
            t_ptr=temperature.data_ptr() if t_per_row else 0, t_per_row=int(t_per_row),
            t_value=1.0 if t_per_row or temperature is None else f32(temperature),
            flags=self.kernel_flags(l2))
        clusters = rows if fit is None else min(rows, fit)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        kernels.launch(KERNELS[0], clusters * cluster, THREADS, smem, stream, [args])
        return out

    def kernel_flags(self, l2: bool) -> int:
        """:func:`kernel_flags` of this filter's flags."""
        return kernel_flags(self.flags, l2)

    def compiled_flags(self, l2: bool) -> int | None:
        """:func:`compiled_flags` of this filter's flags."""
        return compiled_flags(self.flags, l2)

    def _l2_build(self, size: int, persist: bool = False, carry: bool = False):
        """The L2-row build of ``size`` blocks per row with this filter's build options (FLAG_L2_FIVE, and with
        FLAG_SPECIALIZE the kernel flags compiled in)."""
        return filter_kernels(self.device.index, True, size, persist, carry, bool(self.flags & FLAG_L2_FIVE),
                              self.compiled_flags(True))

    def fit_cluster(self, rows: int) -> int:
        """The L2-row build's cluster size for a call of top-p alone on ``rows`` aligned rows: :func:`fit_cluster` over
        the sizes loaded for :data:`FLAG_L2_FIT`, else the fixed one (``l2_cluster``)."""
        if not self.l2_fits:
            return self.l2_cluster
        return fit_cluster(rows, {size: count for size, (_, count) in self.l2_fits.items()})

    def force_cluster(self, size: int) -> None:
        """:data:`FLAG_L2_FIT` (tests, sanitizer runs): every later call of the L2-row build runs clusters of ``size``
        blocks, one of the loaded sizes (``l2_fits``' counts set so that :func:`fit_cluster` takes it up to
        ``max_rows`` rows; the other sizes dropped)."""
        if not self.l2_fits:
            raise ValueError("force_cluster: this filter has no FLAG_L2_FIT sizes (flags without it, or max_rows below "
                             "L2_MIN_ROWS)")
        if size in self.l2_fits:
            kernels = self.l2_fits[size][0]
        else:  # (a filter of one wave's rows loads the 8-block build only)
            kernels = self._l2_build(size)
        every = self.max_rows if size == CLUSTER else 0
        self.l2_fits = {CLUSTER: (self.l2_fits[CLUSTER][0], every), size: (kernels, self.max_rows)}

    def cap_clusters(self, count: int) -> None:
        """:data:`FLAG_PERSIST`: launch at most ``count`` clusters, fewer than fit at once, so that every cluster loops
        over more rows (tests, sanitizer runs). Without FLAG_PERSIST nothing changes: a cluster per row."""
        if self.clusters is not None:
            self.clusters = int(count)
        if self.l2_clusters is not None:
            self.l2_clusters = int(count)


def _top_k_off(k, vocab) -> bool:
    """Whether top-k is off for every row: ``k`` None or a scalar outside ``(0, V)`` (a per-row tensor counts as on)."""
    if k is None:
        return True
    return not isinstance(k, bool) and isinstance(k, int) and not 0 < k < vocab  # (else validated later)


def _aligned_rows(t) -> bool:
    """Whether every row of ``t`` (fp32, last stride 1) starts on a 16-byte boundary (the L2-row build's loads)."""
    return t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 4 == 0)


_FILTERS: dict = {}


def launch_top_k_top_p(logits, k, p, out, temperature=None):
    """Filter ``logits`` (RAW when ``temperature`` is given) into ``out`` through a cached
    :class:`CudaTopKTopPFilter` of this shape (allocated the first time a shape, or a larger batch of it, is seen)."""
    rows, vocab = logits.shape
    key = (logits.device, vocab)
    filt = _FILTERS.get(key)
    if filt is None or filt.max_rows < rows:
        filt = CudaTopKTopPFilter(max(rows, 1), vocab, logits.device)
        _FILTERS[key] = filt
    return filt._run(logits, k, p, out, temperature)  # (checked by top_k_top_p)
