"""Near-tie traps for the verifier's emit scan (CPU interpreter and GPU tests).

The emit items rank a row's tokens by cheap noise (``ops.noise.approx_gumbel``: the hardware ``lg2`` on a GPU,
``tl.log2`` in the interpreter) and let exact keys decide. A *trap* is a bonus row (``x + g``) whose two best keys tie
exactly (the smaller token wins) or differ by one ulp, ordered the other way by the cheap keys, so only an emit scan
that notices the near-tie and asks the exact keys draws the reference's token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dspark_markov.ops import noise
from dspark_markov.verify import keys

_BLOCK = 1024


@triton.jit
def _cheap_noise_kernel(seed_ptr, pos_ptr, out_ptr, n, DOMAIN: tl.constexpr, HARDWARE: tl.constexpr,
                        BLOCK: tl.constexpr):
    token = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    prefix = noise.hash_prefix(tl.load(seed_ptr), tl.load(pos_ptr) - 1, DOMAIN)
    tl.store(out_ptr + token, noise.approx_gumbel(noise.uniform32(noise.hash_finish(prefix, token)), HARDWARE),
             mask=token < n)


def resample_noise_pair(seed: torch.Tensor, position: torch.Tensor, vocab: int):
    """(exact, cheap) resampling noise ``[vocab]`` fp32 of one row (``seed``, ``position``: 0-d int64, on the device
    the kernels run on); the cheap noise is the emit scan's on that device."""
    device = seed.device
    token = torch.arange(vocab, device=device)
    exact = keys.resample_noise(seed.view(1, 1), position.view(1, 1), token)[0]
    cheap = torch.empty(vocab, dtype=torch.float32, device=device)
    _cheap_noise_kernel[(triton.cdiv(vocab, _BLOCK),)](seed.view(1), position.view(1), cheap, vocab,
                                                       keys.RESAMPLE_DOMAIN, noise.hardware_log2(device), _BLOCK,
                                                       enable_fp_fusion=False)  # (the verifier's cheap noise)
    return exact, cheap


def _losing_logit(x_win, g_win, g_lose, cheap_win, cheap_lose, tie):
    """A logit whose exact key is the winner's (``tie``) or the float below it and whose cheap key is above the
    winner's cheap key; None when the two tokens' noise errors are too close for that."""
    key_win = x_win + g_win
    want = key_win if tie else torch.nextafter(key_win, torch.full_like(key_win, float("-inf")))
    x = want - g_lose
    for _ in range(8):  # (rounding: step x until x + g lands on the wanted key)
        got = x + g_lose
        if bool(got == want):
            break
        x = torch.nextafter(x, torch.full_like(x, float("inf") if bool(got < want) else float("-inf")))
    if bool(x + g_lose == want) and bool(x + cheap_lose > x_win + cheap_win):
        return x
    return None


def plant_bonus_trap(row: torch.Tensor, exact: torch.Tensor, cheap: torch.Tensor, *, window: int, lane: int,
                     same_lane: bool, tie: bool, floor: float = -60.0, top: float = 5.0, candidates: int = 48):
    """Write a trap into ``row`` (``[V]`` fp32, a bonus row: its keys are ``row + exact``) within tokens
    ``[0, window)``: every logit ``floor``, the winner ``top``, the loser by :func:`_losing_logit`. ``same_lane``: the
    two tokens a multiple of ``lane`` apart (one lane of an emit tile of ``lane`` values), else not. Returns
    ``(winner, loser)``; raises if the noise gives no trap among the ``candidates`` most extreme errors."""
    diff = (cheap - exact)[:window].cpu()
    order = torch.argsort(diff)
    low, high = order[:candidates].tolist(), order.flip(0)[:candidates].tolist()
    pairs = sorted(((float(diff[lose] - diff[win]), win, lose) for win in low for lose in high
                    if win != lose and ((win - lose) % lane == 0) == same_lane and (win < lose or not tie)),
                   reverse=True)
    x_win = torch.tensor(top, device=row.device)
    for _, win, lose in pairs:
        x_lose = _losing_logit(x_win, exact[win], exact[lose], cheap[win], cheap[lose], tie)
        if x_lose is not None:
            row.fill_(floor)
            row[win] = x_win
            row[lose] = x_lose
            return win, lose
    raise AssertionError(f"no trap in [0, {window}) (same_lane={same_lane}, tie={tie})")


def plant_traps(args, specs, *, window: int, lane: int) -> dict:
    """Turn requests of verifier inputs ``args`` (``verify_drafts``' positional list, changed in place) into bonus
    traps: for each ``(b, same_lane, tie)`` of ``specs`` request ``b`` gets no drafts (a sampled slot: T = 0 becomes
    1) and a trap in row 0 (:func:`plant_bonus_trap`). Returns ``{b: the token the exact keys draw}``."""
    target, num_drafts, idx, positions, temperature, seeds = (args[i] for i in (0, 3, 4, 5, 6, 7))
    expect = {}
    for b, same_lane, tie in specs:
        num_drafts[b] = 0  # the bonus keys x + g of row 0
        slot = int(idx[b])
        if float(temperature[slot]) == 0.0:
            temperature[slot] = 1.0
        exact, cheap = resample_noise_pair(seeds[slot], positions[b], target.shape[-1])
        expect[b], _ = plant_bonus_trap(target[b, 0], exact, cheap, window=window, lane=lane, same_lane=same_lane,
                                        tie=tie)
    return expect
