"""Launch-shape sweep of the paged decode kernel against SDPA on a contiguous cache (H200).

Sweeps the knobs that set how many programs run and how each one streams: programs per SM (hence
the split count), K/V tile height, pipeline stages, warps, and how page ids are read ("loop":
tl.load per tile; "asm": inline PTX, which lets Triton multi-buffer K/V), and whether the split
partials are merged in the partial kernel. Same inputs as `bench/kernels.py` (B = 64 unless
--batch, shuffled 16-token pages in the engine's CUDA layout, rotating input sets bigger than L2,
graph-replayed). Prints the best configs per L, the best with loop page loads, the launcher's
default and SDPA, and writes JSON.

    python3 bench/paged_decode_sweep.py --out bench/results/paged_decode_sweep_h200.json
    python3 bench/paged_decode_sweep.py --batch 16 --lengths 1024,4096,16384 --per-sm 2,4,16 \
        --block-n 64,128 --stages 3 --warps 4 --page-loads asm
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (D, DT, HKV, HQ, SCALE, bench_graph, clocks_up, copy_bandwidth,  # noqa: E402
                           decode_call_bytes, decode_kv_bytes, make_decode_set, rel, rotating_sets)
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402


def sdpa_ms(B: int, L: int, n_sets: int, gen: torch.Generator) -> float:
    g = HQ // HKV
    sets = [(torch.randn(B, HKV, g, D, device="cuda", dtype=DT, generator=gen),
             torch.randn(B, HKV, L, D, device="cuda", dtype=DT, generator=gen),
             torch.randn(B, HKV, L, D, device="cuda", dtype=DT, generator=gen)) for _ in range(n_sets)]
    best = min(bench_graph([lambda c=c: F.scaled_dot_product_attention(c[0], c[1], c[2], scale=SCALE) for c in sets]),
               bench_graph([lambda c=c: F.scaled_dot_product_attention(
                   c[0].view(B, HQ, 1, D), c[1], c[2], scale=SCALE, enable_gqa=True) for c in sets]))
    del sets
    torch.cuda.empty_cache()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--per-sm", default="2,3,4,6,8,12,16")
    ap.add_argument("--block-n", default="64,128,256")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--page-loads", default="loop,asm", help="how page ids are loaded (kernels/paged_attention_triton.py)")
    ap.add_argument("--fused-reduce", default="0", help="merge split partials in the partial kernel: 0, 1 or 0,1")
    ap.add_argument("--out", default="bench/results/paged_decode_sweep_h200.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    copy = copy_bandwidth()["TBps"]
    B = args.batch
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    grid = list(itertools.product([int(x) for x in args.per_sm.split(",")], [int(x) for x in args.block_n.split(",")],
                                  [int(x) for x in args.stages.split(",")], [int(x) for x in args.warps.split(",")],
                                  args.page_loads.split(","), [bool(int(x)) for x in args.fused_reduce.split(",")]))
    results = []
    for L in [int(x) for x in args.lengths.split(",")]:
        kv_bytes = decode_kv_bytes(B, L)
        nbytes = decode_call_bytes(B, L)
        n_sets = rotating_sets(kv_bytes)
        sets = [make_decode_set(B, L, gen) for _ in range(n_sets)]
        sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
        s0 = sets[0]
        ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], sl, qsl, 1, L, SCALE)
        rows = []
        for per_sm, bn, st, wp, sp, fr in grid:
            kw = dict(programs_per_sm=per_sm, block_n=bn, num_stages=st, num_warps=wp, page_loads=sp, fused_reduce=fr)
            plan = pa.plan(B, HQ, HKV, 1, L, torch.device("cuda"), per_sm, None, bn)
            try:
                err = rel(pa.paged_attention_triton(s0["q"], s0["kc"], s0["vc"], s0["tables"], sl, qsl, 1, L, SCALE, **kw), ref)
                ms = bench_graph([lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl,
                                                                        1, L, SCALE, **kw) for s in sets])
            except Exception as exc:  # noqa: BLE001 (out of shared memory and the like)
                rows.append({"L": L, **kw, "error": repr(exc)[:200]})
                continue
            rows.append({"L": L, **kw, "splits": plan["splits"], "ms": ms, "TBps": nbytes / (ms * 1e-3) / 1e12,
                         "pct_copy": 100 * nbytes / (ms * 1e-3) / 1e12 / copy, "rel_err": err})
        default_ms = bench_graph([lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl,
                                                                        1, L, SCALE) for s in sets])
        del sets, s0, ref
        torch.cuda.empty_cache()
        sd = sdpa_ms(B, L, n_sets, gen)
        ok = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
        print(f"\nL={L}: default {default_ms * 1e3:.1f} us ({100 * nbytes / (default_ms * 1e-3) / 1e12 / copy:.1f}% copy), "
              f"SDPA {sd * 1e3:.1f} us, copy floor {nbytes / (copy * 1e12) * 1e6:.1f} us")
        print(f"{'per_sm':>6} {'block_n':>7} {'stages':>6} {'warps':>5} {'pages':>6} {'fused':>5} {'splits':>6} {'us':>7} "
              f"{'%copy':>6} {'vs SDPA':>7}")
        for r in ok[:12]:
            print(f"{r['programs_per_sm']:>6} {r['block_n']:>7} {r['num_stages']:>6} {r['num_warps']:>5} "
                  f"{r['page_loads']:>6} {int(r['fused_reduce']):>5} {r['splits']:>6} "
                  f"{r['ms'] * 1e3:>7.1f} {r['pct_copy']:>6.1f} {sd / r['ms']:>7.2f}")
        loop = [r for r in ok if r["page_loads"] == "loop"]
        if loop:
            r = loop[0]
            print(f"best with in-loop page loads: per_sm {r['programs_per_sm']} block_n {r['block_n']} stages "
                  f"{r['num_stages']} warps {r['num_warps']}: {r['ms'] * 1e3:.1f} us ({r['pct_copy']:.1f}% copy)")
        results.append({"L": L, "B": B, "bytes": nbytes, "default_ms": default_ms, "sdpa_ms": sd, "rows": rows})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"copy_TBps": copy, "device": torch.cuda.get_device_name(), "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
