"""Paged decode attention that reads a low-bit KV pool directly (Triton): FP8, INT8 or INT4 codes
with their scales, dequantized in registers, never written back as 16-bit numbers.

Decode is memory-bound: each step reads every cached K and V byte once for a handful of FLOPs per
byte. A cache stored in fewer bits is only faster if the attention kernel reads those bits; the KV
compression lab's torch path decodes the codes into a 16-bit copy first and then attends, which
reads (and writes) more bytes than it saves. This kernel is the fused version, and the bench
(bench/kv_quant_decode.py) measures what it buys against the engine's 16-bit kernel.

Contract: one query row per sequence (decode), q [B, Hq, D]; sequence b's context is seq_lens[b]
keys, token n in page block_tables[b, n // page_size] at slot n % page_size of a
`kernels.quant_kv_pool.QuantizedPool`. Same result as `kernels.paged_decode_quant_ref`.

One program per (KV head, split, sequence), the GROUP query heads of its KV head as the rows of one
tile (as in kernels/paged_attention_triton.py), split-KV over interleaved tiles when the batch alone
does not fill the GPU, the partials merged by that module's reduce kernel. Scales never touch the
codes: a key's score is (q . codes) x its scale, a value's scale multiplies its softmax weight before
p @ codes, and INT4's two groups of 32 numbers a row each get their own products (their zero points
add z x sum(q) to a score and sum(p z) to an output channel).

What sets the speed (bench/NOTES_kv_quant_decode.md): turning codes into numbers the tensor cores take.
Conversion instructions (int8 -> float, float -> bf16) issue at a quarter of the ALU rate, and a first
version that used them read half the bytes yet ran 1.3-1.7x slower than the BF16 kernel. Codes are
therefore turned into fp16 with integer operations (0x6400 | c is the fp16 number 1024 + c), FP8 through
the hardware's packed e4m3 -> fp16 conversion, and the quantized formats multiply in fp16.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.paged_attention_triton import page_ids_unpipelined, plan, reduce_partials, split_partials
from kernels.quant_kv_pool import QuantizedPool
from kernels.triton_compat import patch_interpreter

patch_interpreter()

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634
KIND_CODES = {"bf16": 0, "fp8": 1, "int8": 2, "int4": 3}
INT4_GROUP = 32
# K/V tile height on a GPU, and pipeline stages: the engine kernel's decode choices (128-key tiles, 3 stages),
# also the best of bench/kv_quant_decode_sweep.py at 8k for every format. The interpreter takes 16-key tiles.
BLOCK_N = 128
NUM_STAGES = 3


@triton.jit
def _int8_as_fp16(u):
    """uint8 bytes of int8 codes -> their values in fp16 without a conversion instruction (those issue at a
    quarter of the ALU rate and made the first version slower than BF16): 0x6400 | (u ^ 0x80) is the fp16
    number 1024 + (x + 128), exactly, so subtracting 1152 leaves x."""
    h = (u.to(tl.uint16) ^ 0x80) | 0x6400
    return (h.to(tl.float16, bitcast=True) - 1152.0).to(tl.float16)


@triton.jit
def _nibbles_as_fp16(b):
    """[N, W] packed bytes -> [N, 2W] fp16 codes 0..15 in storage order (low nibble first), by the same trick:
    0x6400 | c is 1024 + c."""
    b16 = b.to(tl.uint16)
    lo = ((b16 & 15) | 0x6400).to(tl.float16, bitcast=True)
    hi = ((b16 >> 4) | 0x6400).to(tl.float16, bitcast=True)
    return (tl.interleave(lo, hi) - 1024.0).to(tl.float16)


@triton.jit
def _quant_decode_partial(
    Q, KC, KS, KZ, VC, VS, VZ, BT, SEQ_LENS,
    O, PM, PL, PACC,
    qk_scale,
    stride_qb, stride_qh,
    stride_bt, BT_WIDTH,
    stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KIND: tl.constexpr,  # 0 bf16, 1 fp8, 2 int8 (one scale a row), 3 int4 (scale and zero per 32)
    ASM_PAGES: tl.constexpr = False,  # page ids through inline PTX (kernels/paged_attention_triton.py)
):
    pid0 = tl.program_id(0)
    kvh = pid0 % HKV
    split = pid0 // HKV
    b = tl.program_id(1)
    ctx = tl.load(SEQ_LENS + b)

    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    head = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    HALF: tl.constexpr = HEAD_DIM // 2  # INT4: 32 numbers a scale group, two groups a row of 64
    offs_h = tl.arange(0, HALF)
    q_row = Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh
    # Codes are exact in fp16 and the products accumulate in fp32, so the quantized formats multiply in fp16
    # (their fast conversions produce it); the BF16 pool and an fp32 run keep the query's dtype.
    if KIND == 0 or Q.dtype.element_ty == tl.float32:
        dot_t = Q.dtype.element_ty
    else:
        dot_t = tl.float16
    if KIND == 3:
        q0 = tl.load(q_row + offs_h[None, :], mask=row_ok[:, None], other=0.0).to(dot_t)
        q1 = tl.load(q_row + HALF + offs_h[None, :], mask=row_ok[:, None], other=0.0).to(dot_t)
        q_sum0 = tl.sum(q0.to(tl.float32), 1)
        q_sum1 = tl.sum(q1.to(tl.float32), 1)
    else:
        q = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(dot_t)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # INT4: the two scale groups' accumulators, and the zero points' share (sum_n p z, the same for a group's channels)
    acc0 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    z_acc0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    z_acc1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    # Split s reads tiles s, s + NUM_SPLITS, ...: its first tile needs no seq_lens (INTERLEAVE_DECODE_SPLITS).
    for start in range(split * BLOCK_N, ctx, BLOCK_N * NUM_SPLITS):
        n = start + offs_n
        n_ok = n < ctx
        if ASM_PAGES:
            page = page_ids_unpipelined(bt_row + tl.minimum(n // PAGE, BT_WIDTH - 1))
        else:
            page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0)
        # The row's index in the pool, counted in rows of D numbers: pools are contiguous [pages, Hkv, PAGE, *].
        row = (page.to(tl.int64) * HKV + kvh) * PAGE + n % PAGE
        if KIND == 3:
            # A key is s_g * c + z_g per group g, so q . k = sum_g s_g (q_g . c_g) + z_g sum(q_g).
            kb = KC + row[:, None] * HALF
            c0 = _nibbles_as_fp16(tl.load(kb + tl.arange(0, HALF // 2)[None, :], mask=n_ok[:, None],
                                          other=0)).to(dot_t)
            c1 = _nibbles_as_fp16(tl.load(kb + HALF // 2 + tl.arange(0, HALF // 2)[None, :],
                                          mask=n_ok[:, None], other=0)).to(dot_t)
            ks0 = tl.load(KS + row * 2, mask=n_ok, other=0.0).to(tl.float32)
            ks1 = tl.load(KS + row * 2 + 1, mask=n_ok, other=0.0).to(tl.float32)
            kz0 = tl.load(KZ + row * 2, mask=n_ok, other=0.0).to(tl.float32)
            kz1 = tl.load(KZ + row * 2 + 1, mask=n_ok, other=0.0).to(tl.float32)
            s = (tl.dot(q0, tl.trans(c0)) * ks0[None, :] + tl.dot(q1, tl.trans(c1)) * ks1[None, :]
                 + q_sum0[:, None] * kz0[None, :] + q_sum1[:, None] * kz1[None, :]) * qk_scale
        else:
            if KIND == 2:
                k = _int8_as_fp16(tl.load(KC + row[:, None] * HEAD_DIM + offs_d[None, :], mask=n_ok[:, None], other=0))
            else:
                k = tl.load(KC + row[:, None] * HEAD_DIM + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k.to(dot_t)))
            if KIND == 0:
                s = s * qk_scale
            else:
                k_scale = tl.load(KS + row, mask=n_ok, other=0.0).to(tl.float32)
                s = s * (k_scale * qk_scale)[None, :]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if KIND == 3:
            # A value's scale joins its softmax weight; its zero point adds sum_n p z to every channel of the group.
            vb = VC + row[:, None] * HALF
            v0 = _nibbles_as_fp16(tl.load(vb + tl.arange(0, HALF // 2)[None, :], mask=n_ok[:, None], other=0))
            v1 = _nibbles_as_fp16(tl.load(vb + HALF // 2 + tl.arange(0, HALF // 2)[None, :], mask=n_ok[:, None],
                                          other=0))
            vs0 = tl.load(VS + row * 2, mask=n_ok, other=0.0).to(tl.float32)
            vs1 = tl.load(VS + row * 2 + 1, mask=n_ok, other=0.0).to(tl.float32)
            vz0 = tl.load(VZ + row * 2, mask=n_ok, other=0.0).to(tl.float32)
            vz1 = tl.load(VZ + row * 2 + 1, mask=n_ok, other=0.0).to(tl.float32)
            acc0 = tl.dot((p * vs0[None, :]).to(dot_t), v0.to(dot_t), acc0 * alpha[:, None])
            acc1 = tl.dot((p * vs1[None, :]).to(dot_t), v1.to(dot_t), acc1 * alpha[:, None])
            z_acc0 = z_acc0 * alpha + tl.sum(p * vz0[None, :], 1)
            z_acc1 = z_acc1 * alpha + tl.sum(p * vz1[None, :], 1)
        else:
            acc = acc * alpha[:, None]
            if KIND == 2:
                v = _int8_as_fp16(tl.load(VC + row[:, None] * HEAD_DIM + offs_d[None, :], mask=n_ok[:, None], other=0))
            else:
                v = tl.load(VC + row[:, None] * HEAD_DIM + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            if KIND == 0:
                acc = tl.dot(p.to(dot_t), v.to(dot_t), acc)
            else:
                v_scale = tl.load(VS + row, mask=n_ok, other=0.0).to(tl.float32)
                acc = tl.dot((p * v_scale[None, :]).to(dot_t), v.to(dot_t), acc)
        m_i = m_new

    tok = b.to(tl.int64)
    if NUM_SPLITS == 1:
        inv = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)
        o_row = O + tok * stride_ob + head[:, None] * stride_oh
        if KIND == 3:
            tl.store(o_row + offs_h[None, :], ((acc0 + z_acc0[:, None]) * inv[:, None]).to(O.dtype.element_ty),
                     mask=row_ok[:, None])
            tl.store(o_row + HALF + offs_h[None, :],
                     ((acc1 + z_acc1[:, None]) * inv[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
        else:
            tl.store(o_row + offs_d[None, :], (acc * inv[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        idx = (tok * (HKV * GROUP) + head) * NUM_SPLITS + split
        tl.store(PM + idx, m_i, mask=row_ok)
        tl.store(PL + idx, l_i, mask=row_ok)
        if KIND == 3:
            tl.store(PACC + idx[:, None] * HEAD_DIM + offs_h[None, :], acc0 + z_acc0[:, None], mask=row_ok[:, None])
            tl.store(PACC + idx[:, None] * HEAD_DIM + HALF + offs_h[None, :], acc1 + z_acc1[:, None],
                     mask=row_ok[:, None])
        else:
            tl.store(PACC + idx[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])


def decode_splits(batch: int, hq: int, hkv: int, max_seq_len: int, device: torch.device) -> int:
    """How many ways each context is split: the engine kernel's decode plan at this kernel's tile height, without
    its single pass for short contexts, which is tuned for BF16: at B = 64 and 2k tokens two splits take FP8 from
    48 to 34 us and INT4 from 78 to 53 (bench/kv_quant_decode_sweep.py --splits, bench/NOTES_kv_quant_decode.md)."""
    return plan(batch, hq, hkv, 1, max_seq_len, device, block_n=16 if _INTERPRET else BLOCK_N,
                single_pass_len=None if _INTERPRET else 0)["splits"]


def paged_decode_quant_triton(
    q: torch.Tensor,  # [B, Hq, D]
    pool: QuantizedPool,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    max_seq_len: int,
    scale: float,
    *,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    page_loads: str = "asm",
    maxnreg: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over `pool` for one query row per sequence. `splits` overrides the plan (tests); `block_n`,
    `num_warps`, `num_stages`, `page_loads` and `maxnreg` (registers per thread) the launch, for the bench's
    sweep (bench/kv_quant_decode_sweep.py)."""
    batch, hq, d = q.shape
    hkv, page = pool.kv_heads, pool.page_size
    if pool.fmt.name not in KIND_CODES:
        raise ValueError(f"no fused decode path for {pool.fmt.name!r}")
    assert pool.head_dim == d and hq % hkv == 0 and d >= 16 and (d & (d - 1)) == 0
    assert block_tables.stride(1) == 1 and q.stride(2) == 1
    for e in (pool.k, pool.v):
        assert all(t.is_contiguous() for t in e.tensors()), "the kernel indexes the pool as contiguous rows"
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    group = hq // hkv
    if block_n is None:
        block_n = 16 if _INTERPRET else BLOCK_N
    if splits is None:
        splits = decode_splits(batch, hq, hkv, max_seq_len, q.device)
    if pool.fmt.name == "int4":
        assert d == 2 * INT4_GROUP, "the INT4 path holds a row as two groups of 32"
    k, v = pool.k, pool.v
    # INT8 codes go in as their bytes: the kernel turns them into fp16 with integer operations.
    k_codes, v_codes = ((e.codes.view(torch.uint8) if pool.fmt.name == "int8" else e.codes) for e in (k, v))
    # Unused pointer arguments get the codes (a valid tensor of the right device).
    ks, kz = (k.scale if k.scale is not None else k.codes), (k.zero if k.zero is not None else k.codes)
    vs, vz = (v.scale if v.scale is not None else v.codes), (v.zero if v.zero is not None else v.codes)
    if splits > 1:
        pm, pl, pacc = split_partials(batch, hq, splits, d, q.device)
    else:
        pm = pl = pacc = out
    _quant_decode_partial[(splits * hkv, batch)](
        q, k_codes, ks, kz, v_codes, vs, vz, block_tables, seq_lens,
        out, pm, pl, pacc,
        float(scale) * _LOG2E,
        q.stride(0), q.stride(1),
        block_tables.stride(0), block_tables.shape[1],
        out.stride(0), out.stride(1),
        NUM_SPLITS=splits, HKV=hkv, GROUP=group, HEAD_DIM=d, PAGE=page,
        BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, KIND=KIND_CODES[pool.fmt.name],
        ASM_PAGES=page_loads == "asm" and not _INTERPRET,
        num_warps=num_warps, num_stages=(1 if _INTERPRET else NUM_STAGES) if num_stages is None else num_stages,
        **({} if maxnreg is None or _INTERPRET else {"maxnreg": maxnreg}))
    if splits > 1:
        starts = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
        reduce_partials(out, pm, pl, pacc, starts, 1, batch, splits)
    return out
