"""RMSNorm with an optional fused residual add (torch reference).

`rmsnorm_ref(x, w, eps)` is exactly `LlamaModel._rmsnorm`: normalise in fp32 (fp64 for fp64 x), cast to x's dtype,
then multiply by the weight in that dtype. With `residual`, `h = x + residual` (in x's dtype, as the
model's `h = h + linear(...)`) is computed first and returned as the new residual stream:

    x, h = rmsnorm(o_proj_out, mlp_norm_w, eps, residual=h)   # h += o_proj_out; x = norm(h)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.precision import at_least_fp32


def rmsnorm_ref(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H], x's dtype
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H], x's dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (rmsnorm(h) * weight, h) with h = x + residual, or (rmsnorm(x) * weight, None)."""
    h = x if residual is None else x + residual
    if h.device.type == "cpu" and h.dtype == torch.float32 and weight.dtype == torch.float32:
        # The same arithmetic in one op instead of six (each op costs microseconds on a small CPU);
        # bit-identical to the lines below for fp32 on the CPU (tests/test_fused_kernels.py).
        return F.rms_norm(h, (h.shape[-1],), weight, eps), (None if residual is None else h)
    hf = at_least_fp32(h)
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight
    return normed, (None if residual is None else h)
