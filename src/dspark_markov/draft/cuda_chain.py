"""``impl="cuda_chain"``: the N-step chain of 1-16 rows in one persistent CUDA C++ launch (Gumbel-max).

The kernel (``dspark_markov/cuda/chain.cu``) runs one block per SM (16 warps, or 8 warps of 255
registers); block ``b`` owns a contiguous range of ``V / SMs`` tokens of W2 and keeps it on chip
across the steps (each warp's first ``reg_tiles`` 16-token tiles as tensor-core A-fragments in
registers, the next tiles in shared memory, the rest re-read from L2 with an evict-last policy),
so only step 0 streams W2 from HBM. The bias is computed with ``mma.sync`` (bf16 -> fp32, rounded
once to bf16), the draw by the approximate-key filter of :mod:`dspark_markov.ops.filter` with exact
keys for the candidates that can still win, merged across blocks through packed (key, index) words
and a bounded grid barrier. Its header comment has the details; ``noise.cuh`` the bit-exact noise.

Contract (as :class:`~dspark_markov.draft.triton_chain.ChainBackend`): scratch (``words``
``[N, 16]`` int64, ``sync`` ``[N + 1]`` int32, ``status`` ``[1]`` int32) is allocated once in
``__init__``; ``run`` allocates nothing and makes one launch on torch's current stream, so it can
be captured in a CUDA graph (one graph per batch size). All blocks must be resident at once (one
per SM; the launch takes every SM): a barrier that waits longer than ``spin_cycles`` sets
``status`` and the launch ends early with tokens in ``[0, V)``; :meth:`check` raises
:class:`~dspark_markov.DeviceStatusError`.

Measured (H200, V = 129,280, rank 256, N = 5, CUDA graph, cold L2; benchmarks/results/
NVIDIA-H200_2026-12-02_cuda_chain_cuda3_u2.json): the default picks the kernel variant by the call's
batch (:data:`DEFAULT_VARIANTS`): 82.9 / 89.0 / 95.9 us at 1 / 2 / 4 rows (variant 43, as the previous
round), 103.2 at 8 (variant 107: phase B ranked by the exact noise upper bounds of a per-bucket table;
107.4 with 43), 141.1 at 16 (variant 7275; 153.7 with 43); mixed T 80.0 / 148.7 (1 / 16 rows), fp32 cache
+ mixed T 79.6 / 168.8. Round u3 (..._cuda3_u3.json, one job, the previous default beside it): 83.5 / 88.7 /
95.8 / 103.3 / 141.0 against 83.7 / 89.2 / 96.0 / 108.2 / 153.6 at 1 / 2 / 4 / 8 / 16 rows. Per later step (in-kernel trace, ``trace=True``, warp 14 of 16): at 1 row ~6 us
bias tiles (the L2-streamed part of W2: 21 MB per step) + 0.9 phase A + 1.4 phase B (exact keys) + ~2
barrier + 0.9 token; at 16 rows (7275) 8-11 tiles + ~2.8 phase A + 4.0-4.9 phase B (was 8.3) + ~3.3
barrier + 0.9 token. Step 0 streams W2 once from HBM (66 MB; with the harness's dirty L2 also ~60 MB of
write-back): 40.7 us for N = 1 at 1 row, 34.6 with a clean L2.

Requirements (``ValueError`` otherwise): a CUDA device of compute capability 9.0 with NVRTC
(:func:`dspark_markov.cuda.availability`), bf16 weights of rank 256, at most 16 rows, at most 32
steps. Base logits bf16 or fp32, cache bf16 or fp32, any mix of temperatures, padding rows.
"""

from __future__ import annotations

import ctypes

import torch

from ..ops.constants import FILTER_MARGIN  # the margin of every filter (no Triton import)

