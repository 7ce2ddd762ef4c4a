"""compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over one small call of every GPU kernel.

The calls: every draft design of the backend registry that runs on CUDA (each of its methods, and a
reduced draft vocabulary where the design takes one), every top-k drafting design, so a new design
is covered as soon as it is registered; verification (``verify_drafts(impl="triton")``,
standard and block, and a persistent ``StreamVerifier`` as DSparkStep holds it); top-k/top-p
(per-row and scalar ``k``/``p``, one-program-per-row and split-row layouts); block inputs.
Shapes are small (V = 4096, rank 256, N = 2, 2 rows) so that the four tools fit in a short GPU job.

Modes::

    python3 tools/sanitize.py --dry-run                 # list the calls and the commands (no GPU)
    python3 tools/sanitize.py --one-call all            # run every call once (what each tool runs)
    python3 tools/sanitize.py --one-call chain/gumbel   # one call
    python3 tools/sanitize.py --run --out DIR           # warm the Triton cache, then each tool in turn
        # = compute-sanitizer --tool T python3 tools/sanitize.py --one-call all, per tool;
        #   writes DIR/<tool>.log and DIR/summary.txt (tool, status, errors, seconds, calls)
    python3 tools/sanitize.py --run --tools racecheck --no-warmup --out DIR
        # one tool, the cache already warm: one such process per tool runs the four side by side

``--device cpu`` runs the calls in Triton's interpreter (``TRITON_INTERPRET=1``, tiny V): the CPU
test of this script. Persistent kernels get a short bounded spin (a barrier timeout under a tool's
serialisation is reported as such, not as a hang).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the calls
def _draft_calls(device):
    from dspark_markov import registry

    calls, native = [], []
    for impl in registry.names("draft"):
        if impl == "auto":
            continue
        try:
            cls = registry.load("draft", impl)
        except ValueError as error:
            calls.append((f"{impl}", None, f"not importable here: {error}"))
            continue
        if device.type not in cls.DEVICES or (impl == "reference"):
            continue
        # CUDA-only designs (CUDA C++ through NVRTC) compile in every process (no Triton disk
        # cache): they run last, so that a tool's time limit never hides the Triton kernels.
        target = native if "cpu" not in cls.DEVICES else calls
        opt_in = getattr(cls, "opt_in_reason", None)  # a design not yet run on a GPU runs only when opted in
        reason = opt_in() if opt_in is not None else None
        for method in cls.METHODS:
            target.append((f"{impl}/{method}", None if reason else ("draft", impl, method), reason))
        if getattr(cls, "D2T", False) and "gumbel" in cls.METHODS:  # a reduced draft vocabulary (issue 17)
            target.append((f"{impl}/d2t", ("draft_d2t", impl, "gumbel"), None))
    for impl in registry.names("draft_top_k") if "draft_top_k" in registry.REGISTRY else ():
        if impl in ("auto", "reference"):
            continue
        cls = registry.load("draft_top_k", impl)
        if device.type in cls.DEVICES:
            calls.append((f"draft_top_k/{impl}", ("draft_top_k", impl, "gumbel"), None))
            if getattr(cls, "D2T", False):
                calls.append((f"draft_top_k/{impl}/d2t", ("draft_top_k_d2t", impl, "gumbel"), None))
    return calls, native


def list_calls(device):
    """``(name, spec, skip_reason)`` of every call, in order (CUDA-only draft designs last)."""
    calls, native = _draft_calls(device)
    calls += [("verify/standard", ("verify", "standard"), None), ("verify/block", ("verify", "block"), None),
              ("verifier/standard", ("verifier", "standard"), None),
              ("top_k_top_p/per-row", ("filter", "row"), None), ("top_k_top_p/scalar", ("filter", "scalar"), None),
              ("top_k_top_p/split-rows", ("filter", "split"), None),
              ("prepare_block_inputs", ("block",), None)]
    return calls + native


def _problem(device, vocab, rank, rows=2, steps=2, slots=4):
    import torch

    import dspark_markov as dm

    g = torch.Generator().manual_seed(0)
    head = dm.MarkovHead((torch.randn(vocab, rank, generator=g) * 0.1).bfloat16().to(device),
                         (torch.randn(vocab, rank, generator=g) * 0.1).bfloat16().to(device))
    base = torch.randn(rows, steps, vocab, generator=g).bfloat16().to(device)
    anchor = torch.randint(0, vocab, (rows,), generator=g).to(device)
    idx = torch.tensor([1, -1] * (rows // 2) + [0] * (rows % 2)).repeat_interleave(steps).to(device)
    idx[: steps] = 1  # row 0 on slot 1, row 1 padding
    positions = torch.randint(1, 1000, (rows * steps,), generator=g).to(device)
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.0][:slots]).to(device)
    seeds = torch.arange(slots, dtype=torch.int64, device=device) * 7919
    return head, [base, anchor, idx, positions, temperature, seeds]


def run_call(spec, device, vocab, rank):
    """One call of the kernel(s) of ``spec``; synchronises; returns a short note."""
    import torch

    import dspark_markov as dm

    kind = spec[0]
    if kind in ("draft", "draft_d2t", "draft_top_k", "draft_top_k_d2t"):
        _, impl, method = spec
        head, args = _problem(device, vocab, rank)
        options = {}
        if kind in ("draft_d2t", "draft_top_k_d2t"):  # the head's rows are a draft vocabulary of V - 96 ids spread over V targets
            g = torch.Generator().manual_seed(3)
            draft = vocab - 96
            targets = torch.sort(torch.randperm(vocab, generator=g)[:draft]).values
            head = dm.MarkovHead(head.embed_weight, head.head_weight[:draft].contiguous(),
                                 d2t=(targets - torch.arange(draft)).to(device))
            args[0] = args[0][..., :draft].contiguous()
        if kind in ("draft_top_k", "draft_top_k_d2t"):
            options["draft_top_k"] = 8
        sampler = dm.MarkovSampler(head, 2, 2, cache_dtype=torch.bfloat16, method=method, impl=impl, **options)
        backend = sampler.backend
        if hasattr(backend, "spin_limit"):
            backend.spin_limit = 1 << 14  # bounded even when a tool serialises the programs
        try:
            out = sampler.sample(*args)
        except dm.DeviceStatusError as error:
            return f"device status raised under this run: {str(error)[:80]}"
        torch.cuda.synchronize() if device.type == "cuda" else None
        return f"tokens {out.draft_tokens.flatten().tolist()}"
    if kind in ("verify", "verifier"):
        method = spec[1]
        head, args = _problem(device, vocab, rank)
        drafts = dm.sample_drafts(head, *args, impl="reference")
        batch, k = 2, 2
        g = torch.Generator().manual_seed(1)
        target = (torch.randn(batch, k + 1, vocab, generator=g)).to(device)
        num_drafts = torch.tensor([2, 1], device=device)
        req_slots = args[2].view(2, 2)[:, 0].contiguous()
        req_pos = args[3].view(2, 2)[:, 0].contiguous()
        if kind == "verify":
            out = dm.verify_drafts(target, drafts.draft_tokens, drafts.logits_cache, num_drafts, req_slots, req_pos,
                                   args[4], args[5], method=method, impl="triton")
            tokens = out.tokens
        else:
            from dspark_markov.verify.triton_verify_stream import StreamVerifier

            verifier = StreamVerifier(batch, k, vocab, device)  # the persistent verifier DSparkStep builds
            tokens, _ = verifier.run(target, drafts.draft_tokens, drafts.logits_cache, num_drafts, req_slots, req_pos,
                                     args[4], args[5], method=method)
        torch.cuda.synchronize() if device.type == "cuda" else None
        return f"tokens {tokens.flatten().tolist()}"
    if kind == "filter":
        layout = spec[1]
        g = torch.Generator().manual_seed(2)
        rows = 3
        logits = torch.randn(rows, vocab, generator=g).to(device)
        if layout == "scalar":
            dm.top_k_top_p(logits, 50, 0.9, impl="triton")
        elif layout == "row":
            k = torch.tensor([5, 0, 100], device=device)
            p = torch.tensor([0.9, 0.5, 1.0], device=device)
            dm.top_k_top_p(logits, k, p, impl="triton")
        else:
            from dspark_markov.verify import triton_filtering

            k = torch.tensor([5, 0, 100], device=device)
            p = torch.tensor([0.9, 0.5, 1.0], device=device)
            triton_filtering.launch_top_k_top_p(logits, k, p, logits, block=1024 if device.type == "cuda" else 128,
                                                chunks=3)
        torch.cuda.synchronize() if device.type == "cuda" else None
        return f"kept {int((logits > float('-inf')).sum())}"
    if kind == "block":
        reqs, steps = 3, 2
        z = lambda n, dtype=torch.int64: torch.zeros(n, dtype=dtype, device=device)  # noqa: E731
        input_ids, positions, is_padding = z(reqs * (steps + 1)), z(reqs * (steps + 1)), z(reqs * (steps + 1), torch.bool)
        sample_pos, sample_idx = z(reqs * steps), z(reqs * steps)
        dm.prepare_block_inputs(torch.tensor([5, 9], device=device), torch.tensor([3, 4], device=device),
                                torch.tensor([0, 2], device=device), num_steps=steps, mask_token_id=7,
                                max_model_len=100, input_ids=input_ids, positions=positions, sample_pos=sample_pos,
                                sample_idx_mapping=sample_idx, is_padding=is_padding, impl="triton")
        torch.cuda.synchronize() if device.type == "cuda" else None
        return f"input_ids {input_ids.tolist()}"
    raise ValueError(f"spec: unknown call {spec!r}")


def one_call(which, device, vocab, rank, skip=()) -> int:
    """Run ``which`` (a call name or ``all``) except ``skip``; print one line per call; 1 if a call raised."""
    import torch

    device = torch.device(device)
    failed = 0
    for name, spec, reason in list_calls(device):
        if (which != "all" and name != which) or name in skip or name.split("/")[0] in skip:
            continue
        if spec is None:
            print(f"call {name}: skipped ({reason})", flush=True)
            continue
        began = time.perf_counter()
        try:
            note = run_call(spec, device, vocab, rank)
            print(f"call {name}: ok in {time.perf_counter() - began:.2f} s ({note[:100]})", flush=True)
        except Exception as error:  # noqa: BLE001 - report every call, keep going
            failed += 1
            print(f"call {name}: RAISED {type(error).__name__}: {str(error)[:200]}", flush=True)
    return 1 if failed else 0


# --------------------------------------------------------------------------- the tools
def tool_command(tool, extra=()):
    return ["compute-sanitizer", "--tool", tool, "--print-limit", "30", sys.executable, str(Path(__file__).resolve()),
            "--one-call", "all", *extra]


def parse_log(tool: str, text: str) -> dict:
    """Errors reported by one compute-sanitizer run, and the kernels they name."""
    errors = None
    match = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if match:
        errors = int(match.group(1))
    match = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    if match:
        errors = int(match.group(2))
        warnings = int(match.group(3))
    else:
        warnings = None
    kernels = sorted(set(re.findall(r"(?:in|kernel) (_\w+|\w+_kernel\w*)", text)))
    calls_ok = len(re.findall(r"^call .*: ok", text, flags=re.M))
    calls_raised = len(re.findall(r"^call .*: RAISED", text, flags=re.M))
    return {"tool": tool, "errors": errors, "warnings": warnings, "kernels": kernels[:12], "calls_ok": calls_ok,
            "calls_raised": calls_raised}


def _run(command, timeout):
    """``(output, returncode or 'timeout')`` of a bounded subprocess (partial output on a timeout).

    The command runs in its own process group, killed whole on a timeout, so that the python
    process under compute-sanitizer is not left behind.
    """
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
    except FileNotFoundError as error:
        return f"cannot run {command[0]}: {error}", "missing"
    try:
        text, _ = process.communicate(timeout=timeout)
        return text, process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        text, _ = process.communicate()
        return text, "timeout"


def run_tools(out_dir: Path, tools, timeout: float, extra=(), warmup_timeout: float | None = None,
              warmup: bool = True) -> int:
    """Each tool over ``--one-call all`` in turn, after a warm-up without a tool (``warmup=False``: the
    caller warmed Triton's disk cache already, e.g. before starting one process per tool)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    if warmup:
        began = time.perf_counter()
        text, rc = _run([sys.executable, str(Path(__file__).resolve()), "--one-call", "all", *extra],
                        warmup_timeout or 2 * timeout)
        (out_dir / "warmup.log").write_text(text)
        lines.append(f"warm-up (no tool, compiles the kernels): rc {rc}, {time.perf_counter() - began:.1f} s")
        lines += ["  " + line for line in text.splitlines() if line.startswith("call ")]
    (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")  # rewritten after every tool
    worst = 0
    for tool in tools:
        began = time.perf_counter()
        text, rc = _run(tool_command(tool, extra), timeout)
        seconds = time.perf_counter() - began
        (out_dir / f"{tool}.log").write_text(text)
        info = parse_log(tool, text)
        status = "clean" if info["errors"] == 0 and info["calls_raised"] == 0 and rc == 0 else "NOT CLEAN"
        if rc == "timeout":
            status = f"TIMEOUT after {timeout:.0f} s (partial)"
        elif rc == "missing":
            status = "NOT RUN (no compute-sanitizer)"
        if status != "clean":
            worst = 1
        lines.append(f"{tool:<10} {status:<12} rc {rc}, errors {info['errors']}, "
                     f"warnings {info['warnings']}, calls ok {info['calls_ok']}, raised {info['calls_raised']}, "
                     f"{seconds:.1f} s" + (f"; kernels named: {', '.join(info['kernels'])}" if info["kernels"] and
                                            info["errors"] else ""))
        if rc == "timeout":
            done = [line.split(":")[0][5:] for line in text.splitlines() if line.startswith("call ")]
            lines.append(f"           completed before the limit: {', '.join(done) or 'none'}")
        (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")
    summary = "\n".join(lines) + "\n"
    (out_dir / "summary.txt").write_text(summary)
    print(summary)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="list the calls and the commands, run nothing")
    mode.add_argument("--one-call", metavar="NAME", help="run one call (or 'all') in this process")
    mode.add_argument("--run", action="store_true", help="warm up, then run every tool; write --out")
    parser.add_argument("--out", default="sanitize_out", help="folder of the logs and summary.txt (--run)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per tool run (--run)")
    parser.add_argument("--warmup-timeout", type=float, default=None, help="seconds of the warm-up (default 2x)")
    parser.add_argument("--no-warmup", action="store_true", help="--run without the warm-up (the cache is warm)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the interpreter, tiny V")
    parser.add_argument("--vocab", type=int, default=None, help="V (default 4096; cpu 300)")
    parser.add_argument("--rank", type=int, default=None, help="R_k (default 256; cpu 16)")
    parser.add_argument("--skip", default="", help="comma-separated calls or designs to leave out (e.g. cuda_chain)")
    args = parser.parse_args(argv)
    vocab = args.vocab or (4096 if args.device == "cuda" else 300)
    rank = args.rank or (256 if args.device == "cuda" else 16)
    tools = [t for t in args.tools.split(",") if t]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        print(f"sanitize: --tools: unknown tool(s) {', '.join(bad)}; expected {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if args.dry_run:
        for name, spec, skip in list_calls(torch.device(args.device)):
            print(f"call {name}" + (f"  (skipped: {skip})" if spec is None else ""))
        for tool in tools:
            print("would run: " + shlex.join(tool_command(tool)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sanitize: needs a CUDA GPU (none found); --dry-run lists the calls, --device cpu runs them in the "
              "interpreter", file=sys.stderr)
        return 2
    skip = tuple(name for name in args.skip.split(",") if name)
    extra = ["--device", args.device, "--vocab", str(vocab), "--rank", str(rank)] + (["--skip", args.skip] if skip else [])
    if args.one_call:
        return one_call(args.one_call, args.device, vocab, rank, skip)
    return run_tools(Path(args.out), tools, args.timeout, extra, args.warmup_timeout, not args.no_warmup)


if __name__ == "__main__":
    sys.exit(main())
