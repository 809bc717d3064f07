"""A decode kernel with the keys on the MMA's M axis (bench only): S^T = K Q^T and O^T = V^T P^T.

The engine's decode tile puts the GROUP = 3 query heads of a KV group on M (16 rows, 13 of them
padding), so its MMAs are Ampere-style mma.sync fed by ldmatrix from shared memory. With the keys on
M (64 or 128 rows) and the heads on N (16), both products have M >= 64 and can be Hopper wgmma, which
reads K and V straight from shared memory: no ldmatrix, fewer instructions a tile. The softmax then
runs down the columns (over keys) instead of along rows. Same paged inputs as `bench/kernels.py`
(B = 64, shuffled 16-token head-major pages, rotating sets, graph-timed); compared against the
engine's launcher and SDPA on a contiguous cache.

    python3 bench/paged_decode_keys_major.py --out bench/results/paged_decode_keys_major_h200.json
    TRITON_INTERPRET=1 python3 bench/paged_decode_keys_major.py --check   # small shapes, CPU
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _decode_keys_major(
    Q, KC, VC, BT, SEQ_LENS, O, PM, PL, PACC,
    qk_scale,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_bt, stride_ot, stride_oh,
    BT_WIDTH,
    NUM_SPLITS: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr, QN: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr,
):
    pid0 = tl.program_id(0)
    kvh = pid0 % HKV
    split = pid0 // HKV
    b = tl.program_id(1)
    ctx = tl.load(SEQ_LENS + b)
    g = tl.arange(0, QN)
    g_ok = g < GROUP
    head = kvh * GROUP + g
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    # Q^T [D, QN]: the group's heads as columns (padding columns zero).
    qt = tl.load(Q + b.to(tl.int64) * stride_qt + head[None, :] * stride_qh + offs_d[:, None],
                 mask=g_ok[None, :], other=0.0)
    m_i = tl.zeros([QN], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([QN], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM, QN], dtype=tl.float32)  # O^T
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_head = KC + kvh * stride_kh
    v_head = VC + kvh * stride_kh
    k_in = (offs_n % PAGE)[:, None] * stride_ks + offs_d[None, :]
    for start in range(split * BLOCK_N, ctx, BLOCK_N * NUM_SPLITS):
        n = start + offs_n
        n_ok = n < ctx
        if ASM:
            page = pa.page_ids_unpipelined(bt_row + tl.minimum(n // PAGE, BT_WIDTH - 1))
        else:
            page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0)
        off = page[:, None] * stride_kb + k_in
        k = tl.load(k_head + off, mask=n_ok[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_head + off, mask=n_ok[:, None], other=0.0)
        s = tl.dot(k, qt) * qk_scale  # S^T [BLOCK_N, QN]
        s = tl.where(n_ok[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[None, :])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha[None, :]
        acc = tl.dot(tl.trans(v), p.to(v.dtype), acc)  # O^T += V^T P^T
        m_i = m_new
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[None, :]
        tl.store(O + b.to(tl.int64) * stride_ot + head[None, :] * stride_oh + offs_d[:, None],
                 out.to(O.dtype.element_ty), mask=g_ok[None, :])
    else:
        idx = (b * (HKV * GROUP) + head) * NUM_SPLITS + split
        tl.store(PM + idx, m_i, mask=g_ok)
        tl.store(PL + idx, l_i, mask=g_ok)
        tl.store(PACC + idx[None, :] * HEAD_DIM + offs_d[:, None], acc, mask=g_ok[None, :])


def decode_keys_major(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                      seq_lens: torch.Tensor, scale: float, splits: int = 1, block_n: int = 64,
                      num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Decode attention for q [B, Hq, D] over the paged pools kc / vc [blocks, page, Hkv, D]."""
    B, hq, d = q.shape
    hkv = kc.shape[2]
    out = torch.empty_like(q)
    qsl = torch.arange(B + 1, dtype=torch.int32, device=q.device)
    if splits > 1:
        pm, pl, pacc = pa.split_partials(B, hq, splits, d, q.device)
    else:
        pm = pl = pacc = out
    assert kc.stride() == vc.stride()
    _decode_keys_major[(hkv * splits, B)](
        q, kc, vc, tables, seq_lens, out, pm, pl, pacc, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
        tables.stride(0), out.stride(0), out.stride(1), tables.shape[1],
        NUM_SPLITS=splits, HKV=hkv, GROUP=hq // hkv, HEAD_DIM=d, PAGE=kc.shape[1], QN=16, BLOCK_N=block_n,
        ASM=not _INTERPRET, num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        pa.reduce_partials(out, pm, pl, pacc, qsl, 1, B, splits)
    return out


def check() -> None:
    """Small random shapes against the torch reference (CPU under TRITON_INTERPRET=1, or a GPU)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # Triton 3.6's interpreter multiplies bf16 operands of this kernel's dots as raw bits; fp32 checks the logic.
    dt = torch.float32 if _INTERPRET else torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    for B, L, splits, bn in ((2, 40, 1, 64), (3, 100, 2, 64), (2, 200, 3, 128)):
        page, hkv, hq, d = 16, 3, 9, 64
        nb = B * triton.cdiv(L, page) + 3
        kc = torch.randn(nb, page, hkv, d, generator=gen, device=dev).to(dt)
        vc = torch.randn(nb, page, hkv, d, generator=gen, device=dev).to(dt)
        tables = torch.randperm(nb, generator=gen, device=dev)[:B * triton.cdiv(L, page)].to(torch.int32)
        tables = tables.view(B, -1).contiguous()
        q = torch.randn(B, hq, d, generator=gen, device=dev).to(dt)
        lens = torch.tensor([L - 7 * i for i in range(B)], dtype=torch.int32, device=dev)
        qsl = torch.arange(B + 1, dtype=torch.int32, device=dev)
        ref = paged_attention_ref(q.float(), kc.float(), vc.float(), tables, lens, qsl, 1, L, d ** -0.5)
        out = decode_keys_major(q, kc, vc, tables, lens, d ** -0.5, splits=splits, block_n=bn)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        print(f"B={B} L={L} splits={splits} block_n={bn}: rel err {err:.2e}")
        assert err < 2e-2, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only the small-shape correctness check")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--splits", default="1,2,3")
    ap.add_argument("--block-n", default="64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="3,4")
    ap.add_argument("--out", default="bench/results/paged_decode_keys_major_h200.json")
    args = ap.parse_args()
    check()
    if args.check:
        return
    from bench.kernels import (SCALE, bench_graph, clocks_up, copy_bandwidth, decode_call_bytes, decode_kv_bytes,
                               make_decode_set, rel, rotating_sets)
    from bench.paged_decode_sweep import sdpa_ms
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    copy = copy_bandwidth()["TBps"]
    B = 64
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    results = []
    for L in [int(x) for x in args.lengths.split(",")]:
        kv_bytes = decode_kv_bytes(B, L)
        nbytes = decode_call_bytes(B, L)
        sets = [make_decode_set(B, L, gen) for _ in range(rotating_sets(kv_bytes))]
        sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
        s0 = sets[0]
        ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], sl, qsl, 1, L, SCALE)
        default_ms = bench_graph([lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl,
                                                                        1, L, SCALE) for s in sets])
        rows = []
        for splits, bn, wp, st in itertools.product(*[[int(x) for x in a.split(",")] for a in
                                                       (args.splits, args.block_n, args.warps, args.stages)]):
            kw = dict(splits=splits, block_n=bn, num_warps=wp, num_stages=st)
            try:
                err = rel(decode_keys_major(s0["q"], s0["kc"], s0["vc"], s0["tables"], sl, SCALE, **kw), ref)
                ms = bench_graph([lambda s=s: decode_keys_major(s["q"], s["kc"], s["vc"], s["tables"], sl, SCALE, **kw)
                                  for s in sets])
            except Exception as exc:  # noqa: BLE001 (out of resources and the like)
                rows.append({**kw, "error": repr(exc)[:200]})
                continue
            rows.append({**kw, "ms": ms, "rel_err": err, "pct_copy": 100 * nbytes / (ms * 1e-3) / 1e12 / copy})
        del sets, s0, ref
        torch.cuda.empty_cache()
        sd = sdpa_ms(B, L, rotating_sets(kv_bytes), gen)
        ok = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
        print(f"\nL={L}: engine {default_ms * 1e3:.1f} us ({sd / default_ms:.3f}x SDPA), SDPA {sd * 1e3:.1f} us")
        for r in ok[:6]:
            print(f"  splits {r['splits']} block_n {r['block_n']:>3} warps {r['num_warps']} stages {r['num_stages']}: "
                  f"{r['ms'] * 1e3:7.1f} us  {sd / r['ms']:.3f}x SDPA  {r['pct_copy']:5.1f}% copy  err {r['rel_err']:.1e}")
        for r in rows:
            if "error" in r:
                print("  error", {k: v for k, v in r.items() if k != "error"}, r["error"][:120])
        results.append({"L": L, "B": B, "engine_ms": default_ms, "sdpa_ms": sd, "rows": rows})
    mma = {}
    try:  # which MMA the compiler chose, per compiled variant (Triton 3.6's cache layout)
        for kernel in _decode_keys_major.device_caches[torch.cuda.current_device()][0].values():
            ptx = kernel.asm["ptx"]
            c = kernel.constants if hasattr(kernel, "constants") else {}
            mma[str(len(mma))] = {"wgmma": ptx.count("wgmma.mma_async"), "mma.sync": ptx.count("mma.sync"),
                                  "ldmatrix": ptx.count("ldmatrix"), "meta": str(c)[:200]}
    except Exception as exc:  # noqa: BLE001
        mma["error"] = repr(exc)[:200]
    print("MMA instructions per compiled variant:", json.dumps(mma)[:1500])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"copy_TBps": copy, "device": torch.cuda.get_device_name(), "results": results,
                               "mma": mma}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
