"""The vLLM plugin against vLLM 0.33.0's own source, read with ``ast`` (vLLM is never imported).

``tools/extract_vllm.py`` copies the modules the plugin relies on byte for byte into
``.vllm-cache/vllm-0.33.0/source/`` (git-ignored; it needs the vllm-0.33.0 wheel, an installed vLLM
or the network). Where that copy is present these tests check, in vLLM's source, every class, method
and attribute the plugin (``dspark_markov.integrations.vllm``) wraps, calls or reads, with the
parameters, dtypes and call lines it assumes; where it is absent (CI) they skip and say how to get it.
The names are taken from the plugin's own source wherever they can be (``hook.py`` and
``__init__.py`` parsed here too), so a name the plugin starts to read is checked without editing this
file. ``test_vllm.py`` runs vLLM's loop itself where vLLM 0.33.0 is installed (``tools/check_vllm.sh``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from dspark_markov.integrations import vllm as plugin
from dspark_markov.integrations.vllm import hook
from tests.helpers import ROOT, load_tool

tool = load_tool("extract_vllm")
SOURCE = ROOT / ".vllm-cache" / f"vllm-{tool.VERSION}" / tool.SOURCE_DIR
PLUGIN = Path(plugin.__file__).resolve().parent
SPECULATOR = plugin._SPECULATOR.replace(".", "/") + ".py"
QWEN3 = "vllm/model_executor/models/qwen3_dspark.py"
LOGITS = "vllm/model_executor/layers/logits_processor.py"
EMBEDDING = "vllm/model_executor/layers/vocab_parallel_embedding.py"
# Model hooks the hook reads only behind a check of its own (so a model may lack them), and why.
OPTIONAL_MODEL_HOOKS = {
    "apply_markov_bias_gathered": "top-k drafting: vLLM allows dspark_draft_topk for Qwen3 DSpark only, "
                                  "and the hook checks that it is callable",
    "apply_output_logit_transform": "the hook declines a model that has one",
}


# ------------------------------------------------------------------------------ reading vLLM's source
def member_of(module: str) -> str:
    """``vllm.a.b`` -> ``vllm/a/b.py``."""
    return module.replace(".", "/") + ".py"


@functools.cache
def _parsed(member: str):
    path = SOURCE / member
    return ast.parse(path.read_text(), filename=str(path)) if path.is_file() else None


def vllm_tree(member: str) -> ast.Module:
    """vLLM's ``member`` parsed; skips the test when the extracted copy is absent."""
    tree = _parsed(member)
    if tree is None:
        pytest.skip(f"{SOURCE / member} is absent: run `python tools/extract_vllm.py` (reads the vllm-{tool.VERSION} "
                    "wheel, an installed vLLM or downloads the wheel) to check the plugin against vLLM's source")
    return tree


@dataclass
class VllmClass:
    """One class of vLLM's source: its methods, the ``self.X`` it assigns anywhere, its bases."""

    name: str
    member: str
    methods: dict = field(default_factory=dict)       # name -> ast.FunctionDef
    assigned: dict = field(default_factory=dict)      # attribute -> the assigned value (ast), first seen
    bases: list = field(default_factory=list)         # (member or None, name)


def _self_targets(node):
    """``(attribute, value)`` for each ``self.X = value`` (also annotated and tuple assignments)."""
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets, value = [node.target], node.value
    else:
        return []
    found = []
    for target in targets:
        for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
            if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                found.append((leaf.attr, value))
    return found


def _imports(tree: ast.Module, member: str) -> dict:
    """Name -> the member it is imported from (relative imports resolved against ``member``)."""
    package = member.rsplit("/", 1)[0].split("/")
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = "/".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                names[alias.asname or alias.name] = module + ".py"
    return names


@functools.cache
def vllm_classes(member: str) -> dict:
    """``{name: VllmClass}`` of the top-level classes of vLLM's ``member``."""
    tree = vllm_tree(member)
    imports = _imports(tree, member)
    classes = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = VllmClass(node.name, member)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cls.methods[item.name] = item
                for statement in ast.walk(item):
                    for attribute, value in _self_targets(statement):
                        cls.assigned.setdefault(attribute, value)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                for target in (item.targets if isinstance(item, ast.Assign) else [item.target]):
                    if isinstance(target, ast.Name):
                        cls.assigned.setdefault(target.id, item.value)
        for base in node.bases:
            if isinstance(base, ast.Name):
                cls.bases.append((member if base.id in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
                                  else imports.get(base.id), base.id))
        classes[node.name] = cls
    return classes


