"""``dspark-markov bench --verify`` on the CPU: bytes model, the grid, the reports and the CLI."""

import csv
import json

import pytest
import torch

from dspark_markov.bench import cli, roofline, verify_grid
from dspark_markov.verify import filtering

FAKE_BANDWIDTH = roofline.Bandwidth(copy_gbps=4300.0, read_gbps=4200.0, copy_bytes=1, read_bytes=1)


# ---------------------------------------------------------------------------------------------- bytes model


def test_bytes_model_deepseek_shapes():
    # Verification at 253 rows, K = 5: target 253 * 6 * 129280 * 4 = 784,988,160 bytes, bf16 cache
    # 253 * 5 * 129280 * 2 = 327,078,400 bytes.
    assert verify_grid.verify_bytes(253, 5, 129_280) == 784_988_160 + 327_078_400
    assert verify_grid.verify_bytes(1, 5, 129_280, cache_bytes=4) == 6 * 129_280 * 4 + 5 * 129_280 * 4
    # Filtering 1518 = 253 * 6 rows: read and written once.
    assert verify_grid.filter_bytes(1518, 129_280) == 2 * 784_988_160
    # Block inputs, 256 requests, N = 5: 6 * (8 + 8 + 1) + 5 * (8 + 8) = 182 bytes per request.
    assert verify_grid.block_inputs_bytes(256, 5) == 46_592
    assert verify_grid.block_inputs_bytes(256, 5, id_bytes=4) == 256 * (6 * 9 + 80)

    config = verify_grid.VerifyBenchConfig()
    assert verify_grid.kernel_bytes(config, "verify_block", 253) == (253, 784_988_160 + 327_078_400)
    assert verify_grid.kernel_bytes(config, "filter_split", 253) == (1518, 2 * 784_988_160)
    assert verify_grid.kernel_bytes(config, "block_inputs", 1) == (256, 46_592)  # the whole padded batch
    fp32 = verify_grid.VerifyBenchConfig(cache_dtype=torch.float32)
    assert verify_grid.kernel_bytes(fp32, "verify_standard", 1)[1] == 6 * 129_280 * 4 + 5 * 129_280 * 4
    # The floor of the 253-row verification at 4.2 TB/s: about 264.8 us.
    assert roofline.floor_us(784_988_160 + 327_078_400, 4200.0) == pytest.approx(264.778, abs=1e-3)


def test_greedy_requests_read_no_cache_rows_so_their_bytes_leave_the_floor():
    """A T = 0 request verifies by the target's argmax alone: the reference's tokens do not change when its
    cache rows are garbage, and the StreamVerifier reads none of them (triton_verify_stream._stream_chunk's
    ``greedy`` branch). The floor of a mixed-T batch (slot b at T = (0, 0.6, 1)[b % 3]) counts the cache rows
    of its non-greedy requests only; it counted all of them (253 requests: +9.9 % floor, bf16 cache; the
    mixed batch of 1 request, which is greedy: +42 %)."""
    import dspark_markov as dm

    v = 129_280
    assert [verify_grid.greedy_requests(b, "mixed") for b in (1, 2, 3, 4, 16, 64, 253)] == [1, 1, 1, 2, 6, 22, 85]
    assert verify_grid.greedy_requests(253, "1") == verify_grid.greedy_requests(253, "0.6") == 0
    config = verify_grid.VerifyBenchConfig()
    assert verify_grid.kernel_bytes(config, "verify_standard", 253, "1") == (253, 784_988_160 + 327_078_400)
    mixed = 784_988_160 + (253 - 85) * 5 * v * 2
    for kernel in verify_grid.VERIFY_METHODS:
        assert verify_grid.kernel_bytes(config, kernel, 253, "mixed") == (253, mixed)
    assert verify_grid.kernel_bytes(config, "verify_raw", 1, "mixed") == (1, 6 * v * 4)  # no cache row at all
    fp32 = verify_grid.VerifyBenchConfig(cache_dtype=torch.float32)
    assert verify_grid.kernel_bytes(fp32, "verify_block", 16, "mixed")[1] == v * (16 * 6 * 4 + 10 * 5 * 4)
    assert verify_grid._record(config, "verify_standard", "triton", 253, "mixed")["minimal_bytes"] == mixed
    assert verify_grid._record(config, "filter_row", "triton", 253, "gaussian p")["minimal_bytes"] == 2 * 784_988_160

    # The premise, on the reference: garbage in a greedy request's cache rows changes nothing it emits.
    gen = torch.Generator().manual_seed(5)
    b, k, vocab = 6, 3, 200
    target = torch.randn(b, k + 1, vocab, generator=gen) * 2
    cache = (torch.randn(b, k, vocab, generator=gen) * 2).bfloat16()
    drafts = target[:, :k].argmax(dim=-1)  # greedy requests accept some drafts
    drafts[1, 1] = (drafts[1, 1] + 1) % vocab
    args = (torch.full((b,), k), torch.arange(b), torch.randint(1, 1000, (b,), generator=gen),
            verify_grid.mixed_temperatures(b, "cpu"), torch.randint(0, 1 << 40, (b,), generator=gen))
    first = dm.verify_drafts(target, drafts, cache, *args)
    garbage = cache.clone()
    garbage[0::3] = torch.randn(2, k, vocab, generator=gen).bfloat16() * 50  # requests 0 and 3: T = 0
    second = dm.verify_drafts(target, drafts, garbage, *args)
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.num_emitted, second.num_emitted)


