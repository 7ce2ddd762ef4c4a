"""prepare_block_inputs on the GPU: Triton == reference at serving sizes, and CUDA-graph replay."""

import pytest
import torch

import dspark_markov as dm

pytestmark = pytest.mark.gpu

STEPS = 5
MAX_REQS = 256
MAX_LEN = 163_840
MASK_ID = 128_815
NAMES = ("input_ids", "positions", "sample_pos", "sample_idx_mapping", "is_padding")


def buffers():
    queries = MAX_REQS * (STEPS + 1)
    return dict(input_ids=torch.full((queries,), 9, dtype=torch.int32, device="cuda"),
                positions=torch.full((queries,), 9, dtype=torch.int64, device="cuda"),
                sample_pos=torch.full((MAX_REQS * STEPS,), 9, dtype=torch.int64, device="cuda"),
                sample_idx_mapping=torch.full((MAX_REQS * STEPS,), 9, dtype=torch.int64, device="cuda"),
                is_padding=torch.zeros(queries, dtype=torch.bool, device="cuda"))


def inputs(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    last_pos = torch.randint(0, MAX_LEN, (MAX_REQS,), generator=gen, device="cuda")
    last_pos[:2] = torch.tensor([MAX_LEN - 1, MAX_LEN - 4])
    bonus = torch.randint(0, 129_280, (MAX_REQS,), generator=gen, device="cuda")
    slots = torch.randperm(1024, generator=gen, device="cuda")[:MAX_REQS]
    return last_pos, bonus, slots


def call(last_pos, bonus, slots, out, num_reqs, impl="triton"):
    dm.prepare_block_inputs(last_pos, bonus, slots, num_steps=STEPS, mask_token_id=MASK_ID, max_model_len=MAX_LEN,
                            num_reqs=num_reqs, impl=impl, **out)


@pytest.mark.parametrize("num_reqs", [1, 16, 64, 253])
def test_triton_equals_reference(num_reqs):
    last_pos, bonus, slots = inputs(num_reqs)
    expected, got = buffers(), buffers()
    call(last_pos, bonus, slots, expected, num_reqs, impl="reference")
    call(last_pos, bonus, slots, got, num_reqs)
    for name in NAMES:
        assert torch.equal(got[name], expected[name]), name


def test_cuda_graph_replay_with_a_device_count():
    last_pos, bonus, slots = inputs(0)
    count = torch.tensor([16], device="cuda")
    out = buffers()
    call(last_pos, bonus, slots, out, count)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(last_pos, bonus, slots, out, count)
    for seed, live in ((1, 253), (2, 1), (3, 0), (4, 64)):
        fresh = inputs(seed)
        for dst, src in zip((last_pos, bonus, slots), fresh):
            dst.copy_(src)
        count.fill_(live)
        graph.replay()
        expected = buffers()
        call(*fresh, expected, live, impl="reference")
        for name in NAMES:
            assert torch.equal(out[name], expected[name]), (name, live)


@pytest.mark.parametrize("max_len", [2**63 - 1, 2**62, 2**31 + 1, 2**31 - 1, MAX_LEN])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_positions_clamp_near_the_ends_of_the_integer_types(max_len, dtype):
    """min(last_pos + j, max_model_len - 1) without an int64 sum that wraps (last_pos near 2^63 - 1) and with
    max_model_len on both sides of 2^31 (the kernel's scalar typed int32 or int64): Triton == reference == Python
    integers, eagerly and replayed from a graph with new positions."""
    top = torch.iinfo(dtype).max
    wanted = [top, top - 2, min(max_len - 1, top), min(max_len - 1, top) - 3, 0, 7]
    slots = torch.arange(len(wanted), device="cuda").to(dtype)
    bonus = torch.arange(len(wanted), device="cuda").to(dtype)

    def expected(values):
        return ([[min(p + j, max_len - 1) for j in range(STEPS + 1)] for p in values],
                [[min(p + 1 + i, max_len - 1) for i in range(STEPS)] for p in values])

    def run(last_pos, out, impl):
        dm.prepare_block_inputs(last_pos, bonus, slots, num_steps=STEPS, mask_token_id=MASK_ID, max_model_len=max_len,
                                num_reqs=len(wanted), impl=impl, **out)

    last_pos = torch.tensor(wanted, device="cuda").to(dtype)
    n = len(wanted)
    for impl in ("triton", "reference"):
        out = buffers()
        run(last_pos, out, impl)
        torch.cuda.synchronize()
        positions, sample_pos = expected(wanted)
        assert out["positions"].view(MAX_REQS, STEPS + 1)[:n].tolist() == positions, impl
        assert out["sample_pos"].view(MAX_REQS, STEPS)[:n].tolist() == sample_pos, impl
    out = buffers()
    run(last_pos, out, "triton")  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(last_pos, out, "triton")
    shifted = [max(p - 5, 0) for p in wanted]
    last_pos.copy_(torch.tensor(shifted, device="cuda").to(dtype))
    graph.replay()
    torch.cuda.synchronize()
    positions, sample_pos = expected(shifted)
    assert out["positions"].view(MAX_REQS, STEPS + 1)[:n].tolist() == positions
    assert out["sample_pos"].view(MAX_REQS, STEPS)[:n].tolist() == sample_pos