def vllm_class(member: str, name: str) -> VllmClass:
    classes = vllm_classes(member)
    assert name in classes, f"vLLM {tool.VERSION}'s {member} defines no class {name}"
    return classes[name]


def lineage(cls: VllmClass) -> list:
    """``cls`` and its bases defined in the extracted modules (most derived first); bases from modules
    the extractor does not copy (``nn.Module``, vLLM's model interfaces) are left out."""
    chain, todo = [], [cls]
    while todo:
        current = todo.pop(0)
        chain.append(current)
        for member, name in current.bases:
            if member in tool.SOURCE_MODULES and name in vllm_classes(member):  # (skips if the member is absent)
                todo.append(vllm_classes(member)[name])
    return chain


def find(cls: VllmClass, name: str):
    """The method (``ast.FunctionDef``) or assigned value of ``name`` in ``cls`` or its bases, else None."""
    for current in lineage(cls):
        if name in current.methods:
            return current.methods[name]
        if name in current.assigned:
            return current.assigned[name]
    return None


def method(cls: VllmClass, name: str) -> ast.FunctionDef:
    found = find(cls, name)
    assert isinstance(found, ast.FunctionDef), f"{cls.member}: {cls.name} has no method {name}"
    return found


def params(function: ast.FunctionDef) -> list:
    """Positional parameter names of a vLLM method, ``self`` left out."""
    names = [arg.arg for arg in function.args.posonlyargs + function.args.args]
    return names[1:] if names[:1] == ["self"] else names


def accepts(function: ast.FunctionDef, count: int) -> bool:
    """Whether ``function`` takes ``count`` positional arguments (besides ``self``)."""
    names = params(function)
    required = len(names) - len(function.args.defaults)
    return required <= count and (count <= len(names) or function.args.vararg is not None)


def called_class(value) -> str | None:
    """``X`` for a value ``X(...)`` or ``a.b.X(...)``, else None."""
    if isinstance(value, ast.Call):
        return ast.unparse(value.func).rsplit(".", 1)[-1]
    return None


def resolve(cls: VllmClass, name: str) -> VllmClass:
    """The class ``name`` as ``cls``'s module sees it (defined there or imported from an extracted member)."""
    if name in vllm_classes(cls.member):
        return vllm_classes(cls.member)[name]
    member = _imports(vllm_tree(cls.member), cls.member).get(name)
    assert member is not None, f"{cls.member} neither defines nor imports {name}"
    return vllm_class(member, name)


def lines(function: ast.FunctionDef) -> set:
    """Every expression and statement of ``function``, unparsed (to look for the lines the hook mirrors)."""
    return {ast.unparse(node) for node in ast.walk(function) if isinstance(node, (ast.expr, ast.stmt))}


# ------------------------------------------------------------------------------ reading the plugin
@functools.cache
def plugin_tree(name: str) -> ast.Module:
    return ast.parse((PLUGIN / name).read_text())


def plugin_function(name: str, file: str = "hook.py") -> ast.FunctionDef:
    for node in ast.walk(plugin_tree(file)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"the plugin's {file} has no function {name}")


def reads(tree, *exprs: str) -> set:
    """Attribute names the plugin reads from any of ``exprs`` (source text: ``spec``, ``spec.model``, ...):
    ``expr.X`` and ``getattr(expr, "X", ...)`` / ``hasattr(expr, "X")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in exprs:
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and ast.unparse(node.args[0]) in exprs
              and isinstance(node.args[1], ast.Constant)):
            names.add(node.args[1].value)
    return names


def calls(tree, *exprs: str) -> dict:
    """``{method: {positional argument counts}}`` of the plugin's calls ``expr.method(...)``."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and ast.unparse(node.func.value) in exprs:
            found.setdefault(node.func.attr, set()).add(len(node.args))
    return found


def speculator() -> VllmClass:
    return vllm_class(SPECULATOR, "DSparkSpeculator")


# How hook.py names the speculator, and its draft model (``model = spec.model`` in why_not and _draft_vocab).
SPEC_READS = ("spec",)
MODEL_READS = ("spec.model", "model")


