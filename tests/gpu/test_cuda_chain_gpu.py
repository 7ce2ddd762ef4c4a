"""``impl="cuda_chain"`` on the H200 at DeepSeek-V4.1 shapes (V = 129,280, rank 256, N = 5).

Every draw is checked bit for bit against the reference applied to the kernel's own cache
(:func:`check_exact`, as tests.helpers.check_against_reference): rows 1 / 2 / 3 / 8 / 9 / 16, both cache dtypes, mixed
temperatures with padding rows, fp32 base logits, int32 index inputs, NaN / all -inf rows, the
exact fallback path, with and without the register-resident tile; CUDA-graph replays equal eager
calls; a forced barrier timeout raises and the next call is exact again; the approximate noise of
noise.cuh is within the filter's bound over all 2^32 hashes.
"""

import ctypes

import pytest
import torch

import dspark_markov as dm
from dspark_markov import rng
from dspark_markov.draft import cuda_chain
from dspark_markov.draft.cuda_chain import CudaChainBackend
from tests.helpers import STEPS, VOCAB, check_against_reference, check_graph_replays, full_problem

pytestmark = pytest.mark.gpu


def cache_report(head, base_logits, anchor, idx_mapping, positions, temperature, seeds, out, limit=8):
    """The cached entries farther from the reference than one bias rounding (for a failure message)."""
    from tests.helpers import ulp

    rows, steps, _ = base_logits.shape
    slots, prev, lines = idx_mapping.view(rows, steps), anchor.long(), []
    for step in range(steps):
        padding = slots[:, step] < 0
        bias = head.bias(prev)
        want = (base_logits[:, step].float() + bias.float()).to(out.logits_cache.dtype).float()
        for r in range(rows):
            if padding[r]:
                continue
            got = out.logits_cache[slots[r, step], step].float()
            tol = 2 * ulp(bias[r], head.dtype) + ulp(want[r], out.logits_cache.dtype)
            bad = ((got - want[r]).abs() > tol) & ~(torch.isnan(got) & torch.isnan(want[r]))
            for v in bad.nonzero().flatten()[:limit].tolist():
                lines.append(f"step {step} row {r} token {v}: got {got[v].item()!r} want {want[r, v].item()!r} "
                             f"bias {bias[r, v].item()!r} base {base_logits[r, step, v].item()!r} tol {tol[v].item()!r}")
            if bad.any():
                lines.append(f"step {step} row {r}: {int(bad.sum())} entries off, prev {int(prev[r])}")
        prev = out.draft_tokens[:, step].long()
    return "\n".join(lines)


def check_exact(head, args, out):
    """``tests.helpers.check_against_reference`` (tokens bit for bit from the kernel's own cache, the
    cache within the bias's rounding and reordering bound), printing :func:`cache_report` on a miss."""
    try:
        check_against_reference(head, *args, out)
    except AssertionError:
        print(cache_report(head, *args, out))
        raise


def cuda_sampler(head, rows, cache_dtype=torch.bfloat16, **options):
    sampler = dm.MarkovSampler(head, STEPS, rows, cache_dtype=cache_dtype, impl="cuda_chain")
    if options:
        sampler.backend = CudaChainBackend(head, STEPS, rows, method="gumbel", cache_dtype=cache_dtype, device=head.device, **options)
    return sampler


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16])
def test_cuda_chain_full_shape(rows, cache_dtype):
    head, args = full_problem(rows, seed=rows)
    sampler = cuda_sampler(head, rows, cache_dtype)
    out = sampler.sample(*args)
    check_exact(head, args, out)
    sampler.backend.check()


@pytest.mark.parametrize("rows", [1, 16])
def test_cuda_chain_t1_fp32_base_int32_inputs(rows):
    head, args = full_problem(rows, temps=(1.0,), seed=11)
    args[0] = args[0].float()
    args[1], args[2], args[3] = (a.to(torch.int32) for a in args[1:4])
    sampler = cuda_sampler(head, rows)
    out = sampler.sample(*args)
    check_exact(head, args, out)


