"""Diagnose ``cuda_wide(tensor_cores=True)`` (``wide_tc.cu``) on one GPU: where its cache and partials differ.

Usage (GPU): ``DSPARK_MARKOV_UNVERIFIED=cuda_wide PYTHONPATH=src python3 tools/check_wide_tc.py [--rows 1,64,130,253]``

Per batch size, one step (N = 1, T = 1, every row live): the cache the wgmma step wrote against the torch value
``round_bf16(U + round_bf16(W1[anchor] @ W2^T))`` (fp32 accumulation in torch's order: equal up to the bias's
summation order), and the token drawn against the mma.sync ``_icdf`` step's. On a mismatch it prints the fraction of
equal entries per m-tile row and 64-token tile column and, for the first wrong (row, token)s, which reference
(row, token) of the same 64 x 64 item holds the written value: a permuted fragment mapping shows up as a fixed
offset. Prints "OK" per size when >= 99% of the entries equal the torch value.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_markov as dm  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,64,130,253")
    args = parser.parse_args()
    vocab, rank = 129_280, 256
    gen = torch.Generator(device="cuda").manual_seed(5)
    embed = (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16()
    w2 = (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.05).bfloat16()
    head = dm.MarkovHead(embed, w2)
    for rows in [int(x) for x in args.rows.split(",")]:
        base = (torch.randn(rows, 1, vocab, device="cuda", generator=gen) * 2).bfloat16()
        anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        idx = torch.arange(rows, device="cuda")
        pos = torch.randint(1, 1 << 20, (rows,), device="cuda", generator=gen)
        temp = torch.ones(rows, device="cuda")
        seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
        out = {}
        for label, kwargs in (("tc", {"tensor_cores": True}), ("mma", {})):
            sampler = dm.MarkovSampler(head, 1, rows, method="inverse_cdf", impl="cuda_wide")
            sampler.backend = type(sampler.backend)(head, 1, rows, method="inverse_cdf", cache_dtype=torch.bfloat16,
                                                    device="cuda", **kwargs)
            tokens = torch.full((rows, 1), -1, dtype=torch.int64, device="cuda")
            cache = torch.full((rows, 1, vocab), 7.0, dtype=torch.bfloat16, device="cuda")
            sampler.sample(base, anchor, idx, pos, temp, seeds, draft_tokens=tokens, logits_cache=cache)
            torch.cuda.synchronize()
            part = sampler.backend.part[:rows].clone()
            out[label] = (tokens.clone(), cache.clone(), part)
        bias = (embed[anchor].float() @ w2.float().T).bfloat16().float()
        want = (base[:, 0].float() + bias).bfloat16()
        got = out["tc"][1][:, 0]
        equal = got == want
        frac = float(equal.float().mean())
        same_tokens = float((out["tc"][0] == out["mma"][0]).float().mean())
        print(f"rows {rows}: cache equal to torch {frac:.5f}, mma.sync step's cache equal to torch "
              f"{float((out['mma'][1][:, 0] == want).float().mean()):.5f}, tokens equal to the mma.sync step's "
              f"{same_tokens:.3f}; partial max equal {float((out['tc'][2][:, :, 0] == out['mma'][2][:, :, 0]).float().mean()):.4f}"
              f"  {'OK' if frac >= 0.99 else 'WRONG'}", flush=True)
        if frac >= 0.99:
            continue
        ntiles = -(-vocab // 64)
        per_row = equal.float().mean(dim=1)
        print("  equal fraction by row (first 16):", [round(float(x), 3) for x in per_row[:16]])
        cols = equal[:, : ntiles * 64 - (ntiles * 64 - vocab)].float()
        by_col = [round(float(cols[:, c:c + 64].mean()), 3) for c in range(0, 64 * 8, 64)]
        print("  equal fraction of the first 8 token tiles:", by_col)
        by_col_in_tile = [round(float(equal[:, c::64].float().mean()), 3) for c in range(64)]
        print("  equal fraction by token position in a tile:", by_col_in_tile)
        wrong = (~equal).nonzero()[:6].tolist()
        for r, t in wrong:
            r0, t0 = (r // 64) * 64, (t // 64) * 64
            block = want[r0:r0 + 64, t0:t0 + 64]
            hits = (block == got[r, t]).nonzero().tolist()[:4]
            print(f"  ({r}, {t}): wrote {float(got[r, t])!r}, want {float(want[r, t])!r}; that value at item offsets "
                  f"{[(r0 + a, t0 + b) for a, b in hits]}")


if __name__ == "__main__":
    main()
