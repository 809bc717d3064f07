"""Integer weight grids: asymmetric min-max quantization with one scale and zero point per group of input
channels, round-to-nearest. What GPTQ and AWQ checkpoints store (4-bit codes, an FP16 scale and zero point
per group of 128 inputs of each output row), with the bytes counted as such a checkpoint lays them out."""
from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_BYTES = 2  # FP16 scale
ZERO_BYTES = 2  # FP16 zero point (AWQ packs zeros in 4 bits; GPTQ in the code width: FP16 is the upper bound)
MIN_RANGE = 1e-8  # a constant group still gets a nonzero scale


@dataclass(frozen=True, slots=True)
class Grid:
    """`bits`-bit codes, one scale and zero point per `group` consecutive input channels of a row (`group`
    0: one per row, "per channel")."""

    bits: int
    group: int = 128

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 8:
            raise ValueError(f"weight bits must be 2 to 8, not {self.bits}")
        if self.group < 0:
            raise ValueError("the group size cannot be negative")

    @property
    def levels(self) -> int:
        return 2 ** self.bits - 1

    def group_size(self, in_features: int) -> int:
        g = self.group or in_features
        if in_features % g:
            raise ValueError(f"group {g} does not divide {in_features} input channels")
        return g

    @property
    def label(self) -> str:
        return f"INT{self.bits} " + ("per channel" if self.group == 0 else f"g{self.group}")

    def bytes_for(self, out_features: int, in_features: int) -> int:
        """Codes packed `bits` to the byte, plus a scale and a zero point per group."""
        groups = out_features * (in_features // self.group_size(in_features))
        return (out_features * in_features * self.bits + 7) // 8 + groups * (SCALE_BYTES + ZERO_BYTES)

    def bits_per_weight(self, in_features: int) -> float:
        return self.bits + 8 * (SCALE_BYTES + ZERO_BYTES) / self.group_size(in_features)


def group_params(w: torch.Tensor, grid: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point for w [rows, n] taken as one group per row: min-max, the range always covering 0."""
    lo = w.amin(dim=1).clamp(max=0)
    hi = w.amax(dim=1).clamp(min=0)
    scale = ((hi - lo) / grid.levels).clamp(min=MIN_RANGE)
    zero = torch.round(-lo / scale)
    return scale, zero


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Round w [rows, ...] to the grid of each row's (scale, zero) and return the dequantized values."""
    shape = (-1,) + (1,) * (w.dim() - 1)
    s, z = scale.reshape(shape), zero.reshape(shape)
    q = torch.clamp(torch.round(w / s) + z, 0, grid.levels)
    return (q - z) * s


def round_to_nearest(w: torch.Tensor, grid: Grid) -> torch.Tensor:
    """w [out, in] quantized group by group and dequantized (fp32): plain round-to-nearest, no calibration."""
    out_f, in_f = w.shape
    g = grid.group_size(in_f)
    groups = w.float().reshape(out_f * (in_f // g), g)
    scale, zero = group_params(groups, grid)
    return quantize_with(groups, scale, zero, grid).reshape(out_f, in_f)
