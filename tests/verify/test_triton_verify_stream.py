"""The one-launch stream verifier (``verify_drafts(impl="triton")``) on the CPU interpreter.

Equality with the reference on random inputs (the kernel forms ``p`` and ``q`` with its own exp and
summation order, so it may differ only at last-bit near-ties, which these inputs do not have),
bit equality of the raw-logit mode with pre-divided logits, the layouts (chunks, lags, exact or
filtered noise), padding, NaN rows (the all-zero residual fallback), ``K = 0 / 1``, counter reset
between calls, and a chi-square of the emitted tokens (``slow``: a few minutes in the interpreter).
"""

import itertools

import pytest
import torch
import triton
import triton.language as tl

import dspark_markov as dm
from dspark_markov.demo.generate import chi_square, chi_square_threshold
from dspark_markov.verify.reference import scale_target
from dspark_markov.verify import triton_verify_stream
from dspark_markov.verify.triton_verify_stream import StreamVerifier, _divide, _divide_poisoned, _divisor, cached_verifier
from tests.emit_traps import plant_traps
from tests.helpers import VERIFY_VOCAB as VOCAB
from tests.helpers import verify_case as _case


def _run(verifier, args, method, greedy=None, **kwargs):
    tokens, count = verifier.run(*args, greedy, method=method, **kwargs)
    assert int(verifier.counters.abs().sum()) == 0  # reset by the kernel
    verifier.check()
    return tokens.clone(), count.clone()


def _assert_reference(args, method, out, greedy=None):
    ref = dm.verify_drafts(*args, target_greedy=greedy, method=method, impl="reference")
    assert torch.equal(out[0], ref.tokens), (out[0], ref.tokens)
    assert torch.equal(out[1], ref.num_emitted), (out[1], ref.num_emitted)
    return ref


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("method", ["standard", "block"])
def test_equals_reference(method, cache_dtype):
    counts = []
    for seed in range(2):
        args = _case(seed, cache_dtype=cache_dtype)
        out = dm.verify_drafts(*args, method=method, impl="triton")
        _assert_reference(args, method, out)
        counts.append(out.num_emitted[args[4] >= 0])
    counts = torch.cat(counts)
    assert int((counts >= 2).sum()) >= 2 and int((counts == 1).sum()) >= 2  # accepts and rejections


@pytest.mark.parametrize("method", ["standard", "block"])
def test_raw_logits_bit_identical_to_pre_divided(method, monkeypatch):
    """``target_temperature``: the kernel divides raw logits with div_rn, exactly as scale_target; also the
    large-batch raw launch (RAW_WIDE: the poisoned fast division, 4 tiles at once where values are divided)."""
    args = _case(3, closeness=0.4)
    temperature, idx = args[6], args[4]
    temperature[idx[idx >= 0][-1]] = 1.0  # a T = 1 slot (the kernel skips its division: x / 1 = x)
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[idx.clamp_min(0), None, None]
    raw[0, 0, :5] = torch.tensor([1e-35, -0.0, float("-inf"), 3e38, 1e-42])  # the fast division's fallback
    divided = scale_target(raw, temperature, idx)
    verifier = StreamVerifier(7, 3, VOCAB, "cpu")
    a = _run(verifier, [divided] + args[1:], method)
    b = _run(verifier, [raw] + args[1:], method, target_temperature=temperature)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    monkeypatch.setattr(triton_verify_stream, "RAW_WIDE_FROM", 1)  # what a launch of >= 64 requests takes
    fast = StreamVerifier(7, 3, VOCAB, "cpu", fused=1)  # no divide per element, poisoned fallback
    c = _run(fast, [raw] + args[1:], method, target_temperature=temperature)
    monkeypatch.undo()
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    # div_unroll: the divided slots one tile at a time, the T = 0 / 1 slots the standard loop (4 tiles)
    split = StreamVerifier(7, 3, VOCAB, "cpu", div_unroll=1)
    trace = torch.zeros(split.programs(7, method), 4, dtype=torch.int64)
    d = _run(split, [raw] + args[1:], method, target_temperature=temperature, trace=trace)
    assert torch.equal(a[0], d[0]) and torch.equal(a[1], d[1])
    lay = split.layout(7)
    stage, valid = trace[:, 3] & 3, (trace[:, 3] >> 2) & 1
    assert int(((stage == 0) & (valid == 1)).sum()) == 7 * 4 * lay.c1  # every stream item ran and wrote its line
    assert int(((stage == 2) & (valid == 1)).sum()) == 7 * lay.c2
    _assert_reference([divided] + args[1:], method, a)
    out = dm.verify_drafts(raw, *args[1:], method=method, impl="triton", target_temperature=temperature)
    ref = dm.verify_drafts(raw, *args[1:], method=method, target_temperature=temperature)
    assert torch.equal(out.tokens, a[0]) and torch.equal(ref.tokens, a[0]) and torch.equal(ref.num_emitted, a[1])


