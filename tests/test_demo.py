"""The end-to-end demo: a small run must show the Markov head's gain and pass its chi-square checks."""

import pytest
import torch

from dspark_markov import demo


def test_demo_small_run_passes(capsys):
    code = demo.main(["--vocab", "64", "--requests", "48", "--length", "24", "--rank", "8", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    lines = [line for line in printed.splitlines() if "mean accepted length" in line]
    assert len(lines) == 2 and all("pass" in line for line in lines), printed
    accepted = [float(line.split("mean accepted length ")[1].split()[0]) for line in lines]
    assert accepted[1] > accepted[0] + 0.5, printed  # the Markov head accepts clearly more


def test_demo_block_verification_and_inverse_cdf():
    args = ["--vocab", "48", "--requests", "32", "--length", "16", "--rank", "8", "--quiet", "--method", "block",
            "--draft-method", "inverse_cdf", "--cache-dtype", "fp32", "--temperature", "0.7"]
    assert demo.main(args) == 0


def test_demo_returns_one_when_the_head_does_not_help(monkeypatch):
    # A head fitted with rank 0 cannot exist; instead replace the fit by a zero head: no gain -> 1.
    monkeypatch.setattr(demo, "fit_markov_head", lambda language, rank: demo.zero_head(language.vocab, rank))
    assert demo.main(["--vocab", "32", "--requests", "16", "--length", "8", "--quiet"]) == 1


def test_chi_square_pools_small_cells_and_detects_bias():
    expected = torch.tensor([[50.0, 30.0, 15.0, 3.0, 2.0]])
    statistic, dof = demo.chi_square(expected.clone(), expected)
    assert statistic == 0.0 and dof == 3  # the two small cells are pooled (5 expected)
    biased = torch.tensor([[80.0, 10.0, 5.0, 3.0, 2.0]])
    statistic, dof = demo.chi_square(biased, expected)
    assert statistic > demo.chi_square_threshold(dof)
    assert demo.chi_square(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))[0] == float("inf")


def test_bad_arguments_exit_with_usage_error():
    with pytest.raises(SystemExit):
        demo.main(["--temperature", "0"])
    with pytest.raises(SystemExit):
        demo.main(["--vocab", "1"])
