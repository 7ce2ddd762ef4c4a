"""CudaVerifier (verify/cuda_verify.py, cuda/verify.cu) on the GPU at DeepSeek-V4.1 shapes (V = 129,280, K = 5).

Equality with the reference (and with the Triton verifier, whose formulas it follows) on the random inputs of
test_triton_verify_gpu.py, raw logits bit-identical to pre-divided ones, CUDA-graph replays with new inputs (the
kernel resets its own counters), other schedules giving the same tokens, masked and NaN rows staying in range,
and the chi-square of every position against the target with its negative control.
"""

import pytest
import torch

import dspark_markov as dm
from tests.gpu.test_triton_verify_gpu import K, VOCAB, _case, assert_lossless_with_control

pytestmark = pytest.mark.gpu


def _verifier(rows, **options):
    from dspark_markov import cuda
    from dspark_markov.verify.cuda_verify import CudaVerifier

    why = cuda.availability(build=False)
    if why is not None:
        pytest.skip(why)
    return CudaVerifier(rows, K, VOCAB, "cuda", **options)


def _triton(rows):
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    return StreamVerifier(rows, K, VOCAB, "cuda")


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
def test_equals_reference_and_triton_at_full_shapes(rows):
    verifier = _verifier(rows)
    triton_verifier = _triton(rows)
    for seed in range(3):
        args = _case(rows, seed)
        ref = dm.verify_drafts(*args)
        tokens, count = verifier.run(*args)
        verifier.check()
        assert torch.equal(count, ref.num_emitted), (seed, count.tolist(), ref.num_emitted.tolist())
        assert torch.equal(tokens, ref.tokens), seed
        t_tokens, t_count = triton_verifier.run(*args)
        assert torch.equal(tokens, t_tokens) and torch.equal(count, t_count)


def test_fp32_cache_explicit_greedy_flags_and_int32_inputs():
    rows = 64
    args = _case(rows, 7, cache_dtype=torch.float32)
    flags = torch.zeros(rows, dtype=torch.bool, device="cuda")
    flags[::3] = True
    ref = dm.verify_drafts(*args, target_greedy=flags)
    verifier = _verifier(rows)
    tokens, count = verifier.run(*args, target_greedy=flags)
    assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    narrow = list(args)
    for i in (1, 3, 4, 5):  # drafts, num_drafts, idx_mapping, positions as int32
        narrow[i] = args[i].to(torch.int32)
    tokens, count = verifier.run(*narrow, target_greedy=flags)
    assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    verifier.check()


@pytest.mark.parametrize("rows", [1, 16, 253])
def test_raw_logits_bit_identical_to_pre_divided(rows):
    from dspark_markov.verify.reference import scale_target

    args = _case(rows, 11)
    temperature = args[6]
    temperature[args[4][0]] = 1.0
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[args[4].clamp_min(0), None, None]
    tiny = 2 if rows > 2 else 0
    raw[tiny, 0, :4] = torch.tensor([1e-35, -0.0, float("-inf"), 1e-42], device=raw.device)
    divided = scale_target(raw, temperature, args[4])
    verifier = _verifier(rows)
    a = [x.clone() for x in verifier.run(divided, *args[1:])]
    b = verifier.run(raw, *args[1:], target_temperature=temperature)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ref = dm.verify_drafts(raw, *args[1:], target_temperature=temperature)
    assert torch.equal(a[0], ref.tokens) and torch.equal(a[1], ref.num_emitted)
    verifier.check()


_LIST = dict(queue=False)  # the lag-ordered list (its lag, static tickets)


@pytest.mark.parametrize("options", [dict(lag=0, **_LIST), dict(lag=1, emit_iters=1, **_LIST),
                                     dict(lag=40, emit_iters=2, **_LIST), dict(emit_iters=32, piece_mult=3),
                                     dict(piece_mult=32), dict(static=True, **_LIST),
                                     dict(static=True, row_arrivals=True, piece_mult=2, **_LIST),
                                     dict(static=False, row_arrivals=False, **_LIST),
                                     dict(static=False, lag=0, emit_iters=1, row_arrivals=True, **_LIST),
                                     dict(emit_iters=1), dict(row_arrivals=True, emit_iters=2),
                                     dict(emit_iters=505, piece_mult=4), dict(static=True),
                                     dict(static=True, row_arrivals=True, emit_iters=1)],
                         ids=["lag0", "lag1_e1", "lag40_e2", "e32_m3", "m32", "static", "static_rows_m2",
                              "counter_one_word", "counter_rows_lag0_e1", "queue_e1", "queue_rows_e2",
                              "queue_one_emit_m4", "queue_static", "queue_static_rows_e1"])
def test_schedules_agree(options):
    rows = 64
    args = _case(rows, 21)
    ref = dm.verify_drafts(*args)
    verifier = _verifier(rows, **options)
    for _ in range(3):  # repeated launches: the counters are reset by the kernel
        tokens, count = verifier.run(*args)
        assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    verifier.check()