@pytest.mark.parametrize("call, name", [
    (lambda: verify_grid.verify_bytes(0, 5, 100), "rows"),
    (lambda: verify_grid.verify_bytes(2, 5, 100, greedy=3), "greedy"),
    (lambda: verify_grid.verify_bytes(1, 0, 100), "drafts"),
    (lambda: verify_grid.verify_bytes(1, 5, 100, cache_bytes=1), "cache_bytes"),
    (lambda: verify_grid.filter_bytes(1, 0), "vocab"),
    (lambda: verify_grid.block_inputs_bytes(0, 5), "max_reqs"),
    (lambda: verify_grid.block_inputs_bytes(4, 5, id_bytes=2), "id_bytes"),
    (lambda: verify_grid.kernel_bytes(verify_grid.VerifyBenchConfig(), "warp_drive", 1), "kernel"),
    (lambda: verify_grid.VerifyBenchConfig(rows=(300,)), "rows"),
    (lambda: verify_grid.VerifyBenchConfig(kernels=("verify",)), "kernels"),
    (lambda: verify_grid.VerifyBenchConfig(impls=("cudnn",)), "impls"),
    (lambda: verify_grid.VerifyBenchConfig(top_p=1.5), "top_p"),
])
def test_bad_values_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------------------------------------- grid


def test_triton_kernels_in_the_interpreter():
    """Every kernel's Triton path runs, passes its first-call checks (the filter equals the
    reference bit for bit) and gets a time; the split filter needs two blocks, so it is n/a here."""
    config = verify_grid.cpu_config(vocab=300, rows=(1,), impls=("triton",), temperatures=("mixed",), rounds=2,
                                    replays=1, filter_inputs=("peaked",), filter_cases=("p",))
    records = verify_grid.run_grid(config, FAKE_BANDWIDTH, progress=False)
    by_kernel = {r["kernel"]: r for r in records}
    assert list(by_kernel) == list(verify_grid.KERNELS)
    for kernel in ("verify_standard", "verify_block", "filter_row", "block_inputs"):
        record = by_kernel[kernel]
        assert record["status"] == "ok", record["reason"]
        assert record["impl"] == "triton" and record["timing"] == "host"
        assert 0 < record["time_us_low"] <= record["time_us"] <= record["time_us_high"]
    assert by_kernel["filter_row"]["layout"] == "row" and by_kernel["filter_row"]["work_rows"] == 6
    split = by_kernel["filter_split"]
    assert split["status"] == "n/a" and "filter_split needs V >= 2 blocks" in split["reason"]


