"""Regression tests of issue 14: inputs that used to give silently wrong results or crashes.

Each test names the item of the issue it covers. The package-wide rules they pin down (README,
"Inputs"): a non-contiguous 1-D per-row / per-slot tensor raises ``ValueError`` naming it, before
anything is written; a device-side failure (the chain's barrier timeout) is raised as
:class:`dspark_markov.DeviceStatusError` at the next eager call or ``check()``.
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm

pytest.importorskip("triton")


def strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a 1-D view with stride 2 (every other element of a twice-as-long tensor)."""
    wide = torch.empty(2 * x.shape[0], dtype=x.dtype, device=x.device)
    wide[::2] = x
    wide[1::2] = x.flip(0) if x.numel() else x  # garbage a stride-blind kernel would read
    view = wide[::2]
    assert view.stride(0) == 2 and torch.equal(view, x)
    return view


# --------------------------------------------------------------------------- item 1: verify strides
def _verify_case(seed=0, batch=6, k=3, vocab=300, slots=8):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(slots, k, vocab, generator=g)
    idx = torch.randperm(slots, generator=g)[:batch]
    temperature = torch.rand(slots, generator=g) + 0.5
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    positions = torch.randint(1, 10_000, (batch,), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
    target = cache[idx].float().repeat(1, 2, 1)[:, : k + 1].contiguous() + torch.randn(batch, k + 1, vocab, generator=g)
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    return [target, drafts, cache, num_drafts, idx, positions, temperature, seeds]


VERIFY_VECTORS = {"num_drafts": 3, "idx_mapping": 4, "positions": 5, "temperature": 6, "seeds": 7}


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("name", sorted(VERIFY_VECTORS) + ["target_greedy"])
def test_item1_verify_rejects_strided_per_slot_and_per_request_vectors(name, impl):
    args = _verify_case()
    kwargs = {}
    if name == "target_greedy":
        kwargs["target_greedy"] = strided(torch.tensor([True, False, True, False, False, True]))
    else:
        args[VERIFY_VECTORS[name]] = strided(args[VERIFY_VECTORS[name]])
    with pytest.raises(ValueError, match=rf"^{name}: expected a contiguous"):
        dm.verify_drafts(*args, impl=impl, **kwargs)
    with pytest.raises(ValueError, match=rf"^{name}: expected a contiguous"):
        dm.verify_drafts(*args, impl=impl, check_values=False, **kwargs)


def test_item1_contiguous_copies_still_equal_the_reference():
    args = _verify_case(seed=3)
    ref = dm.verify_drafts(*args, impl="reference")
    out = dm.verify_drafts(*args, impl="triton")
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_emitted, ref.num_emitted)


# --------------------------------------------------------------------------- item 2: top-k/top-p strides
@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("name", ["k", "p"])
def test_item2_top_k_top_p_rejects_strided_per_row_k_and_p(name, impl):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 300, generator=g)
    before = logits.clone()
    k = torch.tensor([52, 50, 3, 0])
    p = torch.tensor([0.9, 0.5, 1.0, 0.2])
    kwargs = {"k": strided(k) if name == "k" else k, "p": strided(p) if name == "p" else p}
    with pytest.raises(ValueError, match=rf"^{name}: expected a contiguous"):
        dm.top_k_top_p(logits, impl=impl, **kwargs)
    assert torch.equal(logits, before), "logits were written before the error"


def _step(**kwargs):
    """A small DSparkStep on the CPU (V = 300, N = 2, 3 requests, 5 slots) with a fixed backbone."""
    from dspark_markov.step import DSparkStep

    g = torch.Generator().manual_seed(4)
    head = dm.MarkovHead(torch.randn(300, 16, generator=g) * 0.3, torch.randn(300, 16, generator=g) * 0.3)
    table = torch.randn(300, 300, generator=g)

    def backbone(input_ids, positions):
        return table[input_ids.view(3, 3)[:, 1:]].contiguous()

    options = dict(num_steps=2, max_reqs=3, num_slots=5, mask_token_id=299, max_model_len=4096,
                   draft_impl="reference", verify_impl="triton", block_inputs_impl="reference")
    options.update(kwargs)
    step = DSparkStep(head, backbone, **options)
    inputs = dict(last_pos=torch.tensor([10, 20, 30]), bonus_tokens=torch.tensor([1, 2, 3]),
                  req_slots=torch.tensor([4, 0, 2]), temperature=torch.tensor([1.0, 0.7, 0.0, 1.0, 0.5]),
                  seeds=torch.arange(5, dtype=torch.int64) * 7919)
    return step, inputs


