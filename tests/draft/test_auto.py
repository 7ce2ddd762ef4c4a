"""``impl="auto"``: the measured table and per-call dispatch."""

import pytest
import torch

import dspark_markov as dm
from dspark_markov.draft import auto


def test_cpu_auto_is_the_reference():
    for rows in (1, 5, 300):
        assert auto.choose("gumbel", torch.bfloat16, rows, torch.device("cpu")) == "reference"


@pytest.mark.parametrize("table", ["AUTO_TABLE", "PORTABLE_TABLE"])
@pytest.mark.parametrize("key", sorted(auto.AUTO_TABLE, key=str))
def test_table_buckets_are_increasing_and_cover_every_batch(key, table):
    from dspark_markov.registry import NATIVE_DESIGNS

    buckets = getattr(auto, table)[key]
    if table == "PORTABLE_TABLE":
        assert not {impl for _, impl in buckets} & set(NATIVE_DESIGNS)
    limits = [limit for limit, _ in buckets[:-1]]
    assert limits == sorted(limits) and buckets[-1][0] is None
    method = key[0]
    for _, impl in buckets:
        from dspark_markov import registry

        assert method in registry.load("draft", impl).METHODS


@pytest.mark.parametrize("native", [True, False], ids=["native designs available", "native designs unavailable"])
def test_cuda_choices_follow_the_table(monkeypatch, native):
    cuda = torch.device("cuda")
    why_not = None if native else "no NVRTC"
    monkeypatch.setattr(auto, "_UNAVAILABLE", {("cuda_chain", "cuda", None): why_not,
                                               ("cuda_gumbel", "cuda", None): why_not})
    small = "cuda_chain" if native else "chain"
    large = "cuda_gumbel" if native else "gumbel_fused"
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda) == small
    assert auto.choose("gumbel", torch.bfloat16, 4, cuda) == ("cuda_chain" if native else "gumbel_fused")
    assert auto.choose("gumbel", torch.bfloat16, 16, cuda) == ("cuda_chain" if native else "fused")
    assert auto.choose("gumbel", torch.bfloat16, 32, cuda) == "fused"
    assert auto.choose("gumbel", torch.bfloat16, 64, cuda) == ("cuda_gumbel" if native else "fused")
    assert auto.choose("gumbel", torch.bfloat16, 253, cuda) == large
    assert auto.choose("gumbel", torch.float32, 1, cuda) == small
    assert auto.choose("gumbel", torch.float32, 16, cuda) == "fused"
    assert auto.choose("gumbel", torch.float32, 64, cuda) == large
    assert auto.choose("inverse_cdf", torch.bfloat16, 8, cuda) == "fused"
    assert auto.choose("inverse_cdf", torch.bfloat16, 64, cuda) == "wide"
    assert auto.choose("inverse_cdf", torch.bfloat16, 253, cuda) == "inverse_cdf"
    assert auto.choose("inverse_cdf", torch.float32, 8, cuda) == "inverse_cdf"


def test_heads_the_native_designs_cannot_take_get_the_portable_designs(monkeypatch):
    # the native designs draft from bf16 weights (cuda_chain and cuda_wide of rank 256 only): an fp32 head or
    # another rank gets the portable table's design instead of a constructor error
    cuda = torch.device("cuda")
    monkeypatch.setattr(auto, "_UNAVAILABLE", {("cuda_chain", "cuda", None): None, ("cuda_gumbel", "cuda", None): None})

    def head(dtype, rank):
        return dm.MarkovHead(torch.zeros(300, rank, dtype=dtype), torch.zeros(300, rank, dtype=dtype))

    bf16 = head(torch.bfloat16, 256)
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda, bf16) == "cuda_chain"
    assert auto.choose("gumbel", torch.bfloat16, 253, cuda, bf16) == "cuda_gumbel"
    for other in (head(torch.float32, 256), head(torch.bfloat16, 16)):
        expected_large = "cuda_gumbel" if other.dtype == torch.bfloat16 else "gumbel_fused"  # any rank
        assert auto.choose("gumbel", torch.bfloat16, 1, cuda, other) == "chain"
        assert auto.choose("gumbel", torch.bfloat16, 16, cuda, other) == "fused"
        assert auto.choose("gumbel", torch.bfloat16, 253, cuda, other) == expected_large
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda) == "cuda_chain"  # no head given: the table alone
    # the sentence the designs' constructors raise (after "head_weight: ")
    from dspark_markov import registry

    chain = registry.load("draft", "cuda_chain")
    assert chain.head_reason(head(torch.float32, 256)) == "impl 'cuda_chain' needs bf16 weights, got torch.float32"
    assert chain.head_reason(head(torch.bfloat16, 16)) == "impl 'cuda_chain' needs rank 256, got 16"
    assert registry.load("draft", "cuda_gumbel").head_reason(head(torch.bfloat16, 16)) is None
    # cuda_chain takes up to 32 steps: more get the portable design (cuda_gumbel has no such bound)
    assert chain.head_reason(bf16, 33) == "impl 'cuda_chain' takes 1 to 32 steps, got 33"
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda, bf16, num_steps=33) == "chain"
    assert auto.choose("gumbel", torch.bfloat16, 1, cuda, bf16, num_steps=5) == "cuda_chain"
    assert auto.choose("gumbel", torch.bfloat16, 253, cuda, bf16, num_steps=33) == "cuda_gumbel"


