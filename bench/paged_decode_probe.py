"""Paged decode at B = 64: where the gap to the copy bandwidth is, and a mode for Nsight Compute.

Graph-timed like `bench/kernels.py` (rotating input sets bigger than L2). Compares, at one context
length, the default kernel and the all-heads variant on shuffled pages (as a long-running server's
pool looks), on sequential pages (each sequence's pages in order, as a contiguous cache), and both
again with the pool stored head-major ([block, Hkv, 16, D], exposed through strides), plus SDPA on
a contiguous cache with the query heads of a group as its query rows. Prints JSON and writes it.

With `--ncu`, runs the default kernel on the engine's CUDA layout (head-major, shuffled pages) and
SDPA both ways (`enable_gqa`, the path `bench/kernels.py` compares with, and the query heads of a
group as query rows) three times each on one input set and exits, for

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \\
        -k regex:"paged_attn|flash|fmha|attention" -c 8 python3 bench/paged_decode_probe.py --ncu

(`--programs-per-sm 1` profiles the single-pass launch instead; results/paged_decode_ncu_*_h200.txt.)

    python3 bench/paged_decode_probe.py --length 8192 --out bench/results/paged_decode_probe_h200.json
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
from bench.kernels import (DT, HKV, HQ, SCALE, D, bench_graph, clocks_up, copy_bandwidth,  # noqa: E402
                           decode_call_bytes, decode_kv_bytes, make_decode_set, rotating_sets)

B = 64


def make_set(length: int, sequential: bool, head_major: bool, gen: torch.Generator) -> dict:
    """`bench/kernels.py`'s decode inputs with the pool stored head-major (its layout since v11) or
    token-major."""
    s = make_decode_set(B, length, gen, sequential)
    for name in ("kc", "vc"):
        if head_major:  # storage [nb, Hkv, BS, D], seen as [nb, BS, Hkv, D]
            s[name] = s[name].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        else:
            s[name] = s[name].contiguous()
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--ncu", action="store_true", help="a few launches for Nsight Compute, no timing")
    ap.add_argument("--programs-per-sm", type=int, default=None,
                    help="with --ncu: the launch plan's programs per SM (1: one split at B = 64)")
    ap.add_argument("--out", default="bench/results/paged_decode_probe.json")
    args = ap.parse_args()
    length = args.length
    gen = torch.Generator(device="cuda").manual_seed(0)
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    sl = torch.full((B,), length, dtype=torch.int32, device="cuda")
    if args.ncu:
        s = make_set(length, False, True, gen)
        c = [torch.randn(B, HKV, n, D, device="cuda", dtype=DT, generator=gen) for n in (HQ // HKV, length, length)]
        for _ in range(3):
            pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, length, SCALE,
                                      programs_per_sm=args.programs_per_sm)
            F.scaled_dot_product_attention(c[0].reshape(B, HQ, 1, D), c[1], c[2], scale=SCALE, enable_gqa=True)
            F.scaled_dot_product_attention(*c, scale=SCALE)
        torch.cuda.synchronize()
        return
    clocks_up()
    copy = copy_bandwidth()["TBps"]
    kv_bytes = decode_kv_bytes(B, length)
    n_sets = rotating_sets(kv_bytes)
    nbytes = decode_call_bytes(B, length)

    def record(name: str, ms: float) -> None:
        res[f"{name}_us"] = ms * 1e3
        res[f"{name}_pct_copy"] = 100 * nbytes / (ms * 1e-3) / 1e12 / copy

    res: dict = {"copy_TBps": copy, "L": length, "B": B, "plan": pa.plan(B, HQ, HKV, 1, length, torch.device("cuda"))}
    for name, sequential, head_major in (("shuffled", False, False), ("sequential", True, False),
                                         ("shuffled_headmajor", False, True), ("sequential_headmajor", True, True)):
        sets = [make_set(length, sequential, head_major, gen) for _ in range(n_sets)]
        for kernel in (("default", "allheads") if not head_major else ("default",)):
            kw = {} if kernel == "default" else {"decode_kernel": kernel}
            record(f"{name}_{kernel}", bench_graph([
                lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, length,
                                                      SCALE, **kw) for s in sets]))
        del sets
        torch.cuda.empty_cache()
    csets = [[torch.randn(B, HKV, n, D, device="cuda", dtype=DT, generator=gen) for n in (HQ // HKV, length, length)]
             for _ in range(n_sets)]
    record("sdpa_grouped", bench_graph([lambda c=c: F.scaled_dot_product_attention(*c, scale=SCALE) for c in csets]))
    print(json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