@pytest.mark.parametrize("name", ["temperature", "seeds"])
def test_item1_step_verify_checks_strides_even_without_value_checks(name):
    """DSparkStep.verify skipped every check with check_values=False (the default in a capture)."""
    step, inputs = _step()
    step.draft(**inputs)
    target = torch.randn(3, 3, 300)
    values = dict(temperature=inputs["temperature"], seeds=inputs["seeds"])
    values[name] = strided(values[name])
    tokens_before = step.tokens.clone()
    with pytest.raises(ValueError, match=rf"^{name}: expected a contiguous"):
        step.verify(target, torch.tensor([2, 1, 2]), values["temperature"], values["seeds"], check_values=False)
    assert torch.equal(step.tokens, tokens_before)


# --------------------------------------------------------------------------- item 4: argument checks
def _small_head(vocab=300, rank=16):
    g = torch.Generator().manual_seed(0)
    return dm.MarkovHead(torch.randn(vocab + 2, rank, generator=g), torch.randn(vocab, rank, generator=g) * 0.3)


@pytest.mark.parametrize("head", [None, torch.zeros(3), "head"], ids=["None", "tensor", "str"])
def test_item4_sampler_rejects_a_head_that_is_not_a_markov_head(head):
    with pytest.raises(ValueError, match=r"^head: expected a MarkovHead"):
        dm.MarkovSampler(head, 2, 2)


@pytest.mark.parametrize("name", ["num_steps", "max_rows"])
@pytest.mark.parametrize("value", [2.7, "3", True, None, 2.0])
def test_item4_sampler_sizes_must_be_ints(name, value):
    sizes = {"num_steps": 2, "max_rows": 2, name: value}
    with pytest.raises(ValueError, match=rf"^{name}: expected an int"):
        dm.MarkovSampler(_small_head(), sizes["num_steps"], sizes["max_rows"])


def test_item4_sampler_sizes_accept_integer_scalars():
    import numpy as np

    sampler = dm.MarkovSampler(_small_head(), np.int64(2), torch.tensor(3))
    assert (sampler.num_steps, sampler.max_rows) == (2, 3)


@pytest.mark.parametrize("scale", [None, "abc", [1.0], float("nan"), float("inf")])
def test_item4_head_scale_must_be_a_finite_float(scale):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"^scale: expected a finite"):
        dm.MarkovHead(torch.randn(10, 16, generator=g), torch.randn(8, 16, generator=g), scale)


def test_item4_sample_drafts_with_no_steps_names_base_logits():
    head = _small_head()
    empty = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^base_logits: expected N >= 1"):
        dm.sample_drafts(head, torch.zeros(2, 0, 300), torch.zeros(2, dtype=torch.int64), empty, empty,
                         torch.ones(3), torch.zeros(3, dtype=torch.int64))


def test_item4_sample_drafts_rejects_a_head_that_is_not_a_markov_head():
    with pytest.raises(ValueError, match=r"^head: expected a MarkovHead"):
        dm.sample_drafts(None, torch.zeros(1, 1, 4), torch.zeros(1, dtype=torch.int64),
                         torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.ones(1),
                         torch.zeros(1, dtype=torch.int64))


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_item4_top_k_top_p_rejects_an_empty_vocabulary_on_every_path(impl):
    with pytest.raises(ValueError, match=r"^logits: expected V >= 1"):
        dm.top_k_top_p(torch.zeros(3, 0), 2, 0.5, impl=impl)


@pytest.mark.parametrize("name", ["num_steps", "max_reqs", "num_slots", "max_model_len"])
def test_item4_step_sizes_must_be_ints(name):
    with pytest.raises(ValueError, match=rf"^{name}: expected an int"):
        _step(**{name: 2.7})
    with pytest.raises(ValueError, match=r"^head: expected a MarkovHead"):
        from dspark_markov.step import DSparkStep

        DSparkStep(None, lambda ids, pos: None, num_steps=2, max_reqs=3, num_slots=5, mask_token_id=1,
                   max_model_len=10)


