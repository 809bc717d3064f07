"""The one dtype rule of the torch reference arithmetic: compute in at least fp32.

bf16 and fp16 inputs are computed in fp32 (what the GPU engine's references do); fp32 stays fp32; fp64 stays
fp64, so that a test can run a whole model in fp64 and compare two orders of the same arithmetic without fp32
rounding (30 layers of it) in the way.
"""
from __future__ import annotations

import torch


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in its own dtype when that is wider (fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
