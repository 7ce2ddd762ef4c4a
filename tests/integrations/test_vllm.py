"""The vLLM plugin against vLLM 0.33.0's own speculator loop (skipped where vLLM is not installed).

Run by ``tools/check_vllm.sh`` in the side environment ``.venv-vllm`` (vLLM 0.33.0 and this
package; Triton's interpreter, ``CUDA_VISIBLE_DEVICES=`` so that vLLM keeps Triton without a GPU).
A ``DSparkSpeculator`` is made with ``object.__new__`` and only the attributes
``_sample_sequential`` reads; its draft model is vLLM's NVIDIA ``DSparkDeepseekV4ForCausalLM``
(also made with ``object.__new__``) carrying vLLM's ``DSparkMarkovHead``, a ``ParallelLMHead``
and a ``LogitsProcessor``, so ``compute_draft_logits``, ``markov_embed``, ``markov_bias``,
``_sample_logits`` and ``gumbel_sample`` are vLLM's code. vLLM's ``_sample_sequential`` runs twice
on the same inputs, without the hook (vLLM's loop) and with it, and the whole ``draft_tokens`` and
``draft_logits`` buffers must be equal bit for bit. Weights are multiples of 1/16 so that the bias
sums are exact in fp32 whatever the summation order (SPEC.md section 3 leaves the order free).
"""

from __future__ import annotations

import contextlib
import logging
import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # vLLM keeps Triton (the interpreter) without a GPU

vllm = pytest.importorskip("vllm")
if vllm.__version__ != "0.33.0":
    pytest.skip(f"checked against vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True)

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.logits_processor import LogitsProcessor  # noqa: E402
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead  # noqa: E402
from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead  # noqa: E402
from vllm.models.deepseek_v41.nvidia.dspark import DSparkDeepseekV4ForCausalLM  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator  # noqa: E402

from dspark_markov.integrations import vllm as plugin  # noqa: E402
from dspark_markov.integrations.vllm import hook  # noqa: E402

if not HAS_TRITON:
    pytest.skip("vLLM disabled Triton here (set CUDA_VISIBLE_DEVICES= to keep the interpreter)", allow_module_level=True)

DEVICE = torch.device("cpu")


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def dyadic(shape, gen, dtype):
    return (torch.randint(-8, 9, shape, generator=gen) / 16).to(dtype)


def make_model(gen, *, vocab, rank, hidden, scale=1.0, weight_dtype=torch.bfloat16):
    """vLLM's DSparkDeepseekV4ForCausalLM (NVIDIA, V4.1) with just its Markov head, lm_head, norm and
    logits processor (no backbone)."""
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))), default_dtype(weight_dtype):
        markov_head = DSparkMarkovHead(vocab, vocab, rank, prefix="model.markov_head")
        lm_head = ParallelLMHead(vocab, hidden, prefix="lm_head", disable_tp=True)
        processor = LogitsProcessor(vocab, scale=scale)
    with torch.no_grad():
        markov_head.markov_w1.weight.copy_(dyadic(markov_head.markov_w1.weight.shape, gen, weight_dtype))
        markov_head.markov_w2.weight.copy_(dyadic(markov_head.markov_w2.weight.shape, gen, weight_dtype))  # padded rows too
        lm_head.weight.copy_(dyadic(lm_head.weight.shape, gen, weight_dtype))
    model = object.__new__(DSparkDeepseekV4ForCausalLM)
    torch.nn.Module.__init__(model)
    model.model = torch.nn.Module()
    model.model.markov_head = markov_head
    model.model.norm = torch.nn.Identity()
    model.lm_head = lm_head
    model.logits_processor = processor
    return model


