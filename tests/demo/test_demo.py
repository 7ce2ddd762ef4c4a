"""The end-to-end demo: a small run must show the Markov head's gain and pass its chi-square checks."""

import pytest
import torch

from dspark_markov import MarkovHead
from dspark_markov.demo import cli, generate


def test_demo_small_run_passes(capsys):
    code = cli.main(["--vocab", "64", "--requests", "48", "--length", "24", "--rank", "8", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    lines = [line for line in printed.splitlines() if "mean accepted length" in line]
    assert len(lines) == 2 and all("pass" in line for line in lines), printed
    accepted = [float(line.split("mean accepted length ")[1].split()[0]) for line in lines]
    assert accepted[1] > accepted[0] + 0.5, printed  # the Markov head accepts clearly more


def test_demo_block_verification_and_inverse_cdf():
    args = ["--vocab", "48", "--requests", "32", "--length", "16", "--rank", "8", "--quiet", "--method", "block",
            "--draft-method", "inverse_cdf", "--cache-dtype", "fp32", "--temperature", "0.7"]
    assert cli.main(args) == 0


def test_demo_returns_one_when_the_head_does_not_help(monkeypatch):
    # A head fitted with rank 0 cannot exist; instead replace the fit by a zero head: no gain -> 1.
    monkeypatch.setattr(cli, "fit_markov_head", lambda language, rank: generate.zero_head(language.vocab, rank))
    assert cli.main(["--vocab", "32", "--requests", "16", "--length", "8", "--quiet"]) == 1


def test_chi_square_pools_small_cells_and_detects_bias():
    expected = torch.tensor([[50.0, 30.0, 15.0, 3.0, 2.0]])
    statistic, dof = generate.chi_square(expected.clone(), expected)
    assert statistic == 0.0 and dof == 3  # the two small cells are pooled (5 expected)
    biased = torch.tensor([[80.0, 10.0, 5.0, 3.0, 2.0]])
    statistic, dof = generate.chi_square(biased, expected)
    assert statistic > generate.chi_square_threshold(dof)
    assert generate.chi_square(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))[0] == float("inf")


def test_bad_arguments_exit_with_usage_error():
    with pytest.raises(SystemExit):
        cli.main(["--temperature", "0"])
    with pytest.raises(SystemExit):
        cli.main(["--vocab", "1"])


def test_sizes_that_cannot_fit_are_refused_before_any_work(capsys):
    """A legal but huge --num-drafts was killed by the OS's out-of-memory killer mid-run (stop 50 audit); sizes whose
    target logits alone exceed the free memory are a usage error naming the arguments."""
    with pytest.raises(SystemExit) as raised:
        cli.main(["--num-drafts", str(2**31 - 1), "--quiet"])
    assert raised.value.code == 2
    assert "--requests / --num-drafts / --vocab" in capsys.readouterr().err


# --------------------------------------------------------------------------- --engine step (DSparkStep)
def _setup(vocab, batch, rank, seed=0, device="cpu"):
    language = generate.BigramLanguage(vocab, seed=seed, device=device)
    log_mu = language.marginals().log().float()
    g = torch.Generator().manual_seed(seed + 1)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g).to(device)
    anchor = torch.randint(0, vocab, (batch,), generator=g).to(device)
    start = torch.randint(1, 1000, (batch,), generator=g).to(device)
    temperature = torch.full((batch,), 0.8, device=device)

    def target_fn(prev, position):
        return language.logits(prev, position) / 0.8

    return language, log_mu, generate.fit_markov_head(language, rank), seeds, anchor, start, temperature, target_fn