@pytest.mark.parametrize("raw", [False, True])
def test_cuda_graph_capture_and_replay_equals_eager(raw):
    rows = 64
    verifier = _verifier(rows)
    first = _case(rows, 1)
    static = [x.clone() for x in first]
    extra = dict(target_temperature=static[6]) if raw else {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        verifier.run(*static, **extra)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, count = verifier.run(*static, **extra)
    for seed in (2, 3, 4):
        fresh = _case(rows, seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref = dm.verify_drafts(*fresh, **({"target_temperature": fresh[6]} if raw else {}))
        assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    verifier.check()


def test_masked_and_nan_rows_stay_in_range():
    rows = 16
    args = _case(rows, 5)
    target, cache = args[0], args[2]
    target[3, :, 1000:] = float("-inf")  # a masked target (top-k style): equal to the reference
    target[4, 2, 77] = float("nan")  # a NaN row: any token in range
    cache[args[4][5], 1, 5] = float("nan")
    verifier = _verifier(rows)
    tokens, count = verifier.run(*args)
    verifier.check()
    ref = dm.verify_drafts(*args)
    assert torch.equal(tokens[3], ref.tokens[3]) and int(count[3]) == int(ref.num_emitted[3])
    live = count > 0
    assert bool(((count >= 0) & (count <= K + 1)).all())
    emitted = tokens[live]
    kept = torch.arange(K + 1, device="cuda")[None, :] < count[live][:, None]
    assert bool(((emitted >= 0) & (emitted < VOCAB))[kept].all())
    assert bool((emitted[~kept] == -1).all())


def test_every_position_follows_the_target():
    verifier = _verifier(253)
    assert_lossless_with_control(verifier.run, verifier.check)


@pytest.mark.parametrize("rows", [16, 253])
def test_verify_drafts_impl_cuda_equals_impl_triton(rows):
    _verifier(1)  # (skips where the kernel cannot build)
    args = _case(rows, 7)
    ours = dm.verify_drafts(*args, impl="cuda")
    theirs = dm.verify_drafts(*args, impl="triton")
    assert torch.equal(ours.tokens, theirs.tokens) and torch.equal(ours.num_emitted, theirs.num_emitted)
    raw_t = args[6] + 0.25  # raw logits and a target temperature: divided in the kernel
    raw = dm.verify_drafts(*args, impl="cuda", target_temperature=raw_t)
    raw_triton = dm.verify_drafts(*args, impl="triton", target_temperature=raw_t)
    assert torch.equal(raw.tokens, raw_triton.tokens) and torch.equal(raw.num_emitted, raw_triton.num_emitted)
    with pytest.raises(ValueError, match="impl: 'cuda' does not cover this call"):
        dm.verify_drafts(*args, impl="cuda", method="block")


def test_dsparkstep_verify_impl_cuda_equals_triton_eager_and_in_a_graph():
    # DSparkStep(verify_impl="cuda") holds a persistent CudaVerifier: the same tokens as verify_impl="triton" on the
    # same drafts, eagerly and replayed from a CUDA graph with new target values
    from dspark_markov.step import DSparkStep

    _verifier(1)  # (skips where the kernel cannot build)
    vocab, n, reqs, slots_n = 4096, 5, 8, 12
    g = torch.Generator(device="cuda").manual_seed(11)
    head = dm.MarkovHead(torch.randn(vocab, 16, device="cuda", generator=g) * 0.3,
                         torch.randn(vocab, 16, device="cuda", generator=g) * 0.3)
    columns = torch.arange(vocab, device="cuda", dtype=torch.float32)

    def backbone(input_ids, positions):  # deterministic base logits [reqs, n, V]
        ids = input_ids.view(reqs, n + 1)[:, 1:, None].float()
        pos = positions.view(reqs, n + 1)[:, 1:, None].float()
        return (2.0 * torch.sin(ids * 0.37 + columns * 0.011 + pos * 0.1)).contiguous()

    steps = {impl: DSparkStep(head, backbone, num_steps=n, max_reqs=reqs, num_slots=slots_n, mask_token_id=vocab - 1,
                              max_model_len=4096, verify_impl=impl) for impl in ("cuda", "triton")}
    live = 6  # requests 6 and 7 are padding
    last_pos = torch.randint(10, 1000, (live,), device="cuda", generator=g)
    bonus = torch.randint(0, vocab, (live,), device="cuda", generator=g)
    slots = torch.randperm(slots_n, device="cuda", generator=g)[:live]
    temperature = torch.rand(slots_n, device="cuda", generator=g) + 0.5
    temperature[slots[1]] = 0.0  # a greedy request
    seeds = torch.randint(-(2**62), 2**62, (slots_n,), device="cuda", generator=g)
    drafts = {impl: step.draft(last_pos, bonus, slots, temperature, seeds).clone() for impl, step in steps.items()}
    assert torch.equal(drafts["cuda"], drafts["triton"])
    step = steps["cuda"]
    slot = step.req_slots.clamp_min(0)
    safe_t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    num_drafts = torch.tensor([5, 4, 5, 0, 3, 5, 0, 0], device="cuda")

    def target(seed):  # near the drafter's distribution, so that some drafts are accepted
        gen = torch.Generator(device="cuda").manual_seed(seed)
        t = torch.randn(reqs, n + 1, vocab, device="cuda", generator=gen) * 0.5
        t[:, :n] += step.logits_cache[slot].float() / safe_t[slot, None, None]
        return t

    first = target(1)
    ours = step.verify(first.clone(), num_drafts, temperature, seeds)
    theirs = steps["triton"].verify(first.clone(), num_drafts, temperature, seeds)
    assert torch.equal(ours.tokens, theirs.tokens) and torch.equal(ours.num_emitted, theirs.num_emitted)
    assert int(ours.num_emitted[live:].sum()) == 0 and int(ours.num_emitted[:live].sum()) > live
    static = first.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step.verify(static, num_drafts, temperature, seeds)  # (warm-up on the capture stream)
        with torch.cuda.graph(graph, stream=stream):
            captured = step.verify(static, num_drafts, temperature, seeds)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (2, 3):
        fresh = target(seed)
        static.copy_(fresh)
        graph.replay()
        expected = steps["triton"].verify(fresh.clone(), num_drafts, temperature, seeds)
        assert torch.equal(captured.tokens, expected.tokens) and torch.equal(captured.num_emitted, expected.num_emitted)
    step.verifier.check()
