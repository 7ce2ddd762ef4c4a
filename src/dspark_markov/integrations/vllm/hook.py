"""The ``sample_sequential`` hook of vLLM's DSpark speculator, on the speculator's own buffers.

vLLM 0.33.0's ``DSparkSpeculator._sample_sequential(num_reqs, head_hidden)``
(``vllm/v1/worker/gpu/spec_decode/dspark/speculator.py``) goes to ``_sample_sequential_topk`` when
``_draft_topk`` is set; otherwise it first calls ``model.sample_sequential(speculator, num_reqs,
head_hidden)``: True means the hook has written ``speculator.draft_tokens[:num_reqs]`` and the
``speculator.draft_logits`` rows, False (having done nothing) lets the speculator run its own loop,
which per step is::

    markov_embed = model.markov_embed(prev)                 # markov_w1[prev]
    bias = model.markov_bias(markov_embed)                   # LogitsProcessor(markov_w2): F.linear, * scale
    logits_i = base_logits[:, i] + bias                      # bf16 + bf16, one rounding
    (model.apply_output_logit_transform(logits_i) where the model has one: declined here)
    draft_tokens[:R, i] = _sample_logits(logits_i, idx_map[:, i], sample_pos[:, i], i)

and ``_sample_logits`` (after the acceptance estimator's ``_maybe_predict_acceptance``, declined
here; with a reduced vocabulary, the ``index_copy_`` into ``_draft_scatter_buf``) is::

    gumbel_sample(logits_i, idx_map[:, i], temperature, seeds, sample_pos[:, i] - 1,
                  apply_temperature=True, is_drafting=True, logits_cache=draft_logits,
                  logits_cache_col=_step_cols[i], use_fp64=use_fp64_gumbel)   # _step_cols[i] == i

which is SPEC.md sections 1-4 with ``anchor = input_ids[_anchor_idx[:R]]``,
``idx_mapping = sample_idx_mapping``, ``positions = sample_pos`` (keys at ``P - 1``),
``logits_cache = draft_logits``. :func:`sample_sequential` computes the base logits exactly as the
loop does (``model.compute_draft_logits(head_hidden[sample_indices])``) and hands the rest to the
speculator's :class:`~dspark_markov.MarkovSampler` of the batch's size bucket (built at the first
call of that size, which vLLM makes eagerly before it captures its draft graph; scratch allocated
once, CUDA-graph capturable, no host synchronisation).

Exactness: the tokens, the cache rows and the untouched padding rows are those of vLLM's loop given
the same bias. The bias is an fp32 sum of rank products rounded to bf16 (SPEC.md section 3); the
cuBLAS designs (``loop``, ``gumbel_fused``, ``cuda_gumbel`` -- the last is what ``auto`` picks from 33
rows up) make the same GEMM call as vLLM's ``F.linear`` on ``markov_w2``; the in-kernel designs
(``fused``, ``chain``, ``cuda_chain``, which ``auto`` picks at up to 32 rows) add the products in another order, so a bias value can differ in its last bf16 bit -- as
vLLM's own AMD hook (``fused_markov.py``) does. That changes which tokens are proposed, never the
target's output (the rejection sampler verifies against the cache that was written).

Drafting modes (issue 17), computed as vLLM computes them (``tests/integrations/test_vllm.py``
against vLLM's own ``_sample_sequential`` / ``_sample_sequential_topk``, bit for bit on the CPU):

- a reduced draft vocabulary (the speculator's ``_d2t_scatter_index``): ``MarkovHead(..., d2t=)``,
  cache rows, keys and tokens in target ids (README "Id spaces");
- top-k drafting (``_draft_topk``): vLLM's ``_sample_sequential`` goes to
  ``_sample_sequential_topk`` without asking the model, so the plugin wraps that method
  (:func:`sample_sequential_topk`); ``MarkovSampler(draft_top_k=k)``;
- the confidence head: the sampler hands back each step's ``W1[prev]`` (``markov_embeds``) and
  the hook calls the model's ``compute_confidence`` on them as vLLM's loop does.

Everything else is declined (:func:`why_not`, one log line per reason): see ``DECLINED``.
This module imports no vLLM: it reads the speculator's attributes only, so it also runs on a
stand-in speculator (the GPU check, where vLLM is not installed).
"""