# ------------------------------------------------------------------------------ without the extracted source
def test_the_extractor_covers_every_module_the_plugin_names():
    """tools/extract_vllm.py extracts the speculator and every model class of MODEL_CLASSES (checked in CI too)."""
    assert tool.VERSION in plugin.CHECKED_VERSIONS
    assert tool.SOURCE_MODULES.get(SPECULATOR) == "DSparkSpeculator"
    for qualified in plugin.MODEL_CLASSES:
        module, name = qualified.rsplit(".", 1)
        assert tool.SOURCE_MODULES.get(member_of(module)) == name, qualified


def test_the_extractor_copies_vllms_source_byte_for_byte(tmp_path):
    """tools/extract_vllm.py from a synthetic wheel: a present module byte for byte under source/ with its
    SHA-256 in SOURCE.txt, an absent one reported, one without its class refused (checked in CI too)."""
    gumbel = "from vllm.triton_utils import tl, triton\n\ndef gumbel_sample(x):\n    return x\n"
    speculator_source = b"from vllm.config import VllmConfig\n\n\nclass DSparkSpeculator:\n    pass\n"
    wheel = tmp_path / f"vllm-{tool.VERSION}-cp38-abi3-manylinux1_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(tool.MEMBER, gumbel)
        archive.writestr(SPECULATOR, speculator_source)
    assert tool.main(["--wheel", str(wheel), "--out", str(tmp_path / "cache")]) == 0
    folder = tmp_path / "cache" / f"vllm-{tool.VERSION}"
    assert (folder / tool.SOURCE_DIR / SPECULATOR).read_bytes() == speculator_source
    text = (folder / "SOURCE.txt").read_text()
    assert f"{tool.SOURCE_DIR}/{SPECULATOR} sha256 {hashlib.sha256(speculator_source).hexdigest()}" in text
    assert f"{QWEN3}: not in the source" in text and not (folder / tool.SOURCE_DIR / QWEN3).exists()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(tool.MEMBER, gumbel)
        archive.writestr(SPECULATOR, b"class DFlashSpeculator:\n    pass\n")
    with pytest.raises(SystemExit, match="defines no DSparkSpeculator"):
        tool.main(["--wheel", str(wheel), "--out", str(tmp_path / "cache")])


# ------------------------------------------------------------------------------ the speculator
def test_the_methods_the_plugin_wraps_have_the_signatures_it_assumes():
    cls = speculator()
    assert "load_draft_model" in cls.methods and "_sample_sequential_topk" in cls.methods  # DSpark's own
    assert params(cls.methods["load_draft_model"]) == ["target_model", "target_attn_layer_names"]
    # The wrapper replaces _sample_sequential_topk with the same parameters.
    wrapper = plugin_function("_sample_sequential_topk", "__init__.py")
    assert params(cls.methods["_sample_sequential_topk"]) == params(wrapper) == ["num_reqs", "head_hidden"], \
        f"vLLM's _sample_sequential_topk{tuple(params(cls.methods['_sample_sequential_topk']))}, the wrapper's " \
        f"{tuple(params(wrapper))}"
    # load_draft_model's result is what the hook reads as spec.model: load_model stores it there.
    load_model = method(cls, "load_model")
    assert any(line.startswith("self.model = self.load_draft_model(") for line in lines(load_model))
    assert "return model" in lines(cls.methods["load_draft_model"])


def test_the_speculator_asks_the_model_as_the_hook_answers():
    """_sample_sequential: top-k first (without asking the model), then model.sample_sequential(self, num_reqs,
    head_hidden), whose True skips vLLM's loop; the plugin's method takes exactly those arguments."""
    function = speculator().methods["_sample_sequential"]
    assert params(function) == ["num_reqs", "head_hidden"]
    branches = [node for node in function.body if isinstance(node, ast.If)]
    assert ast.unparse(branches[0].test) == "self._draft_topk is not None"
    assert "self._sample_sequential_topk(num_reqs, head_hidden)" in lines(branches[0])
    asks = [node for node in ast.walk(function) if isinstance(node, ast.Assign)
            and ast.unparse(node.value) == "getattr(self.model, 'sample_sequential', None)"]
    assert len(asks) == 1, "vLLM's _sample_sequential no longer asks getattr(self.model, 'sample_sequential')"
    local = asks[0].targets[0].id
    seam = [node for node in branches if f"{local}(self, num_reqs, head_hidden)" in lines(node.test)]
    assert len(seam) == 1 and isinstance(seam[0].body[0], ast.Return), "True must end _sample_sequential"
    assert list(inspect.signature(plugin._model_sample_sequential).parameters) == \
        ["model", "speculator", "num_reqs", "head_hidden"]


