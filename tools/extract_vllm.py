"""Extract vLLM 0.33.0's ``gumbel_sample``, top-k/top-p filter and rejection sampler into ``.vllm-cache/``.

The benchmark's ``vllm_loop`` baseline (``dspark_markov.bench.vllm_loop``) times the speculator's
loop built from vLLM's own ``gumbel_sample``. Where vLLM is installed it imports it from there;
elsewhere (the GPU machine has no vLLM) it loads the copy this script writes. Nothing of vLLM is
committed or copied into ``src/``: the cache is ``.vllm-cache/`` at the repository root, listed in
``.gitignore``.

Source of the file, in order: ``--wheel PATH`` (a vllm-0.33.0 wheel), an installed vllm 0.33.0 in
``--site-packages DIR`` (default: the side venv ``.venv-vllm/`` of ``tools/check_vllm.sh``), or
``pip download --no-deps vllm==0.33.0`` into a temporary folder (a large wheel; only these
members are read). Written:

- ``.vllm-cache/vllm-0.33.0/gumbel.py``: ``vllm/v1/worker/gpu/sample/gumbel.py`` byte for byte;
- ``.vllm-cache/vllm-0.33.0/gumbel_standalone.py``: the same file with its one vLLM import
  (``from vllm.triton_utils import tl, triton``) replaced by Triton's own
  (``import triton; import triton.language as tl``, on one line, so every other line keeps its
  number); nothing else differs;
- the same pair (``<name>.py`` byte for byte, ``<name>_standalone.py``) for each module of
  :data:`MODULES`: ``topk_topp_triton`` (``vllm/v1/sample/ops/topk_topp_triton.py``, the Qrita
  top-k/top-p filter, ``apply_top_k_top_p_triton``) and ``rejection_sampler_utils``
  (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, the GPU rejection sampler,
  ``rejection_sample``). Their standalone copies change only the first line of each vLLM import
  statement (:func:`standalone_module`, same line count, every kernel line unchanged): Triton's own
  imports for ``vllm.triton_utils``, ``gumbel_standalone`` for vLLM's gumbel module, and
  ``vllm_standins`` (our ``tools/vllm_standins.py``, copied beside them) for the rest. They import
  ``vllm_standins`` / ``gumbel_standalone`` as top-level modules: put the folder on ``sys.path``
  (``dspark_markov.bench.vllm_ops`` does). A module missing from the source is reported, not fatal;
- ``.vllm-cache/vllm-0.33.0/source/<member>``: each module of :data:`SOURCE_MODULES` byte for byte under
  its path in the wheel (the DSpark speculator and its bases, the NVIDIA DSpark draft models the vLLM
  plugin hooks, the logits processor and LM head), never imported and without standalone copies:
  ``tests/integrations/test_vllm_source.py`` reads them with ``ast`` to check every name the plugin
  (``dspark_markov.integrations.vllm``) relies on. A module missing from the source is reported, not fatal;
- ``.vllm-cache/vllm-0.33.0/vllm_standins.py``: a copy of ``tools/vllm_standins.py``;
- ``.vllm-cache/vllm-0.33.0/SOURCE.txt``: where it came from, the SHA-256 of every file written
  (lines ``<file> sha256 <hex>``), the changes.

Usage: ``python tools/extract_vllm.py [--wheel PATH | --site-packages DIR] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.33.0"
MEMBER = "vllm/v1/worker/gpu/sample/gumbel.py"
VLLM_IMPORT = "from vllm.triton_utils import tl, triton"
TRITON_IMPORT = "import triton; import triton.language as tl  # was: " + VLLM_IMPORT
REPO = Path(__file__).resolve().parent.parent
STANDINS = Path(__file__).resolve().parent / "vllm_standins.py"
STANDIN_MODULE = "vllm_standins"
GUMBEL_MODULE = "gumbel_standalone"
# Member -> (file stem in the cache, the entry point its source must define).
MODULES = {
    "vllm/v1/sample/ops/topk_topp_triton.py": ("topk_topp_triton", "apply_top_k_top_p_triton"),
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py": ("rejection_sampler_utils", "rejection_sample"),
}
# vLLM's own source for tests/integrations/test_vllm_source.py (``ast`` only, never imported): member -> a class
# its source must define. Written byte for byte as ``source/<member>``.
SOURCE_DIR = "source"
SOURCE_MODULES = {
    "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py": "DSparkSpeculator",
    "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py": "DFlashSpeculator",
    "vllm/v1/worker/gpu/spec_decode/speculator.py": "DraftModelSpeculator",
    "vllm/v1/worker/gpu/input_batch.py": "InputBuffers",
    "vllm/model_executor/models/qwen3_dspark.py": "Qwen3DSparkForCausalLM",
    "vllm/model_executor/models/qwen3_dflash.py": "DFlashQwen3ForCausalLM",
    "vllm/models/deepseek_v41/nvidia/dspark.py": "DSparkDeepseekV4ForCausalLM",
    "vllm/models/deepseek_v4/nvidia/dspark.py": "DSparkDeepseekV4ForCausalLM",
    "vllm/models/kimi_k3/nvidia/dspark_mla.py": "K3DSparkForCausalLM",
    "vllm/model_executor/layers/logits_processor.py": "LogitsProcessor",
    "vllm/model_executor/layers/vocab_parallel_embedding.py": "VocabParallelEmbedding",
}
_MEMBERS = (MEMBER, *MODULES, *SOURCE_MODULES)  # every member read from a wheel or site-packages
# vLLM module -> the module a standalone copy takes its names from (None: Triton's own imports).
IMPORT_TARGETS = {
    "vllm.triton_utils": None,
    "vllm.v1.worker.gpu.sample.gumbel": GUMBEL_MODULE,
    "vllm.model_executor.warmup.jit_warmup": STANDIN_MODULE,
    "vllm.model_executor.warmup.jit_warmup_triton_helper": STANDIN_MODULE,
    "vllm.platforms": STANDIN_MODULE,
    "vllm.utils.gpu_sync_debug": STANDIN_MODULE,
    "vllm.utils.math_utils": STANDIN_MODULE,
    "vllm.utils.platform_utils": STANDIN_MODULE,
    "vllm.v1.spec_decode.fly": STANDIN_MODULE,
    "vllm.v1.worker.gpu.sample.watermark": STANDIN_MODULE,
}
# What ``from vllm.triton_utils import <name>`` becomes, in this order on the one line.
TRITON_NAMES = {"triton": "import triton", "tl": "import triton.language as tl",
                "tldevice": "import triton.language.extra.libdevice as tldevice"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def standalone(source: str) -> str:
    """``source`` with its one ``vllm.triton_utils`` import replaced by Triton's (same line count)."""
    lines = source.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == VLLM_IMPORT]
    if len(hits) != 1:
        raise SystemExit(f"extract_vllm: expected exactly one line {VLLM_IMPORT!r} in {MEMBER}, found {len(hits)}")
    others = [line for line in lines if "vllm" in line and line.strip() != VLLM_IMPORT and line.lstrip().startswith(("import", "from"))]
    if others:
        raise SystemExit(f"extract_vllm: {MEMBER} imports more of vLLM than triton_utils: {others}")
    lines[hits[0]] = TRITON_IMPORT + "\n"
    return "".join(lines)