def make_speculator(model, gen, *, num_reqs, max_reqs, steps, vocab, hidden, padding_rows=(), temperatures=(1.0,),
                    fp64=False, query_per_req=None, cache_dtype=torch.bfloat16):
    """A DSparkSpeculator with the attributes _sample_sequential reads, vLLM's dtypes, random batch."""
    spec = object.__new__(DSparkSpeculator)
    query = query_per_req or steps
    n = max_reqs * steps
    spec.model = model
    spec.num_speculative_steps = steps
    spec.max_num_reqs = max_reqs
    spec.vocab_size = vocab
    spec.device = DEVICE
    spec._draft_topk = None
    spec.draft_watermarker = None
    spec._d2t_scatter_index = None
    spec._draft_scatter_buf = None
    spec.use_confidence_head = False
    spec.acceptance_estimator = None
    spec.use_fp64_gumbel = fp64
    spec._step_cols = torch.arange(steps, dtype=torch.int32)
    spec._anchor_idx = torch.arange(max_reqs, dtype=torch.int64) * query
    num_tokens = max_reqs * query + 3
    spec.input_buffers = types.SimpleNamespace(input_ids=torch.randint(0, vocab, (num_tokens,), generator=gen,
                                                                       dtype=torch.int32))
    spec.sample_indices = torch.randperm(num_tokens, generator=gen)[:n]
    slots = torch.randperm(max_reqs, generator=gen)[:num_reqs]
    slots[list(padding_rows)] = -1
    spec.sample_idx_mapping = torch.full((n,), -1, dtype=torch.int64)
    spec.sample_idx_mapping[: num_reqs * steps] = slots.repeat_interleave(steps)
    start = torch.randint(1, 1 << 20, (max_reqs, 1), generator=gen)
    spec.sample_pos = (start + torch.arange(steps) + 1).reshape(-1)
    table = torch.tensor(temperatures, dtype=torch.float32)
    spec.temperature = table[torch.arange(max_reqs) % len(temperatures)].contiguous()
    spec.seeds = torch.randint(-(1 << 62), 1 << 62, (max_reqs,), generator=gen)
    spec.draft_tokens = torch.full((max_reqs, steps), -5, dtype=torch.int64)
    spec.draft_logits = torch.full((max_reqs, steps, vocab), -3.0, dtype=cache_dtype)
    spec.head_hidden = dyadic((num_tokens, hidden), gen, torch.bfloat16)
    return spec


def clone_speculator(spec):
    twin = object.__new__(DSparkSpeculator)
    twin.__dict__.update(spec.__dict__)
    twin.draft_tokens = spec.draft_tokens.clone()
    twin.draft_logits = None if spec.draft_logits is None else spec.draft_logits.clone()
    return twin


@pytest.fixture
def hooked(monkeypatch):
    """Installs the hook on vLLM's class for the test (removed after it)."""
    monkeypatch.delenv(hook.IMPL_ENV, raising=False)
    assert getattr(DSparkDeepseekV4ForCausalLM, "sample_sequential", None) is None
    assert plugin.install(DSparkDeepseekV4ForCausalLM)
    yield
    del DSparkDeepseekV4ForCausalLM.sample_sequential


def run_both(spec, num_reqs, *, taken=True):
    """vLLM's _sample_sequential without, then with the hook, on twins of ``spec``; the twins."""
    plain, with_hook = clone_speculator(spec), clone_speculator(spec)
    saved = DSparkDeepseekV4ForCausalLM.__dict__.get("sample_sequential")
    with torch.inference_mode():
        if saved is not None:
            del DSparkDeepseekV4ForCausalLM.sample_sequential
        try:
            plain._sample_sequential(num_reqs, spec.head_hidden)  # vLLM's loop: no hook
        finally:
            if saved is not None:
                DSparkDeepseekV4ForCausalLM.sample_sequential = saved
        before = hook.stats["taken"]
        with_hook._sample_sequential(num_reqs, spec.head_hidden)
    assert hook.stats["taken"] == before + int(taken), "the hook declined a case it should take"
    return plain, with_hook


def assert_same(plain, with_hook):
    assert torch.equal(plain.draft_tokens, with_hook.draft_tokens)
    assert plain.draft_logits.dtype == with_hook.draft_logits.dtype
    assert torch.equal(plain.draft_logits.view(torch.int16), with_hook.draft_logits.view(torch.int16))  # bit for bit


