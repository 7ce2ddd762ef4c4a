"""The layer map of CONTRIBUTING.md, enforced: imports only look down, and no module cycle.

Every module of ``src/dspark_markov`` belongs to a unit (a sub-package, or a module at the root)
with a level in :data:`LAYERS`. An import (at module level or inside a function) may go to a
lower level or stay inside its own unit; ``integrations`` may import the public API (the package
root) only. The import graph of modules has no cycle. A new unit must be added to the map (and
to CONTRIBUTING.md) before it can be imported.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "dspark_markov"

# unit -> level (imports go to lower levels only, or inside the unit)
LAYERS = {
    "dspark_markov._version": 0, "dspark_markov.rng": 0, "dspark_markov.registry": 0, "dspark_markov.head": 0,
    "dspark_markov.ops": 1, "dspark_markov.cuda": 1,
    "dspark_markov.validate": 2,
    "dspark_markov.draft": 3,
    "dspark_markov.verify": 4, "dspark_markov.block_inputs": 4, "dspark_markov.sharded": 4,
    "dspark_markov.step": 5,
    "dspark_markov.bench": 6, "dspark_markov.demo": 6,
    "dspark_markov.cli": 7,
    "dspark_markov": 8,  # the package root: the public API
    "dspark_markov.integrations": 9,  # engine adapters: the public API only
}
PUBLIC_ONLY = {"dspark_markov.integrations"}


def _modules():
    """``{module name: path}`` of every module under ``src/dspark_markov``."""
    found = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT
    candidate = ".".join(parts[:2])
    return candidate


def _is_package(module: str) -> bool:
    return MODULES.get(module, Path()).name == "__init__.py"


def imports(module: str) -> set[str]:
    """The package modules ``module`` imports (anywhere in its body)."""
    path = MODULES[module]
    package = module if _is_package(module) else module.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            targets.update(name for name in names if name == ROOT or name.startswith(ROOT + "."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == ROOT or source.startswith(ROOT + ".")):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in MODULES else source)
    targets = {t if t in MODULES else t.rsplit(".", 1)[0] for t in targets}
    targets.discard(module)
    return targets


GRAPH = {module: imports(module) for module in MODULES}


def test_every_unit_is_on_the_map():
    missing = sorted({unit(m) for m in MODULES} - set(LAYERS))
    assert not missing, f"add these to LAYERS here and to the layer map in CONTRIBUTING.md: {missing}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_look_down(module):
    source_unit = unit(module)
    bad = []
    for target in sorted(GRAPH[module]):
        target_unit = unit(target)
        if target_unit == source_unit:
            continue
        if source_unit in PUBLIC_ONLY:
            if target != ROOT:
                bad.append(f"{target} (integrations import the public API, `dspark_markov`, only)")
        elif LAYERS.get(target_unit, 99) >= LAYERS.get(source_unit, -1):
            bad.append(f"{target} (level {LAYERS.get(target_unit)} >= {LAYERS.get(source_unit)})")
    assert not bad, f"{module} imports upward or sideways: {bad}"


def test_no_import_cycle():
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if target not in GRAPH:
                continue
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_the_checker_sees_relative_and_lazy_imports():
    """The graph is not vacuous: known edges are found (module level, relative, inside functions)."""
    assert "dspark_markov.ops.numerics" in GRAPH["dspark_markov.ops.filter"]
    assert "dspark_markov.draft.sampler" in GRAPH["dspark_markov.draft.api"]
    assert "dspark_markov.verify.triton_verify_stream" in GRAPH["dspark_markov.step"]  # imported in a function