MAX_ROWS = 16
MAX_STEPS = 32  # the exit path has one thread per (row, step): 16 * 32 = 512 threads
RANK = 256
TILE = 16  # tokens per mma tile (the M of m16n8k16)
# Register-resident tiles per warp that each block shape supports (chain.cu's entry points).
REG_TILES = {16: (0, 1), 8: (3,)}
TILE_BYTES = TILE * RANK * 2
# A barrier gives up after this many SM clock cycles (~1 s at 1.98 GHz): far beyond any step.
SPIN_CYCLES = 2_000_000_000
INT64_MIN = -(2**63)
TRACE_SLOTS = 264  # chain.cu DM_TRACE_SLOTS: 1 + 8 per step + exit, per traced block
# (warps, reg_tiles) by batch: (<= 8 rows, 9-16 rows). Measured on the H200 (N = 5, bf16, T = 1):
# 16 warps with one register tile beat no register tile (79 vs 97 us at 1 row, 259 vs 289 at 16 in
# one run) and 8 warps with three register tiles (97.4 vs 98.9 us at 1 row, 178.8 vs 227.3 at 16 in
# another): latency hiding by more warps outweighs the smaller L2 share.
DEFAULT_SHAPE = ((16, 1), (16, 1))
# Run-time hints (chain.cu DM_F_*; they never change a draw): prefetch of W2's register and
# L2-streamed tiles into L2 at launch (bulk copy engine), and of step s + 1's base logits at step s;
# step 0 in dependency order (anchors, W1 rows, then W2; shared-memory tiles copied in the tile loop).
FLAG_PREFETCH_W2 = 1
FLAG_PREFETCH_BASE = 2
FLAG_STEP0_ORDER = 4
FLAG_EXACT_SMALL = 8  # at 1-2 rows: every token's exact key in phase B (no approximate ranking)
FLAG_STEP0_SMEM_EARLY = 16  # with FLAG_STEP0_ORDER: shared-memory tiles copied at launch, after the codes
FLAGS_ALL = FLAG_PREFETCH_W2 | FLAG_PREFETCH_BASE | FLAG_STEP0_ORDER | FLAG_EXACT_SMALL | FLAG_STEP0_SMEM_EARLY
# Measured on the H200 (N = 5, bf16, T = 1; benchmarks/results/NVIDIA-H200_2026-12-01_cuda_chain_variants_r1.json,
# us at 1/2/4/8/16 rows): v5 kernel 90.3/95.0/101.3/117.6/167.7; variant 11 with both hints
# 84.9/88.7/94.8/109.3/158.8 (the best of the sweep); the hints alone on the v5 kernel 90.2 ... 170.7.
# Round 2 (..._cuda_chain_variants_r2.json): variant 43 with flags 15 80.3/85.7/93.1/104.1/155.7 against
# 89.8/94.3/100.6/116.1/170.1 for v5 and 85.0/89.3/95.8/108.9/162.1 for variant 11 + hints.
# Round 3 (..._variants_r3.json): flags 15 82.6/88.6/95.4/106.9/152.8, flags 31 (+ STEP0_SMEM_EARLY)
# 82.4/88.2/95.7/108.5/156.6, v5 91.4/94.8/101.3/118.0/174.8.
DEFAULT_FLAGS = FLAG_PREFETCH_W2 | FLAG_PREFETCH_BASE | FLAG_STEP0_ORDER | FLAG_EXACT_SMALL
# Compile-time variants of the 16-warp / one-register-tile kernel (chain.cu V6 bits): 11 = L2-streamed
# tiles loaded in two batches of 8 16-byte loads per lane ahead of their mma (1), phase A with two
# 8-token base-logit units in flight per lane (2), every step's per-row keys loaded at launch (8);
# 43 = 11 + phase B on fp32 triples, four keys computed before their insertions (32). Measured and
# not built any more (chain.cu's DM_V6_ENTRY builds them): 1, 9 (subsumed by 11), 25 / 27 (+ the
# counter-free agreement through per-block word slots, V6 & 16: slower than the counter barrier).
# 107 = 43 + phase B at 4-16 rows ranked by exact upper bounds of the keys from a per-bucket noise table
# (64; noise.cuh tb_bucket, built once per device by dm_noise_table over all 2^32 hashes), no approximate
# noise and no top-3 insertion: ~35 instead of ~70 instructions per logit. Round u1 (H200, N = 5, bf16,
# T = 1): 146.9 against 153.9 us at 16 rows, 106.6 / 107.2 at 8; mixed T 148.9 / 156.0, fp32 cache with
# mixed T 166.8 / 172.2. Bits on 43 or 107: 1024 = the register tiles loaded before the step loop
# (Nsight Compute, round u1: 92,928 local-memory spill requests per 1-row call, the 8 words of the tile
# that the allocator kept in local memory, reloaded from L2 at every step); 2048 = four load batches per
# L2-streamed tile instead of two (8 registers less); 4096 = base logits and W1 rows not allocated in L1
# (the spilled words stay there); 8192 = the barrier arrival by the block's last thread (13355 = 5163 + 8192,
# 15467 = 7275 + 8192). Measured slower and not built: a pre-barrier load of the next step's
# first L2 tile (quarter or half, ~+7 us: 130-250 bytes of spills) and the base logits loaded at the top
# of the step at 1-4 rows (+2.5 us: the codes gather waited for them).
# Round u2 (benchmarks/results/NVIDIA-H200_2026-12-02_cuda_chain_cuda3_u2.json): at 16 rows 107 142.7, 7275
# (107 + 1024 + 2048 + 4096) 141.1, 5227 140.8, against 153.7 us for 43; at 1-4 rows every new variant was
# 0.3-6 us slower than 43 (the 1024 bit moved the tile's spill store in front of step 0's codes: 20 instead of 4.5 us
# to the first barrier, the same total). Only 0, 11, 43, 107 and 7275 are built (chain.cu DM_V6_ENTRY).
VARIANTS = (0, 11, 43, 107, 7275)
DEFAULT_VARIANT = 43
# The default kernel variant by the call's rows rounded up to a power of two (16 warps, one register tile):
# measured side by side on the H200 in round u2 (benchmarks/results/NVIDIA-H200_2026-12-02_cuda_chain_cuda3_u2.json,
# N = 5, bf16, T = 1): 43 at 1-4 rows (82.9 / 89.0 / 95.9 us; every other variant was 0.3-6 us slower there),
# 107 at 5-8 rows (103.2 against 107.4 at 8 rows), 7275 at 9-16 rows (141.1 against 153.7 at 16 rows; mixed T
# 148.7 / 156.0, fp32 cache with mixed T 168.8 / 171.2).
DEFAULT_VARIANTS = {1: 43, 2: 43, 4: 43, 8: 107, 16: 7275}
VARIANT_NOISE_TABLE = 64  # the variant bit of the table-bounded phase B
TB_SIZE = 33 << 6  # noise.cuh DM_TB_SIZE (fp32 entries)
_noise_tables = {}


