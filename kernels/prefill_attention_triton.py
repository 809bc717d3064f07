"""FlashAttention-2 forward for a packed, variable-length causal batch (Triton).

Same contract as `kernels.prefill_attention_ref.flash_attention_varlen_ref`: sequence b owns rows
cu_seqlens[b]:cu_seqlens[b+1] of q [T, Hq, D], k and v [T, Hkv, D]; query head h reads KV head
h // (Hq // Hkv); row i of a sequence sees keys 0..i of the same sequence.

Structure (as in Triton's fused-attention tutorial):
- one program owns a BLOCK_M tile of query rows of one (sequence, head); the Q tile stays in
  registers while K/V tiles of BLOCK_N rows stream past it;
- online softmax in base 2: scores are multiplied by scale*log2(e) and exponentiated with exp2;
  the running max m_i, running sum l_i and fp32 accumulator are rescaled when the max grows;
- causal: key tiles entirely in the future of the Q tile are never visited; stage 1 runs over the
  tiles strictly left of the diagonal with no masking at all (every key there is < start_m, so it is
  visible to every row and lies inside the sequence), stage 2 runs over the BLOCK_M-wide diagonal
  band with the causal mask (which also hides keys past the sequence end);
- programs are launched heaviest first across all heads and sequences (grid (H, B, q tiles) with
  the q-tile axis slowest and reversed), so the long causal rows do not form a
  tail at the end of the grid.

bf16/fp16 inputs go through tl.dot in that precision with fp32 accumulation; fp32 inputs in full
IEEE fp32 once `kernels.dispatch` is imported (it sets TRITON_F32_DEFAULT=ieee for the engine's
exactness runs), Triton's TF32 default otherwise (exact fp32 under TRITON_INTERPRET=1).

Two variants of the same kernel: `ptr` gathers tiles with plain pointer loads (cp.async pipelined by
Triton), `tma` reads Q/K/V tiles through Hopper tensor descriptors (TMA bulk copies) on a 2-D view
[T, H*D] of each input. `tma` is the default where it applies (Hopper, bf16/fp16): 2-8% faster on
the H200 at L >= 1024. Both run a fixed tile config (`default_config`: DEFAULT_CONFIG, the autotuner's
pick on the H200, and LONG_CONFIG for TMA launches longer than 2,048 tokens); `config="autotune"`
searches _TILES instead (first call per shape class).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.launch_tape import launch
from kernels.triton_compat import patch_interpreter

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

patch_interpreter()

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634


@triton.jit
def _attn_inner(acc, l_i, m_i, q, K_base, V_base, stride_kt, stride_vt,
                start_m, lo, hi, seq_len, qk_scale,
                offs_m, offs_n, offs_d,
                STAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    # STAGE 1: key tiles [lo, hi) strictly before the diagonal band: no mask, no bounds check.
    # STAGE 2: the diagonal band: causal mask (key <= query), keys past seq_len masked too.
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kptr = K_base + cols[:, None].to(tl.int64) * stride_kt + offs_d[None, :]
        vptr = V_base + cols[:, None].to(tl.int64) * stride_vt + offs_d[None, :]
        if STAGE == 1:
            k = tl.load(kptr)
        else:
            k = tl.load(kptr, mask=cols[:, None] < seq_len, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if STAGE == 2:
            causal = offs_m[:, None] >= cols[None, :]
            qk = qk * qk_scale + tl.where(causal, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        if STAGE == 1:
            v = tl.load(vptr)
        else:
            v = tl.load(vptr, mask=cols[:, None] < seq_len, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["MAX_SEQLEN", "SEQ_BUCKET"])
def _fa2_fwd_kernel(
    Q, K, V, O, CU_SEQLENS,
    qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    MAX_SEQLEN,
    SEQ_BUCKET,  # only an autotune key (coarse max_seqlen class)
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Grid (heads, sequences, q tiles) with the q-tile axis slowest and reversed: the heaviest
    # tiles (longest causal rows) of every head and sequence go first, the light ones fill the tail.
    h = tl.program_id(0)
    b = tl.program_id(1)
    pid_m = tl.cdiv(MAX_SEQLEN, BLOCK_M) - 1 - tl.program_id(2)
    seq_start = tl.load(CU_SEQLENS + b)
    seq_len = tl.load(CU_SEQLENS + b + 1) - seq_start
    start_m = pid_m * BLOCK_M
    if start_m >= seq_len:
        return
    kvh = h // GROUP

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len

    seq_start64 = seq_start.to(tl.int64)
    q_ptr = Q + (seq_start64 + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None], other=0.0)
    K_base = K + seq_start64 * stride_kt + kvh * stride_kh
    V_base = V + seq_start64 * stride_vt + kvh * stride_vh

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Stage 1: keys [0, start_m), whole tiles, all visible and in bounds.
    acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K_base, V_base, stride_kt, stride_vt,
                                start_m, 0, start_m, seq_len, qk_scale,
                                offs_m, offs_n, offs_d, 1, BLOCK_N)
    # Stage 2: the diagonal band [start_m, min(start_m + BLOCK_M, seq_len)).
    hi = tl.minimum(start_m + BLOCK_M, seq_len)
    acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K_base, V_base, stride_kt, stride_vt,
                                start_m, start_m, hi, seq_len, qk_scale,
                                offs_m, offs_n, offs_d, 2, BLOCK_N)

    # l_i started at 1 (not 0) so that the first rescale (alpha = exp2(-inf) = 0) wipes it: this
    # keeps the first tile free of a special case; after stage 2 every valid row has l_i >= 1.
    acc = acc / l_i[:, None]
    o_ptr = O + (seq_start64 + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, col0,
                    lo, hi, qk_scale, offs_m, offs_n,
                    STAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    # Same as _attn_inner, tiles come through TMA. Rows past the sequence (the next sequence's keys,
    # or zeros past the tensor end) only ever land in the diagonal band, where the causal mask hides
    # them from every valid query row.
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([row0 + start_n, col0])
        qk = tl.dot(q, tl.trans(k))
        if STAGE == 2:
            causal = offs_m[:, None] >= (start_n + offs_n)[None, :]
            qk = qk * qk_scale + tl.where(causal, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        acc = acc * alpha[:, None]
        v = desc_v.load([row0 + start_n, col0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["MAX_SEQLEN", "SEQ_BUCKET"])
def _fa2_fwd_tma_kernel(
    desc_q, desc_k, desc_v, O, CU_SEQLENS,
    qk_scale,
    stride_ot, stride_oh,
    MAX_SEQLEN,
    SEQ_BUCKET,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Grid (heads, sequences, q tiles) with the q-tile axis slowest and reversed: the heaviest
    # tiles (longest causal rows) of every head and sequence go first, the light ones fill the tail.
    h = tl.program_id(0)
    b = tl.program_id(1)
    pid_m = tl.cdiv(MAX_SEQLEN, BLOCK_M) - 1 - tl.program_id(2)
    seq_start = tl.load(CU_SEQLENS + b)
    seq_len = tl.load(CU_SEQLENS + b + 1) - seq_start
    start_m = pid_m * BLOCK_M
    if start_m >= seq_len:
        return
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q = desc_q.load([seq_start + start_m, h * HEAD_DIM])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, seq_start, kvh * HEAD_DIM,
                                    0, start_m, qk_scale, offs_m, offs_n, 1, BLOCK_N)
    hi = tl.minimum(start_m + BLOCK_M, seq_len)
    acc, l_i, m_i = _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, seq_start, kvh * HEAD_DIM,
                                    start_m, hi, qk_scale, offs_m, offs_n, 2, BLOCK_N)
    acc = acc / l_i[:, None]
    # Pointer store with a row mask: a TMA store would spill into the next sequence's rows.
    o_ptr = O + (seq_start.to(tl.int64) + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=(offs_m < seq_len)[:, None])


_TILES = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages): the autotune space (config="autotune")
    (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3),
    (128, 128, 8, 2), (128, 32, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4),
    (64, 64, 4, 2), (64, 64, 4, 4),
]

# The default: what the autotuner chose for both variants at every L in 512..8192 on the H200 (run 1,
# bench/NOTES_kernels.md). A fixed config keeps launches deterministic (autotuning short kernels
# proved noisy: runs 2 and 3 picked 2- or 4-stage variants that timed 1-40% slower afterwards).
DEFAULT_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
# Long prompts through TMA (max_seqlen > LONG_FROM): 128-row tiles over two warpgroups that share each
# K/V tile, four stages deep. Interleaved H200 timings (bench/fa2_variants.py, 3 rounds, median;
# results/fa2_variants_h200_v25b.json) against DEFAULT_CONFIG: 4k 0.965 vs 0.960x SDPA, 8k 0.986 vs 0.949x,
# 16k 0.997 vs 0.953x; at 2k and below it loses (0.941 vs 0.959x at 2k, 0.874 vs 0.943x at 1k), since
# fewer, longer programs fill 132 SMs less evenly. The autotune space above never held 4 stages at 128 rows.
LONG_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
LONG_FROM = 2048
# One fixed config for the interpreter (small tiles keep it quick).
INTERPRET_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _tma_pre_hook(nargs):
    bm, bn, d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"]
    nargs["desc_q"].block_shape = [bm, d]
    nargs["desc_k"].block_shape = [bn, d]
    nargs["desc_v"].block_shape = [bn, d]


def _configs(pre_hook=None):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=pre_hook)
            for bm, bn, w, s in _TILES]


_KEY = ["HEAD_DIM", "GROUP", "SEQ_BUCKET"]
_fa2_fwd_autotuned = triton.autotune(configs=_configs(), key=_KEY)(_fa2_fwd_kernel)
_fa2_fwd_tma_autotuned = triton.autotune(configs=_configs(_tma_pre_hook), key=_KEY)(_fa2_fwd_tma_kernel)


def default_config(max_seqlen: int, impl: str) -> dict:
    """The fixed tile config a launch uses when the caller names none (see DEFAULT_CONFIG, LONG_CONFIG)."""
    if _INTERPRET:
        return INTERPRET_CONFIG
    return LONG_CONFIG if impl == "tma" and max_seqlen > LONG_FROM else DEFAULT_CONFIG


def default_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The variant a call without `impl` runs: TMA where it applies, pointer loads elsewhere."""
    return "tma" if (not _INTERPRET and tma_ok(q, k, v)) else "ptr"


