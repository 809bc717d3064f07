"""Paged decode with the launcher's v14 decode switches on and off, at many batch sizes and lengths.

The switches (kernels/paged_attention_triton.py, bench/NOTES_kernels.md "v14"): the partial kernel's
DECODE variant (`lean`), page ids read one tile ahead (`next_pages`), no split for short contexts
(`single_pass_len`), the split merge inside the partial kernel for two splits (`fused_reduce`), and
(v18) splits that take every S-th tile instead of a contiguous range (`interleave`).
Each case times the launcher's defaults, the v13 settings (all four off) and each switch off alone,
on the same inputs (`bench/kernels.py` pools: shuffled 16-token head-major pages, rotating input
sets bigger than L2, graph-replayed). Uniform cases also time SDPA on a contiguous cache; ragged
cases are the engine's decode graphs (contexts shorter than the bucket the plan is made for).
Every output is checked against the torch reference. Prints a table and writes JSON.

    python3 bench/paged_decode_switches.py --out bench/results/paged_decode_switches_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (HKV, HQ, SCALE, bench_graph, clocks_up, decode_kv_bytes, make_decode_set, rel,  # noqa: E402
                           rotating_sets)
from bench.paged_decode_sweep import sdpa_ms  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

# (batch, shortest context, longest context, plan bucket): uniform when shortest == longest == bucket
UNIFORM = [(64, n, n, n) for n in (1024, 2048, 4096, 8192, 16384)] + [
    (56, 1024, 1024, 1024), (56, 2048, 2048, 2048), (48, 1024, 1024, 1024), (48, 2048, 2048, 2048),
    (80, 1024, 1024, 1024), (80, 4096, 4096, 4096), (32, 1024, 1024, 1024), (32, 4096, 4096, 4096),
    (16, 1024, 1024, 1024), (16, 4096, 4096, 4096), (8, 4096, 4096, 4096), (1, 1024, 1024, 1024),
    (1, 8192, 8192, 8192)]
RAGGED = [(256, 16, 400, 2048), (128, 16, 400, 2048), (64, 16, 400, 2048), (32, 16, 400, 2048),
          (8, 16, 400, 2048), (1, 16, 400, 2048), (64, 1500, 2048, 2048), (256, 800, 2000, 2048)]
V13 = dict(lean=False, next_pages=False, single_pass_len=0, fused_reduce=False, interleave=False)
VARIANTS = {"default": {}, "v13": V13, "no_lean": dict(lean=False), "no_next": dict(next_pages=False),
            "no_single_pass": dict(single_pass_len=0), "no_fused": dict(fused_reduce=False),
            "no_interleave": dict(interleave=False)}


def measure(batch: int, lo: int, hi: int, bucket: int, gen: torch.Generator) -> dict:
    uniform = lo == hi == bucket
    n_sets = rotating_sets(decode_kv_bytes(batch, bucket))
    sets = [make_decode_set(batch, bucket, gen) for _ in range(n_sets)]
    lens = torch.randint(lo, hi + 1, (batch,), generator=gen, device="cuda").to(torch.int32)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    s0 = sets[0]
    ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], lens, qsl, 1,
                              bucket, SCALE)
    plan = pa.plan(batch, HQ, HKV, 1, bucket, torch.device("cuda"))
    row: dict = {"B": batch, "contexts": [lo, hi], "bucket": bucket, "splits": plan["splits"], "us": {}, "rel_err": {}}
    for name, kw in VARIANTS.items():
        out = pa.paged_attention_triton(s0["q"], s0["kc"], s0["vc"], s0["tables"], lens, qsl, 1, bucket, SCALE, **kw)
        row["rel_err"][name] = rel(out, ref)
        assert row["rel_err"][name] < 1e-2, (batch, lo, hi, name, row["rel_err"][name])
        row["us"][name] = 1e3 * bench_graph([lambda s=s, kw=kw: pa.paged_attention_triton(
            s["q"], s["kc"], s["vc"], s["tables"], lens, qsl, 1, bucket, SCALE, **kw) for s in sets])
    del sets, ref
    torch.cuda.empty_cache()
    if uniform:
        row["us"]["sdpa"] = 1e3 * sdpa_ms(batch, bucket, n_sets, gen)  # its faster path, as the sweep compares
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/paged_decode_switches_h200.json")
    ap.add_argument("--batches", default="", help="only cases of these batch sizes (comma-separated; all by default)")
    args = ap.parse_args()
    only = {int(b) for b in args.batches.split(",") if b}
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()  # as the other decode benches do, so the first case is not timed at idle clocks
    names = list(VARIANTS) + ["sdpa"]
    print(f"{'B':>4} {'contexts':>11} {'bucket':>6} {'splits':>6} " + " ".join(f"{n:>14}" for n in names)
          + "   default/sdpa")
    rows = []
    for case in UNIFORM + RAGGED:
        if only and case[0] not in only:
            continue
        row = measure(*case, gen)
        rows.append(row)
        us = row["us"]
        ratio = f"{us['sdpa'] / us['default']:.3f}" if "sdpa" in us else "-"
        print(f"{row['B']:>4} {row['contexts'][0]:>5}-{row['contexts'][1]:<5} {row['bucket']:>6} {row['splits']:>6} "
              + " ".join(f"{us[n]:>14.2f}" if n in us else f"{'-':>14}" for n in names) + f"   {ratio}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
