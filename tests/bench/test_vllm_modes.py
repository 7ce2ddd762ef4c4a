"""The modes' benchmark baseline (bench/vllm_modes.py: vLLM 0.33.0's reduced-vocabulary and top-k loops
with its real gumbel_sample) draws what the reference draws, bit for bit on exact-sum heads.

Runs where vLLM's gumbel kernel runs: tools/check_vllm.sh (Triton 3.8's interpreter) and the GPU;
Triton 3.9's interpreter cannot run it (skipped on exactly that error).
"""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.bench import vllm_loop
from dspark_markov.bench.vllm_modes import VllmModesLoop
from tests.modes_helpers import SENTINEL, exact_head, modes_inputs, modes_outputs


@pytest.mark.parametrize("d2t, top_k", [(True, None), (True, 6), (False, 6)])
def test_vllm_modes_loop_draws_what_the_reference_draws(d2t, top_k):
    try:
        gumbel_sample = vllm_loop.load_gumbel_sample()[0]
    except ImportError as error:
        pytest.skip(str(error))
    head = exact_head(300, 520, 16, d2t=d2t, scale=0.5)
    vocab = head.draft_vocab_size
    inputs = modes_inputs(5, 3, vocab, 520)
    expected = dm.sample_drafts(head, **inputs, impl="reference", draft_top_k=top_k,
                                logits_cache=modes_outputs(head, inputs, torch.bfloat16)[1])
    tokens, cache = modes_outputs(head, inputs, torch.bfloat16)
    try:
        VllmModesLoop(head, 3, 5, gumbel_sample, draft_top_k=top_k).run(*inputs.values(), tokens, cache)
    except Exception as error:  # noqa: BLE001 - only the one known interpreter limitation is skipped
        if "mask has unsupported dtype" in str(error):
            pytest.skip(f"this Triton's interpreter cannot run vLLM 0.33's gumbel kernel: {error}")
        raise
    assert torch.equal(tokens, expected.draft_tokens)
    assert torch.equal(cache.view(torch.int16), expected.logits_cache.view(torch.int16))
    assert bool((cache == SENTINEL).any())
