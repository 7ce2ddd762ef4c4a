"""The approximate noise's error bound and the filter's margin, as plain floats (no Triton import).

:mod:`.noise` and :mod:`.filter` (Triton) and the CUDA C++ chain (:mod:`dspark_markov.draft.cuda_chain`)
read them from here, so the margin every filter uses is written once.
"""

# Bound on |approximate - exact| Gumbel noise; measured worst case on the H200: 3.34e-6
# (tests/gpu/test_noise_bound_gpu.py checks it over all 2^32 hashes).
NOISE_BOUND = 2.5e-5
# Twice the error of an approximate key (two keys compared), with a margin of 2.
FILTER_MARGIN = 4 * NOISE_BOUND