# --------------------------------------------------------------------------- item 5: duplicate slots
def _draft_case(rows=4, steps=2, vocab=300, slots=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, steps, vocab, generator=g)
    anchor = torch.randint(0, vocab, (rows,), generator=g)
    idx = torch.arange(rows)[:, None].repeat(1, steps).reshape(-1)
    positions = torch.randint(1, 1000, (rows * steps,), generator=g)
    temperature = torch.rand(slots, generator=g) + 0.5
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g)
    return [base, anchor, idx, positions, temperature, seeds]


@pytest.mark.parametrize("impl", ["reference", "fused", "chain"])
def test_item5_two_rows_on_one_slot_are_rejected_before_any_write(impl):
    head = _small_head()
    args = _draft_case()
    args[2] = torch.tensor([0, 0, 3, 3, 2, 2, 3, 3])  # rows 1 and 3 both on slot 3
    tokens = torch.full((4, 2), -7, dtype=torch.int64)
    cache = torch.full((6, 2, 300), 5.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^idx_mapping: rows 1 and 3 both use slot 3"):
        dm.sample_drafts(head, *args, impl=impl, draft_tokens=tokens, logits_cache=cache)
    assert bool((tokens == -7).all()) and bool((cache == 5.0).all())
    sampler = dm.MarkovSampler(head, 2, 4, impl=impl)
    with pytest.raises(ValueError, match=r"^idx_mapping: .*slot 3"):
        sampler.sample(*args, draft_tokens=tokens, logits_cache=cache)


def test_item5_one_row_may_change_slot_between_steps_and_padding_may_repeat():
    """Only a (slot, step) cache row written twice is an error; -1 (padding) may repeat freely."""
    head = _small_head()
    args = _draft_case()
    args[2] = torch.tensor([0, 1, 1, 0, -1, -1, -1, -1])  # (0,0) (1,1) (1,0) (0,1): all distinct
    dm.sample_drafts(head, *args)


def test_item5_step_rejects_duplicate_request_slots():
    step, inputs = _step()
    inputs["req_slots"] = torch.tensor([4, 0, 4])
    cache_before = step.logits_cache.clone()
    with pytest.raises(ValueError, match=r"^req_slots: requests 0 and 2 both use slot 4"):
        step.draft(**inputs)
    assert torch.equal(step.logits_cache, cache_before)


# --------------------------------------------------------------------------- item 3: barrier failures
def _failing_chain(head, steps, rows):
    """A chain backend whose barriers time out: two programs in the interpreter (which runs them in turn)."""
    from dspark_markov.draft.triton_chain import ChainBackend

    backend = ChainBackend(head, steps, rows, method="gumbel", cache_dtype=torch.bfloat16, device=head.device, spin_limit=3, word_slots=2)
    for _, layout in backend.layouts:
        layout.programs = 2  # more programs than can run at once here
    return backend


def _working(backend):
    for _, layout in backend.layouts:
        layout.programs = 1
    return backend


def test_item3_eager_sample_raises_when_the_chain_barrier_timed_out():
    head = _small_head()
    args = _draft_case(rows=2, steps=2)
    sampler = dm.MarkovSampler(head, 2, 2, impl="chain")
    sampler.backend = _failing_chain(head, 2, 2)
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        sampler.sample(*args)
    assert issubclass(dm.DeviceStatusError, RuntimeError)
    # reported once: the flag is cleared, and a working launch then passes its checks
    _working(sampler.backend)
    sampler.sample(*args)
    sampler.check()


def test_item3_without_value_checks_the_failure_waits_for_check():
    """check_values=False (as in a CUDA-graph capture): no host sync in sample; check() raises later."""
    head = _small_head()
    args = _draft_case(rows=2, steps=2)
    sampler = dm.MarkovSampler(head, 2, 2, impl="chain")
    sampler.backend = _failing_chain(head, 2, 2)
    out = sampler.sample(*args, check_values=False)
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < 300)).all())
    assert int(sampler.status.sum()) != 0  # the device flag an engine can copy with its outputs
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        sampler.check()
    sampler.check()  # cleared after it was reported
    assert int(sampler.status.sum()) == 0


