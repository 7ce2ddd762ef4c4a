"""Shared test factories and checks (imported as ``tests.helpers``; no ``sys.path`` edits).

Factories: :func:`make_head` / :func:`make_inputs` / :func:`new_outputs` (keyword inputs with a
sentinel-filled cache), :func:`make_problem` (positional inputs), :func:`nan_inf_problem`,
:func:`full_problem` (GPU, DeepSeek-V4.1 shapes). Checks: :func:`check_against_reference`
(replay the reference on a sampler's own outputs), :func:`check_draws` (every SPEC.md invariant
of one call), :func:`check_exact_and_untouched`, :func:`check_graph_replays`. :func:`load_tool`
imports a script of ``tools/``.

SPEC.md section 3: the bias may differ from the reference in its last bit, the draw may not. So
:func:`check_against_reference` walks the steps with the sampler's own tokens as ``prev``, checks
each cached row against the reference logits within one rounding of the bias, and checks each
Gumbel token bit for bit against the reference draw from the sampler's own cached row.
"""

import importlib.util
from pathlib import Path

import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import reference
from dspark_markov.draft import reference as ref
from dspark_markov.draft.reference import argmax_first, draw_gumbel, row_keys

ROOT = Path(__file__).resolve().parents[1]


def load_tool(name: str):
    """The script ``tools/<name>.py`` as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SENTINEL = -7.0  # initial cache value of new_outputs: entries no live sample wrote must keep it


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``x`` rounded to ``dtype`` (as fp32)."""
    mantissa_bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    exponent = torch.frexp(x.float().abs().clamp_min(1e-30))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - mantissa_bits)


def check_against_reference(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, out, *,
                            method="gumbel", exact_cache=False):
    """Assert that ``out`` (a DraftOutput) is what the reference draws from its own cache.

    The cache is compared within one rounding of the bias (two with ``scale != 1``), one rounding of
    ``z``, and the bound on reordering the fp32 sum over the rank, ``R_k 2^-23 |scale| sum_k
    |W1[prev, k] W2[v, k]|`` (SPEC.md section 3 leaves the order free; tensor cores and split sums
    reorder it). Where the bias nearly cancels (|bias| ~ 1e-8 from terms ~ 1e-3) a reordered sum
    differs by more than the bias's last bit, which an fp32 cache shows (seen on the H200 with
    cuda_chain and stream); a wrong previous token or a missed write is off by far more. The draw
    is checked bit for bit from the sampler's own cached row.
    """
    rows, steps, _ = base_logits.shape
    slots = idx_mapping.view(rows, steps)
    pos = positions.view(rows, steps)
    cache_dtype = out.logits_cache.dtype
    prev = anchor.long().clamp(0, head.embed_vocab_size - 1)
    for step in range(steps):
        padding, temp, seed, position = reference.row_keys(slots[:, step], pos[:, step], temperature, seeds)
        bias = head.bias(prev)
        want = (base_logits[:, step].float() + bias.float()).to(cache_dtype)
        live = ~padding
        got = out.logits_cache[slots[live, step].long(), step]
        if exact_cache:
            assert torch.equal(got, want[live]), f"step {step}: cache differs from the reference"
        else:
            # one rounding of the accumulated bias, possibly doubled by the rounding after scale,
            # plus the reordering bound of its fp32 sum over the rank
            magnitude = head.embed_weight.index_select(0, prev).float().abs() @ head.head_weight.float().abs().t()
            reorder = head.rank * 2.0**-23 * abs(float(head.scale)) * magnitude
            tolerance = (2 * ulp(bias, head.dtype) + ulp(want, cache_dtype) + reorder)[live]
            both_nan = torch.isnan(got.float()) & torch.isnan(want[live].float())
            same = (got.float() == want[live].float()) | both_nan
            close = (got.float() - want[live].float()).abs() <= tolerance
            assert bool((same | close).all()), f"step {step}: cache off by more than one bias rounding"
        # The draw is replayed from the sampler's own cached row; padding rows have none, so they
        # are replayed from the reference row (their draw is the greedy argmax).
        own = want.clone()
        own[live] = got
        if method == "gumbel":
            expected = reference.draw_gumbel(own, temp, seed, step, position)
            assert torch.equal(out.draft_tokens[:, step].cpu(), expected.cpu()), f"step {step}: tokens differ"
        else:
            greedy = temp == 0
            expected = reference.argmax_first(own.float())
            assert torch.equal(out.draft_tokens[greedy, step].cpu(), expected[greedy].cpu()), f"step {step}: greedy tokens differ"
        assert bool(((out.draft_tokens[:, step] >= 0) & (out.draft_tokens[:, step] < base_logits.shape[-1])).all())
        prev = out.draft_tokens[:, step].long()


