"""tools/sanitize.py on the CPU: the calls it would run (from the registry), its log parser, its errors."""

import subprocess
import sys

import pytest

from tests.helpers import ROOT, load_tool

sanitize = load_tool("sanitize")

pytest.importorskip("triton")


def test_dry_run_lists_every_cuda_design_and_the_other_kernels(capsys):
    import torch

    from dspark_markov import registry

    assert sanitize.main(["--dry-run"]) == 0
    printed = capsys.readouterr().out
    for impl in registry.names("draft"):
        if impl in ("auto", "reference"):
            continue
        try:
            cls = registry.load("draft", impl)
        except ValueError:
            assert f"call {impl}  (skipped" in printed
            continue
        if "cuda" in cls.DEVICES:
            for method in cls.METHODS:
                assert f"call {impl}/{method}" in printed, impl
            assert (f"call {impl}/d2t" in printed) == bool(getattr(cls, "D2T", False)), impl  # reduced vocabulary
    for name in ("draft_top_k/fused", "verify/standard", "verify/block", "top_k_top_p/per-row", "top_k_top_p/split-rows",
                 "prepare_block_inputs"):
        assert f"call {name}" in printed
    for tool in sanitize.TOOLS:
        assert f"compute-sanitizer --tool {tool}" in printed
    assert torch.device("cuda").type == "cuda"


def test_one_call_runs_in_the_interpreter(capsys):
    assert sanitize.main(["--one-call", "prepare_block_inputs", "--device", "cpu"]) == 0
    assert "call prepare_block_inputs: ok" in capsys.readouterr().out


def test_log_parser_counts_errors_and_hazards():
    memcheck = "call fused/gumbel: ok in 1 s\n========= Invalid __global__ read of size 4 bytes\n" \
               "=========     at 0x1 in _fused_kernel\n========= ERROR SUMMARY: 3 errors\n"
    info = sanitize.parse_log("memcheck", memcheck)
    assert info["errors"] == 3 and info["calls_ok"] == 1 and "_fused_kernel" in info["kernels"]
    race = "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n"
    info = sanitize.parse_log("racecheck", race)
    assert info["errors"] == 0 and info["warnings"] == 2
    assert sanitize.parse_log("synccheck", "nothing")["errors"] is None  # no summary: not a clean run


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_without_a_gpu_it_says_so_and_exits_2():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sanitize.py"), "--one-call", "all"],
                            capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_run_tools_without_warmup_runs_only_the_tools(tmp_path, monkeypatch):
    """``--no-warmup`` (one process per tool after one shared warm-up): no warm-up line, each tool once."""
    commands = []

    def fake_run(command, timeout):
        commands.append(command)
        return "call loop/gumbel: ok in 0.1 s\n========= ERROR SUMMARY: 0 errors\n", 0

    monkeypatch.setattr(sanitize, "_run", fake_run)
    assert sanitize.run_tools(tmp_path, ["racecheck"], 5.0, warmup=False) == 0
    summary = (tmp_path / "summary.txt").read_text()
    assert "warm-up" not in summary and "racecheck  clean" in summary
    assert len(commands) == 1 and "racecheck" in commands[0]
    commands.clear()
    sanitize.run_tools(tmp_path, ["racecheck"], 5.0)
    assert len(commands) == 2 and "compute-sanitizer" not in commands[0]  # the warm-up, then the tool
