"""Launch shapes of the fused low-bit decode kernel (CUDA only): every combination of the axes given, per format
and shape; prints the default and the best launch of each, writes every measurement.

    python3 bench/kv_quant_decode_sweep.py [--formats fp8,int8,int4] [--shapes 64x2048,64x8192,1x32768]
        [--block-n 64,128,256] [--warps 4,8] [--stages 2,3,4] [--splits plan] [--maxnreg none] [--out FILE]

`--splits plan` keeps the launcher's split count; numbers force one. `--maxnreg` caps registers per thread
(Triton's maxnreg; `none` leaves it to the compiler). Same inputs and timing as bench/kv_quant_decode.py
(kernels/quant_decode_timing.py). The runs in bench/NOTES_kv_quant_decode.md:
  tiles:     --block-n 64,128,256 --warps 4,8 --stages 2,3,4                      (results/..._sweep_h200_{a,b})
  splits:    --formats bf16,fp8,int4 --shapes 64x2048,64x8192 --splits 1,2,3,4,6,8 --block-n 128,256 --stages 3
  registers: --shapes 64x8192,64x2048 --maxnreg none,128,96,80 --stages 2,3 --splits 2,4 --block-n 128
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
from kernels.paged_decode_quant_triton import BLOCK_N, NUM_STAGES, paged_decode_quant_triton  # noqa: E402
from kernels.quant_decode_timing import D, _format_sets, graph_time_us  # noqa: E402
from kernels.quant_kv_pool import KERNEL_FORMATS  # noqa: E402


def _ints(text: str, none_word: str | None = None) -> list[int | None]:
    return [None if v == none_word else int(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/kv_quant_decode_sweep_<card>.json)")
    ap.add_argument("--formats", default=",".join(KERNEL_FORMATS))
    ap.add_argument("--shapes", default="64x2048,64x8192,1x32768", help="BxL,BxL,...")
    ap.add_argument("--block-n", default="64,128,256")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--splits", default="plan")
    ap.add_argument("--maxnreg", default="none")
    args = ap.parse_args()
    axes = {"block_n": _ints(args.block_n), "warps": _ints(args.warps), "stages": _ints(args.stages),
            "splits": _ints(args.splits, "plan"), "maxnreg": _ints(args.maxnreg, "none")}
    default = {"block_n": BLOCK_N, "warps": 4, "stages": NUM_STAGES, "splits": None, "maxnreg": None}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for (B, L), fmt in itertools.product(shapes, args.formats.split(",")):
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        sets = _format_sets(fmt, B, L, gen)
        timed = []
        for values in itertools.product(*axes.values()):
            launch = dict(zip(axes, values))
            try:
                us = graph_time_us([lambda s=s: paged_decode_quant_triton(
                    s["q"], s["pool"], s["tables"], lens, L, D ** -0.5, block_n=launch["block_n"],
                    num_warps=launch["warps"], num_stages=launch["stages"], splits=launch["splits"],
                    maxnreg=launch["maxnreg"]) for s in sets], reps=50)
            except Exception as e:  # noqa: BLE001 - a launch that does not fit (shared memory) is a result too
                us = float("nan")
                print(f"{fmt} B={B} L={L} {launch}: {type(e).__name__}", flush=True)
            timed.append(dict(B=B, L=L, fmt=fmt, **launch, us=us))
        ok = [t for t in timed if t["us"] == t["us"]]
        best = min(ok, key=lambda t: t["us"])
        base = next((t for t in timed if all(t[k] == v for k, v in default.items())), None)
        base_text = f"default {base['us']:7.1f} us, " if base else ""
        print(f"B={B:>3} L={L:>6} {fmt:>5}: {base_text}best {best['us']:7.1f} "
              f"({', '.join(f'{k} {best[k]}' for k in axes)})", flush=True)
        rows += timed
        del sets
        torch.cuda.empty_cache()
    write_results_and_out(args.out or default_results_path("kv_quant_decode_sweep"), {"device": torch.cuda.get_device_name(), "axes": {k: list(v) for k, v in axes.items()},
                                     "rows": rows})


if __name__ == "__main__":
    main()
