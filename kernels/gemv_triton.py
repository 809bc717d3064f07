"""Small-M linear layer y = x @ W^T for decode batches of a few rows (Triton), with programmatic
dependent launch (PDL).

Why: at batch 1 every projection of SmolLM2 moves 0.7-3.5 MB of weights, 0.2-0.8 us at the H200's
copy bandwidth, yet each cuBLAS GEMV costs ~3.9 us inside a CUDA graph: the launch of a kernel
waits for the previous one to finish, and its first weight bytes then need a DRAM round trip. The
weights do not depend on the previous kernel, so with PDL (Hopper's `griddepcontrol`) this kernel
is launched while the previous one still runs, loads its whole weight slab into registers, and
only then waits for the previous kernel's output (`gdc_wait`) to read the few activations. The
other Triton kernels of a decode step take the same `pdl` switch, so one kernel's prologue overlaps
the previous one's tail all along the chain (kernels/pdl.py states the rule they all follow;
bench/pdl_chain.py, bench/NOTES_kernels.md).

Contract: x [M, K], w [N, K] (row-major, contiguous rows), returns y [M, N] in x's dtype with fp32
accumulation. One program owns BLOCK_N output columns and holds their full K-long weight rows
(K padded to a power of two, masked), then loads all M rows of x at once (M padded to a power of two,
masked) and reduces the [M, BLOCK_N, K] product over K. Meant for M <= MAX_M.

Why all rows at once: a loop over the rows issued one x load and one cross-warp reduction after another,
and each extra row cost ~0.7 us a projection on the H100 (30 layers' norms and projections at M = 8: 833 us
against cuBLAS's 648 us). One load and one reduction of every row: 481 us at M = 8 (bench/small_m_chain.py,
bench/NOTES_kernels.md v58).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_supported
from kernels.triton_compat import patch_interpreter

patch_interpreter()

MAX_M = 8
# Output columns per program. Measured on the H200 (bench/pdl_chain.py, graph-replayed, M = 1): 4
# is the best or within 3 % of it for every projection of SmolLM2 (QKV, O, gate_up, down).
DEFAULT_BLOCK_N = 4
# Elements of a program's weight slab per thread kept in registers (bf16); more warps above it.
_ELEMS_PER_WARP = 2048


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    X, W, Y,
    M, N,
    stride_xm, stride_wn, stride_ym,
    K: tl.constexpr,
    ROWS: tl.constexpr,  # M padded to a power of two: one compiled variant per padded row count
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    k_ok = k < K
    w = tl.load(W + n.to(tl.int64)[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
    m = tl.arange(0, ROWS)
    m_ok = m < M
    x = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                other=0.0).to(tl.float32)
    y = tl.sum(w[None, :, :] * x[:, None, :], axis=2)  # [ROWS, BLOCK_N]
    tl.store(Y + m[:, None] * stride_ym + n[None, :], y.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def gemv_num_warps(block_n: int, block_k: int) -> int:
    """Warps of one program: ~_ELEMS_PER_WARP weights each, 1-16, a power of two."""
    warps = max(1, min(16, block_n * block_k // _ELEMS_PER_WARP))
    return 1 << (warps.bit_length() - 1)


def gemv_triton(x: torch.Tensor, w: torch.Tensor, *, pdl: bool = False, block_n: int | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T for x [M, K] with M <= MAX_M (see the module docstring)."""
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1]
    assert x.stride(1) == 1 and w.stride(1) == 1
    m, k = x.shape
    n = w.shape[0]
    assert m <= MAX_M, f"gemv_triton is for at most {MAX_M} rows, got {m}"
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bn = block_n or DEFAULT_BLOCK_N
    bk = triton.next_power_of_2(k)
    warps = gemv_num_warps(bn, bk)
    use_pdl = pdl and pdl_supported(x.device)
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, w, out, m, n, x.stride(0), w.stride(0), out.stride(0),
        K=k, ROWS=triton.next_power_of_2(m), BLOCK_N=bn, BLOCK_K=bk, PDL=use_pdl, num_warps=warps,
        **launch_options(use_pdl))
    return out


# Past this many output columns cuBLAS is as fast (the LM head: 49152 columns, bandwidth-bound).
MAX_N = 16384


def gemv_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the engine's projection (`Kernels.linear`) takes the GEMV path for these shapes (else cuBLAS)."""
    return x.shape[0] <= MAX_M and w.shape[0] <= MAX_N and x.stride(-1) == 1 and w.stride(-1) == 1