def test_item3_auto_dispatcher_checks_the_backends_it_dispatches_to():
    head = _small_head()
    args = _draft_case(rows=1, steps=2)
    sampler = dm.MarkovSampler(head, 2, 1, impl="auto")
    sampler.backend.backends["chain"] = _failing_chain(head, 2, 1)
    sampler.backend.choices[1] = "chain"  # (the dispatcher's choice of 1 row, kept from its construction)
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        sampler.sample(*args)
    sampler.sample(*args, check_values=False)
    with pytest.raises(dm.DeviceStatusError):
        sampler.check()


def test_item3_step_reports_a_chain_failure_at_draft_or_check():
    step, inputs = _step(draft_impl="chain")
    step.sampler.backend = _failing_chain(step.head, 2, 3)
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        step.draft(**inputs)
    step.draft(**inputs, check_values=False)
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        step.check()
    step.check()


# --------------------------------------------------------------------------- item 8: the demo's checks
def test_item8_demo_says_a_zero_df_check_was_not_run(capsys):
    from dspark_markov import demo  # the package's main (demo.cli.main)

    code = demo.main(["--vocab", "32", "--rank", "4", "--requests", "2", "--length", "2", "--quiet"])
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if "bigram chi-square" in line]
    assert len(lines) == 2, printed
    for line in lines:
        assert "too few draws for a chi-square" in line and "not run" in line, line
        assert "pass" not in line.split("chi-square", 1)[1], line
    assert code == 1, "a run whose distribution check could not run must not report success"


def test_item8_verdict_of_the_chi_square():
    from dspark_markov.demo import generate as demo

    assert demo.chi_square_verdict(0.0, 0) == (None, "not run: too few draws for a chi-square (0 df)")
    passed, text = demo.chi_square_verdict(3.0, 4)
    assert passed is True and text.endswith(": pass")
    passed, text = demo.chi_square_verdict(1e9, 4)
    assert passed is False and text.endswith(": FAIL")


# --------------------------------------------------------------------------- the CLI and unavailable impls
def _python(code, *args, interpret=False):
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "dspark_markov.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, env=env, timeout=300)


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU without Triton's interpreter")


@pytest.mark.parametrize("impl, words", [("bogus", "impl: expected one of"), ("fused", "TRITON_INTERPRET=1")])
@no_cuda
def test_cli_demo_with_a_wrong_or_unrunnable_impl_says_one_line_and_exits_2(impl, words):
    result = _python(None, "demo", "--impl", impl, "--vocab", "32", "--requests", "4", "--length", "4", "--quiet")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr


