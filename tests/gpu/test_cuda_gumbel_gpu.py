"""``impl="cuda_gumbel"`` at DeepSeek-V4.1 shapes on the H200 (sm_90 + NVRTC), against ``gumbel_fused``.

Both make the same cuBLAS bias GEMM, so tokens and cache must be equal bit for bit; every token must
also be ``draw_gumbel`` of the sampler's own cache (``check_draws``), padding rows untouched. Covered:
rows {1, 16, 64, 253}, bf16 / fp32 base and cache, mixed T (0 / 0.6 / 1) with padding rows and
samples, strided base logits with a bias scale, NaN / all -inf / huge rows, a vocabulary that is not a
multiple of 8 (the scalar path), every token exact (``filter_margin`` huge), CUDA-graph replay equal
to eager, and the noise table (rebuilt from all 2^32 hashes, equal to the one kept on disk).
"""

from __future__ import annotations

import pytest
import torch

import dspark_markov as dm
from tests.helpers import check_draws, cuda_inputs, make_head, make_inputs, new_outputs, same_values
from tests.helpers import replays_with_fresh_inputs, special_rows_inputs
from tests.helpers import sample_synced as sample

pytestmark = pytest.mark.gpu

VOCAB = 129_280
RANK = 256
STEPS = 5
IMPLS = ("gumbel_fused", "cuda_gumbel")


def _available():
    from dspark_markov.draft.cuda_gumbel import CudaGumbelBackend

    return CudaGumbelBackend.unavailable_reason()


@pytest.fixture(scope="module")
def head():
    why = _available()
    if why is not None:
        pytest.skip(why)
    torch.backends.cuda.matmul.allow_tf32 = False
    return make_head(VOCAB, RANK, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)


def inputs_for(rows, logit_dtype, seed=7, vocab=VOCAB):
    return cuda_inputs(rows, STEPS, vocab, logit_dtype, seed)


def both(head, inputs, cache_dtype, **backend_kwargs):
    rows = inputs["base_logits"].shape[0]
    out = {}
    for impl in IMPLS:
        sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, method="gumbel", impl=impl)
        if impl == "cuda_gumbel" and backend_kwargs:
            sampler.backend = type(sampler.backend)(head, STEPS, rows, method="gumbel", cache_dtype=cache_dtype,
                                                    device="cuda", **backend_kwargs)
        out[impl] = sample(sampler, inputs, cache_dtype)
    return out


def assert_same(out):
    assert torch.equal(out["gumbel_fused"][0], out["cuda_gumbel"][0])
    assert same_values(out["gumbel_fused"][1], out["cuda_gumbel"][1])


@pytest.mark.parametrize("rows", [1, 16, 64, 253])
@pytest.mark.parametrize("logit_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                                     (torch.bfloat16, torch.float32)])
def test_matches_gumbel_fused_and_reference_at_full_shape(head, rows, logit_dtype, cache_dtype):
    inputs = inputs_for(rows, logit_dtype)
    out = both(head, inputs, cache_dtype)
    check_draws(head, inputs, *out["cuda_gumbel"], exact=False)
    assert_same(out)


@pytest.mark.parametrize("flags", [0, 1, 2, 3])
def test_every_token_exact_and_the_prefetch_hint_draw_the_same(head, flags):
    """filter_margin = 1e30: the bound test never skips (every token's exact key); flags never change a draw."""
    inputs = inputs_for(64, torch.bfloat16)
    out = both(head, inputs, torch.bfloat16, filter_margin=1e30, flags=flags)
    assert_same(out)
    out = both(head, inputs, torch.bfloat16, blocks_per_sm=1000, flags=flags)  # one block per work item
    assert_same(out)


@pytest.mark.parametrize("rows", [64, 253])
def test_vocabulary_slices(head, rows):
    """slices=4: per step four (GEMM of a vocabulary slice, block kernel on it) pairs; every token is
    draw_gumbel of the cache. Where cuBLAS computes a slice's columns as the whole GEMM does (checked
    here), the draws and cache equal gumbel_fused's bit for bit."""
    inputs = inputs_for(rows, torch.bfloat16)
    out = both(head, inputs, torch.bfloat16, slices=4, range_chunks=4)
    check_draws(head, inputs, *out["cuda_gumbel"], exact=False)
    codes = head.embed_weight[inputs["anchor"].long()]
    full = torch.matmul(codes, head.head_weight.t())
    per = 8 * 4096
    if all(torch.equal(torch.matmul(codes, head.head_weight[lo:lo + per].t()), full[:, lo:lo + per])
           for lo in range(0, VOCAB, per)):
        assert_same(out)


@pytest.mark.parametrize("variant,blocks_per_sm,range_chunks", [(1, 3, 4), (3, 3, 4), (13, 4, 4), (15, 4, 2),
                                                                (0, 3, 1), (1, 3, 8)])
def test_kernel_variants_and_ranges_draw_the_same(head, variant, blocks_per_sm, range_chunks):
    """Compile-time variants (cvt rounding, pipelined loads, 256-token chunks, 4 blocks per SM) and work-item
    sizes: the same tokens and cache as gumbel_fused, mixed T and padding included."""
    inputs = inputs_for(64, torch.bfloat16)
    out = both(head, inputs, torch.bfloat16, variant=variant, blocks_per_sm=blocks_per_sm, range_chunks=range_chunks)
    assert_same(out)


def test_strided_logits_and_scale(head):
    scaled = dm.MarkovHead(head.embed_weight, head.head_weight, 0.8125)
    inputs = make_inputs(16, STEPS, VOCAB, strided=True, device="cuda", seed=13, embed_vocab=VOCAB + 1000)
    assert inputs["base_logits"].stride(0) != STEPS * VOCAB
    out = both(scaled, inputs, torch.bfloat16)
    check_draws(scaled, inputs, *out["cuda_gumbel"], exact=False)
    assert_same(out)


def test_vocabulary_not_a_multiple_of_8_takes_the_scalar_path(head):
    vocab = VOCAB - 3
    small = dm.MarkovHead(head.embed_weight, head.head_weight[:vocab].contiguous())
    inputs = inputs_for(16, torch.bfloat16, seed=21, vocab=vocab)
    sampler = dm.MarkovSampler(small, STEPS, 16, cache_dtype=torch.bfloat16, method="gumbel", impl="cuda_gumbel")
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    assert sampler.backend.kernel_name(inputs["base_logits"], cache).endswith("_v0_s0")
    out = both(small, inputs, torch.bfloat16)
    check_draws(small, inputs, *out["cuda_gumbel"], exact=False)
    assert_same(out)


def test_nan_and_all_minus_inf_rows_stay_in_range(head):
    inputs = special_rows_inputs(4, STEPS, VOCAB)
    out = both(head, inputs, torch.bfloat16)
    tokens = out["cuda_gumbel"][0]
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
    assert_same(out)


@pytest.mark.parametrize("rows", [64, 253])
def test_cuda_graph_capture_and_replay(head, rows):
    """Capture sample() once; refill every input with new values; replay equals eager."""
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="gumbel", impl="cuda_gumbel")
    for fresh, tokens, cache in replays_with_fresh_inputs(sampler, rows, STEPS, VOCAB, torch.bfloat16):
        check_draws(head, fresh, tokens, cache, exact=False)
        eager = both(head, fresh, torch.bfloat16)
        assert torch.equal(tokens, eager["cuda_gumbel"][0]) and torch.equal(tokens, eager["gumbel_fused"][0])
        assert same_values(cache, eager["cuda_gumbel"][1])