# --------------------------------------------------------------------------- inputs and checks
def make_head(vocab, rank, *, embed_extra=37, dtype=torch.bfloat16, scale=1.0, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab + embed_extra, rank, generator=g) / rank**0.25
    head = torch.randn(vocab, rank, generator=g) / rank**0.25
    return dm.MarkovHead(embed.to(dtype).to(device), head.to(dtype).to(device), scale)


def make_inputs(rows, steps, vocab, *, logit_dtype=torch.bfloat16, extra_slots=3, strided=False, device="cpu",
                seed=1, embed_vocab=None):
    """Inputs of one call: mixed temperatures (0, 0.6, 1), a padding row and a padding sample.

    Each step maps the rows to distinct slots (so no cache row is written twice). With
    ``strided`` the base logits are a view with row stride != N*V.
    """
    g = torch.Generator().manual_seed(seed)
    slots = rows + extra_slots
    if strided:  # [N, R, V + 5] storage viewed as [R, N, V]: row stride V + 5, step stride R*(V + 5)
        storage = torch.randn(steps, rows, vocab + 5, generator=g) * 4
        base = storage.to(logit_dtype).to(device).transpose(0, 1)[:, :, :vocab]
    else:
        base = (torch.randn(rows, steps, vocab, generator=g) * 4).to(logit_dtype).to(device)
    anchor = torch.randint(0, embed_vocab or vocab, (rows,), generator=g)
    idx = torch.stack([torch.randperm(slots, generator=g)[:rows] for _ in range(steps)], dim=1)  # [R, N]
    if rows > 1:
        idx[rows // 2] = -1  # a padding row
    idx[0, steps - 1] = -1  # a padding sample in a live row
    positions = torch.randint(1, 1 << 20, (rows * steps,), generator=g)
    temperature = torch.tensor([0.0, 0.6, 1.0])[torch.arange(slots) % 3]
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    return dict(base_logits=base, anchor=anchor.to(device), idx_mapping=idx.reshape(-1).to(device),
                positions=positions.to(device), temperature=temperature.to(device), seeds=seeds.to(device))


def new_outputs(inputs, cache_dtype):
    rows, steps, vocab = inputs["base_logits"].shape
    slots = inputs["temperature"].shape[0]
    device = inputs["base_logits"].device
    cache = torch.full((slots, steps, vocab), SENTINEL, dtype=cache_dtype, device=device)
    tokens = torch.full((rows, steps), -1, dtype=torch.int64, device=device)
    return tokens, cache


_CUDA_INPUTS = {}


def cuda_inputs(rows, steps, vocab, logit_dtype, seed=7):
    """``make_inputs`` on CUDA at full shapes (5 extra slots, an embedding vocabulary of ``vocab + 1000``),
    made once per process and shared by the GPU test modules (they only read them)."""
    key = (rows, steps, vocab, logit_dtype, seed)
    if key not in _CUDA_INPUTS:
        _CUDA_INPUTS[key] = make_inputs(rows, steps, vocab, logit_dtype=logit_dtype, device="cuda", seed=seed,
                                        extra_slots=5, embed_vocab=vocab + 1000)
    return _CUDA_INPUTS[key]


def sample_synced(sampler, inputs, cache_dtype, **kwargs):
    """``sampler.sample`` into fresh sentinel-filled outputs (``new_outputs``), then a device synchronisation."""
    tokens, cache = new_outputs(inputs, cache_dtype)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, **kwargs)
    torch.cuda.synchronize()
    return tokens, cache


def run_sampler(impl, head, inputs, cache_dtype, *, block=None, **sample_kwargs):
    rows, steps, _ = inputs["base_logits"].shape
    sampler = dm.MarkovSampler(head, steps, rows, cache_dtype=cache_dtype, method="gumbel", impl=impl)
    if block is not None:
        backend_cls = type(sampler.backend)
        sampler.backend = backend_cls(head, steps, rows, method="gumbel", cache_dtype=cache_dtype, device=head.device, block=block)
    tokens, cache = new_outputs(inputs, cache_dtype)
    sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, **sample_kwargs)
    return tokens, cache


