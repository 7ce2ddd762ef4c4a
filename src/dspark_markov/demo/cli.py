"""The demo's command line (``dspark-markov demo``, ``python -m dspark_markov.demo``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from ..validate import check_triton_runs
from . import generate
from .generate import (BigramLanguage, chi_square, chi_square_verdict, fit_markov_head, pair_counts,
                       speculative_generate, zero_head)
from .step_engine import StepGenerator, marginal_backbone


# --------------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark-markov demo", description=generate.__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=128, help="vocabulary size V (default 128)")
    parser.add_argument("--rank", type=int, default=16, help="rank of the fitted Markov head (default 16)")
    parser.add_argument("--num-drafts", type=int, default=5, help="drafts per round K = N (default 5)")
    parser.add_argument("--requests", type=int, default=128, help="sequences generated in parallel (default 128)")
    parser.add_argument("--length", type=int, default=48, help="tokens generated per sequence (default 48)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature > 0 (default 1.0)")
    parser.add_argument("--period", type=int, default=3, help="period of the position component (default 3)")
    parser.add_argument("--method", choices=("standard", "block"), default="standard", help="verification method")
    parser.add_argument("--draft-method", choices=("gumbel", "inverse_cdf"), default="gumbel", help="draft sampler")
    parser.add_argument("--cache-dtype", choices=("bf16", "fp32"), default="bf16", help="draft cache dtype")
    parser.add_argument("--device", default="cpu", help="torch device (cpu or cuda)")
    parser.add_argument("--impl", default=None, help="sample_drafts impl (default: reference on CPU, auto on CUDA)")
    parser.add_argument("--engine", choices=("step", "functional"), default=None,
                        help="DSparkStep or sample_drafts/verify_drafts (default: step on CUDA, functional on CPU)")
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                        help="capture the step's draft and verify in CUDA graphs (default: on with CUDA and "
                             "--engine step)")
    parser.add_argument("--verify-impl", choices=("triton", "reference"), default=None,
                        help="step engine's verify and block-input impl (default: triton on CUDA, else reference)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the language and of the sampling keys")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _check_args(parser, args):
    for name in ("vocab", "rank", "num_drafts", "requests", "length", "period"):
        value = getattr(args, name)
        if not 1 <= value <= 2**31 - 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer below 2^31, got {value}")
    if not -(2**63) <= args.seed <= 2**63 - 1:
        parser.error(f"--seed: expected a 64-bit integer, got {args.seed}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        parser.error(f"--device: expected cpu or cuda (cuda:N), got {args.device!r}")
    if args.vocab < 2:
        parser.error(f"--vocab: expected at least 2, got {args.vocab}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        parser.error(f"--temperature: expected a finite value > 0, got {args.temperature}")
    # A lower bound of what a round holds (the fp32 target logits [requests, K + 1, V]): sizes that cannot fit are
    # refused here rather than by the allocator or the kernel's out-of-memory killer mid-run.
    need = 4 * args.requests * (args.num_drafts + 1) * args.vocab
    free = _free_memory(device)
    if free is not None and need > free:
        parser.error(f"--requests / --num-drafts / --vocab: one round's target logits alone take {need / 2**30:.1f} GiB, "
                     f"more than the {free / 2**30:.1f} GiB available on {device}")


def _free_memory(device: torch.device):
    """Bytes ``device`` can still give (CUDA: the driver's free count; CPU: Linux's MemAvailable, which counts the
    reclaimable page cache, else the free pages), or None if unknown."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0] if torch.cuda.is_available() else None
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024  # (kB)
        except OSError:
            pass
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None


