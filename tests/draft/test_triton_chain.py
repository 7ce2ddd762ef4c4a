"""``impl="chain"`` in Triton's interpreter (one program: the interpreter runs programs in turn).

The GPU tests (tests/gpu/test_chain_gpu.py) run it with one program per SM at full shapes.
"""

import pytest
import torch

import dspark_markov as dm
from tests.helpers import (DTYPE_CASES, NAN_INF_TOKENS, check_against_reference, check_exact_and_untouched,
                           make_problem, nan_inf_problem)

pytest.importorskip("triton")


@pytest.mark.parametrize("weight_dtype,logit_dtype,cache_dtype,scale", DTYPE_CASES)
def test_chain_exact_against_reference(weight_dtype, logit_dtype, cache_dtype, scale, device):
    check_exact_and_untouched("chain", weight_dtype, logit_dtype, cache_dtype, scale, device)


@pytest.mark.parametrize("word_slots", [1, 4])
def test_chain_repeated_calls_reset_scratch(word_slots, device):
    """Calls in a row reuse the words and counters, which each launch resets (one or several slots)."""
    from dspark_markov.draft.triton_chain import ChainBackend

    head, args = make_problem(301, 16, 3, 4, device=device)
    sampler = dm.MarkovSampler(head, 4, 16, impl="chain")
    sampler.backend = ChainBackend(head, 4, 16, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, word_slots=word_slots)
    for seed in range(3):
        _, args = make_problem(301, 16, 3, 4, seed=seed, device=device)
        out = sampler.sample(*args)
        check_against_reference(head, *args, out)
        assert int(sampler.backend.sync.abs().sum()) == 0
        assert bool((sampler.backend.words == -(2**63)).all())
    sampler.backend.check()


def test_chain_exact_fallback_on_near_ties(device):
    """A huge filter margin leaves every row undecided: the exact recomputation draws the same."""
    from dspark_markov.draft.triton_chain import ChainBackend

    head, args = make_problem(700, 16, 4, 2, device=device)
    sampler = dm.MarkovSampler(head, 2, 4, impl="chain")
    sampler.backend = ChainBackend(head, 2, 4, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, filter_margin=1e30)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)


@pytest.mark.parametrize("leaders", [2, 3])
def test_chain_two_candidate_path(leaders, device):
    """A few leading tokens per row and a wide margin: the winner is decided between the best two.

    With two leaders the third is far below (the two-candidate path always); with three the third
    is often within the margin (the exact recomputation). The draws equal the reference either way.
    """
    from dspark_markov.draft.triton_chain import ChainBackend

    head, args = make_problem(600, 16, 6, 3, logit_dtype=torch.float32, temps=(1.0, 0.7), padding_row=None,
                              device=device)
    base = torch.full_like(args[0], -30.0)
    gen = torch.Generator().manual_seed(11)
    for row in range(6):
        for step in range(3):
            base[row, step, torch.randperm(600, generator=gen)[:leaders]] = 10.0
    args[0] = base
    sampler = dm.MarkovSampler(head, 3, 6, impl="chain", cache_dtype=torch.float32)
    sampler.backend = ChainBackend(head, 3, 6, method="gumbel", cache_dtype=torch.float32, device=head.device, filter_margin=5.0)
    out = sampler.sample(*args)
    check_against_reference(head, *args, out)


def test_chain_nan_inf_rows_give_defined_tokens(device):
    head, args = nan_inf_problem(device)
    out = dm.sample_drafts(head, *args, impl="chain", cache_dtype=torch.float32)
    assert out.draft_tokens[:, 0].tolist() == NAN_INF_TOKENS


def test_chain_barrier_gives_up_instead_of_hanging(device):
    """Two programs in the interpreter: the first waits for a second that runs only after it.

    The bounded wait gives up, the status says so and ``check`` raises; the launch ends, the last
    program still resets the scratch, and every token is in range.
    """
    from dspark_markov.draft.triton_chain import ChainBackend

    head, args = make_problem(300, 16, 2, 2, device=device)
    backend = ChainBackend(head, 2, 2, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, spin_limit=3, word_slots=2)
    backend.layout(2).programs = 2  # more programs than can run at once here
    tokens = torch.full((2, 2), -5, dtype=torch.int64, device=device)
    cache = torch.zeros(3, 2, 300, dtype=torch.bfloat16, device=device)
    backend.run(*args, tokens, cache)
    assert bool(((tokens >= 0) & (tokens < 300)).all())
    with pytest.raises(RuntimeError, match="barrier timed out"):
        backend.check()
    assert int(backend.sync.abs().sum()) == 0
    assert bool((backend.words == -(2**63)).all())


def test_chain_refuses_what_it_cannot_run(device):
    head, _ = make_problem(300, 16, 2, 2, device=device)
    with pytest.raises(ValueError, match="max_rows"):
        dm.MarkovSampler(head, 2, 17, impl="chain")
    with pytest.raises(ValueError, match="method"):
        dm.MarkovSampler(head, 2, 4, impl="chain", method="inverse_cdf")
    from dspark_markov.draft.triton_chain import ChainBackend

    with pytest.raises(ValueError, match="word_slots"):
        ChainBackend(head, 2, 4, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, word_slots=3)