def test_every_speculator_attribute_the_plugin_reads_exists():
    cls = speculator()
    read = reads(plugin_tree("hook.py"), *SPEC_READS) | reads(plugin_function("_sample_sequential_topk", "__init__.py"),
                                                             "self")
    missing = sorted(name for name in read if find(cls, name) is None)
    assert not missing, f"DSparkSpeculator (and its bases) has no {missing}"
    buffers = _input_buffers(cls)
    read = reads(plugin_tree("hook.py"), "spec.input_buffers")
    missing = sorted(name for name in read if find(buffers, name) is None)
    assert not missing, f"InputBuffers has no {missing}"


def _input_buffers(cls: VllmClass) -> VllmClass:
    """The class of the speculator's ``input_buffers`` (``self.input_buffers = InputBuffers(...)``)."""
    for current in lineage(cls):
        if "input_buffers" in current.assigned:
            return resolve(current, called_class(current.assigned["input_buffers"]))
    raise AssertionError("no self.input_buffers = ...(...) in the speculator's classes")


def _dtype_of(value) -> torch.dtype | None:
    """The ``dtype=torch.X`` keyword of an allocation ``torch.zeros(..., dtype=torch.X)``, as a torch dtype."""
    if isinstance(value, ast.Call):
        for keyword in value.keywords:
            if keyword.arg == "dtype" and ast.unparse(keyword.value).startswith("torch."):
                return getattr(torch, ast.unparse(keyword.value).split(".", 1)[1])
    return None


def test_the_buffers_have_dtypes_the_hook_takes():
    """vLLM's allocations of the buffers the hook hands to the sampler are of a dtype hook.SPECULATOR_DTYPES takes."""
    cls = speculator()
    for name, dtypes in hook.SPECULATOR_DTYPES.items():
        dtype = _dtype_of(find(cls, name))
        assert dtype in dtypes, f"speculator.{name} is allocated as {dtype}; the hook takes {dtypes}"
    dtype = _dtype_of(find(_input_buffers(cls), "input_ids"))
    assert dtype in hook.INPUT_IDS_DTYPES, f"input_ids is allocated as {dtype}"
    anchor = find(cls, "_anchor_idx")  # torch.arange(max_num_reqs, dtype=...) * num_query_per_req: an index
    assert isinstance(anchor, ast.BinOp) and _dtype_of(anchor.left) in (torch.int32, torch.int64), ast.unparse(anchor)


def test_every_branch_of_vllms_loop_is_one_the_hook_looks_at():
    """Each speculator attribute (and model hook) that vLLM's loop and _sample_logits branch on is read by
    hook.why_not: a new mode of vLLM's loop fails here until the hook takes or declines it."""
    cls = speculator()
    looked_at = reads(plugin_function("why_not"), *SPEC_READS)
    model_hooks = reads(plugin_function("why_not"), *MODEL_READS)
    unseen = set()
    for name in ("_sample_sequential", "_sample_sequential_topk", "_sample_logits", "_maybe_predict_acceptance"):
        for node in ast.walk(method(cls, name)):
            if isinstance(node, (ast.If, ast.IfExp)):
                unseen |= {f"self.{n}" for n in reads(node.test, "self") - looked_at}
                unseen |= {f"self.model.{n}" for n in reads(node.test, "self.model") - model_hooks}
    assert not unseen, f"vLLM's loop branches on {sorted(unseen)}, which hook.why_not never reads"


