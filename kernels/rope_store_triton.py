"""RoPE on q and k of the fused QKV projection + K/V into the paged pool, in one launch (Triton).

Same contract as `kernels.rope_store_ref.rope_store_ref`: reads `qkv` [T, (Hq + 2 Hkv) * D]
(q heads, k heads, v heads), gathers cos/sin rows at `positions` itself, applies rotate-half RoPE
(Hugging Face layout) to the Hq + Hkv q/k heads in fp32, and
- writes rotated q to a new contiguous q [T, Hq, D] and rotated k to a new contiguous k [T, Hkv, D];
- writes rotated k and the unrotated v into k_cache/v_cache [num_blocks, block_size, Hkv, D] at
  `slot_mapping[t]`, skipping rows whose slot is < 0 (CUDA-graph padding);
- returns (q, k, v) with v a strided view of `qkv` (not copied); `qkv` is not modified.
That is the layout the model had with apply_rope + store_kv, so attention sees the same tensors.

One program handles BLOCK_T whole rows (all heads): replaces the two position gathers, the two
apply_rope chains (~6 kernels each) and store_kv. No host sync and no value-dependent allocation:
safe to capture in a CUDA graph.

Arithmetic is `apply_rope`'s op for op in fp32 (x1*c - x2*s, x2*c + x1*s, each product and sum
rounded separately: FMA contraction is disabled at launch), cast to qkv's dtype, then to the
cache dtype: bit-identical to the eager path in fp32 and bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options
from kernels.triton_compat import patch_interpreter

patch_interpreter()

# From this many rows on, a program takes several rows (tests lower it to reach that path cheaply).
MULTI_ROW_MIN_T = 512


@triton.jit(do_not_specialize=["T"])
def _rope_store_kernel(
    QKV, POS, COS, SIN, KC, VC, SLOT, QO, KO,
    T,
    stride_qkv, stride_cos, stride_sin, stride_qo, stride_ko,
    stride_cb, stride_cs, stride_ch,  # k_cache strides: block, slot-in-block, head (dim stride 1)
    stride_vcb, stride_vcs, stride_vch,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    RH_PAD: tl.constexpr,  # next power of two of (HQ + HKV) * D / 2: the half-heads to rotate
    V_PAD: tl.constexpr,  # next power of two of HKV * D
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/pdl.py)
):
    HALF: tl.constexpr = D // 2
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    rows64 = rows.to(tl.int64)[:, None]
    pos = tl.load(POS + rows, mask=row_ok, other=0).to(tl.int64)[:, None]
    slot = tl.load(SLOT + rows, mask=row_ok, other=-1).to(tl.int64)
    st_ok = row_ok & (slot >= 0)
    slot = tl.where(st_ok, slot, 0)
    blk = (slot // BLOCK_SIZE)[:, None]
    off = (slot % BLOCK_SIZE)[:, None]

    # ---- q and k: column c covers element j of the first half of head `head` (and j + HALF).
    c = tl.arange(0, RH_PAD)
    head = c // HALF
    j = c % HALF
    c_ok = c < (HQ + HKV) * HALF
    m = row_ok[:, None] & c_ok[None, :]
    src = QKV + rows64 * stride_qkv + (head * D + j)[None, :]
    x1 = tl.load(src, mask=m, other=0.0)
    x2 = tl.load(src + HALF, mask=m, other=0.0)
    cs = tl.load(COS + pos * stride_cos + j[None, :], mask=m, other=0.0).to(tl.float32)
    sn = tl.load(SIN + pos * stride_sin + j[None, :], mask=m, other=0.0).to(tl.float32)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    o1 = (x1f * cs - x2f * sn).to(QKV.dtype.element_ty)
    o2 = (x2f * cs + x1f * sn).to(QKV.dtype.element_ty)

    is_q = (head < HQ)[None, :]
    mq = m & is_q
    qdst = QO + rows64 * stride_qo + (head * D + j)[None, :]
    tl.store(qdst, o1, mask=mq)
    tl.store(qdst + HALF, o2, mask=mq)

    kh = head - HQ  # negative on q columns, which are masked off below
    mk = m & (head >= HQ)[None, :]
    kdst = KO + rows64 * stride_ko + (kh * D + j)[None, :]
    tl.store(kdst, o1, mask=mk)
    tl.store(kdst + HALF, o2, mask=mk)
    mkc = mk & st_ok[:, None]
    kc = KC + blk * stride_cb + off * stride_cs + (kh * stride_ch + j)[None, :]
    tl.store(kc, o1.to(KC.dtype.element_ty), mask=mkc)
    tl.store(kc + HALF, o2.to(KC.dtype.element_ty), mask=mkc)

    # ---- v: straight copy into the pool.
    cv = tl.arange(0, V_PAD)
    v_ok = cv < HKV * D
    v = tl.load(QKV + rows64 * stride_qkv + (HQ + HKV) * D + cv[None, :],
                mask=st_ok[:, None] & v_ok[None, :])
    vc = VC + blk * stride_vcb + off * stride_vcs + ((cv // D) * stride_vch + cv % D)[None, :]
    tl.store(vc, v.to(VC.dtype.element_ty), mask=st_ok[:, None] & v_ok[None, :])


def rope_store_triton(
    qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D]
    positions: torch.Tensor,  # [T] int
    cos: torch.Tensor,  # [max_len, D/2] fp32
    sin: torch.Tensor,  # [max_len, D/2] fp32
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int, < 0 = skip
    hq: int,
    hkv: int,
    d: int,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (q [T,Hq,D] new contiguous, k [T,Hkv,D] new contiguous, v [T,Hkv,D] view of qkv)."""
    assert qkv.dim() == 2 and qkv.stride(1) == 1 and qkv.shape[1] == (hq + 2 * hkv) * d
    assert d % 2 == 0
    t = qkv.shape[0]
    assert positions.shape[0] == t and slot_mapping.shape[0] == t
    assert positions.stride(0) == 1 and slot_mapping.stride(0) == 1
    assert cos.shape[1] == d // 2 and sin.shape[1] == d // 2 and cos.stride(1) == 1 and sin.stride(1) == 1
    assert k_cache.shape == v_cache.shape and k_cache.shape[2] == hkv and k_cache.shape[3] == d
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    q = torch.empty((t, hq, d), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((t, hkv, d), dtype=qkv.dtype, device=qkv.device)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    if t == 0:
        return q, k, v
    rh_pad = triton.next_power_of_2((hq + hkv) * (d // 2))
    v_pad = triton.next_power_of_2(hkv * d)
    # Decode: one row per program. Prefill: 4 rows per program (~3K elements for SmolLM2).
    block_t = 1 if t < MULTI_ROW_MIN_T else max(1, min(8, 2048 // rh_pad))
    _rope_store_kernel[(triton.cdiv(t, block_t),)](
        qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, q, k,
        t,
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), k.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HQ=hq, HKV=hkv, D=d, BLOCK_SIZE=k_cache.shape[1], RH_PAD=rh_pad, V_PAD=v_pad, BLOCK_T=block_t, PDL=pdl,
        num_warps=4, enable_fp_fusion=False, **launch_options(pdl),
    )
    return q, k, v
