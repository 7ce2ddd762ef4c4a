"""Plain constants of the ops layer (no Triton import): the interpreter switch, the noise bound, the margin.

:mod:`.noise` and :mod:`.filter` (Triton), the CUDA C++ chain (:mod:`dspark_markov.draft.cuda_chain`)
and :func:`dspark_markov.validate.check_triton_runs` read them from here, so each is written once.
"""

import os

# Read once: TRITON_INTERPRET must be set before any kernel is defined (before Triton is imported).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Bound on |approximate - exact| Gumbel noise; measured worst case on the H200: 3.34e-6
# (tests/gpu/test_noise_bound_gpu.py checks it over all 2^32 hashes).
NOISE_BOUND = 2.5e-5
# Twice the error of an approximate key (two keys compared), with a margin of 2.
FILTER_MARGIN = 4 * NOISE_BOUND

# Candidates one program of the fused top-k drafting design holds (a [k, BLOCK_RANK] tile of W2 rows per
# chunk; draft/triton_top_k.py); ``auto`` sends larger ``draft_top_k`` to the reference.
MAX_TOP_K = 1024
