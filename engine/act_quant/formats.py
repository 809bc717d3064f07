"""Low-precision number formats as fake quantization: quantize, then dequantize, all in fp32.

A W8A8 or FP8 GEMM multiplies low-precision codes and applies the scales to the fp32 accumulator; the result
equals an fp32 matmul of the dequantized values (up to the accumulator's own rounding). So to see what a
format does to the model's outputs it is enough to round each tensor onto the format's grid and multiply in
fp32, which is what these functions are for. There is no FP8 or FP4 GEMM here.

Formats:
  INT8: symmetric, s = amax / 127, x̂ = s · clamp(round(x / s), -127, 127).
  FP8 E4M3: s = amax / 448 (E4M3's largest finite value), x̂ = s · e4m3(x / s) (torch.float8_e4m3fn cast).
  NVFP4: FP4 E2M1 values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} in blocks of 16 along the input dimension, each block
    with an FP8 E4M3 scale (amax_block / 6), and one fp32 scale per tensor that brings the block scales into
    FP8's range (as NVIDIA's NVFP4 does; for activations it is calibrated in advance, like a static FP8 scale).
  MXFP4: the same E2M1 values in blocks of 32 with a power-of-two scale (OCP Microscaling: an 8-bit exponent,
    2^(floor(log2 amax_block) - 2); values above 6 saturate).

Granularity of INT8 and FP8 scales: "tensor" (one scale) or "row" (one per row: per token for activations
[tokens, in], per output channel for weights [out, in]). FP4 formats always use their block scales along the
last dimension (the input dimension of both activations and weights, the GEMM's reduction dimension).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kernels.precision import at_least_fp32

FormatName = Literal["int8", "fp8", "nvfp4", "mxfp4"]
Granularity = Literal["tensor", "row"]

INT8_MAX = 127.0
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_MAX = 6.0
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes
MX_ELEM_EMAX = 2  # E2M1's largest exponent: 6 = 1.5 · 2^2
TINY = 1e-12  # an all-zero tensor or block still gets a nonzero scale

_FP4 = torch.tensor(FP4_VALUES)
_FP4_MIDPOINTS = (_FP4[1:] + _FP4[:-1]) / 2


@dataclass(frozen=True, slots=True)
class Format:
    """A number format as a GEMM input: its element bits, the block its scale covers (0: per tensor or row,
    chosen by the caller) and the bits each scale costs, spread over the block."""

    name: FormatName
    label: str
    element_bits: int
    block: int = 0
    scale_bits: int = 0

    @property
    def bits(self) -> float:
        """Bits per value, block scales included (per-tensor or per-row scales are negligible: 0)."""
        return self.element_bits + (self.scale_bits / self.block if self.block else 0.0)


FORMATS: dict[FormatName, Format] = {
    "int8": Format("int8", "INT8", 8),
    "fp8": Format("fp8", "FP8 E4M3", 8),
    "nvfp4": Format("nvfp4", "NVFP4", 4, block=16, scale_bits=8),
    "mxfp4": Format("mxfp4", "MXFP4", 4, block=32, scale_bits=8),
}


def _amax(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """The largest |x| per tensor ([1, 1]) or per row ([rows, 1])."""
    if granularity == "tensor":
        return x.abs().amax().reshape(1, 1)
    if granularity == "row":
        return x.abs().amax(dim=-1, keepdim=True)
    raise ValueError(f"granularity must be 'tensor' or 'row', not {granularity!r}")


def int8_scale(amax: torch.Tensor) -> torch.Tensor:
    return amax.clamp(min=TINY) / INT8_MAX


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    return amax.clamp(min=TINY) / FP8_MAX


def fake_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x on the symmetric INT8 grid of `scale` (broadcast), values beyond ±127 steps clipped."""
    return torch.clamp(torch.round(x / scale), -INT8_MAX, INT8_MAX) * scale