def test_layouts_and_explicit_greedy_flags():
    """Chunks of one tile or of the whole row, lags 0..3, the fused and the separate row loops: the
    same tokens; greedy targets with probabilistic drafts; a Verifier reused with a smaller batch."""
    args = _case(5, batch=8)
    flags = torch.zeros(8, dtype=torch.bool)
    flags[2] = flags[5] = True
    outs = []
    # (fused: the target and cache rows in one loop; stages: pipelining, which the interpreter ignores)
    for options in (dict(t1=1, t2=1, lag=0, fused=1, stages=3), dict(t1=6, t2=6, lag=3, noise_filter=0, fused=0),
                    # dbuf: 64-value tiles so the double-buffered loops turn (5 groups of 2 tiles)
                    dict(t1=11, t2=2, lag=1, unroll=2, block=64, dbuf=1, greedy_direct=0, emit_dbuf=1),
                    dict(t1=2, t2=2, lag=2, compact=0),  # the padded program order (standard)
                    dict(t2=3, lag=1, claim=3), dict(t1=1, lag=2, claim=8, compact=1),  # chunks claimed from a counter
                    dict(t2=1, emit_eager=0),  # emit items without their epilogue loads at once (the default)
                    dict(t2=2, emit_gather=1),  # emit items with every row's statistics loaded with the count
                    # the exact keys of every lane's best (emit_winner, the default, off)
                    dict(t2=3, emit_winner=0, emit_dbuf=1, emit_reverse=1)):
        verifier = StreamVerifier(8, 3, VOCAB, "cpu", **options)
        for method in ("standard", "block"):
            outs.append(_run(verifier, args, method, flags))
            _assert_reference(args, method, outs[-1], flags)
    small = [x[:5] if i in (0, 1, 3, 4, 5) else x for i, x in enumerate(_case(6, batch=8))]
    tokens, count = _run(verifier, small, "standard")
    assert tokens.shape == (5, 4)
    _assert_reference(small, "standard", (tokens, count))


def test_spanned_items_equal_reference():
    """``span``: a request's rows end to end, cut into items of ``t1`` tiles that end one row and start the next
    (700 values: 6 tiles of 128 per row, the last one ragged; K = 3: 24 tiles per request). Items of 5 and 7 tiles
    cross rows at every boundary but one, 6 end at row ends, 13 cover three rows, 4 is the fewest a row's partials
    hold (t1 = 2 is raised to it); with 1,024-value tiles a row is one tile and an item covers all four rows; greedy
    flags, a padding request, rows past a request's drafts, the raw mode and the double-buffered loops (64-value
    tiles, 11 per row) too; tokens as the reference, and every row's statistics as whole-row chunks give them."""
    args = _case(11, batch=8)
    flags = torch.zeros(8, dtype=torch.bool)
    flags[3] = True
    temperature, idx = args[6], args[4]
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[idx.clamp_min(0), None, None]
    divided = scale_target(raw, temperature, idx)
    plain = StreamVerifier(8, 3, VOCAB, "cpu")
    _run(plain, [divided] + args[1:], "standard", flags)
    for options in (dict(t1=5), dict(t1=7, lag=2), dict(t1=6, t2=1), dict(t1=2),
                    dict(t1=9, block=64, unroll=2, dbuf=1, emit_dbuf=1),
                    # items over three rows (13 tiles of 6-tile rows), and one-tile rows (so 4 rows per item)
                    dict(t1=13), dict(t1=2, block=1024)):
        verifier = StreamVerifier(8, 3, VOCAB, "cpu", span=1, **options)
        verifier.pa.fill_(3e38)  # a partial that no item of this call wrote must not be read
        verifier.pb.fill_(float("nan"))
        verifier.pi.fill_(-7)
        lay = verifier.layout(8)
        tiles = triton.cdiv(VOCAB, verifier.block)
        assert lay.span and lay.s1 == lay.c1 == triton.cdiv(4 * tiles, lay.t1) <= tiles
        assert lay.t1 == max(options["t1"], triton.cdiv(4 * tiles, tiles))
        out = _run(verifier, [divided] + args[1:], "standard", flags)
        _assert_reference([divided] + args[1:], "standard", out, flags)
        # every row's statistics from all of its pieces and no other row's (the fields a request uses: a greedy
        # target's argmax only, a T = 0 draft's cache argmax): maxima and argmaxes exact, sums to rounding
        for b in range(8):
            n, slot = int(args[3][b]), int(idx[b])
            if slot < 0:
                continue
            fields = [(0, True), (5, True)] if flags[b] else [(0, True), (5, True), (1, False), (2, True), (6, True)]
            if not flags[b] and float(temperature[slot]) != 0.0:
                fields.append((3, False))
            for field, exact in fields:
                used = n + 1 if field in (0, 1, 5) else n  # target rows 0..n, cache rows 0..n-1
                got, want = verifier.rows[b, field, :used], plain.rows[b, field, :used]
                if exact:
                    assert torch.equal(got, want), (options, b, field)
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
        raw_out = _run(verifier, [raw] + args[1:], "standard", flags, target_temperature=temperature)
        assert torch.equal(out[0], raw_out[0])
        block = _run(verifier, [divided] + args[1:], "block", flags)  # (the block method keeps whole-row chunks)
        _assert_reference([divided] + args[1:], "block", block, flags)
    assert not StreamVerifier(8, 3, VOCAB, "cpu", span=1, claim=2).layout(8).span