def test_committed_results_give_the_table():
    """AUTO_TABLE and PORTABLE_TABLE are what table_from_results derives from the committed H200 results."""
    import json
    from pathlib import Path

    from dspark_markov.registry import NATIVE_DESIGNS

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

    def load(name):
        return json.loads((results / f"NVIDIA-H200_{name}.json").read_text())["results"]

    # The full runs of 2026-12-02, updated by the later partial run of the large-batch Gumbel designs.
    for names, key, method in (
            (("2026-12-02_bf16", "2026-12-04_large4_bf16"), ("gumbel", torch.bfloat16), "gumbel"),
            (("2026-12-02_fp32_fp32-logits", "2026-12-04_large4_fp32_fp32-logits"), ("gumbel", torch.float32),
             "gumbel"),
            (("2026-12-02_bf16_inverse_cdf",), ("inverse_cdf", torch.bfloat16), "inverse_cdf"),
            (("2026-12-02_fp32_fp32-logits", "2026-12-04_large4_fp32_fp32-logits"), ("inverse_cdf", torch.float32),
             "inverse_cdf")):
        records = auto.merge_results(*(load(name) for name in names))
        name = " + ".join(names)
        assert auto.table_from_results(records, method) == auto.AUTO_TABLE[key], name
        assert auto.table_from_results(records, method, exclude=NATIVE_DESIGNS) == auto.PORTABLE_TABLE[key], name


def test_auto_sampler_on_cpu_matches_reference():
    gen = torch.Generator().manual_seed(0)
    head = dm.MarkovHead(torch.randn(50, 8, generator=gen), torch.randn(40, 8, generator=gen))
    base = torch.randn(3, 2, 40, generator=gen)
    args = (base, torch.tensor([1, 2, 3]), torch.arange(3).repeat_interleave(2), torch.arange(6) + 5,
            torch.tensor([1.0, 0.0, 0.6]), torch.tensor([3, 4, 5]))
    sampler = dm.MarkovSampler(head, 2, 4, impl="auto")
    assert set(sampler.backend.backends) == {"reference"}
    got = sampler.sample(*args)
    want = dm.sample_drafts(head, *args)
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert torch.equal(got.logits_cache, want.logits_cache)


def _record(design, rows, temperature, time_us, method="gumbel", status="ok"):
    return dict(design=design, method=method, rows=rows, temperature=temperature, status=status, time_us=time_us)


def test_table_from_results_picks_the_fastest_per_size_with_a_margin():
    records = [
        _record("loop", 1, "1", 200.0), _record("chain", 1, "1", 130.0), _record("fused", 1, "1", 150.0),
        _record("loop", 1, "mixed", 190.0), _record("chain", 1, "mixed", 140.0), _record("fused", 1, "mixed", 150.0),
        # 4 rows: chain within the 2% margin of loop's incumbent? no: fused is 10% faster than chain
        _record("loop", 4, "1", 220.0), _record("chain", 4, "1", 160.0), _record("fused", 4, "1", 144.0),
        # 16 rows: fused 1% faster than chain only: the earlier design (chain) keeps it
        _record("loop", 16, "1", 300.0), _record("chain", 16, "1", 170.0), _record("fused", 16, "1", 168.5),
        # 64 rows: chain cannot run (n/a), fused wins; inverse_cdf records are another method
        _record("chain", 64, "1", None, status="n/a"), _record("fused", 64, "1", 300.0),
        _record("loop", 64, "1", 500.0), _record("inverse_cdf", 64, "1", 100.0, method="inverse_cdf"),
        _record("loop", 253, "1", 1600.0), _record("fused", 253, "1", 1700.0),
    ]
    table = auto.table_from_results(records, "gumbel")
    assert table == ((1, "chain"), (4, "fused"), (16, "chain"), (64, "fused"), (None, "loop"))
    assert auto.table_from_results(records, "inverse_cdf") == ((None, "inverse_cdf"),)
    with pytest.raises(ValueError, match="records"):
        auto.table_from_results(records, "nope")


