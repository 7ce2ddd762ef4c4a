"""Property-based fuzzing of every entry point (issue 14): random shapes, strides, dtypes, ids, NaN/inf.

Each property draws a problem and, with some probability, one *violation* of the input rules (README,
"Inputs": a strided 1-D per-row/per-slot tensor, a wrong dtype, an out-of-range id, a bad
temperature, two rows on one slot, a bad last stride ...). Then:

- with a violation, the call must raise ``ValueError`` whose message starts with the violated
  argument's name, and every output passed in must be bit-for-bit untouched;
- without one, the call must succeed and equal the reference exactly (Triton samplers: the draw is
  the reference's from the sampler's own cache, SPEC.md section 3; verification, top-k/top-p and
  block inputs: identical outputs), with no write outside the outputs' live rows.

Unchecked calls (``check_values=False``) with out-of-range ids are also drawn for the Triton
samplers: kernels treat out-of-range slots as padding and clamp previous tokens (CONTRIBUTING), so
the result must equal the reference on the sanitised inputs.

Budget: a fixed, derandomised number of examples per property (CI cannot flake);
``DSPARK_FUZZ_EXAMPLES=N`` sets N examples per property (e.g. 500 for a long local run). The
``gpu`` variants run the same properties at V = 129,280 (rank 256) with their own fixed budget
(``DSPARK_FUZZ_GPU_EXAMPLES``). Implementations come from the backend registry, so a new design is
fuzzed as soon as it is registered.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("triton")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dspark_markov as dm  # noqa: E402
from dspark_markov.block_inputs import prepare_block_inputs  # noqa: E402
from dspark_markov import registry  # noqa: E402
from tests.helpers import check_against_reference  # noqa: E402

CPU_EXAMPLES = {"sampler": 6, "verify": 30, "filter": 16, "block": 40}  # sampler: per (impl, method)
GPU_EXAMPLES = {"sampler": 2, "verify": 10, "filter": 10, "block": 10}  # sampler: per (impl, method)
FULL_VOCAB, FULL_RANK = 129_280, 256
HAS_CUDA = torch.cuda.is_available()


def _budget(name: str, gpu: bool) -> int:
    if gpu:
        return int(os.environ.get("DSPARK_FUZZ_GPU_EXAMPLES", GPU_EXAMPLES[name]))
    return int(os.environ.get("DSPARK_FUZZ_EXAMPLES", CPU_EXAMPLES[name]))


def fuzz_settings(name: str, gpu: bool = False):
    # No shrinking unless asked (DSPARK_FUZZ_SHRINK=1): a failure is reported with its first example
    # at once instead of minutes of shrinking inside the CI budget.
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if os.environ.get("DSPARK_FUZZ_SHRINK") == "1":
        phases.append(Phase.shrink)
    return settings(max_examples=_budget(name, gpu), derandomize=True, database=None, deadline=None,
                    print_blob=False, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --------------------------------------------------------------------------- helpers
def strided(x: torch.Tensor) -> torch.Tensor:
    """The values of 1-D ``x`` as a stride-2 view (garbage in between)."""
    wide = torch.full((2 * max(x.shape[0], 1),), 0, dtype=x.dtype, device=x.device)
    view = wide[::2][: x.shape[0]]
    view.copy_(x)
    return view


def bits(x: torch.Tensor) -> torch.Tensor:
    """Bit pattern (NaN-exact comparison) of a tensor."""
    x = x.contiguous()
    if x.dtype in (torch.bfloat16, torch.float16):
        return x.view(torch.int16)
    if x.dtype == torch.float32:
        return x.view(torch.int32)
    if x.dtype == torch.float64:
        return x.view(torch.int64)
    return x


def like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same sizes and strides (clone would make a gapped view contiguous)."""
    copy = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    copy.copy_(t)
    return copy


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def raised_name(error: ValueError) -> str:
    return str(error).split(":", 1)[0].strip()