@pytest.mark.parametrize("rows", [1, 12])
@pytest.mark.parametrize("warps,reg_tiles,smem_tiles", [(16, 0, 3), (16, 1, None), (8, 3, None), (8, 3, 0)])
def test_cuda_chain_block_shapes(rows, warps, reg_tiles, smem_tiles):
    head, args = full_problem(rows, seed=4)
    sampler = cuda_sampler(head, rows, warps=warps, reg_tiles=reg_tiles, smem_tiles=smem_tiles)
    out = sampler.sample(*args)
    check_exact(head, args, out)


@pytest.mark.parametrize("variant", [0, 43])
def test_cuda_chain_exact_fallback_everywhere(variant):
    """A huge filter margin: every sampled row of every block takes the exact recomputation."""
    head, args = full_problem(3, seed=6)
    sampler = cuda_sampler(head, 3, filter_margin=1e30, variant=variant)
    out = sampler.sample(*args)
    check_exact(head, args, out)


@pytest.mark.parametrize("variant,flags", [(0, 0), (11, 3), (43, 15), (43, 31)])
def test_cuda_chain_nan_and_all_minus_inf_rows(variant, flags):
    head, args = full_problem(4, temps=(1.0, 0.6, 0.0, 1.0), seed=8)
    base = args[0].float()
    base[0, 0, 100_000] = float("nan")
    base[0, 0, 70_000] = float("nan")
    base[1] = float("-inf")
    base[3, 1, :] = 3.0e38
    args[0] = base
    for cache_dtype in (torch.bfloat16, torch.float32):
        out = cuda_sampler(head, 4, cache_dtype, variant=variant, flags=flags).sample(*args)
        tokens = out.draft_tokens
        assert tokens.min() >= 0 and tokens.max() < VOCAB
        assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
        check_exact(head, args, out)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 9, 16])
@pytest.mark.parametrize("flags,variant", [(3, 0), (0, 11), (31, 43), (20, 0)])
def test_cuda_chain_prefetch_hints_and_variants(rows, cache_dtype, flags, variant):
    """The L2 prefetch hints (flags) and the compile-time variant draw exactly as the reference."""
    head, args = full_problem(rows, seed=20 + rows)
    sampler = cuda_sampler(head, rows, cache_dtype, flags=flags, variant=variant)
    out = sampler.sample(*args)
    check_exact(head, args, out)
    sampler.backend.check()


@pytest.mark.parametrize("rows", [2, 16])
def test_cuda_chain_prefetch_unaligned_fp32_base(rows):
    """Base rows not 16-byte aligned (no vector I/O, no bulk base prefetch) and an fp32 base."""
    head, args = full_problem(rows, temps=(1.0, 0.6), seed=12)
    for dtype in (torch.bfloat16, torch.float32):
        wide = torch.empty(rows, STEPS, VOCAB + 1, dtype=dtype, device=args[0].device)
        wide[..., 1:] = args[0].to(dtype)
        case = [wide[..., 1:]] + args[1:]
        out = cuda_sampler(head, rows, flags=31, variant=43).sample(*case)
        check_exact(head, case, out)


@pytest.mark.parametrize("temps", [(1.0, 0.0), (0.0, 0.6)])
def test_cuda_chain_exact_small_nan_inf_rows(temps):
    """FLAG_EXACT_SMALL at 2 rows (its path): NaN, -inf and 3e38 logits, greedy and sampled rows."""
    head, args = full_problem(2, temps=temps, seed=13)
    base = args[0].float()
    base[0, 0, 90_000] = float("nan")
    base[1, 1] = float("-inf")
    base[0, 2, :] = 3.0e38
    args[0] = base
    out = cuda_sampler(head, 2, torch.float32, variant=43, flags=31).sample(*args)
    check_exact(head, args, out)