VOCAB, RANK, HIDDEN, STEPS, MAX_REQS = 1000, 16, 32, 3, 6  # W2 is padded to 1024 rows by ParallelLMHead


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", ["T=1", "mixed T, padding", "scale 0.5, 1+N layout"])
def test_hook_equals_vllm_loop(hooked, seed, case):
    gen = torch.Generator().manual_seed(100 * seed + 7)
    scale = 0.5 if "scale" in case else 1.0
    model = make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN, scale=scale)
    num_reqs = 5 if "padding" in case else (1 + seed % 3)
    spec = make_speculator(model, gen, num_reqs=num_reqs, max_reqs=MAX_REQS, steps=STEPS, vocab=VOCAB, hidden=HIDDEN,
                           padding_rows=(1, 3) if "padding" in case else (),
                           temperatures=(0.0, 0.6, 1.0, 1.7) if "mixed" in case else (1.0,),
                           query_per_req=STEPS + 1 if "1+N" in case else None)
    plain, with_hook = run_both(spec, num_reqs)
    assert_same(plain, with_hook)
    assert bool((plain.draft_tokens[num_reqs:] == -5).all())  # rows past num_reqs untouched
    # The cache rows of padding samples and unused slots are still the sentinel.
    live = {int(s) for s in spec.sample_idx_mapping[: num_reqs * STEPS] if s >= 0}
    for slot in set(range(MAX_REQS)) - live:
        assert bool((with_hook.draft_logits[slot] == -3.0).all())
    assert bool((with_hook.draft_logits[sorted(live)] != -3.0).any())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp64_gumbel_flag_takes_vllms_loop(hooked, seed):
    """With use_fp64_gumbel the hook declines (writes nothing) and vLLM's own loop drafts: the
    speculator's result is vLLM's, bit for bit."""
    gen = torch.Generator().manual_seed(40 + seed)
    spec = make_speculator(make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN), gen, num_reqs=4, max_reqs=MAX_REQS,
                           steps=STEPS, vocab=VOCAB, hidden=HIDDEN, padding_rows=(2,), temperatures=(0.0, 0.6, 1.0),
                           fp64=True)
    plain, with_hook = clone_speculator(spec), clone_speculator(spec)
    with torch.inference_mode():
        assert hook.sample_sequential(with_hook, 4, spec.head_hidden) is False
        assert torch.equal(with_hook.draft_tokens, spec.draft_tokens) and torch.equal(with_hook.draft_logits, spec.draft_logits)
        with_hook._sample_sequential(4, spec.head_hidden)  # the hook declines, vLLM's loop runs
        saved = DSparkDeepseekV4ForCausalLM.__dict__["sample_sequential"]
        del DSparkDeepseekV4ForCausalLM.sample_sequential
        try:
            plain._sample_sequential(4, spec.head_hidden)
        finally:
            DSparkDeepseekV4ForCausalLM.sample_sequential = saved
    assert_same(plain, with_hook)


def test_fp64_reference_noise_is_vllms():
    """Our fp64 reference draws against vLLM's fp64 gumbel_sample (when this passes, the hook can
    take the fp64 flag on the CPU: update hook.why_not)."""
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    from dspark_markov.draft import reference

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3000, generator=gen)
    temp = torch.tensor([1.0, 0.7, 1.3, 1.0])
    seeds = torch.randint(-(1 << 62), 1 << 62, (4,), generator=gen)
    pos = torch.randint(1, 10_000, (4,), generator=gen)
    cache = torch.zeros(4, 3, 3000)
    theirs = gumbel_sample(logits, torch.arange(4), temp, seeds, pos - 1, True, True, logits_cache=cache,
                           logits_cache_col=torch.tensor(2, dtype=torch.int32), use_fp64=True)
    ours = reference.draw_gumbel(logits, temp, seeds, 2, pos, fp64=True)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("impl", ["loop", "gumbel_fused", "fused", "chain"])