@no_cuda
def test_triton_impls_on_the_cpu_without_the_interpreter_raise_value_error():
    result = _python("""
        import torch, dspark_markov as dm
        head = dm.MarkovHead(torch.randn(40, 16), torch.randn(32, 16))
        def expect(call, name):
            try:
                call()
            except ValueError as error:
                assert str(error).startswith(name + ":") and "TRITON_INTERPRET=1" in str(error), error
            else:
                raise AssertionError(name)
        expect(lambda: dm.MarkovSampler(head, 2, 2, impl="fused"), "impl")
        expect(lambda: dm.sample_drafts(head, torch.zeros(1, 2, 32), torch.zeros(1, dtype=torch.long),
                                        torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                                        torch.ones(1), torch.zeros(1, dtype=torch.long), impl="chain"), "impl")
        expect(lambda: dm.top_k_top_p(torch.randn(2, 32), 3, impl="triton"), "impl")
        t = torch.randn(1, 2, 32)
        expect(lambda: dm.verify_drafts(t, torch.zeros(1, 1, dtype=torch.long), torch.randn(1, 1, 32),
                                        torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                        torch.ones(1, dtype=torch.long), torch.ones(1),
                                        torch.zeros(1, dtype=torch.long), impl="triton"), "impl")
        z = lambda n: torch.zeros(n, dtype=torch.long)
        expect(lambda: dm.prepare_block_inputs(z(1), z(1), z(1), num_steps=2, mask_token_id=1, max_model_len=9,
                                               input_ids=z(3), positions=z(3), sample_pos=z(2),
                                               sample_idx_mapping=z(2), is_padding=torch.zeros(3, dtype=torch.bool),
                                               impl="triton"), "impl")
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@no_cuda
def test_cli_info_says_how_to_enable_what_is_missing():
    result = _python(None, "info")
    assert result.returncode == 0, result.stderr
    fused = next(line for line in result.stdout.splitlines() if line.strip().startswith("fused "))
    assert "TRITON_INTERPRET=1" in fused, result.stdout
    result = _python("""
        import sys
        sys.modules["triton"] = None
        from dspark_markov import cli
        cli.main(["info"])
    """)
    fused = next(line for line in result.stdout.splitlines() if line.strip().startswith("fused "))
    assert "pip install" in fused and "triton" in fused, result.stdout


def test_item3_demo_step_engine_reads_the_status_with_its_per_round_sync():
    """The step engine (no value checks, as on CUDA) folds the chain's status into its one sync per round."""
    from dspark_markov.demo import generate as demo
    from dspark_markov.demo.step_engine import StepGenerator, marginal_backbone

    vocab, batch, k = 300, 2, 2
    language = demo.BigramLanguage(vocab, seed=0)
    log_mu = language.marginals().log().float()
    head = demo.fit_markov_head(language, 16)
    stepper = StepGenerator(lambda prev, pos: language.logits(prev, pos), head, marginal_backbone(log_mu, batch, k),
                            batch=batch, num_steps=k, temperature=torch.ones(batch), seeds=torch.arange(batch),
                            draft_impl="chain", verify_impl="reference", block_inputs_impl="reference")
    stepper._check = False  # the CUDA setting: no value checks, no extra host syncs
    stepper.step.sampler.backend = _failing_chain(head, k, batch)
    with pytest.raises(dm.DeviceStatusError, match="barrier timed out"):
        stepper.generate(torch.tensor([1, 2]), torch.tensor([10, 20]), 4)


def test_item4_step_rejects_an_unknown_filter_impl_at_construction():
    with pytest.raises(ValueError, match=r"^filter_impl: expected"):
        _step(filter_impl="sorted")


# --------------------------------------------------------------------------- stop 45: an adversarial audit's findings
@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_audit_reference_reads_out_of_range_ids_as_the_kernels_do(method):
    """check_values=False: the reference raised IndexError on an anchor >= V or a slot >= S; it now clamps the
    anchor and treats the slot as padding, as every Triton design does, and draws what they draw."""
    head = _small_head()
    args = _draft_case(rows=3, steps=2)
    args[1] = torch.tensor([10**6, -5, 7])  # anchors outside [0, V_t)
    args[2] = torch.tensor([0, 0, 9, 9, 2, 2])  # row 1's slot 9 >= S = 6: padding
    outputs = {}
    for impl in ("reference", "fused"):
        tokens = torch.full((3, 2), -7, dtype=torch.int64)
        cache = torch.full((6, 2, 300), 5.0, dtype=torch.bfloat16)
        dm.sample_drafts(head, *args, impl=impl, method=method, draft_tokens=tokens, logits_cache=cache,
                         check_values=False)
        outputs[impl] = tokens, cache
    assert bool(((outputs["reference"][0] >= 0) & (outputs["reference"][0] < 300)).all())
    assert torch.equal(outputs["reference"][0], outputs["fused"][0])
    # the same cache up to the bias's summation order (SPEC.md 3 leaves it free: Triton 3.9's interpreter sums tl.dot
    # in another order than torch's matmul, and an entry where U and the bias nearly cancel then rounds to another
    # bf16 value): within the fp32 accumulation bound of tests.helpers.bias_bracket (any previous token) plus one bf16
    # ulp of z on each side
    ref, fused = outputs["reference"][1].float(), outputs["fused"][1].float()
    magnitude = head.embed_weight.float().abs() @ head.head_weight.float().abs().t()
    slack = head.rank * 2.0**-23 * float(magnitude.max())
    _, exponent = torch.frexp(torch.maximum(ref.abs(), fused.abs()))
    ulp = torch.ldexp(torch.ones_like(ref), (exponent - 8).clamp_min(-133))
    assert bool(((ref - fused).abs() <= 2 * slack + 2 * ulp).all())
    assert bool((outputs["reference"][1][[1, 3, 4, 5]] == 5.0).all())  # only slots 0 and 2 written
    assert bool((outputs["fused"][1][[1, 3, 4, 5]] == 5.0).all())


def test_audit_reference_verification_treats_a_slot_past_s_as_padding():
    args = _verify_case(seed=5)
    args[4] = args[4].clone()
    args[4][1] = 8  # S = 8 slots: out of range
    ref = dm.verify_drafts(*args, impl="reference", check_values=False)
    out = dm.verify_drafts(*args, impl="triton", check_values=False)
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_emitted, ref.num_emitted)
    assert int(ref.num_emitted[1]) == 0 and bool((ref.tokens[1] == -1).all())
    raw = dm.verify_drafts(*args, impl="reference", check_values=False, target_temperature=args[6])
    assert int(raw.num_emitted[1]) == 0