def test_step_engine_runs_end_to_end_and_passes(capsys):
    code = cli.main(["--engine", "step", "--vocab", "64", "--requests", "48", "--length", "24", "--rank", "8",
                      "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "engine step" in printed and "CUDA graphs" not in printed
    lines = [line for line in printed.splitlines() if "mean accepted length" in line]
    assert len(lines) == 2 and all("pass" in line and "tokens/s" in line for line in lines), printed
    accepted = [float(line.split("mean accepted length ")[1].split()[0]) for line in lines]
    assert accepted[1] > accepted[0] + 0.5, printed
    speeds = [float(line.split("; ")[1].split()[0]) for line in lines]
    assert all(s > 0 for s in speeds), printed


@pytest.mark.parametrize("method,draft_method", [("standard", "gumbel"), ("block", "inverse_cdf")])
def test_step_engine_emits_the_functional_engines_tokens(method, draft_method):
    """Same (slot, position) keys, reference impls: the two engines emit identical text and counts."""
    from dspark_markov.demo.step_engine import StepGenerator, marginal_backbone

    vocab, batch, k, length = 40, 12, 4, 15  # 15 = 3 full rounds at most + short tails: padding occurs
    _, log_mu, head, seeds, anchor, start, temperature, target_fn = _setup(vocab, batch, 6)
    functional = generate.speculative_generate(target_fn, lambda pos: log_mu[pos % 3], head, anchor, start, length,
                                           num_steps=k, temperature=temperature, seeds=seeds, method=method,
                                           draft_method=draft_method, cache_dtype=torch.float32)
    stepper = StepGenerator(target_fn, head, marginal_backbone(log_mu, batch, k), batch=batch, num_steps=k,
                            temperature=temperature, seeds=seeds, method=method, draft_method=draft_method,
                            cache_dtype=torch.float32)
    result, seconds = stepper.generate(anchor, start, length)
    assert seconds > 0
    assert bool((result.tokens >= 0).all())
    assert torch.equal(result.tokens, functional.tokens)
    assert result.rounds == functional.rounds
    assert result.accepted == functional.accepted and result.emitted == functional.emitted
    assert functional.rounds > length // (k + 1)  # requests finished in different rounds


@pytest.mark.parametrize("draft_impl", ["gumbel_fused", "fused"])
def test_step_engine_with_triton_kernels_emits_the_reference_tokens(draft_impl):
    """The CUDA code path (Triton drafts, verification and block inputs; no graphs) in the interpreter."""
    from dspark_markov.demo.step_engine import StepGenerator, marginal_backbone

    vocab, batch, k, length = 300, 4, 3, 7
    _, log_mu, head, seeds, anchor, start, temperature, target_fn = _setup(vocab, batch, 16)
    reference = generate.speculative_generate(target_fn, lambda pos: log_mu[pos % 3], head, anchor, start, length,
                                          num_steps=k, temperature=temperature, seeds=seeds)
    stepper = StepGenerator(target_fn, head, marginal_backbone(log_mu, batch, k), batch=batch, num_steps=k,
                            temperature=temperature, seeds=seeds, draft_impl=draft_impl, verify_impl="triton",
                            block_inputs_impl="triton")
    result, _ = stepper.generate(anchor, start, length)
    assert torch.equal(result.tokens, reference.tokens)
    assert result.rounds == reference.rounds and result.accepted == reference.accepted


def test_marginal_backbone_reads_positions_only():
    from dspark_markov.demo.step_engine import marginal_backbone

    log_mu = torch.randn(3, 7)
    backbone = marginal_backbone(log_mu, 2, 3)
    positions = torch.tensor([4, 5, 6, 7, 0, 0, 0, 0])
    out = backbone(torch.randint(0, 7, (8,)), positions)
    assert out.shape == (2, 3, 7) and out.is_contiguous()
    assert torch.equal(out[0], log_mu[[2, 0, 1]]) and torch.equal(out[1], log_mu[[0, 0, 0]])
    assert torch.equal(backbone(torch.zeros(8, dtype=torch.int64), positions), out)  # ignores the ids


def test_step_engine_bad_arguments():
    with pytest.raises(SystemExit):
        cli.main(["--engine", "step", "--graphs"])  # graphs need CUDA
    with pytest.raises(SystemExit):
        cli.main(["--engine", "functional", "--verify-impl", "triton"])
    with pytest.raises(SystemExit):
        cli.main(["--engine", "nope"])
    from dspark_markov.demo.step_engine import StepGenerator

    head = generate.zero_head(8, 2)
    with pytest.raises(ValueError, match="graphs"):
        StepGenerator(lambda p, q: None, head, lambda i, p: None, batch=2, num_steps=2,
                      temperature=torch.ones(2), seeds=torch.zeros(2, dtype=torch.int64), graphs=True)


@pytest.mark.gpu
def test_step_engine_graphs_equal_eager_on_cuda():
    """CUDA graphs replayed every round emit exactly the eager step's tokens (V = 129,280, N = 5, 64 rows)."""
    from dspark_markov.demo.step_engine import StepGenerator, marginal_backbone

    vocab, batch, k, length = 129_280, 64, 5, 13
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    transition = torch.randn(vocab, 64, generator=g, device=dev)
    proj = torch.randn(64, vocab, generator=g, device=dev) * 0.4
    log_mu = torch.log_softmax(torch.randn(3, vocab, generator=g, device=dev) * 2, dim=-1)
    head = MarkovHead((torch.randn(vocab, 256, generator=g, device=dev) * 0.05).to(torch.bfloat16),
                           (torch.randn(vocab, 256, generator=g, device=dev) * 0.05).to(torch.bfloat16))
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g, device=dev)
    anchor = torch.randint(0, vocab, (batch,), generator=g, device=dev)
    start = torch.randint(1, 1000, (batch,), generator=g, device=dev)
    temperature = torch.full((batch,), 0.9, device=dev)

    def target_fn(prev, position):  # [B, K+1] -> [B, K+1, V]
        return transition[prev] @ proj + log_mu[position % 3]

    def run(graphs):
        stepper = StepGenerator(target_fn, head, marginal_backbone(log_mu, batch, k), batch=batch, num_steps=k,
                                temperature=temperature, seeds=seeds, draft_impl="auto", verify_impl="triton",
                                block_inputs_impl="triton", graphs=graphs)
        return stepper.generate(anchor, start, length)[0]

    graphed, eager = run(True), run(False)
    assert bool((graphed.tokens >= 0).all())
    assert torch.equal(graphed.tokens, eager.tokens)
    assert graphed.rounds == eager.rounds and graphed.accepted == eager.accepted


@pytest.mark.gpu
def test_demo_on_cuda_with_graphs_passes(capsys):
    code = cli.main(["--device", "cuda", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "engine step + CUDA graphs" in printed and printed.count("tokens/s") >= 2, printed