def expect_outcome(call, violations, outputs):
    """Run ``call``; check the ValueError-or-success contract. Returns the result (or None on error)."""
    hypothesis.event(f"violated: {', '.join(sorted(violations)) or 'nothing'}")
    before = [(t, t.clone()) for t in outputs if t is not None]  # values only: clone is fine here
    try:
        result = call()
    except ValueError as error:
        assert violations, f"no rule was violated, yet the call raised: {error}"
        assert raised_name(error) in violations, f"expected an error naming one of {sorted(violations)}, got: {error}"
        for tensor, copy in before:
            assert same_bits(tensor, copy), f"an output was written before the error ({error})"
        return None
    assert not violations, f"rules {sorted(violations)} were violated, yet the call succeeded"
    return result


def sample_specials(draw, x: torch.Tensor) -> torch.Tensor:
    """Sprinkle NaN / +-inf / huge values / all -inf rows into a float tensor ``[..., V]`` (in place)."""
    flat = x.view(-1, x.shape[-1])
    if flat.numel() == 0:
        return x
    for _ in range(draw(st.integers(0, 4))):
        row = draw(st.integers(0, flat.shape[0] - 1))
        kind = draw(st.sampled_from(["nan", "inf", "-inf", "huge", "-inf row", "ties"]))
        col = draw(st.integers(0, flat.shape[1] - 1))
        if kind == "nan":
            flat[row, col] = float("nan")
        elif kind == "inf":
            flat[row, col] = float("inf")
        elif kind == "-inf":
            flat[row, col: col + 7] = float("-inf")
        elif kind == "huge":
            flat[row, col] = 3e38 if x.dtype != torch.bfloat16 else 3e38
        elif kind == "-inf row":
            flat[row] = float("-inf")
        else:
            flat[row] = flat[row].round()
    return x


# --------------------------------------------------------------------------- heads (cached per shape)
@functools.lru_cache(maxsize=None)
def _head(vocab, rank, extra, dtype, device):
    g = torch.Generator().manual_seed(vocab * 31 + rank)
    embed = (torch.randn(vocab + extra, rank, generator=g) * 0.5).to(dtype)
    head = (torch.randn(vocab, rank, generator=g) * 0.3).to(dtype)
    return dm.MarkovHead(embed.to(device), head.to(device), scale=1.0)


def pick(draw, cpu_options, label, gpu, gpu_options=None):
    """``sampled_from`` the CPU options, or on the GPU from fewer (each dtype or constexpr choice is a
    Triton compile there, seconds each: the GPU variants vary values, strides and shapes instead)."""
    return draw(st.sampled_from(gpu_options if gpu and gpu_options is not None else cpu_options), label=label)


def _sampler_impls(device):
    """(impl, method) pairs of every registered design that runs on ``device`` (auto excluded)."""
    pairs = []
    for impl in registry.names("draft"):
        if impl == "auto":
            continue
        try:
            cls = registry.load("draft", impl)
        except ValueError:
            continue
        if torch.device(device).type not in cls.DEVICES:
            continue
        pairs.extend((impl, method) for method in cls.METHODS)
    return pairs


# --------------------------------------------------------------------------- sample_drafts / MarkovSampler
ONE_D = ("anchor", "idx_mapping", "positions", "temperature", "seeds")