@pytest.mark.parametrize("method", ["standard", "block"])
def test_audit_unchecked_num_drafts_outside_0_k_is_clamped_alike(method):
    """check_values=False with num_drafts outside [0, K]: every implementation verifies min(max(n, 0), K) drafts
    (the Triton and CUDA kernels' documented clamp). The reference did not clamp (n > K after K acceptances drew a
    residual of p_K - q_{K-1} instead of the bonus from p_K), and the Triton kernel truncated n to int32 before
    clamping (2^40 verified 0 drafts, 2^32 + 1 one)."""
    args = _verify_case(seed=6, batch=8, k=3)
    target, drafts, cache, _, idx, _, temperature, _ = args
    target[:, :3] = cache[idx].float() / temperature[idx, None, None]  # p = q: drafts are accepted (ratio 1)
    drafts.copy_(cache[idx].float().argmax(dim=-1))
    args[3] = torch.tensor([4, 100, 2**40, 2**32 + 1, 2**31, -1, -(2**40), 3])
    want = dm.verify_drafts(*args[:3], args[3].clamp(0, 3), *args[4:], method=method, impl="reference")
    assert int(want.num_emitted[:5].min()) >= 3  # the clamped requests accept drafts
    for impl in ("reference", "triton"):
        out = dm.verify_drafts(*args, method=method, impl=impl, check_values=False)
        assert torch.equal(out.tokens, want.tokens), (impl, out.tokens, want.tokens)
        assert torch.equal(out.num_emitted, want.num_emitted), (impl, out.num_emitted, want.num_emitted)
    # int32 counts at their limits, and padding requests (slot -1 or past the cache) whatever their count
    args[3] = torch.tensor([2**31 - 1, 4, -(2**31), 3, 2**31 - 1, 7, -5, 1], dtype=torch.int32)
    args[4] = idx.clone()
    args[4][[4, 6]] = torch.tensor([-1, int(cache.shape[0]) + 2], dtype=idx.dtype)
    want = dm.verify_drafts(*args[:3], args[3].clamp(0, 3), *args[4:], method=method, impl="reference",
                            check_values=False)
    for impl in ("reference", "triton"):
        out = dm.verify_drafts(*args, method=method, impl=impl, check_values=False)
        assert torch.equal(out.tokens, want.tokens), (impl, out.tokens, want.tokens)
        assert torch.equal(out.num_emitted, want.num_emitted), (impl, out.num_emitted, want.num_emitted)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_audit_filter_scalar_arguments_beyond_machine_ints(impl):
    """k of any size means what the docstring says (<= 0 or >= V: no top-k); p or T too large for a float, or an
    infinite scalar T, raise ValueError naming them."""
    x = torch.randn(4, 700, generator=torch.Generator().manual_seed(1))
    for k in (2**63, 2**100, -(2**100)):
        assert torch.equal(dm.top_k_top_p(x.clone(), k, impl=impl), x)
    with pytest.raises(ValueError, match=r"^p: expected a float >= 0, got an int too large"):
        dm.top_k_top_p(x.clone(), None, 10**400, impl=impl)
    with pytest.raises(ValueError, match=r"^temperature: expected a finite float >= 0, got inf"):
        dm.top_k_top_p(x.clone(), 5, temperature=float("inf"), impl="reference")
    # a float p beyond the float32 range: top-p off (p >= 1), not an overflow in torch.full; such a T: ValueError
    assert torch.equal(dm.top_k_top_p(x.clone(), None, 1e39, impl=impl), x)
    with pytest.raises(ValueError, match=r"^temperature: expected a value within the float32 range"):
        dm.top_k_top_p(x.clone(), 5, temperature=1e39, impl="reference")


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_audit_filter_out_overlapping_logits_is_rejected(impl):
    big = torch.randn(5, 700, generator=torch.Generator().manual_seed(2))
    before = big.clone()
    with pytest.raises(ValueError, match=r"^out: overlaps logits"):
        dm.top_k_top_p(big[:4], 5, 0.8, impl=impl, out=big[1:5])
    assert torch.equal(big, before)
    expected = dm.top_k_top_p(before[:4].clone(), 5, 0.8, impl="reference")
    assert torch.equal(dm.top_k_top_p(big[:4], 5, 0.8, impl=impl, out=big[:4]), expected)  # out=logits: in place
    interleaved = torch.randn(8, 700)
    with pytest.raises(ValueError, match=r"^out: overlaps logits"):  # conservative: interleaved rows count too
        dm.top_k_top_p(interleaved[0::2], 5, None, impl=impl, out=interleaved[1::2])