def test_hook_equals_vllm_loop_triton_designs(hooked, monkeypatch, impl):
    """The Triton designs (interpreter) through the hook: the same as vLLM's loop bit for bit."""
    monkeypatch.setenv(hook.IMPL_ENV, impl)
    gen = torch.Generator().manual_seed(11)
    model = make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN)
    spec = make_speculator(model, gen, num_reqs=3, max_reqs=4, steps=STEPS, vocab=VOCAB, hidden=HIDDEN,
                           padding_rows=(1,), temperatures=(1.0, 0.0, 0.6))
    plain, with_hook = run_both(spec, 3)
    assert_same(plain, with_hook)
    assert hook._states[with_hook].impl == impl


def _declined_cases():
    def attr(name, value):
        return lambda spec: setattr(spec, name, value)

    def model_attr(name, value):
        return lambda spec: setattr(spec.model, name, value)

    def processor(name, value):
        return lambda spec: setattr(spec.model.logits_processor, name, value)

    def quantized(spec):
        spec.model.model.markov_head.markov_w2.quant_method = type("Fp8EmbeddingMethod", (), {})()

    def no_head(spec):
        del spec.model.model.markov_head

    return {
        "top-k drafting": (attr("_draft_topk", 8), None, "top-k"),
        "greedy drafts": (attr("draft_logits", None), None, "greedy"),
        "watermarker": (attr("draft_watermarker", object()), None, "watermarker"),
        "reduced vocabulary": (attr("_d2t_scatter_index", torch.arange(VOCAB)), None, "reduced draft vocabulary"),
        "confidence head": (attr("use_confidence_head", True), None, "confidence head"),
        "acceptance estimator": (attr("acceptance_estimator", object()), None, "acceptance estimator"),
        "output logit transform": (model_attr("apply_output_logit_transform", lambda x: x), None, "logit transform"),
        "soft cap": (processor("soft_cap", 30.0), None, "soft cap"),
        "fp32 head_dtype": (processor("head_dtype", torch.float32), None, "head_dtype"),
        "fp32 Markov weights": (None, dict(weight_dtype=torch.float32), "Markov weights"),
        "quantized markov_w2": (quantized, None, "quantized"),
        "fp32 cache": (None, dict(cache_dtype=torch.float32), "non-bf16 draft logits cache"),
        "fp64 Gumbel": (None, dict(fp64=True), "fp64"),
        "batch invariant": (None, dict(env={"VLLM_BATCH_INVARIANT": "1"}), "VLLM_BATCH_INVARIANT"),
        "no rows": (None, dict(num_reqs=0), "batch outside"),
        "too many rows": (None, dict(num_reqs=MAX_REQS + 1), "batch outside"),
        "inverse-CDF design": (None, dict(impl="inverse_cdf"), "MarkovSampler refused"),
        "no Markov head": (no_head, None, "no Markov head"),
        "fp64 temperature buffer": (lambda spec: setattr(spec, "temperature", spec.temperature.double()), None,
                                    "speculator.temperature"),
    }


@pytest.mark.parametrize("name", list(_declined_cases()))
def test_declined_cases_write_nothing(hooked, monkeypatch, caplog, name):
    change, options, reason = _declined_cases()[name]
    options = dict(options or {})
    for key, value in options.pop("env", {}).items():
        monkeypatch.setenv(key, value)
    if "impl" in options:
        monkeypatch.setenv(hook.IMPL_ENV, options.pop("impl"))
    num_reqs = options.pop("num_reqs", 3)
    gen = torch.Generator().manual_seed(5)
    model = make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN,
                       weight_dtype=options.pop("weight_dtype", torch.bfloat16))
    spec = make_speculator(model, gen, num_reqs=min(num_reqs, MAX_REQS), max_reqs=MAX_REQS, steps=STEPS, vocab=VOCAB,
                           hidden=HIDDEN, **options)
    if change is not None:
        change(spec)
    tokens = spec.draft_tokens.clone()
    cache = None if spec.draft_logits is None else spec.draft_logits.clone()
    declined = hook.stats["declined"]
    with caplog.at_level(logging.INFO, logger="vllm.dspark_markov"), torch.inference_mode():
        assert DSparkDeepseekV4ForCausalLM.sample_sequential(spec.model, spec, num_reqs, spec.head_hidden) is False
    assert hook.stats["declined"] == declined + 1
    assert torch.equal(spec.draft_tokens, tokens)
    if cache is not None:
        assert torch.equal(spec.draft_logits, cache)
    assert reason == "MarkovSampler refused" or reason in hook.why_not(spec, num_reqs)
    logged = [r.getMessage() for r in caplog.records] + [key[1] for key in hook._logged]
    assert any(reason in message for message in logged), logged


