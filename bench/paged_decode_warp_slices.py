"""The warp-slice decode kernel (bench/warp_slice_decode.py) against the engine's kernel and SDPA.

Same inputs and timing as `bench/kernels.py` (B = 64, shuffled 16-token head-major pages, rotating
input sets bigger than L2, graph-replayed); `--sequential` lays each sequence's pages in order.
Every variant's output is checked against the torch reference. Prints a table and writes JSON.
With `--ncu`, launches the single-pass variant, the engine's kernel and SDPA twice each at one
length for

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section Occupancy -k regex:"warp_slice|paged_attn_partial|flash_fprop" --launch-skip 3 -c 3 \\
        python3 bench/paged_decode_warp_slices.py --ncu

    python3 bench/paged_decode_warp_slices.py --out bench/results/paged_decode_warp_slices_v13_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (D, DT, HKV, HQ, SCALE, bench_graph, clocks_up, decode_kv_bytes, make_decode_set,  # noqa: E402
                           rel, rotating_sets)
from bench.paged_decode_sweep import sdpa_ms  # noqa: E402
from bench.warp_slice_decode import warp_slice_decode  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

# name -> warp_slice_decode keywords (the shapes v13 measured; slices = warps)
VARIANTS = {
    "1 split, 4x32 keys, 3 stages": dict(splits=1, slices=4, slice_keys=32, num_warps=4, num_stages=3),
    "1 split, 4x32 keys, 4 stages": dict(splits=1, slices=4, slice_keys=32, num_warps=4, num_stages=4),
    "1 split, 4x32 keys, L1 prefetch": dict(splits=1, slices=4, slice_keys=32, num_warps=4, num_stages=3,
                                            prefetch_lines=64),
    "2 splits, 4x32 keys": dict(splits=2, slices=4, slice_keys=32, num_warps=4, num_stages=3),
    "2 splits, 2x32 keys, 2 warps": dict(splits=2, slices=2, slice_keys=32, num_warps=2, num_stages=3),
    "2 splits, 4x16 keys, 4 stages": dict(splits=2, slices=4, slice_keys=16, num_warps=4, num_stages=4),
    # v19: one program per (sequence, KV head), as SDPA's cuDNN kernel, but two 4-warp streams of 64-key
    # tiles merged in shared memory at the end: the two-split launch's streams without its merge through L2.
    "1 split, 2x64 keys, 8 warps, 3 stages": dict(splits=1, slices=2, slice_keys=64, num_warps=8, num_stages=3),
    "1 split, 2x64 keys, 8 warps, 4 stages": dict(splits=1, slices=2, slice_keys=64, num_warps=8, num_stages=4),
    "1 split, 2x32 keys, 8 warps, 4 stages": dict(splits=1, slices=2, slice_keys=32, num_warps=8, num_stages=4),
}


def measure(batch: int, length: int, sequential: bool, gen: torch.Generator, variants: dict[str, dict]) -> dict:
    n_sets = rotating_sets(decode_kv_bytes(batch, length))
    sets = [make_decode_set(batch, length, gen, sequential) for _ in range(n_sets)]
    sl = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    s0 = sets[0]
    ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], sl, qsl, 1, length,
                              SCALE)
    row = {"L": length, "B": batch, "sequential": sequential, "variants": {}}
    row["engine_us"] = 1e3 * bench_graph([lambda s=s: pa.paged_attention_triton(
        s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, length, SCALE) for s in sets])
    for name, kw in variants.items():
        err = rel(warp_slice_decode(s0["q"], s0["kc"], s0["vc"], s0["tables"], sl, SCALE, **kw), ref)
        us = 1e3 * bench_graph([lambda s=s, kw=kw: warp_slice_decode(s["q"], s["kc"], s["vc"], s["tables"], sl, SCALE,
                                                                     **kw) for s in sets])
        row["variants"][name] = {"us": us, "rel_err": err, **kw}
    del ref, sets
    torch.cuda.empty_cache()
    row["sdpa_us"] = 1e3 * sdpa_ms(batch, length, n_sets, gen)  # its faster path, as the sweep compares
    return row


def ncu_launches(length: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    s = make_decode_set(64, length, gen)
    sl = torch.full((64,), length, dtype=torch.int32, device="cuda")
    qsl = torch.arange(65, dtype=torch.int32, device="cuda")
    q4 = torch.randn(64, HQ, 1, D, device="cuda", dtype=DT, generator=gen)
    kk = torch.randn(64, HKV, length, D, device="cuda", dtype=DT, generator=gen)
    vv = torch.randn(64, HKV, length, D, device="cuda", dtype=DT, generator=gen)
    for _ in range(2):
        warp_slice_decode(s["q"], s["kc"], s["vc"], s["tables"], sl, SCALE)
        pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, length, SCALE)
        F.scaled_dot_product_attention(q4, kk, vv, scale=SCALE, enable_gqa=True)
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sequential", action="store_true", help="each sequence's pages in order")
    ap.add_argument("--ncu", action="store_true", help="a few launches at 8k for Nsight Compute, no timing")
    ap.add_argument("--only", default="", help="substrings separated by |: the variants whose names hold one")
    ap.add_argument("--out", default="bench/results/paged_decode_warp_slices_v13_h200.json")
    args = ap.parse_args()
    if args.ncu:
        ncu_launches(8192)
        return
    wanted = [w for w in args.only.split("|") if w]
    variants = {k: v for k, v in VARIANTS.items() if not wanted or any(w in k for w in wanted)}
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        row = measure(args.batch, length, args.sequential, gen, variants)
        rows.append(row)
        print(f"L={length}: engine kernel {row['engine_us']:.1f} us, SDPA {row['sdpa_us']:.1f} us")
        for name, v in row["variants"].items():
            print(f"   {name:34s} {v['us']:7.1f} us  x SDPA {row['sdpa_us'] / v['us']:.3f}  rel err {v['rel_err']:.1e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