def sampler_property(data, device, vocab, rank, impl, method):
    draw = data.draw
    rows = draw(st.integers(0, 4), label="R")
    steps = draw(st.integers(1, 3), label="N")
    slots = draw(st.integers(rows, rows + 3), label="S")
    gpu = torch.device(device).type == "cuda"
    wdtype = pick(draw, [torch.bfloat16, torch.float32], "weight dtype", gpu, [torch.bfloat16])
    ldtype = pick(draw, [torch.bfloat16, torch.float32], "logit dtype", gpu, [torch.bfloat16])
    cdtype = pick(draw, [torch.bfloat16, torch.float32], "cache dtype", gpu, [torch.bfloat16])
    head = _head(vocab, rank, 3, wdtype, device)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label="seed"))
    row_stride_extra = draw(st.integers(0, 1), label="base row/step padding")
    base = (torch.randn(rows, steps + row_stride_extra, vocab + 2 * row_stride_extra, generator=g) * 2)
    base = base[:, :steps, row_stride_extra: row_stride_extra + vocab].to(ldtype)  # last stride 1, strided rows
    if draw(st.booleans(), label="specials"):
        base = base.clone()
        sample_specials(draw, base)
    perm = torch.randperm(slots, generator=g)[:rows]
    padding = torch.tensor([draw(st.booleans()) for _ in range(rows)], dtype=torch.bool)
    row_slot = torch.where(padding, torch.full_like(perm, -1), perm)
    idx = row_slot[:, None].repeat(1, steps)
    if rows >= 1 and steps >= 2 and slots > rows and draw(st.booleans(), label="slot change at step 1"):
        free = [s for s in range(slots) if s not in perm.tolist()]
        if free and int(idx[0, 1]) >= 0:
            idx[0, 1] = free[0]  # row 0 writes another slot at step 1: (slot, step) rows stay distinct
    idx_dtype = pick(draw, [torch.int32, torch.int64], "idx dtype", gpu, [torch.int64])
    inputs = {
        "base_logits": base,
        "anchor": torch.randint(0, vocab + 3, (rows,), generator=g).to(
            pick(draw, [torch.int32, torch.int64], "anchor dtype", gpu, [torch.int64])),
        "idx_mapping": idx.reshape(-1).to(idx_dtype),
        "positions": torch.randint(1, 2**31 - 1, (rows * steps,), generator=g).to(idx_dtype),
        "temperature": torch.tensor([draw(st.sampled_from([0.0, 0.5, 1.0, 1.7])) for _ in range(slots)],
                                    dtype=torch.float32),
        "seeds": torch.randint(-(2**62), 2**62, (slots,), generator=g),
    }
    inputs = {name: value.to(device) for name, value in inputs.items()}  # before any strided view is made
    check_values = draw(st.booleans(), label="check_values") if impl != "reference" else True
    live = [r for r in range(rows) if not bool(padding[r])]
    hypothesis.event(f"impl {impl}/{method}, {'empty' if rows == 0 else 'rows'}")
    kinds = ["none"] * 3 + [f"strided {name}" for name in ONE_D] + ["dtype seeds", "dtype temperature",
                                                                     "dtype anchor", "base last stride",
                                                                     "tokens last stride", "cache step stride"]
    if check_values:
        kinds += ["anchor range", "slot range", "bad temperature"] + (["duplicate slot"] if len(live) >= 2 else [])
    elif impl != "reference":
        kinds += ["unchecked anchor range", "unchecked slot range"] * 2
    violation = draw(st.sampled_from(kinds), label="violation")
    violations = set()
    sanitized = {name: value.clone() for name, value in inputs.items() if name != "base_logits"}
    if rows == 0 and violation in ("anchor range", "slot range", "duplicate slot", "unchecked anchor range",
                                   "unchecked slot range", "strided anchor", "strided idx_mapping",
                                   "strided positions", "dtype anchor"):
        violation = "none"  # nothing to break in an empty batch (a 0-element view is contiguous)
    if slots <= 1 and violation in ("strided temperature", "strided seeds"):
        violation = "none"  # a 1-element view is contiguous
    if violation.startswith("strided "):
        name = violation.split()[1]
        inputs[name] = strided(inputs[name])
        if inputs[name].numel() > 1:  # a view of one element is contiguous
            violations.add(name)
    elif violation == "dtype seeds":
        inputs["seeds"] = inputs["seeds"].to(torch.int32)
        violations.add("seeds")
    elif violation == "dtype temperature":
        inputs["temperature"] = inputs["temperature"].double()
        violations.add("temperature")
    elif violation == "dtype anchor":
        inputs["anchor"] = inputs["anchor"].float()
        violations.add("anchor")
    elif violation == "base last stride":
        inputs["base_logits"] = torch.cat([base, base], dim=2)[:, :, ::2]
        violations.add("base_logits")
    elif violation in ("anchor range", "unchecked anchor range"):
        inputs["anchor"][draw(st.integers(0, rows - 1))] = draw(st.sampled_from([-1, vocab + 3, 10**6]))
        if violation == "anchor range":
            violations.add("anchor")
        sanitized["anchor"] = inputs["anchor"].long().clamp(0, vocab + 2)
    elif violation in ("slot range", "unchecked slot range"):
        flat = inputs["idx_mapping"]
        at = draw(st.integers(0, flat.numel() - 1))
        flat[at] = draw(st.sampled_from([slots, slots + 5, -2, -(2**31)]))
        if violation == "slot range":
            violations.add("idx_mapping")
        sanitized["idx_mapping"] = torch.where((flat < 0) | (flat >= slots), -1, flat.long())
    elif violation == "bad temperature":
        inputs["temperature"][draw(st.integers(0, slots - 1))] = draw(st.sampled_from(
            [float("nan"), -0.5, float("inf")]))
        violations.add("temperature")
    elif violation == "duplicate slot":
        a, b = live[0], live[1]
        grid = inputs["idx_mapping"].view(rows, steps)
        grid[b] = grid[a]
        violations.add("idx_mapping")
    # outputs: sentinel-filled, possibly strided views of larger buffers (allowed layouts)
    wide_tokens = torch.full((rows, steps + 1), -77, dtype=torch.int64, device=device)
    tokens = wide_tokens[:, :steps]
    cache_full = torch.full((slots, steps + 1, vocab), 7.0, dtype=cdtype, device=device)
    cache = cache_full[:, 1:]
    if violation == "tokens last stride":
        tokens = torch.full((steps, rows), -77, dtype=torch.int64, device=device).t()
        if rows > 1 and steps > 1:
            violations.add("draft_tokens")
    if violation == "cache step stride":
        cache = torch.full((slots, steps, vocab + 1), 7.0, dtype=cdtype, device=device)[:, :, :vocab]
        if slots > 0 and steps > 1:  # the step stride must be V (N = 1: never used, any is accepted)
            violations.add("logits_cache")
    args = [inputs[name] for name in ("base_logits",) + ONE_D]

    def call():
        sampler = dm.MarkovSampler(head, steps, max(rows, 1), cache_dtype=cdtype, method=method, impl=impl)
        return sampler.sample(*args, draft_tokens=tokens, logits_cache=cache, check_values=check_values)

    out = expect_outcome(call, violations, [wide_tokens, cache_full, tokens, cache])
    if out is None:
        return
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < vocab)).all()), "a token outside [0, V)"
    assert bool((wide_tokens[:, steps] == -77).all()), "wrote past draft_tokens"
    assert bool((cache_full[:, 0].float() == 7.0).all()), "wrote outside logits_cache"
    ref_args = [inputs["base_logits"]] + [sanitized[name].contiguous() for name in ONE_D]
    if impl == "reference":
        want = dm.sample_drafts(head, *ref_args, method=method, impl="reference", cache_dtype=cdtype)
        assert torch.equal(out.draft_tokens, want.draft_tokens)
    else:
        check_against_reference(head, *ref_args, out, method=method)
    # cache rows written exactly by the live (slot, step) samples
    idx = sanitized["idx_mapping"].view(rows, steps)
    written = torch.zeros(slots, steps, dtype=torch.bool, device=device)
    for step in range(steps):
        live_slots = idx[:, step][idx[:, step] >= 0].long()
        written[live_slots, step] = True
    untouched = cache[~written]
    assert bool((untouched.float() == 7.0).all()), "a padding or unused cache row was written"


