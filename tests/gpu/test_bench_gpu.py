"""The benchmark's CUDA path at DeepSeek-V4.1 shapes: graph capture, cold-L2 replays, reports."""

import json

import pytest
import torch

from dspark_markov.bench import cli, grid, harness, roofline

pytestmark = pytest.mark.gpu


def test_bandwidth_measurement_is_in_physical_range():
    bandwidth = roofline.measure_bandwidth(torch.device("cuda"), repeats=5)
    # Any datacenter GPU of the last years streams between 0.5 and 10 TB/s; a unit slip (ms/us,
    # bytes/elements) lands orders of magnitude outside.
    assert 500 < bandwidth.read_gbps < 10_000 and 500 < bandwidth.copy_gbps < 10_000


def test_flushed_replay_is_slower_than_warm_replay():
    # A 32 MB read fits the H200's L2: warm replays hit it, flushed replays go to HBM.
    data = torch.ones(8 << 20, dtype=torch.float32, device="cuda")
    total = torch.empty((), dtype=torch.float32, device="cuda")
    graph = harness.capture_graph(lambda: torch.sum(data, dim=0, out=total))
    flush = harness.L2Flusher(torch.device("cuda"))
    cold = harness.summarize([harness.time_graph_replays(graph, 20, flush) for _ in range(3)]).median
    # The warm "flush" spins the GPU without touching memory, so the host still runs ahead of the
    # GPU and the events do not time the host's launch gap.
    spin = lambda: torch.cuda._sleep(200_000)  # noqa: E731 - about 0.1 ms of clock cycles
    warm = harness.summarize([harness.time_graph_replays(graph, 20, spin) for _ in range(3)]).median
    assert warm < cold
    assert total.item() == 8 << 20


def test_grid_at_full_shapes():
    config = grid.BenchConfig(rows=(1, 16, 64, 253), temperatures=("mixed",), rounds=3, replays=5, eager_calls=2)
    bandwidth = roofline.measure_bandwidth(torch.device("cuda"), repeats=5)
    records = grid.run_grid(config, bandwidth, progress=False)
    assert len(records) == 4 * len(grid.DESIGNS)
    for record in records:
        assert record["status"] in ("ok", "n/a"), record
        if record["status"] == "ok":
            assert record["graph_tokens_match"] is True, record
            assert 0 < record["time_us_low"] <= record["time_us"] <= record["time_us_high"]
            assert record["eager_us"] > 0
    loop = {r["rows"]: r for r in records if r["design"] == "loop"}
    if all(r["status"] == "ok" for r in loop.values()):
        # 253 rows move ~270 MB more logits and cache per step than 1 row.
        assert loop[253]["time_us"] > loop[1]["time_us"]
        assert all(r["speedup_vs_loop"] == 1.0 for r in loop.values())


def test_cli_writes_gpu_environment(tmp_path):
    argv = ["--rows", "1,16", "--designs", "loop,fused", "--temperature", "1", "--rounds", "3", "--replays", "5",
            "--eager-calls", "2", "--out", str(tmp_path), "--no-progress", "--targets", "--no-plot"]
    assert cli.main(argv) == 0
    (json_path,) = tmp_path.glob("*.json")
    data = json.loads(json_path.read_text())
    env = data["environment"]
    assert env["gpu"] == torch.cuda.get_device_name(0) and env["cuda"] == torch.version.cuda
    assert env["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    assert len(data["results"]) == 4 and len(list(tmp_path.glob("*.csv"))) == 1
