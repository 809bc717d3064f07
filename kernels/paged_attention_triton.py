"""Paged attention through block tables, with split-KV (Flash-Decoding) and GQA grouping (Triton).

Same contract as `kernels.paged_attention_ref.paged_attention_ref`: sequence b has
q_len = query_start_loc[b+1] - query_start_loc[b] query rows (1 for decode, more for a prefill chunk
that continues a cached prefix); its context is seq_lens[b] tokens (this step's keys included,
already stored); query row j sits at absolute position seq_lens[b] - q_len + j and sees keys
0..that position. Keys live in the pool `[num_blocks, block_size, Hkv, D]`; token n of sequence b is
in block block_tables[b, n // block_size] at offset n % block_size. Any strides with D contiguous:
the engine's CUDA pool is a head-major view (each block stored [Hkv, block_size, D], engine/kv_pool.py).

Two kernels:
1. `_paged_attn_partial`: one program per (KV head, split, query tile, sequence). The rows of its
   tile are (query row, query head of this KV group) pairs, so the GROUP query heads that share a
   KV head read each K/V tile once (for decode: 3 of the 16 MMA rows are used, which costs nothing
   in a memory-bound loop). The program walks its slice of the context (the keys its rows see,
   split NUM_SPLITS ways in whole tiles: contiguous ranges for prefill chunks, every NUM_SPLITS-th
   tile for decode, INTERLEAVE_DECODE_SPLITS) in BLOCK_N-key tiles, gathering each key row through the
   block table, with an online softmax in base 2, and writes an unnormalised partial (max m, sum l,
   accumulator acc) in fp32; when there is a single split it writes the normalised output directly
   and the reduce is skipped. A launch with exactly one query row per sequence (decode) compiles a
   DECODE variant: no causal mask, nothing read from query_start_loc (DECODE_LEAN); decode with two
   splits merges in the partial kernel instead, the last program of each pair reducing
   (FUSED_REDUCE_DECODE_SPLITS).
2. `_paged_attn_reduce`: one program per (query row, sequence, query head) merges the partials:
   M = max_s m_s, out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.

CUDA-graph safe: no host sync, no `.item()`; every size (grid, number of splits, partial buffers)
is a function of tensor shapes, the python ints max_query_len / max_seq_len and the device's SM
count only. Each sequence's real length decides, inside the kernels, how its context is split and
where the loops stop (empty loops past it), so a graph captured for a max_seq_len bucket stays
correct, and its programs busy, for any shorter lengths.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.launch_tape import launch, note_untaped_work
from kernels.pdl import launch_options
from kernels.triton_compat import patch_interpreter

patch_interpreter()

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634

# Tunables (see bench/NOTES_kernels.md). Programs aimed at per SM when splitting the context,
# the shortest slice of context one split may get, and the most splits.
# "allheads" (decode only: one program reads whole token rows for all heads) or "group" (one
# program per KV head; also serves q_len > 1).
# Measured on the H200 (bench/NOTES_kernels.md): "group" wins; "allheads" is kept as an option.
DECODE_KERNEL = "group"
# Per mode: "decode" = max_query_len == 1, "chunk" = prefill chunks (q_len > 1, mixed batches).
# Decode aims at *at most* its programs per SM (a floor), the other modes at least (a ceiling).
# Decode with its page ids read through inline PTX (PAGE_LOADS) streams K/V several tiles ahead, so a
# few long programs per SM beat many short ones: B = 64 gets 2 splits (384 programs) above 2k (see
# SINGLE_PASS_LEN), B >= 128 none.
# bench/NOTES_kernels.md "v10" (the loop page loads wanted 16 per SM and 128-key tiles, "v5").
TARGET_PROGRAMS_PER_SM = {"decode": 3, "chunk": 8, "allheads": 8}
# Chunks: 2 stages beat 3 by 2-4 % at all four shapes of bench/paged_chunk_sweep.py (v25; 128-row tiles,
# which help FA2 at long L, lose here).
NUM_STAGES = {"decode": 3, "chunk": 2, "allheads": 2}
# K/V tile height (allheads: token-head rows). Decode takes 128-key tiles with the engine's
# head-major pool on CUDA (engine/kv_pool.py), where a page's keys of one head are contiguous: 0.6-1.9 %
# faster than 64-key tiles at B = 64 from 8k to 32k and equal below (v11). With a token-major pool
# 64-key tiles were 1-2 % faster at 8k-32k, but the engine no longer makes one on CUDA.
BLOCK_N = {"decode": 128, "chunk": 64, "allheads": 128}
# Merge the split partials inside the partial kernel (the last-arriving program reduces) instead of
# a second kernel launch. Measured 1-9% slower than the separate reduce on the H200 with many splits;
# with the 2 splits decode takes at B = 64 it is 0.3-1 % faster (v11), but at B = 16 (8 splits) 1k
# is 10 % slower and 4k equal, so off.
FUSED_REDUCE = False
# ... except decode launches with at most this many splits, which merge in the partial kernel:
# 0.6-1.3 us a call faster than the second kernel at B = 48-64 from 2k to 16k (v14).
FUSED_REDUCE_DECODE_SPLITS = 2
# How the partial kernel reads page ids from the block table, per mode: "loop" (tl.load per K/V
# tile) or "asm" (inline PTX per tile, so K/V are multi-buffered; see the kernel's loop). "asm"
# measured 5-8 % faster for decode at B = 64 from 4k to 32k with (2 programs per SM, 64-key
# tiles, 3 stages) against the best "loop" shape (bench/NOTES_kernels.md, v10).
PAGE_LOADS = {"decode": "asm", "chunk": "loop", "allheads": "loop"}
# Launches with exactly one query row per sequence and no draft tree compile the partial kernel's
# DECODE variant: the row sees its whole context, so nothing waits for query_start_loc and the keys
# need no causal mask (B = 256 at 16-400 tokens 24.7 -> 23.3 us, B = 64 at 2k 35.0 -> 33.3; at B = 1
# 0.1 us slower; v14).
DECODE_LEAN = True
# Decode programs of at least this many tiles read each tile's page ids one tile ahead (the kernel's
# NEXT_PAGES; "asm" page loads only): B = 64 at 1k 19.8 -> 18.8 us and 2k 34.5 -> 33.3 unsplit, 0-1 %
# with two splits; but up to 5 % slower for programs of 2-4 tiles, which pay the extra read (v14).
NEXT_PAGE_IDS_MIN_TILES = 8
# Decode contexts up to this many keys are not split when the unsplit programs (one per sequence and
# KV head) already cover every SM, nor up to twice as many when they are 1.25 per SM or more: the
# reduce then costs more than the splits gain (B = 64: 1k 21.0 -> 18.8 us, 2k 33.8 -> 33.3; B = 48 at
# 1k 17.7 -> 16.8; B = 48 at 2k would lose 4 %, B = 56 at 2k is even within 2 %; v14).
SINGLE_PASS_LEN = 1024
# Decode programs that read their page ids one tile ahead compute K/V addresses as int32 offsets (page x
# block stride + in-page offset) when the pools fit (`_fits_int32`), not as 64-bit products: 465 -> 397
# SASS instructions a tile, and 2 dependent ones instead of 7 between a page id's arrival and its copies.
# The single pass gains (Nsight Compute: the same cycles per instruction as cuDNN's kernel, more
# instructions): B = 64 1k 18.8-19.2 -> 18.2-18.3 us, 2k 33.0-33.2 -> 32.1-32.5; two-split launches
# (4k and up) unchanged. Cutting the loop's masks as well (329 a tile) bought nothing (v16).
OFF32 = True
# Decode splits take every NUM_SPLITS-th tile of the context (split s: tiles s, s + S, ...) instead of one
# contiguous range each. A split's first tile is then known from its program id alone, so its first page-id
# read and K/V copies need not wait for seq_lens (a contiguous range starts at a multiple of ctx / S). Pages
# are scattered in the pool anyway, so no split loses a contiguous stream by it.
INTERLEAVE_DECODE_SPLITS = True
MIN_PARTITION = 256
MAX_SPLITS = 128
# Tests set this to fill the split partials with NaN, so a partial the reduce reads but nobody wrote
# shows up as NaN in the output.
POISON_SCRATCH = False


@triton.jit
def page_ids_unpipelined(ptrs):
    """Block-table entries read with inline PTX, which Triton's pipeliner does not see as a load, so
    the K/V copies whose addresses depend on them keep their multi-buffering (see PAGE_LOADS)."""
    return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit(do_not_specialize=["PARTITION"])
def _paged_attn_partial(
    Q, KC, VC, BT, SEQ_LENS, QSL,
    O, PM, PL, PACC,
    qk_scale,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    PARTITION,
    BT_WIDTH,  # entries per block-table row
    CNT, Q_TILES,  # fused reduce: arrival counters, one per (sequence, q tile, KV head)
    TM, TOFF,  # tree masks: flat int8 [q_len x q_len per tree], per-sequence offset into it (-1: causal)
    NUM_SPLITS: tl.constexpr,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FUSED_REDUCE: tl.constexpr = False,
    SPLITS_PAD: tl.constexpr = 1,
    TREE: tl.constexpr = False,
    PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/pdl.py)
    HOIST: tl.constexpr = False,  # in-page address offsets computed once (tiles start on page boundaries)
    ASM_PAGES: tl.constexpr = False,  # page ids read with inline PTX (see PAGE_LOADS)
    DECODE: tl.constexpr = False,  # one query row per sequence (see DECODE_LEAN)
    NEXT_PAGES: tl.constexpr = False,  # each tile reads the next tile's page ids (see NEXT_PAGE_IDS_MIN_TILES)
    KV_SAME: tl.constexpr = False,  # the K and V pools have the same strides: one address product for both
    OFF32: tl.constexpr = False,  # page offsets in int32 (the launcher checks the pools fit)
    INTERLEAVE: tl.constexpr = False,  # decode splits take every NUM_SPLITS-th tile (see INTERLEAVE_DECODE_SPLITS)
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    Q_PER_TILE: tl.constexpr = BLOCK_M // GROUP
    pid0 = tl.program_id(0)
    kvh = pid0 % HKV
    split = pid0 // HKV
    qt = tl.program_id(1)
    b = tl.program_id(2)

    # No early return for a tile past this sequence's rows (its loop is empty and its stores masked
    # instead): a branch on q_len would make every later load wait for query_start_loc, and the
    # context length, the page ids and the first K/V copies would then come one after another
    # instead of together (v11: 0.5-1 % at B = 64, 1k-32k).
    if DECODE:  # one row per sequence: query_start_loc is arange, nothing to wait for
        q_start = b
        q_len = 1
    else:
        q_start = tl.load(QSL + b)
        q_len = tl.load(QSL + b + 1) - q_start
    ctx = tl.load(SEQ_LENS + b)
    j0 = qt * Q_PER_TILE

    rows = tl.arange(0, BLOCK_M)
    qi = rows // GROUP
    g = rows % GROUP
    j = j0 + qi
    row_ok = (qi < Q_PER_TILE) & (j < q_len)
    head = kvh * GROUP + g
    pos = ctx - q_len + j  # absolute position of each row: it sees keys 0..pos
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    tok = (q_start + j).to(tl.int64)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)

    # Keys visible to the tile's last row end at kv_end (exclusive); this split owns [lo, hi).
    if DECODE:
        # The one row sees the whole context: bounds and masks need seq_lens only.
        kv_end = ctx
    else:
        last_j = tl.minimum(j0 + Q_PER_TILE, q_len) - 1
        kv_end = ctx - q_len + last_j + 1
    if INTERLEAVE:
        # Split s reads tiles s, s + NUM_SPLITS, ... up to kv_end: lo needs no load (see INTERLEAVE_DECODE_SPLITS).
        part = BLOCK_N
    elif NUM_SPLITS > 1:
        # The keys this tile sees, divided among the splits in whole tiles: per sequence, not the
        # launch's PARTITION, which is sized for the graph's max_seq_len bucket. A decode graph is
        # captured for max_model_len, so with PARTITION a short context fills only its first split
        # or two and the other programs idle (v11: contexts of 16-400 tokens under a 2,048 bucket,
        # B = 32 11.2 -> 9.2 us, B = 64 15.0 -> 13.1, B = 1 8.0 -> 7.0; uniform lengths unchanged;
        # 500-2,048 tokens at B = 32 17.9 -> 18.5). Eager decode plans for the same bucket
        # (engine/model.py), so graphs on and off split a context alike.
        part = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    else:
        part = PARTITION
    STEP: tl.constexpr = BLOCK_N * NUM_SPLITS if INTERLEAVE else BLOCK_N
    lo = split * part
    if INTERLEAVE:
        hi = kv_end
    else:
        hi = tl.minimum(lo + part, kv_end)
    if not DECODE:
        hi = tl.where(j0 < q_len, hi, lo)  # a tile past this sequence's rows reads nothing

    if TREE:
        # A draft tree under verification: among this step's rows, row j sees only the rows its
        # mask row allows (its ancestors and itself, all earlier rows, so the causal rule still holds).
        t_off = tl.load(TOFF + b)
        new0 = ctx - q_len  # position of this step's first row
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_head = KC + kvh * stride_kh
    if KV_SAME:
        v_head = VC + kvh * stride_kh
    else:
        v_head = VC + kvh * stride_vh
    if HOIST:
        # Tiles start on page boundaries (PAGE divides BLOCK_N, splits start on whole tiles), so a row's offset
        # inside its page is the same in every tile: its part of the address is computed once. The
        # loop's integer work is the busiest pipe (ncu: 30 % of cycles); this saves 1-3 % at 4k-32k.
        k_in = (offs_n % PAGE)[:, None] * stride_ks + offs_d[None, :]
        if KV_SAME:
            v_in = k_in
        else:
            v_in = (offs_n % PAGE)[:, None] * stride_vs + offs_d[None, :]
    if NEXT_PAGES:
        tile_pages = offs_n // PAGE  # the tile starts on a page (HOIST)
        next_page = page_ids_unpipelined(bt_row + tl.minimum(lo // PAGE + tile_pages, BT_WIDTH - 1))
    for start in range(lo, hi, STEP):
        n = start + offs_n
        n_ok = n < hi
        if NEXT_PAGES:
            # This tile's ids were read by the previous one; read the next tile's now. The pipeliner
            # still issues each read in the iteration that copies its tile (it moves the read along
            # with the copy it feeds), but ptxas then places it earlier, behind the previous tile's
            # math, where its latency is hidden (see NEXT_PAGE_IDS_MIN_TILES).
            page = next_page
            next_page = page_ids_unpipelined(
                bt_row + tl.minimum((start + STEP) // PAGE + tile_pages, BT_WIDTH - 1))
        elif ASM_PAGES:
            # Page ids through inline PTX, which Triton's pipeliner does not see as a load: K/V
            # addresses then depend on no pipelined load, so K and V get num_stages - 1 buffers each
            # and stream ahead of the math. With tl.load the page ids take a pipeline stage of their
            # own and K/V get one buffer, refilled only after the tile's math (see PAGE_LOADS). The
            # clamp keeps the read inside the block-table row where the tile runs past the context;
            # it is the row's width, not `hi`, so the read need not wait for seq_lens. Ids read past
            # the context are never used: their K/V rows are masked off and not fetched.
            page = page_ids_unpipelined(bt_row + tl.minimum(n // PAGE, BT_WIDTH - 1))
        else:
            page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0)
        if not OFF32:
            page = page.to(tl.int64)
        if HOIST and OFF32:
            # Summed before the pointer add. The int64 form below keeps its own grouping: written this
            # way it compiles to more instructions (sm_90: 1080 -> 1112 for B = 1 decode, 1224 -> 1320
            # for two splits), so the two branches are not merged.
            k_off = page[:, None] * stride_kb + k_in
            v_off = k_off if KV_SAME else page[:, None] * stride_vb + v_in
            k = tl.load(k_head + k_off, mask=n_ok[:, None], other=0.0)
            v = tl.load(v_head + v_off, mask=n_ok[:, None], other=0.0)
        elif HOIST:
            k_page = page[:, None] * stride_kb
            v_page = k_page if KV_SAME else page[:, None] * stride_vb
            k = tl.load(k_head + k_page + k_in, mask=n_ok[:, None], other=0.0)
            v = tl.load(v_head + v_page + v_in, mask=n_ok[:, None], other=0.0)
        else:
            off = n % PAGE
            k = tl.load(k_head + page[:, None] * stride_kb + off[:, None] * stride_ks + offs_d[None, :],
                        mask=n_ok[:, None], other=0.0)
            v = tl.load(v_head + page[:, None] * stride_vb + off[:, None] * stride_vs + offs_d[None, :],
                        mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if DECODE:
            visible = n_ok[None, :]  # hi <= ctx: every key in range is in the row's past
        else:
            visible = (n[None, :] <= pos[:, None]) & n_ok[None, :]
        if TREE:
            # Only the tiles that reach this step's rows read the mask. Loaded in every tile (masked off in the
            # context's), it cost 12.5 us a launch against 7.3 for the same 4 rows causal; read here, 9.5 (H100,
            # 1k context, the default plan's 5 splits; bench/NOTES_kernels.md v58).
            if (t_off >= 0) & (start + BLOCK_N > new0):
                in_new = (n[None, :] >= new0) & visible & row_ok[:, None]
                bit = tl.load(TM + t_off + j[:, None] * q_len + (n[None, :] - new0), mask=in_new, other=1)
                visible = visible & (bit != 0)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead (p = 0 then).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(O + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        base = (tok * (HKV * GROUP) + head) * NUM_SPLITS
        idx = base + split
        tl.store(PM + idx, m_i, mask=row_ok)
        tl.store(PL + idx, l_i, mask=row_ok)
        tl.store(PACC + idx[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
        if FUSED_REDUCE:
            # The last split program to arrive for this (sequence, q tile, KV head) merges all the
            # partials (no second kernel). The barrier orders this CTA's partial stores before the
            # release of the counter increment; the winner reads the partials back from L2 (.cg).
            tl.debug_barrier()
            cidx = (b * Q_TILES + qt) * HKV + kvh
            prev = tl.atomic_add(CNT + cidx, 1, sem="acq_rel", scope="gpu")
            if prev == NUM_SPLITS - 1:
                sp = tl.arange(0, SPLITS_PAD)
                msk = row_ok[:, None] & (sp < NUM_SPLITS)[None, :]
                m_all = tl.load(PM + base[:, None] + sp[None, :], mask=msk, other=float("-inf"),
                                cache_modifier=".cg")
                l_all = tl.load(PL + base[:, None] + sp[None, :], mask=msk, other=0.0, cache_modifier=".cg")
                m_max = tl.max(m_all, 1)
                m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
                w = tl.math.exp2(m_all - m_max[:, None])
                denom = tl.sum(w * l_all, 1)
                o = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
                for s_i in range(NUM_SPLITS):
                    w_s = tl.sum(tl.where(sp[None, :] == s_i, w, 0.0), 1)
                    a = tl.load(PACC + (base + s_i)[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None],
                                other=0.0, cache_modifier=".cg")
                    o += a * w_s[:, None]
                o = o / tl.where(denom == 0.0, 1.0, denom)[:, None]
                tl.store(O + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                         o.to(O.dtype.element_ty), mask=row_ok[:, None])
                tl.atomic_xchg(CNT + cidx, 0)  # re-arm for the next launch (stream-ordered)


@triton.jit(do_not_specialize=["PARTITION"])
def _paged_decode_allheads(
    Q, KC, VC, BT, SEQ_LENS, QSL,
    O, PM, PL, PACC,
    qk_scale,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    PARTITION,
    NUM_SPLITS: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Decode only (q_len <= 1): one program per (split, sequence) for ALL heads. A K/V tile is
    BLOCK_R rows r = (token t, KV head g) with r = t * HKV + g, i.e. whole 'token rows' of the pool
    (Hkv*D contiguous elements), read once for every query head; query head h only keeps the
    columns of its KV head (h // GROUP), the others are masked to -inf (the wasted MMA work is
    free in this memory-bound loop)."""
    TOK: tl.constexpr = BLOCK_R // HKV  # tokens per tile
    split = tl.program_id(0)
    b = tl.program_id(1)
    q_start = tl.load(QSL + b)
    q_len = tl.load(QSL + b + 1) - q_start
    if q_len <= 0:
        return
    ctx = tl.load(SEQ_LENS + b)

    h = tl.arange(0, BLOCK_H)
    h_ok = h < HQ
    offs_d = tl.arange(0, HEAD_DIM)
    tok = q_start.to(tl.int64)
    q = tl.load(Q + tok * stride_qt + h[:, None] * stride_qh + offs_d[None, :], mask=h_ok[:, None], other=0.0)

    r = tl.arange(0, BLOCK_R)
    r_tok = r // HKV
    r_head = r % HKV
    r_ok = r < TOK * HKV
    head_match = (h // GROUP)[:, None] == r_head[None, :]

    lo = split * PARTITION
    hi = tl.minimum(lo + PARTITION, ctx)
    m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    for start in range(lo, hi, TOK):
        n = start + r_tok
        n_ok = r_ok & (n < hi)
        page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        off = n % PAGE
        k = tl.load(KC + (page * stride_kb + off * stride_ks + r_head * stride_kh)[:, None] + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)
        v = tl.load(VC + (page * stride_vb + off * stride_vs + r_head * stride_vh)[:, None] + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(head_match & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(O + tok * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=h_ok[:, None])
    else:
        idx = (tok * HQ + h) * NUM_SPLITS + split
        tl.store(PM + idx, m_i, mask=h_ok)
        tl.store(PL + idx, l_i, mask=h_ok)
        tl.store(PACC + idx[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=h_ok[:, None])


@triton.jit
def _paged_attn_reduce(
    O, PM, PL, PACC, QSL,
    stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    j = tl.program_id(0)
    b = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(QSL + b)
    q_len = tl.load(QSL + b + 1) - q_start
    if j >= q_len:
        return
    tok = (q_start + j).to(tl.int64)
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < NUM_SPLITS
    idx = (tok * HQ + head) * NUM_SPLITS + s
    m = tl.load(PM + idx, mask=s_ok, other=float("-inf"))
    l = tl.load(PL + idx, mask=s_ok, other=0.0)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.load(PACC + idx[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    m_max = tl.max(m, 0)
    m_sub = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.math.exp2(m - m_sub)  # 0 for splits that saw no key
    denom = tl.sum(w * l, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(O + tok * stride_ot + head * stride_oh + offs_d, out.to(O.dtype.element_ty))


# The last tree masks flattened: every layer of a forward pass passes the same tuple, so it is
# flattened and copied to the device once per pass, not once per layer.
_LAST_TREE: list = [None, None, None]


def _flat_tree_masks(tree_masks: tuple[torch.Tensor | None, ...],
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree masks as one flat int8 tensor and each sequence's offset into it (-1: causal)."""
    if _LAST_TREE[0] is tree_masks and _LAST_TREE[1].device == device:
        return _LAST_TREE[1], _LAST_TREE[2]
    offsets, parts, used = [], [], 0
    for m in tree_masks:
        if m is None:
            offsets.append(-1)
            continue
        offsets.append(used)
        parts.append(m.reshape(-1))
        used += m.numel()
    flat = torch.cat(parts).to(device=device, dtype=torch.int8)
    _LAST_TREE[:] = [tree_masks, flat, torch.tensor(offsets, dtype=torch.int32).to(device)]
    return _LAST_TREE[1], _LAST_TREE[2]


def last_tree_mask_buffers() -> tuple[torch.Tensor, ...]:
    """The device tensors holding the last flattened tree masks. A CUDA graph captured over a tree launch reads
    them at every replay, and this cache drops them at the next batch's masks: whoever keeps such a graph must
    keep these too (app/analysis/pass_timing.py)."""
    return tuple(t for t in _LAST_TREE[1:] if t is not None)


_COUNTERS: dict[str, list[torch.Tensor]] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor | None:
    """Zeroed int32 arrival counters for the fused reduce, at least n of them. The kernel re-arms
    each counter it uses, so one buffer serves every later launch (and graph replay) on this device
    without a memset; buffers are never freed because a captured graph may hold their address.
    Not safe for two launches running concurrently on different streams."""
    key = str(device)
    bufs = _COUNTERS.setdefault(key, [])
    if bufs and bufs[-1].numel() >= n:
        return bufs[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None  # zeros made inside a capture would only be zeroed on replay
    bufs.append(torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device))
    return bufs[-1]


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # interpreter: a small number so tests exercise several splits
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def plan(batch: int, hq: int, hkv: int, max_query_len: int, max_seq_len: int, device: torch.device,
         programs_per_sm: int | None = None, min_partition: int | None = None,
         block_n: int | None = None, decode_kernel: str | None = None,
         single_pass_len: int | None = None) -> dict:
    """Kernel, tile sizes and the context split, from shapes and python ints only (graph-safe).

    `block_n` is the K/V tile height: tokens for the "group" kernel, (token, KV head) rows for the
    "allheads" decode kernel. Memoised (a fresh dict each call): every layer of a forward pass asks
    with the same shapes, and working the plan out cost ~20 us of host time on the H200 machine,
    30 times a prefill step (bench/launch_overhead.py). The module's tuning constants are read once
    per shape (the interpreter switch is part of the key: tests flip it)."""
    return dict(_plan(batch, hq, hkv, max_query_len, max_seq_len, _sm_count(device), programs_per_sm,
                      min_partition, block_n, decode_kernel, single_pass_len, _INTERPRET))


def decode_plan_for(batch: int, hq: int, hkv: int, context: int, sms: int) -> dict:
    """The plan a decode launch (one query row per sequence, contexts of up to `context` tokens) gets on a
    GPU with `sms` SMs, from the launcher's own defaults: what the FlashAttention page tabulates for an
    H200 without one. Same keys as `plan`."""
    return dict(_plan(batch, hq, hkv, 1, context, sms, None, None, None, None, None, False))


@functools.lru_cache(maxsize=4096)
def _plan(batch: int, hq: int, hkv: int, max_query_len: int, max_seq_len: int, sms: int,
          programs_per_sm: int | None, min_partition: int | None, block_n: int | None,
          decode_kernel: str | None, single_pass_len: int | None, interpret: bool) -> dict:
    group = hq // hkv
    kernel = DECODE_KERNEL if decode_kernel is None else decode_kernel
    if max_query_len > 1 or hq > 64:
        kernel = "group"
    if kernel == "allheads":
        mode = "allheads"
        block_m = max(16, triton.next_power_of_2(hq))
        q_tiles = 1
        if block_n is None:
            block_n = 32 if interpret else BLOCK_N[mode]
        block_n = max(block_n, triton.next_power_of_2(hkv))
        step = block_n // hkv  # tokens per tile
        base = batch
    else:
        mode = "decode" if max_query_len <= 1 else "chunk"
        block_m = max(16 if mode == "decode" else 64, triton.next_power_of_2(group))
        q_tiles = triton.cdiv(max(max_query_len, 1), block_m // group)
        if block_n is None:
            block_n = 16 if interpret else BLOCK_N[mode]
        step = block_n
        base = batch * hkv * q_tiles
    per_sm = TARGET_PROGRAMS_PER_SM[mode] if programs_per_sm is None else programs_per_sm
    min_part = (32 if interpret else MIN_PARTITION) if min_partition is None else min_partition
    min_part = max(min_part, step)
    length = max(max_seq_len, 1)
    if mode == "decode":
        want = per_sm * sms // max(base, 1)
        if single_pass_len is None:
            single_pass_len = 32 if interpret else SINGLE_PASS_LEN  # interpreter: short, so tests still split
        if length <= single_pass_len and base >= sms or length <= 2 * single_pass_len and 4 * base >= 5 * sms:
            want = 1
    else:
        want = triton.cdiv(per_sm * sms, max(base, 1))
    splits = max(1, min(want, triton.cdiv(length, min_part), MAX_SPLITS))
    partition = triton.cdiv(triton.cdiv(length, splits), step) * step
    splits = triton.cdiv(length, partition)  # drop splits that would own nothing
    return {"kernel": kernel, "mode": mode, "BLOCK_M": block_m, "BLOCK_N": block_n, "q_tiles": q_tiles,
            "splits": splits, "partition": partition}


def paged_attention_triton(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    *,
    num_warps: int | None = None,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
    min_partition: int | None = None,
    block_n: int | None = None,
    decode_kernel: str | None = None,
    fused_reduce: bool | None = None,
    page_loads: str | None = None,
    lean: bool | None = None,
    next_pages: bool | None = None,
    single_pass_len: int | None = None,
    tree_masks: tuple[torch.Tensor | None, ...] = (),
    out: torch.Tensor | None = None,
    pdl: bool = False,
    off32: bool | None = None,
    interleave: bool | None = None,
) -> torch.Tensor:
    """Keyword-only knobs are for tests and the bench (kernel choice, tile/launch tuning, a
    preallocated `out`). max_seq_len must be >= every seq_lens[b] (a graph bucket may be larger).
    `tree_masks`: as in `paged_attention_ref`, per sequence None (causal) or a [q_len, q_len] bool
    mask over this step's rows (a draft tree: each row sees its ancestors and itself)."""
    t, hq, d = q.shape
    _, page, hkv, dk = k_cache.shape
    assert dk == d and v_cache.shape == k_cache.shape and hq % hkv == 0
    assert d >= 16 and (d & (d - 1)) == 0, "head dim must be a power of two >= 16"
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert block_tables.stride(1) == 1
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(2) == 1
    batch = seq_lens.shape[0]
    if t == 0 or batch == 0:
        return out
    group = hq // hkv
    tree = any(m is not None for m in tree_masks)
    if tree:
        decode_kernel = "group"  # the all-heads decode kernel has no mask input
        tm, toff = _flat_tree_masks(tree_masks, q.device)
    else:
        tm = toff = seq_lens  # unused
    cfg = plan(batch, hq, hkv, max_query_len, max_seq_len, q.device, programs_per_sm, min_partition, block_n,
               decode_kernel, single_pass_len)
    splits = cfg["splits"]
    if splits > 1:
        pm, pl, pacc = split_partials(t, hq, splits, d, q.device)
    else:
        pm = pl = pacc = out  # unused
    kernel = cfg["kernel"]
    if num_warps is None:
        num_warps = 4
    if num_stages is None:
        num_stages = 1 if _INTERPRET else NUM_STAGES[cfg["mode"]]
    common = (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
              out, pm, pl, pacc,
              float(scale) * _LOG2E,
              q.stride(0), q.stride(1),
              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
              v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
              block_tables.stride(0),
              out.stride(0), out.stride(1),
              cfg["partition"])
    fused = False
    pdl_options = launch_options(pdl)
    if kernel == "allheads":
        launch(_paged_decode_allheads, (splits, batch),
            *common, NUM_SPLITS=splits, HQ=hq, HKV=hkv, GROUP=group, HEAD_DIM=d, PAGE=page,
            BLOCK_H=cfg["BLOCK_M"], BLOCK_R=cfg["BLOCK_N"], num_warps=num_warps, num_stages=num_stages)
    else:
        if fused_reduce is None:
            fused_reduce = FUSED_REDUCE or (cfg["mode"] == "decode" and splits <= FUSED_REDUCE_DECODE_SPLITS)
        fused = splits > 1 and fused_reduce
        cnt = _counters(q.device, batch * cfg["q_tiles"] * hkv) if fused else None
        if fused and cnt is None:  # first use inside a graph capture: keep the two-kernel path
            fused = False
        hoist = cfg["BLOCK_N"] % page == 0  # every split starts on a whole tile, so then on a page
        loads = PAGE_LOADS[cfg["mode"]] if page_loads is None else page_loads
        assert loads in ("loop", "asm"), f"page_loads must be 'loop' or 'asm', not {loads!r}"
        if loads == "asm" and _INTERPRET:
            loads = "loop"  # the interpreter runs no inline PTX
        # At most one row per sequence and as many rows as sequences: exactly one each, so
        # query_start_loc is arange (a shape-only test, safe inside a graph capture).
        one_row_each = max_query_len == 1 and t == batch
        decode = one_row_each and not tree and (DECODE_LEAN if lean is None else lean)
        if next_pages is None:
            next_pages = cfg["partition"] >= NEXT_PAGE_IDS_MIN_TILES * cfg["BLOCK_N"]
        ahead = decode and loads == "asm" and hoist and next_pages
        # int32 offsets by default where measured (decode reading page ids ahead); tests force them
        # elsewhere (the interpreter runs no inline PTX, so never `ahead`).
        off32 = (OFF32 and ahead if off32 is None else off32) and hoist and _fits_int32(k_cache) and _fits_int32(v_cache)
        interleave = decode and splits > 1 and (INTERLEAVE_DECODE_SPLITS if interleave is None else interleave)
        launch(_paged_attn_partial, (splits * hkv, cfg["q_tiles"], batch),
            *common, block_tables.shape[1], cnt if fused else out, cfg["q_tiles"], tm, toff,
            NUM_SPLITS=splits, HKV=hkv, GROUP=group, HEAD_DIM=d, PAGE=page,
            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
            FUSED_REDUCE=fused, SPLITS_PAD=triton.next_power_of_2(splits) if fused else 1, TREE=tree,
            PDL=pdl, HOIST=hoist, ASM_PAGES=loads == "asm", DECODE=decode, NEXT_PAGES=ahead,
            KV_SAME=k_cache.stride() == v_cache.stride(),
            OFF32=off32, INTERLEAVE=interleave,
            num_warps=num_warps, num_stages=num_stages, **pdl_options)
    if splits > 1 and not fused:
        reduce_partials(out, pm, pl, pacc, query_start_loc, max_query_len, batch, splits, pdl)
    return out


def _fits_int32(pool: torch.Tensor) -> bool:
    """Every element offset of the pool (as the kernel computes it: page x block stride + in-page
    offset) fits in int32."""
    return sum((n - 1) * st for n, st in zip(pool.shape, pool.stride())) < 2 ** 31


def split_partials(rows: int, hq: int, splits: int, d: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split partials (m, l, acc) of `rows` query rows, as `_paged_attn_partial` writes and
    `_paged_attn_reduce` reads them. One allocation for the three (each allocator call costs host time on
    every launch): acc first, then m and l, each segment 16-byte aligned."""
    n = rows * hq * splits
    seg = triton.cdiv(n, 4) * 4
    alloc = torch.full if POISON_SCRATCH else torch.empty
    if POISON_SCRATCH:
        note_untaped_work()  # the NaN fill is a kernel a replay would not repeat
    extra = {"fill_value": float("nan")} if POISON_SCRATCH else {}
    scratch = alloc((n * d + 2 * seg,), device=device, dtype=torch.float32, **extra)
    pacc = scratch[:n * d].view(rows, hq, splits, d)
    pm = scratch[n * d:n * d + n].view(rows, hq, splits)
    pl = scratch[n * d + seg:n * d + seg + n].view(rows, hq, splits)
    return pm, pl, pacc


def reduce_partials(out: torch.Tensor, pm: torch.Tensor, pl: torch.Tensor, pacc: torch.Tensor,
                    query_start_loc: torch.Tensor, max_query_len: int, batch: int, splits: int,
                    pdl: bool = False) -> None:
    """Merge the split partials of `batch` sequences into `out` [T, Hq, D] (the second kernel of a split
    launch)."""
    hq, d = out.shape[1], out.shape[2]
    launch(_paged_attn_reduce, (max(max_query_len, 1), batch, hq),
        out, pm, pl, pacc, query_start_loc,
        out.stride(0), out.stride(1),
        NUM_SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), HQ=hq, HEAD_DIM=d, PDL=pdl,
        num_warps=4 if splits * d >= 2048 else 1, **launch_options(pdl),
    )
