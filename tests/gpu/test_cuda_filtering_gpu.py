"""``top_k_top_p(impl="cuda")`` on the H200 at V = 129,280: the cluster-resident filter == the sort reference, bit for bit.

First run and passed on the H200 on 2026-12-05 (benchmarks/results/NVIDIA-H200_2026-12-05_checks_r1.txt and
..._cluster_filter_v2_check.txt, with every FilterArgs.flags option). Every input kind of tests/gpu/test_filtering_gpu.py (Gaussian,
peaked, bf16 ties, the edge rows) and every case (k + p, p, k, the per-row mixed cycles with k beyond the
candidate capacity and p at 0 / 1e-9 / 0.99), at 6, 96 and 1518 rows, in and out of place; flat and tied rows
whose target bucket needs the narrowing passes (``stats`` counts them); scalar and per-row int32 k; a row stride
larger than V; CUDA-graph replay with fresh values and no allocation per call.
"""

import pytest
import torch

import dspark_markov as dm
from tests.gpu.test_filtering_gpu import (CASES, KINDS, VOCAB, assert_same, check_graph_replay_and_no_allocation,
                                          logits, parameters, reference)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def opted_in():
    from dspark_markov.verify import cuda_filtering

    why = cuda_filtering.unavailable_reason()
    if why is not None:
        pytest.skip(f"the CUDA filter cannot run here: {why}")
    return cuda_filtering