def test_vllms_loop_reads_the_buffers_as_the_hook_does():
    """The lines of _sample_sequential / _sample_sequential_topk / _sample_logits that the hook mirrors."""
    cls = speculator()
    dense = lines(cls.methods["_sample_sequential"])
    for line in ("self.input_buffers.input_ids[self._anchor_idx[:num_reqs]]",  # anchor
                 "head_hidden[self.sample_indices[:num_sample]]",              # the rows of the base logits
                 "self.model.compute_draft_logits(sample_hidden)",
                 "self.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)",
                 "self.sample_pos[:num_sample].view(num_reqs, n_spec)",
                 "self.model.markov_embed(prev)", "self.model.markov_bias(markov_embed)",
                 "self._sample_logits(logits_i, idx_map[:, i], sample_pos[:, i], i)",
                 ("self.model.compute_confidence(sample_hidden, "
                  "torch.stack(confidence_markov_embeds, dim=1).flatten(0, 1))")):
        assert line in dense, f"vLLM's _sample_sequential has no {line!r}"
    top_k = lines(cls.methods["_sample_sequential_topk"])
    for line in ("base_logits.topk(self._draft_topk, dim=-1)", "base_logits.fill_(float('-inf'))",
                 ("self.model.apply_markov_bias_gathered(markov_embed, base_logits[:, i], base_values[:, i], "
                  "draft_indices[:, i])")):
        assert line in top_k, f"vLLM's _sample_sequential_topk has no {line!r}"
    # _sample_logits' signature takes the hook's _loop_rest call; its draw is SPEC.md's (keys at P - 1, column = step).
    sample_logits = cls.methods["_sample_logits"]
    assert calls(plugin_function("_loop_rest"), "spec")["_sample_logits"] == {len(params(sample_logits))}
    draws = [node for node in ast.walk(sample_logits) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "sampler"]
    assert len(draws) == 1, "_sample_logits no longer draws through one sampler(...) call"
    arguments = [ast.unparse(arg) for arg in draws[0].args]
    assert arguments == ["logits", "idx_map", "self.temperature", "self.seeds", "sample_pos - 1"], arguments
    keywords = {k.arg: ast.unparse(k.value) for k in draws[0].keywords}
    assert keywords == {"apply_temperature": "True", "is_drafting": "True", "logits_cache": "self.draft_logits",
                        "logits_cache_col": "self._step_cols[step]", "use_fp64": "self.use_fp64_gumbel"}, keywords
    assert ast.unparse(find(cls, "_step_cols")).startswith("torch.arange(self.num_speculative_steps,")


def test_the_cache_and_the_d2t_scatter_are_laid_out_as_the_hook_assumes():
    """draft_logits [max_num_reqs, N, vocab_size]; _d2t_scatter_index[j] = j + d2t[j] (the hook takes
    d2t = scatter - arange); the -inf scatter row is vocab_size wide (the hook's target width)."""
    cls = speculator()
    cache = find(cls, "draft_logits")
    allocations = [node for current in lineage(cls) for function in current.methods.values()
                   for node in ast.walk(function) if isinstance(node, ast.Call)
                   and ast.unparse(node.func) == "torch.full" and node.args
                   and ast.unparse(node.args[0]) == "(self.max_num_reqs, self.num_speculative_steps, self.vocab_size)"]
    assert cache is not None and allocations, "draft_logits is not allocated [max_num_reqs, N, vocab_size]"
    load = lines(cls.methods["load_draft_model"])
    for line in ("d2t = model.draft_id_to_target_id", "torch.arange(d2t.shape[0], device=d2t.device) + d2t"):
        assert line in load, f"load_draft_model has no {line!r}"
    assert any(line.startswith("torch.full((self.max_num_reqs, self.vocab_size), float('-inf')") for line in load), \
        "the d2t scatter row is no longer a [max_num_reqs, vocab_size] -inf buffer"
    line = "buf.index_copy_(1, self._d2t_scatter_index, logits.to(buf.dtype))"
    assert line in lines(cls.methods["_sample_logits"]), f"_sample_logits has no {line!r}"


# ------------------------------------------------------------------------------ the draft models
def model_classes() -> list:
    found = []
    for qualified in plugin.MODEL_CLASSES:
        module, name = qualified.rsplit(".", 1)
        found.append(vllm_class(member_of(module), name))
    return found


def test_every_model_class_has_the_hooks_the_plugin_calls():
    """Each class of MODEL_CLASSES exists, has no sample_sequential of its own (install() gives it the hook),
    and has every model method the hook calls, with the arguments it passes."""
    tree = plugin_tree("hook.py")
    called = calls(tree, *MODEL_READS)
    read = reads(tree, *MODEL_READS) - set(called)
    for cls in model_classes():
        assert find(cls, "sample_sequential") is None, f"{cls.name} has its own sample_sequential"
        for name, counts in called.items():
            function = find(cls, name)
            if function is None and name in OPTIONAL_MODEL_HOOKS:
                continue
            assert isinstance(function, ast.FunctionDef), f"{cls.member}: {cls.name} has no method {name}"
            assert all(accepts(function, count) for count in counts), f"{cls.name}.{name}{tuple(params(function))}"
        for name in read - set(OPTIONAL_MODEL_HOOKS):
            assert find(cls, name) is not None, f"{cls.member}: {cls.name} has no {name}"
        assert find(cls, "apply_output_logit_transform") is None, f"{cls.name}: the hook would decline every step"
    assert find(vllm_class(QWEN3, "Qwen3DSparkForCausalLM"), "apply_markov_bias_gathered") is not None, \
        "Qwen3DSparkForCausalLM (the top-k drafting model) has no apply_markov_bias_gathered"


