"""Shared checks for draft samplers: replay the reference on a sampler's own outputs.

SPEC.md section 3: the bias may differ from the reference in its last bit, the draw may not. So
:func:`check_against_reference` walks the steps with the sampler's own tokens as ``prev``, checks
each cached row against the reference logits within one rounding of the bias, and checks each
Gumbel token bit for bit against the reference draw from the sampler's own cached row.
"""

import torch

from dspark_markov.draft import reference


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``x`` rounded to ``dtype`` (as fp32)."""
    mantissa_bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    exponent = torch.frexp(x.float().abs().clamp_min(1e-30))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - mantissa_bits)


def check_against_reference(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, out, *,
                            method="gumbel", exact_cache=False):
    """Assert that ``out`` (a DraftOutput) is what the reference draws from its own cache."""
    rows, steps, _ = base_logits.shape
    slots = idx_mapping.view(rows, steps)
    pos = positions.view(rows, steps)
    cache_dtype = out.logits_cache.dtype
    prev = anchor.long().clamp(0, head.embed_vocab_size - 1)
    for step in range(steps):
        padding, temp, seed, position = reference.row_keys(slots[:, step], pos[:, step], temperature, seeds)
        bias = head.bias(prev)
        want = (base_logits[:, step].float() + bias.float()).to(cache_dtype)
        live = ~padding
        got = out.logits_cache[slots[live, step].long(), step]
        if exact_cache:
            assert torch.equal(got, want[live]), f"step {step}: cache differs from the reference"
        else:
            # one rounding of the accumulated bias, possibly doubled by the rounding after scale
            tolerance = 2 * ulp(bias[live], head.dtype) + ulp(want[live], cache_dtype)
            both_nan = torch.isnan(got.float()) & torch.isnan(want[live].float())
            same = (got.float() == want[live].float()) | both_nan
            close = (got.float() - want[live].float()).abs() <= tolerance
            assert bool((same | close).all()), f"step {step}: cache off by more than one bias rounding"
        # The draw is replayed from the sampler's own cached row; padding rows have none, so they
        # are replayed from the reference row (their draw is the greedy argmax).
        own = want.clone()
        own[live] = got
        if method == "gumbel":
            expected = reference.draw_gumbel(own, temp, seed, step, position)
            assert torch.equal(out.draft_tokens[:, step].cpu(), expected.cpu()), f"step {step}: tokens differ"
        else:
            greedy = temp == 0
            expected = reference.argmax_first(own.float())
            assert torch.equal(out.draft_tokens[greedy, step].cpu(), expected[greedy].cpu()), f"step {step}: greedy tokens differ"
        assert bool(((out.draft_tokens[:, step] >= 0) & (out.draft_tokens[:, step] < base_logits.shape[-1])).all())
        prev = out.draft_tokens[:, step].long()
