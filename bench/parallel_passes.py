"""What one forward pass over K rows costs against a one-row pass (the premise of decoding in parallel, the roofline
page's last section): the engine's model times passes over 1 to 128 rows after a cached context, in a scratch pool,
and the table says how many tokens a second one sequence would get keeping 1, 4 or 16 tokens a pass.

    python3 bench/parallel_passes.py                                    # CPU, real weights, fp32
    python3 bench/parallel_passes.py --device cuda --weights random     # GPU, bf16 (random weights, same shapes)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.analysis.parallel_decoding import MEASURED_ROWS, measure_passes  # noqa: E402
from bench.results_io import write_results_and_out  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.weights import load_weights  # noqa: E402

PER_PASS = (1, 4, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--weights", default="real", choices=("real", "random"))
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="default: bench/results/parallel_passes_<device>.json")
    args = ap.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    weights = load_weights(args.weights, args.device, getattr(torch, dtype))
    engine = LLMEngine(EngineConfig(device=args.device, dtype=dtype, num_blocks=8, block_size=16,
                                    max_model_len=args.context + max(MEASURED_ROWS) + 16, profile_kernels=False),
                       weights)
    measure_passes(engine, args.context, rows=(1, 8), repeats=1)  # warm-up: first-call allocations and compiles
    passes = measure_passes(engine, args.context, repeats=args.repeats)
    one = passes[0].seconds
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    how = f"each pass {passes[0].timing.value}"
    print(f"{name}, {args.weights} weights, {dtype}, {passes[0].context}-token context, "
          f"median of {args.repeats}, {how}")
    print(f"{'rows':>5} {'pass ms':>9} {'x 1 row':>8} " + " ".join(f"{f'{r}/pass tok/s':>13}" for r in PER_PASS))
    rows = []
    for p in passes:
        tps = {r: r / p.seconds for r in PER_PASS if r <= p.rows}
        print(f"{p.rows:>5} {p.seconds * 1e3:>9.2f} {p.seconds / one:>7.2f}x "
              + " ".join(f"{tps[r]:>13,.0f}" if r in tps else f"{'':>13}" for r in PER_PASS), flush=True)
        rows.append({"rows": p.rows, "seconds": p.seconds, "vs_one_row": p.seconds / one,
                     "tokens_per_s": {str(r): v for r, v in tps.items()}})
    out = args.out or f"bench/results/parallel_passes_{args.device}.json"
    write_results_and_out(out, {"device": name, "weights": args.weights, "dtype": dtype,
                                "context": passes[0].context, "repeats": args.repeats, "timing": passes[0].timing.name,
                                "command": "python3 " + " ".join(sys.argv), "rows": rows})


if __name__ == "__main__":
    main()
