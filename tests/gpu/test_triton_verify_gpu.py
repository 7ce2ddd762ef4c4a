"""verify_drafts(impl="triton") on the GPU at DeepSeek-V4.1 shapes (V = 129,280, K = 5).

Equality with the reference on random inputs (decisions within a few ulps of a threshold, the only
place the two may differ, have probability about 1e-6 each; see ``triton_verify_stream``), a chi-square
test of every position against the target over many trials, and CUDA-graph capture and replay.
"""

import pytest
import torch

import dspark_markov as dm
import dspark_markov.draft.reference  # noqa: F401  (dm.draft.reference below; the file alone imports nothing else)
from dspark_markov.demo.generate import chi_square, chi_square_threshold

pytestmark = pytest.mark.gpu

VOCAB, K = 129_280, 5


def _case(rows, seed, cache_dtype=torch.bfloat16, closeness=0.5):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    slots = rows + 3
    cache = (torch.randn(slots, K, VOCAB, generator=g, device=dev) * 2).to(cache_dtype)
    idx = torch.randperm(slots, generator=g, device=dev)[:rows]
    temperature = torch.rand(slots, generator=g, device=dev) + 0.5
    if rows > 1:
        temperature[idx[rows // 2]] = 0.0  # one greedy request
    seeds = torch.randint(-(2**62), 2**62, (slots,), generator=g, device=dev)
    positions = torch.randint(1, 1 << 20, (rows,), generator=g, device=dev)
    num_drafts = torch.randint(0, K + 1, (rows,), generator=g, device=dev)
    num_drafts[0] = K
    safe_t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    target = torch.empty(rows, K + 1, VOCAB, device=dev)
    target[:, :K] = cache[idx].float() / safe_t[idx, None, None]
    target[:, K] = torch.randn(rows, VOCAB, generator=g, device=dev) * 2
    target += closeness * torch.randn(rows, K + 1, VOCAB, generator=g, device=dev)
    drafts = torch.zeros(rows, K, dtype=torch.int64, device=dev)
    for i in range(K):
        drafts[:, i] = dm.draft.reference.draw_gumbel(cache[idx, i], temperature[idx], seeds[idx], i, positions + i)
    if rows > 2:
        idx[1] = -1  # a padding request
    return [target, drafts, cache, num_drafts, idx, positions, temperature, seeds]


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("rows", [1, 16, 64, 253])
def test_equals_reference_at_full_shapes(rows, method):
    for seed in range(2):
        args = _case(rows, seed)
        ref = dm.verify_drafts(*args, method=method)
        out = dm.verify_drafts(*args, method=method, impl="triton")
        assert torch.equal(out.num_emitted, ref.num_emitted)
        assert torch.equal(out.tokens, ref.tokens)


def test_fp32_cache_and_explicit_greedy_flags():
    args = _case(64, 7, cache_dtype=torch.float32)
    flags = torch.zeros(64, dtype=torch.bool, device="cuda")
    flags[::3] = True
    for method in ("standard", "block"):
        ref = dm.verify_drafts(*args, target_greedy=flags, method=method)
        out = dm.verify_drafts(*args, target_greedy=flags, method=method, impl="triton")
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_emitted, ref.num_emitted)


def position_counts(verify, dev, *, vocab, k, rows, calls, support=24, seed=3):
    """Counts of each completed position over ``rows * calls`` one-round trials, and the target ``p``.

    The target rows are fixed (they do not depend on the drafts), so a lossless verifier makes
    position ``j`` of the emitted block, completed by sampling ``p_j`` where nothing was emitted,
    distributed exactly as ``p_j``. The target's support is ``support`` tokens (the rest of V is
    ``-inf``); the draft rows are close to the target on that support, put a little mass on 16 tokens
    outside it (always rejected) and ``exp(-30)`` on the rest. ``verify(target, drafts, cache,
    num_drafts, slots, positions, temp, seeds) -> (tokens, count)``. Returns (counts ``[k+1, vocab]``
    fp64, p ``[k+1, vocab]`` fp64, mean accepted drafts).
    """
    g = torch.Generator(device=dev).manual_seed(seed)
    target_row = torch.full((k + 1, vocab), float("-inf"), device=dev)
    target_row[:, :support] = torch.randn(k + 1, support, generator=g, device=dev)
    temp = torch.full((rows,), 0.9, device=dev)
    cache_row = torch.full((k, vocab), -30.0, device=dev)
    cache_row[:, :support] = 0.9 * target_row[:k, :support] + 0.6 * torch.randn(k, support, generator=g, device=dev)
    cache_row[:, support:support + 16] = -2.0
    p = torch.softmax(target_row.double(), dim=-1)
    cache = cache_row.to(torch.bfloat16).expand(rows, k, vocab).contiguous()
    target = target_row.expand(rows, k + 1, vocab).contiguous()
    slots = torch.arange(rows, device=dev)
    counts = torch.zeros(k + 1, vocab, dtype=torch.float64, device=dev)
    accepted = 0.0
    for call in range(calls):
        seeds = slots * 1_000_003 + call * 7919 + 17
        positions = torch.full((rows,), 1000 + 13 * call, device=dev)
        drafts = torch.stack([dm.draft.reference.draw_gumbel(cache[:, i], temp, seeds, i, positions + i)
                              for i in range(k)], dim=1)
        tokens, count = verify(target, drafts, cache, torch.full((rows,), k, device=dev), slots, positions, temp,
                               seeds)
        accepted += float((count - 1).double().mean()) / calls
        for j in range(k + 1):
            fresh = torch.multinomial(p[j].float(), rows, replacement=True, generator=g)
            column = torch.where(j < count, tokens[:, j], fresh)
            counts[j] += torch.bincount(column, minlength=vocab).double()
    return counts, p, accepted


def test_cuda_graph_capture_and_replay_equals_eager():
    rows = 64
    verifier = _stream()(rows, K, VOCAB, "cuda")
    first = _case(rows, 1)
    static = [x.clone() for x in first]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        verifier.run(*static, method="block")  # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, count = verifier.run(*static, method="block")
    for seed in (2, 3):
        fresh = _case(rows, seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        eager = dm.verify_drafts(*fresh, method="block", impl="triton")
        ref = dm.verify_drafts(*fresh, method="block")
        assert torch.equal(tokens, eager.tokens) and torch.equal(count, eager.num_emitted)
        assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)


# --------------------------------------------------------------------------- DSparkStep in CUDA graphs
def test_dspark_step_graph_replay_equals_eager():
    """Draft and verify captured once in two CUDA graphs, replayed with new batches == eager steps."""
    from dspark_markov.step import DSparkStep

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    max_reqs, slots, rank = 16, 24, 256
    head = dm.MarkovHead((torch.randn(VOCAB, rank, generator=g, device=dev) * 0.05).to(torch.bfloat16),
                         (torch.randn(VOCAB, rank, generator=g, device=dev) * 0.05).to(torch.bfloat16))
    embed = torch.randn(VOCAB, 64, generator=g, device=dev).to(torch.bfloat16)
    proj = torch.randn(64, VOCAB, generator=g, device=dev).to(torch.bfloat16) * 0.3

    def backbone(input_ids, positions):  # capturable: a lookup and a GEMM
        rows = input_ids.view(max_reqs, K + 1)[:, 1:]
        return embed[rows] @ proj

    def make():
        return DSparkStep(head, backbone, num_steps=K, max_reqs=max_reqs, num_slots=slots, mask_token_id=1,
                          max_model_len=1 << 20, verify_method="block")

    def batch(seed):
        h = torch.Generator(device=dev).manual_seed(seed)
        temperature = torch.rand(slots, generator=h, device=dev) + 0.5
        temperature[3] = 0.0
        return dict(last_pos=torch.randint(1, 1 << 19, (max_reqs,), generator=h, device=dev),
                    bonus=torch.randint(0, VOCAB, (max_reqs,), generator=h, device=dev),
                    req_slots=torch.randperm(slots, generator=h, device=dev)[:max_reqs],
                    temperature=temperature,
                    seeds=torch.randint(-(2**62), 2**62, (slots,), generator=h, device=dev),
                    num_reqs=torch.tensor([max_reqs - seed % 4], device=dev),
                    num_drafts=torch.randint(0, K + 1, (max_reqs,), generator=h, device=dev),
                    noise=torch.randn(max_reqs, K + 1, VOCAB, generator=h, device=dev))

    def target_of(step, b):
        slot = step.req_slots.clamp_min(0)
        t = b["temperature"][slot]
        target = b["noise"].clone()
        target[:, :K] += step.logits_cache[slot].float() / torch.where(t == 0, 1.0, t)[:, None, None]
        return target

    graphed, eager = make(), make()
    static = batch(0)
    static_target = torch.zeros(max_reqs, K + 1, VOCAB, device=dev)

    def draft(step, b):
        return step.draft(b["last_pos"], b["bonus"], b["req_slots"], b["temperature"], b["seeds"],
                          num_reqs=b["num_reqs"], check_values=False)

    def verify(step, b, target):
        return step.verify(target, b["num_drafts"], b["temperature"], b["seeds"], check_values=False)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compile every kernel outside the capture
        draft(graphed, static)
        static_target.copy_(target_of(graphed, static))
        verify(graphed, static, static_target)
    torch.cuda.current_stream().wait_stream(stream)
    draft_graph, verify_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(draft_graph):
        draft(graphed, static)
    with torch.cuda.graph(verify_graph):
        out = verify(graphed, static, static_target)
    for seed in (1, 2, 3):
        fresh = batch(seed)
        for key, value in fresh.items():
            static[key].copy_(value)
        draft_graph.replay()
        expected_drafts = draft(eager, fresh).clone()
        torch.cuda.synchronize()
        assert torch.equal(graphed.draft_tokens, expected_drafts)
        live = int(fresh["num_reqs"])
        used = fresh["req_slots"][:live]
        assert torch.equal(graphed.logits_cache[used], eager.logits_cache[used])
        target = target_of(eager, fresh)
        static_target.copy_(target)
        verify_graph.replay()
        expected = verify(eager, fresh, target.clone())
        torch.cuda.synchronize()
        assert torch.equal(out.tokens, expected.tokens) and torch.equal(out.num_emitted, expected.num_emitted)
        assert bool((out.num_emitted[live:] == 0).all())


# --------------------------------------------------------------------------- the one-launch stream design
def _stream():
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    return StreamVerifier


@pytest.mark.parametrize("method", ["standard", "block"])
def test_stream_every_position_follows_the_target(method):
    """The chi-square of every position for the stream kernel (the one verify_drafts runs), with its
    negative control."""
    verifier = _stream()(253, K, VOCAB, "cuda")
    assert_lossless_with_control(lambda *args: verifier.run(*args, method=method), verifier.check)


def assert_lossless_with_control(verify, check, rows=253, calls=48, support=24):
    """Every position of ``verify`` (``verify(target, drafts, cache, num_drafts, slots, positions, temp, seeds)
    -> (tokens, count)``, a verifier of ``rows`` requests) passes the chi-square against the target over ``calls``
    rounds (:func:`position_counts`), emits nothing outside the support and accepts more than half a draft on
    average; ``check()`` (the verifier's status) passes; and the negative control, the drafts' distribution taken
    at 1.5 x their temperature, fails the chi-square."""
    counts, p, accepted = position_counts(verify, torch.device("cuda"), vocab=VOCAB, k=K, rows=rows, calls=calls,
                                          support=support)
    check()
    assert float(counts[:, support:].sum()) == 0
    statistic, dof = chi_square(counts[:, :support].cpu(), (p[:, :support] * rows * calls).cpu())
    assert statistic <= chi_square_threshold(dof), f"chi-square {statistic:.1f} on {dof} df"
    assert accepted > 0.5

    def wrong_q(target, drafts, cache, num_drafts, slots, positions, temp, seeds):
        return verify(target, drafts, cache, num_drafts, slots, positions, temp * 1.5, seeds)

    counts, p, _ = position_counts(wrong_q, torch.device("cuda"), vocab=VOCAB, k=K, rows=rows, calls=calls,
                                   support=support)
    statistic, dof = chi_square(counts[:, :support].cpu(), (p[:, :support] * rows * calls).cpu())
    assert statistic > chi_square_threshold(dof)


# the defaults (fused loop, fast exact division, ...) and the separate loops with div_rn per value
STREAM_VARIANTS = {"default": {}, "separate": dict(fused=0, fast_divide=0, interior=0, scan_argmax=0, early=0, prefetch=0,
                                                   max_registers=128, emit_block=2048)}


@pytest.mark.parametrize("variant", sorted(STREAM_VARIANTS))
@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("rows", [1, 16, 253])
def test_stream_raw_logits_bit_identical_to_pre_divided(rows, method, variant):
    """Raw logits + the per-slot temperature == ``scale_target`` of them passed pre-divided, bit for bit
    (and both == the reference), with greedy slots (T = 0: unscaled) and a T = 1 slot among them;
    for the default kernel (the fast exact division, no divide per element) and the separate loops."""
    from dspark_markov.verify.reference import scale_target

    args = _case(rows, 11)
    temperature = args[6]
    temperature[args[4][0]] = 1.0  # (the division is skipped for T = 1)
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[args[4].clamp_min(0), None, None]
    tiny = 2 if rows > 2 else 0  # a request with T in (0.5, 1.5), not 1: values for the exact fallback
    raw[tiny, 0, :4] = torch.tensor([1e-35, -0.0, float("-inf"), 1e-42], device=raw.device)
    divided = scale_target(raw, temperature, args[4])
    verifier = _stream()(rows, K, VOCAB, "cuda", **STREAM_VARIANTS[variant])
    a = [x.clone() for x in verifier.run(divided, *args[1:], method=method)]
    b = verifier.run(raw, *args[1:], method=method, target_temperature=temperature)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ref = dm.verify_drafts(raw, *args[1:], method=method, target_temperature=temperature)
    assert torch.equal(a[0], ref.tokens) and torch.equal(a[1], ref.num_emitted)
    verifier.check()


def test_stream_layouts_agree_and_graph_replays():
    """Other chunkings and lags give the same tokens; a captured launch replays with new inputs
    (the kernel resets its own counters) and equals the reference every time."""
    rows = 64
    StreamVerifier = _stream()
    first = _case(rows, 21)
    outs = []
    for options in ({}, dict(t1=1, t2=1, lag=1), dict(t1=8, t2=4, lag=9)):
        verifier = StreamVerifier(rows, K, VOCAB, "cuda", **options)
        outs.append([x.clone() for x in verifier.run(*first, method="block")])
        verifier.check()
    for tokens, count in outs[1:]:
        assert torch.equal(tokens, outs[0][0]) and torch.equal(count, outs[0][1])
    verifier = StreamVerifier(rows, K, VOCAB, "cuda")
    static = [x.clone() for x in first]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        verifier.run(*static, method="standard", target_temperature=static[6])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, count = verifier.run(*static, method="standard", target_temperature=static[6])
    for seed in (22, 23, 24):
        fresh = _case(rows, seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref = dm.verify_drafts(*fresh, method="standard", target_temperature=fresh[6])
        assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    verifier.check()
    assert int(verifier.counters.abs().sum()) == 0


# the options measured against the defaults (issue 18, verify3 and verify4): the compact and the padded program
# orders, the raw mode's split unroll (only the divided slots load fewer tiles at once), the poisoned fast division
# with 4 tiles at once where values are divided, the L2 prefetch of the emitted row (evict_last)
OPTION_VARIANTS = {"compact": dict(compact=1), "padded": dict(compact=0), "div_unroll": dict(div_unroll=2),
                   "fast_divide_2": dict(fast_divide=2, div_unroll=4), "emit_prefetch": dict(emit_prefetch=2),
                   # phased launches (passed on the H200, stop 31): row 0, then rows 1..K; and three launches
                   "phases_1": dict(phases=1), "phases_1_2": dict(phases=(1, 2)),
                   # a request's chunks claimed from a counter (stop 32; exact on an H100, slower), alone and phased
                   "claim_4": dict(claim=4), "claim_2_phases_1": dict(claim=2, phases=1),
                   # the single-buffered stream loops at 80 registers (the standard method's default until stop 33,
                   # now double-buffered at 128), and the double buffers in groups of 2 tiles at 80 (passed on an H100)
                   "dbuf_0": dict(dbuf=0), "dbuf_unroll_2": dict(dbuf=1, unroll=2, max_registers=80),
                   # the emit scan double-buffered, reversed, both (stop 33; passed on an H100 in stop 34; both the
                   # standard method's default since), and neither (the standard method's old emit scan)
                   "emit_dbuf": dict(emit_dbuf=1), "emit_reverse": dict(emit_reverse=1),
                   "emit_dbuf_reverse": dict(emit_dbuf=1, emit_reverse=1), "emit_off": dict(emit_dbuf=0, emit_reverse=0),
                   # the double-buffered loops on pre-divided logits above 16 requests (off there by default)
                   "dbuf_1": dict(dbuf=1),
                   # rows end to end in items crossing row ends (stop 34, passed on the H200): the default layout
                   # (16 requests: 16 items of 24 tiles; 253: 6 of 64, one row each), 40-tile items (every row's
                   # partials from two or three items), and with the emit scan's options
                   "span": dict(span=1), "span_t1_40": dict(span=1, t1=40),
                   "span_emit": dict(span=1, emit_dbuf=1, emit_reverse=1),
                   # emit items with fewer dependent round trips (stop 34; passed on the H200 and the default since),
                   # and without (the emit chain before it)
                   "emit_eager": dict(emit_eager=1), "emit_eager_0": dict(emit_eager=0),
                   # every row's statistics loaded with the accepted count (stop 34; passed on an H100 in stop 38)
                   "emit_gather": dict(emit_gather=1),
                   # the exact keys of every lane's best (stop 39: emit_winner, the exact key of each emit item's
                   # cheap winner only, became the default but for pre-divided launches of 17-128 requests)
                   "emit_winner_0": dict(emit_winner=0),
                   # the last requests' emit items over fewer tiles each (stop 39, opt-in)
                   "tail": dict(tail=5, tail_t2=2)}


@pytest.mark.parametrize("rows", [16, 253])
def test_stream_emit_winner_near_ties(rows):
    """Near-tie traps (:mod:`tests.emit_traps`) with the GPU's cheap noise (hardware ``lg2``): bonus rows whose two
    best keys tie exactly or differ by one ulp while the cheap keys order them the other way, in one lane of a
    1,024-value emit tile (tokens 1,024 apart in the first emit item's chunk) or in two; the emit scan with
    ``emit_winner`` on and off draw the reference's token, eagerly and from a graph replay."""
    from tests.emit_traps import plant_traps

    args = _case(rows, 41)
    expect = plant_traps(args, [(2, True, False), (3, True, True), (4, False, False), (5, False, True)], window=2048,
                         lane=1024)
    ref = dm.verify_drafts(*args)
    for b, win in expect.items():
        assert int(ref.tokens[b, 0]) == win
    for options in (dict(emit_winner=0), dict(emit_winner=1)):
        verifier = _stream()(rows, K, VOCAB, "cuda", **options)
        out = verifier.run(*args)
        assert torch.equal(out[0], ref.tokens) and torch.equal(out[1], ref.num_emitted)
        static = [x.clone() for x in args]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replay = verifier.run(*static)
        graph.replay()
        torch.cuda.synchronize()
        verifier.check()
        assert torch.equal(replay[0], ref.tokens) and torch.equal(replay[1], ref.num_emitted)


def _poison(verifier, variant):
    """Claimed chunks and spanned items: NaN partials before a run, so a chunk that no program streamed (or a
    partial of another row) cannot pass on stale values."""
    if "claim" in variant or "span" in variant:
        verifier.pa.fill_(float("nan"))
        verifier.pb.fill_(float("nan"))
        verifier.pi.fill_(-7)


@pytest.mark.parametrize("variant", sorted(OPTION_VARIANTS))
@pytest.mark.parametrize("rows", [16, 253])
def test_stream_options_equal_reference_and_replay(rows, variant):
    """Each option on repeated eager launches (raw and pre-divided; block too for div_unroll, fast_divide_2 and
    the emit scan's dbuf / reverse, the options that change it) and on graph replays with new inputs: every launch
    equals the reference, and the counters are reset."""
    verifier = _stream()(rows, K, VOCAB, "cuda", **OPTION_VARIANTS[variant])
    first = _case(rows, 31)
    temperature = first[6]
    raw = first[0] * torch.where(temperature == 0, 1.0, temperature)[first[4].clamp_min(0), None, None]
    # (the options that change the block method too)
    both = variant in ("div_unroll", "fast_divide_2", "emit_dbuf", "emit_reverse", "emit_dbuf_reverse", "emit_eager",
                       "emit_eager_0", "emit_gather", "emit_winner_0")
    for method in ("standard", "block") if both else ("standard",):
        ref = dm.verify_drafts(first[0], *first[1:], method=method)
        ref_raw = dm.verify_drafts(raw, *first[1:], method=method, target_temperature=temperature)
        for _ in range(3):
            _poison(verifier, variant)
            out = verifier.run(first[0], *first[1:], method=method)
            assert torch.equal(out[0], ref.tokens) and torch.equal(out[1], ref.num_emitted)
            _poison(verifier, variant)
            out = verifier.run(raw, *first[1:], method=method, target_temperature=temperature)
            assert torch.equal(out[0], ref_raw.tokens) and torch.equal(out[1], ref_raw.num_emitted)
    static = [x.clone() for x in first]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        verifier.run(*static, method="standard")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, count = verifier.run(*static, method="standard")
    for seed in (32, 33, 34):
        fresh = _case(rows, seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        ref = dm.verify_drafts(*fresh, method="standard")
        for _ in range(2):
            _poison(verifier, variant)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(tokens, ref.tokens) and torch.equal(count, ref.num_emitted)
    verifier.check()
    assert int(verifier.counters.abs().sum()) == 0


@pytest.mark.parametrize("closeness", [0.5, 0.02], ids=["mixed", "mostly_accepted"])
@pytest.mark.parametrize("rows", [16, 253])
def test_phased_launches_equal_one_launch_and_skip_later_rows(rows, closeness):
    """``phases`` at full shapes: the tokens of one launch (and the reference), with drafts mostly rejected early or
    mostly accepted (every launch has work); no stream item of a launch after the one holding a request's emitted row
    wrote its partials (a sentinel stays); the counters are reset."""
    StreamVerifier = _stream()
    args = _case(rows, 41, closeness=closeness)
    if closeness > 0.1:  # request 0 (live, sampled, n = K) rejects draft 0 for sure: p(draft) = 0
        args[0][0, 0, args[1][0, 0]] = float("-inf")
    one = StreamVerifier(rows, K, VOCAB, "cuda", phases=())
    expected = [x.clone() for x in one.run(*args)]
    ref = dm.verify_drafts(*args)
    assert torch.equal(expected[0], ref.tokens) and torch.equal(expected[1], ref.num_emitted)
    live = args[4] >= 0
    for bounds in ((1,), (1, 2), (3,)):
        verifier = StreamVerifier(rows, K, VOCAB, "cuda", phases=bounds)
        verifier.pa.fill_(1234.5)
        tokens, count = verifier.run(*args)
        torch.cuda.synchronize()
        verifier.check()
        assert torch.equal(tokens, expected[0]) and torch.equal(count, expected[1]), bounds
        assert int(verifier.counters.abs().sum()) == 0
        cut = torch.tensor(bounds, device="cuda")
        phase_of_emitted = ((count - 1).clamp_min(0)[:, None] >= cut[None, :]).sum(1)  # [B]
        phase_of_row = (torch.arange(K + 1, device="cuda")[:, None] >= cut[None, :]).sum(1)  # [K+1]
        later = phase_of_row[None, :] > phase_of_emitted[:, None]  # [B, K+1]
        written = (verifier.pa[:rows, :K + 1] != 1234.5).any(-1)
        in_request = live[:, None] & (torch.arange(K + 1, device="cuda")[None, :] <= args[3][:, None])
        assert torch.equal(written, in_request & ~later), bounds
    n, emitted = args[3][live], expected[1][live]
    all_accepted = float((emitted == n + 1).double().mean())
    early = int(((n >= 1) & (emitted == 1)).sum())
    assert all_accepted >= 0.75 if closeness < 0.1 else (early >= 1 and int((emitted >= 2).sum()) >= 1)