def test_span_layout_fills_one_wave_at_gpu_shapes():
    """The default span layout at V = 129,280 (64 tiles of 2,048 per row, 6 rows) on 132 SMs of two programs: one
    wave of items up to 44 requests, the fewest waves giving each request >= 6 items above, never more than 64 items
    per request (the partials' room)."""
    for batch, t1, s1 in ((16, 24, 16), (4, 6, 64), (32, 48, 8), (64, 48, 8), (253, 64, 6), (1, 6, 64)):
        lay = triton_verify_stream.Layout(batch, 5, 129280, 2048, True, 132, resident_per_sm=2, span=True)
        assert (lay.t1, lay.s1, lay.c1) == (t1, s1, s1), (batch, lay.t1, lay.s1)
        assert lay.lag == max(1, 264 // s1)
    assert not triton_verify_stream.Layout(16, 5, 129280, 2048, True, 132, span=True, rows=1).span  # a phased launch


def test_emit_items_read_the_emitted_rows_statistics():
    """The emit items' ways to fetch the emitted row's statistics (per field after the accepted count, or every row's
    with it: ``emit_gather``) and their epilogue loads (``emit_eager``) give the reference's tokens when requests
    reject at later rows whose statistics differ from row 0's (target rows 1.. shifted by +6: the same
    probabilities, another max and normaliser, so row 0's statistics in their place scale p by e^6 and change the
    residual)."""
    args = _case(13, batch=8, closeness=0.9)
    args[0][:, 1:] += 6.0
    later = 0
    for options in (dict(emit_gather=1), dict(emit_gather=1, emit_eager=0), dict(emit_gather=0)):
        for method in ("standard", "block"):
            out = _run(StreamVerifier(8, 3, VOCAB, "cpu", **options), args, method)
            _assert_reference(args, method, out)
            live = args[4] >= 0
            later += int((live & (out[1] >= 2) & (out[1] <= args[3])).sum())  # rejected at a row j >= 1
    assert later >= 6


def test_emit_winner_near_ties_equal_reference():
    """``emit_winner``: only the cheap keys' winner gets its exact key, and a candidate within the noise bound's
    slack sends the chunk to the exact rescan. Bonus draws (no drafts) whose two best keys are traps
    (:mod:`tests.emit_traps`: the exact keys tie, the first token winning, or differ by one ulp, and the cheap keys,
    their noise off by up to ~2.6e-6 in the interpreter, order the two the other way), in one lane (tokens 128 apart:
    a lane's best and runner-up when an item scans both 128-value tiles) or in two: every layout and scan order gives
    the reference's tokens. (Without the slack test, the winner's exact key taken as the answer, the first two
    layouts draw the cheap keys' winner.)"""
    vocab = 300
    args = _case(17, batch=7, vocab=vocab)
    expect = plant_traps(args, [(2, True, False), (3, True, True), (4, False, False), (5, False, True),
                                (6, False, False)], window=vocab, lane=128)
    for options in (dict(emit_winner=1, t2=3), dict(emit_winner=1, t2=3, emit_dbuf=1, emit_reverse=1),
                    dict(emit_winner=1, t2=1), dict(emit_winner=0, t2=3)):
        out = _run(StreamVerifier(7, 3, vocab, "cpu", **options), args, "standard")
        _assert_reference(args, "standard", out)
        for b, win in expect.items():
            assert int(out[0][b, 0]) == win and int(out[1][b]) == 1


def test_tail_emit_items_equal_reference():
    """``tail`` / ``tail_t2``: the last requests' emit items scan fewer tiles each (700 values: 6 emit tiles of 128;
    t2 = 3 gives 2 items per request, tail_t2 = 1 or 2 gives 6 or 3, the extra ones after every other program): the
    reference's tokens (standard method, pre-divided and raw, greedy flags), every emit item ran (the trace), and the
    option is off where it does not apply (block method, compact order)."""
    args = _case(19, batch=8, closeness=0.9)
    flags = torch.zeros(8, dtype=torch.bool)
    flags[6] = True
    temperature = args[6]
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[args[4].clamp_min(0), None, None]
    for tail, tail_t2, chunks in ((3, 1, 6), (8, 2, 3), (1, 1, 6)):
        verifier = StreamVerifier(8, 3, VOCAB, "cpu", t2=3, tail=tail, tail_t2=tail_t2)
        lay = verifier.layout(8)
        assert (lay.tail, lay.c2, lay.c2t) == (tail, 2, chunks)
        trace = torch.zeros(verifier.programs(8), 4, dtype=torch.int64)
        out = _run(verifier, args, "standard", flags, trace=trace)
        _assert_reference(args, "standard", out, flags)
        stage, valid = trace[:, 3] & 3, (trace[:, 3] >> 2) & 1
        assert int(((stage == 2) & (valid == 1)).sum()) == (8 - tail) * 2 + tail * chunks
        again = _run(verifier, [raw] + args[1:], "standard", flags, target_temperature=temperature)
        assert torch.equal(again[0], out[0]) and torch.equal(again[1], out[1])
    assert StreamVerifier(8, 3, VOCAB, "cpu", t2=3, tail=3, tail_t2=1).layout(8, "block").tail == 0
    assert StreamVerifier(8, 3, VOCAB, "cpu", t2=3, tail=3, tail_t2=1, compact=1).layout(8).tail == 0


def test_emit_winner_default():
    """``emit_winner`` is on by default except for the pre-divided standard launches of 17-128 requests (their
    single-buffered loops at 80 registers), and as given when given."""
    verifier = StreamVerifier(253, 3, VOCAB, "cpu")
    assert [verifier.winner("standard", b, False) for b in (1, 16, 17, 64, 128, 129, 253)] == [
        True, True, False, False, False, True, True]
    assert all(verifier.winner(m, b, raw) for m, raw in (("standard", True), ("block", False), ("block", True))
               for b in (1, 16, 64, 253))
    for given in (0, 1):
        verifier = StreamVerifier(253, 3, VOCAB, "cpu", emit_winner=given)
        assert all(verifier.winner(m, b, raw) == bool(given) for m in ("standard", "block") for raw in (False, True)
                   for b in (1, 64, 253))


def test_double_buffered_loops_give_the_same_partials():
    """``dbuf`` / ``emit_dbuf`` / ``emit_reverse``: every stream item's partial statistics (pairs, bonus rows,
    greedy argmaxes; pre-divided and raw logits; groups of 2 and 4 tiles) and every emit item's (key, token,
    positive residual) bit-identical to the single-buffered forward loops', at 32-value tiles in two chunks per
    row (the second starting at 352) so each double-buffered loop turns; greedy rows' maxima planted in different
    tiles of the groups, and equal maxima (and NaN emit keys, and equal emit keys) in one lane of two tiles: the
    first must win."""
    args = _case(21, batch=8)
    flags = torch.zeros(8, dtype=torch.bool)
    flags[[3, 5, 6]] = True  # (explicit flags: request 6's rows keep their random maxima)
    args[3][[3, 5]] = 3  # every row of requests 3 and 5 streamed
    for (b, j), tokens in {(3, 0): [70], (3, 1): [100], (3, 2): [390], (3, 3): [500], (5, 0): [200], (5, 1): [620],
                           (5, 2): [390, 422], (5, 3): [421, 453]}.items():
        args[0][b, j, tokens] = 50.0
    args[0][4, :, [100, 132]] = float("nan")  # request 4: NaN keys in one lane of two tiles (the first wins)
    args[0][4, :, [400, 432]] = 1e30  # and in its second chunk equal keys in one lane (x + g rounds to x: the first)
    raw = args[0] * torch.where(args[6] == 0, 1.0, args[6])[args[4].clamp_min(0), None, None]
    cases = itertools.product(((args[0], {}), (raw, dict(target_temperature=args[6]))), ((2, 0), (4, 1)))
    for (target, extra), (unroll, noise_filter) in cases:  # (the exact keys in the loop: a wrong key shows)
        partials = []
        # (single-buffered, then double-buffered, then the emit scans reversed: with and without emit_dbuf)
        for dbuf, reverse in ((0, 0), (1, 0), (1, 1), (0, 1)):
            verifier = StreamVerifier(8, 3, VOCAB, "cpu", t1=11, t2=11, unroll=unroll, block=32, dbuf=dbuf,
                                      greedy_direct=0, emit_dbuf=dbuf, emit_reverse=reverse, noise_filter=noise_filter)
            out = _run(verifier, [target] + args[1:], "standard", flags, **extra)
            partials.append((out, *(x.clone() for x in (verifier.pa, verifier.pb, verifier.pi, verifier.ea,
                                                         verifier.ei, verifier.eany))))
        (out0, *p0) = partials[0]
        assert out0[0][4, 0] == 100 and p0[4][4, 1] == 400  # (no drafts: its bonus keys; the first NaN, first tie)
        for out1, *p1 in partials[1:]:
            assert torch.equal(out0[0], out1[0]) and torch.equal(out0[1], out1[1])
            for a, b in zip(p0, p1):
                assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                                   b.view(torch.int32) if b.is_floating_point() else b)
        assert bool(p0[4].ne(0).any())  # emitted tokens written
        if not extra:  # the planted maxima found (pi: [B, 2K + 1, chunks] tokens of rows 0..K, then the cache's)
            found = p0[2]
            assert found[3, :2, 0].tolist() == [70, 100] and found[3, 2:4, 1].tolist() == [390, 500]
            assert found[5, 0, 0] == 200 and found[5, 1:4, 1].tolist() == [620, 390, 421]