@pytest.mark.parametrize("rows", [1, 16])
def test_cuda_chain_prefetch_graph_replays_match_eager(rows):
    head, _ = full_problem(rows, seed=1)
    sampler = cuda_sampler(head, rows, flags=31, variant=43)
    check_graph_replays(sampler, rows, seeds=(2, 3), replays=2)
    sampler.backend.check()


@pytest.mark.parametrize("rows", [1, 16])
def test_cuda_chain_graph_replays_match_eager(rows):
    head, _ = full_problem(rows, seed=1)
    sampler = cuda_sampler(head, rows)
    check_graph_replays(sampler, rows, seeds=(2, 3), replays=2)
    sampler.backend.check()


@pytest.mark.parametrize("rows,variant", [(2, None), (16, None), (2, 7275)])
def test_cuda_chain_barrier_timeout_raises_and_recovers(rows, variant):
    head, args = full_problem(rows, seed=9)
    options = {} if variant is None else dict(variant=variant, flags=15)
    sampler = cuda_sampler(head, rows, barrier_extra=1, spin_cycles=200_000, **options)
    out = sampler.sample(*args, check_values=False)
    torch.cuda.synchronize()
    assert out.draft_tokens.min() >= 0 and out.draft_tokens.max() < VOCAB
    with pytest.raises(dm.DeviceStatusError, match="cuda_chain"):
        sampler.backend.check()
    sampler.backend.check()  # reported once
    sampler.backend.barrier_extra = 0
    out = sampler.sample(*args)
    check_exact(head, args, out)
    sampler.backend.check()