def same_values(a, b):
    """Equal as floats, NaN equal to NaN."""
    a, b = a.float(), b.float()
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def bias_bracket(head, prev):
    """Reference bias and a bound on how far any fp32-accumulated GEMM may round away from it.

    One bf16/fp16 ulp of the bias (the two fp32 sums may straddle a rounding boundary; three when
    ``scale != 1`` rounds the scaled bias again) plus twice
    the worst-case fp32 accumulation error, ``rank * 2^-23 * sum_k |W1[prev, k] W2[v, k]|`` (both
    sums err; only visible where the bias nearly cancels).
    """
    bias = head.bias(prev).float()
    if head.dtype == torch.float32:
        ulp = torch.zeros_like(bias)
    else:
        mantissa_bits = 7 if head.dtype == torch.bfloat16 else 10
        _, exponent = torch.frexp(bias)
        ulp = torch.ldexp(torch.ones_like(bias), (exponent - 1 - mantissa_bits).clamp_min(-133))
    if head.scale != 1.0:
        # The scaled bias is rounded again on both sides: |s b' - s b| <= s ulp(b) <= 2 ulp(s b),
        # plus half an ulp of each of the two roundings.
        ulp = 3 * ulp
    codes = head.embed_weight.index_select(0, prev.long()).float()
    magnitude = codes.abs() @ head.head_weight.float().abs().t()
    slack = ulp + head.rank * 2.0**-23 * magnitude * abs(head.scale)
    return bias, slack


def check_draws(head, inputs, tokens, cache, *, exact=True, method="gumbel"):
    """Every SPEC.md invariant of one call, given the sampler's tokens ``[R, N]`` and cache.

    - the cache row of each live sample is the reference ``z`` computed with the sampler's own
      previous tokens (bit-exact with ``exact``, else inside the bracket that a bias within
      :func:`bias_bracket` allows, rounding being monotone);
    - each live sample's token is ``draw_gumbel`` of the sampler's own cached row (always exact);
      with ``method="inverse_cdf"``: greedy rows and rows whose max of ``z / T`` is not finite (or that
      hold a NaN) ``argmax_first`` of the own row, every other token the inverse CDF of its uniform
      (:func:`check_inverse_cdf`, within the fp32 sums);
    - a padding sample's token is ``argmax_first`` of the reference ``z`` (``exact``), or a token
      whose ``z`` can be the maximum (bias slack);
    - cache entries that no live sample owns keep their initial value; tokens lie in ``[0, V)``.
    """
    base = inputs["base_logits"]
    rows, steps, vocab = base.shape
    slots_rs = inputs["idx_mapping"].view(rows, steps)
    positions = inputs["positions"].view(rows, steps)
    assert tokens.min() >= 0 and tokens.max() < vocab
    written = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    prev = inputs["anchor"].long().clamp(0, head.embed_vocab_size - 1)
    num_slots = cache.shape[0]
    for step in range(steps):
        slot_col = slots_rs[:, step].long()
        slot_col = torch.where(slot_col >= num_slots, torch.full_like(slot_col, -1), slot_col)
        padding, temp, seed, pos = row_keys(slot_col, positions[:, step], inputs["temperature"], inputs["seeds"])
        live = ~padding
        logits = base[:, step].float()
        if exact:
            bias = head.bias(prev).float()
            z_lo = z_hi = (logits + bias).to(cache.dtype)
        else:
            bias, slack = bias_bracket(head, prev)
            z_lo = (logits.double() + (bias.double() - slack.double())).float().to(cache.dtype)
            z_hi = (logits.double() + (bias.double() + slack.double())).float().to(cache.dtype)
        own = cache[slot_col.clamp_min(0), step]  # [R, V]; rows of padding samples are unused
        if exact:
            assert same_values(own[live], z_lo[live]), f"step {step}: cached logits differ from the reference"
        else:
            got, lo, hi = own[live].float(), z_lo[live].float(), z_hi[live].float()
            inside = (got >= lo) & (got <= hi) | (torch.isnan(got) & torch.isnan(lo))
            assert bool(inside.all()), f"step {step}: cached logits outside the one-ulp bias bracket"
        if method == "inverse_cdf":
            own = own.float()
            scaled = own / torch.where(temp > 0, temp, torch.ones_like(temp))[:, None]
            finite = torch.isfinite(scaled.amax(dim=-1)) & ~torch.isnan(own).any(dim=-1)
            argmax_rows = live & ((temp == 0) | ~finite)
            if bool(argmax_rows.any()):
                assert torch.equal(tokens[argmax_rows, step], argmax_first(own[argmax_rows])), f"step {step}: argmax rows"
            drawn = live & (temp > 0) & finite
            if bool(drawn.any()):
                check_inverse_cdf(own[drawn], temp[drawn], seed[drawn], step, pos[drawn], tokens[drawn, step])
        elif bool(live.any()):
            want = draw_gumbel(own[live], temp[live], seed[live], step, pos[live])
            assert torch.equal(tokens[live, step], want), f"step {step}: tokens differ from draw_gumbel(own cache)"
        if bool(padding.any()):
            got = tokens[padding, step]
            if exact:
                assert torch.equal(got, argmax_first(z_lo[padding].float())), f"step {step}: padding argmax"
            else:
                best_lo = z_lo[padding].float().amax(dim=-1)
                assert bool((z_hi[padding].float().gather(1, got[:, None])[:, 0] >= best_lo).all())
        written[slot_col[live], step] = True
        prev = tokens[:, step]
    untouched = cache[~written].float()
    assert bool((untouched == SENTINEL).all()), "a cache row of a padding sample or unused slot was written"