@pytest.mark.parametrize("k", [0, 1])
def test_no_or_one_draft_and_padding_only(k):
    args = _case(13, batch=4, k=k, vocab=300)
    verifier = StreamVerifier(4, k, 300, "cpu")
    for method in ("standard", "block"):
        _assert_reference(args, method, _run(verifier, args, method))
    claimed = StreamVerifier(4, k, 300, "cpu", claim=2, greedy_direct=0)  # claimed chunks, n <= 1 rows
    _assert_reference(args, "standard", _run(claimed, args, "standard"))
    args[4] = torch.full((4,), -1)
    tokens, count = _run(verifier, args, "block")
    assert bool((tokens == -1).all()) and bool((count == 0).all())


def test_masked_and_nan_logits_stay_in_range():
    args = _case(9, vocab=300)
    args[0][:, :, 150:] = float("-inf")
    out = dm.verify_drafts(*args, impl="triton")
    _assert_reference(args, "standard", out)
    live = args[4] >= 0
    last = out.tokens.gather(1, (out.num_emitted - 1).clamp_min(0)[:, None])[:, 0]
    assert bool((last[live] < 150).all())
    args[0][0, :, 7] = float("nan")
    args[0][2] = float("nan")  # every p NaN: rejected, residual all zero -> the bonus keys, a NaN wins
    # request 3 (sampled, one draft): p of row 0 NaN, so draft 0 is rejected and the residual is all zero; the bonus
    # keys of row 0 then win at the NaN (token 20), where the residual keys (all -inf) would give token 0
    args[0][3, 0, 20] = float("nan")
    # request 4 (sampled, two drafts, its own cache slot 2, T ~ 1.5): draft 0 at token 5, where row 0 is -inf with the
    # rest of the first 128 tokens (the first emit chunk with t2 = 1 on the CPU): rejected. Its residual is zero in
    # chunks 0 and 2 and positive in chunk 1 at token 140 only (p flat over 128-149 but lower at 140, q slightly above
    # p on the others and 0 at 140), so the draw is 140; the bonus keys' fallback, wrongly taken, would almost never
    # draw 140
    args[1][4, 0] = 5
    args[0][4, 0, :128] = float("-inf")
    args[0][4, 0, 128:150] = 0.0
    args[0][4, 0, 140] = -3.0
    args[2][2, 0] = float("-inf")
    args[2][2, 0, 128:150] = 1.0
    args[2][2, 0, 140] = float("-inf")
    args[2][2, 0, 5] = -10.0
    for method in ("standard", "block"):
        out = dm.verify_drafts(*args, impl="triton", method=method)
        assert bool(((out.tokens >= -1) & (out.tokens < 300)).all())
        _assert_reference(args, method, out)
        assert int(out.tokens[3, 0]) == 20 and int(out.num_emitted[3]) == 1
        assert int(out.tokens[4, 0]) == 140 and int(out.num_emitted[4]) == 1
        # emit_eager (the default: the last emit item's epilogue loads, the all-zero-residual flags among them, issued
        # at once) and without it
        for eager in (0, 1):
            again = _run(StreamVerifier(7, 3, 300, "cpu", emit_eager=eager, emit_gather=eager, t2=1), args, method)
            assert torch.equal(again[0], out.tokens) and torch.equal(again[1], out.num_emitted)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_draft_temperatures_at_the_ends_of_the_float_range(cache_dtype):
    """``q = softmax(cache / T)`` where ``cache / T`` overflows, and with a subnormal ``T``.

    Request 0: a cache value C with C / T = inf (T = 0.5, C = 3e38; bf16 rounds it to 2.99e38, still beyond), where
    p puts ~all its mass on that token, the draft: the reference's q is NaN, the draft rejected and its row's residual
    replaced by p, so the token comes back. (The kernel's residuals form q in the cache values' space, finite there:
    one-hot at the draft, so max(p - q, 0) never emitted it, losing p's mass.) Request 1: T = 1e-45 and a cache row
    whose maximum is 0: cache / T is 0 there and -inf elsewhere, q one-hot, the draft there accepted (log2(e) / T
    overflowing made q NaN in the kernel, rejecting it). Request 2: the same overflow with the block method's second
    row (K = 2, the residual masses' q)."""
    vocab, k = 300, 2
    gen = torch.Generator().manual_seed(5)
    cache = torch.rand(3, k, vocab, generator=gen) - 0.5
    cache[0, 0, 17] = 3e38
    cache[1, 0] = -torch.rand(vocab, generator=gen) - 0.5
    cache[1, 0, 5] = 0.0
    cache[2, 0, 7] = 30.0
    cache[2, 1, 40] = 3e38
    cache = cache.to(cache_dtype)
    target = torch.randn(3, k + 1, vocab, generator=gen)
    target[0, 0, 17] = 40.0
    target[1, 0, 5] = 40.0
    target[1, 1, 9] = 40.0
    target[2, 0, 7] = 60.0
    target[2, 1, 40] = 30.0
    drafts = torch.tensor([[17, 3], [5, 9], [7, 40]])
    num_drafts = torch.tensor([1, 1, 2])
    idx = torch.tensor([0, 1, 2])
    temperature = torch.tensor([0.5, 1e-45, 0.5])
    for seed in range(4):
        seeds = torch.tensor([seed * 7919 - 10, seed + 3, seed])
        positions = torch.tensor([50, 9, 4]) + seed
        args = [target, drafts, cache, num_drafts, idx, positions, temperature, seeds]
        for method in ("standard", "block"):
            out = dm.verify_drafts(*args, method=method, impl="triton")
            _assert_reference(args, method, out)
            assert int(out.tokens[0, 0]) == 17 and int(out.num_emitted[0]) == 1  # rejected, drawn from p
            assert out.tokens[1].tolist() == [5, 9, -1]  # accepted (q one-hot at 5), then the bonus from p
        out = dm.verify_drafts(*args, method="standard", impl="triton")
        assert out.tokens[2].tolist() == [7, 40, -1]  # draft 1 rejected (q NaN), its row drawn from p


