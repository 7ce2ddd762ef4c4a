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
