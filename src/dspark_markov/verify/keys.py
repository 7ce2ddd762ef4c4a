"""Counter-based keys of verification (SPEC.md section 6): acceptance uniforms and resampling noise.

Verification draws two kinds of randomness per request and emitted position ``P``:

- one **acceptance uniform** ``u`` per draft (standard verification) or per block prefix (block
  verification), hash domain :data:`ACCEPT_DOMAIN`;
- **resampling noise** ``g[v]`` per vocabulary entry for the token drawn after a rejection (from
  the residual distribution) or as the bonus (from the target distribution), hash domain
  :data:`RESAMPLE_DOMAIN`, drawn by Gumbel-max over ``log`` of the distribution.

Both are keyed by the slot's seed and ``P - 1`` (the position of the token that conditions ``P``,
the convention of the target's own stream), with the token word the column id for the noise and
:data:`ACCEPT_TOKEN` for the uniform. The draft noise (``rng.draft_noise``) hashes with domain 0,
a step-salted seed and ``P - 1 + 2**30``; fp64 draft noise adds :data:`rng.GOLDEN_DOMAIN`. The
two verification domains differ from both, so MurmurHash3 gives verification words that are
unrelated to every draft word, whatever the seed, step or position: drafts and their verification
never share noise (the "noise shared between drafts and residual resampling" bug of ANCHORS.md).

Each position is emitted once per request (the next round starts after the last emitted token),
so every emitted decision uses keys that no earlier decision of that request used.
"""

from __future__ import annotations

import torch

from .. import rng

ACCEPT_DOMAIN = 0x243F6A88  # hash seed of acceptance uniforms (first fraction digits of pi)
RESAMPLE_DOMAIN = 0x85A308D3  # hash seed of residual/bonus Gumbel noise (the next pi digits)
ACCEPT_TOKEN = 0xFFFFFFFF  # token word of the one acceptance uniform per (request, position)

VERIFY_DOMAINS = (ACCEPT_DOMAIN, RESAMPLE_DOMAIN)
assert not set(VERIFY_DOMAINS) & {0, rng.GOLDEN_DOMAIN}, "verification domains must differ from draft domains"


def verify_key_pos(position) -> torch.Tensor:
    """Key position of a decision about the token at position ``P``: ``P - 1`` (int64, unsalted)."""
    return rng._as_int64(position) - 1


def accept_uniform(seed, position) -> torch.Tensor:
    """fp32 acceptance uniform in (0, 1] for the token at ``position`` (broadcast, int64 inputs).

    ``uniform32(murmur3(seed, P - 1, ACCEPT_TOKEN, domain=ACCEPT_DOMAIN))``.
    """
    h = rng.murmur3_hash32(seed, verify_key_pos(position), ACCEPT_TOKEN, domain=ACCEPT_DOMAIN)
    return rng.uniform32(h)


def resample_noise(seed, position, token) -> torch.Tensor:
    """fp32 Gumbel noise for the residual or bonus draw of the token at ``position``.

    ``seed`` and ``position`` are per-row ``[B, 1]`` int64 tensors, ``token`` the column ids ``[V]``;
    returns ``[B, V]`` fp32 ``gumbel32(uniform32(murmur3(seed, P - 1, v, domain=RESAMPLE_DOMAIN)))``.
    """
    h = rng.murmur3_hash32(seed, verify_key_pos(position), token, domain=RESAMPLE_DOMAIN)
    return rng.gumbel32(rng.uniform32(h))