def fake_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x rounded to FP8 E4M3 after dividing by `scale` (saturating at ±448: the cast alone would give NaN)."""
    y = torch.clamp(x / scale, -FP8_MAX, FP8_MAX)
    return y.to(torch.float8_e4m3fn).to(y.dtype) * scale


def round_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Each value to the nearest FP4 E2M1 value (saturating at ±6; a tie goes to the larger magnitude)."""
    idx = torch.bucketize(y.abs(), _FP4_MIDPOINTS.to(y.device), right=True)
    return torch.sign(y) * _FP4.to(y.device)[idx]


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"blocks of {block} do not divide the last dimension ({n})")
    return x.reshape(*x.shape[:-1], n // block, block)


def nvfp4_scales(x: torch.Tensor, amax: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4's effective scale per block of 16 ([..., blocks, 1]): an FP8 E4M3 block scale amax/6, relative to a
    per-tensor fp32 scale amax_tensor / (448 · 6) so the largest block scale lands on FP8's 448. `amax`: the
    tensor's largest |x| fixed in advance (activations: calibrated, as NVIDIA's NVFP4 checkpoints ship it); a block
    beyond it saturates its FP8 scale at 448 and clips. None: x's own (weights, known when quantized)."""
    xb = _blocks(x, FORMATS["nvfp4"].block)
    top = x.abs().amax() if amax is None else amax.reshape(())
    tensor_scale = (top.clamp(min=TINY) / (FP8_MAX * FP4_MAX))
    block = xb.abs().amax(dim=-1, keepdim=True) / FP4_MAX / tensor_scale
    block = block.clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float()
    return block.clamp(min=TINY) * tensor_scale


def mxfp4_scales(x: torch.Tensor) -> torch.Tensor:
    """MXFP4's scale per block of 32 ([..., blocks, 1]): 2^(floor(log2 amax) - 2), a power of two (E8M0)."""
    xb = _blocks(x, FORMATS["mxfp4"].block)
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp(min=TINY)
    return torch.exp2(torch.floor(torch.log2(amax)) - MX_ELEM_EMAX)


def fake_fp4(x: torch.Tensor, fmt: FormatName, amax: torch.Tensor | None = None) -> torch.Tensor:
    """x on the E2M1 grid of its NVFP4 or MXFP4 block scales (`amax`: NVFP4's static per-tensor range, see
    `nvfp4_scales`; MXFP4 has no per-tensor scale)."""
    scales = nvfp4_scales(x, amax) if fmt == "nvfp4" else mxfp4_scales(x)
    xb = _blocks(x, FORMATS[fmt].block)
    return (round_e2m1(xb / scales) * scales).reshape(x.shape)


def scale_for(fmt: FormatName, amax: torch.Tensor) -> torch.Tensor:
    """The INT8 or FP8 scale that maps `amax` to the format's largest value."""
    return int8_scale(amax) if fmt == "int8" else fp8_scale(amax)


def fake_quant(x: torch.Tensor, fmt: FormatName, granularity: Granularity = "tensor",
               amax: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] quantized to `fmt` and dequantized (fp32, or fp64 for fp64 x: a test runs the dense pass in
    fp64 so that float rounding cannot tip a code). INT8 and FP8: one scale per tensor or per row, from x's own
    largest |x| (dynamic) or from `amax` (static, e.g. calibrated; what lies beyond it clips). FP4 formats: their
    block scales (granularity does not apply; `amax` sets NVFP4's per-tensor scale)."""
    x = at_least_fp32(x)
    if fmt in ("nvfp4", "mxfp4"):
        return fake_fp4(x, fmt, amax)
    if fmt not in ("int8", "fp8"):
        raise ValueError(f"unknown format {fmt!r}")
    scale = scale_for(fmt, _amax(x, granularity) if amax is None else amax)
    return fake_int8(x, scale) if fmt == "int8" else fake_fp8(x, scale)