def test_audit_auto_blames_the_argument_that_is_not_a_tensor():
    with pytest.raises(ValueError, match=r"^logits: expected a torch.Tensor"):
        dm.top_k_top_p(torch.randn(2, 10).tolist(), 5)
    with pytest.raises(ValueError, match=r"^input_ids: expected a torch.Tensor"):
        dm.prepare_block_inputs(torch.tensor([3]), torch.tensor([1]), torch.tensor([0]), num_steps=2, mask_token_id=9,
                                max_model_len=100, input_ids=[0, 0, 0], positions=torch.zeros(3, dtype=torch.int64),
                                sample_pos=torch.zeros(2, dtype=torch.int64),
                                sample_idx_mapping=torch.zeros(2, dtype=torch.int64),
                                is_padding=torch.zeros(3, dtype=torch.bool))


def test_audit_sizes_and_scale_beyond_machine_ints():
    head = _small_head()
    for name, args in (("num_steps", (10**30, 4)), ("max_rows", (3, 10**30)), ("max_rows", (3, 2**40))):
        with pytest.raises(ValueError, match=rf"^{name}: expected an int <= {2**31 - 1}"):
            dm.MarkovSampler(head, *args, impl="fused")
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"^scale: expected a finite float"):
        dm.MarkovHead(torch.randn(10, 4, generator=g), torch.randn(8, 4, generator=g), 2**2000)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_audit_mask_token_id_must_fit_input_ids(impl):
    def call(mask, dtype):
        ids = torch.full((6,), -3, dtype=dtype)
        dm.prepare_block_inputs(torch.tensor([3, 5]), torch.tensor([1, 2]), torch.tensor([0, 1]), num_steps=2,
                                mask_token_id=mask, max_model_len=100, input_ids=ids,
                                positions=torch.zeros(6, dtype=torch.int64),
                                sample_pos=torch.zeros(4, dtype=torch.int64),
                                sample_idx_mapping=torch.zeros(4, dtype=torch.int64),
                                is_padding=torch.zeros(6, dtype=torch.bool), impl=impl)
        return ids

    with pytest.raises(ValueError, match=r"^mask_token_id: 1099511627776 does not fit input_ids' dtype int32"):
        call(2**40, torch.int32)
    with pytest.raises(ValueError, match=r"^mask_token_id: expected an int in \[0, "):
        call(2**63, torch.int64)
    assert call(2**31 - 1, torch.int32).tolist() == [1, 2**31 - 1, 2**31 - 1, 2, 2**31 - 1, 2**31 - 1]


def test_audit_outputs_whose_rows_overlap_are_rejected():
    head = _small_head()
    args = _draft_case(rows=2, steps=2)
    with pytest.raises(ValueError, match=r"^draft_tokens: rows overlap"):
        dm.sample_drafts(head, *args, impl="reference", draft_tokens=torch.zeros(1, 2, dtype=torch.int64).expand(2, 2))
    cache = torch.zeros(1, 2, 300, dtype=torch.bfloat16).expand(6, 2, 300)
    with pytest.raises(ValueError, match=r"^logits_cache: slots overlap"):
        dm.sample_drafts(head, *args, impl="reference", logits_cache=cache)