def _resolve_impl(impl, device, head, num_steps, rows, cache_dtype, draft_method, quiet=False):
    """The draft impl to use; ``auto`` that cannot be resolved here falls back to the reference, loudly."""
    from ..draft.sampler import MarkovSampler

    if impl is None:
        impl = "auto" if device.type == "cuda" else "reference"
    try:
        return MarkovSampler(head, num_steps, rows, cache_dtype=cache_dtype, method=draft_method, impl=impl).impl
    except (ValueError, ImportError) as error:
        if impl != "auto":
            raise
        if not quiet:
            print(f"note: impl 'auto' is not available here ({error}); using impl 'reference'")
        return "reference"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    """Run the demo; return 0 if the Markov head accepts more and the chi-square checks pass, else 1."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device: CUDA was requested but torch sees no GPU")
    engine = args.engine or ("step" if device.type == "cuda" else "functional")
    graphs = args.graphs if args.graphs is not None else (engine == "step" and device.type == "cuda")
    if graphs and (engine != "step" or device.type != "cuda"):
        parser.error("--graphs: CUDA graphs need --engine step and --device cuda")
    verify_impl = args.verify_impl or ("triton" if device.type == "cuda" else "reference")
    if graphs and verify_impl != "triton":
        parser.error("--verify-impl: CUDA graphs need the Triton verifier")
    if engine == "functional" and args.verify_impl is not None:
        parser.error("--verify-impl: only used by --engine step")
    if engine == "step" and verify_impl == "triton":
        try:
            check_triton_runs("triton", device, name="--verify-impl")
        except ValueError as error:
            parser.error(str(error))
    cache_dtype = torch.bfloat16 if args.cache_dtype == "bf16" else torch.float32
    vocab, k, batch = args.vocab, args.num_drafts, args.requests
    started = time.time()

    try:  # a wrong or unrunnable --impl: one line and the usage-error status, before any work
        _resolve_impl(args.impl, device, zero_head(vocab, min(args.rank, vocab), device=device), k, batch,
                      cache_dtype, args.draft_method, quiet=True)
    except ValueError as error:
        print(f"dspark-markov demo: --impl: {error}", file=sys.stderr)
        return 2

    language = BigramLanguage(vocab, period=args.period, seed=args.seed, device=device)
    log_mu = language.marginals().log().float()  # [period, V]
    rank = min(args.rank, vocab)
    drafters = {
        "A: per-position marginals (no Markov head)": zero_head(vocab, rank, device=device),
        f"B: marginals + rank-{rank} Markov head": fit_markov_head(language, rank),
    }
    temperature_value = float(args.temperature)
    temperature = torch.full((batch,), temperature_value, dtype=torch.float32, device=device)
    generator = torch.Generator().manual_seed(args.seed + 1)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator).to(device)
    anchor = torch.randint(0, vocab, (batch,), generator=generator).to(device)
    start = torch.randint(1, 1000, (batch,), generator=generator).to(device)

    def base_logits_fn(position):
        return log_mu[position % args.period]  # [B, N, V] fp32

    def target_logits_fn(prev, position):
        return language.logits(prev, position) / temperature_value  # [B, K+1, V] fp32

    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; keep the demo usable without it anyway
        tqdm = None

    print(f"dspark-markov demo: V = {vocab}, K = N = {k}, {batch} requests x {args.length} tokens, "
          f"T = {temperature_value}, {args.method} verification, {args.draft_method} drafts, "
          f"{args.cache_dtype} cache, device {device}, engine {engine}{' + CUDA graphs' if graphs else ''}")
    results, speeds = {}, {}
    passed_all = True
    for name, head in drafters.items():
        impl = _resolve_impl(args.impl, device, head, k, batch, cache_dtype, args.draft_method)
        bar = None
        if tqdm is not None and not args.quiet:
            bar = tqdm(total=batch * args.length, desc=name[:1], unit="tok", leave=False, file=sys.stdout)
        if engine == "step":
            if graphs and impl == "reference":
                parser.error("--graphs: the reference draft impl cannot be captured; pass --no-graphs or a "
                             "Triton --impl")

            stepper = StepGenerator(target_logits_fn, head, marginal_backbone(log_mu, batch, k), batch=batch,
                                       num_steps=k, temperature=temperature, seeds=seeds, method=args.method,
                                       draft_method=args.draft_method, cache_dtype=cache_dtype, draft_impl=impl,
                                       verify_impl=verify_impl, block_inputs_impl=verify_impl, graphs=graphs)
            result, seconds = stepper.generate(anchor, start, args.length, progress=bar)
        else:
            _synchronize(device)
            began = time.perf_counter()
            result = speculative_generate(target_logits_fn, base_logits_fn, head, anchor, start, args.length,
                                          num_steps=k, temperature=temperature, seeds=seeds, method=args.method,
                                          draft_method=args.draft_method, impl=impl, cache_dtype=cache_dtype,
                                          progress=bar)
            _synchronize(device)
            seconds = time.perf_counter() - began
        if bar is not None:
            bar.close()
        observed, expected = pair_counts(language, anchor, start, result.tokens, temperature_value)
        statistic, dof = chi_square(observed, expected)
        passed, verdict = chi_square_verdict(statistic, dof)
        passed_all &= passed is True  # a check that could not run is not a pass
        results[name] = result
        speeds[name] = batch * args.length / max(seconds, 1e-9)
        print(f"{name} [impl {impl}]: mean accepted length {result.accepted:.3f} of {k} "
              f"({result.emitted:.3f} tokens per round, {result.rounds} rounds); "
              f"{speeds[name]:.0f} tokens/s ({seconds:.3f} s); "
              f"bigram chi-square {verdict}")
    accepted_a, accepted_b = (r.accepted for r in results.values())
    longer = accepted_b > accepted_a
    speed_a, speed_b = speeds.values()
    print(f"Markov head: accepted length x{accepted_b / max(accepted_a, 1e-9):.2f} "
          f"({'longer' if longer else 'NOT longer'}), tokens/s x{speed_b / max(speed_a, 1e-9):.2f}; "
          f"{time.time() - started:.1f} s")
    if not passed_all:
        print("output distribution: NOT verified (a chi-square failed or had too few draws to run; "
              "use more --requests / --length)")
    return 0 if (longer and passed_all) else 1


if __name__ == "__main__":
    sys.exit(main())