def describe_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen: int) -> str:
    """In words, the variant and tile config a default call would launch (for the pages' tables)."""
    impl = default_impl(q, k, v)
    cfg = default_config(max_seqlen, impl)
    loads = "TMA loads" if impl == "tma" else "pointer loads"
    return (f"{loads}, {cfg['BLOCK_M']} x {cfg['BLOCK_N']} tiles, {cfg['num_warps']} warps, "
            f"{cfg['num_stages']} stages")


def _seq_bucket(max_seqlen: int) -> int:
    """Autotune key: short (<= 512), medium (<= 2048), long prompts may prefer different tiles.
    (Values are multiples of 16 so the unused argument never changes Triton's specialisation.)"""
    return 512 if max_seqlen <= 512 else (2048 if max_seqlen <= 2048 else 16384)


@functools.lru_cache(maxsize=None)
def _major(device: torch.device) -> int:
    """Compute capability major of a device, asked once (the query cost microseconds on every
    launch, ~60 launches per prefill step)."""
    return torch.cuda.get_device_capability(device)[0]


def tma_ok(q, k, v) -> bool:
    """The TMA variant needs Hopper+, bf16/fp16 (fp32 rows would exceed the 128-byte swizzle) and
    [T, H*D] views with 16-byte aligned bases and row strides."""
    if TensorDescriptor is None or q.device.type != "cuda":
        return False
    if _major(q.device) < 9:
        return False
    d = q.shape[2]
    if q.element_size() != 2:
        return False
    for x in (q, k, v):
        if x.stride(1) != d or x.data_ptr() % 16 or (x.stride(0) * x.element_size()) % 16:
            return False
    return True


