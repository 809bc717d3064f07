"""Launch shapes of the fused low-bit decode kernel (CUDA only): tile height, warps and pipeline stages per format.

    python3 bench/kv_quant_decode_sweep.py [--out bench/results/kv_quant_decode_sweep_h200.json]

Same inputs and timing as bench/kv_quant_decode.py (kernels/quant_decode_timing.py); prints the best launch per
format and shape, writes every measurement.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.results_io import write_results_and_out  # noqa: E402
from kernels.paged_decode_quant_triton import paged_decode_quant_triton  # noqa: E402
from kernels.quant_decode_timing import D, _format_sets, graph_time_us  # noqa: E402
from kernels.quant_kv_pool import KERNEL_FORMATS  # noqa: E402

SHAPES = [(64, 2048), (64, 8192), (1, 32768)]
LAUNCHES = list(itertools.product((64, 128, 256), (4, 8), (2, 3, 4)))  # block_n, warps, stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/kv_quant_decode_sweep_h200.json"))
    ap.add_argument("--formats", default=",".join(KERNEL_FORMATS))
    ap.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES), help="BxL,BxL,...")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    for (B, L), fmt in itertools.product(shapes, args.formats.split(",")):
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        sets = _format_sets(fmt, B, L, gen)
        timed = []
        for block_n, warps, stages in LAUNCHES:
            try:
                us = graph_time_us([lambda s=s: paged_decode_quant_triton(
                    s["q"], s["pool"], s["tables"], lens, L, D ** -0.5, block_n=block_n, num_warps=warps,
                    num_stages=stages) for s in sets], reps=50)
            except Exception as e:  # noqa: BLE001 - a launch that does not compile (shared memory) is a result too
                us = float("nan")
                print(f"{fmt} B={B} L={L} {block_n}/{warps}/{stages}: {type(e).__name__}", flush=True)
            timed.append(dict(B=B, L=L, fmt=fmt, block_n=block_n, warps=warps, stages=stages, us=us))
        best = min((t for t in timed if t["us"] == t["us"]), key=lambda t: t["us"])
        default = next(t for t in timed if (t["block_n"], t["warps"], t["stages"]) == (128, 4, 3))
        print(f"B={B:>3} L={L:>6} {fmt:>5}: default {default['us']:7.1f} us, best {best['us']:7.1f} "
              f"({best['block_n']} keys, {best['warps']} warps, {best['stages']} stages)", flush=True)
        rows += timed
        del sets
        torch.cuda.empty_cache()
    write_results_and_out(args.out, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