def test_a_design_not_run_on_a_gpu_never_enters_a_table():
    from dspark_markov import registry

    assert "cuda_wide" in registry.OPT_IN_DESIGNS
    records = [_record("loop", 64, "1", 500.0), _record("cuda_wide", 64, "1", 100.0),
               _record("cuda_wide", 64, "1", 90.0, method="inverse_cdf"), _record("inverse_cdf", 64, "1", 300.0,
                                                                                  method="inverse_cdf")]
    assert auto.table_from_results(records, "gumbel") == ((None, "loop"),)
    assert auto.table_from_results(records, "inverse_cdf") == ((None, "inverse_cdf"),)


def test_merge_results_lets_a_later_run_replace_a_design_and_keeps_the_order():
    def record(design, rows, time_us, temperature="1"):
        return {"design": design, "method": "gumbel", "rows": rows, "temperature": temperature, "status": "ok",
                "time_us": time_us}

    full = [record("fused", 64, 300.0), record("gumbel_fused", 64, 310.0), record("fused", 253, 900.0)]
    later = [record("gumbel_fused", 64, 200.0), record("cuda_gumbel", 64, 250.0)]
    merged = auto.merge_results(full, later)
    assert [(r["design"], r["rows"], r["time_us"]) for r in merged] == [
        ("fused", 64, 300.0), ("gumbel_fused", 64, 200.0), ("fused", 253, 900.0), ("cuda_gumbel", 64, 250.0)]
    reversed_order = {r["design"]: r["time_us"] for r in auto.merge_results(later, full) if r["rows"] == 64}
    assert reversed_order["gumbel_fused"] == 310.0  # the last run given wins
    assert full[1]["time_us"] == 310.0  # the inputs are not modified


def test_an_unavailable_native_design_falls_back_to_the_portable_table(monkeypatch):
    """Where the measured fastest design is CUDA C++ that cannot run here, auto runs the portable choice."""
    key = ("gumbel", torch.bfloat16)
    monkeypatch.setitem(auto.AUTO_TABLE, key, ((16, "cuda_chain"), (None, "fused")))
    monkeypatch.setitem(auto.PORTABLE_TABLE, key, ((1, "chain"), (None, "fused")))
    cuda = torch.device("cuda")
    monkeypatch.setattr(auto, "_UNAVAILABLE", {("cuda_chain", "cuda", None): "no NVRTC library"})
    assert [auto.choose("gumbel", torch.bfloat16, rows, cuda) for rows in (1, 8, 64)] == ["chain", "fused", "fused"]
    monkeypatch.setattr(auto, "_UNAVAILABLE", {("cuda_chain", "cuda", None): None})
    assert [auto.choose("gumbel", torch.bfloat16, rows, cuda) for rows in (1, 8, 64)] == ["cuda_chain"] * 2 + ["fused"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="names the reason on a machine without a CUDA GPU")
def test_unavailable_asks_the_design_once_and_names_the_reason():
    cpu = torch.device("cpu")
    reason = auto.unavailable("cuda_chain", cpu)
    assert reason is not None and "no CUDA GPU" in reason
    assert auto._UNAVAILABLE[("cuda_chain", "cpu", None)] == reason  # asked once, then remembered
    assert auto.unavailable("fused", cpu) is None  # Triton designs have no extra requirement


def test_a_max_rows_up_to_2_31_builds_the_dispatcher_at_once(monkeypatch):
    """``max_rows`` may be any int up to 2^31 - 1: the dispatcher asked ``choose`` once per row up to it (a 2^31-entry
    list: minutes and ~17 GB before anything ran). Past the tables' largest bucket limit every batch gets one design,
    so it asks up to there and dispatches larger batches to that design."""
    calls = []
    choose = auto.choose

    def counted(*args, **kwargs):
        calls.append(args[2])
        assert len(calls) < 1000, "choose() asked once per row up to max_rows"
        return choose(*args, **kwargs)

    monkeypatch.setattr(auto, "choose", counted)
    head = dm.MarkovHead(torch.randn(300, 16), torch.randn(300, 16))
    backend = auto.AutoBackend(head, 2, 2**31 - 1, method="gumbel", cache_dtype=torch.bfloat16, device="cpu")
    assert max(calls) <= 1 + max(limit for table in (*auto.AUTO_TABLE.values(), *auto.PORTABLE_TABLE.values())
                                 for limit, _ in table if limit is not None)
    assert backend.choice(1) == backend.choice(2**31 - 1) == "reference"
    for rows in (0, 2**31):
        with pytest.raises(ValueError, match=r"^rows: this dispatcher takes 1 to 2147483647 rows"):
            backend.choice(rows)