from __future__ import annotations

import logging
import os
import weakref

import torch

from ... import MarkovHead, MarkovSampler  # the public API only (the layer map)

IMPL_ENV = "DSPARK_MARKOV_VLLM_IMPL"
DEFAULT_IMPL = "auto"
# The cases the hook leaves to vLLM's loop (documented in the README); each is logged once.
DECLINED = (
    "top-k drafting (dspark_draft_topk)",
    "greedy drafts (no draft logits cache)",
    "a draft watermarker",
    "a reduced draft vocabulary without a matching d2t scatter index",
    "the confidence head without compute_confidence / draft_token_confidence_probs",
    "the acceptance estimator",
    "an output logit transform",
    "a soft-capped or fp32 Markov projection",
    "non-bf16, quantized or tensor-parallel Markov weights",
    "a non-bf16 draft logits cache",
    "fp64 Gumbel noise",
    "VLLM_BATCH_INVARIANT",
    "a batch outside 1..max_num_reqs",
)

# The speculator's buffers the hook hands to the sampler, and the dtypes it takes for each (vLLM 0.33.0 allocates
# temperature fp32 and the rest int64 in DraftModelSpeculator / DFlashSpeculator.__init__, input_ids int32 in
# InputBuffers: tests/integrations/test_vllm_source.py reads those allocations in vLLM's source).
SPECULATOR_DTYPES = {
    "temperature": (torch.float32,), "seeds": (torch.int64,), "draft_tokens": (torch.int64,),
    "sample_idx_mapping": (torch.int32, torch.int64), "sample_pos": (torch.int32, torch.int64),
    "sample_indices": (torch.int32, torch.int64),
}
INPUT_IDS_DTYPES = (torch.int32, torch.int64)  # speculator.input_buffers.input_ids

# A reduced draft vocabulary without top-k is taken up to this batch: on the H200 (bench_modes, 2026-12-01)
# fused + d2t beat vLLM's loop at 1 and 16 rows (80.5 vs 122.8, 139.5 vs 228.1 us) and lost at 64 and 253
# (420.5 vs 364.2, 1460.0 vs 1048.7 us: its cache rows are scattered stores at the target ids).
D2T_MAX_ROWS = 16

logger = logging.getLogger("vllm.dspark_markov")
_logged: set = set()
_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
stats = {"taken": 0, "declined": 0, "loop_rest": 0}  # host-side calls (eager and captured), not graph replays


def log_once(level: int, message: str, *args) -> None:
    """Log ``message % args`` once per process."""
    key = (level, message % args if args else message)
    if key not in _logged:
        _logged.add(key)
        logger.log(level, message, *args)


def _impl() -> str:
    return os.environ.get(IMPL_ENV, "").strip().lower() or DEFAULT_IMPL  # (case ignored, as DSPARK_MARKOV_VLLM's)


def _impl_setting() -> str:
    """`` (DSPARK_MARKOV_VLLM_IMPL='x')`` where the setting names a design (the ``impl`` of a refusal is
    its value: the message names the setting that chose it), else ``""``."""
    return f" ({IMPL_ENV}={_impl()!r})" if _impl() != DEFAULT_IMPL else ""


def _is_off(value) -> bool:
    return value is None or value is False


def _draft_vocab(spec) -> int:
    """The draft vocabulary V_d: the logits processor's ``org_vocab_size``, else W2's rows (the one rule of
    :func:`why_not` and the run, so that both size the head alike)."""
    model = spec.model
    weight2 = model.model.markov_head.markov_w2.weight
    return int(getattr(model.logits_processor, "org_vocab_size", weight2.shape[0]))


