"""CPU projections of this model: MKL's sgemm (`F.linear`) against oneDNN's inner product, per batch size.

The engine's CPU path runs its projections through oneDNN on weights packed once
(kernels/cpu_linear.py); this measures why. Each shape cycles through as many distinct weights as
the model has layers (30; 3 for the 113 MB LM head), so weights stream from memory as they do in a
forward pass instead of sitting in cache. Columns: `F.linear` (MKL), oneDNN on the plain weight,
oneDNN on the packed weight, and the largest difference of the packed result from `F.linear`
(the sums run in another order). Prints a table and writes JSON.

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
from kernels.cpu_linear import ONEDNN_LINEAR, cpu_linear, pack_linear_weight  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def _time(fn, x: torch.Tensor, weights: list[torch.Tensor], reps: int) -> float:
    """Best of `reps` passes over every weight, per call."""
    fn(x, weights[0])
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in weights:
            fn(x, w)
        best = min(best, (time.perf_counter() - t0) / len(weights))
    return best


def onednn_plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/cpu_linear.json")
    args = ap.parse_args()
    if not ONEDNN_LINEAR:
        sys.exit("this torch has no oneDNN linear; the engine falls back to F.linear")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    print(f"{'rows':>4} {'weight':<8} {'F.linear us':>12} {'oneDNN us':>10} {'packed us':>10} {'max diff':>9}")
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k) for _ in range(3 if name == "lm_head" else 30)]
        packed = [pack_linear_weight(w) for w in weights]
        for m in args.rows:
            if name == "lm_head" and m > 64:
                continue  # the LM head only sees the rows that sample
            x = torch.randn(m, k)
            mkl = _time(F.linear, x, weights, args.reps)
            plain = _time(onednn_plain, x, weights, args.reps)
            fast = _time(cpu_linear, x, packed, args.reps)
            diff = float((cpu_linear(x, packed[0]) - F.linear(x, weights[0])).abs().max())
            rows.append(dict(rows=m, weight=name, linear_us=mkl * 1e6, onednn_us=plain * 1e6,
                             onednn_packed_us=fast * 1e6, max_abs_diff=diff))
            print(f"{m:>4} {name:<8} {mkl * 1e6:>12.1f} {plain * 1e6:>10.1f} {fast * 1e6:>10.1f} {diff:>9.1e}")
    write_results(args.out, dict(threads=args.threads, torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
