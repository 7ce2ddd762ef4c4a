"""vLLM 0.33.0's own top-k/top-p filter and GPU rejection sampler, loaded for side-by-side timing.

Two vLLM operations the verification benchmarks compare ours with:

- ``filter``: ``apply_top_k_top_p_triton(logits, k, p, mask_value=-inf, has_topp_only_rows=True)``
  (``vllm/v1/sample/ops/topk_topp_triton.py``, the Qrita pivot filter): ``logits`` fp32 ``[B, V]``
  masked in place (the return value may alias it), ``k`` int32 ``[B]`` or None, ``p`` fp32 ``[B]`` or
  None; top-k first, then top-p over what is left;
- ``rejection``: ``rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos,
  idx_mapping, expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
  ...) -> (sampled [R, K+1] int64, num_sampled [R] int32)``
  (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, standard speculative sampling).

Where they come from (:func:`load_op`): an installed vLLM 0.33.0 whose Triton is live, else the
standalone copies ``tools/extract_vllm.py`` writes into the git-ignored ``.vllm-cache/vllm-0.33.0/``
(found as :func:`.vllm_loop.cache_dirs` says: ``DSPARK_MARKOV_VLLM_CACHE``, the working directory,
the repository root). Those copies are vLLM's files with only their vLLM import lines pointed at
Triton, at ``gumbel_standalone.py`` and at our ``vllm_standins.py`` (all in the same folder, which is
put on ``sys.path`` for the import); their SHA-256 is checked against ``SOURCE.txt``. Nothing of vLLM
is part of this package. When neither source works, ``ImportError`` says what was tried.

The stand-in launcher compiles a kernel variant at its first call (vLLM compiles them ahead, at
start-up): call once before timing or capturing a CUDA graph.

On the CPU (``TRITON_INTERPRET=1``) run them inside :func:`interpreter_shims`: Triton's interpreter
yields Python ints from ``tl.range`` (vLLM's filter calls ``.to(tl.int64)`` on one) and does not
interpret libdevice (the rejection sampler's ``tldevice.log1p``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .vllm_loop import VLLM_VERSION, cache_dirs, recorded_hashes, unverified  # noqa: F401  (recorded_hashes: re-exported)

# op -> (vLLM module, file stem in the cache, entry point)
OPS = {
    "filter": ("vllm.v1.sample.ops.topk_topp_triton", "topk_topp_triton", "apply_top_k_top_p_triton"),
    "rejection": ("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils", "rejection_sampler_utils",
                  "rejection_sample"),
}
SOURCES = ("auto", "installed", "cache")
# Files a standalone copy imports besides itself, by op.
_NEEDS = {"filter": ("vllm_standins.py",), "rejection": ("vllm_standins.py", "gumbel_standalone.py")}
_loaded: dict = {}


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")


def _from_installed(op: str, tried: list):
    module_name, _, entry = OPS[op]
    if importlib.util.find_spec("vllm") is None:
        tried.append("vLLM is not installed")
        return None
    try:
        version = getattr(importlib.import_module("vllm"), "__version__", "?")
        if version != VLLM_VERSION:
            tried.append(f"installed vLLM is {version}, not {VLLM_VERSION}")
            return None
        if not importlib.import_module("vllm.triton_utils").HAS_TRITON:
            tried.append(f"installed vLLM {version} disabled Triton (no active GPU driver)")
            return None
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a broken vLLM install: try the extracted copy
        tried.append(f"import {module_name}: {type(error).__name__}: {error}")
        return None
    return getattr(module, entry), f"installed vLLM {version} ({module.__file__})"


def _from_cache(op: str, tried: list):
    _, stem, entry = OPS[op]
    for root in cache_dirs():
        folder = Path(root) / f"vllm-{VLLM_VERSION}"
        names = (f"{stem}_standalone.py",) + _NEEDS[op]
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            tried.append(f"no {', '.join(str(folder / name) for name in missing)}")
            continue
        edited, unrecorded = unverified(folder, names)
        if edited or unrecorded:
            tried.append(f"{folder}: {', '.join(edited + unrecorded)} "
                         f"{'differ from' if edited else 'missing in'} SOURCE.txt (run tools/extract_vllm.py again)")
            continue
        ours = Path(__file__).resolve().parents[3] / "tools" / "vllm_standins.py"  # in a source checkout
        if ours.is_file() and ours.read_bytes() != (folder / "vllm_standins.py").read_bytes():
            tried.append(f"{folder / 'vllm_standins.py'} differs from {ours} (run tools/extract_vllm.py again)")
            continue
        module_name = f"{stem}_standalone"
        sys.path.insert(0, str(folder))
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - say why and try the next folder
            tried.append(f"import {folder / (module_name + '.py')}: {type(error).__name__}: {error}")
            continue
        finally:
            sys.path.remove(str(folder))
        if Path(module.__file__).resolve().parent != folder.resolve():
            tried.append(f"{module_name} is already imported from {module.__file__}, not {folder}")
            continue
        return getattr(module, entry), f"vLLM {VLLM_VERSION} {stem}.py extracted to {folder / (module_name + '.py')}"
    return None


def load_op(op: str, source: str = "auto"):
    """``(function, origin)``: vLLM's ``op`` (:data:`OPS`: ``"filter"`` or ``"rejection"``) and a line
    saying where it was loaded from.

    ``source``: ``"auto"`` (an installed vLLM 0.33.0, else the extracted copy), ``"installed"`` or
    ``"cache"``. Raises ``ImportError`` saying what was tried when it cannot be loaded.
    """
    _check_op(op)
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {', '.join(SOURCES)}, got {source!r}")
    key = (op, source)
    if key in _loaded:
        return _loaded[key]
    tried = []
    found = None
    if source in ("auto", "installed"):
        found = _from_installed(op, tried)
    if found is None and source in ("auto", "cache"):
        found = _from_cache(op, tried)
    if found is None:
        raise ImportError(f"vLLM's {OPS[op][2]} is not importable (" + "; ".join(tried)
                          + f"); run `python tools/extract_vllm.py` to extract it from the vLLM {VLLM_VERSION} wheel")
    _loaded[key] = found
    return found


def load_filter(source: str = "auto"):
    """``(apply_top_k_top_p_triton, origin)``: :func:`load_op` of ``"filter"``."""
    return load_op("filter", source)


def load_rejection_sampler(source: str = "auto"):
    """``(rejection_sample, origin)``: :func:`load_op` of ``"rejection"``."""
    return load_op("rejection", source)


def availability(source: str = "auto") -> dict:
    """``{op: origin, or "unavailable: <why>"}`` for every op of :data:`OPS`."""
    result = {}
    for op in OPS:
        try:
            result[op] = load_op(op, source)[1]
        except ImportError as error:
            result[op] = f"unavailable: {error}"
    return result


@contextlib.contextmanager
def interpreter_shims():
    """Under ``TRITON_INTERPRET=1``, for the duration: ``tl.range`` yields interpreter tensors (as
    compiled Triton's loop variables are) instead of Python ints, and libdevice's ``log1p(x)`` is
    computed as ``log(1 + x)`` (less accurate for ``|x|`` near 0; compiled code keeps libdevice).
    Elsewhere it changes nothing. It patches Triton's interpreter internals (checked with Triton 3.9)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    import triton.language.extra.libdevice as libdevice
    from triton.runtime import interpreter

    original = interpreter._patch_lang_core

    def patch_core(lang, scope):
        original(lang, scope)

        def tensor_range(arg1, arg2=None, step=None, **kwargs):
            start, end = (0, arg1) if arg2 is None else (arg1, arg2)
            for value in range(int(start), int(end), int(1 if step is None else step)):
                yield interpreter._implicit_cvt(value)

        scope.set_attr(lang, "range", tensor_range)

    old_log1p = libdevice.log1p
    interpreter._patch_lang_core = patch_core
    libdevice.log1p = lambda x: tl.log(x + 1.0)
    try:
        yield
    finally:
        interpreter._patch_lang_core = original
        libdevice.log1p = old_log1p