@pytest.mark.parametrize("impl, method", _sampler_impls("cpu"))
@fuzz_settings("sampler")
@given(data=st.data())
def test_fuzz_sample_drafts(impl, method, data):
    sampler_property(data, "cpu", data.draw(st.sampled_from([300, 333, 520]), label="V"), 16, impl, method)


@pytest.mark.gpu
@pytest.mark.parametrize("impl, method", _sampler_impls("cuda") if HAS_CUDA else [])
@fuzz_settings("sampler", gpu=True)
@given(data=st.data())
def test_fuzz_sample_drafts_gpu(impl, method, data):
    # an opt-in design (cuda_wide: registry.OPT_IN_DESIGNS) runs only when opted in; any other unavailable one fails here
    opt_in = getattr(registry.load("draft", impl), "opt_in_reason", None)
    if opt_in is not None and opt_in() is not None:
        pytest.skip(opt_in())
    sampler_property(data, "cuda", FULL_VOCAB, FULL_RANK, impl, method)


# --------------------------------------------------------------------------- verify_drafts
VERIFY_1D = ("num_drafts", "idx_mapping", "positions", "temperature", "seeds")


def verify_property(data, device, vocab):
    draw = data.draw
    batch = draw(st.integers(0, 4), label="B")
    k = draw(st.integers(0, 3), label="K")
    slots = draw(st.integers(max(batch, 1), batch + 3), label="S")
    gpu = torch.device(device).type == "cuda"
    cdtype = pick(draw, [torch.bfloat16, torch.float32], "cache dtype", gpu, [torch.bfloat16])
    method = draw(st.sampled_from(["standard", "block"]), label="method")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label="seed"))
    steps = k + draw(st.integers(0, 1), label="extra cache steps")
    cache = (torch.randn(slots, max(steps, 1), vocab, generator=g) * 2).to(cdtype)[:, :steps]
    idx = torch.randperm(slots, generator=g)[:batch]
    for b in range(batch):
        if draw(st.booleans(), label="padding"):
            idx[b] = -1
    temperature = torch.tensor([draw(st.sampled_from([0.0, 0.6, 1.0, 1.5])) for _ in range(slots)])
    safe = torch.where(temperature == 0, 1.0, temperature)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 0.7
    if steps > 0:
        target[:, :k] += cache[idx.clamp_min(0), :k].float() / safe[idx.clamp_min(0), None, None]
    if draw(st.booleans(), label="-inf masks"):
        target[:, :, draw(st.integers(1, vocab - 1)):] = float("-inf")
    nan_target = draw(st.integers(0, 9), label="nan target") == 0
    if nan_target and batch > 0:
        target[draw(st.integers(0, batch - 1)), :, draw(st.integers(0, vocab - 1))] = float("nan")
    if draw(st.booleans(), label="strided target rows"):
        target = torch.cat([target, target], dim=1)[:, : k + 1]  # row strides 2 (K+1) V, last stride 1
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
    for b in range(batch):  # entries at or after num_drafts are ignored: put garbage there
        drafts[b, int(num_drafts[b]):] = -5
    if draw(st.booleans(), label="transposed drafts"):
        drafts = drafts.t().contiguous().t()
    index_dtype = pick(draw, [torch.int32, torch.int64], "index dtype", gpu, [torch.int64])
    inputs = {"target_logits": target,
              "draft_tokens": drafts.to(pick(draw, [torch.int32, torch.int64], "draft dtype", gpu, [torch.int64])),
              "logits_cache": cache, "num_drafts": num_drafts.to(index_dtype), "idx_mapping": idx.to(index_dtype),
              "positions": torch.randint(1, 2**30, (batch,), generator=g).to(index_dtype),
              "temperature": temperature, "seeds": torch.randint(-(2**62), 2**62, (slots,), generator=g)}
    inputs = {name: value.to(device) for name, value in inputs.items()}  # before any strided view is made
    greedy = None
    if draw(st.booleans(), label="target_greedy"):
        greedy = torch.tensor([draw(st.booleans()) for _ in range(batch)], dtype=torch.bool).to(device)
    check_values = draw(st.booleans(), label="check_values")
    live = [b for b in range(batch) if int(idx[b]) >= 0]
    kinds = ["none"] * 3 + [f"strided {name}" for name in VERIFY_1D] + ["dtype seeds", "target last stride",
                                                                         "short cache"]
    if greedy is not None:
        kinds.append("strided target_greedy")
    if check_values:
        kinds += ["slot range", "bad temperature"] + (["num_drafts range", "draft range"] if live and k > 0 else [])
    violation = draw(st.sampled_from(kinds), label="violation")
    violations = set()
    if violation.startswith("strided "):
        name = violation.split()[1]
        length = batch if name != "temperature" and name != "seeds" else slots
        if length > 1:
            if name == "target_greedy":
                greedy = strided(greedy)
            else:
                inputs[name] = strided(inputs[name])
            violations.add(name)
    elif violation == "dtype seeds":
        inputs["seeds"] = inputs["seeds"].to(torch.int32)
        violations.add("seeds")
    elif violation == "target last stride" and vocab > 1 and batch > 0:
        wide = inputs["target_logits"]
        inputs["target_logits"] = torch.cat([wide, wide], dim=2)[:, :, ::2]
        violations.add("target_logits")
    elif violation == "short cache" and k > 0:
        inputs["logits_cache"] = inputs["logits_cache"][:, : k - 1]
        violations.add("logits_cache")
    elif violation == "slot range" and batch > 0:
        inputs["idx_mapping"][draw(st.integers(0, batch - 1))] = draw(st.sampled_from([slots, slots + 9, -3]))
        violations.add("idx_mapping")
    elif violation == "bad temperature":
        inputs["temperature"][draw(st.integers(0, slots - 1))] = draw(st.sampled_from([float("nan"), -1.0,
                                                                                        float("inf")]))
        violations.add("temperature")
    elif violation == "num_drafts range":
        inputs["num_drafts"][live[0]] = draw(st.sampled_from([k + 1, -1, 10**6]))
        violations.add("num_drafts")
    elif violation == "draft range":
        b = live[-1]
        inputs["num_drafts"][b] = k
        inputs["draft_tokens"][b, draw(st.integers(0, k - 1))] = draw(st.sampled_from([vocab, -1, 2**31 - 1]))
        violations.add("draft_tokens")
    args = [inputs[name] for name in ("target_logits", "draft_tokens", "logits_cache") + VERIFY_1D]
    outs = {}
    for impl in ("reference", "triton"):
        result = expect_outcome(lambda: dm.verify_drafts(*args, target_greedy=greedy, method=method, impl=impl,
                                                         check_values=check_values), violations, [])
        if result is None:
            return
        outs[impl] = result
    ref, tri = outs["reference"], outs["triton"]
    for out in (ref, tri):
        tokens, count = out.tokens, out.num_emitted
        assert bool(((tokens >= -1) & (tokens < vocab)).all()), "a token outside [0, V) (or -1)"
        position = torch.arange(k + 1, device=device)[None, :]
        assert torch.equal(tokens >= 0, position < count[:, None]), "tokens and num_emitted disagree"
    if nan_target:
        return  # a NaN target distribution has no defined draw (SPEC.md 6); only the structure is checked
    assert torch.equal(tri.tokens, ref.tokens), (tri.tokens, ref.tokens)
    assert torch.equal(tri.num_emitted, ref.num_emitted)