def test_split_filter_layout_in_the_interpreter():
    config = verify_grid.cpu_config(vocab=1100, rows=(1,), kernels=("filter_split",), impls=("triton",),
                                    rounds=1, replays=1, filter_inputs=("gaussian",), filter_cases=("k+p",))
    (record,) = verify_grid.run_grid(config, FAKE_BANDWIDTH, progress=False)
    assert record["status"] == "ok", record["reason"]
    assert record["layout"] == "split x2" and record["minimal_bytes"] == 2 * 6 * 1100 * 4


def test_triton_without_interpreter_is_na_and_a_wrong_filter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(filtering, "top_k_top_p", lambda logits, k, p, **kwargs: kwargs["out"].fill_(0.0))
    config = verify_grid.VerifyBenchConfig(device="cpu", vocab=300, rows=(2,), kernels=("filter_row", "block_inputs"),
                                           impls=("triton", "reference"), rounds=3, replays=1,
                                           filter_inputs=("gaussian",), filter_cases=("k+p",))
    records = verify_grid.run_grid(config, FAKE_BANDWIDTH, progress=False)
    by_key = {(r["kernel"], r["impl"]): r for r in records}
    assert len(records) == 4
    for kernel in ("filter_row", "block_inputs"):
        assert by_key[(kernel, "triton")]["status"] == "n/a"
        assert "TRITON_INTERPRET" in by_key[(kernel, "triton")]["reason"]
    wrong = by_key[("filter_row", "reference")]
    assert wrong["status"] == "error" and "disagrees with top_k_top_p_reference" in wrong["reason"]
    assert wrong["time_us"] is None and wrong["bandwidth_fraction"] is None
    assert by_key[("block_inputs", "reference")]["status"] == "ok"
    table = verify_grid.format_table(records, FAKE_BANDWIDTH)
    assert "not measured:" in table and "disagrees" in table


def test_cuda_filter_impl_is_na_off_a_gpu_and_for_other_kernels():
    """impl "cuda" (the cluster-resident filter; the CUDA verifier) is timed only as filter_row / verify_standard /
    verify_raw on a CUDA device; elsewhere its records say n/a and why."""
    config = verify_grid.VerifyBenchConfig(device="cpu", vocab=304, rows=(2,),
                                           kernels=("filter_row", "block_inputs", "verify_standard"),
                                           impls=("cuda",), rounds=3, replays=1, filter_inputs=("gaussian",),
                                           filter_cases=("p",), temperatures=("1",))
    records = verify_grid.run_grid(config, FAKE_BANDWIDTH, progress=False)
    assert len(records) == 3
    for record in records:
        assert record["status"] == "n/a" and "on a CUDA device" in record["reason"], record


# ---------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def small_bandwidth_buffers(monkeypatch):
    monkeypatch.setattr(roofline, "CPU_COPY_BYTES", 1 << 20)
    monkeypatch.setattr(roofline, "CPU_READ_BYTES", 1 << 20)


