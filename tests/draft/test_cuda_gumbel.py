"""``impl="cuda_gumbel"`` on the CPU: what can be checked without a GPU.

- ``blocks.cu`` compiles for sm_90 (the package's NVRTC path, else ``nvcc``; skipped without either)
  with no stack frame;
- the ctypes argument struct matches ``struct BlocksArgs`` field by field;
- the kernel's skip threshold is sound: a token whose bound lies below the threshold of a seed key
  ``k`` has bound + ``key_slack(bound)`` below ``k`` (so its exact key, which the chain's test shows
  is below bound + key_slack, cannot reach ``k``, ties included);
- the backend refuses the CPU and bad arguments, and says why it cannot run.
The draws themselves are checked on the H200 (tests/gpu/test_cuda_gumbel_gpu.py).
"""

import ctypes
import re

import numpy as np
import pytest
import torch

import dspark_markov as dm
from dspark_markov.cuda import BLOCKS_KERNELS, build
from tests.helpers import assert_args_struct_matches, sm90_compile_log

cuda_gumbel = pytest.importorskip("dspark_markov.draft.cuda_gumbel")  # imports Triton (the combine)

F32 = np.float32


def test_blocks_kernels_compile_for_sm90(tmp_path):
    """NVRTC (the path the backend uses; every entry point) if a libnvrtc is found, else nvcc (two entry
    points); skipped without either."""
    # nvcc: two entry points (every template bit both ways): the 16 take ~13 s with nvcc, too long for CPU CI.
    log, nvrtc = sm90_compile_log("blocks.cu", tmp_path, ("DM_BLOCKS_TWO_ENTRIES",))
    if not nvrtc:
        names = ("dm_blocks_b0_c0_v1_s0", "dm_blocks_b1_c1_v0_s1", "dm_blocks_noise_table", "dm_blocks_table_floats")
    else:
        names = BLOCKS_KERNELS
    for name in names:
        assert f"'{name}'" in log, name
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) <= 96, log  # variants 5 and 7 (<= 64 registers) spill a few words


def test_args_struct_matches_the_kernel():
    assert_args_struct_matches("blocks.cu", "BlocksArgs", cuda_gumbel.BlocksArgs._fields_)
    assert ctypes.sizeof(cuda_gumbel.BlocksArgs) == 8 * len(cuda_gumbel.BlocksArgs._fields_)
    text = (build.SOURCE_DIR / "blocks.cu").read_text()
    assert "#define DM_CHUNK (32 * DM_PER)" in text and "#define DM_PER (8 * DM_GROUPS)" in text
    assert "#define DM_GROUPS 2 " in text and cuda_gumbel.CHUNK == 32 * 16


def key_slack(value, margin):  # noise.cuh dm::key_slack, in fp32 (numpy rounds each operation to nearest)
    return F32(margin) + (np.abs(value) + F32(64.0)) * F32(2.0**-20)


def test_skip_threshold_is_below_every_reachable_bound():
    """blocks.cu phase 2 skips a token iff bound < thr = k - margin - (|k| + 64) 2^-19 (fp32 operations).
    The largest skipped bound (the float just below thr) plus its key_slack must stay below k; bound +
    key_slack(bound) is non-decreasing (tests/draft/test_cuda_chain.py), so every smaller bound is too."""
    gen = np.random.default_rng(5)
    n = 1 << 16
    k = np.concatenate([gen.normal(0, 8, n // 2), gen.normal(0, 3e4, n // 4), gen.uniform(-3e38, 3e38, n // 4),
                        [0.0, -0.0, 1e-30, -1e-30, 64.0, -64.0]]).astype(F32)
    for margin in (0.0, 1e-4, 0.5):
        thr = (k - F32(margin)) - (np.abs(k) + F32(64.0)) * F32(2.0**-19)
        below = np.nextafter(thr, F32(-np.inf))
        finite = np.isfinite(below) & np.isfinite(k)
        reach = below + key_slack(below, margin)
        assert bool(np.all(reach[finite] < k[finite])), margin


def test_backend_refuses_cpu_and_bad_arguments():
    head = dm.MarkovHead(torch.zeros(300, 256, dtype=torch.bfloat16), torch.zeros(300, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="impl"):
        dm.MarkovSampler(head, 5, 4, impl="cuda_gumbel")
    with pytest.raises(ValueError, match="device"):
        cuda_gumbel.CudaGumbelBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cpu")
    # Option checks come first (named before the device check), so they are testable without a GPU.
    for option, value in (("filter_margin", -1e-3), ("filter_margin", float("nan")), ("filter_margin", "0.1"),
                          ("range_chunks", 3), ("range_chunks", 4.0), ("range_chunks", True),
                          ("blocks_per_sm", 0), ("blocks_per_sm", 2.5)):
        with pytest.raises(ValueError, match=option):
            cuda_gumbel.CudaGumbelBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cpu",
                                          **{option: value})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            cuda_gumbel.CudaGumbelBackend(head, 5, 4, method="gumbel", cache_dtype=torch.bfloat16, device="cuda")
        assert "no CUDA GPU" in cuda_gumbel.CudaGumbelBackend.unavailable_reason()