def why_not(spec, num_reqs: int, *, top_k: bool = False) -> str | None:
    """Why this call is left to vLLM's loop, or ``None`` when the hook computes it as the loop does.

    ``top_k``: the call is ``_sample_sequential_topk``'s. Reads attributes only (host side: no
    device synchronisation, nothing written).
    """
    draft_top_k = getattr(spec, "_draft_topk", None)
    if (draft_top_k is not None) != top_k:
        return DECLINED[0]
    model = spec.model
    head = getattr(getattr(model, "model", None), "markov_head", None)
    if head is None:
        return "no Markov head"
    cache = spec.draft_logits
    if cache is None:
        return DECLINED[1]
    if not _is_off(getattr(spec, "draft_watermarker", None)):
        return DECLINED[2]
    scatter = getattr(spec, "_d2t_scatter_index", None)
    if (scatter is None) != (getattr(model, "draft_id_to_target_id", None) is None):
        return DECLINED[3]
    if getattr(spec, "use_confidence_head", False) and not (
            callable(getattr(model, "compute_confidence", None))
            and isinstance(getattr(spec, "draft_token_confidence_probs", None), torch.Tensor)):
        return DECLINED[4]
    if getattr(spec, "acceptance_estimator", None) is not None:
        return DECLINED[5]
    if hasattr(model, "apply_output_logit_transform"):
        return DECLINED[6]
    if os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0"):
        return DECLINED[11]
    processor = getattr(model, "logits_processor", None)
    if processor is None or getattr(processor, "soft_cap", None) is not None or getattr(processor, "logits_as_input", False):
        return DECLINED[7] + " (soft cap)"
    if getattr(processor, "head_dtype", None) not in (None, torch.bfloat16):
        return DECLINED[7] + f" (head_dtype {processor.head_dtype})"
    w1, w2 = head.markov_w1, head.markov_w2
    weight1, weight2 = getattr(w1, "weight", None), getattr(w2, "weight", None)
    if not (isinstance(weight1, torch.Tensor) and isinstance(weight2, torch.Tensor)):
        return DECLINED[8] + " (no plain weights)"
    if weight1.dtype != torch.bfloat16 or weight2.dtype != torch.bfloat16:
        return DECLINED[8] + f" ({weight1.dtype} / {weight2.dtype})"
    method = type(getattr(w2, "quant_method", None)).__name__
    if method != "UnquantizedEmbeddingMethod" or getattr(w2, "is_w4a16_nvfp4", False):
        # (vLLM hands an excluded head UnquantizedLinearMethod, whose GEMM --linear-backend may change: declined too)
        nvfp4 = ", W4A16 NVFP4" if method == "UnquantizedEmbeddingMethod" else ""
        return DECLINED[8] + f" (quantized markov_w2: {method}{nvfp4})"
    if getattr(w2, "tp_size", 1) != 1:
        return DECLINED[8] + " (tensor-parallel markov_w2)"
    if type(w1).__name__ != "Embedding" or weight1.dim() != 2 or weight2.dim() != 2 or weight1.shape[1] != weight2.shape[1]:
        return DECLINED[8] + " (layout)"
    if not (weight1.is_contiguous() and weight2.is_contiguous()):
        return DECLINED[8] + " (not contiguous)"
    vocab = _draft_vocab(spec)
    if cache.dtype != torch.bfloat16:
        return DECLINED[9] + f" ({cache.dtype})"
    steps = int(spec.num_speculative_steps)
    width = vocab if scatter is None else int(getattr(spec, "vocab_size", cache.shape[-1]))  # the cache's vocabulary
    if cache.dim() != 3 or cache.shape[1] != steps or cache.shape[2] != width or cache.stride(-1) != 1:
        return f"a draft logits cache of shape {tuple(cache.shape)} (expected [max_num_reqs, {steps}, {width}])"
    if weight2.shape[0] < vocab or weight1.shape[0] < width:
        return f"Markov weights of {weight1.shape[0]} / {weight2.shape[0]} rows for a vocabulary of {width} / {vocab}"
    if scatter is not None and not (isinstance(scatter, torch.Tensor) and scatter.dtype == torch.int64
                                    and scatter.dim() == 1 and scatter.shape[0] == vocab and width >= vocab):
        return DECLINED[3] + " (its shape or dtype)"
    if scatter is not None and not top_k and num_reqs > D2T_MAX_ROWS:
        return (f"a reduced draft vocabulary at {num_reqs} rows (above {D2T_MAX_ROWS} vLLM's loop measured faster "
                "than fused + d2t on the H200)")
    if top_k:
        if isinstance(draft_top_k, bool) or not isinstance(draft_top_k, int) or not 1 <= draft_top_k <= vocab:
            return f"dspark_draft_topk = {draft_top_k!r} (expected an int in [1, {vocab}])"
        if not callable(getattr(model, "apply_markov_bias_gathered", None)):
            return "top-k drafting without the model's apply_markov_bias_gathered"
    if not 1 <= num_reqs <= spec.draft_tokens.shape[0]:
        return DECLINED[12] + f" ({num_reqs})"
    if getattr(spec, "use_fp64_gumbel", False):
        # Only impl='reference' has fp64 noise (vLLM's word order, tests/integrations), and it is
        # not graph safe, so the hook cannot take it inside vLLM's draft graph.
        return DECLINED[10] + " (not computed as vLLM 0.33 does)"
    for name, dtypes in SPECULATOR_DTYPES.items():
        tensor = getattr(spec, name)
        if tensor.dtype not in dtypes or (tensor.dim() == 1 and tensor.stride(0) != 1):
            return f"speculator.{name} of dtype {tensor.dtype} / stride {tensor.stride()}"
    if spec.input_buffers.input_ids.dtype not in INPUT_IDS_DTYPES:
        return f"input_ids of dtype {spec.input_buffers.input_ids.dtype}"
    devices = {t.device for t in (weight1, weight2, cache, spec.temperature, spec.seeds, spec.draft_tokens)}
    if len(devices) != 1:
        return f"buffers on several devices ({', '.join(sorted(map(str, devices)))})"
    return None