def _descs(q, k, v, bm, bn):
    t, hq, d = q.shape
    hkv = k.shape[1]
    dq = TensorDescriptor(q, [t, hq * d], [q.stride(0), 1], [bm, d])
    dk = TensorDescriptor(k, [t, hkv * d], [k.stride(0), 1], [bn, d])
    dv = TensorDescriptor(v, [t, hkv * d], [v.stride(0), 1], [bn, d])
    return dq, dk, dv


def flash_attention_varlen_triton(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    max_seqlen: int,
    scale: float,
    config: dict | str | None = None,  # None = default_config(max_seqlen, impl); "autotune"; or a fixed dict
    impl: str | None = None,  # "ptr" | "tma"; None = "tma" where tma_ok(), else "ptr"
    out: torch.Tensor | None = None,  # optional preallocated [T, Hq, D] output
) -> torch.Tensor:
    t, hq, d = q.shape
    hkv = k.shape[1]
    assert hq % hkv == 0 and k.shape == v.shape and k.shape[0] == t and k.shape[2] == d
    assert d >= 16 and (d & (d - 1)) == 0, "head dim must be a power of two >= 16"
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(2) == 1
    batch = cu_seqlens.shape[0] - 1
    if t == 0 or batch == 0 or max_seqlen <= 0:
        return out
    if config == "autotune" and _INTERPRET:
        config = INTERPRET_CONFIG
    if impl is None:
        impl = default_impl(q, k, v)
    elif impl == "tma" and not _INTERPRET and not tma_ok(q, k, v):
        raise ValueError("impl='tma' needs a Hopper GPU, bf16/fp16 inputs with [T, H*D]-contiguous rows")
    if config is None:
        config = default_config(max_seqlen, impl)
    _launch(impl, q, k, v, out, cu_seqlens, max_seqlen, float(scale) * _LOG2E, hq // hkv,
            None if config == "autotune" else config)
    return out


def _launch(impl, q, k, v, out, cu_seqlens, max_seqlen, qk_scale, group, config):
    t, hq, d = q.shape
    batch = cu_seqlens.shape[0] - 1
    tail = (int(max_seqlen), _seq_bucket(max_seqlen))
    if impl == "tma":
        bm, bn = (config["BLOCK_M"], config["BLOCK_N"]) if config else (128, 64)
        head = (*_descs(q, k, v, bm, bn), out, cu_seqlens, qk_scale, out.stride(0), out.stride(1))
        kernel, tuned = _fa2_fwd_tma_kernel, _fa2_fwd_tma_autotuned
    else:
        head = (q, k, v, out, cu_seqlens, qk_scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                out.stride(0), out.stride(1))
        kernel, tuned = _fa2_fwd_kernel, _fa2_fwd_autotuned
    if config is not None:
        cfg = dict(config)
        bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        grid = (hq, batch, triton.cdiv(max_seqlen, bm))
        launch(kernel, grid, *head, *tail, GROUP=group, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, **cfg)
    else:
        def grid(meta):
            return (hq, batch, triton.cdiv(max_seqlen, meta["BLOCK_M"]))

        launch(tuned, grid, *head, *tail, GROUP=group, HEAD_DIM=d)  # a tape cannot replay an autotuned launch