def test_noise_table_is_the_exhaustive_bucket_maximum(head):
    """A fresh sweep of all 2^32 hashes equals the table in use (kept on disk; cuda_chain's test checks
    its own sweep, the same function)."""
    from dspark_markov import cuda

    index = torch.cuda.current_device()
    fresh = cuda.build_noise_table(index)
    in_use = cuda.noise_table(index)
    assert torch.equal(fresh.view(torch.int32), in_use.view(torch.int32))
    assert float(fresh[0]) > 20.0 and float(fresh.max()) < 23.0  # bucket 0: h in {0, 1}, u ~ 2^-32, g ~ 22


def test_noise_table_matches_the_torch_reference_noise(head):
    """Independent of the sweep kernel: every bucket of the hashes below 2^26 (fp32 exponents 0-25 of
    ``h | 1``: 1,664 of the 2,112 buckets, the large-noise end where the bound decides) recomputed with
    :mod:`dspark_markov.rng`'s torch reference (``uniform32`` / ``gumbel32``) and noise.cuh's bucket rule."""
    from dspark_markov import cuda, rng

    table = cuda.noise_table(torch.cuda.current_device())
    bits, limit, step = cuda.TB_SIZE // 33, 1 << 26, 1 << 22
    best = torch.full((cuda.TB_SIZE,), float("-inf"), device="cuda")
    for lo in range(0, limit, step):
        h = torch.arange(lo, lo + step, dtype=torch.int64, device="cuda")
        noise = rng.gumbel32(rng.uniform32(h))
        as_float = (h | 1).to(torch.float32)  # exact below 2^24, rounded to nearest above (as the C cast)
        bucket = (as_float.view(torch.int32).to(torch.int64) >> (23 - 6)) - (127 << 6)
        best.scatter_reduce_(0, bucket, noise, reduce="amax")
    covered = 26 * bits  # exponents 0..25: every hash of these buckets is below 2^26
    assert bits == 1 << 6
    assert torch.equal(best[:covered].view(torch.int32), table[:covered].view(torch.int32))


_FRESH_PROCESS_CAPTURE = r"""
import sys, torch
import dspark_markov as dm
from tests.helpers import SENTINEL, make_head, make_inputs, new_outputs, same_values
torch.backends.cuda.matmul.allow_tf32 = False
V, STEPS = 129_280, 5
head = make_head(V, 256, embed_extra=1000, dtype=torch.bfloat16, device="cuda", seed=3)
for rows in (16, 64, 253):
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=torch.bfloat16, method="gumbel", impl="auto")
    inputs = make_inputs(rows, STEPS, V, device="cuda", seed=rows, extra_slots=5, embed_vocab=V + 1000)
    tokens, cache = new_outputs(inputs, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
    torch.cuda.current_stream().wait_stream(side)
    eager_tokens, eager_cache = tokens.clone(), cache.clone()
    graph = torch.cuda.CUDAGraph()
    print("capture", rows, type(sampler.backend).__name__, flush=True)
    with torch.cuda.graph(graph):
        sampler.sample(**inputs, draft_tokens=tokens, logits_cache=cache, check_values=False)
    tokens.fill_(-1)
    cache.fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(tokens, eager_tokens) and same_values(cache, eager_cache), rows
print("ok")
"""


def test_auto_capture_in_a_fresh_process(head):
    """The first capture of ``impl="auto"`` in a process (16 / 64 / 253 rows: cuda_chain, cuda_gumbel), after
    the two warm-up calls of PyTorch's recipe, replays what eager drew: nothing loads or queries the driver
    lazily inside the capture (the 2026-12-04 hook-timing failure happened in such a first capture)."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_CAPTURE], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stdout + done.stderr
