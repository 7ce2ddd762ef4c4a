"""Draw with every draft design at full shapes; save the tokens and a digest of every cache bit.

Run it once per tree (``PYTHONPATH=<old tree>/src`` and the current ``src``) on the same GPU, then
compare with ``tools/draws_compare.py old.json new.json``: a refactoring that must not change what
a design draws shows 0 differing tokens and identical caches. This is how the ops/ restructuring
(issue 15) was checked on the H200 (13 cases, all bit-identical).

Usage: ``python tools/draws_digest.py OUT.json [impl,impl,...]`` (needs CUDA).
"""
import hashlib
import json
import sys

import torch

import dspark_markov as dm

VOCAB, RANK, STEPS = 129_280, 256, 5
out_path = sys.argv[1]
cases = [("loop", "gumbel", (1, 64)), ("gumbel_fused", "gumbel", (1, 64)),
         ("inverse_cdf", "inverse_cdf", (1, 64)), ("fused", "gumbel", (1, 64)),
         ("fused", "inverse_cdf", (1, 64)), ("chain", "gumbel", (1, 16)), ("stream", "gumbel", (64,))]
if len(sys.argv) > 2:
    cases = [c for c in cases if c[0] in sys.argv[2].split(",")]
gen = torch.Generator(device="cuda").manual_seed(7)
embed = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
head_w = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
head = dm.MarkovHead(embed, head_w)
results = {}
for impl, method, all_rows in cases:
    for rows in all_rows:
        g = torch.Generator(device="cuda").manual_seed(rows)
        base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=g) * 2).bfloat16()
        slots = torch.arange(rows, device="cuda")
        if rows > 2:
            slots[rows // 2] = -1
        idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
        pos = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=g)
        temps = torch.tensor([1.0, 0.6, 0.0, 1.3], device="cuda")[torch.arange(rows, device="cuda") % 4].contiguous()
        seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=g)
        anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=g)
        key = f"{impl}/{method}/{rows}"
        try:
            sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method=method, impl=impl)
            out = sampler.sample(base, anchor, idx, pos, temps, seeds)
            torch.cuda.synchronize()
            cache = out.logits_cache.view(torch.int16).cpu().numpy().tobytes()
            results[key] = {"tokens": out.draft_tokens.cpu().tolist(), "cache": hashlib.sha256(cache).hexdigest(),
                            "greedy_rows": (temps == 0).cpu().tolist()}
        except Exception as error:  # record and go on: one failure must not hide the others
            results[key] = {"error": f"{type(error).__name__}: {error}"}
        print(key, "error" if "error" in results[key] else "ok", flush=True)
        json.dump(results, open(out_path, "w"))  # after every case: a timeout keeps what was drawn
