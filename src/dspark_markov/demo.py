"""End-to-end demo: speculative decoding of a synthetic language with and without the Markov head.

The language is a bigram model with a periodic position component: the next token at position
``t`` after ``prev`` has logits ``A[prev] + C[t % period]`` (``A`` low rank and sharp: each token has a
few likely successors). The target model is that language, exactly. Two drafters propose ``K`` tokens
per round with :func:`~dspark_markov.sample_drafts`, and :func:`~dspark_markov.verify_drafts`
verifies them:

- drafter A (DFlash-style, block-parallel only) knows the per-position marginals: its base logits
  at position ``t`` are ``log mu[t % period]``, the stationary marginal of that phase, and its
  Markov head is zero;
- drafter B has the same base logits plus a rank-``r`` Markov head fitted to the language: the
  truncated SVD of the (row-centred) log-transition matrix minus the marginals' logs, so that
  ``base + bias`` approximates the true conditional ``log P(v | prev, t)``.

The demo prints the mean accepted length per round of each, and a chi-square check that the
emitted (prev, next) pairs follow the target's conditional distribution (the Anderson-Goodman
test of a Markov chain: per previous token, Pearson's statistic against the expected counts). It
exits 0 when the Markov head accepts more and both chi-square checks pass (a check with too few draws
to have a degree of freedom is reported as not run, and the exit status is then 1).

Two engines run the rounds: ``--engine functional`` (the CPU default) calls ``sample_drafts`` and
``verify_drafts`` on fresh tensors; ``--engine step`` (the CUDA default,
:mod:`dspark_markov.demo_step`) drives a :class:`~dspark_markov.step.DSparkStep` per drafter, with
a backbone returning the marginals' logs from the block inputs, the fastest implementations on
CUDA (``auto`` drafts, Triton verification and block inputs; the references on CPU) and, with
``--graphs`` (the CUDA default), draft and verify captured once in CUDA graphs and replayed every
round. Both print emitted tokens per second (wall clock of the decoding loop, device
synchronised at both ends; the step engine compiles and captures before the clock starts, the
functional one does not, so its first round on CUDA includes Triton compilation).

Run it with ``dspark-markov demo`` or ``python -m dspark_markov.demo``; ``--device cuda`` runs on
a GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch

from .draft.api import sample_drafts
from .head import MarkovHead
from .verify.api import verify_drafts


# --------------------------------------------------------------------------- statistics
def chi_square(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0):
    """Pearson's chi-square of counts against expectations, one group per row.

    observed, expected : ``[G, C]`` (or ``[C]``) tensors; each row is one multinomial group whose
    observed and expected totals agree. Within a row, cells expected below ``min_expected`` are
    pooled into one cell (added to the smallest kept cell if the pool is still below it). Returns
    ``(statistic, degrees_of_freedom)`` as Python numbers (df = sum over rows of cells - 1); the
    statistic is ``inf`` if any cell expected to be empty (expectation 0) has a count.
    """
    observed = torch.as_tensor(observed, dtype=torch.float64).cpu()
    expected = torch.as_tensor(expected, dtype=torch.float64).cpu()
    if observed.dim() == 1:
        observed, expected = observed[None], expected[None]
    if bool(((expected <= 0) & (observed > 0)).any()):
        return math.inf, max(int((expected > 0).sum()) - 1, 1)  # a count where nothing was expected
    statistic, dof = 0.0, 0
    for obs_row, exp_row in zip(observed, expected):
        keep = exp_row >= min_expected
        obs_cells = obs_row[keep].tolist()
        exp_cells = exp_row[keep].tolist()
        pool_obs, pool_exp = float(obs_row[~keep].sum()), float(exp_row[~keep].sum())
        if pool_exp > 0 or pool_obs > 0:
            if pool_exp >= min_expected or not exp_cells:
                obs_cells.append(pool_obs)
                exp_cells.append(pool_exp)
            else:
                smallest = min(range(len(exp_cells)), key=exp_cells.__getitem__)
                obs_cells[smallest] += pool_obs
                exp_cells[smallest] += pool_exp
        if len(exp_cells) < 2:
            continue
        for o, e in zip(obs_cells, exp_cells):
            if e > 0:
                statistic += (o - e) ** 2 / e
        dof += len(exp_cells) - 1
    return statistic, dof


def chi_square_threshold(dof: int) -> float:
    """The project's pass threshold ``df + 10 sqrt(2 df)`` (about 7 standard deviations)."""
    return dof + 10.0 * math.sqrt(2.0 * dof)


