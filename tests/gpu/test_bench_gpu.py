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


def test_flush_and_replay_timing():
    flush = harness.L2Flusher(torch.device("cuda"))
    l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
    assert flush.nbytes >= max(harness.FLUSH_BYTES, 2 * l2_bytes)
    flush.buffer.fill_(7)
    flush()
    torch.cuda.synchronize()
    assert int(flush.buffer.max()) == 0  # the flush really writes the whole buffer
    data = torch.ones(8 << 20, dtype=torch.float32, device="cuda")  # 32 MB
    total = torch.empty((), dtype=torch.float32, device="cuda")
    graph = harness.capture_graph(lambda: torch.sum(data, dim=0, out=total))
    times = harness.time_graph_replays(graph, 20, flush)
    assert len(times) == 20 and total.item() == 8 << 20
    # Reading 32 MB takes at least 32 MB / 10 TB/s = 3.4 us and, on any GPU, far less than 10 ms.
    assert all(3.0 < t < 10_000 for t in times)


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
