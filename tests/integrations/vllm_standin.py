"""A stand-in for vLLM 0.33.0's DSpark speculator and draft model where vLLM is not installed.

Used by ``tools/vllm_hook_timing.py`` and ``test_vllm_hook_gpu.py`` on the GPU machine (no vLLM
there). What is real vLLM code and what is re-created:

- real: ``gumbel_sample`` (vLLM 0.33.0's ``vllm/v1/worker/gpu/sample/gumbel.py``, loaded by
  :func:`dspark_markov.bench.vllm_loop.load_gumbel_sample` from an installed vLLM or the copy
  ``tools/extract_vllm.py`` extracted into ``.vllm-cache/``);
- re-created here, line for line from vLLM 0.33.0: ``DSparkSpeculator._sample_sequential`` (the
  dense path, with its ``model.sample_sequential`` seam) and ``_sample_logits`` (the probabilistic
  Gumbel path, no watermarker, no reduced vocabulary), the draft model's ``markov_embed``
  (``nn.Embedding``) and ``markov_bias`` (``LogitsProcessor``: ``F.linear`` over ``markov_w2``,
  the padding rows sliced off, ``* scale``), and the speculator's persistent buffers with vLLM's
  dtypes (``input_ids`` int32, ``sample_*`` int64, ``temperature`` fp32, ``seeds`` int64,
  ``draft_tokens`` int64, ``draft_logits`` ``[max_num_reqs, N, V]``).

``compute_draft_logits`` returns a fixed base-logits tensor (the backbone is not part of the step
being measured) so both paths time the Markov loop only. On the CPU the real classes are used
instead (``test_vllm.py``).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


class UnquantizedEmbeddingMethod:
    """Named as vLLM's unquantized method (the hook checks the class name)."""


class MarkovW2:
    """``markov_w2``: vLLM's ``ParallelLMHead`` weight ``[V padded to 64, rank]`` (disable_tp)."""

    def __init__(self, weight):
        self.weight = weight
        self.quant_method = UnquantizedEmbeddingMethod()
        self.tp_size = 1
        self.is_w4a16_nvfp4 = False


class LogitsProcessor:
    """vLLM's ``LogitsProcessor.forward`` for an unquantized, unsharded head: ``F.linear``, the vocab
    padding sliced off, ``logits *= scale`` when the scale is not 1."""

    def __init__(self, vocab, scale=1.0):
        self.org_vocab_size = vocab
        self.scale = scale
        self.soft_cap = None
        self.head_dtype = None
        self.logits_as_input = False

    def __call__(self, lm_head, hidden):
        logits = F.linear(hidden, lm_head.weight)[..., : self.org_vocab_size]
        if self.scale != 1.0:
            logits *= self.scale
        return logits


class DraftModel:
    """The draft model's hooks that the speculator's loop calls (``DSparkDeepseekV4ForCausalLM``'s)."""

    draft_id_to_target_id = None

    def __init__(self, w1, w2_padded, vocab, scale, base_logits):
        embedding = torch.nn.Embedding(w1.shape[0], w1.shape[1], device=w1.device, dtype=w1.dtype)
        embedding.weight.data = w1
        self.model = types.SimpleNamespace(markov_head=types.SimpleNamespace(markov_w1=embedding,
                                                                             markov_w2=MarkovW2(w2_padded)))
        self.logits_processor = LogitsProcessor(vocab, scale)
        self.base_logits = base_logits  # [max_num_reqs * N, V]

    def compute_draft_logits(self, hidden_states):
        return self.base_logits[: hidden_states.shape[0]]

    def markov_embed(self, token_ids):
        return self.model.markov_head.markov_w1(token_ids)

    def markov_bias(self, markov_embed):
        return self.logits_processor(self.model.markov_head.markov_w2, markov_embed)


