"""RMSNorm with an optional fused residual add (torch reference).

`rmsnorm_ref(x, w, eps)` is exactly `LlamaModel._rmsnorm`: normalise in fp32, cast to x's dtype,
then multiply by the weight in that dtype. With `residual`, `h = x + residual` (in x's dtype, as the
model's `h = h + linear(...)`) is computed first and returned as the new residual stream:

    x, h = rmsnorm(o_proj_out, mlp_norm_w, eps, residual=h)   # h += o_proj_out; x = norm(h)
"""
from __future__ import annotations

import torch


def rmsnorm_ref(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H], x's dtype
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H], x's dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (rmsnorm(h) * weight, h) with h = x + residual, or (rmsnorm(x) * weight, None)."""
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight
    return normed, (None if residual is None else h)