def test_cached_verifier_is_reused():
    first = cached_verifier(3, 3, VOCAB, "cpu")
    assert cached_verifier(16, 3, VOCAB, "cpu") is first and first.max_batch >= 16
    assert cached_verifier(17, 3, VOCAB, "cpu") is not first


def test_validation():
    args = _case(1, vocab=300)
    with pytest.raises(ValueError, match="target_logits"):
        StreamVerifier(7, 2, 300, "cpu").run(*args, None)
    with pytest.raises(ValueError, match="max_batch"):
        StreamVerifier(0, 2, 300, "cpu")
    with pytest.raises(ValueError, match="trace"):
        StreamVerifier(7, 3, 300, "cpu").run(*args, trace=torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="target_temperature"):
        dm.verify_drafts(*args, impl="triton", target_temperature=-args[6])
    with pytest.raises(ValueError, match="target_temperature"):
        dm.verify_drafts(*args, impl="triton", target_temperature=args[6][:3])


@pytest.mark.parametrize("name, sizes", [
    ("max_batch", (2.7, 3, 300)),  # was truncated to 2
    ("max_batch", (True, 3, 300)),  # was taken as 1
    ("max_batch", (None, 3, 300)),  # was a TypeError
    ("num_drafts", (4, "3", 300)),  # was parsed
    ("num_drafts", (4, -1, 300)),
    ("vocab_size", (4, 3, 300.9)),  # was truncated to 300
    ("vocab_size", (4, 3, 0)),
])
def test_sizes_are_ints_never_truncated_or_parsed(name, sizes):
    """README "Inputs": sizes are ints; 2.7, "3", True and None are refused by name, never truncated or parsed."""
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        StreamVerifier(*sizes, "cpu")
    assert StreamVerifier(torch.tensor(4), 3, 300, "cpu").max_batch == 4  # (an integer scalar is an int)


