"""The ``dspark-markov`` console script: help, info, errors, lazy imports."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dspark_markov import __version__, cli

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the package's src on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in ("demo", "bench", "info"):
        assert name in out


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_info_reports_versions_device_and_impls(capsys):
    import torch

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"dspark-markov {__version__}" in out
    assert torch.__version__ in out
    assert "device" in out
    for impl in ("reference", "loop", "gumbel_fused", "inverse_cdf", "fused", "chain", "auto"):
        assert f"  {impl} " in out
    # The reference always runs: its line must say so.
    reference_line = next(line for line in out.splitlines() if line.strip().startswith("reference"))
    assert "available (" in reference_line and "unavailable" not in reference_line
    verify_line = next(line for line in out.splitlines() if line.startswith("verification"))
    assert "cuda (CudaVerifier" in verify_line and ("unavailable: " in verify_line or verify_line.endswith("available"))


def test_unknown_subcommand_fails_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["frobnicate"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "frobnicate" in err and "invalid choice" in err


def test_no_subcommand_is_a_usage_error(capsys):
    assert cli.main([]) != 0
    assert "usage" in capsys.readouterr().err


def test_subcommand_arguments_are_passed_through(monkeypatch):
    """Everything after ``demo``/``bench`` reaches that module's ``main``, untouched."""
    import types

    seen = {}
    fake = types.ModuleType("dspark_markov.demo")

    def fake_main(argv=None):
        seen["argv"] = argv
        return 3

    fake.main = fake_main
    monkeypatch.setitem(sys.modules, "dspark_markov.demo", fake)
    assert cli.main(["demo", "--rows", "4", "--help"]) == 3
    assert seen["argv"] == ["--rows", "4", "--help"]


def test_help_and_info_work_without_triton():
    """With ``triton`` unimportable, ``--help`` and ``info`` still work and ``info`` says so."""
    result = _run_python("""
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        from dspark_markov import cli
        try:
            cli.main(["--help"])
        except SystemExit as e:
            assert e.code == 0, e.code
        assert cli.main(["info"]) == 0
        assert "triton" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
    """)
    assert result.returncode == 0, result.stderr
    assert "usage: dspark-markov" in result.stdout
    assert "triton        not available" in result.stdout
    assert "reference     available" in result.stdout


def test_console_script_entry_point_is_cli_main():
    """pyproject's ``[project.scripts]`` points at this module's ``main``."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    assert 'dspark-markov = "dspark_markov.cli:main"' in pyproject.read_text()


def test_module_runs_as_a_program():
    result = _run_python("import runpy, sys; sys.argv = ['dspark-markov', 'info']; "
                         "runpy.run_module('dspark_markov.cli', run_name='__main__')")
    assert result.returncode == 0, result.stderr
    assert "implementations" in result.stdout


ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs():
    """The API example in README.md runs as written (CPU, reference implementation)."""
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```python\n")[1:]
    assert blocks, "README.md has no python example"
    for block in blocks:
        code = block.split("```", 1)[0]
        exec(compile(code, "README.md", "exec"), {})


def test_readme_commands_match_ci():
    """README's test command is `bash .ci/run`, which installs torch 2.13.0 before the package."""
    readme = (ROOT / "README.md").read_text()
    script = (ROOT / ".ci" / "run").read_text()
    assert "\nbash .ci/run\n" in readme
    assert "set -euo pipefail" in script
    assert script.index("torch==2.13.0") < script.index("-e '.[test]'")
    assert 'pytest -q -m "not gpu"' in script
    assert "dspark-markov demo" in readme


# --------------------------------------------------------------------------- stop 45: an audit of the options
DEMO = ["demo", "--vocab", "8", "--rank", "2", "--num-drafts", "2", "--requests", "4", "--length", "4", "--quiet"]
BENCH = ["bench", "--device", "cpu", "--temperature", "1", "--no-plot", "--no-progress", "--rounds", "1",
         "--replays", "1", "--vocab", "64", "--rank", "4", "--steps", "2", "--rows", "1"]


@pytest.mark.parametrize("extra, message", [
    (["--device", "bogus"], "--device: expected cpu or cuda"),
    (["--device", "meta"], "--device: expected cpu or cuda"),
    (["--requests", str(10**12)], "--requests: expected a positive integer below 2^31"),
    (["--vocab", str(10**11)], "--vocab: expected a positive integer below 2^31"),
    (["--seed", str(10**23)], "--seed: expected a 64-bit integer"),
])
def test_demo_names_the_bad_option(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(DEMO + extra)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_seeds_at_the_ends_of_int64(capsys):
    # int64's largest value is a seed like any other (it was refused: `< 2**63 - 1`); 2^63 is not an int64
    for seed in (2**63 - 1, -(2**63)):  # the demo runs (exit 1 only says that so few draws verify nothing)
        assert cli.main(DEMO + ["--seed", str(seed)]) in (0, 1)
        assert "--seed" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(DEMO + ["--seed", str(2**63)])
    assert exit_.value.code == 2 and "--seed: expected a 64-bit integer" in capsys.readouterr().err
    from dspark_markov.bench import grid

    assert grid.BenchConfig(device="cpu", seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ValueError, match="seed: expected an int64"):
        grid.BenchConfig(device="cpu", seed=2**63)


def test_demo_names_verify_impl_when_triton_cannot_run(capsys, monkeypatch):
    from dspark_markov.ops import constants

    monkeypatch.setattr(constants, "INTERPRET", False)  # (as without TRITON_INTERPRET=1 on a CPU machine)
    with pytest.raises(SystemExit) as exit_:
        cli.main(DEMO + ["--engine", "step", "--verify-impl", "triton"])
    assert exit_.value.code == 2 and "--verify-impl: 'triton' runs on the CPU only" in capsys.readouterr().err


def test_bench_checks_its_output_folder_before_the_run(capsys, tmp_path, monkeypatch):
    from dspark_markov.bench import grid

    ran = []
    monkeypatch.setattr(grid, "run_grid", lambda *a, **k: ran.append(1) or [])
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        assert cli.main(BENCH + ["--out", str(out)]) == 2
        assert "--out: cannot write files into" in capsys.readouterr().err
    assert cli.main(["bench", "--verify", "--device", "cpu", "--out", str(blocker)]) == 2
    assert "--out: cannot write files into" in capsys.readouterr().err
    assert not ran


@pytest.mark.parametrize("extra, message", [(["--seed", str(10**23)], "seed: expected an int64"),
                                            (["--rows", str(10**11)], "rows: expected a non-empty list")])
def test_bench_names_values_beyond_machine_ints(capsys, extra, message):
    assert cli.main(BENCH + extra) == 2
    assert message in capsys.readouterr().err


def test_sizes_the_machine_cannot_hold_are_one_line(capsys, monkeypatch):
    import dspark_markov.demo as demo_cli  # (the module `dspark-markov demo` delegates to)

    def fail(argv=None):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: 16 GB")

    monkeypatch.setattr(demo_cli, "main", fail)
    assert cli.main(["demo"]) == 1
    assert "not enough memory for these sizes" in capsys.readouterr().err
    monkeypatch.setattr(demo_cli, "main", lambda argv=None: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors are not hidden
        cli.main(["demo"])


@pytest.mark.parametrize("extra, message", [(["--vllm-cache", "/tmp"], "--vllm-cache: not used by --verify"),
                                            (["--logits-dtype", "float32"], "--logits-dtype: not used by --verify")])
def test_bench_verify_rejects_options_it_does_not_use(capsys, extra, message):
    assert cli.main(["bench", "--verify", "--device", "cpu"] + extra) == 2
    assert message in capsys.readouterr().err