@fuzz_settings("verify")
@given(data=st.data())
def test_fuzz_verify_drafts(data):
    verify_property(data, "cpu", data.draw(st.sampled_from([300, 257, 64]), label="V"))


@pytest.mark.gpu
@fuzz_settings("verify", gpu=True)
@given(data=st.data())
def test_fuzz_verify_drafts_gpu(data):
    verify_property(data, "cuda", FULL_VOCAB)


# --------------------------------------------------------------------------- top_k_top_p
def filter_property(data, device, vocab):
    draw = data.draw
    gpu = torch.device(device).type == "cuda"
    rows = draw(st.integers(0, 5), label="B")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label="seed"))
    scale = draw(st.sampled_from([0.01, 1.0, 8.0]), label="logit scale")
    logits = torch.randn(rows, vocab + 3, generator=g) * scale
    if draw(st.booleans(), label="ties"):
        logits = logits.round()
    logits = sample_specials(draw, logits) if draw(st.booleans(), label="specials") else logits
    logits = logits.to(device)
    logits = logits[:, 1: vocab + 1] if draw(st.booleans(), label="strided rows") else logits[:, :vocab].contiguous()
    violations = set()

    def draw_k():
        kind = pick(draw, ["none", "int", "tensor"], "k kind", gpu, ["none", "tensor"])
        if kind == "none":
            return None
        if kind == "int":
            return draw(st.integers(-2, vocab + 2), label="k")
        return torch.tensor([draw(st.integers(-3, vocab + 3)) for _ in range(rows)],
                            dtype=pick(draw, [torch.int32, torch.int64], "k dtype", gpu, [torch.int64]), device=device)

    def draw_p():
        kind = pick(draw, ["none", "float", "tensor"], "p kind", gpu, ["none", "tensor"])
        if kind == "none":
            return None
        if kind == "float":
            return draw(st.sampled_from([0.0, 1e-9, 0.3, 0.9, 0.999, 1.0, 2.0]), label="p")
        return torch.tensor([draw(st.sampled_from([0.0, 1e-7, 0.5, 0.95, 1.0, 1.5, -0.2, float("nan")]))
                             for _ in range(rows)], dtype=torch.float32, device=device)

    k, p = draw_k(), draw_p()
    violation = draw(st.sampled_from(["none"] * 6 + ["strided k", "strided p", "k float", "p negative", "p nan",
                                                     "k dtype", "p dtype", "logits last stride", "out shape"]),
                     label="violation")
    if violation == "strided k" and isinstance(k, torch.Tensor) and rows > 1:
        k = strided(k)
        violations.add("k")
    elif violation == "strided p" and isinstance(p, torch.Tensor) and rows > 1:
        p = strided(p)
        violations.add("p")
    elif violation == "k float":
        k = 2.5
        violations.add("k")
    elif violation == "p negative":
        p = -0.1
        violations.add("p")
    elif violation == "p nan":
        p = float("nan")
        violations.add("p")
    elif violation == "k dtype" and isinstance(k, torch.Tensor):
        k = k.float()
        violations.add("k")
    elif violation == "p dtype" and isinstance(p, torch.Tensor):
        p = p.double()
        violations.add("p")
    elif violation == "logits last stride" and rows > 0 and vocab > 1:
        logits = torch.cat([logits, logits], dim=1)[:, ::2]
        violations.add("logits")
    use_out = draw(st.booleans(), label="out")
    out_shape = (rows, vocab + (1 if violation == "out shape" else 0))
    if violation == "out shape" and use_out:
        violations.add("out")
    results = {}
    for impl in ("reference", "triton"):
        x = like(logits)  # same strides: a row-strided or (violation) column-strided input stays so
        out = torch.full(out_shape, 5.0, device=device) if use_out else None
        result = expect_outcome(lambda: dm.top_k_top_p(x, k, p, impl=impl, out=out), violations,
                                [x, out])
        if result is None:
            return
        if use_out:
            assert same_bits(x, logits), "logits changed although out was given"
        results[impl] = result
    torch.testing.assert_close(results["triton"], results["reference"], rtol=0, atol=0, equal_nan=True)
    kept = results["reference"] > float("-inf")
    has_nan = torch.isnan(logits).any(dim=1)
    finite_row = (logits > float("-inf")).any(dim=1)
    assert bool((kept.any(dim=1) | ~finite_row | has_nan).all()), "a row lost every token"