def bucket(rows: int, max_rows: int) -> int:
    """The sampler size a batch of ``rows`` rows runs on: the next power of two, at most ``max_rows``."""
    size = 1
    while size < rows:
        size *= 2
    return min(size, max_rows)


class _State:
    """One speculator's head, anchor buffer and samplers (rebuilt if the weights move).

    One :class:`MarkovSampler` per batch-size bucket (powers of two up to ``max_num_reqs``), each
    sized for its bucket: the designs choose their launch shapes by ``max_rows`` (``fused`` sized for
    256 rows runs 16 at 377 us, sized for 16 at ~172 us on the H200), and vLLM captures one graph per
    batch size anyway. A bucket's sampler is built at its first call (vLLM's eager warm-up of that
    size, before it captures), its scratch allocated once; at most twice the largest bucket's scratch.
    """

    def __init__(self, spec, head_module, vocab: int):
        weight1, weight2 = head_module.markov_w1.weight, head_module.markov_w2.weight
        scale = float(getattr(spec.model.logits_processor, "scale", 1.0))
        self.key = self.key_of(spec, head_module, vocab)
        # W2 has padding rows past the vocabulary (ParallelLMHead pads to 64); vLLM slices them off.
        scatter = getattr(spec, "_d2t_scatter_index", None)
        if scatter is None:
            self.head = MarkovHead(weight1.detach(), weight2[:vocab].detach(), scale)  # views, no copies
        else:  # a reduced draft vocabulary: vLLM scatters draft id j to column _d2t_scatter_index[j]
            d2t = scatter - torch.arange(vocab, device=scatter.device, dtype=scatter.dtype)
            self.head = MarkovHead(weight1.detach(), weight2[:vocab].detach(), scale, d2t=d2t,
                                   target_vocab_size=int(spec.draft_logits.shape[2]))  # one host read of d2t
        self.impl = _impl()
        self.steps = int(spec.num_speculative_steps)
        self.max_rows = spec.draft_tokens.shape[0]
        self.top_k = getattr(spec, "_draft_topk", None)
        self.samplers = {}  # bucket -> MarkovSampler
        input_ids = spec.input_buffers.input_ids
        self.anchor = torch.zeros(self.max_rows, dtype=input_ids.dtype, device=input_ids.device)  # [max_rows]
        # The confidence head's inputs, [max_rows, N, R_k] (MarkovSampler.sample(markov_embeds=)).
        self.embeds = None
        if getattr(spec, "use_confidence_head", False):
            self.embeds = torch.zeros(self.max_rows, self.steps, self.head.rank, dtype=self.head.dtype,
                                      device=weight1.device)

    def sampler(self, rows: int) -> MarkovSampler:
        """The sampler of ``rows``' bucket (built at its first call; ``ValueError`` if it cannot run)."""
        size = bucket(rows, self.max_rows)
        sampler = self.samplers.get(size)
        if sampler is None:
            sampler = MarkovSampler(self.head, self.steps, size, cache_dtype=torch.bfloat16, method="gumbel",
                                    impl=self.impl, draft_top_k=self.top_k)
            self.samplers[size] = sampler
            # (said once a sampler exists: a design that cannot run is a decline reason instead)
            log_once(logging.INFO, "dspark-markov: DSpark Markov drafting through MarkovSampler(impl=%r): %d steps, "
                     "vocabulary %d, rank %d, up to %d rows", self.impl, self.steps, self.head.vocab_size,
                     self.head.rank, self.max_rows)
        return sampler

    @staticmethod
    def key_of(spec, head_module, vocab):
        w1, w2 = head_module.markov_w1.weight, head_module.markov_w2.weight
        scatter = getattr(spec, "_d2t_scatter_index", None)
        return (w1.data_ptr(), w2.data_ptr(), tuple(w1.shape), tuple(w2.shape), vocab, _impl(),
                float(getattr(spec.model.logits_processor, "scale", 1.0)), int(spec.num_speculative_steps),
                spec.draft_tokens.shape[0], None if scatter is None else scatter.data_ptr(),
                getattr(spec, "_draft_topk", None), bool(getattr(spec, "use_confidence_head", False)))