def aligned_rows(x):
    """A copy of ``x [B, V]`` whose rows start on 16-byte boundaries (stride V rounded up to a multiple of 4)."""
    rows, vocab = x.shape
    out = torch.full((rows, -(-vocab // 4) * 4), 9.0, device=x.device)[:, :vocab]
    return out.copy_(x)


def run(filt, x, k, p, in_place):
    out = x.clone() if in_place else torch.full_like(x, 123.0)
    filt.filter(out if in_place else x, k, p, out)
    assert int(filt.stats[1]) == 0  # no search missed its target
    return out


@pytest.mark.parametrize("flags", [None, 63])  # 63: every option, the L2-row build included (not run on a GPU yet)
@pytest.mark.parametrize("rows", [6, 96, 1518])
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_and_case_equals_reference(opted_in, kind, rows, flags):
    x = logits(kind, rows)
    filt = opted_in.CudaTopKTopPFilter(rows, VOCAB, "cuda", flags=flags)
    for index, case in enumerate(CASES):
        k, p = parameters(case, rows)
        assert_same(run(filt, x, k, p, in_place=index % 2 == 0), reference(x, k, p))
    k, p = parameters("mixed", rows)
    assert_same(dm.top_k_top_p(x.clone(), k, p, impl="cuda"), reference(x, k, p))  # the public function


@pytest.mark.parametrize("flags", [0, 1, 2, 3, 7, 11, 19, 31, 34, 35, 63])
@pytest.mark.parametrize("vocab", [1001, 1003, 50_258, VOCAB])
def test_every_option_and_ragged_slices(opted_in, flags, vocab, monkeypatch):
    """Every FilterArgs.flags option at vocabularies whose last block holds a token count that is not a multiple of 4
    (1,001: 105 tokens; 1,003: 107; 50,258: 6,270: remainders 1, 3 and 2 for the gather's tail mask, the L2 build's
    partial groups, the histogram's and the async load's scalar tails) and at the full V; Gaussian, peaked and bf16
    rows and a narrow row (a large bucket: refinement passes) through every
    case, contiguous and with rows padded to 16 bytes (the L2-row build takes aligned rows only); raw logits with
    per-row temperatures (the async load divides in shared memory; FLAG_L2_ROWS sends them to the default build) and
    rows misaligned for 16-byte copies (the register-load path whatever the flags)."""
    from dspark_markov.draft.reference import scaled_logits

    gen = torch.Generator(device="cuda").manual_seed(21)
    x = torch.randn(8, vocab, generator=gen, device="cuda") * 2
    x[5] = x[5].to(torch.bfloat16).float()
    x[6, :32] += 12.0  # peaked
    x[7] = torch.randn(vocab, generator=gen, device="cuda") * 0.02
    filt = opted_in.CudaTopKTopPFilter(8, vocab, "cuda", flags=flags)
    l2_calls = []
    if filt.l2_kernels is not None:  # FLAG_L2_ROWS: count the calls that reach the L2-row build
        launch = filt.l2_kernels.launch
        monkeypatch.setattr(filt.l2_kernels, "launch", lambda *a: l2_calls.append(a[1]) or launch(*a))
    for index, case in enumerate(CASES):
        k, p = parameters(case, 8)
        assert_same(run(filt, x, k, p, in_place=index % 2 == 0), reference(x, k, p))
        padded = aligned_rows(x)  # 16-byte aligned rows: the L2-row build (FLAG_L2_ROWS) at ragged V too
        out = padded if index % 2 == 0 else torch.full_like(x, 123.0)  # in place, or into contiguous rows
        filt.filter(padded, k, p, out)
        assert_same(out, reference(x, k, p))
    temp = torch.tensor([0.0, 0.6, 1.0, 1.7, 0.25, 0.6, 1.3, 0.9], device="cuda")
    for case in ("k+p", "p"):
        k, p = parameters(case, 8)
        out = torch.full_like(x, 3.0)
        filt.filter(x, k, p, out, temp)
        assert_same(out, reference(scaled_logits(x, temp), k, p))
    shifted = torch.full((8, vocab + 1), 5.0, device="cuda")[:, 1:]  # rows 4 bytes past 16-byte alignment
    shifted.copy_(x)
    filt.filter(shifted, None, 0.9, shifted)
    assert_same(shifted, reference(x, None, torch.full((8,), 0.9, device="cuda")))
    assert int(filt.stats[1]) == 0
    if flags & opted_in.FLAG_L2_ROWS:  # every padded call, and the contiguous ones when V is a multiple of 4
        assert len(l2_calls) == len(CASES) * (2 if vocab % 4 == 0 else 1), l2_calls
    else:
        assert filt.l2_kernels is None


def test_auto_routes_small_batches_and_temperatures_to_the_cluster_filter(opted_in, monkeypatch):
    """top_k_top_p(impl="auto") runs this filter at <= AUTO_MAX_ROWS rows and for raw logits with a temperature,
    the Triton filter otherwise (the call counted where it lands); every result equals the reference."""
    calls = []
    launch = opted_in.launch_top_k_top_p
    monkeypatch.setattr(opted_in, "launch_top_k_top_p", lambda *a, **kw: calls.append(a[0].shape[0]) or launch(*a, **kw))
    small, large = logits("gaussian", opted_in.AUTO_MAX_ROWS), logits("gaussian", opted_in.AUTO_MAX_ROWS + 90)
    for x in (small, large):
        assert_same(dm.top_k_top_p(x.clone(), 50, 0.9), reference(x, 50, 0.9))
    assert calls == [opted_in.AUTO_MAX_ROWS]
    got = dm.top_k_top_p(large * 0.7, None, 0.9, temperature=0.7)  # raw logits: divided in the kernel
    assert calls == [opted_in.AUTO_MAX_ROWS, large.shape[0]]
    assert_same(got, reference((large * 0.7) / 0.7, None, 0.9))


@pytest.mark.parametrize("flags", [None, 63])
def test_flat_and_tied_rows_narrow(opted_in, flags):
    """Rows whose target bucket holds more than 2,048 tokens: all equal, two values, a narrow Gaussian, bf16 ties of
    a narrow Gaussian, a constant with -inf halves; the narrowing passes run (stats) and the kept set is exact."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = [torch.zeros(VOCAB, device="cuda"), torch.randint(0, 2, (VOCAB,), generator=gen, device="cuda").float(),
            torch.randn(VOCAB, generator=gen, device="cuda") * 0.01,
            (torch.randn(VOCAB, generator=gen, device="cuda") * 0.05).to(torch.bfloat16).float(),
            torch.full((VOCAB,), -3.5, device="cuda").index_fill_(0, torch.arange(0, VOCAB, 2, device="cuda"),
                                                                  float("-inf"))]
    x = torch.stack(rows)
    filt = opted_in.CudaTopKTopPFilter(len(rows), VOCAB, "cuda", flags=flags)
    for k, p in ((None, 0.5), (7000, None), (12345, 0.3), (None, 1e-9), (3, 0.999), (None, 0.0), (100_000, 0.9)):
        kk = None if k is None else torch.full((len(rows),), k, device="cuda")
        pp = None if p is None else torch.full((len(rows),), p, device="cuda")
        assert_same(run(filt, x, kk, pp, in_place=True), reference(x, kk, pp))
    assert int(filt.stats[0]) > 0 and int(filt.stats[1]) == 0  # narrowed searches, none failed


def test_scalar_and_int32_arguments_and_a_wide_stride(opted_in):
    x = logits("gaussian", 12, seed=4)
    filt = opted_in.CudaTopKTopPFilter(12, VOCAB, "cuda")
    for k, p in ((50, 0.9), (None, 0.9), (1000, None), (torch.full((12,), 50, dtype=torch.int32, device="cuda"), 0.5)):
        kk = k if not isinstance(k, int) else torch.full((12,), k, device="cuda")
        pp = p if p is None else torch.full((12,), p, device="cuda")
        assert_same(run(filt, x, k, p, in_place=False), reference(x, kk, pp))
    wide = torch.full((12, VOCAB + 3), 7.0, device="cuda")[:, 1:VOCAB + 1]  # stride V + 3, rows not 16-byte aligned
    wide.copy_(x)
    filt.filter(wide, None, 0.9, wide)
    assert_same(wide, reference(x, None, torch.full((12,), 0.9, device="cuda")))


@pytest.mark.parametrize("flags", [None, 63])
@pytest.mark.parametrize("rows", [6, 1518])
def test_cuda_graph_replay_and_no_allocation(opted_in, rows, flags):
    filt = opted_in.CudaTopKTopPFilter(rows, VOCAB, "cuda", flags=flags)
    check_graph_replay_and_no_allocation(filt, rows)
    assert int(filt.stats[1]) == 0


def test_two_vocabulary_sizes_in_one_process(opted_in):
    """Filters of different V share the kernel: a small one built after a large one must not lower the large one's
    shared-memory limit (the launch would fail)."""
    big, small = logits("peaked", 6, seed=8), torch.randn(6, 4096, device="cuda") * 2
    p = torch.full((6,), 0.9, device="cuda")
    first = opted_in.CudaTopKTopPFilter(6, VOCAB, "cuda")
    second = opted_in.CudaTopKTopPFilter(6, 4096, "cuda")
    assert_same(run(first, big, None, p, in_place=True), reference(big, None, p))
    assert_same(run(second, small, None, p, in_place=True), reference(small, None, p))
    assert_same(run(first, big, None, p, in_place=False), reference(big, None, p))


@pytest.mark.parametrize("rows", [6, 1518])
def test_raw_logits_with_temperature(opted_in, rows):
    """Raw logits and a per-row temperature (0, 0.6, 1, 1.7, ... cycling; a scalar too): the kernel divides as it loads
    (IEEE x / T) and equals the filter of the pre-divided rows bit for bit, for every case, in and out of place."""
    from dspark_markov.draft.reference import scaled_logits

    temp = torch.tensor([0.0, 0.6, 1.0, 1.7, 0.25], device="cuda").repeat(rows // 5 + 1)[:rows].contiguous()
    filt = opted_in.CudaTopKTopPFilter(rows, VOCAB, "cuda")
    for index, kind in enumerate(("peaked", "bf16", "edge")):
        x = logits(kind, rows, seed=9)
        for case in CASES:
            k, p = parameters(case, rows)
            expected = reference(scaled_logits(x, temp), k, p)
            out = x.clone() if index % 2 == 0 else torch.full_like(x, 3.0)
            filt.filter(x if index % 2 else out, k, p, out, temp)
            assert_same(out, expected)
        assert_same(dm.top_k_top_p(x.clone(), None, 0.9, impl="cuda", temperature=0.6),
                    reference(scaled_logits(x, torch.full((rows,), 0.6, device="cuda")), None, 0.9))
    assert int(filt.stats[1]) == 0


def test_dspark_step_raw_target_logits_filtered_by_the_cuda_filter(opted_in):
    """DSparkStep.verify(target_temperature=, top_k / top_p, filter_impl="cuda") at V = 129,280: the filter divides the
    raw rows as it reads them; tokens and filtered rows equal the reference filter on scale_target's pre-divided rows."""
    from dspark_markov.step import DSparkStep
    from dspark_markov.verify.reference import scale_target
    from tests.helpers import make_head

    steps, reqs, slots = 5, 4, 6
    gen = torch.Generator(device="cuda").manual_seed(12)
    head = make_head(VOCAB, 256, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=4)
    base = torch.randn(reqs, steps, VOCAB, generator=gen, device="cuda").to(torch.bfloat16)
    common = dict(num_steps=steps, max_reqs=reqs, num_slots=slots, mask_token_id=VOCAB - 1, max_model_len=4096)
    cuda_step = DSparkStep(head, lambda ids, pos: base, filter_impl="cuda", **common)
    ref_step = DSparkStep(head, lambda ids, pos: base, filter_impl="reference", **common)
    last_pos = torch.tensor([10, 500, 77], device="cuda")
    bonus = torch.tensor([5, 6, 7], device="cuda")
    req_slots = torch.tensor([4, 1, 2], device="cuda")
    temperature = torch.tensor([0.7, 1.0, 0.0, 0.9, 0.6, 1.3], device="cuda")
    seeds = torch.arange(slots, device="cuda") * 977
    for step in (cuda_step, ref_step):
        step.draft(last_pos, bonus, req_slots, temperature, seeds)
    assert torch.equal(cuda_step.draft_tokens, ref_step.draft_tokens)
    raw = torch.randn(reqs, steps + 1, VOCAB, generator=gen, device="cuda") * 3
    target_t = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.8, 1.1], device="cuda")
    num_drafts = torch.full((reqs,), steps, device="cuda")
    for top_k, top_p in ((50, 0.9), (None, 0.9), (1000, None)):
        rows = raw.clone()
        out = cuda_step.verify(rows, num_drafts, temperature, seeds, top_k=top_k, top_p=top_p, target_temperature=target_t)
        expected_rows = scale_target(raw, target_t, ref_step.req_slots)
        expected = ref_step.verify(expected_rows, num_drafts, temperature, seeds, top_k=top_k, top_p=top_p)
        assert_same(rows, expected_rows)
        assert torch.equal(out.tokens, expected.tokens) and torch.equal(out.num_emitted, expected.num_emitted)