def test_sampler_refusal_after_the_base_logits_finishes_with_vllms_loop(hooked, monkeypatch):
    """A ValueError of MarkovSampler.sample (raised before it writes anything) once the base logits
    are computed: the hook finishes with vLLM's loop from them, and the result is vLLM's."""
    from dspark_markov.draft.sampler import MarkovSampler

    def refuse(self, *args, **kwargs):
        raise ValueError("base_logits: refused for the test")

    monkeypatch.setattr(MarkovSampler, "sample", refuse)
    gen = torch.Generator().manual_seed(21)
    spec = make_speculator(make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN), gen, num_reqs=4, max_reqs=MAX_REQS,
                           steps=STEPS, vocab=VOCAB, hidden=HIDDEN, padding_rows=(0,), temperatures=(0.6, 1.0))
    rest = hook.stats["loop_rest"]
    plain, with_hook = run_both(spec, 4, taken=False)
    assert hook.stats["loop_rest"] == rest + 1
    assert_same(plain, with_hook)


def test_decline_is_logged_once(hooked, caplog):
    gen = torch.Generator().manual_seed(9)
    spec = make_speculator(make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN), gen, num_reqs=2, max_reqs=MAX_REQS,
                           steps=STEPS, vocab=VOCAB, hidden=HIDDEN)
    spec.draft_watermarker = types.SimpleNamespace(sample=None)
    hook._logged.discard((logging.INFO, "dspark-markov: vLLM's loop drafts this step: " + hook.DECLINED[2]))
    with caplog.at_level(logging.INFO, logger="vllm.dspark_markov"):
        for _ in range(3):
            assert hook.sample_sequential(spec, 2, spec.head_hidden) is False
    assert sum(hook.DECLINED[2] in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------------------------------------- plugin entry point


@pytest.fixture
def speculator_class(monkeypatch):
    """Restores DSparkSpeculator.load_draft_model and the plugin's status after a test."""
    monkeypatch.setattr(DSparkSpeculator, "load_draft_model", DSparkSpeculator.load_draft_model)
    monkeypatch.setattr(DSparkSpeculator, "_sample_sequential_topk", DSparkSpeculator._sample_sequential_topk)
    monkeypatch.setattr(plugin, "_registered", {"enabled": False, "reason": "", "classes": []})
    return DSparkSpeculator


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    (point,) = [p for p in entry_points(group="vllm.general_plugins") if p.name == "dspark_markov"]
    assert point.value == "dspark_markov.integrations.vllm:register" and point.load() is plugin.register


def test_off_unless_turned_on(monkeypatch, speculator_class):
    monkeypatch.delenv(plugin.ENV, raising=False)
    plugin.register()
    assert not getattr(speculator_class.load_draft_model, "dspark_markov", False)
    assert plugin.status()["enabled"] is False and plugin.ENV in plugin.status()["reason"]
    monkeypatch.setenv(plugin.ENV, "maybe")
    plugin.register()
    assert not getattr(speculator_class.load_draft_model, "dspark_markov", False)


def test_version_guard_and_platform(monkeypatch, speculator_class):
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    plugin.register()
    assert plugin.status()["enabled"] is False and "0.34.0" in plugin.status()["reason"]
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    plugin.register()  # checked version, but this machine is not a CUDA platform
    assert plugin.status()["enabled"] is False and "CUDA" in plugin.status()["reason"]
    assert not getattr(speculator_class.load_draft_model, "dspark_markov", False)


def test_force_through_vllms_plugin_loader(monkeypatch, speculator_class):
    """vLLM's own loader finds the entry point; with =force the speculator's load_draft_model then
    installs the hook on the draft model's class."""
    import vllm.plugins

    monkeypatch.setenv(plugin.ENV, "force")
    monkeypatch.setattr(vllm, "__version__", "0.99.0")  # force ignores the version guard
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert getattr(speculator_class.load_draft_model, "dspark_markov", False)
    assert getattr(speculator_class._sample_sequential_topk, "dspark_markov", False)  # top-k drafting too
    assert plugin.status()["enabled"] is True

    assert speculator_class.load_draft_model.__wrapped__ is not None

    # The wrapper calls the original load_draft_model, then installs the hook on the model's class.
    gen = torch.Generator().manual_seed(3)
    model = make_model(gen, vocab=VOCAB, rank=RANK, hidden=HIDDEN)
    holder = type("Holder", (), {"load_draft_model": lambda self, target, names: model})
    plugin._wrap_load_draft_model(holder)
    try:
        assert holder().load_draft_model(None, set()) is model
        assert getattr(DSparkDeepseekV4ForCausalLM.sample_sequential, "dspark_markov", False)
        assert "DSparkDeepseekV4ForCausalLM" in plugin.status()["classes"][-1]
    finally:
        if "sample_sequential" in DSparkDeepseekV4ForCausalLM.__dict__:
            del DSparkDeepseekV4ForCausalLM.sample_sequential


def test_install_only_on_checked_classes():
    other = type("SomeOtherDraftModel", (), {})
    assert plugin.install(other) is False and not hasattr(other, "sample_sequential")
    own = type("DSparkDeepseekV4ForCausalLM", (), {"sample_sequential": lambda self, *a: False,
                                                    "__module__": "vllm.models.deepseek_v41.nvidia.dspark"})
    assert plugin.install(own) is False  # a class with its own hook keeps it


# ---------------------------------------------------------------------------------------------- drafting modes (issue 17)
from vllm.model_executor.models.qwen3_dspark import DSparkConfidenceHead, Qwen3DSparkForCausalLM  # noqa: E402

DRAFT_VOCAB, TARGET_VOCAB = 700, 1000  # a reduced draft vocabulary: W2 and the base logits [700], W1 and the cache [1000]


def make_qwen3_model(gen, *, target_vocab, draft_vocab, rank, hidden, scale=1.0, d2t=True, confidence=False):
    """vLLM's Qwen3DSparkForCausalLM (made with object.__new__): its Markov head (W1 target-indexed,
    W2 draft-indexed, the top-k gathered path), lm_head, logits processor, d2t table and, optionally,
    its confidence head (with the Markov embeddings)."""
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))), default_dtype(torch.bfloat16):
        markov_head = DSparkMarkovHead(target_vocab, draft_vocab, rank, prefix="model.markov_head",
                                       retain_weight_for_gather=True)
        lm_head = ParallelLMHead(draft_vocab, hidden, prefix="lm_head", disable_tp=True)
        processor = LogitsProcessor(draft_vocab, scale=scale)
    head = None
    if confidence:  # vLLM's DSparkConfidenceHead.forward; its ReplicatedLinear (which needs a TP group) as F.linear
        head = object.__new__(DSparkConfidenceHead)
        torch.nn.Module.__init__(head)
        head.with_markov = True
        head.proj = torch.nn.Linear(hidden + rank, 1, bias=True, dtype=torch.float32)
    with torch.no_grad():
        for weight in (markov_head.markov_w1.weight, markov_head.markov_w2.weight, lm_head.weight):
            weight.copy_(dyadic(weight.shape, gen, torch.bfloat16))
        if head is not None:
            head.proj.weight.copy_(torch.randn(head.proj.weight.shape, generator=gen))
            head.proj.bias.copy_(torch.randn(head.proj.bias.shape, generator=gen))
    model = object.__new__(Qwen3DSparkForCausalLM)
    torch.nn.Module.__init__(model)
    model.model = torch.nn.Module()
    model.model.markov_head = markov_head
    model.model.confidence_head = head
    model.lm_head = lm_head
    model.logits_processor = processor
    model.draft_id_to_target_id = None
    if d2t:
        ids = torch.randperm(target_vocab, generator=gen)[:draft_vocab].sort().values  # EAGLE-3 tables increase
        model.draft_id_to_target_id = torch.nn.Parameter(ids - torch.arange(draft_vocab), requires_grad=False)
    return model


