"""The GPU plans (``tools/gpu_plans/*.sh``) cannot fail for a reason the CPU can see: device time is scarce.

Every script parses (``bash -n``), every Python program it writes from a here-document compiles, and every
``python3 tools/<name>.py`` it runs exists in the tree or is added by a patch the same script applies.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PLANS = sorted((Path(__file__).resolve().parent.parent / "tools" / "gpu_plans").glob("*.sh"))
REPO = Path(__file__).resolve().parent.parent


def test_there_are_plans():
    assert len(PLANS) >= 5


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_plan_parses_and_its_programs_exist(plan):
    text = plan.read_text()
    if shutil.which("bash"):
        result = subprocess.run(["bash", "-n", str(plan)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    for body in re.findall(r"<<'PY'\n(.*?)\nPY\n", text, re.S):
        compile(body, f"{plan.name} here-document", "exec")
    patched = set()
    for patch in re.findall(r"tools/gpu_plans/([\w.]+\.patch)", text):
        patched |= set(re.findall(r"^\+\+\+ b/(\S+)", (REPO / "tools" / "gpu_plans" / patch).read_text(), re.M))
    for tool in set(re.findall(r"python3 (tools/[\w/]+\.py)", text)):
        assert (REPO / tool).exists() or tool in patched, f"{plan.name} runs {tool}, which is nowhere"
    for script in set(re.findall(r"bash (tools/[\w/]+\.sh)", text)):
        assert (REPO / script).exists(), f"{plan.name} runs {script}, which is nowhere"
