"""CPU projections of this model: torch's F.linear vs MKL's packed GEMM, per batch size.

Packed GEMM (the weight reordered once for a given number of rows) is what torch.compile's CPU
freezing uses; the question is whether the engine's CPU path would gain from it, and whether it
keeps results bit-identical (greedy exactness against Hugging Face). Prints a table, writes JSON.

    OMP_NUM_THREADS=2 python bench/cpu_linear.py --threads 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def _time(fn, n: int) -> float:
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="bench/results/cpu_linear.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    print(f"{'rows':>4} {'weight':<8} {'F.linear us':>12} {'packed us':>10} {'bit-identical':>14}")
    for m in args.rows:
        for name, (n, k) in SHAPES.items():
            w, x = torch.randn(n, k), torch.randn(m, k)
            plain = _time(lambda: F.linear(x, w), args.iters)
            packed_w = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            packed = _time(lambda: torch.ops.mkl._mkl_linear(x, packed_w, w, None, m), args.iters)
            same = torch.equal(torch.ops.mkl._mkl_linear(x, packed_w, w, None, m), F.linear(x, w))
            rows.append(dict(rows=m, weight=name, linear_us=plain * 1e6, packed_us=packed * 1e6, bit_identical=same))
            print(f"{m:>4} {name:<8} {plain * 1e6:>12.1f} {packed * 1e6:>10.1f} {str(same):>14}")
    write_results(args.out, dict(threads=args.threads, torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