def make_mode_speculator(model, gen, *, top_k=None, confidence=False, **options):
    """make_speculator over the target vocabulary, with vLLM's load_draft_model state of the modes."""
    width = model.model.markov_head.markov_w1.weight.shape[0]
    spec = make_speculator(model, gen, vocab=width, hidden=HIDDEN, **options)
    if model.draft_id_to_target_id is not None:  # DSparkSpeculator.load_draft_model's d2t scatter state
        d2t = model.draft_id_to_target_id
        spec._d2t_scatter_index = torch.arange(d2t.shape[0]) + d2t
        spec._draft_scatter_buf = torch.full((spec.max_num_reqs, width), float("-inf"), dtype=spec.draft_logits.dtype)
    spec._draft_topk = top_k
    spec.use_confidence_head = confidence
    spec.draft_token_confidence_probs = torch.full(spec.draft_tokens.shape, -2.0, dtype=torch.float32)
    return spec


def clone_mode_speculator(spec):
    twin = clone_speculator(spec)
    twin.draft_token_confidence_probs = spec.draft_token_confidence_probs.clone()
    if spec._draft_scatter_buf is not None:
        twin._draft_scatter_buf = spec._draft_scatter_buf.clone()
    return twin


@pytest.fixture
def hooked_modes(monkeypatch):
    """The hook on Qwen3DSparkForCausalLM and the plugin's _sample_sequential_topk wrapper (both removed after)."""
    monkeypatch.delenv(hook.IMPL_ENV, raising=False)
    monkeypatch.setattr(DSparkSpeculator, "_sample_sequential_topk", DSparkSpeculator._sample_sequential_topk)
    plugin._wrap_sample_sequential_topk(DSparkSpeculator)
    assert getattr(Qwen3DSparkForCausalLM, "sample_sequential", None) is None
    assert plugin.install(Qwen3DSparkForCausalLM)
    yield
    del Qwen3DSparkForCausalLM.sample_sequential


