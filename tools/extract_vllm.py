"""Extract vLLM 0.33.0's ``gumbel_sample`` module into the git-ignored ``.vllm-cache/`` folder.

The benchmark's ``vllm_loop`` baseline (``dspark_markov.bench.vllm_loop``) times the speculator's
loop built from vLLM's own ``gumbel_sample``. Where vLLM is installed it imports it from there;
elsewhere (the GPU machine has no vLLM) it loads the copy this script writes. Nothing of vLLM is
committed or copied into ``src/``: the cache is ``.vllm-cache/`` at the repository root, listed in
``.gitignore``.

Source of the file, in order: ``--wheel PATH`` (a vllm-0.33.0 wheel), an installed vllm 0.33.0 in
``--site-packages DIR`` (default: the side venv ``.venv-vllm/`` of ``tools/check_vllm.sh``), or
``pip download --no-deps vllm==0.33.0`` into a temporary folder (a large wheel; only the one
member is read). Written (three small files):

- ``.vllm-cache/vllm-0.33.0/gumbel.py``: ``vllm/v1/worker/gpu/sample/gumbel.py`` byte for byte;
- ``.vllm-cache/vllm-0.33.0/gumbel_standalone.py``: the same file with its one vLLM import
  (``from vllm.triton_utils import tl, triton``) replaced by Triton's own
  (``import triton; import triton.language as tl``, on one line, so every other line keeps its
  number); nothing else differs;
- ``.vllm-cache/vllm-0.33.0/SOURCE.txt``: where it came from, SHA-256 of both files, the change.

Usage: ``python tools/extract_vllm.py [--wheel PATH | --site-packages DIR] [--out DIR]``.
"""

from __future__ import annotations

import argparse
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


def _from_wheel(wheel: Path) -> tuple:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(MEMBER), f"wheel {wheel.name} (sha256 {_sha256(wheel.read_bytes())})"


def _from_site_packages(site: Path) -> tuple | None:
    path = site / MEMBER
    metadata = site / f"vllm-{VERSION}.dist-info" / "METADATA"
    if not (path.is_file() and metadata.is_file()):
        return None
    return path.read_bytes(), f"installed vllm {VERSION} at {site}"


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
    data, origin = found
    source = data.decode("utf-8")
    if "def gumbel_sample(" not in source:
        raise SystemExit(f"extract_vllm: {MEMBER} from {origin} defines no gumbel_sample")
    patched = standalone(source)

    folder = args.out / f"vllm-{VERSION}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gumbel.py").write_bytes(data)
    (folder / "gumbel_standalone.py").write_text(patched)
    (folder / "SOURCE.txt").write_text(
        f"vLLM {VERSION}: {MEMBER}\n"
        f"from: {origin}\n"
        f"gumbel.py sha256 {_sha256(data)} (byte for byte)\n"
        f"gumbel_standalone.py sha256 {_sha256(patched.encode())}\n"
        f"change: the line {VLLM_IMPORT!r} -> {TRITON_IMPORT!r}; nothing else\n"
        "written by tools/extract_vllm.py; git-ignored, never committed (vLLM is Apache-2.0)\n")
    print(f"extract_vllm: wrote {folder} ({origin})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
