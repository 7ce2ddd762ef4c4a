"""How ranks exchange their per-row winners: one packed int64 word per rank and row.

Transports (``transport=`` of :class:`~dspark_markov.sharded.ShardedMarkovSampler`):

- ``"collective"`` (alias ``"nccl"``): ``torch.distributed.all_gather`` of the ``[R]`` words into a
  persistent ``[world, R]`` buffer, then an ``amax`` over ranks. Works with every backend (gloo on
  the CPU, NCCL on GPUs); it is the reference transport and the fallback of the others.
- ``"all_reduce"``: one ``all_reduce(MAX)`` of the words (half the received bytes, no local max).
- ``"symm_mem"``: ``torch.distributed._symmetric_memory`` peer buffers on CUDA: every rank stores
  its words straight into each peer's buffer, then a device-side barrier with a bounded wait
  (``timeout_ms``) orders the stores before the reads. No host round trip, no NCCL launch.

Set-up agreement (:func:`install_transport`): every rank first prepares its transport *locally*
(imports, device checks, allocations: nothing collective), then all ranks all-reduce a "can
install" flag with MIN. Only if every rank can, they run the transport's collective connection
step (the symmetric-memory rendezvous) and agree once more. If any rank cannot, all of them fall
back together to ``"collective"``; if the collective transport itself cannot be installed, all of
them raise ``RuntimeError`` together. No rank is ever left waiting in a collective the others skip.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..validate import DeviceStatusError
from .keys import unpack_token, winner_token

TRANSPORTS = ("collective", "nccl", "all_reduce", "symm_mem")
FALLBACK = "collective"


class TransportUnavailable(RuntimeError):
    """A transport cannot be installed on this rank (the reason is the message)."""


def _canonical(name: str) -> str:
    return "collective" if name == "nccl" else name


class CollectiveTransport:
    """All-gather of the packed words (any backend). ``exchange`` launches one collective.

    Buffers: ``[world, max_rows]`` int64 allocated once. Bytes received per exchange: ``8 world R``.
    """

    name = "collective"

    def __init__(self, group, world: int, rank: int, max_rows: int, num_steps: int, device, timeout_ms: int):
        self.group = group
        self.world = world
        self.gathered = torch.empty(world, max_rows, dtype=torch.int64, device=device)  # [world, max_rows]

    def connect(self):
        pass

    def exchange(self, packed: torch.Tensor, step: int) -> torch.Tensor:
        """Winner token ids ``[R]`` int64 from this rank's packed words ``[R]`` int64."""
        rows = packed.shape[0]
        views = [self.gathered[peer, :rows] for peer in range(self.world)]  # each [R], contiguous
        dist.all_gather(views, packed.contiguous(), group=self.group)
        return winner_token(self.gathered[:, :rows])


class AllReduceTransport:
    """One ``all_reduce(MAX)`` of the packed words. Buffer: ``[max_rows]`` int64; bytes ``~8 R`` per hop."""

    name = "all_reduce"

    def __init__(self, group, world: int, rank: int, max_rows: int, num_steps: int, device, timeout_ms: int):
        self.group = group
        self.reduced = torch.empty(max_rows, dtype=torch.int64, device=device)  # [max_rows]

    def connect(self):
        pass

    def exchange(self, packed: torch.Tensor, step: int) -> torch.Tensor:
        rows = packed.shape[0]
        reduced = self.reduced[:rows]
        reduced.copy_(packed)
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=self.group)
        return unpack_token(reduced)


