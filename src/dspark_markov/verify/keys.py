"""Counter-based keys of verification (SPEC.md section 6): acceptance uniforms and resampling noise.

Verification draws two kinds of randomness per request and round:

- one **acceptance uniform** ``u_i`` per draft index ``i`` (standard verification compares it with
  ``p_i(x_i) / q_i(x_i)``, block verification with ``h_i``), hash domain :data:`ACCEPT_DOMAIN`,
  keyed by the seed, the round's anchor position ``P - 1`` (``P`` = ``positions[b]``, the position
  of the round's first draft) and the token word ``i``;
- **resampling noise** ``g[v]`` per vocabulary entry for the one token drawn after the accepted
  prefix (from the residual distribution, or the bonus from the target distribution), hash domain
  :data:`RESAMPLE_DOMAIN`, keyed by the seed, ``P_e - 1`` for the emitted position ``P_e`` and the
  token word ``v``; drawn by Gumbel-max over ``log`` of the distribution.

Why the uniforms are keyed by the round and not by the draft's own position: block verification
reads every ``u_i`` of the round (it keeps the longest prefix whose test passes), so uniforms past
the accepted prefix are *known to have failed* once the round is over. The next round starts right
after the emitted token, i.e. at a position that such a failed uniform was keyed by; a key
``(seed, position of the draft)`` would reuse it, conditioned to be large, and bias the next round.
Rounds of a request start at strictly increasing positions, so ``(seed, P - 1, i)`` never repeats.
The resampling noise is read only for the emitted row, and each position is emitted once per
request, so keying it by the emitted position is safe.

The draft noise (``rng.draft_noise``) hashes with domain 0, a step-salted seed and
``P - 1 + 2**30``; fp64 draft noise adds :data:`rng.GOLDEN_DOMAIN`. The two verification domains
differ from both, so MurmurHash3 gives verification words unrelated to every draft word, whatever
the seed, step or position: drafts and their verification never share noise (the "noise shared
between drafts and residual resampling" bug of ANCHORS.md).
"""

from __future__ import annotations

import torch

from .. import rng

ACCEPT_DOMAIN = 0x243F6A88  # hash seed of acceptance uniforms (first fraction digits of pi)
RESAMPLE_DOMAIN = 0x85A308D3  # hash seed of residual/bonus Gumbel noise (the next pi digits)

VERIFY_DOMAINS = (ACCEPT_DOMAIN, RESAMPLE_DOMAIN)
assert not set(VERIFY_DOMAINS) & {0, rng.GOLDEN_DOMAIN}, "verification domains must differ from draft domains"


def verify_key_pos(position) -> torch.Tensor:
    """Key position of a decision about the token at position ``P``: ``P - 1`` (int64, unsalted)."""
    return rng._as_int64(position) - 1


def accept_uniforms(seed, position, count: int) -> torch.Tensor:
    """fp32 acceptance uniforms in (0, 1] of a round whose first draft predicts ``position``.

    ``seed`` and ``position`` are per-request ``[B, 1]`` int64 tensors; returns ``[B, count]``:
    ``u_i = uniform32(murmur3(seed, P - 1, i, domain=ACCEPT_DOMAIN))`` for ``i < count``.
    """
    index = torch.arange(count, device=rng._as_int64(seed).device)
    h = rng.murmur3_hash32(seed, verify_key_pos(position), index, domain=ACCEPT_DOMAIN)
    return rng.uniform32(h)


def resample_noise(seed, position, token) -> torch.Tensor:
    """fp32 Gumbel noise for the residual or bonus draw of the token at ``position``.

    ``seed`` and ``position`` are per-row ``[B, 1]`` int64 tensors, ``token`` the column ids ``[V]``;
    returns ``[B, V]`` fp32 ``gumbel32(uniform32(murmur3(seed, P - 1, v, domain=RESAMPLE_DOMAIN)))``.
    """
    h = rng.murmur3_hash32(seed, verify_key_pos(position), token, domain=RESAMPLE_DOMAIN)
    return rng.gumbel32(rng.uniform32(h))
