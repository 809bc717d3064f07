"""SwiGLU activation on the fused gate/up projection (torch reference): silu(gate) * up, where
gate is the first half of the columns and up the second (`torch.cat([gate_w, up_w])` order)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
