"""The vLLM plugin's entry point without vLLM installed: ``register()`` must never raise into vLLM's start-up.

vLLM's general-plugin loader calls ``register()`` while the engine starts; an exception there stops it. A stand-in
``vllm`` package (modules in ``sys.modules``) plays the versions and layouts ``=force`` may meet: the speculator
module missing, a speculator without ``load_draft_model``, no vLLM at all. test_vllm.py covers the real vLLM 0.33.0.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from dspark_markov.integrations import vllm as plugin
from dspark_markov.integrations.vllm import hook


class Speculator:
    def load_draft_model(self, target, names):
        return None


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in vLLM 0.99.0 on a CUDA platform with a DSpark speculator; the plugin's state restored after."""
    root = types.ModuleType("vllm")
    root.__version__ = "0.99.0"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cuda=lambda: True)
    speculator = types.ModuleType(plugin._SPECULATOR)
    speculator.DSparkSpeculator = type("DSparkSpeculator", (Speculator,), {})
    monkeypatch.setitem(sys.modules, "vllm", root)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, plugin._SPECULATOR, speculator)
    monkeypatch.setattr(plugin, "_registered", {"enabled": False, "reason": "", "classes": []})
    monkeypatch.setattr(hook, "_logged", set())
    monkeypatch.setenv(plugin.ENV, "force")
    monkeypatch.delenv(hook.IMPL_ENV, raising=False)
    return speculator


def test_force_turns_the_stand_in_on(fake_vllm):
    plugin.register()
    assert plugin.status()["enabled"] is True
    assert getattr(fake_vllm.DSparkSpeculator.load_draft_model, "dspark_markov", False)


def test_a_missing_speculator_module_leaves_the_plugin_off(fake_vllm, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, plugin._SPECULATOR, None)  # (importing it raises ImportError)
    with caplog.at_level(logging.WARNING):
        plugin.register()
    assert plugin.status()["enabled"] is False and "no DSpark speculator" in plugin.status()["reason"]
    assert any("stays off" in r.getMessage() for r in caplog.records)


def test_a_speculator_without_load_draft_model_leaves_the_plugin_off(fake_vllm):
    fake_vllm.DSparkSpeculator = type("DSparkSpeculator", (), {})
    plugin.register()
    assert plugin.status()["enabled"] is False and "load_draft_model" in plugin.status()["reason"]


def test_no_vllm_leaves_the_plugin_off(fake_vllm, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    plugin.register()
    assert plugin.status()["enabled"] is False and "cannot be imported" in plugin.status()["reason"]


@pytest.mark.parametrize("value", ["0", "off", ""])
def test_off_says_which_setting(fake_vllm, monkeypatch, value):
    monkeypatch.setenv(plugin.ENV, value)
    plugin.register()
    assert plugin.status()["enabled"] is False
    assert plugin.status()["reason"] == (f"{plugin.ENV} is not set" if not value else f"{plugin.ENV}={value}")


def test_an_unknown_design_is_named_at_start_up(fake_vllm, monkeypatch, caplog):
    monkeypatch.setenv(hook.IMPL_ENV, "bogus")
    with caplog.at_level(logging.WARNING):
        plugin.register()
    assert plugin.status()["enabled"] is True  # (on: each step is then declined and drafted by vLLM's loop)
    assert any(hook.IMPL_ENV in r.getMessage() and "'bogus'" in r.getMessage() for r in caplog.records)


def test_the_design_name_ignores_case(fake_vllm, monkeypatch, caplog):
    monkeypatch.setenv(hook.IMPL_ENV, " AUTO ")
    with caplog.at_level(logging.WARNING):
        plugin.register()
    assert hook._impl() == "auto" and not any(hook.IMPL_ENV in r.getMessage() for r in caplog.records)


def test_a_local_version_label_is_the_checked_version(fake_vllm, monkeypatch):
    """vLLM's wheels for another CUDA carry a local label (``0.33.0+cu126``): the same source as 0.33.0, so
    ``=1`` turns the plugin on; another release stays off."""
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.33.0+cu126")
    plugin.register()
    assert plugin.status()["enabled"] is True, plugin.status()["reason"]
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.33.1+cu126")
    plugin.register()
    assert plugin.status()["enabled"] is False and "0.33.1+cu126" in plugin.status()["reason"]


def test_force_asks_no_platform(fake_vllm, monkeypatch):
    """``=force`` is on whatever the platform, also on a vLLM whose platform API differs (no ``vllm.platforms``):
    ``register()`` must not raise into vLLM's start-up."""
    monkeypatch.setitem(sys.modules, "vllm.platforms", None)  # (importing it raises ImportError)
    plugin.register()
    assert plugin.status()["enabled"] is True


def test_a_speculator_that_fails_to_import_leaves_the_plugin_off(fake_vllm, monkeypatch):
    """Any error importing the speculator (not only ImportError) leaves the plugin off, with the reason."""

    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError("CUDA initialization failed")

    monkeypatch.setitem(sys.modules, plugin._SPECULATOR, Broken(plugin._SPECULATOR))
    plugin.register()
    assert plugin.status()["enabled"] is False and "CUDA initialization failed" in plugin.status()["reason"]


def test_a_design_that_cannot_run_names_the_setting(monkeypatch, caplog):
    """A DSPARK_MARKOV_VLLM_IMPL that names a design the hook cannot run (``inverse_cdf``: vLLM draws Gumbel):
    the step is declined, writes nothing, and the logged reason names the setting."""
    import torch

    from tests.integrations import vllm_standin as standin

    monkeypatch.setenv(hook.IMPL_ENV, "inverse_cdf")
    monkeypatch.setattr(hook, "_logged", set())
    gen = torch.Generator().manual_seed(0)
    vocab, rank, steps, rows = 100, 8, 3, 4
    w1 = torch.randn(vocab, rank, generator=gen).bfloat16()
    w2 = torch.randn(128, rank, generator=gen).bfloat16()  # padded rows, as ParallelLMHead's
    model = standin.HookedDraftModel(w1, w2, vocab, 1.0, torch.randn(rows * steps, vocab, generator=gen).bfloat16())
    spec = standin.Speculator(model, None, max_num_reqs=rows, num_steps=steps, vocab=vocab, device="cpu")
    standin.fill_batch(spec, 2, gen)
    tokens, cache = spec.draft_tokens.clone(), spec.draft_logits.clone()
    with caplog.at_level(logging.INFO, logger="vllm.dspark_markov"):
        assert hook.sample_sequential(spec, 2, torch.zeros(rows * steps, 4)) is False
    assert torch.equal(spec.draft_tokens, tokens) and torch.equal(spec.draft_logits, cache)
    refusals = [r.getMessage() for r in caplog.records if "MarkovSampler refused" in r.getMessage()]
    assert refusals and all(f"{hook.IMPL_ENV}='inverse_cdf'" in message for message in refusals), refusals
    assert not any("drafting through" in r.getMessage() for r in caplog.records)  # (it does not draft)
