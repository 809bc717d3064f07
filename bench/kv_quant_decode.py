"""What a KV cache in fewer bits buys a decode step, when the attention kernel reads those bits (CUDA only).

    python3 bench/kv_quant_decode.py [--out bench/results/kv_quant_decode_<card>.json] [--quick]

For each batch and context length: the engine's BF16 paged decode kernel (kernels/paged_attention_triton.py),
the fused low-bit kernel (kernels/paged_decode_quant_triton.py) reading BF16, FP8, INT8 and INT4 pools of the
KV compression lab's formats, the unfused path (dequantize the INT4 pool into a BF16 copy, then the engine
kernel: what the lab's torch path does) and torch SDPA on a contiguous BF16 cache. SmolLM2's decode shape
(9 query heads, 3 KV heads of dim 64), shuffled 16-token pages in the engine's head-major layout, CUDA-graph
timed medians, input sets rotated so no call finds its pool in L2 (kernels/quant_decode_timing.py, which the KV
compression page also runs live on a GPU).
Prints a table and writes JSON (a copy in $OUT when set).
"""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.kernels import clocks_up, contiguous_sets, copy_bandwidth, sdpa_variants  # noqa: E402
from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
from kernels.quant_decode_timing import (BF16_BYTES_PER_TOKEN, QuantDecodeTimings, graph_time_us,  # noqa: E402
                                         rotating_sets, time_quant_decode)
from kernels.quant_kv_pool import KERNEL_FORMATS  # noqa: E402

SHAPES = [(64, 1024), (64, 2048), (64, 4096), (64, 8192), (64, 16384), (64, 32768), (1, 8192), (1, 32768),
          (8, 32768)]
QUICK_SHAPES = [(64, 4096), (1, 32768)]


def sdpa_us(B: int, L: int) -> tuple[float, str]:
    """Torch SDPA's fastest GQA variant on a contiguous BF16 cache [B, Hkv, L, D] (bench/kernels.py's reference)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    csets = contiguous_sets(B, L, rotating_sets(B * L * BF16_BYTES_PER_TOKEN), gen)
    times = {name: graph_time_us([lambda c=c, fn=fn: fn(c) for c in csets])
             for name, fn in sdpa_variants(B, expand=False).items()}
    best = min(times, key=times.get)
    del csets
    torch.cuda.empty_cache()
    return times[best], best


def row(t: QuantDecodeTimings, copy_tbps: float) -> dict:
    sd, variant = sdpa_us(t.batch, t.context)
    return {"B": t.batch, "L": t.context, "splits_fused": t.splits, "engine_bf16_us": t.engine_bf16_us,
            "unfused_int4_us": t.unfused_int4_us, "sdpa_us": sd, "sdpa_variant": variant,
            "formats": {f.fmt: {"bytes_per_token": f.bytes_per_token, "us": f.us, "rel_err": f.rel_err,
                                "TBps": t.bandwidth_tbps(f.fmt),
                                "pct_of_copy": 100 * t.bandwidth_tbps(f.fmt) / copy_tbps,
                                "speedup_vs_engine_bf16": t.speedup(f.fmt)} for f in t.formats}}


def print_table(rows: list[dict]) -> None:
    head = f"{'B':>3} {'L':>6} | {'engine bf16':>11} {'SDPA':>7} |" + "".join(f" {f:>14}" for f in KERNEL_FORMATS)
    print(head + f" | {'int4 unfused':>12}")
    print("-" * (len(head) + 15))
    for r in rows:
        cells = "".join(f" {r['formats'][f]['us']:7.1f} {r['formats'][f]['speedup_vs_engine_bf16']:5.2f}x"
                        for f in KERNEL_FORMATS)
        print(f"{r['B']:>3} {r['L']:>6} | {r['engine_bf16_us']:9.1f}us {r['sdpa_us']:6.1f} |{cells} | "
              f"{r['unfused_int4_us']:12.1f}")
    print("(us per call; Nx = speed-up over the engine's BF16 kernel; the fused kernel's bf16 column reads the same "
          "pool as the engine's)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/kv_quant_decode_<card>.json)")
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "CUDA only"
    clocks_up()
    copy = copy_bandwidth()
    rows = []
    for B, L in (QUICK_SHAPES if args.quick else SHAPES):
        rows.append(row(time_quant_decode(B, L), copy["TBps"]))
        r = rows[-1]
        print(f"B={B} L={L}: engine {r['engine_bf16_us']:.1f} us, " + ", ".join(
            f"{f} {r['formats'][f]['us']:.1f} (err {r['formats'][f]['rel_err']:.1e})" for f in KERNEL_FORMATS),
            flush=True)
    print_table(rows)
    write_results_and_out(args.out or default_results_path("kv_quant_decode"), {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": platform.node(),
        "copy": copy, "shape": {"Hq": 9, "Hkv": 3, "D": 64, "page": 16}, "rows": rows})


if __name__ == "__main__":
    main()
