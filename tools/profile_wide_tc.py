"""One ``cuda_wide(tensor_cores=True)`` step (N = 1) at full shape, called twice: the second call's kernels are the
ones to profile (``ncu --launch-skip 1 --launch-count 1 --kernel-name regex:dm_wide_tc``).

Usage (GPU): ``DSPARK_MARKOV_UNVERIFIED=cuda_wide PYTHONPATH=src python3 tools/profile_wide_tc.py ROWS [METHOD
[WARPGROUPS]]`` (METHOD: inverse_cdf (default) or gumbel; WARPGROUPS: 2 (default) or 3, ``tc_warpgroups``; bf16 base and
cache, T = 1, the benchmark's N(0, 4) base logits).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_markov as dm  # noqa: E402
from dspark_markov.bench import grid  # noqa: E402


def main():
    rows = int(sys.argv[1])
    method = sys.argv[2] if len(sys.argv) > 2 else "inverse_cdf"
    warpgroups = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    config = grid.BenchConfig()
    gen = torch.Generator(device="cuda").manual_seed(config.seed)
    head = grid.make_head(config, gen)
    vocab = head.vocab_size
    sampler = dm.MarkovSampler(head, 1, rows, method=method, impl="cuda_wide")
    sampler.backend = type(sampler.backend)(head, 1, rows, method=method, cache_dtype=torch.bfloat16, device="cuda",
                                            tensor_cores=True, tc_warpgroups=warpgroups)
    base = (torch.randn(rows, 1, vocab, device="cuda", generator=gen) * 4).bfloat16()
    anchor = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    idx = torch.arange(rows, device="cuda")
    pos = torch.randint(1, 1 << 20, (rows,), device="cuda", generator=gen)
    seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
    temp = torch.ones(rows, device="cuda")
    tokens = torch.zeros(rows, 1, dtype=torch.int64, device="cuda")
    cache = torch.empty(rows, 1, vocab, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        sampler.sample(base, anchor, idx, pos, temp, seeds, draft_tokens=tokens, logits_cache=cache, check_values=False)
    torch.cuda.synchronize()
    print("done", rows, method, warpgroups)


if __name__ == "__main__":
    main()
