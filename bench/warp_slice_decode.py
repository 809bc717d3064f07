"""An experimental decode kernel with warp slices (bench only: the engine does not use it).

`kernels/paged_attention_triton.py`'s decode kernel splits each 128-key tile's scores over its four
warps, so every tile's softmax crosses warps (row max and sum through shared memory) and the
probabilities are re-laid-out for the P @ V product: 9 barriers and ~530 SASS instructions per
tile. Here each warp owns a slice of the tile's keys with its own online softmax (a batched
`tl.dot` over a leading slice axis the warps are laid out on), and the slices are merged once, at
the end: 2 barriers per tile. Page ids are read at a scalar base plus a loop-invariant offset, and
K/V addresses are int32 offsets from one page product: 250-280 instructions per tile. Whole tiles
run unmasked; the last partial tile runs in a second, masked loop.

Decode only (one query row per sequence, `query_start_loc` = arange). Measured against the engine's
kernel and SDPA by `bench/paged_decode_warp_slices.py` (bench/NOTES_kernels.md, v13).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

import kernels.paged_attention_triton as pa

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634


@triton.jit
def _warp_slice_decode(
    Q, KC, VC, BT, SEQ_LENS, O, PM, PL, PACC, qk_scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh, BT_WIDTH,
    NUM_SPLITS: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr, W: tl.constexpr, SUB: tl.constexpr, ASM_PAGES: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
):
    BLOCK_N: tl.constexpr = W * SUB
    pid0 = tl.program_id(0)
    kvh = pid0 % HKV
    split = pid0 // HKV
    b = tl.program_id(1)
    ctx = tl.load(SEQ_LENS + b)
    rows = tl.arange(0, 16)  # the GROUP query heads of this KV head, padded to the MMA's 16 rows
    row_ok = rows < GROUP
    head = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    q3 = tl.broadcast_to(q[None, :, :], (W, 16, HEAD_DIM))  # every slice scores the same queries
    if NUM_SPLITS > 1:
        part = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    else:
        part = ctx
    lo = split * part
    hi = tl.maximum(tl.minimum(lo + part, ctx), lo)
    full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    key = tl.arange(0, W)[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [W, SUB]: slice w's keys
    key_page = key // PAGE
    # K's and V's in-page offsets are equal; two tensors and the tail loop's int64 form below are what the
    # measured build had: ptxas's placement of the page-id loads moved with such details (v13).
    k_in = ((key % PAGE) * stride_ks)[:, :, None] + offs_d[None, None, :]
    v_in = ((key % PAGE) * stride_ks)[:, :, None] + offs_d[None, None, :]
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_head = KC + kvh * stride_kh
    v_head = VC + kvh * stride_kh  # K and V pools share their strides (the launcher checks)
    if PREFETCH_LINES > 0:
        # This program's block-table lines pulled into L1 up front (32 ids a line).
        lines = tl.arange(0, PREFETCH_LINES)
        idx = tl.minimum(lo // PAGE + lines * 32, tl.minimum(tl.maximum(hi - 1, lo) // PAGE, BT_WIDTH - 1))
        tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [bt_row + idx],
                                  dtype=tl.int32, is_pure=False, pack=1)
    m = tl.zeros([W, 16], dtype=tl.float32) - float("inf")  # per slice, in raw score units
    l = tl.zeros([W, 16], dtype=tl.float32)
    acc = tl.zeros([W, 16, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, full_end, BLOCK_N):
        # Page index = the tile's first page (scalar) + the key's page in the tile (loop-invariant),
        # clamped to the row because the pipeliner may run this read ahead of the loop's end.
        pidx = tl.minimum(start // PAGE + key_page, BT_WIDTH - 1)
        if ASM_PAGES:  # not a load to the pipeliner, so K/V stay multi-buffered
            page = pa.page_ids_unpipelined(bt_row + pidx)
        else:
            page = tl.load(bt_row + pidx)
        poff = (page * stride_kb)[:, :, None]  # int32: the launcher checks the pool fits
        k = tl.load(k_head + (poff + k_in))
        v = tl.load(v_head + (poff + v_in))
        s = tl.dot(q3, tl.trans(k, (0, 2, 1)))  # [W, 16, SUB]
        m_new = tl.maximum(m, tl.max(s, 2))
        ms = m_new * qk_scale
        p = tl.math.exp2(s * qk_scale - ms[:, :, None])  # one FFMA per score
        alpha = tl.math.exp2(m * qk_scale - ms)
        l = l * alpha + tl.sum(p, 2)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, :, None])
        m = m_new
    for start in range(full_end, hi, BLOCK_N):  # at most one partial tile, masked
        n = start + key
        ok = n < hi
        page = tl.load(bt_row + tl.minimum(n // PAGE, BT_WIDTH - 1), mask=ok, other=0).to(tl.int64)
        k = tl.load(k_head + page[:, :, None] * stride_kb + k_in, mask=ok[:, :, None], other=0.0)
        v = tl.load(v_head + page[:, :, None] * stride_kb + v_in, mask=ok[:, :, None], other=0.0)
        s = tl.where(ok[:, None, :], tl.dot(q3, tl.trans(k, (0, 2, 1))), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 2))
        ms = tl.where(m_new == float("-inf"), 0.0, m_new * qk_scale)  # a slice with no key yet
        p = tl.math.exp2(s * qk_scale - ms[:, :, None])
        alpha = tl.math.exp2(m * qk_scale - ms)
        l = l * alpha + tl.sum(p, 2)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, :, None])
        m = m_new
    # Merge the slices (base 2): M = max_w m_w, out = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w.
    mb = m * qk_scale
    m_max = tl.max(mb, 0)
    w_s = tl.math.exp2(mb - tl.where(m_max == float("-inf"), 0.0, m_max)[None, :])
    l_all = tl.sum(l * w_s, 0)
    a_all = tl.sum(acc * w_s[:, :, None], 0)
    if NUM_SPLITS == 1:
        out = a_all / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
        tl.store(O + b.to(tl.int64) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:  # partials in the layout `_paged_attn_reduce` reads
        idx = (b.to(tl.int64) * (HKV * GROUP) + head) * NUM_SPLITS + split
        tl.store(PM + idx, m_max, mask=row_ok)
        tl.store(PL + idx, l_all, mask=row_ok)
        tl.store(PACC + idx[:, None] * HEAD_DIM + offs_d[None, :], a_all, mask=row_ok[:, None])


def warp_slice_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      seq_lens: torch.Tensor, scale: float, *, splits: int = 1, slices: int = 4, slice_keys: int = 32,
                      num_warps: int = 4, num_stages: int = 3, prefetch_lines: int = 0) -> torch.Tensor:
    """Decode attention for q [B, Hq, D] (one query row per sequence) over the paged pool
    [num_blocks, block_size, Hkv, D]; `slices` x `slice_keys` keys per tile, `splits` programs per
    (sequence, KV head), merged by the engine kernel's reduce when more than one."""
    bsz, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride(), "K and V pools must share strides"
    assert k_cache.shape[0] * k_cache.stride(0) < 2 ** 31, "int32 offsets: pool too large"
    assert slice_keys >= 16 and slices * slice_keys % page == 0
    out = torch.empty_like(q)
    pm, pl, pacc = pa.split_partials(bsz, hq, splits, d, q.device) if splits > 1 else (out, out, out)
    _warp_slice_decode[(splits * hkv, bsz)](
        q, k_cache, v_cache, block_tables, seq_lens, out, pm, pl, pacc, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), block_tables.shape[1],
        NUM_SPLITS=splits, HKV=hkv, GROUP=hq // hkv, HEAD_DIM=d, PAGE=page, W=slices, SUB=slice_keys,
        ASM_PAGES=not _INTERPRET, PREFETCH_LINES=0 if _INTERPRET else prefetch_lines,
        num_warps=num_warps, num_stages=1 if _INTERPRET else num_stages)
    if splits > 1:
        qsl = torch.arange(bsz + 1, dtype=torch.int32, device=q.device)  # one query row per sequence
        pa.reduce_partials(out, pm, pl, pacc, qsl, 1, bsz, splits)
    return out
