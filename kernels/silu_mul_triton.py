"""SwiGLU activation on the fused gate/up projection (Triton): out = silu(gate) * up.

Same contract as `kernels.silu_mul_ref.silu_mul_ref`: gate is the first I columns of gate_up
[T, 2I], up the last I. Grid: (row blocks, column blocks of BLOCK_I); I is a compile-time constant
so the masked loads vectorise. One launch replaces chunk + silu + mul. No host sync and no
value-dependent allocation: safe to capture in a CUDA graph.

Arithmetic follows torch's CUDA kernels op for op: silu(g) = g / (1 + exp(-g)) in fp32 with the
accurate `__nv_expf` (Triton's tl.exp is ex2.approx) and an IEEE division (Triton's `/` is
div.full, ~2 ulp), rounded to the dtype (F.silu's output), then multiplied by up with the product
rounded to the dtype. So fp32 and bf16 match the eager path bit for bit (up to denormals).
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
def _silu_mul_kernel(
    GU, OUT,
    T,
    stride_g, stride_o,
    I: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_I: tl.constexpr,
    PRECISE: tl.constexpr,  # libdevice expf (CUDA); the interpreter has no libdevice
    PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/pdl.py)
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid_t = tl.program_id(0)
    pid_i = tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (rows < T)[:, None] & (cols < I)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    g_ptr = GU + rows64 * stride_g + cols[None, :]
    g = tl.load(g_ptr, mask=m, other=0.0).to(tl.float32)
    u = tl.load(g_ptr + I, mask=m, other=0.0).to(tl.float32)
    if PRECISE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    s = tl.math.div_rn(g, 1.0 + e).to(OUT.dtype.element_ty)
    out = (s.to(tl.float32) * u).to(OUT.dtype.element_ty)
    tl.store(OUT + rows64 * stride_o + cols[None, :], out, mask=m)


def _block_i(i: int) -> int:
    """Largest power of two <= 1024 dividing I (no masked tail: 512 for I = 1536), else the next
    power of two capped at 1024."""
    b = 1024
    while b >= 64:
        if i % b == 0:
            return b
        b //= 2
    return min(1024, triton.next_power_of_2(i))


def silu_mul_triton(gate_up: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:  # [T, 2I] -> [T, I], new contiguous
    assert gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.shape[1] % 2 == 0
    t, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block_i = _block_i(i)
    block_t = 1 if t < MULTI_ROW_MIN_T else max(1, min(8, 2048 // block_i))
    grid = (triton.cdiv(t, block_t), triton.cdiv(i, block_i))
    _silu_mul_kernel[grid](
        gate_up, out, t, gate_up.stride(0), out.stride(0),
        I=i, BLOCK_T=block_t, BLOCK_I=block_i, PRECISE=not _INTERPRET, PDL=pdl,
        num_warps=4, enable_fp_fusion=False, **launch_options(pdl),
    )
    return out
