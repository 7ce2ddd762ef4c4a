"""The vLLM hook at DeepSeek-V4.1 shapes on a GPU, against vLLM's loop (its real gumbel_sample).

vLLM need not be installed: the speculator is the stand-in of ``vllm_standin.py`` and vLLM's
``gumbel_sample`` comes from an installed vLLM or ``.vllm-cache/`` (``tools/extract_vllm.py``);
skipped when neither is there. Timing is ``tools/vllm_hook_timing.py``'s job, not a test's.
"""

import pytest
import torch

from dspark_markov.bench import harness, vllm_loop
from dspark_markov.integrations.vllm import hook
from tests.integrations import vllm_standin as standin

pytestmark = pytest.mark.gpu

V, RANK, N, MAX_REQS = 129_280, 256, 5, 64


@pytest.fixture(scope="module")
def speculators():
    try:
        gumbel_sample, _ = vllm_loop.load_gumbel_sample()
    except ImportError as error:
        pytest.skip(str(error))
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(5)
    w1 = (torch.randn(V, RANK, generator=gen, device=device) * 0.05).bfloat16()
    w2 = (torch.randn(V, RANK, generator=gen, device=device) * 0.05).bfloat16()
    base = (torch.randn(MAX_REQS * N, V, generator=gen, device=device) * 2.0).bfloat16()
    kwargs = dict(max_num_reqs=MAX_REQS, num_steps=N, vocab=V, device=device)
    plain = standin.Speculator(standin.DraftModel(w1, w2, V, 1.0, base), gumbel_sample, **kwargs)
    hooked = standin.Speculator(standin.HookedDraftModel(w1, w2, V, 1.0, base), gumbel_sample, **kwargs)
    return plain, hooked, torch.zeros(MAX_REQS * N, 8, dtype=torch.bfloat16, device=device)


@pytest.mark.parametrize("rows", [1, 2, 16, 64])
def test_hook_equals_vllm_loop_in_a_graph(speculators, rows):
    plain, hooked, hidden = speculators
    for spec in (plain, hooked):
        standin.fill_batch(spec, rows, torch.Generator().manual_seed(rows), padding_rows=(1,) if rows > 1 else (),
                           temperatures=(0.0, 0.6, 1.0))
    graphs = [harness.capture_graph(lambda s=spec: s._sample_sequential(rows, hidden)) for spec in (plain, hooked)]
    taken = hook.stats["taken"]
    for spec in (plain, hooked):
        spec.draft_logits.fill_(-3.0)
        spec.draft_tokens.fill_(-1)
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    assert hook.stats["taken"] == taken  # replays run no Python: the hook was captured
    assert torch.equal(plain.draft_tokens, hooked.draft_tokens)
    assert bool((hooked.draft_tokens[rows:] == -1).all()) and bool((hooked.draft_tokens[:rows] >= 0).all())
    # bf16 bit patterns; in-kernel bias designs may differ in a bias's last bit (SPEC.md section 3),
    # which the H200 runs have not shown: require equality and report the count if not.
    differ = int((plain.draft_logits.view(torch.int16) != hooked.draft_logits.view(torch.int16)).sum())
    assert differ == 0, f"{differ} cache values differ from vLLM's loop"
