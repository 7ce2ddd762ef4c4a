"""``impl="auto"``: the fastest measured design per batch size, chosen at every call.

The table below comes from ``benchmarks/results/NVIDIA-H200_2026-12-02_*.json``, updated by the
later ``NVIDIA-H200_2026-12-04_large4_*.json`` runs (:func:`merge_results`; CUDA graph, cold L2,
V = 129,280, rank 256, N = 5). For each method and cache dtype it lists
``(largest batch, impl)`` buckets in increasing order. :class:`AutoBackend` builds one backend per
impl that a batch up to ``max_rows`` can use, at construction, so that switching between them by
the call's batch size allocates nothing and stays CUDA-graph safe (capture one graph per batch
size, as engines do). On the CPU, ``auto`` is the reference: Triton's interpreter is for tests (the meaning of ``"auto"``
everywhere: :mod:`dspark_markov.registry`).
"""

from __future__ import annotations

import torch

from .. import registry

# (max rows, impl) buckets; the last bucket takes every larger batch. Derived with tools/auto_table.py
# (table_from_results) from benchmarks/results/NVIDIA-H200_2026-12-02_{bf16,bf16_inverse_cdf,
# fp32_fp32-logits}.json merged with NVIDIA-H200_2026-12-04_large4_{bf16,fp32_fp32-logits}.json
# (merge_results: the later run's designs replace their earlier figures; T = 1 and mixed, means over both).
AUTO_TABLE = {
    # bf16: cuda_chain 83/80 us at 1 row, 90 at 2, 97 at 4, 104/107 at 8, 142/149 at 16 (chain 132-181,
    # gumbel_fused 136-207, fused 157-165); fused 213-215 at 32 and 345-346 at 64 (gumbel_fused 235-250,
    # 340-375); gumbel_fused 559-631 at 128 and 977-1128 at 253 (fused 659, 1254; wide 851-936, 1531-1543).
    # 2026-12-04 (..._large4_bf16.json, measured later, replaces those designs' 32-253-row figures):
    # cuda_gumbel 254/248 at 32 (fused 216/214), 304/299 at 64 (fused 349/347), 469/464 at 128
    # (gumbel_fused 637/563) and 743/742 at 253 (gumbel_fused 1128/978).
    ("gumbel", torch.bfloat16): ((16, "cuda_chain"), (32, "fused"), (None, "cuda_gumbel")),
    # fp32 cache (fp32 logits): cuda_chain 82 at 1 row (chain 128); fused 174 at 16 (chain 172 and
    # cuda_chain 172, within the 2% margin); gumbel_fused 379 at 64 and 1131 at 253 (fused 524, 2432).
    # 2026-12-04 (..._large4_fp32_fp32-logits.json): cuda_gumbel 350 at 64 rows (gumbel_fused 389) and
    # 781 at 253 (gumbel_fused 1131).
    ("gumbel", torch.float32): ((1, "cuda_chain"), (16, "fused"), (None, "cuda_gumbel")),
    # ..._bf16_inverse_cdf.json (T = 1 / mixed): inverse_cdf 161/151 vs fused 176/166 at 1 row; fused
    # 165-166 at 16 and 198 at 32 (inverse_cdf 198-220); wide 228/285 at 64 and 318/443 at 128 (fused
    # 267/267, 413/413; inverse_cdf 277, 400-401); inverse_cdf 643/642 at 253 (wide 544/1114: its
    # mixed-T division per logit loses on the mean).
    ("inverse_cdf", torch.bfloat16): ((1, "inverse_cdf"), (32, "fused"), (128, "wide"), (None, "inverse_cdf")),
    # fp32 cache: inverse_cdf is the only inverse-CDF design measured with it (152-696 us at 1-253 rows).
    ("inverse_cdf", torch.float32): ((None, "inverse_cdf"),),
}
# The same measurements without registry.NATIVE_DESIGNS (table_from_results(..., exclude=...)): what
# ``auto`` runs where a native design of AUTO_TABLE cannot run (no NVRTC, not sm_90). bf16: chain
# 132-134 at 1 row, gumbel_fused 146-154 at 2-4 (fused 158-163, chain 175-177); fp32: chain 128 at 1.
PORTABLE_TABLE = {
    ("gumbel", torch.bfloat16): ((1, "chain"), (4, "gumbel_fused"), (64, "fused"), (None, "gumbel_fused")),
    ("gumbel", torch.float32): ((1, "chain"), (16, "fused"), (None, "gumbel_fused")),
    ("inverse_cdf", torch.bfloat16): AUTO_TABLE[("inverse_cdf", torch.bfloat16)],
    ("inverse_cdf", torch.float32): AUTO_TABLE[("inverse_cdf", torch.float32)],
}