# --------------------------------------------------------------------------- positional problems
def make_problem(vocab, rank, rows, steps, *, weight_dtype=torch.bfloat16, logit_dtype=torch.bfloat16,
                 scale=1.0, temps=(1.0, 0.6, 0.0, 1.0, 1.0, 0.7, 0.0), padding_row=2, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab + 3, rank, generator=gen).to(weight_dtype)
    head_w = (torch.randn(vocab, rank, generator=gen) * 0.3).to(weight_dtype)
    head = dm.MarkovHead(embed.to(device), head_w.to(device), scale=scale)
    base = (torch.randn(rows, steps, vocab, generator=gen) * 2).to(logit_dtype)
    num_slots = rows + 1  # distinct slots per row, one slot never used
    slots = torch.arange(rows)
    if padding_row is not None and padding_row < rows:
        slots[padding_row] = -1
    idx = slots[:, None].expand(rows, steps).reshape(-1).clone()
    positions = torch.randint(1, 10_000, (rows * steps,), generator=gen)
    temperature = torch.tensor([temps[i % len(temps)] for i in range(num_slots)], dtype=torch.float32)
    seeds = torch.randint(-(2**62), 2**62, (num_slots,), generator=gen)
    anchor = torch.randint(0, vocab + 3, (rows,), generator=gen)
    args = [base, anchor, idx, positions, temperature, seeds]
    return head, [a.to(device) for a in args]


DTYPE_CASES = [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, 1.0),
    (torch.bfloat16, torch.float32, torch.float32, 0.75),
    (torch.float32, torch.float32, torch.bfloat16, 1.0),
]


def check_exact_and_untouched(impl, weight_dtype, logit_dtype, cache_dtype, scale, device):
    """``impl`` draws what the reference draws from its cache and writes no padding or unused slot."""
    head, args = make_problem(1000, 32, 5, 3, weight_dtype=weight_dtype, logit_dtype=logit_dtype, scale=scale,
                              device=device)
    cache = torch.full((6, 3, 1000), float("nan"), dtype=cache_dtype, device=device)
    out = dm.sample_drafts(head, *args, impl=impl, logits_cache=cache)
    check_against_reference(head, *args, out)
    untouched = torch.ones(6, dtype=torch.bool)
    untouched[args[2].view(5, 3)[:, 0].clamp_min(0).unique()] = False
    assert bool(torch.isnan(cache[untouched.to(cache.device)].float()).all()), "padding or unused slots were written"


# Rows of nan_inf_problem: two NaNs (the first wins), all -inf (token 0), one +inf, one huge logit.
NAN_INF_TOKENS = [17, 0, 123, 7]