def chi_square_verdict(statistic: float, dof: int):
    """``(passed, text)`` of a chi-square check; ``passed`` is ``None`` when it could not run.

    With 0 degrees of freedom (every group pooled into one cell: too few draws) the statistic is 0
    whatever was drawn, a check that cannot fail: it is reported as not run, never as a pass.
    """
    if dof < 1:
        return None, f"not run: too few draws for a chi-square ({dof} df)"
    threshold = chi_square_threshold(dof)
    passed = statistic <= threshold
    return passed, f"{statistic:.1f} on {dof} df (threshold {threshold:.1f}): {'pass' if passed else 'FAIL'}"


# --------------------------------------------------------------------------- the language
class BigramLanguage:
    """Next-token logits ``A[prev] + C[position % period]`` over ``V`` tokens (fp32).

    Parameters
    ----------
    vocab : V. period : the period of the position component. rank, sharpness : the rank and scale
    of the token-token interaction. seed : generator seed of the random tables. device : where the
    tables live.
    """

    def __init__(self, vocab: int, period: int = 3, rank: int = 6, sharpness: float = 4.0, seed: int = 0,
                 device="cpu"):
        if vocab < 2:
            raise ValueError(f"vocab: expected at least 2 tokens, got {vocab}")
        if period < 1:
            raise ValueError(f"period: expected >= 1, got {period}")
        generator = torch.Generator().manual_seed(seed)
        # A low-rank interaction (what a Markov head can learn) plus a little full-rank noise; the
        # sharpness makes each row put most of its mass on a few successors.
        left = torch.randn(vocab, rank, generator=generator)
        right = torch.randn(vocab, rank, generator=generator)
        transition = sharpness * (left @ right.t()) / math.sqrt(rank) + 0.3 * torch.randn(vocab, vocab, generator=generator)
        self.transition_logits = transition.to(device)  # [V, V]
        self.position_logits = (torch.randn(period, vocab, generator=generator) * 0.7).to(device)  # [period, V]
        self.vocab = vocab
        self.period = period

    def logits(self, prev: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[..., V]`` of the token at ``position`` after ``prev`` (same shapes)."""
        return self.transition_logits[prev.long()] + self.position_logits[position.long() % self.period]

    def transition(self, phase: int) -> torch.Tensor:
        """``[V, V]`` fp32 probabilities ``P(next | prev)`` at positions ``t`` with ``t % period == phase``."""
        return torch.softmax(self.transition_logits + self.position_logits[phase], dim=-1)

    def marginals(self, iterations: int = 200) -> torch.Tensor:
        """``[period, V]`` fp64 stationary marginals per phase (power iteration over one period)."""
        mats = [self.transition(phase).double() for phase in range(self.period)]
        mu = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64, device=mats[0].device)
        for _ in range(iterations):
            for phase in range(self.period):
                mu = mu @ mats[phase]
        # mu is the marginal of a token at phase period - 1; walk once more to get every phase.
        out = []
        for phase in range(self.period):
            mu = mu @ mats[phase]
            out.append(mu)
        return torch.stack(out)

    def position_marginals(self, anchor: int, start: int, length: int, temperature: float = 1.0) -> torch.Tensor:
        """``[length, V]`` fp64 exact marginals of the tokens at ``start .. start+length-1`` after ``anchor``,
        under ``softmax(logits / temperature)``."""
        dist = torch.zeros(self.vocab, dtype=torch.float64, device=self.transition_logits.device)
        dist[anchor] = 1.0
        out = []
        for t in range(start, start + length):
            logits = (self.transition_logits + self.position_logits[t % self.period]) / temperature
            dist = dist @ torch.softmax(logits.double(), dim=-1)
            out.append(dist)
        return torch.stack(out)


def fit_markov_head(language: BigramLanguage, rank: int, dtype=torch.float32) -> MarkovHead:
    """Rank-``rank`` head whose bias approximates ``log P(v | prev) - log mu(v)`` (row-centred).

    The log-transition minus the marginals' logs is averaged over the period, each row is centred
    (softmax ignores a per-row constant), and its truncated SVD ``U S V^T`` gives
    ``W1 = U sqrt(S)``, ``W2 = V sqrt(S)``.
    """
    log_mu = language.marginals().log()  # [period, V]
    pmi = torch.stack([language.transition(phase).double().log() - log_mu[phase] for phase in range(language.period)])
    target = pmi.mean(dim=0)
    target = target - target.mean(dim=1, keepdim=True)
    u, s, vh = torch.linalg.svd(target.cpu())
    rank = min(rank, s.numel())
    root = s[:rank].sqrt()
    embed = (u[:, :rank] * root).to(dtype)
    head = (vh[:rank].t() * root).to(dtype)
    device = language.transition_logits.device
    return MarkovHead(embed.to(device), head.to(device))


def zero_head(vocab: int, rank: int, dtype=torch.float32, device="cpu") -> MarkovHead:
    """A Markov head whose bias is zero: drafter A is the base logits alone."""
    return MarkovHead(torch.zeros(vocab, rank, dtype=dtype, device=device),
                      torch.zeros(vocab, rank, dtype=dtype, device=device))


# --------------------------------------------------------------------------- speculative decoding
@dataclass
class GenerationResult:
    tokens: torch.Tensor  # [B, length] int64, the generated text after each anchor
    rounds: int  # draft-verify rounds until every request had `length` tokens
    accepted: float  # mean accepted drafts per (request, round) with num_drafts == K
    emitted: float  # mean emitted tokens per (request, round) over the same rounds


def speculative_generate(target_logits_fn, base_logits_fn, head: MarkovHead, anchor: torch.Tensor, start: torch.Tensor,
                         length: int, *, num_steps: int, temperature: torch.Tensor, seeds: torch.Tensor,
                         method: str = "standard", draft_method: str = "gumbel", impl: str = "reference",
                         cache_dtype=torch.bfloat16, progress=None) -> GenerationResult:
    """Generate ``length`` tokens per request by rounds of Markov drafting and verification.

    Parameters
    ----------
    target_logits_fn : ``(prev [B, K+1], position [B, K+1]) -> [B, K+1, V]`` fp32 target logits
        (temperature applied) of the token at ``position`` after ``prev``.
    base_logits_fn : ``(position [B, N]) -> [B, N, V]`` base logits of the drafter.
    head : the drafter's :class:`~dspark_markov.MarkovHead`.
    anchor : ``[B]`` int64, the token before the first generated one; start : ``[B]`` int64, the
        position of the first generated token.
    num_steps : K = N drafts per round. temperature ``[B]`` fp32 / seeds ``[B]`` int64: request
        ``b`` uses slot ``b``; one seed per request across all rounds (re-drafted positions get
        fresh noise from the step salt).
    method : verification method; draft_method / impl / cache_dtype : passed to ``sample_drafts``.
    progress : optional tqdm-like object whose ``update(n)`` is called with new tokens.

    Requests that already have ``length`` tokens become padding (slot -1); in the last rounds
    ``num_drafts`` shrinks to the tokens still missing minus one (so 0 drafts also occur).
    """
    device = anchor.device
    batch = anchor.shape[0]
    k = num_steps
    out = torch.full((batch, length), -1, dtype=torch.int64, device=device)
    generated = torch.zeros(batch, dtype=torch.int64, device=device)
    last = anchor.long().clone()
    slots = torch.arange(batch, device=device)
    steps = torch.arange(k, device=device)
    rows = torch.arange(k + 1, device=device)
    cache = torch.zeros(batch, k, head.vocab_size, dtype=cache_dtype, device=device)
    rounds, accepted_sum, emitted_sum, full_rounds = 0, 0, 0, 0
    while bool((generated < length).any()):
        live = generated < length
        position = start + generated  # [B], the position of the next token
        idx_mapping = torch.where(live, slots, torch.full_like(slots, -1))
        draft_positions = position[:, None] + steps  # [B, N]
        drafts = sample_drafts(head, base_logits_fn(draft_positions), last, idx_mapping.repeat_interleave(k),
                               draft_positions.reshape(-1), temperature, seeds, logits_cache=cache,
                               method=draft_method, impl=impl).draft_tokens
        num_drafts = torch.clamp(length - generated - 1, 0, k)
        prev = torch.cat([last[:, None], drafts], dim=1)  # [B, K+1]
        target = target_logits_fn(prev, position[:, None] + rows)
        result = verify_drafts(target, drafts, cache, num_drafts, idx_mapping, position, temperature, seeds,
                               method=method)
        full = live & (num_drafts == k)
        accepted_sum += int((result.num_emitted[full] - 1).sum())
        emitted_sum += int(result.num_emitted[full].sum())
        full_rounds += int(full.sum())
        for j in range(k + 1):
            write = (j < result.num_emitted) & (generated + j < length)
            column = torch.where(write, generated + j, torch.zeros_like(generated))
            value = torch.where(write, result.tokens[:, j], out.gather(1, column[:, None])[:, 0])
            out.scatter_(1, column[:, None], value[:, None])
        new = torch.clamp(torch.minimum(result.num_emitted, length - generated), min=0)
        has_new = new > 0
        last_index = torch.clamp(new - 1, min=0)
        last = torch.where(has_new, result.tokens.gather(1, last_index[:, None])[:, 0], last)
        generated = generated + new
        rounds += 1
        if progress is not None:
            progress.update(int(new.sum()))
    return GenerationResult(out, rounds, accepted_sum / max(full_rounds, 1), emitted_sum / max(full_rounds, 1))


def pair_counts(language: BigramLanguage, anchor, start, tokens, temperature: float):
    """Observed and expected ``[V, V]`` (prev, next) counts of generated ``tokens`` ``[B, L]``.

    The expected row of ``prev`` sums ``P(. | prev, t)`` over every occurrence of ``prev`` before a
    generated token at position ``t`` (the conditional test of a Markov chain).
    """
    vocab = language.vocab
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1).reshape(-1)
    position = (start[:, None] + torch.arange(tokens.shape[1], device=tokens.device)).reshape(-1)
    nxt = tokens.reshape(-1)
    probs = torch.softmax(language.logits(prev, position).double() / temperature, dim=-1)
    expected = torch.zeros(vocab, vocab, dtype=torch.float64, device=tokens.device).index_add_(0, prev, probs)
    observed = torch.zeros(vocab * vocab, dtype=torch.float64, device=tokens.device)
    observed.index_add_(0, prev * vocab + nxt, torch.ones_like(nxt, dtype=torch.float64))
    return observed.view(vocab, vocab), expected


# --------------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark-markov demo", description=__doc__.split("\n\n")[0])
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
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.vocab < 2:
        parser.error(f"--vocab: expected at least 2, got {args.vocab}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        parser.error(f"--temperature: expected a finite value > 0, got {args.temperature}")


def _resolve_impl(impl, device, head, num_steps, rows, cache_dtype, draft_method, quiet=False):
    """The draft impl to use; ``auto`` that cannot be resolved here falls back to the reference, loudly."""
    from .draft.sampler import MarkovSampler

    if impl is None:
        impl = "auto" if device.type == "cuda" else "reference"
    try:
        return MarkovSampler(head, num_steps, rows, cache_dtype, draft_method, impl).impl
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
            from .demo_step import StepGenerator, marginal_backbone

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