@fuzz_settings("filter")
@given(data=st.data())
def test_fuzz_top_k_top_p(data):
    filter_property(data, "cpu", data.draw(st.sampled_from([1, 2, 17, 300, 520]), label="V"))


@pytest.mark.gpu
@fuzz_settings("filter", gpu=True)
@given(data=st.data())
def test_fuzz_top_k_top_p_gpu(data):
    filter_property(data, "cuda", FULL_VOCAB)


# --------------------------------------------------------------------------- prepare_block_inputs
def block_property(data, device):
    draw = data.draw
    steps = draw(st.integers(1, 4), label="N")
    max_reqs = draw(st.integers(1, 5), label="max_reqs")
    length = draw(st.integers(0, max_reqs + 1), label="L")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label="seed"))
    in_dtype = draw(st.sampled_from([torch.int32, torch.int64]), label="input dtype")
    out_dtype = draw(st.sampled_from([torch.int32, torch.int64]), label="id dtype")
    max_len = draw(st.integers(1, 5000), label="max_model_len")
    inputs = {"last_pos": torch.randint(0, 6000, (length,), generator=g).to(device, in_dtype),
              "bonus_tokens": torch.randint(0, 1000, (length,), generator=g).to(device, in_dtype),
              "req_slots": torch.randint(0, 50, (length,), generator=g).to(device, in_dtype)}
    q, s = max_reqs * (steps + 1), max_reqs * steps

    def buffers():
        def full(n, dtype):
            return torch.full((n,), 55, dtype=dtype, device=device)

        return {"input_ids": full(q, out_dtype), "positions": full(q, out_dtype), "sample_pos": full(s, torch.int64),
                "sample_idx_mapping": full(s, torch.int64), "is_padding": torch.zeros(q, dtype=torch.bool, device=device)}

    num_kind = draw(st.sampled_from(["none", "int", "tensor"]), label="num_reqs kind")
    num_reqs = None
    if num_kind == "int":
        num_reqs = draw(st.integers(0, min(length, max_reqs)), label="num_reqs")
    elif num_kind == "tensor":
        num_reqs = torch.tensor([draw(st.integers(-2, max_reqs + 3), label="num_reqs tensor")], device=device)
    options = {"num_steps": steps, "mask_token_id": draw(st.integers(0, 999)), "max_model_len": max_len}
    violations = set()
    kinds = ["none"] * 6 + ["strided last_pos", "strided bonus_tokens", "strided req_slots", "strided positions",
                            "short input_ids", "dtype sample_pos", "num_reqs range", "bad num_steps",
                            "bad mask_token_id"]
    violation = draw(st.sampled_from(kinds), label="violation")
    outs = {impl: buffers() for impl in ("reference", "triton")}
    if num_kind == "none" and length > max_reqs:
        violations.add("last_pos")
    if violation.startswith("strided ") and violation != "strided positions" and length > 1:
        name = violation.split()[1]
        inputs[name] = strided(inputs[name])
        violations.add(name)
    elif violation == "strided positions":
        for o in outs.values():
            o["positions"] = strided(o["positions"])
        violations.add("positions")
    elif violation == "short input_ids":
        for o in outs.values():
            o["input_ids"] = o["input_ids"][:-1]
        violations.add("input_ids" if q - 1 > 0 else "input_ids")
    elif violation == "dtype sample_pos":
        for o in outs.values():
            o["sample_pos"] = o["sample_pos"].to(torch.int32)
        violations.add("sample_pos")
    elif violation == "num_reqs range":
        num_reqs = min(length, max_reqs) + 1
        violations.add("num_reqs")
    elif violation == "bad num_steps":
        options["num_steps"] = draw(st.sampled_from([0, 2.0, True]))
        violations.add("num_steps")
    elif violation == "bad mask_token_id":
        options["mask_token_id"] = -1
        violations.add("mask_token_id")
    for impl, o in outs.items():
        expect_outcome(lambda: prepare_block_inputs(inputs["last_pos"], inputs["bonus_tokens"], inputs["req_slots"],
                                                    num_reqs=num_reqs, impl=impl, **options, **o),
                       violations, list(o.values()))
    for name in outs["reference"]:
        assert torch.equal(outs["triton"][name], outs["reference"][name]), name


@fuzz_settings("block")
@given(data=st.data())
def test_fuzz_prepare_block_inputs(data):
    block_property(data, "cpu")


@pytest.mark.gpu
@fuzz_settings("block", gpu=True)
@given(data=st.data())
def test_fuzz_prepare_block_inputs_gpu(data):
    block_property(data, "cuda")
