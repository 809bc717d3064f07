"""A FlashAttention forward in Gluon with FlashAttention-3's intra-warpgroup overlap (bench only).

The engine's Triton kernel (kernels/prefill_attention_triton.py) waits for every wgmma before the
next step, so inside one program the tensor cores and the exponentials take turns; only the 2-3
programs sharing an SM overlap them. Triton 3.6 neither pipelines Q K^T across the softmax (issued
by hand one tile early, it still waits on it at once) nor warp-specialises this loop on Hopper
(`warp_specialize=True` is ignored with 8 warps and a compiler error with 4): bench/NOTES_kernels.md v25. Gluon exposes `warpgroup_mma`
with `is_async` and `warpgroup_mma_wait(num_outstanding)`, so this kernel orders each iteration as
FlashAttention-3 does:

    issue S_j = Q K_j^T            (async)
    issue O  += P_{j-1} V_{j-1}    (async)
    wait until only the PV is in flight -> S_j ready
    softmax of S_j (MUFU) while the PV runs on the tensor cores
    wait for the PV, rescale O by exp2(m_old - m_new)

K and V tiles stream through separate TMA rings (`STAGES` slots each, one mbarrier per slot).
Causal, varlen (cu_seqlens), GQA, head dim 64, the same contract and grid order as the engine
kernel. Tiles on or right of the diagonal are masked; the rest run unmasked.

Usage: timed by bench/fa2_variants.py (variants named gluon/...); tested by
tests/test_kernels.py::test_gpu_gluon_fa3_bench.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _scores(s, m_i, l_i, qk_scale, start_m, start_n, MASKED: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    # Online softmax of one score tile: new running max, probabilities, rescale factor, new sum.
    if MASKED:
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = s * qk_scale + gl.where(rows[:, None] >= cols[None, :], 0.0, -1.0e6)
        m_new = gl.maximum(m_i, gl.max(s, 1))
        s = s - m_new[:, None]
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        s = s * qk_scale - m_new[:, None]
    p = gl.exp2(s)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit(do_not_specialize=["MAX_SEQLEN"])
def _fa3_fwd(desc_q, desc_k, desc_v, O, CU_SEQLENS, qk_scale, stride_ot, stride_oh, MAX_SEQLEN,
             GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, num_warps: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = desc_q.dtype

    h = gl.program_id(0)
    b = gl.program_id(1)
    pid_m = gl.cdiv(MAX_SEQLEN, BLOCK_M) - 1 - gl.program_id(2)
    seq_start = gl.load(CU_SEQLENS + b)
    seq_len = gl.load(CU_SEQLENS + b + 1) - seq_start
    start_m = pid_m * BLOCK_M
    if start_m < seq_len:
        kv_col = (h // GROUP) * HEAD_DIM
        hi = gl.minimum(start_m + BLOCK_M, seq_len)
        n_tiles = gl.cdiv(hi, BLOCK_N)
        n_free = start_m // BLOCK_N  # tiles entirely left of the diagonal: no mask

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bar.index(i), count=1)
            mbarrier.init(v_bar.index(i), count=1)

        mbarrier.expect(q_bar, desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [seq_start + start_m, h * HEAD_DIM], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            ok = i < n_tiles
            mbarrier.expect(k_bar.index(i), desc_k.block_type.nbytes, pred=ok)
            tma.async_copy_global_to_shared(desc_k, [seq_start + i * BLOCK_N, kv_col], k_bar.index(i),
                                            k_smem.index(i), pred=ok)
            mbarrier.expect(v_bar.index(i), desc_v.block_type.nbytes, pred=ok)
            tma.async_copy_global_to_shared(desc_v, [seq_start + i * BLOCK_N, kv_col], v_bar.index(i),
                                            v_smem.index(i), pred=ok)

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.full([BLOCK_M], 1.0, gl.float32, layout=row_s)  # 1, wiped by the first rescale
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        s0 = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

        # Tile 0: scores and softmax with nothing to overlap yet.
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bar.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s0, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        if n_free > 0:
            p, alpha, m_i, l_i = _scores(s, m_i, l_i, qk_scale, start_m, 0, False, BLOCK_M, BLOCK_N, s_layout)
        else:
            p, alpha, m_i, l_i = _scores(s, m_i, l_i, qk_scale, start_m, 0, True, BLOCK_M, BLOCK_N, s_layout)
        # K slot 0 is free again: refill it with tile STAGES.
        ok = STAGES < n_tiles
        mbarrier.expect(k_bar.index(0), desc_k.block_type.nbytes, pred=ok)
        tma.async_copy_global_to_shared(desc_k, [seq_start + STAGES * BLOCK_N, kv_col], k_bar.index(0),
                                        k_smem.index(0), pred=ok)

        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bar.index(slot), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s0, use_acc=False, is_async=True)
            mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc * gl.convert_layout(alpha, row_o)[:, None],
                                is_async=True)
            s = warpgroup_mma_wait(1, deps=[s])
            if j < n_free:
                p, alpha, m_i, l_i = _scores(s, m_i, l_i, qk_scale, start_m, j * BLOCK_N, False,
                                             BLOCK_M, BLOCK_N, s_layout)
            else:
                p, alpha, m_i, l_i = _scores(s, m_i, l_i, qk_scale, start_m, j * BLOCK_N, True,
                                             BLOCK_M, BLOCK_N, s_layout)
            acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
            # K slot `slot` (tile j) and V slot `prev` (tile j-1) are free: refill them.
            nk = j + STAGES
            ok = nk < n_tiles
            mbarrier.expect(k_bar.index(slot), desc_k.block_type.nbytes, pred=ok)
            tma.async_copy_global_to_shared(desc_k, [seq_start + nk * BLOCK_N, kv_col], k_bar.index(slot),
                                            k_smem.index(slot), pred=ok)
            nv = j - 1 + STAGES
            ok = nv < n_tiles
            mbarrier.expect(v_bar.index(prev), desc_v.block_type.nbytes, pred=ok)
            tma.async_copy_global_to_shared(desc_v, [seq_start + nv * BLOCK_N, kv_col], v_bar.index(prev),
                                            v_smem.index(prev), pred=ok)

        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_bar.index(last), ((n_tiles - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(last), acc * gl.convert_layout(alpha, row_o)[:, None],
                            is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bar.index(i))
            mbarrier.invalidate(v_bar.index(i))

        acc = acc / gl.convert_layout(l_i, row_o)[:, None]
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_ptr = O + (seq_start.to(gl.int64) + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
        gl.store(o_ptr, acc.to(O.dtype.element_ty), mask=(offs_m < seq_len)[:, None])


def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                qk_scale: float, block_m: int = 64, block_n: int = 64, stages: int = 2, num_warps: int = 4,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] bf16 on a Hopper GPU; `qk_scale` already includes log2(e)."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous(), "descriptors assume [T, H*D] rows"
    out = torch.empty_like(q) if out is None else out
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    lq = gl.NVMMASharedLayout.get_default_for([block_m, d], gdt)
    lkv = gl.NVMMASharedLayout.get_default_for([block_n, d], gdt)
    dq = TensorDescriptor(q.view(t, hq * d), [t, hq * d], [hq * d, 1], [block_m, d], lq)
    dk = TensorDescriptor(k.view(t, hkv * d), [t, hkv * d], [hkv * d, 1], [block_n, d], lkv)
    dv = TensorDescriptor(v.view(t, hkv * d), [t, hkv * d], [hkv * d, 1], [block_n, d], lkv)
    grid = (hq, cu_seqlens.shape[0] - 1, triton.cdiv(max_seqlen, block_m))
    _fa3_fwd[grid](dq, dk, dv, out, cu_seqlens, qk_scale, out.stride(0), out.stride(1), max_seqlen,
                   GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                   num_warps=num_warps)
    return out