def _state(spec, vocab: int) -> _State:
    head_module = spec.model.model.markov_head
    state = _states.get(spec)
    if state is None or state.key != _State.key_of(spec, head_module, vocab):
        state = _State(spec, head_module, vocab)
        _states[spec] = state
    return state


@torch.no_grad()
def sample_sequential(spec, num_reqs: int, head_hidden: torch.Tensor) -> bool:
    """``DSparkSpeculator._sample_sequential`` through a :class:`MarkovSampler`.

    Returns False, having written nothing, for a call :func:`why_not` declines (logged once per
    reason). Otherwise writes ``spec.draft_tokens[:num_reqs]`` ``[R, N]`` int64, the
    ``spec.draft_logits`` ``[S, N, V]`` bf16 rows of live samples (and, with the confidence head,
    ``spec.draft_token_confidence_probs[:num_reqs]``), and returns True.
    """
    return _run(spec, num_reqs, head_hidden, top_k=False)


@torch.no_grad()
def sample_sequential_topk(spec, num_reqs: int, head_hidden: torch.Tensor) -> bool:
    """``DSparkSpeculator._sample_sequential_topk`` (``dspark_draft_topk``) through a
    :class:`MarkovSampler` with ``draft_top_k``; returns and writes as :func:`sample_sequential`."""
    return _run(spec, num_reqs, head_hidden, top_k=True)


