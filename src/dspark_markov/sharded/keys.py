"""One 64-bit word per (rank, row) that orders candidates exactly like ``torch.argmax``.

A rank's best candidate is a Gumbel key ``k`` (fp32) at a global token id ``v``. Packing

    packed = (ordered(k) << 32) | (0xFFFFFFFF - v)        (int64, two's complement)

makes the *largest* packed word the global winner under SPEC.md section 4's rules:

- ``ordered`` maps fp32 to int32 monotonically (negative floats have their low 31 bits flipped),
  after turning ``-0.0`` into ``+0.0`` (argmax treats them as equal) and every NaN into
  ``INT32_MAX`` (a NaN beats every number);
- equal keys (and equal NaN codes) tie-break on the low word, where the smaller token id is larger:
  the first maximum / the first NaN wins;
- an all ``-inf`` vocabulary: every rank's local argmax is its first token, and the smallest
  global id, 0, wins.

So the winner is a plain integer maximum over ranks: one ``all_reduce(MAX)`` or an all-gather and a
local ``amax``. Token ids must be below ``2**32``.
"""

from __future__ import annotations

import torch

LOW_MASK = 0xFFFFFFFF
INT32_MAX = 0x7FFFFFFF


def ordered_int32(key: torch.Tensor) -> torch.Tensor:
    """fp32 ``key`` -> int32 with the same order (``-0.0 == +0.0``, NaN above ``+inf``)."""
    key = key.float() + 0.0  # IEEE: -0.0 + 0.0 = +0.0, so both zeros share one code
    bits = key.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ INT32_MAX, bits)
    return torch.where(torch.isnan(key), torch.full_like(ordered, INT32_MAX), ordered)


def pack_keys(key: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Pack fp32 keys ``[R]`` and global token ids ``[R]`` (int64, ``< 2**32``) into int64 ``[R]``."""
    return (ordered_int32(key).to(torch.int64) << 32) + (LOW_MASK - token.to(torch.int64))


def unpack_token(packed: torch.Tensor) -> torch.Tensor:
    """Global token id (int64) of a packed word."""
    return LOW_MASK - (packed & LOW_MASK)


def winner_token(gathered: torch.Tensor) -> torch.Tensor:
    """Winner token ids ``[R]`` from the packed words of every rank, ``[world, R]``."""
    return unpack_token(gathered.amax(dim=0))


def unpack_key(packed: torch.Tensor) -> torch.Tensor:
    """The fp32 key of a packed word (NaN keys come back as a NaN; ``-0.0`` as ``+0.0``)."""
    ordered = (packed >> 32).to(torch.int32)
    bits = torch.where(ordered < 0, ordered ^ INT32_MAX, ordered)
    return bits.view(torch.float32)