@pytest.mark.parametrize("name, option", [
    ("lag", dict(lag=-1)),  # was accepted: a grid short of the items a request's emit items wait on (a hang)
    ("lag", dict(lag=1.5)),
    ("unroll", dict(unroll=3)),  # was accepted, then an error inside Triton at the first run (tl.arange)
    ("t1", dict(t1=2.5)),  # was truncated
    ("t2", dict(t2=-2)),
    ("tail", dict(tail="1")),
])
def test_layout_overrides_are_checked_by_name(name, option):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        StreamVerifier(8, 3, 300, "cpu", **option)


def test_layout_overrides_take_integer_scalars():
    """An override is kept as the int check_int returned: a one-element integer tensor (or numpy int) is a size."""
    verifier = StreamVerifier(8, 3, 300, "cpu", unroll=torch.tensor(2), lag=torch.tensor(0), t1=torch.tensor(3))
    assert verifier.overrides["unroll"] == 2 and type(verifier.overrides["unroll"]) is int
    assert verifier.overrides["lag"] == 0 and verifier.overrides["t1"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("method", ["standard", "block"])
def test_first_two_positions_follow_the_target(method):
    """Chi-square of the first two emitted positions (completed by sampling the target where nothing
    was emitted) over 200 one-round trials at V = 6, K = 2, with a negative control (wrong draft T,
    120 trials: its statistic is ~4x the threshold at 200 trials, ~2x at 120).

    The target rows are fixed, so a lossless verifier makes position ``j`` distributed as ``p_j``.
    Small because each trial is several interpreted programs; the exact noise (``noise_filter=0``,
    the same tokens as the filtered noise) interprets fewer operations.
    """
    vocab, k, batch = 6, 2, 200
    g = torch.Generator().manual_seed(4)
    target_row = torch.randn(k + 1, vocab, generator=g)
    cache_row = 0.8 * target_row[:k] + 0.7 * torch.randn(k, vocab, generator=g)
    target = target_row.expand(batch, k + 1, vocab).contiguous()
    cache = cache_row.expand(batch, k, vocab).contiguous()
    temp = torch.full((batch,), 0.9)
    slots = torch.arange(batch)
    seeds = slots * 1_000_003 + 99
    positions = torch.full((batch,), 500)
    drafts = torch.stack([dm.draft.reference.draw_gumbel(cache[:, i], temp, seeds, i, positions + i)
                          for i in range(k)], dim=1)
    p = torch.softmax(target_row.double(), dim=-1)
    verifier = StreamVerifier(batch, k, vocab, "cpu", block=16, noise_filter=0)

    def statistic(verify_temp, trials):
        tokens, count = _run(verifier, (target[:trials], drafts[:trials], cache, torch.full((trials,), k),
                                        slots[:trials], positions[:trials], verify_temp, seeds), method)
        counts = torch.zeros(2, vocab, dtype=torch.float64)
        for j in range(2):
            fresh = torch.multinomial(p[j].float(), trials, replacement=True, generator=g)
            counts[j] = torch.bincount(torch.where(j < count, tokens[:, j], fresh), minlength=vocab).double()
        return chi_square(counts, p[:2] * trials), float((count - 1).double().mean())

    (stat, dof), accepted = statistic(temp, batch)
    assert stat <= chi_square_threshold(dof), f"chi-square {stat:.1f} on {dof} df"
    assert accepted > 0.5
    (bad, dof), _ = statistic(temp * 0.1, 120)  # verifying against the wrong q breaks losslessness
    assert bad > chi_square_threshold(dof), f"negative control: chi-square {bad:.1f} on {dof} df"


@triton.jit
def _divide_kernel(x_ptr, out_ptr, risky_ptr, poisoned_ptr, temp_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    t, r, s, tiny = _divisor(tl.load(temp_ptr))
    y, risky = _divide(x, t, r, s, tiny)
    tl.store(out_ptr + offs, y, mask=offs < n)
    tl.store(risky_ptr + offs, risky.to(tl.int8), mask=offs < n)
    tl.store(poisoned_ptr + offs, _divide_poisoned(x, t, r, s, tiny), mask=offs < n)


def test_fast_division_is_correctly_rounded():
    """``_divide`` (two Markstein corrections, no divide per element) equals ``x / T`` bit for bit
    wherever it does not flag the value for the exact fallback, and flags only nonzero values of
    magnitude below ``max(2^-100, 2^-125 T)``: every significand of a binade (T = 0.6; every 97th for
    the other T), specials, extremes."""
    g = torch.Generator().manual_seed(11)
    significands = torch.arange(1 << 23, dtype=torch.int32) | (127 << 23)  # every x in [1, 2)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38,
                             -3.4028234663852886e38, 1e-45, -1e-45, 1.1754943508222875e-38, 7.9e-31, 7.8e-31,
                             1e-20, 1e30, 12.5, -0.75])
    mixed = torch.randn(1 << 16, generator=g) * torch.exp2(torch.randint(-140, 127, (1 << 16,), generator=g).float())
    for i, temp in enumerate([0.6, 1.7, 0.0123, 3.0, 1.0000001, 1.9999999, 1e-30, 1e30]):
        x = torch.cat([significands.view(torch.float32) if i == 0 else significands[::97].view(torch.float32),
                       specials, mixed, -mixed])
        out = torch.empty_like(x)
        risky = torch.empty(x.shape, dtype=torch.int8)
        poisoned = torch.empty_like(x)
        _divide_kernel[((x.numel() + 4095) // 4096,)](x, out, risky, poisoned, torch.tensor([temp]), x.numel(),
                                                      BLOCK=4096)
        expected = x / torch.tensor(temp, dtype=torch.float32)
        flagged = risky.bool()
        lo = max(2.0 ** -100, 2.0 ** -125 * temp) if 2.0 ** -126 <= temp <= 2.0 ** 126 else float("inf")
        assert torch.equal(flagged, (x != 0) & (x.abs() < lo)), temp
        same = (out.view(torch.int32) == expected.view(torch.int32)) | (out.isnan() & expected.isnan())
        assert bool(same[~flagged].all()), (temp, x[~flagged & ~same][:5], out[~flagged & ~same][:5])
        # fast_divide=2: the same quotient, NaN where flagged
        assert bool(poisoned[flagged].isnan().all())
        assert torch.equal(poisoned[~flagged].view(torch.int32), out[~flagged].view(torch.int32))


def test_mode_options_outside_their_values_are_refused():
    for option, value in (("fast_divide", 3), ("fast_divide", True), ("emit_prefetch", 5), ("emit_prefetch", 1.0),
                          ("claim", 5), ("claim", -1)):
        with pytest.raises(ValueError, match=option):
            StreamVerifier(2, 3, VOCAB, "cpu", **{option: value})
    assert StreamVerifier(2, 3, VOCAB, "cpu", fast_divide=2, emit_prefetch=0).fast_divide == 2
    claimed = StreamVerifier(16, 5, 129_280, "meta", claim=4)  # GPU layouts: about as many stream programs
    for batch in (1, 16, 64, 253):
        plain, lay = StreamVerifier(16, 5, 129_280, "meta").layout(batch), claimed.layout(batch)
        # (at 1 request the 2-tile items stay 2-tile chunks: a quarter as many programs, 4 chunks each)
        assert lay.s1 == -(-6 * lay.c1 // 4) and plain.s1 // 4 <= lay.s1 <= plain.s1 + 6, (batch, lay.s1, plain.s1)
        assert lay.t1 >= min(plain.t1, 4)
        assert claimed.layout(batch, "block").claim == 0  # the block method keeps its fixed items


def _phase_of(row, bounds):
    """Index of the launch (of ``StreamVerifier.launches``) that streams ``row``."""
    return sum(row >= cut for cut in bounds)


@pytest.mark.parametrize("seed, closeness, full", [(24, 0.7, True), (22, 0.02, False)],
                         ids=["mixed", "mostly_accepted"])
def test_phased_launches_equal_one_launch_and_skip_later_rows(seed, closeness, full):
    """``phases``: the same tokens as one launch (and the reference) for every split of the rows, greedy targets,
    padding and ``n < K`` included; a launch after the one holding a request's emitted row streams nothing of it
    (its partial statistics keep a sentinel); the counters are reset after every call and the verifier is reused.
    (Mostly accepted drafts: two splits without greedy flags, which keeps the CPU suite's time.)"""
    args = _case(seed, batch=8, closeness=closeness)
    flags = torch.zeros(8, dtype=torch.bool)
    flags[5] = True
    one = StreamVerifier(8, 3, VOCAB, "cpu", phases=())
    for greedy in (None, flags) if full else (None,):
        expected = _run(one, args, "standard", greedy)
        _assert_reference(args, "standard", expected, greedy)
        emitted = expected[1] if greedy is None else emitted
        for bounds in ((1,), (2,), (3,), (1, 2), (1, 2, 3)) if full else ((2,), (1, 2, 3)):
            verifier = StreamVerifier(8, 3, VOCAB, "cpu", phases=bounds, claim=2 if len(bounds) > 1 else 0)
            verifier.pa.fill_(1234.5)  # rows no stream item wrote keep it
            out = _run(verifier, args, "standard", greedy)
            assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1]), bounds
            for b in range(8):
                emitted_row = int(out[1][b]) - 1
                for row in range(4):
                    written = bool((verifier.pa[b, row] != 1234.5).any())
                    live_row = int(args[4][b]) >= 0 and row <= int(args[3][b])
                    later = emitted_row < 0 or _phase_of(row, bounds) > _phase_of(emitted_row, bounds)
                    assert written == (live_row and not later), (bounds, b, row, emitted_row)
            assert torch.equal(_run(verifier, args, "standard", greedy)[0], expected[0])  # reused: counters reset
    live, n = args[4] >= 0, args[3]
    accepted_all = int((live & (n >= 2) & (emitted == n + 1)).sum())  # (without greedy flags)
    assert accepted_all >= 4 if closeness < 0.1 else (accepted_all >= 2 and int((live & (n >= 1) & (emitted == 1)).sum()) >= 2)