class SymmMemTransport:
    """Peer stores into symmetric memory plus a bounded device barrier (CUDA only).

    Layout: each rank allocates ``[B, world, max_rows]`` int64 of symmetric memory, ``B = max(N, 2)``
    buffers, one per draft step. At step ``i`` rank ``k`` writes its words into row ``k`` of buffer
    ``i`` on *every* rank (itself included), then ``barrier(timeout_ms)`` (release/acquire on the
    device), then reads its own buffer ``i`` ``[world, R]`` and takes the max. A buffer is rewritten
    only one call later (same step) and a rank gets there only through the barriers of the steps
    in between, which each peer passes only after reading it, so no read can see a half-written
    buffer. With ``N = 1`` the only buffer is reused by the next call, so a second barrier follows
    the read. Step indices, not a host counter, pick the buffer: a CUDA graph replays correctly.

    Bounded wait: a barrier that does not complete within ``timeout_ms`` traps on the device (it
    never spins forever); the trap surfaces as a ``RuntimeError`` at the next synchronisation.
    Bytes per exchange: ``8 R`` stored to each peer over NVLink, plus the barrier's signals.
    """

    name = "symm_mem"

    def __init__(self, group, world: int, rank: int, max_rows: int, num_steps: int, device, timeout_ms: int):
        device = torch.device(device)
        if device.type != "cuda":
            raise TransportUnavailable(f"symm_mem needs CUDA tensors, the weights are on {device}")
        try:
            import torch.distributed._symmetric_memory as symm_mem
        except Exception as error:  # torch without symmetric memory
            raise TransportUnavailable(f"torch.distributed._symmetric_memory is unavailable ({error})") from error
        backend = str(dist.get_backend(group))
        if "nccl" not in backend:
            raise TransportUnavailable(f"symm_mem needs an NCCL process group, got backend {backend!r}")
        self.symm_mem = symm_mem
        self.group = group
        self.world = world
        self.rank = rank
        self.timeout_ms = int(timeout_ms)
        self.num_buffers = max(int(num_steps), 2)
        self.single_step = int(num_steps) == 1
        self.shape = (self.num_buffers, world, max_rows)
        try:
            self.local = symm_mem.empty(*self.shape, dtype=torch.int64, device=device)  # [B, world, max_rows]
        except Exception as error:
            raise TransportUnavailable(f"cannot allocate symmetric memory ({error})") from error
        self.handle = None
        self.peers = None

    def connect(self):
        """The collective part: rendezvous with every rank and map the peers' buffers."""
        group_name = self.group.group_name
        enable = getattr(self.symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # required before rendezvous on older torch, a no-op/deprecated later
            try:
                enable(group_name)
            except Exception:
                pass
        try:
            self.handle = self.symm_mem.rendezvous(self.local, self.group)
        except TypeError:  # torch versions whose rendezvous takes the group name
            self.handle = self.symm_mem.rendezvous(self.local, group_name)
        self.peers = [self.handle.get_buffer(peer, self.shape, torch.int64) for peer in range(self.world)]
        self.local.fill_(0)
        self.handle.barrier(channel=0, timeout_ms=self.timeout_ms)

    def exchange(self, packed: torch.Tensor, step: int) -> torch.Tensor:
        rows = packed.shape[0]
        index = step % self.num_buffers
        for peer in range(self.world):
            self.peers[peer][index, self.rank, :rows].copy_(packed)
        self.handle.barrier(channel=0, timeout_ms=self.timeout_ms)
        winner = winner_token(self.local[index, :, :rows])
        if self.single_step:  # the next call rewrites this buffer: wait until every peer has read it
            self.handle.barrier(channel=0, timeout_ms=self.timeout_ms)
        return winner


_CLASSES = {"collective": CollectiveTransport, "all_reduce": AllReduceTransport, "symm_mem": SymmMemTransport}


def flag_device(group, device) -> torch.device:
    """Where the group's backend takes tensors for the small set-up all-reduces (``device`` None: a call whose
    arguments hold no tensor, e.g. one rejected on this rank; the current CUDA device where there is one)."""
    backend = str(dist.get_backend(group))
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    if "gloo" in backend or torch.device(device).type == "cpu":
        return torch.device("cpu")
    return torch.device(device)


def agree(ok: bool, group, device) -> bool:
    """All-reduce MIN of a local success flag: ``True`` iff every rank succeeded."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def agree_call(error, rows: int, group, device, mismatch: str) -> None:
    """Agree one call's local checks: one all-reduce (MIN) of ``[failing rank or world, rows, -rows]``.

    Raises on every rank, together: the lowest failing rank's error (its message broadcast to all; ``ValueError``
    and ``DeviceStatusError`` keep their type, others become ``RuntimeError``), or ``ValueError(mismatch + ...)``
    when the ranks' ``rows`` differ. ``rows`` is ignored (pass any) on a failing rank.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    votes = torch.tensor([rank if error is not None else world, rows, -rows], dtype=torch.int64, device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=group)
    first, low, high = int(votes[0]), int(votes[1]), -int(votes[2])
    if first < world:
        # The failing rank's message reaches every rank (only on this error path: one broadcast).
        message = [f"{type(error).__name__}: {error}" if rank == first else None]
        dist.broadcast_object_list(message, src=dist.get_global_rank(group, first), group=group)
        kind, _, text = message[0].partition(": ")
        cls = {"ValueError": ValueError, "DeviceStatusError": DeviceStatusError}.get(kind, RuntimeError)
        text = text if cls is not RuntimeError else message[0]
        raise cls(f"{text} (rejected on rank {first} of {world}; every rank raises this)") from error
    if low != high:
        raise ValueError(f"{mismatch} (from {low} to {high}); every rank must pass the same rows")


def _build(name, args, fail_for_test: bool):
    if fail_for_test:
        raise TransportUnavailable("set-up failure injected by _fail_setup_for_test")
    return _CLASSES[name](*args)


def install_transport(requested: str, group, world: int, rank: int, max_rows: int, num_steps: int, device,
                      timeout_ms: int, *, _fail_setup_for_test: bool = False):
    """Install ``requested`` on every rank or, together, fall back (see the module docstring).

    Returns ``(transport, reason)``: ``reason`` is ``None`` when ``requested`` was installed, else why
    the ranks fell back to ``"collective"`` (the same text on every rank is not guaranteed, the
    decision is). Raises ``RuntimeError`` on every rank if the fallback cannot be installed either.
    """
    name = _canonical(requested)
    flags_on = flag_device(group, device)
    args = (group, world, rank, max_rows, num_steps, device, timeout_ms)
    transport, reason = None, None
    try:
        transport = _build(name, args, _fail_setup_for_test)
    except Exception as error:  # noqa: BLE001 - any local failure becomes a vote against
        reason = f"rank {rank}: {error}"
    if agree(transport is not None, group, flags_on):
        connected = True
        try:
            transport.connect()
        except Exception as error:  # noqa: BLE001
            connected, reason = False, f"rank {rank}: connect failed ({error})"
        if agree(connected, group, flags_on):
            return transport, None
    reason = reason or "another rank could not install it"
    if name == FALLBACK:
        raise RuntimeError(f"transport: the collective transport could not be installed on every rank ({reason})")
    fallback = CollectiveTransport(*args)
    return fallback, f"transport {requested!r} unavailable, every rank uses 'collective': {reason}"