def test_every_model_class_draws_its_markov_step_from_markov_head_and_its_logits_processor():
    """markov_embed = markov_head.embed (markov_w1), markov_bias = markov_head.bias(.., self.logits_processor)
    (markov_w2 through the model's LogitsProcessor): so the head's weights and the processor's scale, soft cap,
    head dtype and vocabulary that the hook reads are what vLLM's loop computes with."""
    for cls in model_classes():
        assert "self.model.markov_head.embed(token_ids)" in lines(method(cls, "markov_embed"))
        assert "self.model.markov_head.bias(markov_embed, self.logits_processor)" in lines(method(cls, "markov_bias"))
        assert called_class(find(cls, "logits_processor")) == "LogitsProcessor", cls.name
        inner = resolve(cls, called_class(find(cls, "model")))
        assert called_class(find(inner, "markov_head")) == "DSparkMarkovHead", f"{cls.name}.model.markov_head"
        assert resolve(inner, "DSparkMarkovHead").member == QWEN3


def test_the_markov_head_has_the_weights_the_hook_reads():
    head = vllm_class(QWEN3, "DSparkMarkovHead")
    why_not, state = plugin_function("why_not"), plugin_function("__init__")
    for name in reads(why_not, "head") | reads(state, "head_module") | reads(plugin_tree("hook.py"),
                                                                          "model.model.markov_head"):
        assert find(head, name) is not None, f"DSparkMarkovHead has no {name}"
    assert called_class(find(head, "markov_w1")) == "Embedding"  # the hook checks type(w1).__name__
    w2 = find(head, "markov_w2")
    assert called_class(w2) == "ParallelLMHead"
    assert {k.arg: ast.unparse(k.value) for k in w2.keywords}.get("disable_tp") == "True", \
        "markov_w2 is no longer built with disable_tp=True (the hook takes a replicated W2 only)"
    assert "self.markov_w1(token_ids)" in lines(head.methods["embed"])
    assert "logits_processor(self.markov_w2, markov_embed)" in lines(head.methods["bias"])
    # markov_w2's attributes: its layer's, the weight its quant method registers, and those DSparkMarkovHead sets.
    layer = vllm_class(EMBEDDING, "ParallelLMHead")
    set_by_head = {node.attr for node in ast.walk(head.methods["__init__"]) if isinstance(node, ast.Attribute)
                   and ast.unparse(node.value) == "self.markov_w2" and isinstance(node.ctx, ast.Store)}
    registered = "layer.register_parameter('weight', weight)" in lines(
        vllm_class(EMBEDDING, "UnquantizedEmbeddingMethod").methods["create_weights"])
    for name in reads(plugin_function("why_not"), "w2"):
        assert find(layer, name) is not None or name in set_by_head or (name == "weight" and registered), \
            f"markov_w2 (ParallelLMHead) has no {name}"
    # The quant-method class name the hook compares markov_w2's with is vLLM's unquantized embedding method.
    assert "UnquantizedEmbeddingMethod" in {node.value for node in ast.walk(why_not) if isinstance(node, ast.Constant)}
    assert "UnquantizedEmbeddingMethod" in vllm_classes(EMBEDDING)


def test_the_logits_processor_has_what_the_hook_reads_and_branches_only_on_that():
    processor = vllm_class(LOGITS, "LogitsProcessor")
    tree = plugin_tree("hook.py")
    read = reads(tree, "processor", "model.logits_processor", "spec.model.logits_processor")
    missing = sorted(name for name in read if find(processor, name) is None)
    assert not missing, f"LogitsProcessor has no {missing}"
    unseen = set()
    for name in ("forward", "_apply_head", "_get_logits"):
        for node in ast.walk(processor.methods[name]):
            if isinstance(node, (ast.If, ast.IfExp)):
                unseen |= reads(node.test, "self") - read
    assert not unseen, f"LogitsProcessor branches on {sorted(unseen)}, which the hook never reads"
    # The padding rows of a head are sliced off at org_vocab_size: the vocabulary hook._draft_vocab takes.
    assert "logits[..., :self.org_vocab_size]" in lines(processor.methods["_get_logits"])