class Speculator:
    """``DSparkSpeculator`` with the attributes ``_sample_sequential`` reads, and its loop."""

    def __init__(self, model, gumbel_sample, *, max_num_reqs, num_steps, vocab, device, use_fp64_gumbel=False):
        self.model = model
        self.gumbel_sample = gumbel_sample
        self.num_speculative_steps = num_steps
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab
        self.device = device
        self._draft_topk = None
        self.draft_watermarker = None
        self._d2t_scatter_index = None
        self.use_confidence_head = False
        self.acceptance_estimator = None
        self.use_fp64_gumbel = use_fp64_gumbel
        n = max_num_reqs * num_steps
        self.sample_indices = torch.zeros(n, dtype=torch.int64, device=device)
        self.sample_pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.sample_idx_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.temperature = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.draft_tokens = torch.zeros(max_num_reqs, num_steps, dtype=torch.int64, device=device)
        self.draft_logits = torch.zeros(max_num_reqs, num_steps, vocab, dtype=torch.bfloat16, device=device)
        self.input_buffers = types.SimpleNamespace(input_ids=torch.zeros(n, dtype=torch.int32, device=device))
        self._step_cols = torch.arange(num_steps, dtype=torch.int32, device=device)
        self._anchor_idx = torch.arange(max_num_reqs, dtype=torch.int64, device=device) * num_steps

    # -- vLLM 0.33.0 DSparkSpeculator._sample_logits (draft_logits is not None, no watermarker, no d2t)
    def _sample_logits(self, logits, idx_map, sample_pos, step):
        return self.gumbel_sample(logits, idx_map, self.temperature, self.seeds, sample_pos - 1,
                                  apply_temperature=True, is_drafting=True, logits_cache=self.draft_logits,
                                  logits_cache_col=self._step_cols[step], use_fp64=self.use_fp64_gumbel)

    # -- vLLM 0.33.0 DSparkSpeculator._sample_sequential (dense path, no confidence head)
    def _sample_sequential(self, num_reqs, head_hidden):
        sample_sequential = getattr(self.model, "sample_sequential", None)
        if sample_sequential is not None and sample_sequential(self, num_reqs, head_hidden):
            return
        n_spec = self.num_speculative_steps
        num_sample = num_reqs * n_spec
        sample_hidden = head_hidden[self.sample_indices[:num_sample]]
        base_logits = self.model.compute_draft_logits(sample_hidden)
        vocab_size = base_logits.shape[-1]
        base_logits = base_logits.view(num_reqs, n_spec, vocab_size)
        idx_map = self.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
        sample_pos = self.sample_pos[:num_sample].view(num_reqs, n_spec)
        prev = self.input_buffers.input_ids[self._anchor_idx[:num_reqs]]
        for i in range(n_spec):
            markov_embed = self.model.markov_embed(prev)
            bias = self.model.markov_bias(markov_embed)
            logits_i = base_logits[:, i] + bias
            draft_sampled_i = self._sample_logits(logits_i, idx_map[:, i], sample_pos[:, i], i)
            self.draft_tokens[:num_reqs, i] = draft_sampled_i
            prev = draft_sampled_i


class HookedDraftModel(DraftModel):
    """The same draft model with the plugin's hook, as ``integrations.vllm.install`` gives the
    real classes."""

    def sample_sequential(self, speculator, num_reqs, head_hidden):
        from dspark_markov.integrations.vllm import hook

        return hook.sample_sequential(speculator, num_reqs, head_hidden)


def fill_batch(spec, num_reqs, generator, *, padding_rows=(), temperatures=(1.0,)):
    """Random anchors, positions, seeds and per-slot temperatures for ``num_reqs`` rows; rows in
    ``padding_rows`` get slot -1. Row r uses slot ``max_num_reqs - 1 - r`` (slots are not rows)."""
    n_spec, device = spec.num_speculative_steps, spec.device
    vocab = spec.vocab_size
    spec.sample_idx_mapping.fill_(-1)
    slots = torch.tensor([-1 if r in padding_rows else spec.max_num_reqs - 1 - r for r in range(num_reqs)],
                         device=device)
    spec.sample_idx_mapping[: num_reqs * n_spec] = slots.repeat_interleave(n_spec)
    start = torch.randint(1, 1 << 20, (num_reqs, 1), generator=generator, device="cpu").to(device)
    spec.sample_pos[: num_reqs * n_spec] = (start + torch.arange(n_spec, device=device)).reshape(-1)
    anchors = torch.randint(0, vocab, (num_reqs,), generator=generator, device="cpu").to(device, torch.int32)
    spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]] = anchors
    table = torch.tensor(temperatures, dtype=torch.float32, device=device)
    spec.temperature.copy_(table[torch.arange(spec.max_num_reqs, device=device) % len(temperatures)])
    spec.seeds.copy_(torch.randint(-(1 << 62), 1 << 62, (spec.max_num_reqs,), generator=generator).to(device))