def standin_names(path: Path = STANDINS) -> set:
    """Names defined at the top level of ``tools/vllm_standins.py`` (what a standalone copy may import)."""
    return top_level_names(path.read_text())


def _vllm_imports(tree) -> list:
    """Every import statement of ``tree`` (at any depth) that names a ``vllm`` module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            found.append(node)
        elif isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "vllm" for alias in node.names):
            found.append(node)
    return found


def _replacement(node, line: str, label: str) -> str:
    """The standalone line that replaces the first line ``line`` of the vLLM import ``node``."""
    where = f"{label}:{node.lineno}"
    if isinstance(node, ast.Import):
        raise SystemExit(f"extract_vllm: {where}: a plain 'import vllm...' cannot be pointed at a stand-in: {line.strip()!r}")
    if node.module not in IMPORT_TARGETS:
        raise SystemExit(f"extract_vllm: {where} imports {node.module}, which has no stand-in "
                         f"(known: {', '.join(sorted(IMPORT_TARGETS))})")
    indent = line[:len(line) - len(line.lstrip())]
    head = f"from {node.module} import"
    body = line.strip()
    if not body.startswith(head):
        raise SystemExit(f"extract_vllm: {where}: expected the statement to start with {head!r}, got {body!r}")
    names = [alias.name for alias in node.names]
    target = IMPORT_TARGETS[node.module]
    if target is None:  # Triton's own modules, in a fixed order, on the one line
        if node.end_lineno != node.lineno or any(alias.asname for alias in node.names) or not set(names) <= set(TRITON_NAMES):
            raise SystemExit(f"extract_vllm: {where}: expected one line importing some of {', '.join(TRITON_NAMES)} "
                             f"from vllm.triton_utils, got {body!r}")
        return indent + "; ".join(TRITON_NAMES[name] for name in TRITON_NAMES if name in names) + "  # was: " + body
    return indent + f"from {target} import" + body[len(head):] + "  # was: " + body


def standalone_module(source: str, label: str = "<module>", allowed: dict | None = None) -> tuple:
    """``(standalone source, changes)``: ``source`` with the first line of each vLLM import statement
    pointed at Triton, ``gumbel_standalone`` or ``vllm_standins`` (:data:`IMPORT_TARGETS`).

    Every other line is kept byte for byte (the line count too); ``changes`` lists ``(line number,
    old line, new line)``. ``allowed`` (target module -> names it defines) refuses a name the
    target lacks. Raises ``SystemExit`` naming the line for an import that has no stand-in.
    """
    lines = source.splitlines(keepends=True)
    changes = []
    for node in sorted(_vllm_imports(ast.parse(source)), key=lambda node: node.lineno):
        index = node.lineno - 1
        old = lines[index]
        new = _replacement(node, old, label)
        target = IMPORT_TARGETS[node.module]
        missing = sorted({alias.name for alias in node.names} - set((allowed or {}).get(target, ()))) \
            if allowed is not None and target is not None else []
        if missing:
            raise SystemExit(f"extract_vllm: {label}:{node.lineno} imports {', '.join(missing)} from {target}, "
                             "which does not define them")
        ending = old[len(old.rstrip("\r\n")):]
        lines[index] = new + (ending or "\n")
        changes.append((node.lineno, old.rstrip("\r\n"), new))
    patched = "".join(lines)
    check_standalone(source, patched, label)
    return patched, changes


def check_standalone(source: str, patched: str, label: str = "<module>") -> None:
    """Refuse a standalone copy that is not ``source`` with only its vLLM import lines changed.

    Same line count; every changed line is the first line of a vLLM import of ``source``; no vLLM
    import is left; each import binds the same names as before.
    """
    old_lines, new_lines = source.splitlines(), patched.splitlines()
    if len(old_lines) != len(new_lines):
        raise SystemExit(f"extract_vllm: {label}: the standalone copy has {len(new_lines)} lines, vLLM's {len(old_lines)}")
    import_lines = {node.lineno for node in _vllm_imports(ast.parse(source))}
    changed = {number for number, (a, b) in enumerate(zip(old_lines, new_lines), 1) if a != b}
    if not changed <= import_lines:
        raise SystemExit(f"extract_vllm: {label}: lines {sorted(changed - import_lines)} changed outside vLLM imports")
    tree = ast.parse(patched)
    left = _vllm_imports(tree)
    if left:
        raise SystemExit(f"extract_vllm: {label}: vLLM imports left at lines {[node.lineno for node in left]}")

    def bound(tree):
        names = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        return sorted(names)

    if bound(ast.parse(source)) != bound(tree):
        raise SystemExit(f"extract_vllm: {label}: the standalone copy's imports bind other names than vLLM's")


def top_level_names(source: str) -> set:
    """Functions, classes and assigned names at the top level of ``source``."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def _read_wheel(wheel: Path) -> tuple:
    """``({member: bytes or None}, origin)`` for :data:`MEMBER` and every module of :data:`MODULES` and
    :data:`SOURCE_MODULES`."""
    with zipfile.ZipFile(wheel) as archive:
        present = set(archive.namelist())
        data = {member: archive.read(member) if member in present else None for member in _MEMBERS}
    digest = hashlib.sha256()
    with open(wheel, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return data, f"wheel {wheel.name} (sha256 {digest.hexdigest()})"


def _from_wheel(wheel: Path) -> tuple:
    return _read_wheel(wheel)


def _from_site_packages(site: Path) -> tuple | None:
    metadata = site / f"vllm-{VERSION}.dist-info" / "METADATA"
    if not ((site / MEMBER).is_file() and metadata.is_file()):
        return None
    data = {member: (site / member).read_bytes() if (site / member).is_file() else None for member in _MEMBERS}
    return data, f"installed vllm {VERSION} at {site}"


def _site_packages_of(venv: Path):
    for candidate in sorted(venv.glob("lib/python3*/site-packages")):
        yield candidate


def _download(tmp: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(tmp),
               f"vllm=={VERSION}"]
    print("extract_vllm: " + " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)
    wheels = sorted(tmp.glob(f"vllm-{VERSION}-*.whl"))
    if not wheels:
        raise SystemExit(f"extract_vllm: pip download left no vllm-{VERSION} wheel in {tmp}")
    return wheels[0]


def _extra_modules(data: dict, gumbel_source: str, folder: Path) -> list:
    """Write each module of :data:`MODULES` found in ``data`` and its standalone copy; the lines of
    SOURCE.txt that describe them (a missing module gets a line saying so)."""
    allowed = {STANDIN_MODULE: standin_names(), GUMBEL_MODULE: top_level_names(gumbel_source)}
    notes = []
    for member, (stem, entry) in MODULES.items():
        raw = data.get(member)
        if raw is None:
            print(f"extract_vllm: {member} is not in the source; {stem}.py not written", file=sys.stderr)
            notes.append(f"vLLM {VERSION}: {member}: not in the source, not extracted\n")
            continue
        source = raw.decode("utf-8")
        if entry not in top_level_names(source):
            raise SystemExit(f"extract_vllm: {member} defines no {entry}")
        patched, changes = standalone_module(source, member, allowed)
        (folder / f"{stem}.py").write_bytes(raw)
        (folder / f"{stem}_standalone.py").write_text(patched)
        notes.append(f"vLLM {VERSION}: {member}\n"
                     f"{stem}.py sha256 {_sha256(raw)} (byte for byte)\n"
                     f"{stem}_standalone.py sha256 {_sha256(patched.encode())}\n")
        notes += [f"change: line {number} {old!r} -> {new!r}\n" for number, old, new in changes]
    return notes


def _source_modules(data: dict, folder: Path) -> list:
    """Write each module of :data:`SOURCE_MODULES` found in ``data`` byte for byte under
    ``folder/source/``; the lines of SOURCE.txt that describe them."""
    notes = []
    for member, name in SOURCE_MODULES.items():
        raw = data.get(member)
        if raw is None:
            print(f"extract_vllm: {member} is not in the source; {SOURCE_DIR}/{member} not written", file=sys.stderr)
            notes.append(f"vLLM {VERSION}: {member}: not in the source, not extracted\n")
            continue
        if name not in top_level_names(raw.decode("utf-8")):
            raise SystemExit(f"extract_vllm: {member} defines no {name}")
        path = folder / SOURCE_DIR / member
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        notes.append(f"{SOURCE_DIR}/{member} sha256 {_sha256(raw)} (byte for byte, read with ast only)\n")
    return notes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help=f"a vllm-{VERSION} wheel to read")
    parser.add_argument("--site-packages", type=Path, help="site-packages of an installed vllm (default: .venv-vllm)")
    parser.add_argument("--out", type=Path, default=REPO / ".vllm-cache", help="cache folder (default .vllm-cache)")
    args = parser.parse_args(argv)

    found = None
    if args.wheel is not None:
        found = _from_wheel(args.wheel)
    else:
        sites = [args.site_packages] if args.site_packages else list(_site_packages_of(REPO / ".venv-vllm"))
        for site in sites:
            found = _from_site_packages(site)
            if found is not None:
                break
        if found is None:
            with tempfile.TemporaryDirectory() as tmp:
                found = _from_wheel(_download(Path(tmp)))
    members, origin = found
    data = members[MEMBER]
    if data is None:
        raise SystemExit(f"extract_vllm: {origin} holds no {MEMBER}")
    source = data.decode("utf-8")
    if "def gumbel_sample(" not in source:
        raise SystemExit(f"extract_vllm: {MEMBER} from {origin} defines no gumbel_sample")
    patched = standalone(source)

    folder = args.out / f"vllm-{VERSION}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gumbel.py").write_bytes(data)
    (folder / "gumbel_standalone.py").write_text(patched)
    notes = _extra_modules(members, source, folder) + _source_modules(members, folder)
    standins = STANDINS.read_bytes()
    (folder / "vllm_standins.py").write_bytes(standins)
    (folder / "SOURCE.txt").write_text(
        f"vLLM {VERSION}: {MEMBER}\n"
        f"from: {origin}\n"
        f"gumbel.py sha256 {_sha256(data)} (byte for byte)\n"
        f"gumbel_standalone.py sha256 {_sha256(patched.encode())}\n"
        f"change: the line {VLLM_IMPORT!r} -> {TRITON_IMPORT!r}; nothing else\n"
        + "".join(notes)
        + f"vllm_standins.py sha256 {_sha256(standins)} (ours: tools/vllm_standins.py, not vLLM's code)\n"
        "written by tools/extract_vllm.py; git-ignored, never committed (vLLM is Apache-2.0)\n")
    print(f"extract_vllm: wrote {folder} ({origin})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