def test_approximate_noise_bound_over_all_hashes():
    from dspark_markov import cuda

    kernels = cuda.chain_kernels(torch.cuda.current_device())
    worst = torch.zeros(1, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernels.launch("dm_noise_bound", sms * 16, 256, 0, torch.cuda.current_stream().cuda_stream,
                   [ctypes.c_uint32(0), ctypes.c_uint64(1 << 32), ctypes.c_uint64(worst.data_ptr())])
    bound = float(worst.view(torch.float32).item())
    print(f"cuda_chain approximate noise: worst |approx - exact| over 2^32 hashes = {bound:.3e}")
    assert bound <= 2.5e-5  # ops.bounds.NOISE_BOUND



# --------------------------------------------------------------------------- the noise table (variant bit 64)
def tb_bucket(h):
    """noise.cuh tb_bucket on int64 hashes (u32 -> fp32 rounded to nearest, as on the device)."""
    f = (h | 1).to(torch.float64).to(torch.float32)
    return (f.view(torch.int32).long() >> 17) - (127 << 6)


def test_noise_table_is_the_exact_bucket_maximum():
    """Every bucket's entry bounds the exact noise of 16M random hashes and of both ends of the hash
    range; for all h < 2^22 (whole buckets) the entries equal the reference's maximum."""
    from dspark_markov import cuda

    table = cuda_chain.noise_table(cuda.chain_kernels(torch.cuda.current_device()), torch.cuda.current_device())
    table = table.double()
    assert table.shape == (cuda_chain.TB_SIZE,)
    gen = torch.Generator(device="cuda").manual_seed(5)
    rand = torch.randint(0, 2**32, (1 << 24,), device="cuda", generator=gen, dtype=torch.int64)
    small = torch.arange(0, 1 << 22, device="cuda")
    for part in (rand, small, torch.arange(2**32 - (1 << 20), 2**32, device="cuda")):
        g, b = rng.gumbel32(rng.uniform32(part)).double(), tb_bucket(part)
        assert int(b.min()) >= 0 and int(b.max()) < cuda_chain.TB_SIZE
        assert bool((g <= table[b]).all())
    g, b = rng.gumbel32(rng.uniform32(small)).double(), tb_bucket(small)
    best = torch.full((cuda_chain.TB_SIZE,), float("-inf"), dtype=torch.float64, device="cuda")
    best = best.scatter_reduce(0, b, g, "amax")
    seen = torch.zeros(cuda_chain.TB_SIZE, dtype=torch.bool, device="cuda")
    seen[b] = True
    assert torch.equal(best[seen], table[seen])


TABLE_VARIANTS = (107, 7275)  # with the noise table (7275: + register tiles loaded before the loop, + 4 load
# batches per L2 tile, + base logits / W1 rows not kept in L1)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("variant", TABLE_VARIANTS)
def test_cuda_chain_new_variants_full_shape(variant, cache_dtype):
    for rows in (1, 3, 4, 8, 9, 16):
        head, args = full_problem(rows, seed=40 + rows)
        sampler = cuda_sampler(head, rows, cache_dtype, variant=variant, flags=15)
        out = sampler.sample(*args)
        check_exact(head, args, out)
        sampler.backend.check()


@pytest.mark.parametrize("variant", TABLE_VARIANTS)
def test_cuda_chain_table_t1_and_greedy(variant):
    for rows in (4, 16):
        for temps in ((1.0,), (0.0,), (0.25, 1.7)):
            head, args = full_problem(rows, temps=temps, seed=50 + rows)
            out = cuda_sampler(head, rows, variant=variant, flags=15).sample(*args)
            check_exact(head, args, out)


@pytest.mark.parametrize("variant", TABLE_VARIANTS)
def test_cuda_chain_table_exact_fallback_everywhere(variant):
    """filter_margin = 1e30: no row is ever decided; the warp-wide exact recomputation everywhere."""
    for rows in (4, 16):
        head, args = full_problem(rows, seed=6)
        out = cuda_sampler(head, rows, filter_margin=1e30, variant=variant, flags=15).sample(*args)
        check_exact(head, args, out)


@pytest.mark.parametrize("variant", TABLE_VARIANTS + (None,))
def test_cuda_chain_new_variants_nan_inf_rows(variant):
    head, args = full_problem(4, temps=(1.0, 0.6, 0.0, 1.0), seed=8)
    base = args[0].float()
    base[0, 0, 100_000] = float("nan")
    base[0, 0, 70_000] = float("nan")
    base[1] = float("-inf")
    base[3, 1, :] = 3.0e38
    base[2, 2, 5000:5010] = float("inf")
    args[0] = base
    for cache_dtype in (torch.bfloat16, torch.float32):
        out = cuda_sampler(head, 4, cache_dtype, variant=variant, flags=15).sample(*args)
        tokens = out.draft_tokens
        assert tokens.min() >= 0 and tokens.max() < VOCAB
        assert tokens[0, 0] == 70_000 and bool((tokens[1] == 0).all())
        check_exact(head, args, out)


@pytest.mark.parametrize("rows,variant", [(16, 107), (16, 7275), (2, 7275), (8, None), (16, None)])
def test_cuda_chain_new_variants_unaligned_fp32_base(rows, variant):
    head, args = full_problem(rows, temps=(1.0, 0.6), seed=12)
    for dtype in (torch.bfloat16, torch.float32):
        wide = torch.empty(rows, STEPS, VOCAB + 1, dtype=dtype, device=args[0].device)
        wide[..., 1:] = args[0].to(dtype)
        case = [wide[..., 1:]] + args[1:]
        out = cuda_sampler(head, rows, variant=variant, flags=15).sample(*case)
        check_exact(head, case, out)
    args[0] = args[0].float()
    out = cuda_sampler(head, rows, variant=variant, flags=15).sample(*args)
    check_exact(head, args, out)


@pytest.mark.parametrize("rows,variant", [(16, 107), (16, 7275), (1, 7275), (8, 107)])
def test_cuda_chain_new_variants_graph_replays_match_eager(rows, variant):
    head, _ = full_problem(rows, seed=1)
    sampler = cuda_sampler(head, rows, variant=variant, flags=15)
    check_graph_replays(sampler, rows, seeds=(2, 3), replays=2)
    sampler.backend.check()
