"""Standard verification in one persistent CUDA C++ launch (issue 18): :class:`CudaVerifier`.

``dspark_markov/cuda/verify.cu`` (NVRTC at first use, cached on disk). The Triton verifier
(:mod:`.triton_verify_stream`) numbers its work by program id, one fixed item per program, so a request
is ready only when its slowest item ends, and a program's next item starts only after a launch-order
gap. Here every warp of a grid sized to the GPU takes *tickets* one at a time: 16 KB pieces of a target or cache row
(``(max, sum 2^((x - max) scale))`` each, or the first argmax of a greedy row), in request order (:data:`STATIC`:
warp ``w`` takes ``w, w + W, ...``; else from one atomic counter), and the pieces of each decided request's emitted
row (the residual or bonus Gumbel keys, the cheap noise ranking and the exact noise deciding). With :data:`QUEUE`
(the default) a request's last stream piece decides it and puts it on a ready list; each warp holds one claim on
that list's emit pieces and serves it between stream pieces once its request is there, so no warp waits while stream
work is left. Without it the emit pieces come ``lag`` requests after their request's stream pieces in one list, and
a warp that reaches one waits for the decision. Warps stream until no piece is left, so the pieces of a request end
within about one piece of each other at any batch. The formulas are the Triton verifier's, operation for operation
(the module docstring of :mod:`.triton_verify_stream` says which values are exact and which are within fp32 rounding
of the reference): the tokens equal the reference's and, with raw logits, are bit-identical to the pre-divided mode
(each value divided with ``__fdiv_rn``).

Scope: the standard method, ``K + 1 <= 8``, ``V % 8 == 0``, 16-byte aligned target and cache rows
(:meth:`CudaVerifier.unsupported` says why a call is not covered; ``verify_drafts(impl="cuda")`` then
raises ``ValueError`` and ``impl="triton"`` covers it). Requirements: a CUDA device of compute capability
9.0 with NVRTC (``dspark-markov info``).
CUDA-graph safe: one launch, no allocation after construction; counters are reset by their last user.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .. import cuda
from ..validate import DeviceStatusError
from .run_start import cached_instance, run_fresh, start_run

THREADS = 256  # verify.cu DV_THREADS
BLOCKS_PER_SM = 2  # __launch_bounds__(256, 2)
TARGET_SEG = 4096  # verify.cu DV_TARGET_SEG: fp32 target values per stream item
SEG_BYTES = 16384  # verify.cu DV_SEG_BYTES
MAX_ROWS = 8  # verify.cu DV_MAX_ROWS: K + 1 <= 8
KERNELS = ("dm_verify_bf16", "dm_verify_f32", "dm_verify_bf16_q", "dm_verify_f32_q")  # (_q: QUEUE)
DESIGN = "cuda_verify"
PLAN = "tools/gpu_plans/issue18_cuda.sh"
# What `dspark-markov info` says of it without the opt-in.
STATUS = ("is opt-in: exact in its GPU tests (H100, 2026-12-06) but 1.4-2.6x slower than the Triton verifier at its "
          "best schedules (a ~17 us start and end no ticket shows, one warp per emit piece; benchmarks/NOTES.md, stop 38)")
# The list's lag (requests between a request's stream tickets and its emit tickets), the emit ticket's size
# (256 tokens x emit_iters) and the 16 KB pieces per stream ticket by batch: (up to this many requests, lag,
# emit_iters, piece_mult). piece_mult from stop 38's sweep (H100, static ready list; ..._cuda_verify_stop38.txt): stream
# tickets in whole rounds of the 2,112 warps (16 requests: 3 -> 1,536 tickets, 80.1 us against 94.0-95.1 at 1 -> 4,352,
# 2.06 per warp; 64: 11 -> 182.0 against 274.7-278.8; 253: 16 -> 662.5 against 895.9-897.5; Triton 52.0 / 128.1 /
# 405.0).
# Up to 7 requests the 272 tickets per request of piece_mult 1 already fit one round (1 request: 33.1 / 35.3 / 44.1 us
# at piece_mult 1 / 2 / 4; 2-15 requests not measured).
SCHEDULE = ((7, 4, 4, 1), (16, 4, 4, 3), (64, 8, 8, 11), (None, 16, 16, 16))
_FLAGS = dict(has_greedy=1, raw=2, cache_bf16=4, drafts_i64=8, idx_i64=16, nd_i64=32, pos_i64=64, static=128,
              row_arrivals=256, queue=512)
GLOBALS = 32  # verify.cu DV_READY: ints of VerifyArgs.global before the ready list (B more)
COUNTERS = 128  # verify.cu DV_COUNTERS: ints per request
EMIT_GROUP = 16  # verify.cu DV_EMIT_GROUP: emit tickets per group counter (row_arrivals)
# How tickets are taken and arrivals counted. Measured on an H100 (stop 35) with the counter (STATIC False) and one
# arrival word per request (ROW_ARRIVALS False) only: 2.1-4.5x slower than the Triton verifier, ~17-21 ns of launch per
# ticket at every batch. tools/model_cuda_verify.py reproduces those times (16-253 requests) if an atomic on one word
# takes ~20 ns and same-word atomics serialise, and predicts ~27-30 / ~90 / ~345 us at 16 / 64 / 253 requests on an
# H100 without the counter and with a word per row (the Triton verifier: 52 / 128 / 404). Both on by default on that
# model's word, until tools/gpu_plans/issue18_cuda.sh (mini) has measured them. STATIC needs every block resident at
# once (as cuda_chain's grid barrier does): the constructor checks the occupancy (two blocks per SM); another stream's
# kernel holding an SM's registers can still delay a block past the bounded wait, which check() then reports.
# Measured (H100, stop 37, NVIDIA-H100-80GB-HBM3_2026-12-06_cuda_verify_stop37.txt): both slower, not faster (16 / 253
# requests: counter + one word 84.5 / 625.9 us, static 93.5 / 804.3, static + rows 97.1 / 845.5; Triton 52.0 / 416.6).
# The trace showed why: an emit ticket waits for its request's decision while holding its warp (median 22 us at 16
# requests, 169 us at 253), and the stream tickets behind it in that warp's order wait too. QUEUE removes the wait.
STATIC = True  # warp w's tickets w, w + W, ... (True: every block must be resident) or the counters' (False); with
#               the lag-ordered list it was slower (above), with the ready list (QUEUE) it removes the shared-word
#               fetch-and-adds that spread the ticket starts over 60 us at 16 requests (H100 trace, stop 37)
ROW_ARRIVALS = False  # stream (emit) tickets arrive on their row's (group's) counter, each one's last on the request's
QUEUE = True  # stream tickets in request order (static or from a counter); emit tickets only of decided requests
#               (a ready list), each warp serving its one claimed emit ticket between stream tickets (no lag, no
#               waiting while stream work is left); the lag-ordered list (False) is what the trace above measured


class VerifyArgs(ctypes.Structure):
    """The kernel's argument (``struct VerifyArgs`` in verify.cu): 8-byte fields, in order."""

    _fields_ = ([(name, ctypes.c_uint64) for name in (
        "target", "drafts", "cache", "idx", "nd", "pos", "temp", "seeds", "greedy", "ttemp", "part", "epart", "emitp",
        "counters", "global_", "tokens", "num_emitted", "trace")]
        + [(name, ctypes.c_int64) for name in (
            "t_req", "t_row", "d_req", "d_step", "c_slot", "c_step", "tok_stride", "batch", "vocab", "num_slots", "k",
            "flags", "lag", "emit_iters", "piece_mult")])


