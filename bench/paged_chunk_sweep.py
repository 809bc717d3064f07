"""Tile shapes for prefill chunks that continue a cached prefix (the paged kernel's "chunk" mode), H200.

bench/kernels.py measures these chunks at 195-238 TFLOP/s, against FA2's 360-416 on fresh prompts of
the same length. v25 found 128-row tiles over 8 warps (two warpgroups sharing each K/V tile) worth
3-5 % for FA2 at long L; this sweep asks the same of the chunk kernel: BLOCK_M (query rows x heads
of a group), BLOCK_N (keys), warps and stages, each checked against the torch reference first.

Usage: python3 bench/paged_chunk_sweep.py [--out bench/results/paged_chunk_sweep_h200.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import DT, HKV, HQ, SCALE, D, bench_graph, clocks_up, make_decode_set, rel  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

SHAPES = [(4, 8192, 2048), (16, 2048, 512), (8, 1024, 256), (1, 4096, 512)]  # (B, ctx, q_len)
TILES = [(bm, bn, w, s) for bm, bn, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
         if not (bm == 64 and w == 8)]


def with_block_m(block_m: int):
    """pa.plan with the chunk mode's BLOCK_M replaced and its q tiles worked out again; the split count
    stays the default plan's (one split at every shape swept here)."""
    orig = pa.plan

    def plan(batch, hq, hkv, max_query_len, max_seq_len, device, *args, **kw):
        cfg = orig(batch, hq, hkv, max_query_len, max_seq_len, device, *args, **kw)
        if cfg["mode"] == "chunk" and cfg["BLOCK_M"] != block_m:
            group = hq // hkv
            cfg["BLOCK_M"] = block_m
            cfg["q_tiles"] = triton.cdiv(max_query_len, block_m // group)
        return cfg
    return plan


def run(q, s, sl, qsl, ql, ctx, tile=None):
    if tile is None:
        return pa.paged_attention_triton(q, s["kc"], s["vc"], s["tables"], sl, qsl, ql, ctx, SCALE)
    bm, bn, w, st = tile
    orig = pa.plan
    pa.plan = with_block_m(bm)
    try:
        return pa.paged_attention_triton(q, s["kc"], s["vc"], s["tables"], sl, qsl, ql, ctx, SCALE,
                                         block_n=bn, num_warps=w, num_stages=st)
    finally:
        pa.plan = orig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "paged_chunk_sweep_h200.json"))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    clocks_up(seconds=2.0)
    # Correctness at a small ragged-free shape, every tile, against the fp32 reference.
    B, ctx, ql = 3, 700, 200
    s = make_decode_set(B, 704, gen)
    q = torch.randn(B * ql, HQ, D, device="cuda", dtype=DT, generator=gen)
    sl = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, B * ql + 1, ql, dtype=torch.int32, device="cuda")
    kc, vc = s["kc"].float(), s["vc"].float()
    ref = paged_attention_ref(q.float(), kc, vc, s["tables"], sl, qsl, ql, ctx, SCALE)
    checks = {}
    for tile in TILES:
        name = "/".join(map(str, tile))
        try:
            checks[name] = rel(run(q, s, sl, qsl, ql, ctx, tile), ref)
        except Exception as exc:  # noqa: BLE001
            checks[name] = repr(exc)[:200]
    bad = {n: e for n, e in checks.items() if not isinstance(e, float) or e > 2e-2}
    print("checks:", len(checks) - len(bad), "ok;", "bad:", bad, flush=True)
    rows = []
    for B, ctx, ql in SHAPES:
        s = make_decode_set(B, ctx, gen)
        q = torch.randn(B * ql, HQ, D, device="cuda", dtype=DT, generator=gen)
        sl = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        qsl = torch.arange(0, B * ql + 1, ql, dtype=torch.int32, device="cuda")
        flops = B * sum(4 * HQ * D * (ctx - ql + j + 1) for j in range(ql))
        row = {"B": B, "ctx": ctx, "q_len": ql, "default_plan": pa.plan(B, HQ, HKV, ql, ctx, q.device), "ms": {}}
        row["ms"]["default"] = bench_graph([lambda: run(q, s, sl, qsl, ql, ctx)])
        for tile in TILES:
            name = "/".join(map(str, tile))
            if name in bad:
                continue
            try:
                row["ms"][name] = bench_graph([lambda tile=tile: run(q, s, sl, qsl, ql, ctx, tile)])
            except Exception as exc:  # noqa: BLE001
                row["ms"][name] = repr(exc)[:200]
        row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items() if isinstance(ms, float)}
        rows.append(row)
        best = sorted(row["tflops"], key=row["tflops"].get, reverse=True)[:6]
        print(f"B={B} ctx={ctx} q_len={ql}: default {row['tflops']['default']:.1f} TFLOP/s; best "
              + ", ".join(f"{n} {row['tflops'][n]:.1f}" for n in best), flush=True)
        del s, q
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "checks": checks, "rows": rows},
                                         indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