def noise_table(kernels, device_index: int) -> torch.Tensor:
    """The noise upper-bound table of one device ([TB_SIZE] fp32, built once from all 2^32 hashes; not timed alone).

    ``table[b]`` is the largest exact Gumbel noise (``rng.gumbel32(rng.uniform32(h))``) over every hash
    ``h`` of bucket ``b`` (noise.cuh ``tb_bucket``), -inf for an empty bucket.
    """
    table = _noise_tables.get(device_index)
    if table is None:
        device = torch.device("cuda", device_index)
        with torch.cuda.device(device):
            words = torch.zeros(TB_SIZE, dtype=torch.int32, device=device)
            stream = torch.cuda.current_stream(device).cuda_stream
            kernels.launch("dm_noise_table", 4096, 256, 0, stream, [ctypes.c_uint64(words.data_ptr())])
            o = words.to(torch.int64) & 0xFFFFFFFF  # noise.cuh tb_unorder, in int64
            bits = torch.where(o >= 2**31, o & 0x7FFFFFFF, (~o) & 0xFFFFFFFF)
            bits = torch.where(o == 0, torch.full_like(o, 0xFF800000), bits)
            table = (bits - (bits >= 2**31).long() * 2**32).to(torch.int32).view(torch.float32)
            torch.cuda.synchronize(device)
        _noise_tables[device_index] = table
    return table


