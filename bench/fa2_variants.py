"""FA2 prefill tile configs and an FA3-style Gluon kernel against the engine's default and SDPA (H200).

Every Triton variant is the engine's own TMA kernel (kernels/prefill_attention_triton.py) launched
through its entry point with an explicit tile config; the Gluon variants are bench/fa2_gluon.py.
Timings are medians over `--rounds` interleaved rounds, so a slow stretch of the machine hits every
variant alike. The v25 notes (bench/NOTES_kernels.md) also record two Triton loops tried here and then
removed (in git at 7915361): Q K^T of the next tile issued by hand before this tile's softmax
(Triton still waited on it at once: 0.91-0.92x SDPA) and `tl.range(..., warp_specialize=True)`
(ignored on sm_90 with 8 warps, a compiler error with 4).

Usage: python3 bench/fa2_variants.py [--lengths 2048,4096,8192] [--rounds 3] [--only NAME,...]
       [--out bench/results/fa2_variants_<card>.json]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import kernels.prefill_attention_triton as fa  # noqa: E402
from bench.fa2_gluon import fa3_forward  # noqa: E402
from bench.results_io import default_results_path, write_results  # noqa: E402
from bench.kernels import HKV, HQ, SCALE, D, bench, clocks_up, make_prefill_inputs, rel  # noqa: E402

LOG2E = 1.4426950408889634


TRITON_TILES = [  # (BLOCK_M, BLOCK_N, warps, stages) for the engine kernel's TMA variant
    (64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 8, 2),
    (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 8, 3),
]
GLUON_SHAPES = [  # (BLOCK_M, BLOCK_N, stages, warps) for bench/fa2_gluon.py
    (64, 64, 2, 4), (64, 64, 3, 4), (128, 64, 2, 8), (128, 64, 3, 8), (64, 128, 2, 4), (128, 128, 2, 8),
]


def runners() -> dict:
    """name -> run(q, k, v, cu, max_seqlen, out) for every variant timed here."""
    out = {}
    for bm, bn, w, st in TRITON_TILES:
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
        out[f"triton/{bm}/{bn}/{w}/{st}"] = (lambda q, k, v, cu, L, o, cfg=cfg:
                                             fa.flash_attention_varlen_triton(q, k, v, cu, L, SCALE, config=cfg,
                                                                              impl="tma", out=o))
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
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/fa2_variants_<card>.json)")
    args = ap.parse_args()
    args.out = args.out or str(default_results_path("fa2_variants"))
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    clocks_up(seconds=2.0)
    todo = runners()
    if args.only:
        todo = {n: r for n, r in todo.items() if n in args.only.split(",")}
    # Correctness on ragged lengths first, every variant against the engine's kernel.
    lens = [1, 63, 64, 65, 200, 1000, 1537]
    q, k, v, cu = make_prefill_inputs(lens, gen)
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
        q, k, v, cu = make_prefill_inputs([L] * B, gen)
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
                    times[n].append(bench(fn))
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
    write_results(args.out, {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                             "rounds": args.rounds, "checks": checks, "rows": rows})


if __name__ == "__main__":
    main()
