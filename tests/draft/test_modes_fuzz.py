"""Property-based fuzzing of the drafting modes (issue 17; the registry-driven tests/test_fuzz.py covers
the dense family): random vocabularies, d2t tables, k, batch shapes, temperatures and designs, with
at most one violation of the modes' input rules.

- with a violation, a ``ValueError`` whose message starts with the violated argument's name, and
  every output passed in bit-for-bit untouched;
- without one, the draws of tests/modes_helpers.check_modes_draws (each token the reference draw of
  the design's own cached row, the -inf entries exactly the reference's, unwritten rows untouched).

Budget: a fixed, derandomised number of examples (``DSPARK_FUZZ_EXAMPLES`` sets it).
"""

from __future__ import annotations

import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("triton")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dspark_markov as dm  # noqa: E402
from tests.modes_helpers import check_modes_draws, exact_head, modes_inputs, modes_outputs  # noqa: E402

EXAMPLES = int(os.environ.get("DSPARK_FUZZ_EXAMPLES", 8))
VIOLATIONS = (None, None, None, "d2t_range", "d2t_duplicate", "d2t_dtype", "draft_top_k", "logits_cache",
              "markov_embeds")


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate], suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_modes_fuzz(data):
    draft_vocab = data.draw(st.integers(300, 700), label="V_d")
    target_vocab = data.draw(st.integers(draft_vocab, draft_vocab + 400), label="V_t")
    d2t = data.draw(st.booleans(), label="d2t") or target_vocab == draft_vocab
    top_k = data.draw(st.sampled_from([None, 1, 3, 17, 64]), label="draft_top_k")
    impl = data.draw(st.sampled_from(["reference", "fused"] + (["chain"] if top_k is None else [])), label="impl")
    rows = data.draw(st.integers(1, 6), label="rows")
    steps = data.draw(st.integers(1, 4), label="steps")
    cache_dtype = data.draw(st.sampled_from([torch.bfloat16, torch.float32]), label="cache_dtype")
    scale = data.draw(st.sampled_from([1.0, 0.5]), label="scale")
    violation = data.draw(st.sampled_from(VIOLATIONS), label="violation")
    seed = data.draw(st.integers(0, 1000), label="seed")
    vocab = draft_vocab if d2t else target_vocab
    head = exact_head(vocab, target_vocab, 16, d2t=d2t, scale=scale, seed=seed, exact=False, ordered=seed % 2 == 0)
    if violation and violation.startswith("d2t_"):
        table = head.d2t.clone() if head.d2t is not None else torch.zeros(vocab, dtype=torch.int64)
        if violation == "d2t_range":
            table[seed % vocab] = target_vocab - seed % vocab  # target id V_t
        elif violation == "d2t_duplicate":
            table[1] = table[0] - 1  # draft ids 0 and 1 map to one target id
        else:
            table = table.float()
        with pytest.raises(ValueError, match=r"^d2t: "):
            dm.MarkovHead(head.embed_weight, head.head_weight, d2t=table, target_vocab_size=target_vocab)
        return
    inputs = modes_inputs(rows, steps, vocab, target_vocab, seed=seed)
    tokens, cache = modes_outputs(head, inputs, cache_dtype)
    embeds = torch.full((rows, steps, 16), 3.0, dtype=head.dtype)
    k = top_k
    if violation == "draft_top_k":
        k = data.draw(st.sampled_from([0, vocab + 1, 2.0]), label="bad k")
    if violation == "logits_cache":
        cache = cache[:, :, : vocab - 1] if d2t else torch.full((cache.shape[0], steps, vocab + 1), -7.0,
                                                                 dtype=cache_dtype)
    if violation == "markov_embeds":
        embeds = torch.full((rows, steps, 15), 3.0, dtype=head.dtype)
    before = (tokens.clone(), cache.clone(), embeds.clone())
    if violation is not None:
        with pytest.raises(ValueError, match=rf"^{violation}: "):
            sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, impl=impl, draft_top_k=k)
            sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
        for after, original in zip((tokens, cache, embeds), before):
            assert torch.equal(after, original), "a refused call wrote an output"
        return
    sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, impl=impl, draft_top_k=k)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, markov_embeds=embeds)
    check_modes_draws(head, inputs, tokens, cache, draft_top_k=k, exact=impl == "reference")
    prev = torch.cat([inputs["anchor"][:, None], tokens[:, :-1]], dim=1)
    assert torch.equal(embeds, head.embed_weight[prev])