class ChainArgs(ctypes.Structure):
    """The kernel's one argument (``struct ChainArgs`` in chain.cu): 8-byte fields, in order."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "base", "anchor", "embed", "head", "cache", "idx", "pos", "temp", "seeds", "tokens", "words", "sync",
        "status", "trace", "pub", "gtab")] + [(name, ctypes.c_int64) for name in (
            "rows", "vocab", "embed_rows", "num_slots", "num_steps", "stride_br", "stride_bn", "stride_cs",
            "stride_tr", "base_f32", "cache_f32", "anchor64", "idx64", "pos64", "rows_pow2", "log2_rows_pow2", "vec_io",
            "num_blocks", "num_tiles", "smem_tiles", "tiles_per_warp", "barrier_extra", "spin_cycles", "flags")] + [
        ("scale", ctypes.c_double), ("filter_margin", ctypes.c_double)]


def _aligned16(tensor: torch.Tensor, dims) -> bool:
    """Whether every row start along ``dims`` (and the data pointer) is 16-byte aligned."""
    return tensor.data_ptr() % 16 == 0 and all(tensor.stride(d) * tensor.element_size() % 16 == 0 for d in dims)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def fixed_smem_bytes(rows_pow2: int, nt: int, tiles_per_warp: int, warps: int, cache_bytes: int,
                     steps: int = 1, table: bool = False) -> int:
    """Shared memory besides the W2 tiles (chain.cu's layout): codes, the per-warp stage of z
    (``[rows_pow2][tokens * cache_bytes + 16]``), per-warp words, block words, per-row keys
    (``[steps][16]`` of slot, temperature, 1/T, prefix, live), tokens, flags, and with ``table`` the
    noise upper-bound table (variant bit 64 at 4-16 rows)."""
    codes = nt * 8 * 32 * 16
    stage = warps * rows_pow2 * (tiles_per_warp * TILE * cache_bytes + 16)
    triples = warps * rows_pow2 * 3 * 8
    keys = steps * MAX_ROWS * (8 + 4 * 4)
    return codes + stage + triples + MAX_ROWS * 8 + keys + MAX_ROWS * 4 + (MAX_ROWS + 2) * 4 + (TB_SIZE * 4 if table else 0)


def _steps_reason(num_steps) -> str | None:
    """Why ``num_steps`` steps are out of this design's range (1 to :data:`MAX_STEPS`), or ``None``."""
    if not 1 <= int(num_steps) <= MAX_STEPS:
        return f"impl 'cuda_chain' takes 1 to {MAX_STEPS} steps, got {num_steps}"
    return None


class CudaChainBackend:
    """All N steps of up to 16 rows in one persistent CUDA C++ launch (Gumbel only, bf16 weights).

    Options: ``warps`` (16 or 8 per block) and ``reg_tiles`` (tiles each warp holds in registers: 0
    or 1 with 16 warps, 3 with 8; default :data:`DEFAULT_SHAPE`), ``smem_tiles``
    (W2 tiles per block in shared memory; default: as many as fit), ``num_blocks`` (default: one per
    SM), ``spin_cycles`` (barrier bound), ``filter_margin`` (the filter's noise margin; a huge value
    forces the exact path), ``barrier_extra`` (test hook: wait for that many more arrivals than
    there are blocks, so every barrier times out), ``trace`` (record phase timestamps in :attr:`trace`;
    :meth:`phase_times` reads them), ``flags`` (run-time hints, :data:`FLAG_PREFETCH_W2` |
    :data:`FLAG_PREFETCH_BASE` | :data:`FLAG_STEP0_ORDER` | :data:`FLAG_EXACT_SMALL` | :data:`FLAG_STEP0_SMEM_EARLY`;
    they never change a draw) and ``variant`` (compile-time kernel variant,
    :data:`VARIANTS`; non-zero with 16 warps and one register tile only; default: by the call's batch,
    :data:`DEFAULT_VARIANTS`).
    """

    METHODS = ("gumbel",)
    DEVICES = ("cuda",)
    GRAPH_SAFE = True
    MAX_ROWS = MAX_ROWS

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device, warps=None, reg_tiles=None,
                 smem_tiles=None,
                 num_blocks=None, spin_cycles=SPIN_CYCLES, filter_margin=FILTER_MARGIN, barrier_extra=0, trace=False,
                 flags=DEFAULT_FLAGS, variant=None):
        from .. import cuda

        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: impl 'cuda_chain' runs on CUDA devices, got {device}")
        why = cuda.availability(device)
        if why is not None:
            raise ValueError(f"impl: 'cuda_chain' cannot run here: {why}")
        why = self.head_reason(head)
        if why is not None:
            raise ValueError(f"head_weight: {why}")
        if not 1 <= int(max_rows) <= MAX_ROWS:
            raise ValueError(f"max_rows: impl 'cuda_chain' takes 1 to {MAX_ROWS} rows, got {max_rows}")
        why = _steps_reason(num_steps)
        if why is not None:
            raise ValueError(f"num_steps: {why}")
        if cache_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"cache_dtype: expected torch.bfloat16 or torch.float32, got {cache_dtype}")
        if int(spin_cycles) < 1 or int(barrier_extra) < 0:
            raise ValueError(f"spin_cycles: expected >= 1 (and barrier_extra >= 0), got {spin_cycles}, {barrier_extra}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.head = head
        self.kernels = cuda.chain_kernels(index)
        props = torch.cuda.get_device_properties(index)
        vocab = head.vocab_size
        self.num_tiles = -(-vocab // TILE)
        self.num_blocks = min(int(num_blocks or props.multi_processor_count), self.num_tiles)
        per_block = -(-self.num_tiles // self.num_blocks)
        self.max_rows_pow2 = _pow2_at_least(int(max_rows))
        if warps is None and reg_tiles is None:
            warps, reg_tiles = DEFAULT_SHAPE[1 if self.max_rows_pow2 > 8 else 0]
        elif warps is None:
            warps = 16 if reg_tiles in REG_TILES[16] else 8
        elif reg_tiles is None:
            reg_tiles = REG_TILES.get(int(warps), (0,))[-1]
        self.warps, self.reg_tiles = int(warps), int(reg_tiles)
        if self.warps not in REG_TILES or self.reg_tiles not in REG_TILES[self.warps]:
            raise ValueError(f"reg_tiles: expected warps/reg_tiles in {REG_TILES}, got {self.warps}/{self.reg_tiles}")
        self.threads = 32 * self.warps
        if int(flags) < 0 or int(flags) & ~FLAGS_ALL:
            raise ValueError(f"flags: expected a combination of the FLAG_* bits ({FLAGS_ALL} = all), got {flags}")
        if variant is not None and (int(variant) not in VARIANTS or (int(variant) and (self.warps, self.reg_tiles)
                                                                        != (16, 1))):
            raise ValueError(f"variant: expected one of {VARIANTS} (non-zero only with 16 warps and one register "
                             f"tile), got {variant}")
        # The kernel variant of a call with rows_pow2 rows: the given one, or DEFAULT_VARIANTS where the shape has
        # them (None: `variant` is then the smallest-batch default, kept for reports).
        if variant is not None:
            self.variants = {rp: int(variant) for rp in DEFAULT_VARIANTS}
        elif (self.warps, self.reg_tiles) == (16, 1):
            self.variants = dict(DEFAULT_VARIANTS)
        else:
            self.variants = {rp: 0 for rp in DEFAULT_VARIANTS}
        self.flags, self.variant = int(flags), self.variants[1] if variant is None else int(variant)
        # The table is read by variants with bit 64 at 4-16 rows; its shared memory is reserved when a call of
        # this backend can run one.
        uses_table = any(v & VARIANT_NOISE_TABLE for rp, v in self.variants.items() if 4 <= rp <= self.max_rows_pow2)
        self.tiles_per_warp = -(-per_block // self.warps)
        fixed = fixed_smem_bytes(self.max_rows_pow2, 2, self.tiles_per_warp, self.warps,  # codes sized for NT = 2
                                 4 if cache_dtype == torch.float32 else 2, int(num_steps),
                                 table=uses_table)
        from ..cuda import build

        limit = build.max_dynamic_smem(index)
        fit = (limit - fixed) // TILE_BYTES
        wanted = max(per_block - self.warps * self.reg_tiles, 0)
        self.smem_tiles = max(0, min(fit, wanted) if smem_tiles is None else int(smem_tiles))
        if self.smem_tiles > fit:
            raise ValueError(f"smem_tiles: at most {fit} W2 tiles fit in shared memory here, got {smem_tiles}")
        self.smem_bytes = fixed + self.smem_tiles * TILE_BYTES
        for name in {self.kernel_for(rp) for rp in self.variants if rp <= self.max_rows_pow2}:
            # The limit, never this backend's size: a kernel shared by several backends (and graphs
            # captured earlier) must keep accepting the largest of their launches.
            self.kernels.set_dynamic_smem(name, limit)
            if self.kernels.blocks_per_sm(name, self.threads, self.smem_bytes) < 1:
                raise ValueError(f"smem_tiles: kernel {name} with {self.smem_bytes} bytes of shared memory does not "
                                 f"fit on one SM")
        # The noise upper-bound table (variant bit 64): built once per device, read at every launch.
        self.noise_table = noise_table(self.kernels, index) if uses_table else None
        self.spin_cycles = int(spin_cycles)
        self.filter_margin = float(filter_margin)
        self.barrier_extra = int(barrier_extra)
        self.num_steps = int(num_steps)
        self.words = torch.full((self.num_steps, MAX_ROWS), INT64_MIN, dtype=torch.int64, device=self.device)
        self.sync = torch.zeros(self.num_steps + 1, dtype=torch.int32, device=self.device)
        self.status = torch.zeros(1, dtype=torch.int32, device=self.device)
        # Per-block word slots of the counter-free agreement (chain.cu V6 & 16; no built variant uses
        # it): [N, 16, blocks].
        self.pub = torch.full((self.num_steps, MAX_ROWS, self.num_blocks), INT64_MIN, dtype=torch.int64,
                              device=self.device)
        # Profiling: clock64() at the phase boundaries of the first and the last block (chain.cu DM_TRACE).
        self.trace = torch.zeros(2, TRACE_SLOTS, dtype=torch.int64, device=self.device) if trace else None

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why this design cannot run here (no GPU, not sm_90, no NVRTC, a build error), or ``None``."""
        from .. import cuda

        return cuda.availability()

    @staticmethod
    def head_reason(head, num_steps=None) -> str | None:
        """Why this design cannot draft from ``head`` (its weights' dtype or rank), or ``num_steps`` steps (when
        given: at most :data:`MAX_STEPS`), or ``None``."""
        from .. import cuda

        why = cuda.head_reason("cuda_chain", head, RANK)
        return why if why is not None or num_steps is None else _steps_reason(num_steps)

    def phase_times(self, clock_ghz: float) -> dict:
        """Microseconds per phase of the last traced launch (``trace=True``), first and last block.

        Per step: ``compute`` (codes ready -> the block's words merged), ``barrier`` (-> every block
        arrived), ``token`` (-> the next step's codes ready: word read, W1 gather); ``start`` (kernel
        start -> step 0's codes) and ``exit``; and, seen by warp ``warps - 2`` (one with two
        L2-streamed tiles), ``tiles`` (codes ready -> its bias tiles staged), ``phaseA`` (z and the
        cache write) and ``phaseB`` (approximate ranking, exact keys, merge).
        """
        t = self.trace.cpu().tolist()
        out = {}
        for name, row in (("first", t[0]), ("last", t[1])):
            us = lambda a, b: (row[b] - row[a]) / (clock_ghz * 1e3)  # noqa: E731
            steps = self.num_steps
            phases = {"start": us(0, 1)}
            for s in range(steps):
                k = 1 + 8 * s
                # Warp WARPS - 2 (lane 0): its bias tiles, its phase A, its phase B + exact keys.
                phases[f"tiles{s}"] = us(k, k + 4)
                phases[f"phaseA{s}"] = us(k + 4, k + 5)
                phases[f"phaseB{s}"] = us(k + 5, k + 6)
                phases[f"compute{s}"] = us(k, k + 1)
                if s + 1 < steps:
                    phases[f"barrier{s}"] = us(k + 1, k + 2)
                    phases[f"token{s}"] = us(k + 2, k + 8)
            phases["exit"] = us(2 + 8 * (steps - 1), 1 + 8 * steps)
            phases["total"] = us(0, 1 + 8 * steps)
            out[name] = phases
        return out

    def kernel_name(self, nt: int, variant: int | None = None) -> str:
        variant = self.variant if variant is None else variant
        return f"dm_chain_w{self.warps}_r{self.reg_tiles}_nt{nt}" + (f"_v{variant}" if variant else "")

    def kernel_for(self, rows: int) -> str:
        """The entry point of a call with ``rows`` rows (its n-tiles, and the variant for its batch)."""
        rows_pow2 = _pow2_at_least(int(rows))
        return self.kernel_name(1 if rows_pow2 <= 8 else 2, self.variants[rows_pow2])

    def check(self) -> None:
        """Raise :class:`~dspark_markov.DeviceStatusError` if a launch's barrier timed out since the last check.

        Reads :attr:`status` (a host sync: not inside a capture) and clears it (and the scratch), so
        each failure is reported once.
        """
        if int(self.status.item()) != 0:
            self.status.zero_()
            self.words.fill_(INT64_MIN)
            self.pub.fill_(INT64_MIN)
            self.sync.zero_()
            try:
                from ..validate import DeviceStatusError
            except ImportError:  # older tree
                DeviceStatusError = RuntimeError
            raise DeviceStatusError("impl 'cuda_chain': a grid barrier timed out (not every block was resident on "
                                    "the GPU at once: another kernel held SMs, or a fault) in a launch since the "
                                    "last check; the draft tokens of that call are meaningless (in [0, V) but not "
                                    "the reference's). Run it alone on the GPU or use impl='chain'.")

    def arguments(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                  logits_cache) -> ChainArgs:
        head = self.head
        rows, steps, vocab = base_logits.shape  # [R, N, V]
        rows_pow2 = _pow2_at_least(rows)
        status = self.status  # read at every launch: a dispatcher may point it at a shared flag
        return ChainArgs(
            base_logits.data_ptr(), anchor.data_ptr(), head.embed_weight.data_ptr(), head.head_weight.data_ptr(),
            logits_cache.data_ptr(), idx_mapping.data_ptr(), positions.data_ptr(), temperature.data_ptr(),
            seeds.data_ptr(), draft_tokens.data_ptr(), self.words.data_ptr(), self.sync.data_ptr(),
            status.data_ptr(), 0 if self.trace is None else self.trace.data_ptr(), self.pub.data_ptr(),
            0 if self.noise_table is None else self.noise_table.data_ptr(),
            rows, vocab, head.embed_vocab_size, temperature.shape[0], steps,
            base_logits.stride(0), base_logits.stride(1), logits_cache.stride(0), draft_tokens.stride(0),
            int(base_logits.dtype == torch.float32), int(logits_cache.dtype == torch.float32),
            int(anchor.dtype == torch.int64), int(idx_mapping.dtype == torch.int64),
            int(positions.dtype == torch.int64), rows_pow2, rows_pow2.bit_length() - 1,
            int(_aligned16(base_logits, (0, 1)) and _aligned16(logits_cache, (0, 1))),
            self.num_blocks, self.num_tiles, self.smem_tiles, self.tiles_per_warp, self.barrier_extra,
            self.spin_cycles, self.flags, float(head.scale), self.filter_margin)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        rows, steps, _ = base_logits.shape
        if rows > self.max_rows_pow2 or steps != self.num_steps:
            raise ValueError(f"base_logits: this backend was built for <= {self.max_rows_pow2} rows and "
                             f"{self.num_steps} steps, got shape {tuple(base_logits.shape)}")
        args = self.arguments(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens,
                              logits_cache)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self.kernels.launch(self.kernel_for(rows), self.num_blocks, self.threads, self.smem_bytes,
                            stream, [args])
