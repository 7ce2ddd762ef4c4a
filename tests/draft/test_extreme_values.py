"""Legal inputs at the ends of the float range, for every Triton design (CPU interpreter, small V).

Each design must draw what the reference draws from the logits that design cached (SPEC.md section 4):
- a subnormal draft temperature (``1 / T`` overflows fp32 below T ~ 2.9e-39, while ``div_rn(z, T)`` stays finite
  for z = 0 and small z): the per-token bounds of ``stream`` / ``wide`` were ``z * (1/T)`` (0 * inf = NaN, or
  -inf), which dropped every token that can win;
- a reduced draft vocabulary (d2t) whose keys are all -inf (base logits all -inf, or z / T = -inf): ``torch.argmax``
  of the cached target-width row is 0, which ``fused`` / ``chain`` missed (their -inf partials hold mapped target
  ids only, the lowest of them 5 here);
- inverse-CDF rows whose every z / T is finite but below -3e38: ``wide`` started its running shift at -3e38, so such
  a row's mass was scaled to 0 and token 0 drawn (a token of -inf logit where one finite logit was the only choice).
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft import reference as ref

V, RANK = 320, 16


@pytest.mark.parametrize("impl", ["fused", "gumbel_fused", "chain", "stream", "wide"])
def test_subnormal_temperatures(impl):
    gen = torch.Generator().manual_seed(0)
    head = dm.MarkovHead(torch.randn(V, RANK, generator=gen).bfloat16(), torch.randn(V, RANK, generator=gen).bfloat16(),
                         scale=0.0)
    base = torch.stack([torch.zeros(V),  # z / T = 0 everywhere: the noise decides
                        -(torch.rand(V, generator=gen) + 1.0) * 1e-3,  # z / T finite, about -1e37
                        torch.cat([torch.zeros(1), -torch.rand(V - 1, generator=gen) - 1.0])])[:, None]  # one 0
    temperature = torch.tensor([1e-45, 1e-40, 2e-39])
    args = [base, torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2]), torch.tensor([100, 7, 0]), temperature,
            torch.tensor([42, -1, 2**62])]
    out = dm.sample_drafts(head, *args, impl=impl, cache_dtype=torch.float32)
    want = ref.draw_gumbel(out.logits_cache[:, 0], temperature, args[5], 0, args[3])
    assert torch.equal(out.draft_tokens[:, 0], want), (out.draft_tokens[:, 0], want)
    assert int(out.draft_tokens[2, 0]) == 0  # the only finite key


@pytest.mark.parametrize("impl", ["fused", "chain"])
def test_reduced_vocabulary_all_minus_inf_rows_give_token_0(impl):
    vocab_t = 400
    gen = torch.Generator().manual_seed(0)
    d2t = torch.full((V,), 5)  # draft id j -> target id j + 5: target ids 0..4 unmapped
    head = dm.MarkovHead(torch.randn(vocab_t, RANK, generator=gen).bfloat16(),
                         torch.randn(V, RANK, generator=gen).bfloat16(), d2t=d2t, target_vocab_size=vocab_t)
    base = torch.stack([torch.full((V,), float("-inf")), torch.full((V,), float("-inf")),
                        -1000.0 - torch.rand(V, generator=gen)])[:, None]  # the last: z / T = -inf at T = 1e-45
    args = [base, torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2]), torch.tensor([100, 7, 0]),
            torch.tensor([0.0, 1.0, 1e-45]), torch.tensor([42, 43, 44])]
    want = dm.sample_drafts(head, *args, impl="reference", cache_dtype=torch.float32)
    out = dm.sample_drafts(head, *args, impl=impl, cache_dtype=torch.float32)
    assert want.draft_tokens[:, 0].tolist() == [0, 0, 0]
    assert torch.equal(out.draft_tokens, want.draft_tokens), (out.draft_tokens, want.draft_tokens)


@pytest.mark.parametrize("impl", ["inverse_cdf", "fused", "stream", "wide"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_inverse_cdf_rows_below_minus_3e38(impl, cache_dtype):
    head = dm.MarkovHead(torch.zeros(V + 1, RANK), torch.zeros(V, RANK), scale=0.0)
    lone = torch.full((V,), float("-inf"))
    lone[V - 3] = -3.2e38  # the only finite logit (bf16: -3.2e38 rounds to -3.19e38)
    base = torch.stack([torch.full((V,), -3.2e38), torch.full((V,), -1e38), lone])[:, None]
    temperature = torch.tensor([1.0, 0.3, 1.0])  # row 1: z / T = -3.3e38
    args = [base, torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2]), torch.tensor([10, 11, 12]), temperature,
            torch.tensor([12345, 999, 5])]
    out = dm.sample_drafts(head, *args, impl=impl, method="inverse_cdf", cache_dtype=cache_dtype)
    want = ref.draw_inverse_cdf(out.logits_cache[:, 0], temperature, args[5], 0, args[3])
    assert torch.equal(out.draft_tokens[:, 0], want), (out.draft_tokens[:, 0], want)
    assert int(out.draft_tokens[2, 0]) == V - 3 and int(out.draft_tokens[0, 0]) != 0