def test_phased_raw_logits_and_launch_plan(monkeypatch):
    """Raw logits through phases equal pre-divided logits through one launch; ``launches`` (block: one; boundaries
    beyond K dropped; PHASES from PHASES_FROM requests); ``phases`` values refused with the argument's name."""
    args = _case(22, closeness=0.3)
    temperature, idx = args[6], args[4]
    raw = args[0] * torch.where(temperature == 0, 1.0, temperature)[idx.clamp_min(0), None, None]
    divided = scale_target(raw, temperature, idx)
    a = _run(StreamVerifier(7, 3, VOCAB, "cpu", phases=()), [divided] + args[1:], "standard")
    phased = StreamVerifier(7, 3, VOCAB, "cpu", phases=1)
    b = _run(phased, [raw] + args[1:], "standard", target_temperature=temperature)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert phased.launches(7) == [(0, 1), (1, 0)] and phased.launches(7, "block") == [(0, 0)]
    assert StreamVerifier(7, 3, VOCAB, "cpu", phases=(2, 4, 9)).launches(3) == [(0, 2), (2, 0)]
    assert StreamVerifier(7, 0, VOCAB, "cpu", phases=1).launches(3) == [(0, 0)]  # K = 0: one row
    monkeypatch.setattr(triton_verify_stream, "PHASES_FROM", 5)
    default = StreamVerifier(7, 3, VOCAB, "cpu")
    assert default.launches(4) == [(0, 0)] and default.launches(5) == [(0, 1), (1, 0)]
    assert StreamVerifier(7, 3, VOCAB, "cpu", phases=()).launches(7) == [(0, 0)]
    for value in (0, (2, 1), (1, 1), "1", 1.0, True, (1, None)):
        with pytest.raises(ValueError, match="phases"):
            StreamVerifier(2, 3, VOCAB, "cpu", phases=value)
    with pytest.raises(ValueError, match="trace"):
        phased.run(*args, trace=torch.zeros(phased.programs(7), 4, dtype=torch.int64))