def merge_results(*record_lists) -> list:
    """One list of benchmark records from several runs of one cache dtype, oldest run first.

    A later run's record of the same ``(design, method, rows, temperature)`` replaces the earlier
    one (a partial benchmark of a few designs updates a full one); the order of first appearance is
    kept, so :func:`table_from_results`'s incumbent order does not change.
    """
    merged = {}
    for records in record_lists:
        for record in records:
            merged[(record["design"], record["method"], record["rows"], record["temperature"])] = record
    return list(merged.values())


def table_from_results(records, method: str, *, margin: float = 0.02, exclude=()) -> tuple:
    """``(max rows, impl)`` buckets of the fastest design per measured batch size.

    ``records``: benchmark result dicts (``design``, ``method``, ``rows``, ``temperature``,
    ``status``, ``time_us``) of one cache dtype, as in ``benchmarks/results/*.json``. A design's
    time at a batch size is its mean over the temperature modes measured for every candidate;
    a design beats the incumbent (the fastest so far, in the order of ``records``) only by more than
    ``margin`` (relative), so that noise does not split buckets. A batch between two measured sizes
    takes the choice of the larger one; the last bucket (``None``) takes every larger batch.
    Designs in ``exclude`` are left out (``PORTABLE_TABLE``: without ``registry.NATIVE_DESIGNS``), as are
    ``registry.OPT_IN_DESIGNS`` (not for default use: never run on a GPU, or slower), and so
    are baselines that are not draft implementations (``vllm_loop``).
    """
    times = {}
    for record in records:
        if (record["method"] != method or record["status"] != "ok" or record["time_us"] is None
                or record["design"] in exclude or record["design"] not in registry.REGISTRY["draft"]
                or record["design"] in registry.OPT_IN_DESIGNS):
            continue
        times.setdefault(record["rows"], {}).setdefault(record["design"], []).append(record["time_us"])
    choices = []
    for rows in sorted(times):
        means = {design: sum(values) / len(values) for design, values in times[rows].items()}
        modes = max(len(values) for values in times[rows].values())
        means = {design: mean for design, mean in means.items() if len(times[rows][design]) == modes}
        best = None
        for design, mean in means.items():
            if best is None or mean < means[best] * (1.0 - margin):
                best = design
        choices.append((rows, best))
    buckets = []
    for rows, design in choices:
        if buckets and buckets[-1][1] == design:
            buckets[-1] = (rows, design)
        else:
            buckets.append((rows, design))
    if not buckets:
        raise ValueError(f"records: no successful measurement of method {method!r}")
    buckets[-1] = (None, buckets[-1][1])
    return tuple(buckets)


def unavailable(impl: str, device) -> str | None:
    """Why ``impl`` cannot run on ``device`` (a design with a ``unavailable_reason``, such as the
    CUDA C++ ``cuda_chain`` without NVRTC or off sm_90), or ``None``; asked once per design and device."""
    device = torch.device(device)
    key = (impl, device.type, device.index)
    if key not in _UNAVAILABLE:
        why_not = getattr(registry.load("draft", impl), "unavailable_reason", None)
        _UNAVAILABLE[key] = why_not() if why_not is not None else None
    return _UNAVAILABLE[key]


_UNAVAILABLE: dict = {}


def _pick(table, rows: int) -> str:
    for limit, impl in table:
        if limit is None or rows <= limit:
            return impl
    raise AssertionError("the last bucket of every AUTO_TABLE entry takes every batch")


