"""Batched multi-LoRA (Triton): y[t] += B[s_t] (A[s_t] x[t]) for every row t of a packed batch whose
slot s_t >= 0, as in Punica's SGMV / BGMV and S-LoRA. Same contract as `kernels.lora_ref.lora_apply_ref`.

Why: after the base model's shared GEMM each row needs its own adapter's low-rank update. The
reference groups rows by slot with `torch.unique` (a host sync, and one pair of matmuls per
adapter present), which a CUDA graph cannot capture: in a decode graph `slots` is a static buffer
whose values change between replays. Here the grid depends only on the shapes, and each program
finds its own rows on the device.

Two kernels: shrink V[t] = A[s] x[t] (fp32) and expand y[t] += B[s] V[t], both SGMV-style (rows of
one adapter gathered into a tile, tl.dot on tensor cores) with a grid that depends only on the
shapes: (chunk x group, output tile [x K split]).
- Finding the rows (`_find_group`): the batch is cut into chunks of CHUNK rows (the whole batch up
  to 256). A chunk needs sum over slots s of ceil(count_s / BLOCK_M) row groups, numbered slot by
  slot; the grid gives each chunk an upper bound of them (CHUNK / BLOCK_M + slots, at most its
  rows), the programs past the real number exit after reading the chunk's slots. A program counts
  every slot's rows in its chunk ([S_PAD, CHUNK] compares), finds its slot and its group's first
  rank by a prefix sum over the slots, and compacts that slot's rows: the p-th of them is the number
  of chunk positions whose inclusive prefix count (tl.cumsum) is <= p. So rows of one adapter
  share each A / B tile whether they are contiguous (prefill) or interleaved with other adapters'
  rows (decode), no matmul work is spent on other adapters' rows (only each slot's last group is
  padded), and one adapter's many rows spread over many programs. Rows with slot -1 (or >= S)
  belong to no group: never read, never written.
- shrink: a program computes BLOCK_R columns of V for its rows over one K range; with k_splits > 1
  (decode: few programs otherwise) the K ranges' partial sums go to V [k_splits, T, R] and the
  expand adds them in a fixed order (deterministic, no atomics).
- expand: a program loads its rows' V in BLOCK_R slices and loops over every `expand_splits`-th
  tile of BLOCK_N columns of y.
- One kernel can do both (`_lora_fused_kernel`, `fused=True`, R <= FUSED_MAX_R): each column program
  recomputes its rows' V over all of K, to halve a decode step's LoRA launches. Measured slower inside
  the engine's step, so not picked by shape (see FUSED_MAX_T).

Arithmetic (both products accumulate in fp32, as the reference):
- shrink: tl.dot on the inputs' dtype with fp32 accumulation; fp32 inputs with input_precision
  "ieee" (no TF32);
- expand: V is fp32. For bf16 B, V is split into three bf16 terms (hi + mid + lo == V to within
  fp32 rounding), three tensor-core dots with fp32 accumulation: the exact fp32 product up to
  summation order, at tensor-core speed (an fp32 FMA dot would be ~10x slower at large T).
  Otherwise (fp32, fp16) B is taken to fp32 and the dot is an IEEE fp32 dot.
- y <- y + round(update): round the fp32 update to y's dtype, then add in fp32 and round, as
  torch's `y[rows] += upd.to(y.dtype)` does. On the H200, >= 99.99 % of bf16 outputs are bit-identical
  to the reference (tests/test_lora_kernels.py).

No host sync and no value-dependent allocation (V is torch.empty of shape [k_splits, T, R], all from
shapes): safe to capture in a CUDA graph. `pdl=True` launches both kernels with programmatic
dependent launch (kernels/pdl.py): each waits (gdc_wait) before reading anything, so it is safe
anywhere in a PDL chain. Measured (bench/lora_kernels.py): PDL saves ~0.8 us per call at T <= 8 but
costs 1-8 us at T >= 64 (its waiting programs hold SMs), so use it for small decode batches only.
Tiles (`lora_config`) are picked from the shapes alone.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_supported
from kernels.triton_compat import patch_interpreter

patch_interpreter()

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """a @ b with fp32 accumulation; F32: both taken to fp32 first and multiplied in full IEEE
    precision (fp32 operands; and bf16 under the interpreter, whose tl.dot misreads bf16)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _find_group(SLOTS, T, S, GROUPS_PER_CHUNK, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, S_PAD: tl.constexpr):
    """This program's slot and rows. Its chunk of CHUNK rows needs sum over slots s of
    ceil(count_s / BLOCK_M) groups, numbered slot by slot; program_id(0) picks the chunk and the group.
    Returns (slot, rows [BLOCK_M] int64, row exists [BLOCK_M], group exists)."""
    chunk0 = (tl.program_id(0) // GROUPS_PER_CHUNK) * CHUNK
    group = tl.program_id(0) % GROUPS_PER_CHUNK
    pos = chunk0 + tl.arange(0, CHUNK)
    sl = tl.load(SLOTS + pos, mask=pos < T, other=-1)
    vals = tl.arange(0, S_PAD)
    counts = tl.sum((sl[None, :] == vals[:, None]).to(tl.int32), axis=1)  # rows per slot value
    counts = tl.where(vals < S, counts, 0)  # slots >= S: no adapter
    groups = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(groups, axis=0)  # inclusive: groups of slots 0..v
    slot = tl.sum((ends <= group).to(tl.int32), axis=0)  # the slot whose groups contain `group`
    exists = group < tl.sum(groups, axis=0)
    first_group = tl.sum(tl.where(vals < slot, groups, 0), axis=0)
    count = tl.sum(tl.where(vals == slot, counts, 0), axis=0)
    # the p-th row of the slot is the number of chunk positions whose inclusive hit count is <= p
    incl = tl.cumsum((sl == slot).to(tl.int32), axis=0)
    p = (group - first_group) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = chunk0 + tl.sum((incl[None, :] <= p[:, None]).to(tl.int32), axis=1)
    return slot, rows.to(tl.int64), p < count, exists


@triton.jit(do_not_specialize=["T"])
def _lora_shrink_kernel(
    X, A, V, SLOTS,
    T, S, K, R, GROUPS_PER_CHUNK, K_PER_SPLIT,
    stride_xt, stride_as, stride_ar, stride_ak, stride_vs, stride_vt,
    CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    S_PAD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr,  # IEEE fp32 dot (fp32 inputs; the interpreter)
    PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/pdl.py)
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    slot, rows, m_ok, exists = _find_group(SLOTS, T, S, GROUPS_PER_CHUNK, CHUNK, BLOCK_M, S_PAD)
    if exists:
        r_tiles = tl.cdiv(R, BLOCK_R)
        r = (tl.program_id(1) % r_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
        split = tl.program_id(1) // r_tiles  # K range of this program: one partial sum of V
        r_ok = r < R
        a_tile = A + slot.to(tl.int64) * stride_as + r.to(tl.int64)[None, :] * stride_ar  # [1, BLOCK_R]
        kk = tl.arange(0, BLOCK_K)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k = k0 + kk
            k_ok = k < k_hi
            xt = tl.load(X + rows[:, None] * stride_xt + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_tile + k[:, None] * stride_ak, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
            acc += _dot(xt, at, DOT_F32)
        v_ptr = V + split * stride_vs + rows[:, None] * stride_vt + r[None, :]
        tl.store(v_ptr, acc, mask=m_ok[:, None] & r_ok[None, :])


@triton.jit(do_not_specialize=["T"])
def _lora_expand_kernel(
    V, B, Y, SLOTS,
    T, S, N, R, GROUPS_PER_CHUNK,
    K_SPLITS,  # partial sums of V to add (in this order)
    stride_vs, stride_vt, stride_bs, stride_bn, stride_br, stride_yt,
    CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    S_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLIT_BF16: tl.constexpr,  # bf16 B: V as hi + mid + lo bf16 terms, three tensor-core dots
    DOT_F32: tl.constexpr,  # the interpreter: those dots taken in fp32
    PDL: tl.constexpr = False,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    slot, rows, m_ok, exists = _find_group(SLOTS, T, S, GROUPS_PER_CHUNK, CHUNK, BLOCK_M, S_PAD)
    if exists:
        b_slot = B + slot.to(tl.int64) * stride_bs
        rr = tl.arange(0, BLOCK_R)
        # axis 1 splits the N tiles: program j takes tiles j, j + splits, ...
        for nt in range(tl.program_id(1), tl.cdiv(N, BLOCK_N), tl.num_programs(1)):
            n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for r0 in range(0, R, BLOCK_R):
                r = r0 + rr
                r_ok = r < R
                v_ptr = V + rows[:, None] * stride_vt + r[None, :]
                v_mask = m_ok[:, None] & r_ok[None, :]
                v = tl.load(v_ptr, mask=v_mask, other=0.0)
                for ks in range(1, K_SPLITS):
                    v += tl.load(v_ptr + ks * stride_vs, mask=v_mask, other=0.0)
                bt = tl.load(b_slot + n.to(tl.int64)[None, :] * stride_bn + r[:, None] * stride_br,
                             mask=r_ok[:, None] & n_ok[None, :], other=0.0)
                if SPLIT_BF16:
                    hi = v.to(tl.bfloat16)
                    rest = v - hi.to(tl.float32)
                    mid = rest.to(tl.bfloat16)
                    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
                    acc += _dot(hi, bt, DOT_F32)
                    acc += _dot(mid, bt, DOT_F32)
                    acc += _dot(lo, bt, DOT_F32)
                else:
                    acc += _dot(v, bt, True)
            y_ptr = Y + rows[:, None] * stride_yt + n[None, :]
            mask = m_ok[:, None] & n_ok[None, :]
            y = tl.load(y_ptr, mask=mask, other=0.0)
            upd = acc.to(Y.dtype.element_ty).to(tl.float32)  # rounded to y's dtype once, then added
            tl.store(y_ptr, (y.to(tl.float32) + upd).to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["T"])
def _lora_fused_kernel(
    X, A, B, Y, SLOTS,
    T, S, K, N, R, GROUPS_PER_CHUNK,
    stride_xt, stride_as, stride_ar, stride_ak, stride_bs, stride_bn, stride_br, stride_yt,
    CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    S_PAD: tl.constexpr,
    BLOCK_K: tl.constexpr,
    R_PAD: tl.constexpr,  # the whole stacked rank in one tile (<= FUSED_MAX_R)
    BLOCK_N: tl.constexpr,
    SPLIT_BF16: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Shrink and expand in one launch, for decode-sized batches: every program computes its rows' whole V
    (all of K, all R columns) and then its share of y's column tiles. The programs of one row group each
    recompute that V (N / BLOCK_N times a [BLOCK_M, K] x [K, R] product, a few hundred kFLOP at decode), which
    costs less than a second launch and V's round trip through memory."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    slot, rows, m_ok, exists = _find_group(SLOTS, T, S, GROUPS_PER_CHUNK, CHUNK, BLOCK_M, S_PAD)
    if exists:
        r = tl.arange(0, R_PAD)
        r_ok = r < R
        a_tile = A + slot.to(tl.int64) * stride_as + r.to(tl.int64)[None, :] * stride_ar  # [1, R_PAD]
        kk = tl.arange(0, BLOCK_K)
        v = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            k_ok = k < K
            xt = tl.load(X + rows[:, None] * stride_xt + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_tile + k[:, None] * stride_ak, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
            v += _dot(xt, at, DOT_F32)
        if SPLIT_BF16:  # as in the expand kernel: V as three bf16 terms
            hi = v.to(tl.bfloat16)
            rest = v - hi.to(tl.float32)
            mid = rest.to(tl.bfloat16)
            lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        b_slot = B + slot.to(tl.int64) * stride_bs
        for nt in range(tl.program_id(1), tl.cdiv(N, BLOCK_N), tl.num_programs(1)):
            n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < N
            bt = tl.load(b_slot + n.to(tl.int64)[None, :] * stride_bn + r[:, None] * stride_br,
                         mask=r_ok[:, None] & n_ok[None, :], other=0.0)
            if SPLIT_BF16:
                acc = _dot(hi, bt, DOT_F32)
                acc += _dot(mid, bt, DOT_F32)
                acc += _dot(lo, bt, DOT_F32)
            else:
                acc = _dot(v, bt, True)
            y_ptr = Y + rows[:, None] * stride_yt + n[None, :]
            mask = m_ok[:, None] & n_ok[None, :]
            y = tl.load(y_ptr, mask=mask, other=0.0)
            upd = acc.to(Y.dtype.element_ty).to(tl.float32)
            tl.store(y_ptr, (y.to(tl.float32) + upd).to(Y.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class LoraConfig:
    """Tiles and grid of one call (tiles are powers of two; CHUNK a multiple of both BLOCK_Ms)."""
    chunk: int  # rows whose slots one program scans (it gathers its slot's rows among them)
    shrink_block_m: int  # rows of one slot per shrink program (one tl.dot's M)
    shrink_block_r: int  # V columns per shrink program
    shrink_block_k: int
    k_splits: int  # shrink programs along K per tile (partial sums of V, added by the expand in order)
    expand_block_m: int
    expand_block_n: int  # y columns per tile of an expand program
    expand_block_r: int
    expand_splits: int  # expand programs per row group along N (each loops over its N tiles)
    num_warps: int = 4


MAX_CHUNK = 256
# The one-launch kernel (`_lora_fused_kernel`) for batches up to FUSED_MAX_T rows and stacked ranks up to
# FUSED_MAX_R. At decode a LoRA apply is launch-bound (two launches per fused linear, 240 per step of this model),
# hence the idea: one launch, the shrink recomputed in every column program. Alone it wins (H200, CUDA graph of
# 30 applies: 4.1 against 5.1 us at T = 1, bench/results/lora_kernels_paths_h200.json), but inside the engine's
# decode step it lost: r = 8, batch 1, 1.80-2.28 ms a step against 1.35-1.42 with two launches, with or without
# PDL (bench/results/lora_launch_ab_h200.json). Not understood yet (profile it in the step), so the shape rule
# never picks it: FUSED_MAX_T = 0. `fused=True` still runs it; the tests keep it exact.
FUSED_MAX_T = 0
FUSED_MAX_R = 64
FUSED_BLOCK_N = 64
FUSED_PDL = True  # whether the one-launch kernel joins a PDL chain when asked (bench/lora_merge.py A/Bs it)
# Programs to aim for per launch: a few per SM of an H100 / H200 (132 SMs).
_TARGET_PROGRAMS = 512


def lora_config(t: int, r: int, k: int, n: int) -> LoraConfig:
    """Tiles for T rows, stacked rank R, K inputs, N outputs (shapes only: the same config whatever
    the slots, so a CUDA graph replays it). Decode-sized batches get small tiles and split K, hence
    many programs (the work is reading a few hundred KB of adapter weights, latency-bound); large T
    bigger row groups (fewer re-reads of A and B per row) and fewer splits. Picked from
    `bench/lora_kernels.py --sweep` on the H200 (each field varied alone around these choices):
    a 64-wide expand R tile and 128-wide N tile past T = 16 gained up to 25 %; K splits help while the
    shrink has few programs, but each costs the expand a re-read of V, so they shrink as R grows."""
    r_pow2 = max(16, triton.next_power_of_2(r))
    chunk = min(MAX_CHUNK, max(16, triton.next_power_of_2(t)))
    sm = 16 if t <= 2048 else 32
    sr = min(16 if t <= 64 else 32 if t <= 512 else 64, r_pow2)
    sk = 128 if t <= 64 else 64
    shrink_programs = triton.cdiv(t, sm) * triton.cdiv(r, sr)
    k_splits = min(triton.cdiv(triton.cdiv(k, sk), 2), triton.cdiv(_TARGET_PROGRAMS // 2, shrink_programs),
                   256 // r_pow2)
    em = 16 if t <= 512 else 64  # 16: a slot's rows of a chunk are few in mixed batches
    en = 32 if t <= 16 else 128
    return LoraConfig(chunk=chunk, shrink_block_m=sm, shrink_block_r=sr, shrink_block_k=sk, k_splits=max(1, k_splits),
                      expand_block_m=em, expand_block_n=en, expand_block_r=min(64, r_pow2),
                      expand_splits=max(1, min(triton.cdiv(n, en), triton.cdiv(_TARGET_PROGRAMS, triton.cdiv(t, em)))))


def _groups_per_chunk(t: int, chunk: int, block_m: int, s: int) -> int:
    """Upper bound on the row groups of one chunk: sum over slots of ceil(count / BLOCK_M) is at most
    CHUNK / BLOCK_M + (slots present), and at most the chunk's rows (no group is empty)."""
    return min(min(t, chunk), chunk // block_m + min(s, chunk))


def use_fused(t: int, r: int) -> bool:
    return t <= FUSED_MAX_T and r <= FUSED_MAX_R


def lora_apply_triton(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      slots: torch.Tensor, pdl: bool = False, fused: bool | None = None) -> torch.Tensor:
    """y[t] += B[slots[t]] @ (A[slots[t]] @ x[t]) for rows with slots[t] >= 0, in place; returns y.
    y [T, N], x [T, K], A [S, R, K], B [S, N, R] (scale folded in), slots [T] int32 (see the module
    docstring). `fused`: one launch (shrink recomputed per column program) or two; None: by `use_fused`
    (shapes only, so a CUDA graph replays the same choice)."""
    assert y.dim() == 2 and x.dim() == 2 and A.dim() == 3 and B.dim() == 3 and slots.dim() == 1
    t, n = y.shape
    s_count, r, k = A.shape
    assert x.shape == (t, k) and B.shape == (s_count, n, r) and slots.shape[0] == t, \
        f"shapes: y {tuple(y.shape)} x {tuple(x.shape)} A {tuple(A.shape)} B {tuple(B.shape)} slots {tuple(slots.shape)}"
    assert x.dtype == A.dtype and B.dtype == y.dtype, "x and A, B and y must share a dtype"
    assert y.stride(1) == 1 and x.stride(1) == 1 and slots.stride(0) == 1
    assert slots.dtype in (torch.int32, torch.int64)
    if t == 0 or s_count == 0 or r == 0 or n == 0:
        return y
    cfg = lora_config(t, r, k, n)
    use_pdl = pdl and pdl_supported(y.device)
    s_pad = max(16, triton.next_power_of_2(s_count))
    chunks = triton.cdiv(t, cfg.chunk)
    if use_fused(t, r) if fused is None else fused:
        if r > FUSED_MAX_R:
            raise ValueError(f"the one-launch LoRA kernel takes stacked ranks up to {FUSED_MAX_R}, got {r}")
        block_m = 16
        gpc = _groups_per_chunk(t, cfg.chunk, block_m, s_count)
        _lora_fused_kernel[(chunks * gpc, triton.cdiv(n, FUSED_BLOCK_N))](
            x, A, B, y, slots, t, s_count, k, n, r, gpc,
            x.stride(0), A.stride(0), A.stride(1), A.stride(2), B.stride(0), B.stride(1), B.stride(2), y.stride(0),
            CHUNK=cfg.chunk, BLOCK_M=block_m, S_PAD=s_pad, BLOCK_K=64, R_PAD=max(16, triton.next_power_of_2(r)),
            BLOCK_N=FUSED_BLOCK_N, SPLIT_BF16=B.dtype == torch.bfloat16, DOT_F32=x.dtype == torch.float32 or _INTERPRET,
            PDL=use_pdl and FUSED_PDL, num_warps=cfg.num_warps, **launch_options(use_pdl and FUSED_PDL),
        )
        return y
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.shrink_block_k), cfg.k_splits) * cfg.shrink_block_k
    k_splits = triton.cdiv(k, k_per_split)  # no empty split
    v = torch.empty((k_splits, t, r), dtype=torch.float32, device=y.device)  # partial sums over K
    gpc = _groups_per_chunk(t, cfg.chunk, cfg.shrink_block_m, s_count)
    _lora_shrink_kernel[(chunks * gpc, triton.cdiv(r, cfg.shrink_block_r) * k_splits)](
        x, A, v, slots, t, s_count, k, r, gpc, k_per_split,
        x.stride(0), A.stride(0), A.stride(1), A.stride(2), v.stride(0), v.stride(1),
        CHUNK=cfg.chunk, BLOCK_M=cfg.shrink_block_m, S_PAD=s_pad, BLOCK_R=cfg.shrink_block_r,
        BLOCK_K=cfg.shrink_block_k, DOT_F32=x.dtype == torch.float32 or _INTERPRET, PDL=use_pdl,
        num_warps=cfg.num_warps, **launch_options(use_pdl),
    )
    gpc = _groups_per_chunk(t, cfg.chunk, cfg.expand_block_m, s_count)
    _lora_expand_kernel[(chunks * gpc, cfg.expand_splits)](
        v, B, y, slots, t, s_count, n, r, gpc, k_splits,
        v.stride(0), v.stride(1), B.stride(0), B.stride(1), B.stride(2), y.stride(0),
        CHUNK=cfg.chunk, BLOCK_M=cfg.expand_block_m, S_PAD=s_pad, BLOCK_N=cfg.expand_block_n,
        BLOCK_R=cfg.expand_block_r, SPLIT_BF16=B.dtype == torch.bfloat16, DOT_F32=_INTERPRET, PDL=use_pdl,
        num_warps=cfg.num_warps, **launch_options(use_pdl),
    )
    return y
