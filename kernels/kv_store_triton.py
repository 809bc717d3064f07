"""Write this step's keys and values into the paged pool by slot mapping (Triton).

Same contract as `kernels.kv_store_ref.store_kv_ref`: row t of k/v goes to slot
`slot_mapping[t] = block_id * block_size + offset` of every layer-pool tensor
`[num_blocks, block_size, Hkv, D]`; a negative slot means "padding row, skip it" (CUDA-graph
padding). One program moves BLOCK_T rows of K and V (all heads), so a prefill of thousands of
tokens is a few hundred programs, not one per token. No host sync, no value-dependent sizes: safe to
capture in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_compat import patch_interpreter

patch_interpreter()


@triton.jit
def _store_kv_kernel(
    K, V, KC, VC, SLOT,
    T,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,  # k_cache strides: block, slot-in-block, head (dim stride 1)
    stride_vcb, stride_vcs, stride_vch,
    BLOCK_SIZE: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HD_PAD: tl.constexpr,  # next power of two of HKV * HEAD_DIM
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    slot = tl.load(SLOT + rows, mask=row_ok, other=-1).to(tl.int64)
    ok = row_ok & (slot >= 0)
    slot = tl.where(ok, slot, 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE

    cols = tl.arange(0, HD_PAD)
    h = cols // HEAD_DIM
    d = cols % HEAD_DIM
    col_ok = cols < HKV * HEAD_DIM
    m = ok[:, None] & col_ok[None, :]

    rows64 = rows.to(tl.int64)
    k = tl.load(K + rows64[:, None] * stride_kt + h[None, :] * stride_kh + d[None, :], mask=m)
    v = tl.load(V + rows64[:, None] * stride_vt + h[None, :] * stride_vh + d[None, :], mask=m)
    kdst = KC + blk[:, None] * stride_cb + off[:, None] * stride_cs + h[None, :] * stride_ch + d[None, :]
    vdst = VC + blk[:, None] * stride_vcb + off[:, None] * stride_vcs + h[None, :] * stride_vch + d[None, :]
    tl.store(kdst, k.to(KC.dtype.element_ty), mask=m)
    tl.store(vdst, v.to(VC.dtype.element_ty), mask=m)


def store_kv_triton(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int, < 0 = skip
) -> None:
    t, hkv, d = k.shape
    if t == 0:
        return
    assert v.shape == k.shape and k_cache.shape == v_cache.shape
    assert k_cache.shape[2] == hkv and k_cache.shape[3] == d
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert slot_mapping.shape[0] == t
    hd_pad = triton.next_power_of_2(hkv * d)
    # ~4K elements per program: 16 rows of 3 x 64 (padded to 256) for SmolLM2.
    block_t = max(1, min(16, 4096 // hd_pad))
    grid = (triton.cdiv(t, block_t),)
    _store_kv_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping,
        t,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], HKV=hkv, HEAD_DIM=d, HD_PAD=hd_pad, BLOCK_T=block_t,
        num_warps=4,
    )
