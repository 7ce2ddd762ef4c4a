"""vLLM general plugin: DSpark's Markov draft sampling on NVIDIA GPUs through dspark-markov.

Entry point (``pyproject.toml``, group ``vllm.general_plugins``): :func:`register`, which vLLM
calls in each of its processes at start-up. It does nothing unless the one setting is on:

- ``DSPARK_MARKOV_VLLM=1``: on, for the vLLM versions it was checked against (``CHECKED_VERSIONS``)
  on a CUDA platform; on any other version or platform it logs one line and stays off;
- ``DSPARK_MARKOV_VLLM=force``: on whatever the version or platform;
- unset / ``0``: off (vLLM runs exactly as without the package).

When on, it wraps ``DSparkSpeculator.load_draft_model`` so that the loaded draft model's class, if
it is one of vLLM's NVIDIA DSpark draft models (``MODEL_CLASSES``) and has no ``sample_sequential``
of its own (the AMD DeepSeek-V4.1 class keeps vLLM's), gets the hook of :mod:`.hook`; it also wraps
``DSparkSpeculator._sample_sequential_topk`` (top-k drafting, which vLLM runs without asking the
model) so that models with the hook draft that mode through it too. Optional:
``DSPARK_MARKOV_VLLM_IMPL`` picks the design (default ``auto``).

How to see that it is active: the INFO lines ``dspark-markov: ...`` in vLLM's log (enabled,
hook installed on <class>, drafting through MarkovSampler(impl=...), and each reason a step was
left to vLLM's loop, once), and :func:`status` in the worker process.
"""

from __future__ import annotations

import logging
import os

from ... import MarkovSampler
from . import hook

ENV = "DSPARK_MARKOV_VLLM"
CHECKED_VERSIONS = ("0.33.0",)
# vLLM's NVIDIA (and platform-neutral) DSpark draft models whose Markov step is the speculator loop's
# markov_head.embed / markov_head.bias(LogitsProcessor) pair.
MODEL_CLASSES = (
    "vllm.models.deepseek_v41.nvidia.dspark.DSparkDeepseekV4ForCausalLM",
    "vllm.models.deepseek_v4.nvidia.dspark.DSparkDeepseekV4ForCausalLM",
    "vllm.model_executor.models.qwen3_dspark.Qwen3DSparkForCausalLM",
    "vllm.models.kimi_k3.nvidia.dspark_mla.K3DSparkForCausalLM",
)
_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.dspark.speculator"
_ON = ("1", "on", "true", "yes")
_FORCE = ("force",)
_OFF = ("", "0", "off", "false", "no")

logger = hook.logger
_registered = {"enabled": False, "reason": "register() not called", "classes": []}


def _model_sample_sequential(model, speculator, num_reqs, head_hidden):
    """``model.sample_sequential(speculator, num_reqs, head_hidden)`` as the speculator calls it."""
    return hook.sample_sequential(speculator, num_reqs, head_hidden)


_model_sample_sequential.dspark_markov = True


def qualified_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def install(cls) -> bool:
    """Give ``cls`` the hook when it is one of ``MODEL_CLASSES`` without a ``sample_sequential``
    of its own; True when the class has the hook afterwards."""
    name = qualified_name(cls)
    existing = getattr(cls, "sample_sequential", None)
    if getattr(existing, "dspark_markov", False):
        return True
    if name not in MODEL_CLASSES:
        hook.log_once(logging.INFO, "dspark-markov: %s is not one of the NVIDIA DSpark draft models it was "
                      "checked with; vLLM's loop drafts", name)
        return False
    if existing is not None:
        hook.log_once(logging.INFO, "dspark-markov: %s has its own sample_sequential; left as it is", name)
        return False
    cls.sample_sequential = _model_sample_sequential
    _registered["classes"].append(name)
    hook.log_once(logging.INFO, "dspark-markov: sample_sequential hook installed on %s", name)
    return True


def _wrap_load_draft_model(speculator_cls) -> None:
    original = speculator_cls.load_draft_model
    if getattr(original, "dspark_markov", False):
        return

    def load_draft_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        install(type(model))
        return model

    load_draft_model.dspark_markov = True
    load_draft_model.__wrapped__ = original
    load_draft_model.__doc__ = original.__doc__
    speculator_cls.load_draft_model = load_draft_model