@functools.lru_cache(maxsize=None)
def verify_kernels(device_index: int):
    """The loaded functions of ``verify.cu`` on one device (compiled with NVRTC or read from the disk cache)."""
    return cuda.load_kernels("verify.cu", KERNELS, device_index)


def unavailable_reason() -> str | None:
    """Why :class:`CudaVerifier` cannot run here (no sm_90 GPU, no NVRTC, a failed build, or not opted in
    while its GPU tests have not passed), else ``None``."""
    return cuda.unavailable_reason(verify_kernels, lambda: cuda.unverified_reason(DESIGN, PLAN, STATUS))


def scope_reason(num_drafts: int, vocab: int) -> str | None:
    """Why a CudaVerifier of ``K = num_drafts`` over ``V = vocab`` cannot run here (:func:`unavailable_reason`,
    ``K + 1 > 8`` or ``V`` not a multiple of 8), else ``None``. Per call: :meth:`CudaVerifier.unsupported`."""
    why = unavailable_reason()
    if why is None and (num_drafts + 1 > MAX_ROWS or vocab % 8):
        why = f"it takes K + 1 <= {MAX_ROWS} rows and V % 8 == 0, got K = {num_drafts}, V = {vocab}"
    return why


def schedule(batch: int) -> tuple[int, int, int]:
    """``(lag, emit_iters, piece_mult)`` of a launch of ``batch`` requests (:data:`SCHEDULE`)."""
    for bound, lag, iters, mult in SCHEDULE:
        if bound is None or batch <= bound:
            return lag, iters, mult
    raise AssertionError("SCHEDULE ends with None")


