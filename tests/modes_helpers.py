"""Problems and checks of the drafting modes (issue 17): reduced vocabulary (d2t) and top-k drafting.

Shared by tests/draft/test_modes.py (reference, interpreter) and tests/gpu/test_modes_gpu.py.
"""

from __future__ import annotations

import torch

import dspark_markov as dm
from dspark_markov.draft import reference as ref
from dspark_markov.draft.modes_reference import candidate_logits, scatter_row, target_ids

SENTINEL = -7.0


def make_d2t(draft_vocab: int, target_vocab: int, *, seed: int = 0, dtype=torch.int64, device="cpu",
             ordered: bool = False) -> torch.Tensor:
    """A d2t table of distinct target ids in ``[0, target_vocab)`` (EAGLE-3 tables are increasing;
    ``ordered=False`` permutes them to test that no design assumes it)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(target_vocab, generator=g)[:draft_vocab]
    if ordered:
        ids = ids.sort().values
    return (ids - torch.arange(draft_vocab)).to(dtype).to(device)


def exact_head(draft_vocab, target_vocab, rank, *, dtype=torch.bfloat16, scale=1.0, device="cpu", seed=0,
               exact=True, d2t=True, ordered=False):
    """A head whose bias sums are exact in fp32 and in bf16 (weights in 2^-4 steps, |bias| < 1) with
    ``exact``, so any summation order gives the same bits; random normal weights otherwise."""
    g = torch.Generator().manual_seed(seed)
    if exact:
        embed = torch.randint(-3, 4, (target_vocab, rank), generator=g) * 2.0**-4
        head = torch.randint(-3, 4, (draft_vocab, rank), generator=g) * 2.0**-4 / max(1, rank // 16)
    else:
        embed = torch.randn(target_vocab, rank, generator=g) / rank**0.25
        head = torch.randn(draft_vocab, rank, generator=g) / rank**0.25
    table = make_d2t(draft_vocab, target_vocab, seed=seed + 1, device=device, ordered=ordered) if d2t else None
    return dm.MarkovHead(embed.to(dtype).to(device), head.to(dtype).to(device), scale, d2t=table,
                         target_vocab_size=target_vocab if d2t else None)


def modes_inputs(rows, steps, draft_vocab, target_vocab, *, logit_dtype=torch.bfloat16, extra_slots=3, seed=1,
                 device="cpu", temps=(0.0, 0.6, 1.0)):
    """Base logits ``[R, N, V_d]``, anchors (target ids), mixed T, a padding row and a padding sample."""
    g = torch.Generator().manual_seed(seed)
    slots = rows + extra_slots
    base = (torch.randn(rows, steps, draft_vocab, generator=g) * 4).to(logit_dtype).to(device)
    anchor = torch.randint(0, target_vocab, (rows,), generator=g)
    idx = torch.stack([torch.randperm(slots, generator=g)[:rows] for _ in range(steps)], dim=1)
    if rows > 2:
        idx[rows // 2] = -1
    idx[0, steps - 1] = -1
    positions = torch.randint(1, 1 << 20, (rows * steps,), generator=g)
    temperature = torch.tensor(temps, dtype=torch.float32)[torch.arange(slots) % len(temps)]
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    return dict(base_logits=base, anchor=anchor.to(device), idx_mapping=idx.reshape(-1).to(device),
                positions=positions.to(device), temperature=temperature.to(device), seeds=seeds.to(device))


def modes_outputs(head, inputs, cache_dtype):
    rows, steps, _ = inputs["base_logits"].shape
    slots = inputs["temperature"].shape[0]
    device = inputs["base_logits"].device
    cache = torch.full((slots, steps, head.cache_vocab_size), SENTINEL, dtype=cache_dtype, device=device)
    tokens = torch.full((rows, steps), -1, dtype=torch.int64, device=device)
    return tokens, cache


def check_modes_draws(head, inputs, tokens, cache, *, draft_top_k=None, exact=True):
    """The modes' invariants given a sampler's tokens and cache: every live cache row is the
    reference row computed from the sampler's own previous tokens (bit for bit with ``exact``, else
    within the reordering bound of the fp32 sum over the rank, -inf exactly where the reference has
    it), each token is ``draw_gumbel`` of its own cached row (padding: of the reference row),
    unwritten cache rows keep ``SENTINEL``, tokens are target ids in ``[0, V_t)``."""
    base = inputs["base_logits"]
    rows, steps, _ = base.shape
    width = head.cache_vocab_size
    slots_rs = inputs["idx_mapping"].view(rows, steps)
    positions = inputs["positions"].view(rows, steps)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < width
    written = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    prev = inputs["anchor"].long()
    if draft_top_k is not None:
        values, candidates = base.topk(draft_top_k, dim=-1)
    for step in range(steps):
        padding, temp, seed, pos = ref.row_keys(slots_rs[:, step], positions[:, step], inputs["temperature"],
                                                inputs["seeds"])
        live = ~padding
        if draft_top_k is not None:
            z = candidate_logits(head, values[:, step], candidates[:, step], prev, cache.dtype)
            ids = target_ids(head, candidates[:, step])
            magnitude = (head.head_weight[candidates[:, step]].float().abs()
                         @ head.embed_weight[prev].float().abs().unsqueeze(-1)).squeeze(-1)
            bias_rounding = torch.zeros_like(magnitude)  # one rounding of values + scale * sum
        else:
            bias = head.bias(prev).float()
            z = (base[:, step].float() + bias).to(cache.dtype)
            ids = head.d2t_index if head.d2t_index is not None else torch.arange(base.shape[-1], device=base.device)
            magnitude = head.embed_weight[prev].float().abs() @ head.head_weight.float().abs().t()
            bias_rounding = 3 * 2.0**-7 * bias.abs()  # the bias's bf16 rounding (twice with scale != 1)
        want = scatter_row(z, ids, width)
        own = cache[slots_rs[:, step].long().clamp_min(0), step]
        got_live, want_live = own[live].float(), want[live].float()
        if exact:
            same = (got_live == want_live) | (torch.isnan(got_live) & torch.isnan(want_live))
            assert bool(same.all()), f"step {step}: cached row differs from the reference"
        else:
            # the reordered fp32 sum over the rank, the bias rounding, one ulp of z in the cache dtype
            z_ulp = (2.0**-7 if cache.dtype == torch.bfloat16 else 2.0**-23) * z.float().abs() + 2.0**-126
            bound = head.rank * 2.0**-23 * abs(head.scale) * magnitude + bias_rounding + z_ulp
            slack = scatter_row(bound.float(), ids, width)[live]
            inf_same = torch.isinf(want_live) == torch.isinf(got_live)
            assert bool(inf_same.all()), f"step {step}: -inf entries differ from the reference"
            finite = ~torch.isinf(want_live)
            assert bool(((got_live - want_live).abs()[finite] <= slack[finite]).all()), f"step {step}: cache off"
        keys_row = want.clone()
        keys_row[live] = own[live].to(want.dtype)
        expected = ref.draw_gumbel(keys_row, temp, seed, step, pos)
        assert torch.equal(tokens[:, step].cpu(), expected.cpu()), f"step {step}: tokens differ"
        written[slots_rs[live, step].long(), step] = True
        prev = tokens[:, step].long()
    assert bool((cache[~written].float() == SENTINEL).all()), "a cache row no live sample owns was written"


def markov_embeds_of(head, anchor: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """The confidence head's inputs, written independently of the library's two gathers (the reference's
    per step, the sampler's destination-passing one): ``W1[prev_i]`` ``[R, N, R_k]``: prev = anchor, x_0, ..., x_{N-2}."""
    prev = torch.cat([anchor.long()[:, None], draft_tokens[:, :-1].long()], dim=1)  # [R, N]
    return head.embed_weight[prev]