def _wrap_sample_sequential_topk(speculator_cls) -> None:
    """Top-k drafting: vLLM's ``_sample_sequential`` calls ``_sample_sequential_topk`` without asking
    the model, so the hook sits on that method; it drafts only for models that have the hook."""
    original = getattr(speculator_cls, "_sample_sequential_topk", None)
    if original is None or getattr(original, "dspark_markov", False):
        return

    def _sample_sequential_topk(self, num_reqs, head_hidden):
        hooked = getattr(getattr(type(self.model), "sample_sequential", None), "dspark_markov", False)
        if hooked and hook.sample_sequential_topk(self, num_reqs, head_hidden):
            return None
        return original(self, num_reqs, head_hidden)

    _sample_sequential_topk.dspark_markov = True
    _sample_sequential_topk.__wrapped__ = original
    _sample_sequential_topk.__doc__ = original.__doc__
    speculator_cls._sample_sequential_topk = _sample_sequential_topk


def _off(reason: str) -> None:
    """The plugin stays off for ``reason`` (logged once as a warning): vLLM's own loop drafts, and its start-up
    goes on (a general plugin that raises would stop it)."""
    _registered.update(enabled=False, reason=reason)
    hook.log_once(logging.WARNING, "dspark-markov: %s; the plugin stays off", reason)


def register() -> None:
    """vLLM's general-plugin entry point (idempotent; see the module docstring)."""
    mode = os.environ.get(ENV, "").strip().lower()
    if mode in _OFF:
        _registered.update(enabled=False, reason=f"{ENV} is not set" if not mode else f"{ENV}={mode}")
        return
    if mode not in _ON + _FORCE:
        _registered.update(enabled=False, reason=f"{ENV}={mode!r} is not 1, force or 0")
        hook.log_once(logging.WARNING, "dspark-markov: %s=%r is not one of 1, force, 0; the plugin stays off", ENV, mode)
        return
    try:
        import vllm
    except ImportError as error:
        _off(f"vLLM cannot be imported ({error})")
        return

    version = getattr(vllm, "__version__", "unknown")
    # A local version label (the +cu126 of vLLM's wheels for another CUDA) is the same vLLM source.
    if str(version).split("+", 1)[0] not in CHECKED_VERSIONS and mode not in _FORCE:
        _registered.update(enabled=False, reason=f"vLLM {version} is not a checked version")
        hook.log_once(logging.WARNING, "dspark-markov: vLLM %s is not one of the versions the sample_sequential hook "
                      "was checked against (%s); it stays off (%s=force turns it on anyway)", version,
                      ", ".join(CHECKED_VERSIONS), ENV)
        return
    if mode not in _FORCE:  # (=force: any platform, and a vLLM whose platform API may differ)
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            _registered.update(enabled=False, reason="not a CUDA platform")
            hook.log_once(logging.WARNING, "dspark-markov: not an NVIDIA CUDA platform (%s); the hook stays off "
                          "(%s=force turns it on anyway)", type(current_platform).__name__, ENV)
            return
    import importlib

    try:  # (=force on another vLLM: its speculator may live elsewhere, lack the method the hook wraps or fail to import)
        speculator_cls = importlib.import_module(_SPECULATOR).DSparkSpeculator
        if not callable(getattr(speculator_cls, "load_draft_model", None)):
            raise AttributeError("DSparkSpeculator has no load_draft_model")
    except Exception as error:  # a general plugin that raises stops vLLM's start-up
        _off(f"vLLM {version} has no DSpark speculator the hook can wrap ({error})")
        return
    impl = hook._impl()
    if impl not in MarkovSampler.impl_names():
        hook.log_once(logging.WARNING, "dspark-markov: %s=%r is not a draft design (%s); every step will be "
                      "declined and drafted by vLLM's loop", hook.IMPL_ENV, impl, ", ".join(MarkovSampler.impl_names()))
    _wrap_load_draft_model(speculator_cls)
    _wrap_sample_sequential_topk(speculator_cls)
    _registered.update(enabled=True, reason="", version=version, mode=mode)
    hook.log_once(logging.INFO, "dspark-markov: DSpark sample_sequential plugin on (vLLM %s, %s=%s, impl=%s)",
                  version, ENV, mode, hook._impl())


def status() -> dict:
    """Whether the plugin is on (and why not), the classes hooked, and host-side call counts
    (``taken`` / ``declined`` / ``loop_rest``: eager calls and graph captures, not replays)."""
    return {**_registered, "classes": list(_registered["classes"]), "impl": hook._impl(), **hook.stats}