def test_audit_step_names_its_own_arguments():
    step, inputs = _step()
    with pytest.raises(ValueError, match=r"^req_slots: expected values in \[-1, 5\)"):
        step.draft(**dict(inputs, req_slots=torch.tensor([5, 0, 2])))
    with pytest.raises(ValueError, match=r"^bonus_tokens: expected values in \[0, 300\)"):
        step.draft(**dict(inputs, bonus_tokens=torch.tensor([300, 0, 2])))
    step.draft(**inputs)
    for shape in ((2, 3, 300), (3, 2, 300), (3, 3, 299)):
        with pytest.raises(ValueError, match=r"^target_logits: expected shape \(3, 3, 300\)"):
            step.verify(torch.randn(shape), torch.tensor([2, 1, 2]), inputs["temperature"], inputs["seeds"])
    with pytest.raises(ValueError, match=r"^max_model_len: expected an int <= "):
        _step(max_model_len=2**63)


@pytest.mark.parametrize("impl, method, top_k", [("reference", "gumbel", None), ("reference", "inverse_cdf", None),
                                                 ("loop", "gumbel", None), ("gumbel_fused", "gumbel", None),
                                                 ("inverse_cdf", "inverse_cdf", None), ("fused", "gumbel", None),
                                                 ("reference", "gumbel", 5)])
def test_audit_head_of_parameters_that_require_grad(impl, method, top_k):
    """Weights taken from a model (``nn.Parameter``, ``requires_grad=True``) draft as their plain values do. The
    torch ops with ``out=`` (the bias GEMM of loop / gumbel_fused / inverse_cdf, the markov_embeds gather) raised
    torch's autograd RuntimeError, and the reference returned a cache that carried an autograd graph."""
    plain = _small_head()
    head = dm.MarkovHead(torch.nn.Parameter(plain.embed_weight.clone()), torch.nn.Parameter(plain.head_weight.clone()))
    args = _draft_case(rows=3, steps=2)
    outs = []
    for h in (plain, head):
        embeds = torch.empty(3, 2, 16)
        out = dm.sample_drafts(h, *args, impl=impl, method=method, draft_top_k=top_k, markov_embeds=embeds)
        outs.append((out, embeds))
    (want, want_embeds), (got, got_embeds) = outs
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert torch.equal(got.logits_cache, want.logits_cache) and not got.logits_cache.requires_grad
    assert torch.equal(got_embeds, want_embeds) and not got_embeds.requires_grad
    weight = torch.nn.Parameter(torch.randn(300, 16))  # kept as given: no copy of the weights
    assert dm.MarkovHead(weight, weight).head_weight.data_ptr() == weight.data_ptr()


@pytest.mark.parametrize("impl, method, top_k", [("reference", "gumbel", None), ("reference", "inverse_cdf", None),
                                                 ("loop", "gumbel", None), ("fused", "gumbel", None),
                                                 ("fused", "gumbel", 5), ("reference", "gumbel", 5)])
def test_audit_base_logits_of_a_backbone_run_with_autograd(impl, method, top_k):
    """Base logits (and temperatures) that require grad, as a backbone run outside ``torch.no_grad`` returns them,
    draft as their values do: ``loop``'s ``torch.add(out=)`` and top-k ``fused``'s ``torch.topk(out=)`` raised
    torch's autograd RuntimeError, and the reference wrote a cache that carried an autograd graph."""
    head = _small_head()
    args = _draft_case(rows=3, steps=2)
    want = dm.sample_drafts(head, *args, impl=impl, method=method, draft_top_k=top_k)
    leaf = args[0].clone().requires_grad_()
    graded = [leaf * 1.0] + args[1:4] + [args[4].clone().requires_grad_(), args[5]]
    got = dm.sample_drafts(head, *graded, impl=impl, method=method, draft_top_k=top_k)
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert torch.equal(got.logits_cache, want.logits_cache) and not got.logits_cache.requires_grad