def _run(spec, num_reqs: int, head_hidden: torch.Tensor, *, top_k: bool) -> bool:
    why = why_not(spec, num_reqs, top_k=top_k)
    if why is None:
        try:
            vocab = _draft_vocab(spec)
            state = _state(spec, vocab)
            sampler = state.sampler(num_reqs)
        except ValueError as error:  # e.g. DSPARK_MARKOV_VLLM_IMPL names a design that cannot run here
            why = f"MarkovSampler refused: {error}{_impl_setting()}"
    if why is not None:
        stats["declined"] += 1
        log_once(logging.INFO, "dspark-markov: vLLM's loop drafts this step: %s", why)
        return False

    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    sample_hidden = head_hidden[spec.sample_indices[:num_sample]]
    base_logits = spec.model.compute_draft_logits(sample_hidden)  # [R*N, V], as vLLM's loop computes them
    vocab = state.head.vocab_size
    if base_logits.dtype != torch.bfloat16 or base_logits.dim() != 2 or base_logits.shape[-1] != vocab \
            or base_logits.stride(-1) != 1 or base_logits.device != state.anchor.device:
        # Known only now: finish with vLLM's own loop from these base logits (computed once).
        stats["loop_rest"] += 1
        log_once(logging.INFO, "dspark-markov: vLLM's loop drafts from %s base logits of shape %s",
                 base_logits.dtype, tuple(base_logits.shape))
        _loop_rest(spec, num_reqs, base_logits, sample_hidden, top_k=top_k)
        return True

    anchor = state.anchor[:num_reqs]
    torch.index_select(spec.input_buffers.input_ids, 0, spec._anchor_idx[:num_reqs], out=anchor)
    embeds = None if state.embeds is None else state.embeds[:num_reqs]
    try:
        sampler.sample(base_logits.view(num_reqs, n_spec, vocab), anchor, spec.sample_idx_mapping[:num_sample],
                       spec.sample_pos[:num_sample], spec.temperature, spec.seeds,
                       draft_tokens=spec.draft_tokens[:num_reqs], logits_cache=spec.draft_logits, check_values=False,
                       markov_embeds=embeds)
    except ValueError as error:  # raised before anything is written (SPEC.md section 7)
        stats["loop_rest"] += 1
        log_once(logging.WARNING, "dspark-markov: MarkovSampler refused a step (%s%s); vLLM's loop drafts it", error,
                 _impl_setting())
        _loop_rest(spec, num_reqs, base_logits, sample_hidden, top_k=top_k)
        return True
    if embeds is not None:  # vLLM: compute_confidence(sample_hidden, stack(markov_embeds, 1).flatten(0, 1))
        confidence = spec.model.compute_confidence(sample_hidden, embeds.flatten(0, 1))
        spec.draft_token_confidence_probs[:num_reqs] = confidence.view(num_reqs, n_spec)
    stats["taken"] += 1
    return True


def _loop_rest(spec, num_reqs: int, base_logits: torch.Tensor, sample_hidden: torch.Tensor, *,
               top_k: bool = False) -> None:
    """vLLM's loop from its base logits on (the lines of ``_sample_sequential`` or
    ``_sample_sequential_topk`` after ``compute_draft_logits``; the logit transform is declined before)."""
    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    base_logits = base_logits.view(num_reqs, n_spec, base_logits.shape[-1])
    if top_k:
        base_values, draft_indices = base_logits.topk(spec._draft_topk, dim=-1)
        base_logits.fill_(float("-inf"))
    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
    sample_pos = spec.sample_pos[:num_sample].view(num_reqs, n_spec)
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]]
    embeds = []
    for i in range(n_spec):
        markov_embed = spec.model.markov_embed(prev)
        embeds.append(markov_embed)
        if top_k:
            logits_i = spec.model.apply_markov_bias_gathered(markov_embed, base_logits[:, i], base_values[:, i],
                                                             draft_indices[:, i])
        else:
            logits_i = base_logits[:, i] + spec.model.markov_bias(markov_embed)
        draft = spec._sample_logits(logits_i, idx_map[:, i], sample_pos[:, i], i)
        spec.draft_tokens[:num_reqs, i] = draft
        prev = draft
    if getattr(spec, "use_confidence_head", False):
        confidence = spec.model.compute_confidence(sample_hidden, torch.stack(embeds, dim=1).flatten(0, 1))
        spec.draft_token_confidence_probs[:num_reqs] = confidence.view(num_reqs, n_spec)
