"""The benchmark's honest baseline: vLLM's speculator loop built from vLLM's own ``gumbel_sample``.

``DSparkSpeculator._sample_sequential`` (vLLM 0.33.0, ``vllm/v1/worker/gpu/spec_decode/dspark/
speculator.py``) runs, for each of the N steps (about 9 kernels a step):

1. ``markov_embed = W1[prev]`` (the Markov head's ``nn.Embedding``);
2. ``bias = F.linear(markov_embed, W2)`` in the weight dtype (``LogitsProcessor`` over
   ``markov_w2``; ``* scale`` when the processor's scale is not 1);
3. ``logits_i = base_logits[:, i] + bias`` (a torch add, computed in fp32 and rounded once);
4. ``gumbel_sample(logits_i, idx_map[:, i], temperature, seeds, sample_pos[:, i] - 1,
   apply_temperature=True, is_drafting=True, logits_cache=draft_logits, logits_cache_col=step)``
   -- vLLM's Triton block kernel (which also writes the cache rows), an argmax over the block
   maxima and a gather;
5. ``draft_tokens[:R, i] = sampled``; ``prev = sampled``.

:class:`VllmLoop` is that loop, line for line, on the benchmark's buffers, calling the real
``gumbel_sample`` (whose small allocations per call it keeps, as vLLM does: under a CUDA graph they
come from the graph's pool). Where it comes from (:func:`load_gumbel_sample`): an importable vLLM
0.33.0, else the copy ``tools/extract_vllm.py`` extracts from the vLLM 0.33.0 wheel into the
git-ignored ``.vllm-cache/`` (with the SHA-256 its ``SOURCE.txt`` records; found through
``DSPARK_MARKOV_VLLM_CACHE``, the working directory or the repository root). The cached logits and tokens equal the reference's (SPEC.md: vLLM's noise uses
``tl.log``, ours a software log; they agree on every draw measured so far).

vLLM's ``gumbel_sample`` requires the logits in the cache's dtype: an fp32 cache needs fp32 base
logits (``--logits-dtype float32``; the bias stays in the weight dtype and the add is in fp32).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

VLLM_VERSION = "0.33.0"
CACHE_ENV = "DSPARK_MARKOV_VLLM_CACHE"
_MODULE = "vllm.v1.worker.gpu.sample.gumbel"
_CACHED_FILE = Path(f"vllm-{VLLM_VERSION}") / "gumbel_standalone.py"
_loaded: dict = {}


def cache_dirs() -> list:
    """Folders searched for the extracted module, in order."""
    dirs = []
    if os.environ.get(CACHE_ENV):
        dirs.append(Path(os.environ[CACHE_ENV]))
    dirs.append(Path.cwd() / ".vllm-cache")
    dirs.append(Path(__file__).resolve().parents[3] / ".vllm-cache")  # the repository root of a source checkout
    return list(dict.fromkeys(dirs))


def recorded_hashes(folder: Path) -> dict:
    """``{file name: sha256}`` from ``folder/SOURCE.txt`` (lines ``<file> sha256 <hex>``); {} without it."""
    path = Path(folder) / "SOURCE.txt"
    if not path.is_file():
        return {}
    found = re.findall(r"^(\S+\.py) sha256 ([0-9a-f]{64})", path.read_text(), flags=re.MULTILINE)
    return dict(found)


def unverified(folder: Path, names) -> tuple:
    """``(edited, unrecorded)``: those of the extracted files ``names`` of ``folder`` whose SHA-256 differs from the
    one ``SOURCE.txt`` records, and those it records none for (both empty: every one is vLLM 0.33.0's)."""
    hashes = recorded_hashes(folder)
    edited = [name for name in names
              if name in hashes and hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest() != hashes[name]]
    return edited, [name for name in names if name not in hashes]


def load_gumbel_sample():
    """``(gumbel_sample, origin)``: vLLM's function and a line saying where it was loaded from.

    Only vLLM 0.33.0's: an installed vLLM of another version is passed over, and the extracted copy
    must have the SHA-256 that ``SOURCE.txt`` records for it (as :mod:`.vllm_ops` requires).
    Raises ``ImportError`` saying what was tried when neither an installed vLLM nor the extracted
    copy is there (run ``python tools/extract_vllm.py``).
    """
    if "fn" in _loaded:
        return _loaded["fn"], _loaded["origin"]
    tried = []
    if importlib.util.find_spec("vllm") is not None:
        try:
            version = getattr(importlib.import_module("vllm"), "__version__", "?")
            if version != VLLM_VERSION:  # another version's gumbel_sample is not the baseline
                tried.append(f"installed vLLM is {version}, not {VLLM_VERSION}")
            else:
                module = importlib.import_module(_MODULE)
                if importlib.import_module("vllm.triton_utils").HAS_TRITON:
                    _loaded.update(fn=module.gumbel_sample, origin=f"installed vLLM {version} ({module.__file__})")
                    return _loaded["fn"], _loaded["origin"]
                # Without an active GPU driver vLLM replaces triton.jit by a placeholder (set
                # CUDA_VISIBLE_DEVICES= to keep Triton's interpreter); the extracted copy has real kernels.
                tried.append(f"installed vLLM {version} disabled Triton (no active GPU driver)")
        except Exception as error:  # noqa: BLE001 - a broken vLLM install: try the extracted copy
            tried.append(f"import {_MODULE}: {type(error).__name__}: {error}")
    else:
        tried.append("vLLM is not installed")
    for folder in cache_dirs():
        path = folder / _CACHED_FILE
        if not path.is_file():
            tried.append(f"no {path}")
            continue
        edited, unrecorded = unverified(path.parent, (path.name,))
        if edited or unrecorded:
            tried.append(f"{path} {'differs from' if edited else 'missing in'} "
                         f"{path.parent / 'SOURCE.txt'} (run tools/extract_vllm.py again)")
            continue
        spec = importlib.util.spec_from_file_location("_dspark_markov_vllm_gumbel", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # Triton's JIT reads the functions' source through the module
        spec.loader.exec_module(module)
        _loaded.update(fn=module.gumbel_sample, origin=f"vLLM {VLLM_VERSION} gumbel.py extracted to {path}")
        return _loaded["fn"], _loaded["origin"]
    raise ImportError("vLLM's gumbel_sample is not importable (" + "; ".join(tried)
                      + "); run `python tools/extract_vllm.py` to extract it from the vLLM 0.33.0 wheel")


class VllmLoop:
    """vLLM 0.33.0's ``_sample_sequential`` loop (Gumbel, probabilistic drafts) on given buffers.

    Parameters
    ----------
    head : :class:`~dspark_markov.MarkovHead` (W1 ``[V_t, R_k]``, W2 ``[V, R_k]``, scale).
    num_steps : N.
    gumbel_sample : vLLM's function (:func:`load_gumbel_sample`).

    :meth:`run` takes the SPEC.md buffers (``base_logits [R, N, V]``, ``anchor [R]``,
    ``idx_mapping``/``positions [R*N]``, ``temperature``/``seeds [S]``, ``draft_tokens [R, N]``
    int64, ``logits_cache [S, N, V]`` in the logits' dtype). CUDA-graph capturable as vLLM's loop
    is (its temporaries come from the graph's pool).
    """

    def __init__(self, head, num_steps: int, gumbel_sample):
        self.embed = head.embed_weight  # markov_w1.weight [V_t, R_k]
        self.weight = head.head_weight  # markov_w2.weight [V, R_k]
        self.scale = head.scale
        self.num_steps = int(num_steps)
        self.gumbel_sample = gumbel_sample
        # vLLM's self._step_cols: the cache column (= the step) of each step, a device tensor.
        self.step_cols = torch.arange(self.num_steps, dtype=torch.int32, device=head.device)

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        rows, n_spec, _ = base_logits.shape
        if logits_cache.dtype != base_logits.dtype:
            raise ValueError(f"logits_cache: vLLM's gumbel_sample needs the logits' dtype ({base_logits.dtype}), "
                             f"got {logits_cache.dtype}")
        idx_map = idx_mapping.view(rows, n_spec)
        sample_pos = positions.view(rows, n_spec)
        prev = anchor
        for i in range(n_spec):
            markov_embed = F.embedding(prev, self.embed)
            bias = F.linear(markov_embed, self.weight)
            if self.scale != 1.0:
                bias *= self.scale
            logits_i = base_logits[:, i] + bias
            sampled = self.gumbel_sample(logits_i, idx_map[:, i], temperature, seeds, sample_pos[:, i] - 1,
                                         apply_temperature=True, is_drafting=True, logits_cache=logits_cache,
                                         logits_cache_col=self.step_cols[i], use_fp64=False)
            draft_tokens[:rows, i] = sampled
            prev = sampled
