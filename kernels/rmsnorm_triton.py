"""RMSNorm with an optional fused residual add (Triton).

Same contract as `kernels.rmsnorm_ref.rmsnorm_ref`. One program normalises BLOCK_T whole rows
(all H columns in registers, H a compile-time constant so the masked loads vectorise), so a
decode row is one program and a prefill of thousands of rows a few thousand. With `residual`
the kernel also writes `h = x + residual` (the new residual stream) from the same registers:
one launch instead of add + the ~7 kernels of the eager norm. No host sync and no
value-dependent allocation: safe to capture in a CUDA graph.

Arithmetic follows `LlamaModel._rmsnorm` op for op so fp32 matches the eager path to the last
bit except for the order of the sum of squares: h = x + r rounded to x's dtype; mean of h^2 in
fp32 as sum * fp32(1/H) (torch's CUDA mean); `rsqrt` = `__nv_rsqrtf` (torch's CUDA rsqrt);
normalised value cast to the dtype, then multiplied by w with the product rounded to the dtype
(a bf16/fp16 product is exact in fp32, so this equals torch's dtype multiply). FMA contraction is
disabled at launch so no multiply-add pair is fused differently from torch's separate kernels.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels.pdl import launch_options
from kernels.triton_compat import patch_interpreter

patch_interpreter()

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# From this many rows on, a program takes several rows (tests lower it to reach that path cheaply).
MULTI_ROW_MIN_T = 512


@triton.jit(do_not_specialize=["T"])
def _rmsnorm_kernel(
    X, R, W, OUT, HOUT,
    T, eps, inv_h,
    stride_x, stride_r, stride_o, stride_h,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PRECISE: tl.constexpr,  # libdevice rsqrt (CUDA); the interpreter has no libdevice
    PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/pdl.py)
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    m = (rows < T)[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    w = tl.load(W + cols, mask=col_ok, other=0.0)  # constant: read before waiting
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=m, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows64 * stride_r + cols[None, :], mask=m, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(OUT.dtype.element_ty)
        tl.store(HOUT + rows64 * stride_h + cols[None, :], h, mask=m)
    else:
        h = x
    hf = h.to(tl.float32)
    ms = tl.sum(hf * hf, axis=1) * inv_h + eps
    if PRECISE:
        rs = libdevice.rsqrt(ms)
    else:
        rs = tl.math.rsqrt(ms)
    y = (hf * rs[:, None]).to(OUT.dtype.element_ty)
    out = (y.to(tl.float32) * w.to(tl.float32)[None, :]).to(OUT.dtype.element_ty)
    tl.store(OUT + rows64 * stride_o + cols[None, :], out, mask=m)


def rmsnorm_triton(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H], x's dtype
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H], x's dtype
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (rmsnorm(h) * weight, h) with h = x + residual, or (rmsnorm(x) * weight, None).
    Both outputs are new contiguous tensors; the inputs are not modified."""
    assert x.dim() == 2 and x.stride(1) == 1
    t, hdim = x.shape
    assert weight.shape == (hdim,) and weight.stride(0) == 1 and weight.dtype == x.dtype
    out = torch.empty((t, hdim), dtype=x.dtype, device=x.device)
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1 and residual.dtype == x.dtype
        new_res = torch.empty_like(out)
    else:
        new_res = None
    if t == 0:
        return out, new_res
    block_h = triton.next_power_of_2(hdim)
    # Decode (small T): one row per program, as many programs as rows. Prefill: ~4K elements per
    # program (4 rows of 576 padded to 1024 for SmolLM2).
    block_t = 1 if t < MULTI_ROW_MIN_T else max(1, min(8, 4096 // block_h))
    num_warps = 4 if block_t * block_h <= 2048 else 8
    r = residual if residual is not None else x
    hout = new_res if new_res is not None else out
    # torch's CUDA mean multiplies the sum by fp32(1/H); the Python float is passed as fp32, and
    # rounding 1/H via double gives the same fp32 as torch's float division for every H < 70000.
    inv_h = 1.0 / hdim
    _rmsnorm_kernel[(triton.cdiv(t, block_t),)](
        x, r, weight, out, hout,
        t, float(eps), inv_h,
        x.stride(0), r.stride(0), out.stride(0), hout.stride(0),
        H=hdim, BLOCK_H=block_h, BLOCK_T=block_t, HAS_RESIDUAL=residual is not None,
        PRECISE=not _INTERPRET, PDL=pdl,
        num_warps=num_warps, enable_fp_fusion=False, **launch_options(pdl),
    )
    return out, new_res
