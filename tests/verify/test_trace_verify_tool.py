"""tools/trace_verify.py on the CPU: its summary of a synthetic trace, and one traced launch in the interpreter."""

import pytest
import torch

from tests.helpers import load_tool

tool = load_tool("trace_verify")


def row(start_ns, waited_ns, end_ns, stage, valid, sm, direct=False, item_row=0, request=0):
    """A trace row as the kernel writes it (triton_verify_stream's TRACE store)."""
    code = stage + 4 * int(valid) + 8 * sm + (1 << 16) * int(direct) + (1 << 17) * item_row + (1 << 24) * request
    return [start_ns, waited_ns, end_ns, code]


def test_summary_of_a_known_trace():
    base = 5_000_000  # the launch's first valid start, in ns
    trace = torch.tensor([
        row(base, base, base + 10_000, 0, True, 0),  # stream items: 0-10, 2-12, 4-20 us
        row(base + 2_000, base + 2_000, base + 12_000, 0, True, 1),
        row(base + 4_000, base + 4_000, base + 20_000, 0, True, 1),
        row(base + 1_000, base + 9_000, base + 25_000, 2, True, 2),  # emit items: waited 8 / 4 us, 1-25 and 12-30
        row(base + 12_000, base + 16_000, base + 30_000, 2, True, 0),
        row(base - 50_000, base - 50_000, base + 90_000, 0, False, 7),  # lag padding: ignored but counted
        row(base + 3_000, base + 3_000, base + 3_100, 2, True, 131, direct=True),  # a greedy request's emit item
    ], dtype=torch.int64)
    summary = tool.summarize(trace, points=3)  # instants 0, 10, 20 us
    assert summary["total_us"] == 30.0 and summary["sms"] == 4 and summary["padding"] == 1
    stream, emit = summary["stages"]["stream"], summary["stages"]["emit"]
    assert stream["n"] == 3 and stream["start"] == (0.0, 2.0, 4.0) and stream["end"] == (10.0, 12.0, 20.0)
    assert stream["duration"] == (10.0, 16.0) and stream["wait_median"] == 0.0
    assert stream["active"] == [1, 2, 0]  # at 0 us: the first only; at 10: the 2nd and 3rd; at 20: none
    assert emit["n"] == 2 and emit["wait_median"] == 6.0 and emit["duration"] == (21.0, 24.0)  # (median of 18, 24)
    assert emit["active"] == [0, 1, 2]
    idle = summary["stages"]["emit (no work)"]  # apart: its zero wait and 0.1 us would pull the emit medians down
    assert idle["n"] == 1 and idle["duration"] == pytest.approx((0.1, 0.1)) and idle["active"] == [0, 0, 0]
    assert "mass" not in summary["stages"]
    text = tool.format_summary("rows 1 stream", summary)
    assert text.startswith("rows 1 stream: total 30.0 us on 4 SMs, 1 programs not valid")
    assert "active at tenths 1 2 0" in text
    assert summary["sm_load"] == {1: (1, 10.0), 2: (1, 20.0)}  # SM 0 ran one stream item (to 10 us), SM 1 two
    assert ("stream items per SM: 1 on 1 SMs (their last end med 10.0 us), "
            "2 on 1 SMs (their last end med 20.0 us)") in text
    assert "stream: pair" not in summary["stages"]  # kinds only with a bonus row


def test_stream_items_by_kind_and_sm_load():
    base = 1_000_000
    trace = torch.tensor([
        row(base, base, base + 10_000, 0, True, 0, item_row=0),  # a pair (target and cache row 0)
        row(base, base, base + 14_000, 0, True, 0, item_row=4),  # a pair of row 4
        row(base, base, base + 6_000, 0, True, 1, item_row=5),  # the bonus row (K = 5)
        row(base, base, base + 30_000, 0, True, 2, direct=True, item_row=3, request=1),  # greedy request 1's argmax
        row(base, base, base + 2_000, 2, True, 1, direct=True),  # its emit item (no work): not a stream item
    ], dtype=torch.int64)
    summary = tool.summarize(trace, points=2, bonus_row=5)
    stages = summary["stages"]
    assert stages["stream"]["n"] == 4 and stages["stream: pair"]["n"] == 2
    assert stages["stream: pair"]["end"] == (10.0, 12.0, 14.0)
    assert stages["stream: bonus row"]["n"] == 1 and stages["stream: bonus row"]["duration"] == (6.0, 6.0)
    assert stages["stream: greedy"]["n"] == 1 and stages["stream: greedy"]["end"] == (30.0, 30.0, 30.0)
    assert summary["sm_load"] == {1: (2, 18.0), 2: (1, 14.0)}  # SMs 1 and 2 ran one (ends 6, 30), SM 0 two
    # request 0: ends 10, 14, 6 (spread 8, ready at 14); request 1: one item ending at 30 (spread 0)
    assert summary["requests"] == {"n": 2, "spread": (4.0, 8.0), "ready": (22.0, 30.0)}
    assert "requests (2): stream ends spread med 4.0 / max 8.0 us, last stream end (ready) med 22.0 / max 30.0 us" in (
        tool.format_summary("rows 2 stream", summary))


def test_summary_refuses_a_wrong_shape_and_reports_an_empty_launch():
    with pytest.raises(ValueError, match="trace"):
        tool.summarize(torch.zeros(4, 3, dtype=torch.int64))
    empty = tool.summarize(torch.zeros(4, 4, dtype=torch.int64))  # no valid program
    assert empty == {"total_us": 0.0, "sms": 0, "padding": 4, "stages": {}}


def test_options_and_arguments():
    assert tool.options("stream:t1=8+lag=4") == ("stream", {"t1": 8, "lag": 4})
    assert tool.options("raw") == ("raw", {})
    with pytest.raises(SystemExit, match="variants"):
        tool.options("block")
    assert tool.parse(["16", "--variants", "stream,raw", "--vocab", "300"]) == ([16], ["stream", "raw"], "random", 300)
    with pytest.raises(SystemExit, match="inputs"):
        tool.parse(["--inputs", "flat"])


def test_one_traced_launch_runs_in_the_interpreter(capsys):
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter run is the CPU's; on a GPU the tool times the real shapes")
    from dspark_markov.verify.triton_verify_stream import StreamVerifier

    tool.main(["2", "--vocab", "300", "--variants", "stream,raw"])
    out = capsys.readouterr().out
    assert "rows 2 stream (mean emitted" in out and "rows 2 raw (mean emitted" in out
    items = 2 * 6 * StreamVerifier(2, 5, 300, "cpu").layout(2).c1  # every stream item of the launch is traced
    assert out.count(f"{'stream':14s} n={items:5d}") == 2, out
    greedy = 6 * StreamVerifier(2, 5, 300, "cpu").layout(2).c1  # request 0 (T = 0): its six rows' argmax items
    assert out.count(f"stream: greedy n={greedy:5d}") == 2 and out.count("stream: bonus row") == 2, out
    assert out.count("stream items per SM") == 2 and out.count("requests (2): stream ends spread") == 2, out
    assert out.count("emit (no work)") == 2, out  # request 0 is greedy (T = 0): its emit items do no work
