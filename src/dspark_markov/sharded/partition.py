"""How the vocabulary is split across ranks.

Rank ``k`` of ``world`` owns the W2 rows (and cache columns) ``[k V // world, (k + 1) V // world)``.
Shard widths differ by at most one token when ``world`` does not divide ``V``; every shard is
non-empty when ``V >= world``. The rule depends only on ``(V, world, k)``, so every rank computes
every other rank's bounds without communicating.
"""

from __future__ import annotations


def shard_bounds(vocab: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s vocabulary shard (global token ids, end exclusive)."""
    vocab, world, rank = int(vocab), int(world), int(rank)
    if world < 1:
        raise ValueError(f"world: expected >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected a value in [0, {world}), got {rank}")
    if vocab < world:
        raise ValueError(f"vocab: expected V >= world size {world} so that every shard is non-empty, got {vocab}")
    return rank * vocab // world, (rank + 1) * vocab // world


def all_shard_bounds(vocab: int, world: int) -> list[tuple[int, int]]:
    """The bounds of every rank, in rank order."""
    return [shard_bounds(vocab, world, rank) for rank in range(world)]


def max_shard_width(vocab: int, world: int) -> int:
    """The widest shard: ``ceil(V / world)``; padding width of equal-size collectives."""
    return max(end - start for start, end in all_shard_bounds(vocab, world))
