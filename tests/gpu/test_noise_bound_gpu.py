"""The approximate noise of the Gumbel filter (``impl="fused"``, ``"gumbel_fused"``) is within NOISE_BOUND of the exact noise.

Exhaustive: every one of the 2^32 hashes, so the filter's exactness argument holds for every
token on this GPU (hardware log2 is deterministic per architecture).
"""

import pytest
import torch
import triton
import triton.language as tl

from dspark_markov.ops import noise
from dspark_markov.ops.noise import NOISE_BOUND, approx_gumbel

pytestmark = pytest.mark.gpu


@triton.jit
def _noise_error_kernel(error_ptr, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    h = (start + tl.arange(0, BLOCK)).to(tl.uint32)
    u = noise.uniform32(h)
    error = tl.abs(approx_gumbel(u, True) - noise.gumbel32(u))
    # non-negative fp32 values order like their int32 bit patterns
    tl.atomic_max(error_ptr, tl.max(error, axis=0).to(tl.int32, bitcast=True))


def test_approximate_noise_bound_exhaustive():
    block = 1 << 16
    error = torch.zeros(1, dtype=torch.int32, device="cuda")
    _noise_error_kernel[((1 << 32) // block,)](error, BLOCK=block, num_warps=8, enable_fp_fusion=False)
    worst = float(error.view(torch.float32))
    print(f"max |approximate - exact| noise over all 2^32 hashes: {worst:.3g} (bound {NOISE_BOUND})")
    assert worst <= NOISE_BOUND
