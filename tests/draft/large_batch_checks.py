"""Checks shared by the large-batch designs' CPU tests (``stream`` and ``wide``): each takes a
``make_sampler(head, steps, rows)`` that builds the design's inverse-CDF sampler (fp32 cache) with the
vocabulary tiles the check's docstring names; ``skewed_problem`` gives the Gumbel skip inputs."""

import math

import torch

import dspark_markov as dm
from tests.helpers import make_problem, same_bits


def inverse_cdf_chi_square(make_sampler):
    """600 draws over V = 32 in 2 tiles of 16 (one -inf token, never drawn); df + 10 sqrt(2 df)."""
    vocab, rows, steps = 32, 40, 5
    gen = torch.Generator().manual_seed(4)
    head = dm.MarkovHead(torch.randn(vocab, 16, generator=gen), torch.zeros(vocab, 16))
    logits = torch.randn(vocab, generator=gen) * 0.5
    logits[10] = float("-inf")
    base = logits.expand(rows, steps, vocab)
    temperature = torch.tensor([1.0, 0.6]).repeat(rows // 2)
    sampler = make_sampler(head, steps, rows)
    observed = torch.zeros(vocab, dtype=torch.float64)
    expected = torch.zeros(vocab, dtype=torch.float64)
    for call in range(3):
        out = sampler.sample(base, torch.zeros(rows, dtype=torch.long), torch.arange(rows).repeat_interleave(steps),
                             torch.randint(0, 2**31, (rows * steps,), generator=gen), temperature,
                             torch.arange(rows) + 1000 * call)
        for temp in (1.0, 0.6):
            drawn = out.draft_tokens[temperature == temp].flatten()
            assert not bool((drawn == 10).any())
            observed += torch.bincount(drawn, minlength=vocab).double()
            expected += torch.softmax((logits / temp).double(), dim=0) * drawn.numel()
    keep = expected > 0
    chi2 = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    df = int(keep.sum()) - 1
    assert chi2 < df + 10 * math.sqrt(2 * df), (chi2, df)


def inverse_cdf_special_rows(make_sampler):
    """NaN, +inf, all -inf, huge and masked rows at T > 0 (z = base exactly: W2 = 0), three tiles of 256."""
    vocab, rows = 600, 8
    gen = torch.Generator().manual_seed(3)
    head = dm.MarkovHead(torch.randn(vocab, 16, generator=gen), torch.zeros(vocab, 16))
    base = torch.randn(rows, 1, vocab, generator=gen)
    z = base[:, 0]
    z[0, [300, 37]] = float("nan")
    z[1] = float("-inf")
    z[2, [513, 450]] = float("inf")
    z[3] = torch.randn(vocab, generator=gen) * 3e37
    z[3, 444] = 3.4e38
    z[4] = float("-inf")
    z[4, [5, 590]] = 0.0
    z[5] = float("-inf")
    z[5, 400] = -3.0e38
    z[6, 1::2] = float("-inf")
    z[7, :256] = float("-inf")
    temperature = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.6, 1.0, 0.6, 1.0])
    sampler = make_sampler(head, 1, rows)
    out = sampler.sample(base, torch.zeros(rows, dtype=torch.long), torch.arange(rows), torch.arange(rows) + 1,
                         temperature, torch.arange(rows) * 1000 + 1)
    tokens = out.draft_tokens[:, 0]
    assert tokens[0] == 37 and tokens[1] == 0 and tokens[2] == 450 and tokens[3] == 444
    assert int(tokens[4]) in (5, 590) and tokens[5] == 400
    assert tokens[6] % 2 == 0 and tokens[7] >= 256
    assert same_bits(out.logits_cache[:, 0], z)


def skewed_problem(winner_tile, device, rows=3, vocab=512):
    """Rows whose leading logits make later tiles of 64 provably lose (tile skips and token filter engage)."""
    head, args = make_problem(vocab, 16, rows, 2, temps=(1.0, 0.6, 0.0), padding_row=None, seed=2, device=device)
    base = args[0].float()
    base[0, :, 3] = 60.0  # tile 0 leads by far: every later tile (of the program) skipped as a whole
    base[1, :, 70] = 40.0  # tile 1 leads, tile 0 computed first, later tiles skipped
    base[1, :, 64 * winner_tile + 5] = 41.0  # a contender that must not be skipped
    base[2, :, 64 * winner_tile + 9] = 25.0  # T = 0: greedy words skip by z alone
    args[0] = base
    return head, args