def nan_inf_problem(device):
    """One step of four rows whose argmax is :data:`NAN_INF_TOKENS` at any temperature and noise."""
    head, args = make_problem(300, 16, 4, 1, temps=(1.0,), padding_row=None, device=device)
    base = args[0].float()
    base[0, 0, 17] = float("nan")
    base[0, 0, 40] = float("nan")
    base[1, 0, :] = float("-inf")
    base[2, 0, 123] = float("inf")
    base[3, 0, 7] = 1e30
    args[0] = base
    return head, args


# --------------------------------------------------------------------------- GPU problems (full shapes)
VOCAB, RANK, STEPS = 129_280, 256, 5


def full_problem(rows, *, temps=(1.0, 0.6, 0.0), cache_dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    embed = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    head_w = (torch.randn(VOCAB, RANK, device="cuda", generator=gen) * 0.05).bfloat16()
    head = dm.MarkovHead(embed, head_w)
    base = (torch.randn(rows, STEPS, VOCAB, device="cuda", generator=gen) * 2).bfloat16()
    slots = torch.arange(rows, device="cuda")
    slots[rows // 2] = -1 if rows > 1 else 0
    idx = slots[:, None].expand(rows, STEPS).reshape(-1).contiguous()
    positions = torch.randint(1, 1 << 20, (rows * STEPS,), device="cuda", generator=gen)
    temperature = torch.tensor([temps[i % len(temps)] for i in range(rows)], device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (rows,), device="cuda", generator=gen)
    anchor = torch.randint(0, VOCAB, (rows,), device="cuda", generator=gen)
    return head, [base, anchor, idx, positions, temperature, seeds]


def check_graph_replays(sampler, rows, *, seeds=(2,), replays=1):
    """Capture ``sampler.sample`` once, refill its inputs per seed, replay: equal to eager calls."""
    _, args = full_problem(rows, seed=1)
    tokens = torch.empty(rows, STEPS, dtype=torch.int64, device="cuda")
    cache = torch.zeros(rows, STEPS, VOCAB, dtype=torch.bfloat16, device="cuda")
    static = [a.clone() for a in args]
    sampler.sample(*static, draft_tokens=tokens, logits_cache=cache)  # warm-up compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.sample(*static, draft_tokens=tokens, logits_cache=cache, check_values=False)
    for seed in seeds:
        _, fresh = full_problem(rows, seed=seed, temps=(0.6, 1.0, 0.0))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        eager = sampler.sample(*fresh)
        assert torch.equal(tokens, eager.draft_tokens)
        assert torch.equal(cache, eager.logits_cache)


# --------------------------------------------------------------------------- inverse-CDF checks
def same_bits(a, b):
    """Bit equality of two float tensors of one dtype, any NaN matching any NaN."""
    ints = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return bool(((a.view(ints) == b.view(ints)) | (torch.isnan(a) & torch.isnan(b))).all())


def replay_reference(head, base, anchor, idx_mapping, positions, temperature, seeds, tokens, cache_like):
    """The reference cache and per-step keys, fed with the sampler's own tokens."""
    rows, steps, _ = base.shape
    cache = cache_like.clone()
    slots = idx_mapping.view(rows, steps)
    pos = positions.view(rows, steps)
    prev = anchor.long()
    per_step = []
    for step in range(steps):
        padding, temp, seed, position = ref.row_keys(slots[:, step], pos[:, step], temperature, seeds)
        z = (base[:, step].float() + head.bias(prev).float()).to(cache.dtype)
        live = ~padding
        cache[slots[live, step].long(), step] = z[live]
        per_step.append((z, temp, seed, position))
        prev = tokens[:, step]
    return cache, per_step


def check_inverse_cdf(z, temp, seed, step, position, token):
    """Each T > 0 token is the inverse CDF of its uniform, within the fp32 summation error.

    With fp64 weights ``w = exp(fp32(z / T) - max)`` and ``c`` their normalised prefix sums, the
    token ``t`` must have ``w[t] > 0`` and ``c[t-1] - eps <= u <= c[t] + eps``; the kernels sum
    ``<= V`` fp32 terms of relative error ``2^-24`` each (and one ``exp`` of a few ulp), so
    ``eps = 4 V 2^-24`` bounds their deviation from the exact prefix sums.
    """
    vocab = z.shape[-1]
    eps = 4 * vocab * 2.0**-24
    u = rng.inverse_cdf_uniform(seed, step, position).double()
    safe = torch.where(temp > 0, temp, torch.ones_like(temp))
    scaled = (z.float() / safe[:, None]).double()
    weight = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    cumulative = torch.cumsum(weight, dim=-1) / weight.sum(dim=-1, keepdim=True)
    for r in range(z.shape[0]):
        if temp[r] <= 0:
            continue
        t = int(token[r])
        assert weight[r, t] > 0, f"row {r}: drew zero-probability token {t}"
        below = float(cumulative[r, t - 1]) if t > 0 else 0.0
        assert below - eps <= float(u[r]) <= float(cumulative[r, t]) + eps, (r, t, float(u[r]), below)


def draft_inputs(rows, steps, vocab, base_dtype, gen):
    """Mixed-temperature inputs: slot per (row, step) with padding, odd strides on the logits."""
    big = torch.randn(rows, steps + 1, vocab + 5, generator=gen) * 3
    base = big.to(base_dtype)[:, 1:, 2:vocab + 2]  # last stride 1, row/step strides not [N*V, V]
    assert base.stride() != (steps * vocab, vocab, 1)
    slot_table = [[4, 4, 4], [-1, -1, -1], [0, 0, 0], [2, -1, 5]]  # slot 1 and 3 are never used
    idx_mapping = torch.tensor([s for row in slot_table[:rows] for s in row[:steps]])
    positions = torch.randint(0, 2**40, (rows * steps,), generator=gen)
    temperature = torch.tensor([1.0, 0.6, 0.0, 1.0, 0.6, 0.0])
    seeds = torch.tensor([11, -5, 2**62 + 3, 7, -(2**63), 123456789])
    anchor = torch.tensor([0, 3, 777, 5])[:rows]  # 777 = V: an embed-only row
    return base, anchor, idx_mapping, positions, temperature, seeds


# --------------------------------------------------------------------------- verification inputs
VERIFY_VOCAB = 700  # three blocks of 256 (a ragged last one)


def verify_case(seed, *, batch=7, k=3, vocab=VERIFY_VOCAB, slots=9, cache_dtype=torch.float32, closeness=0.7, greedy_slot=True):
    """Self-consistent random inputs; the target is ``cache / T`` plus noise so drafts are often accepted."""
    g = torch.Generator().manual_seed(seed)
    cache = (torch.randn(slots, k + 1, vocab, generator=g) * 2).to(cache_dtype)
    idx = torch.randperm(slots, generator=g)[:batch]
    temperature = torch.rand(slots, generator=g) + 0.5
    if greedy_slot:
        temperature[idx[0]] = 0.0  # a greedy request (greedy drafts, greedy target by default)
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    positions = torch.randint(1, 10_000, (batch,), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
    num_drafts[-1] = k
    safe_t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    target = cache[idx, : k + 1].float() / safe_t[idx, None, None] + closeness * torch.randn(batch, k + 1, vocab,
                                                                                              generator=g)
    drafts = torch.zeros(batch, k, dtype=torch.int64)
    for i in range(k):
        drafts[:, i] = dm.draft.reference.draw_gumbel(cache[idx, i], temperature[idx], seeds[idx], i, positions + i)
    idx = idx.clone()
    idx[1] = -1  # a padding request
    drafts[1] = -1
    return [target.contiguous(), drafts, cache, num_drafts, idx, positions, temperature, seeds]


# --------------------------------------------------------------------------- multi-process (gloo) jobs
def leave_process_group_and_exit():
    """End a rank whose scenario passed (its ok file written): destroy the process group, then leave without the
    interpreter's finalisation (``os._exit(0)``), during which gloo's worker threads, still holding work objects, can
    abort the process (SIGABRT, "terminate called without an active exception": seen twice in CI-like runs on 2 busy
    cores, after every check had passed). A failing rank instead raises as usual (the caller destroys the group)."""
    import os
    import sys

    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(tmp_path, world, worker, args, *, deadline_s, label=""):
    """Run ``worker(rank, *args(init_file, done_dir))`` on ``world`` spawned processes and require
    every rank to finish (``done_dir/rank<r>.ok``) within ``deadline_s``; a hang fails the test and the
    stragglers are terminated."""
    import os
    import time

    import pytest
    import torch.multiprocessing as mp

    done_dir = tmp_path / "done"
    done_dir.mkdir()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    context = mp.start_processes(worker, args=args(str(tmp_path / "rendezvous"), str(done_dir)), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world}-rank job {label} did not finish within {deadline_s} s (a hang)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    assert sorted(os.listdir(done_dir)) == [f"rank{rank}.ok" for rank in range(world)]


# --------------------------------------------------------------------------- interpreter speed
def fast_interpreter_calls():
    """Context manager: Triton's interpreter without its redundant per-device-call patching.

    The interpreter re-patches ``triton.language`` (``_patch_lang``: every builtin of ``tl``,
    ``tl.tensor``, ``tl.math``) on each *device-function* call, although the launch already did it
    for the same modules: about half of an interpreted verifier program. Inside a launch this skips
    the patch when the function's language modules were already patched in that launch (the same
    state, so the same results); outside a launch, or for new modules, it patches as before. A no-op
    when the interpreter's internals are not the expected ones.
    """
    import contextlib
    import inspect

    @contextlib.contextmanager
    def manager():
        try:
            import triton.language as tl
            import triton.runtime.interpreter as interp

            grid_call, device_call, patch = (interp.GridExecutor.__call__, interp.InterpretedFunction.__call__,
                                             interp._patch_lang)
            rewrite, error = interp.InterpretedFunction.rewrite, interp.InterpreterError
        except (ImportError, AttributeError):
            yield
            return
        state = {"patched": None}
        langs_of = {}

        def langs(fn):
            found = langs_of.get(fn)
            if found is None:
                found = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                                 if inspect.ismodule(v) and v in (tl, tl.core))
            return found

        def new_grid_call(self, *args, **kwargs):
            outer = state["patched"]
            state["patched"] = set(langs(self.fn))  # what the launch patches itself
            try:
                return grid_call(self, *args, **kwargs)
            finally:
                state["patched"] = outer

        def new_device_call(self, *args, **kwargs):  # as InterpretedFunction.__call__, the patch memoised
            mine = langs(self.fn)
            if state["patched"] is None or not mine <= state["patched"]:
                patch(self.fn)
                if state["patched"] is not None:
                    state["patched"] |= mine
            fn = rewrite(self)
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise error(repr(e)) from e

        interp.GridExecutor.__call__, interp.InterpretedFunction.__call__ = new_grid_call, new_device_call
        try:
            yield
        finally:
            interp.GridExecutor.__call__, interp.InterpretedFunction.__call__ = grid_call, device_call

    return manager()


def assert_args_struct_matches(source: str, struct: str, fields) -> None:
    """The ctypes ``_fields_`` of a kernel's argument struct are the C struct ``struct`` of
    ``cuda/<source>`` field for field (``u64`` / ``i64`` / ``double``, 8 bytes each, same names, same order)."""
    import ctypes
    import re

    from dspark_markov.cuda import build

    text = (build.SOURCE_DIR / source).read_text()
    body = re.sub(r"//[^\n]*", "", re.search(rf"struct {struct} \{{(.*?)\n\}};", text, re.S).group(1))
    names = []
    for kind, declared in re.findall(r"\b(u64|i64|double)\s+([^;]+);", body):
        names += [(kind, name.strip()) for name in declared.split(",")]
    ctypes_kind = {ctypes.c_uint64: "u64", ctypes.c_int64: "i64", ctypes.c_double: "double"}
    assert [(ctypes_kind[kind], name) for name, kind in fields] == names


def replays_with_fresh_inputs(sampler, rows, steps, vocab, cache_dtype, seeds=(8, 9), flip_temperature=True):
    """CUDA-graph test skeleton: capture ``sampler.sample`` once on full-shape CUDA inputs (``cuda_inputs``
    cloned, ``bench.harness.capture_graph``: PyTorch's warm-up recipe, the garbage collector held off), then per
    seed refill every input with ``make_inputs`` of that seed (the temperatures reversed), reset the outputs to
    sentinels, replay and synchronise. Yields ``(fresh inputs, tokens, cache)`` after each replay for the caller's
    checks against the reference and against an eager call."""
    from dspark_markov.bench import harness

    static = {name: tensor.clone() for name, tensor in cuda_inputs(rows, steps, vocab, torch.bfloat16).items()}
    tokens, cache = new_outputs(static, cache_dtype)
    graph = harness.capture_graph(
        lambda: sampler.sample(**static, draft_tokens=tokens, logits_cache=cache, check_values=False))
    for seed in seeds:
        fresh = make_inputs(rows, steps, vocab, device="cuda", seed=seed, extra_slots=5, embed_vocab=vocab + 1000)
        if flip_temperature:
            fresh["temperature"] = fresh["temperature"].flip(0).contiguous()
        for name, tensor in fresh.items():
            static[name].copy_(tensor)
        cache.fill_(SENTINEL)
        tokens.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        yield fresh, tokens, cache


def special_rows_inputs(rows, steps, vocab, seed=17, plus_inf=True):
    """fp32 CUDA inputs (``make_inputs``, ``rows >= 4``) with non-finite logits: row 0 step 0 has NaN at tokens
    100,000 and 70,000 (its first NaN, so a Gumbel draw takes 70,000), row 1 is all -inf (token 0), row 3 step 1
    is all 3e38 (z/T overflows), and with ``plus_inf`` row 2 step 2 has +inf at token 5,000."""
    inputs = make_inputs(rows, steps, vocab, logit_dtype=torch.float32, device="cuda", seed=seed,
                         embed_vocab=vocab + 1000)
    base = inputs["base_logits"]
    base[0, 0, 100_000] = float("nan")
    base[0, 0, 70_000] = float("nan")
    base[1] = float("-inf")
    base[3, 1, :] = 3.0e38
    if plus_inf:
        base[2, 2, 5_000] = float("inf")
    return inputs


_SM90_BUILDS = {}  # (compiler, source's text, -D options) -> its log (and the nvcc cubin): each build once per process


def sm90_compile_log(source: str, tmp_path, nvcc_defines=(), defines=()):
    """``(log, nvrtc)``: the ``-Xptxas -v`` log of ``cuda/<source>`` compiled for sm_90 with the package's NVRTC
    path (``nvrtc`` True), else with ``nvcc -cubin`` and ``nvcc_defines`` (e.g. fewer entry points); ``defines``: a
    compile-time variant of the source (both compilers); the test is skipped when neither compiler is available.
    A build already made in this process (the same compiler, source text and defines) is not compiled again: its
    log is returned and, for nvcc, its cubin written to ``tmp_path`` as the compile would."""
    import shutil
    import subprocess

    import pytest

    from dspark_markov.cuda import build

    text = "".join(f"{name}\0{body}\0" for name, body in sorted(build.sources(source).items()))
    key = ("nvrtc", source, text, tuple(defines))
    try:
        if key not in _SM90_BUILDS:
            cubin, log = build.compile_cubin(source, verbose=True, extra_options=[f"-D{define}" for define in defines])
            assert len(cubin) > 0
            _SM90_BUILDS[key] = log
        return _SM90_BUILDS[key], True
    except build.BuildError as error:
        if "no NVRTC library" not in str(error):
            raise
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(f"neither NVRTC (libnvrtc.so) nor nvcc is available to compile {source} for sm_90")
    output = tmp_path / f"{Path(source).stem}.cubin"
    key = ("nvcc", nvcc, source, text, tuple(nvcc_defines) + tuple(defines))
    if key not in _SM90_BUILDS:
        result = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-fmad=false", "-std=c++17", "-Xptxas", "-v",
                                 *[f"-D{define}" for define in (*nvcc_defines, *defines)], str(build.SOURCE_DIR / source),
                                 "-o", str(output)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        _SM90_BUILDS[key] = (result.stderr, output.read_bytes())
    log, cubin = _SM90_BUILDS[key]
    output.write_bytes(cubin)
    return log, False


def host_library(folder, source_text: str, what: str):
    """``ctypes.CDLL`` of the host C++ ``source_text`` (which includes headers of ``cuda/``) built in ``folder``
    with IEEE fp32 semantics (``-ffp-contract=off``); the test is skipped without a host compiler."""
    import ctypes
    import shutil
    import subprocess

    import pytest

    from dspark_markov.cuda import build

    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip(f"no host C++ compiler (g++/c++/clang++) to build {what} for the host")
    (folder / "host.cpp").write_text(source_text)
    library = folder / "libhost.so"
    subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                    f"-I{build.SOURCE_DIR}", str(folder / "host.cpp"), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))
