"""Shared Triton building blocks, each numerical rule written once (SPEC.md sections 3-5).

- :mod:`.numerics` — rounding to bf16/fp16/fp32 as torch rounds, exact widening, the NaN-aware
  first-argmax of a block and of per-block partials, (key, index) packing into one int64;
- :mod:`.noise` — the device-side MurmurHash3, uniforms, bit-exact log and Gumbel noise, the
  draft and inverse-CDF keys, the Gumbel key ``z / T + g``, and the approximate noise;
- :mod:`.filter` — the exact argmax of Gumbel keys ranked first by approximate noise, on a 1-D
  block (one row) or a 2-D tile (rows x vocabulary);
- :mod:`.rows` — per-sample loaders of slot, temperature, seed and position (padding-safe) and the
  embedding-row gather of the next step's code;
- :mod:`.pick` — the inverse-CDF pick: the vocabulary block, then the token inside it.

Every function here is tested once against the reference in ``tests/ops/``. Designs
(``draft/triton_*.py``, ``verify/triton_*.py``) compose them; they never copy them. Importing a
module of this package imports Triton; ``dspark_markov/__init__`` imports none of them.
"""
