"""How much the B = 64 paged decode ratio to SDPA moves between repeats on one machine (CUDA only).

    python3 bench/paged_decode_spread.py [--lengths 1024,8192,16384,32768] [--repeats 5] [--out FILE]

Why: `bench/kernels.py` times our paged decode and SDPA once each per context length, and its ratio at 16k-32k
moved from 0.998 to 0.97 between two machine starts with no kernel change (NOTES_kernels.md v42), about as much
as the gap to "no slower than SDPA" that is left. This script sizes the spread within one process: the same
inputs as `bench/kernels.py` (shuffled 16-token head-major pages, rotating input sets bigger than L2, one CUDA
graph per side), both graphs captured once, then timed `--repeats` times in ABBA order (ours first on even
repeats, SDPA first on odd ones) so a clock drift during the run falls on both sides alike. Prints a table of
medians and ranges and writes JSON.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (SCALE, bench, clocks_up, contiguous_sets, copy_bandwidth, decode_call_bytes,  # noqa: E402
                           decode_kv_bytes, graph_of, make_decode_set, rotating_sets, sdpa_variants)
from bench.results_io import default_results_path, write_results_and_out  # noqa: E402

B = 64


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and (max - min) / median of one side's repeats."""
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "range_pct": 100 * (max(values) - min(values)) / med}


def one_length(L: int, repeats: int, gen: torch.Generator) -> dict:
    n_sets = rotating_sets(decode_kv_bytes(B, L))
    sets = [make_decode_set(B, L, gen) for _ in range(n_sets)]
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    ours = graph_of([lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, L,
                                                           SCALE) for s in sets])
    csets = contiguous_sets(B, L, n_sets, gen)
    # SDPA's fastest way to run GQA decode here, picked once (as bench/kernels.py reports the best variant).
    sdpa_graphs, errors = {}, {}
    for name, fn in sdpa_variants(B, expand=False).items():
        try:  # as in bench/kernels.py: a variant this torch cannot run is left out, not fatal
            sdpa_graphs[name] = graph_of([lambda c=c, fn=fn: fn(c) for c in csets])
        except Exception as exc:  # noqa: BLE001
            errors[name] = repr(exc)[:300]
    first_ms = {name: bench(graph.replay) for name, graph in sdpa_graphs.items()}
    variant = min(first_ms, key=first_ms.get)
    sdpa = sdpa_graphs.pop(variant)
    ours_ms: list[float] = []
    sdpa_ms: list[float] = []
    for r in range(repeats):
        order = ((ours, ours_ms), (sdpa, sdpa_ms)) if r % 2 == 0 else ((sdpa, sdpa_ms), (ours, ours_ms))
        for graph, out in order:
            out.append(bench(graph.replay) / n_sets)
    ratios = [s / o for o, s in zip(ours_ms, sdpa_ms)]
    row = {"B": B, "L": L, "rotating_sets": n_sets, "bytes": decode_call_bytes(B, L), "sdpa_variant": variant,
           "sdpa_errors": errors,
           "ours_ms": ours_ms, "sdpa_ms": sdpa_ms, "ratio": ratios,
           "ours": spread(ours_ms), "sdpa": spread(sdpa_ms), "ratio_spread": spread(ratios)}
    del ours, sdpa, sdpa_graphs, sets, csets  # free the GPU memory before the next length
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict], copy_tbps: float) -> str:
    lines = [f"Paged decode vs SDPA, B={B}, repeats in ABBA order (µs: median [min-max]); copy {copy_tbps:.2f} TB/s",
             f"{'L':>6} {'ours µs':>24} {'SDPA µs':>24} {'× SDPA (median [min-max])':>28} {'%copy':>6}"]
    for r in rows:
        o, s, q = r["ours"], r["sdpa"], r["ratio_spread"]
        pct = 100 * r["bytes"] / (o["median"] * 1e-3) / 1e12 / copy_tbps
        lines.append(f"{r['L']:>6} {o['median'] * 1e3:>8.1f} [{o['min'] * 1e3:6.1f}-{o['max'] * 1e3:6.1f}] "
                     f"{s['median'] * 1e3:>8.1f} [{s['min'] * 1e3:6.1f}-{s['max'] * 1e3:6.1f}] "
                     f"{q['median']:>14.3f} [{q['min']:.3f}-{q['max']:.3f}] {pct:>6.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,8192,16384,32768")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/paged_decode_spread_<card>.json)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "bench/paged_decode_spread.py needs CUDA"
    if args.repeats < 2:
        ap.error("--repeats must be at least 2 (a spread needs two runs)")
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    t0 = time.time()
    clocks_up(seconds=2.0)
    cp = copy_bandwidth()
    rows = [one_length(int(L), args.repeats, gen) for L in args.lengths.split(",")]
    gpu = torch.cuda.get_device_name()
    text = f"GPU {gpu}  torch {torch.__version__}\n" + table(rows, cp["TBps"])
    result = {"gpu": gpu, "torch": torch.__version__, "copy": cp, "repeats": args.repeats,
              "rows": rows, "table": text, "wall_s": time.time() - t0}
    write_results_and_out(args.out or default_results_path("paged_decode_spread"), result)
    print(text)


if __name__ == "__main__":
    main()