def test_cpu_run_writes_reports(tmp_path, capsys, monkeypatch, small_bandwidth_buffers):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the references only: quick
    argv = ["--verify", "--device", "cpu", "--vocab", "300", "--rows", "1,2", "--rounds", "3", "--replays", "1",
            "--out", str(tmp_path), "--no-progress", "--markdown"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| kernel | impl | rows | T / inputs | layout |" in printed and "K=N=5" in printed

    (json_path,) = tmp_path.glob("*.json")
    (csv_path,) = tmp_path.glob("*.csv")
    assert json_path.name.startswith("cpu_") and json_path.name.endswith("_bf16_v300_n5_verify.json")
    assert csv_path.stem == json_path.stem
    data = json.loads(json_path.read_text())
    assert data["environment"]["command"].startswith("dspark-markov bench --verify --device cpu")
    assert data["config"]["vocab"] == 300 and data["config"]["impls"] == ["reference"]
    assert data["config"]["top_k"] == 50 and data["config"]["top_p"] == 0.9 and data["config"]["max_reqs"] == 256
    assert data["bandwidth_used_for_fraction"] == "read_gbps" and "perf_counter" in data["timing"]

    results = data["results"]
    expected_keys = [(rows, kernel, mode) for rows in (1, 2)
                     for kernel, mode in (("verify_standard", "1"), ("verify_standard", "mixed"),
                                          ("verify_block", "1"), ("verify_block", "mixed"), ("verify_raw", "1"),
                                          ("verify_raw", "mixed"), ("verify_block_raw", "1"),
                                          ("verify_block_raw", "mixed"),
                                          *[("filter_row", "-")] * (len(verify_grid.FILTER_INPUTS)
                                                                     * len(verify_grid.FILTER_CASES)),
                                          ("block_inputs", "-"))]
    assert [(r["rows"], r["kernel"], r["temperature"]) for r in results] == expected_keys
    for r in results:
        assert set(r) == set(verify_grid.RECORD_FIELDS)
        assert r["status"] == "ok" and r["impl"] == "reference" and r["graph_output_match"] is None
        assert 0 < r["time_us_low"] <= r["time_us"] <= r["time_us_high"]
        assert r["floor_us"] == pytest.approx(r["minimal_bytes"] / (data["bandwidth"]["read_gbps"] * 1e3))
        assert r["bandwidth_fraction"] == pytest.approx(r["floor_us"] / r["time_us"])
        if r["kernel"].startswith("verify"):  # mixed T: request 0 (slot 0, T = 0) is greedy and reads no cache row
            greedy = 1 if r["temperature"] == "mixed" else 0
            assert r["minimal_bytes"] == r["rows"] * 300 * 6 * 4 + (r["rows"] - greedy) * 300 * 5 * 2
        elif r["kernel"] == "filter_row":
            assert r["minimal_bytes"] == 2 * 6 * r["rows"] * 300 * 4 and r["layout"] == "sort"
        else:
            assert r["minimal_bytes"] == 46_592 and r["work_rows"] == 256

    with csv_path.open() as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(results)
    for line, r in zip(lines, results):
        assert line["command"] == data["environment"]["command"] and line["vocab"] == "300"
        assert line["kernel"] == r["kernel"] and int(line["rows"]) == r["rows"]
        assert float(line["time_us"]) == pytest.approx(r["time_us"])
        assert int(line["minimal_bytes"]) == r["minimal_bytes"]
        assert float(line["read_gbps"]) == pytest.approx(data["bandwidth"]["read_gbps"])


@pytest.mark.parametrize("extra, message", [
    (["--rank", "8"], "--rank: not used by --verify"),
    (["--designs", "reference"], "--designs: not used by --verify"),
    (["--targets"], "--targets: not used by --verify"),
    (["--rows", "300"], "rows"),
    (["--rounds", "0"], "rounds"),
])
def test_bad_verify_arguments_exit_2(extra, message, capsys, tmp_path):
    assert cli.main(["--verify", "--device", "cpu", "--out", str(tmp_path), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_verify_refuses_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--verify", "--rows", "1"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_grid_at_real_shapes():
    """V = 129,280, K = N = 5: every kernel is captured, its replay writes what the eager call wrote
    (same inputs and keys), and it gets a positive graph-replay time and an eager time."""
    config = verify_grid.VerifyBenchConfig(rows=(1, 16, 64, 253), rounds=2, replays=3, eager_calls=2)
    bandwidth = roofline.measure_bandwidth(torch.device("cuda"))
    records = verify_grid.run_grid(config, bandwidth, progress=False)
    assert len(records) == 4 * len(verify_grid._cases(config))
    for r in records:
        assert r["status"] == "ok", (r["kernel"], r["rows"], r["reason"])
        assert r["timing"] == "graph" and r["graph_output_match"] is True
        assert 0 < r["time_us_low"] <= r["time_us"] <= r["time_us_high"] and r["eager_us"] > 0
        assert r["bandwidth_fraction"] == pytest.approx(r["floor_us"] / r["time_us"])
    split = [r for r in records if r["kernel"] == "filter_split"]
    assert all(r["layout"].startswith("split x") for r in split)
    assert {r["layout"] for r in records if r["kernel"] == "filter_row"} == {"row"}
