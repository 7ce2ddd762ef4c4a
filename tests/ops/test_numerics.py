"""ops.numerics against torch: rounding, widening, the NaN-aware argmax and key packing (once each)."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from dspark_markov.draft.reference import argmax_first  # noqa: E402
from dspark_markov.ops import numerics  # noqa: E402

NEG_INF = float("-inf")


def same_bits(a, b):
    """Bit equality of two float tensors of one dtype, any NaN matching any NaN."""
    ints = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return bool(((a.view(ints) == b.view(ints)) | (torch.isnan(a) & torch.isnan(b))).all())


@triton.jit
def _widen_round_kernel(x_ptr, wide_ptr, y_ptr, narrow_ptr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(wide_ptr + cols, numerics.to_float32(tl.load(x_ptr + cols)))
    tl.store(narrow_ptr + cols, numerics.round_to(tl.load(y_ptr + cols), tl.bfloat16))


def test_bf16_rounding_helpers_are_exact():
    """The bit-level bf16 helpers agree with torch on every bf16 value and on awkward fp32 values."""

    every_bf16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    awkward = torch.tensor([float("nan"), float("inf"), NEG_INF, 3.4e38, -3.4e38, 3.3961e38, 1e-40, -1e-45, 0.0,
                            -0.0, 1.00390625, 1.01171875, 1.0 + 2**-8 + 2**-20, -(1.0 + 2**-8)])
    random_bits = torch.randint(-(2**31), 2**31 - 1, (65536 - awkward.numel(),), generator=gen).to(torch.int32)
    fp32_values = torch.cat([awkward, random_bits.view(torch.float32)])
    wide = torch.empty(65536)
    narrow = torch.empty(65536, dtype=torch.bfloat16)
    _widen_round_kernel[(1,)](every_bf16, wide, fp32_values, narrow, BLOCK=65536, enable_fp_fusion=False)
    assert same_bits(wide, every_bf16.float())
    assert same_bits(narrow, fp32_values.to(torch.bfloat16))


@triton.jit
def _round_kernel(x_ptr, out_ptr, back_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    rounded = numerics.round_to(x, tl.bfloat16)
    tl.store(out_ptr + offs, rounded, mask=offs < n)
    tl.store(back_ptr + offs, numerics.to_float32(rounded), mask=offs < n)


def test_round_to_bf16_matches_torch_bit_for_bit():
    """The shared software RTNE rounding (the interpreter's own cast truncates) equals torch's."""
    g = torch.Generator().manual_seed(3)
    ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7F8000, 0xFF7FFFFF, 0x00008000, 0x00018000,
                         0x807F8000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x00000001, 0x80000000],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([ties, torch.randn(1000, generator=g) * 10.0 ** torch.randint(-40, 38, (1000,), generator=g)])
    out = torch.empty(x.shape[0], dtype=torch.bfloat16)
    back = torch.empty(x.shape[0], dtype=torch.float32)
    _round_kernel[(1,)](x, out, back, x.shape[0], BLOCK=2048)
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert bool(torch.isnan(out)[nan].all())
    assert torch.equal(out[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.equal(back[~nan], want[~nan].float())