def run_both_modes(spec, num_reqs, *, taken=True):
    """vLLM's _sample_sequential without the hook (the model class unhooked, so the top-k wrapper
    runs vLLM's own _sample_sequential_topk), then with it."""
    plain, with_hook = clone_mode_speculator(spec), clone_mode_speculator(spec)
    saved = Qwen3DSparkForCausalLM.__dict__["sample_sequential"]
    with torch.inference_mode():
        del Qwen3DSparkForCausalLM.sample_sequential
        try:
            plain._sample_sequential(num_reqs, spec.head_hidden)
        finally:
            Qwen3DSparkForCausalLM.sample_sequential = saved
        before = hook.stats["taken"]
        with_hook._sample_sequential(num_reqs, spec.head_hidden)
    assert hook.stats["taken"] == before + int(taken), "the hook declined a mode it should take"
    return plain, with_hook


MODE_CASES = {
    "reduced vocabulary, T=1": dict(d2t=True, top_k=None, temperatures=(1.0,)),
    "reduced vocabulary, mixed T, padding": dict(d2t=True, top_k=None, padding=True),
    "top-k 8, mixed T, padding": dict(d2t=False, top_k=8, padding=True),
    "top-k 1, scale 0.5": dict(d2t=False, top_k=1, scale=0.5, temperatures=(0.6, 1.0)),
    "top-k 40 + reduced vocabulary, mixed T, padding": dict(d2t=True, top_k=40, padding=True),
    "top-k 5 + reduced vocabulary + confidence head, 1+N layout": dict(d2t=True, top_k=5, confidence=True, one_plus_n=True),
    "reduced vocabulary + confidence head": dict(d2t=True, top_k=None, confidence=True, padding=True),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", list(MODE_CASES))
def test_modes_equal_vllm_loop(hooked_modes, seed, case):
    """vLLM's _sample_sequential / _sample_sequential_topk with a reduced vocabulary, top-k drafting and
    the confidence head, without and with the hook: draft_tokens, draft_logits (bit for bit) and the
    confidence probabilities equal."""
    options = MODE_CASES[case]
    gen = torch.Generator().manual_seed(300 * seed + 13)
    confidence = options.get("confidence", False)
    model = make_qwen3_model(gen, target_vocab=TARGET_VOCAB, draft_vocab=DRAFT_VOCAB if options["d2t"] else TARGET_VOCAB,
                             rank=RANK, hidden=HIDDEN, scale=options.get("scale", 1.0), d2t=options["d2t"],
                             confidence=confidence)
    num_reqs = 5 if options.get("padding") else 1 + seed % 3
    spec = make_mode_speculator(model, gen, top_k=options["top_k"], confidence=confidence, num_reqs=num_reqs,
                                max_reqs=MAX_REQS, steps=STEPS, padding_rows=(1, 3) if options.get("padding") else (),
                                temperatures=options.get("temperatures", (0.0, 0.6, 1.0, 1.7)),
                                query_per_req=STEPS + 1 if options.get("one_plus_n") else None)
    plain, with_hook = run_both_modes(spec, num_reqs)
    assert_same(plain, with_hook)
    assert bool((plain.draft_tokens[num_reqs:] == -5).all())
    if options["d2t"]:
        mapped = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
        mapped[spec._d2t_scatter_index] = True
        assert bool(mapped[with_hook.draft_tokens[:num_reqs]].all()), "a token outside the draft vocabulary's ids"
    if confidence:
        assert torch.equal(plain.draft_token_confidence_probs, with_hook.draft_token_confidence_probs)
        assert bool((with_hook.draft_token_confidence_probs[:num_reqs] != -2.0).all())
    written = with_hook.draft_logits[with_hook.draft_logits != -3.0]
    assert written.numel() > 0 and bool(torch.isinf(written).any())  # -inf outside the mapped ids / candidates


@pytest.mark.parametrize("case", ["reduced vocabulary, mixed T, padding", "top-k 40 + reduced vocabulary, mixed T, padding",
                                  "top-k 8, mixed T, padding"])
def test_modes_equal_vllm_loop_fused(hooked_modes, monkeypatch, case):
    """The Triton designs of the modes (interpreter; impl 'fused') through the hook, bit for bit."""
    monkeypatch.setenv(hook.IMPL_ENV, "fused")
    options = MODE_CASES[case]
    gen = torch.Generator().manual_seed(77)
    model = make_qwen3_model(gen, target_vocab=TARGET_VOCAB, draft_vocab=DRAFT_VOCAB if options["d2t"] else TARGET_VOCAB,
                             rank=RANK, hidden=HIDDEN, d2t=options["d2t"])
    spec = make_mode_speculator(model, gen, top_k=options["top_k"], num_reqs=4, max_reqs=4, steps=STEPS,
                                padding_rows=(1,), temperatures=(1.0, 0.0, 0.6))
    plain, with_hook = run_both_modes(spec, 4)
    assert_same(plain, with_hook)
    assert hook._states[with_hook].impl == "fused"


def test_reduced_vocabulary_above_the_measured_batch_is_vllms(hooked_modes, monkeypatch):
    """Above hook.D2T_MAX_ROWS (where vLLM's loop measured faster) the dense reduced-vocabulary step is
    declined and drafted by vLLM's loop; top-k drafting with d2t is still taken."""
    monkeypatch.setattr(hook, "D2T_MAX_ROWS", 2)
    gen = torch.Generator().manual_seed(91)
    model = make_qwen3_model(gen, target_vocab=TARGET_VOCAB, draft_vocab=DRAFT_VOCAB, rank=RANK, hidden=HIDDEN)
    spec = make_mode_speculator(model, gen, num_reqs=3, max_reqs=MAX_REQS, steps=STEPS, temperatures=(1.0, 0.6))
    assert "reduced draft vocabulary at 3 rows" in hook.why_not(spec, 3)
    plain, with_hook = run_both_modes(spec, 3, taken=False)
    assert_same(plain, with_hook)
    spec._draft_topk = 4
    plain, with_hook = run_both_modes(spec, 3)
    assert_same(plain, with_hook)