def choose(method: str, cache_dtype: torch.dtype, rows: int, device: torch.device, head=None,
           num_steps: int | None = None) -> str:
    """The implementation ``auto`` runs for a batch of ``rows`` rows.

    The measured fastest (``AUTO_TABLE``); where that design cannot run on this machine
    (:func:`unavailable`) or cannot draft from ``head`` for ``num_steps`` steps (the native designs
    take bf16 weights, some of rank 256 only, ``cuda_chain`` up to 32 steps: their ``head_reason``),
    the fastest measured among the portable Triton designs (``PORTABLE_TABLE``).
    """
    if torch.device(device).type != "cuda":
        return "reference"
    key = (method, cache_dtype)
    impl = _pick(AUTO_TABLE[key], rows)
    if impl not in registry.NATIVE_DESIGNS:
        return impl
    head_reason = getattr(registry.load("draft", impl), "head_reason", None)
    if unavailable(impl, device) is None and (head is None or head_reason is None
                                               or head_reason(head, num_steps) is None):
        return impl
    return _pick(PORTABLE_TABLE[key], rows)


class AutoBackend:
    """Dispatches each call to the backend of the fastest measured design for its batch size."""

    METHODS = ("gumbel", "inverse_cdf")
    DEVICES = ("cpu", "cuda")
    MAX_ROWS = None

    def __init__(self, head, num_steps, max_rows, *, method, cache_dtype, device):
        self.method = method
        self.cache_dtype = cache_dtype
        self.device = torch.device(device)
        # Each design is built for the largest batch it is chosen for, not for max_rows: a persistent
        # design sized for 16 rows runs a 1-row batch slower than one sized for the batches it gets.
        # Past the tables' largest bucket limit every batch gets one design: the choices stop there (max_rows may be
        # up to 2^31 - 1), and that design is built for max_rows.
        self.max_rows = max_rows
        last = 1 + max(limit for table in (*AUTO_TABLE.values(), *PORTABLE_TABLE.values())
                       for limit, _ in table if limit is not None)
        self.choices = [None] + [choose(method, cache_dtype, rows, self.device, head, num_steps)
                                 for rows in range(1, min(max_rows, last) + 1)]
        needed = {impl: rows for rows, impl in enumerate(self.choices) if impl is not None}
        needed[self.choices[-1]] = max_rows
        self.backends = {}
        for impl in sorted(needed):
            cls = registry.load("draft", impl)
            rows = needed[impl]
            registry.check_draft_backend(cls, impl, method=method, device=device, max_rows=rows)
            self.backends[impl] = cls(head, num_steps, rows, method=method, cache_dtype=cache_dtype, device=device)
        # One device status flag for every dispatched backend that has one (the registry's protocol).
        flagged = [backend for backend in self.backends.values() if hasattr(backend, "status")]
        if flagged:
            self.status = flagged[0].status
            for backend in flagged[1:]:
                backend.status = self.status

    @property
    def GRAPH_SAFE(self) -> bool:  # noqa: N802  (the protocol's attribute)
        """Whether every design this dispatcher may run is graph safe (on CUDA: yes; CPU: the reference)."""
        return all(registry.graph_safe("draft", impl, backend) for impl, backend in self.backends.items())

    def check(self) -> None:
        """``check()`` of every dispatched backend with a device status (raises the first failure)."""
        for backend in self.backends.values():
            check = getattr(backend, "check", None)
            if check is not None:
                check()

    def choice(self, rows: int) -> str:
        """The design that runs a batch of ``rows`` (``choose``'s answer, kept from construction: no lookup
        per call)."""
        if not 1 <= rows <= self.max_rows:  # (a design chosen for other batches was never built)
            raise ValueError(f"rows: this dispatcher takes 1 to {self.max_rows} rows, got {rows}")
        return self.choices[min(rows, len(self.choices) - 1)]

    def run(self, base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache):
        backend = self.backends[self.choice(base_logits.shape[0])]
        backend.run(base_logits, anchor, idx_mapping, positions, temperature, seeds, draft_tokens, logits_cache)
