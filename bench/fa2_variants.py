"""FA2 prefill variants against the engine's kernel and SDPA (H200, bench only).

The engine's TMA kernel (kernels/prefill_attention_triton.py) waits for each Q K^T wgmma before its
softmax, so inside one program the tensor cores idle while the exponentials run, and only the 2-3
programs sharing an SM overlap the two. Two ways to overlap them inside a program, tried here:

- `pipe`: software pipelining by hand (FlashAttention-3's intra-warpgroup overlap): Q K^T of tile
  j+1 is issued before the softmax of tile j, so the wgmma runs while the MUFU works;
- `ws`: Triton's automatic warp specialisation (`tl.range(..., warp_specialize=True)`), which
  splits loads, MMAs and softmax over partitions.

Usage: python3 bench/fa2_variants.py [--lengths 2048,4096,8192] [--out bench/results/fa2_variants_h200.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels.prefill_attention_triton as fa  # noqa: E402
from bench.fa2_gluon import fa3_forward  # noqa: E402
from kernels.prefill_attention_triton import TensorDescriptor  # noqa: E402

HQ, HKV, D = 9, 3, 64
SCALE = D ** -0.5
LOG2E = 1.4426950408889634


@triton.jit
def _softmax_pv(qk, acc, l_i, m_i, v, offs_m, start_n, offs_n, qk_scale, STAGE: tl.constexpr):
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
    acc = tl.dot(p.to(v.dtype), v, acc)
    l_i = l_i * alpha + l_ij
    return acc, l_i, m_ij


@triton.jit
def _inner_plain(acc, l_i, m_i, q, desc_k, desc_v, row0, col0, lo, hi, qk_scale, offs_m, offs_n,
                 STAGE: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([row0 + start_n, col0])
        qk = tl.dot(q, tl.trans(k))
        v = desc_v.load([row0 + start_n, col0])
        acc, l_i, m_i = _softmax_pv(qk, acc, l_i, m_i, v, offs_m, start_n, offs_n, qk_scale, STAGE)
    return acc, l_i, m_i


@triton.jit
def _inner_pipe(acc, l_i, m_i, q, desc_k, desc_v, row0, col0, lo, hi, qk_scale, offs_m, offs_n,
                BLOCK_N: tl.constexpr):
    # Stage 1 only (no mask): Q K^T of the next tile is issued before this tile's softmax.
    if lo < hi:
        k = desc_k.load([row0 + lo, col0])
        qk = tl.dot(q, tl.trans(k))
        for start_n in range(lo, hi - BLOCK_N, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            k_next = desc_k.load([row0 + start_n + BLOCK_N, col0])
            qk_next = tl.dot(q, tl.trans(k_next))
            v = desc_v.load([row0 + start_n, col0])
            acc, l_i, m_i = _softmax_pv(qk, acc, l_i, m_i, v, offs_m, start_n, offs_n, qk_scale, 1)
            qk = qk_next
        last = hi - BLOCK_N
        v = desc_v.load([row0 + last, col0])
        acc, l_i, m_i = _softmax_pv(qk, acc, l_i, m_i, v, offs_m, last, offs_n, qk_scale, 1)
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["MAX_SEQLEN"])
def _fa2_variant(desc_q, desc_k, desc_v, O, CU_SEQLENS, qk_scale, stride_ot, stride_oh, MAX_SEQLEN,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 MODE: tl.constexpr):  # MODE 0 plain, 1 warp-specialised stage 1, 2 pipelined stage 1
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
    if MODE == 2:
        acc, l_i, m_i = _inner_pipe(acc, l_i, m_i, q, desc_k, desc_v, seq_start, kvh * HEAD_DIM,
                                    0, start_m, qk_scale, offs_m, offs_n, BLOCK_N)
    else:
        acc, l_i, m_i = _inner_plain(acc, l_i, m_i, q, desc_k, desc_v, seq_start, kvh * HEAD_DIM,
                                     0, start_m, qk_scale, offs_m, offs_n, 1, BLOCK_N, MODE == 1)
    hi = tl.minimum(start_m + BLOCK_M, seq_len)
    acc, l_i, m_i = _inner_plain(acc, l_i, m_i, q, desc_k, desc_v, seq_start, kvh * HEAD_DIM,
                                 start_m, hi, qk_scale, offs_m, offs_n, 2, BLOCK_N, False)
    acc = acc / l_i[:, None]
    o_ptr = O + (seq_start.to(tl.int64) + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=(offs_m < seq_len)[:, None])


MODES = {"plain": 0, "ws": 1, "pipe": 2}


def run_variant(q, k, v, cu, max_seqlen, mode: str, bm: int, bn: int, warps: int, stages: int, out=None):
    t, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty_like(q) if out is None else out
    dq = TensorDescriptor(q, [t, hq * d], [q.stride(0), 1], [bm, d])
    dk = TensorDescriptor(k, [t, hkv * d], [k.stride(0), 1], [bn, d])
    dv = TensorDescriptor(v, [t, hkv * d], [v.stride(0), 1], [bn, d])
    grid = (hq, cu.shape[0] - 1, triton.cdiv(max_seqlen, bm))
    _fa2_variant[grid](dq, dk, dv, out, cu, SCALE * LOG2E, out.stride(0), out.stride(1), max_seqlen,
                       GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, MODE=MODES[mode],
                       num_warps=warps, num_stages=stages)
    return out


def bench_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def inputs(lens, gen):
    t = sum(lens)
    q = torch.randn(t, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(t, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(t, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return q, k, v, cu.cuda()


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


SHAPES = [  # (mode, BLOCK_M, BLOCK_N, warps, stages); "ws" is left out: on sm90 Triton 3.6 ignores it
    # with 8 warps (the same SASS as "plain") and fails in NVGPUWarpSpecialization with 4.
    ("plain", 64, 64, 4, 3), ("plain", 64, 64, 4, 2), ("plain", 128, 64, 8, 3), ("plain", 128, 64, 8, 2),
    ("plain", 128, 64, 8, 4), ("plain", 128, 128, 8, 2), ("plain", 128, 128, 8, 3), ("plain", 128, 32, 8, 3),
    ("pipe", 64, 64, 4, 3), ("pipe", 128, 64, 8, 3),
]
GLUON_SHAPES = [  # (BLOCK_M, BLOCK_N, stages, warps) for bench/fa2_gluon.py
    (64, 64, 2, 4), (64, 64, 3, 4), (128, 64, 2, 8), (128, 64, 3, 8), (64, 128, 2, 4), (128, 128, 2, 8),
]


def runners() -> dict:
    """name -> run(q, k, v, cu, max_seqlen, out) for every variant timed here."""
    out = {}
    for shape in SHAPES:
        out["/".join(map(str, shape))] = (lambda q, k, v, cu, L, o, shape=shape:
                                          run_variant(q, k, v, cu, L, *shape, out=o))
    for bm, bn, st, w in GLUON_SHAPES:
        out[f"gluon/{bm}/{bn}/{w}/{st}"] = (lambda q, k, v, cu, L, o, bm=bm, bn=bn, st=st, w=w:
                                            fa3_forward(q, k, v, cu, L, SCALE * LOG2E, bm, bn, st, w, out=o))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--rounds", type=int, default=1, help="time every variant this many times, interleaved")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fa2_variants_h200.json"))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.time() + 2.0
    while time.time() < t_end:
        a @ a
    torch.cuda.synchronize()
    del a
    todo = runners()
    if args.only:
        todo = {n: r for n, r in todo.items() if n in args.only.split(",")}
    # Correctness on ragged lengths first, every variant against the engine's kernel.
    lens = [1, 63, 64, 65, 200, 1000, 1537]
    q, k, v, cu = inputs(lens, gen)
    ref = fa.flash_attention_varlen_triton(q, k, v, cu, max(lens), SCALE)
    checks = {}
    for name, run in todo.items():
        try:
            checks[name] = rel(run(q, k, v, cu, max(lens), None), ref)
        except Exception as exc:  # noqa: BLE001
            checks[name] = repr(exc)[:300]
        print("check", name, checks[name], flush=True)
    rows = []
    for L in [int(x) for x in args.lengths.split(",")]:
        B = max(1, args.tokens // L)
        q, k, v, cu = inputs([L] * B, gen)
        flops = B * 4 * L * L * HQ * D / 2
        qs = q.view(B, L, HQ, D).transpose(1, 2).contiguous()
        ks = k.view(B, L, HKV, D).transpose(1, 2).contiguous()
        vs = v.view(B, L, HKV, D).transpose(1, 2).contiguous()
        out = torch.empty_like(q)
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=SCALE, enable_gqa=True),
               "engine": lambda: fa.flash_attention_varlen_triton(q, k, v, cu, L, SCALE)}
        for name, run in todo.items():
            if isinstance(checks.get(name), float) and checks[name] <= 2e-2:
                fns[name] = lambda run=run: run(q, k, v, cu, L, out)
        times: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, fn in fns.items():
                try:
                    times[n].append(bench_ms(fn))
                except Exception as exc:  # noqa: BLE001
                    print("failed", n, repr(exc)[:200], flush=True)
        med = {n: sorted(t)[len(t) // 2] for n, t in times.items() if t}
        row = {"L": L, "B": B, "ms_median": med, "ms_all": times,
               "tflops": {n: flops / (ms * 1e-3) / 1e12 for n, ms in med.items()},
               "x_sdpa": {n: med["sdpa"] / ms for n, ms in med.items()}}
        rows.append(row)
        print(f"L={L} B={B} (median of {args.rounds} rounds)", flush=True)
        for n in sorted(med, key=med.get):
            print(f"   {n:<22} {med[n]:.4f} ms {row['tflops'][n]:6.1f} TF/s  {row['x_sdpa'][n]:.3f}x SDPA", flush=True)
        del q, k, v, qs, ks, vs, out, fns
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                                          "rounds": args.rounds, "checks": checks, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
