"""Batched LoRA (torch reference): every row of a packed batch adds its own adapter's low-rank
update to a linear's output, y[t] += B[s_t] (A[s_t] x[t]), with s_t the row's adapter slot.

This is the operation multi-LoRA servers (Punica's SGMV/BGMV, S-LoRA) run after the base model's
shared GEMM: the base weights are read once for the whole batch, each adapter's A and B only for
its rows. Contract (the Triton kernel in `kernels/lora_triton.py` has the same signature):

- y [T, N]: the base linear's output, updated in place and returned;
- x [T, K]: the linear's input;
- A [S, R, K], B [S, N, R]: one stacked pair per adapter slot (the adapter's scale alpha/r is folded
  into B; an adapter of lower rank than R, or one that leaves a target out, is zero-padded);
- slots [T] int32: each row's slot, -1 for rows without an adapter (left bit for bit as they were).

Arithmetic: both products accumulate in fp32; the update is rounded to y's dtype once, when added.
"""
from __future__ import annotations

import torch


def lora_apply_ref(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   slots: torch.Tensor) -> torch.Tensor:
    # Rows are grouped by slot (SGMV's segments): one pair of small matmuls per adapter present,
    # not per row. torch.unique syncs with the device, which the reference may do.
    for s in torch.unique(slots).tolist():
        if s < 0:
            continue
        rows = (slots == s).nonzero().squeeze(1)
        v = x[rows].float() @ A[s].float().T  # [n, R]: the shrink
        y[rows] += (v @ B[s].float().T).to(y.dtype)  # [n, N]: the expand
    return y


def lora_cost(T_active: int, R: int, K: int, N: int, slots_used: int, element_size: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one call: two matmuls per adapted row; each used slot's A and B read once,
    the adapted rows' x read and y read and written."""
    flops = 2.0 * T_active * R * (K + N)
    nbytes = (slots_used * R * (K + N) + T_active * (K + 2 * N)) * element_size
    return flops, float(nbytes)