def pieces(k: int, vocab: int, cache_bytes: int, emit_iters: int, piece_mult: int = 1) -> tuple[int, int, int, int]:
    """``(ST, SC, SI, E)``: 16 KB pieces of a target row and of a cache row, stream tickets per request, emit tickets
    per request (verify_plan.cuh ``plan_of``)."""
    st = -(-vocab // TARGET_SEG)
    sc = -(-vocab // (SEG_BYTES // cache_bytes))
    si = (k + 1) * -(-st // piece_mult) + k * -(-sc // piece_mult)
    return st, sc, si, -(-vocab // (256 * emit_iters))


def _aligned(t: torch.Tensor, strides) -> bool:
    return t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0 for s in strides)


class CudaVerifier:
    """Persistent-warp verification (standard method) with scratch allocated once; :meth:`run` only launches.

    Parameters: ``max_batch`` (largest ``B``), ``num_drafts`` (``K``, at most 7), ``vocab_size`` (``V``, a multiple
    of 8), ``device`` (CUDA, sm_90); ``lag`` / ``emit_iters`` / ``piece_mult``: override :data:`SCHEDULE` (tests,
    sweeps); ``static``: warp ``w`` takes tickets ``w, w + W, ...`` instead of the counter's (default :data:`STATIC`;
    every block must be resident at once: the constructor checks two per SM, and a wait that still times out is
    reported by :meth:`check`); ``row_arrivals``: stream tickets arrive on a counter per row and emit tickets on a
    counter per group of 16, each one's last on the request's (default :data:`ROW_ARRIVALS`); ``queue``: the
    ready-list schedule (default :data:`QUEUE`; no ``lag`` with it; ``static`` gives each warp fixed stream tickets
    and claims).
    Scratch: ``B (2K+1) ST + B E`` 16-byte partials, ``B`` x 8 words of the emitted rows, ``B`` x 128 counters,
    ``32 + B`` words of global counters and ready list.
    """

    def __init__(self, max_batch: int, num_drafts: int, vocab_size: int, device, *, lag=None, emit_iters=None,
                 piece_mult=None, static=None, row_arrivals=None, queue=None):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: CudaVerifier needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.max_batch, self.k, self.vocab = int(max_batch), int(num_drafts), int(vocab_size)
        if not 0 <= self.k < MAX_ROWS:
            raise ValueError(f"num_drafts: CudaVerifier takes K + 1 <= {MAX_ROWS} rows, got K = {self.k}")
        if self.vocab < 8 or self.vocab % 8:
            raise ValueError(f"vocab_size: CudaVerifier needs a multiple of 8, got {self.vocab}")
        if emit_iters is not None and not 1 <= int(emit_iters) <= -(-int(vocab_size) // 256):
            raise ValueError(f"emit_iters: expected 1..{-(-int(vocab_size) // 256)} (256 tokens each), got {emit_iters}")
        if lag is not None and int(lag) < 0:
            raise ValueError(f"lag: expected >= 0, got {lag}")
        if piece_mult is not None and not 1 <= int(piece_mult) <= 64:
            raise ValueError(f"piece_mult: expected 1..64 pieces of 16 KB per stream ticket, got {piece_mult}")
        self.lag, self.emit_iters, self.piece_mult = lag, emit_iters, piece_mult
        self.static = STATIC if static is None else bool(static)
        self.row_arrivals = ROW_ARRIVALS if row_arrivals is None else bool(row_arrivals)
        self.queue = QUEUE if queue is None else bool(queue)
        if self.queue and lag is not None:
            raise ValueError("lag: the ready-list schedule (queue=True) has no lag; pass queue=False to set one")
        if self.row_arrivals:  # every schedule this verifier can launch (one per SCHEDULE bound): its emit groups fit
            bounds = [bound for bound, *_ in SCHEDULE if bound is not None and bound < self.max_batch]
            for batch in [1, *bounds, self.max_batch]:
                self._check_groups(batch)
        self.kernels = verify_kernels(device.index)
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        if self.static:  # every block resident at once, or the static tickets could wait on a block never started
            resident = min(self.kernels.blocks_per_sm(name, THREADS, 0) for name in KERNELS)
            if resident < BLOCKS_PER_SM:
                raise ValueError(f"static: the device holds {resident} verify block(s) per SM, not {BLOCKS_PER_SM}; "
                                 "pass static=False (tickets from the counter)")
        mb, k = self.max_batch, self.k
        st, _, _, e_max = pieces(k, self.vocab, 2, 1)  # (the smallest emit piece: the most partials)
        self.part = torch.zeros(mb * (2 * k + 1) * st * 4, dtype=torch.float32, device=device)
        self.epart = torch.zeros(mb * e_max * 4, dtype=torch.float32, device=device)
        self.emitp = torch.zeros(mb * 8, dtype=torch.float32, device=device)
        self.counters = torch.zeros(mb * COUNTERS, dtype=torch.int32, device=device)
        self.globals = torch.zeros(GLOBALS + mb, dtype=torch.int32, device=device)
        self.tokens = torch.full((mb, k + 1), -1, dtype=torch.int64, device=device)
        self.num_emitted = torch.zeros(mb, dtype=torch.int64, device=device)
        self._no_greedy = torch.zeros(1, dtype=torch.uint8, device=device)
        self._no_temp = torch.zeros(1, dtype=torch.float32, device=device)

    @staticmethod
    def unsupported(target_logits, draft_tokens, logits_cache, method: str = "standard") -> str | None:
        """Why this call is outside the kernel's scope (the block method, a row not 16-byte aligned), or ``None``."""
        if method != "standard":
            return f"method {method!r}: CudaVerifier runs the standard method only"
        if logits_cache.dtype not in (torch.bfloat16, torch.float32):
            return f"logits_cache: bf16 or fp32, got {logits_cache.dtype}"
        if not _aligned(target_logits, target_logits.stride()[:2]):
            return "target_logits: rows must start on 16-byte boundaries"
        if not _aligned(logits_cache, logits_cache.stride()[:2]):
            return "logits_cache: rows must start on 16-byte boundaries"
        return None

    def schedule_of(self, batch: int) -> tuple[int, int, int]:
        """``(lag, emit_iters, piece_mult)`` this verifier launches ``batch`` requests with."""
        lag, iters, mult = schedule(batch)
        return (lag if self.lag is None else int(self.lag), iters if self.emit_iters is None else int(self.emit_iters),
                mult if self.piece_mult is None else int(self.piece_mult))

    def _check_groups(self, batch: int) -> None:
        """``row_arrivals``: the emit groups of a launch of ``batch`` requests fit in the request's counters."""
        _, iters, mult = self.schedule_of(batch)
        groups = -(-pieces(self.k, self.vocab, 2, iters, mult)[3] // EMIT_GROUP)
        if 4 + 2 * self.k + 1 + groups > COUNTERS:
            raise ValueError(f"emit_iters: {iters} cuts V = {self.vocab} into {groups} groups of {EMIT_GROUP} emit "
                             f"tickets, more than the {COUNTERS - 4 - 2 * self.k - 1} counters left for them; "
                             "pass a larger emit_iters or row_arrivals=False")

    def tickets(self, batch: int, cache_dtype=torch.bfloat16) -> int:
        """Tickets of a launch of ``batch`` requests (verify_plan.cuh ``Plan.total``)."""
        _, iters, mult = self.schedule_of(batch)
        _, _, si, e = pieces(self.k, self.vocab, 2 if cache_dtype == torch.bfloat16 else 4, iters, mult)
        return batch * (si + e)

    def _trace_ptr(self, trace, batch, cache_dtype) -> int:
        rows = self.tickets(batch, cache_dtype)
        if trace.shape != (rows, 4) or trace.dtype != torch.int64 or not trace.is_contiguous():
            raise ValueError(f"trace: expected a contiguous [{rows}, 4] int64 tensor, got {tuple(trace.shape)} "
                             f"{trace.dtype}")
        return trace.data_ptr()

    def check(self) -> None:
        """Raise if a waiting emit item of an earlier launch timed out (synchronises); then reset."""
        if int(self.globals[2].item()) != 0:
            self.globals.zero_()
            self.counters.zero_()
            raise DeviceStatusError("CudaVerifier: a waiting item timed out; the outputs of that launch are invalid")

    def run(self, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
            target_greedy=None, *, method: str = "standard", target_temperature=None, tokens=None,
            num_emitted=None, trace=None):
        """Verify a batch: the arguments and outputs of :meth:`.StreamVerifier.run` (validated by the caller;
        ``ValueError`` for a call :meth:`unsupported` rejects). Allocates nothing, never synchronises.

        target_logits ``[B, K+1, V]`` fp32 (raw with ``target_temperature`` ``[S]`` fp32: divided in the kernel,
        bit-identical to pre-divided), draft_tokens ``[B, K]``, logits_cache ``[S, N >= K, V]`` bf16 / fp32,
        num_drafts / idx_mapping / positions ``[B]`` int32 / int64, temperature ``[S]`` fp32, seeds ``[S]`` int64,
        target_greedy ``[B]`` bool or None. Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)``.
        Bytes: ``B ((n+1) V 4 + n V c)`` streamed, the emitted rows re-read, 16 B per piece of partials.

        trace : a profiling aid, ``[tickets(batch), 4]`` int64 (:meth:`tickets`): per ticket its start and end
        ``%globaltimer`` (ns), ``smid + 256 emit + 512 direct`` and the request (``tools/trace_cuda_verify.py``).
        """
        why = self.unsupported(target_logits, draft_tokens, logits_cache, method)
        if why is not None:
            raise ValueError(why)
        batch, tokens, num_emitted, finished = start_run(self, target_logits, method, temperature, tokens,
                                                         num_emitted)
        if finished:
            return tokens, num_emitted
        lag, iters, mult = self.schedule_of(batch)
        raw = target_temperature is not None
        bf16 = logits_cache.dtype == torch.bfloat16
        flags = ((_FLAGS["has_greedy"] if target_greedy is not None else 0) | (_FLAGS["raw"] if raw else 0)
                 | (_FLAGS["cache_bf16"] if bf16 else 0)
                 | (_FLAGS["drafts_i64"] if draft_tokens.dtype == torch.int64 else 0)
                 | (_FLAGS["idx_i64"] if idx_mapping.dtype == torch.int64 else 0)
                 | (_FLAGS["nd_i64"] if num_drafts.dtype == torch.int64 else 0)
                 | (_FLAGS["pos_i64"] if positions.dtype == torch.int64 else 0)
                 | (_FLAGS["static"] if self.static else 0) | (_FLAGS["row_arrivals"] if self.row_arrivals else 0)
                 | (_FLAGS["queue"] if self.queue else 0))
        greedy = target_greedy.view(torch.uint8) if target_greedy is not None else self._no_greedy
        d_step = draft_tokens.stride(1) if draft_tokens.dim() == 2 and self.k > 0 else 1
        args = VerifyArgs(
            target=target_logits.data_ptr(), drafts=draft_tokens.data_ptr(), cache=logits_cache.data_ptr(),
            idx=idx_mapping.data_ptr(), nd=num_drafts.data_ptr(), pos=positions.data_ptr(),
            temp=temperature.data_ptr(), seeds=seeds.data_ptr(), greedy=greedy.data_ptr(),
            ttemp=(target_temperature if raw else self._no_temp).data_ptr(), part=self.part.data_ptr(),
            epart=self.epart.data_ptr(), emitp=self.emitp.data_ptr(), counters=self.counters.data_ptr(),
            global_=self.globals.data_ptr(), tokens=tokens.data_ptr(), num_emitted=num_emitted.data_ptr(),
            trace=0 if trace is None else self._trace_ptr(trace, batch, logits_cache.dtype),
            t_req=target_logits.stride(0), t_row=target_logits.stride(1), d_req=draft_tokens.stride(0),
            d_step=d_step, c_slot=logits_cache.stride(0), c_step=logits_cache.stride(1),
            tok_stride=tokens.stride(0), batch=batch, vocab=self.vocab, num_slots=temperature.shape[0], k=self.k,
            flags=flags, lag=lag, emit_iters=iters, piece_mult=mult)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        kernel = KERNELS[(0 if bf16 else 1) + (2 if self.queue else 0)]
        self.kernels.launch(kernel, self.sms * BLOCKS_PER_SM, THREADS, 0, stream, [args])
        return tokens, num_emitted


# --------------------------------------------------------------------------- functional form
_VERIFIERS: dict = {}  # (device, K, V) -> CudaVerifier, grown to the largest batch seen


def cached_cuda_verifier(batch: int, k: int, vocab: int, device) -> CudaVerifier:
    """The persistent :class:`CudaVerifier` of ``(device, K, V)`` with room for ``batch`` requests (the next power
    of two, at least 16; replaced by a larger one when a bigger batch comes, else reused: no scratch per call)."""
    return cached_instance(_VERIFIERS, CudaVerifier, batch, k, vocab, device)


def verify_cuda(target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping, positions, temperature, seeds,
                target_greedy=None, *, method: str = "standard", target_temperature=None):
    """``verify_drafts(impl="cuda")``: the cached :class:`CudaVerifier`, fresh outputs (inputs validated by the caller).

    ``ValueError`` naming ``impl`` where it cannot run: not a CUDA tensor, :func:`unavailable_reason`, or a call
    outside its scope (:meth:`CudaVerifier.unsupported`: the block method, K > 7, V not a multiple of 8, rows not
    16-byte aligned); ``impl="triton"`` covers those. Only the two outputs (``[B, K+1]``, ``[B]`` int64) are
    allocated per call; for CUDA graphs capture :meth:`CudaVerifier.run` with your own outputs.
    """
    _, k1, vocab = target_logits.shape
    if target_logits.device.type != "cuda":
        raise ValueError(f"impl: 'cuda' verifies CUDA tensors, got target_logits on {target_logits.device}")
    why = scope_reason(k1 - 1, vocab)
    if why is not None:
        raise ValueError(f"impl: 'cuda' cannot run here: {why}; impl='triton' can")
    why = CudaVerifier.unsupported(target_logits, draft_tokens, logits_cache, method)
    if why is not None:
        raise ValueError(f"impl: 'cuda' does not cover this call ({why}); impl='triton' does")
    return run_fresh(cached_cuda_verifier, target_logits, draft_tokens, logits_cache, num_drafts, idx_mapping,
                     positions, temperature, seeds, target_greedy, method, target_temperature)
