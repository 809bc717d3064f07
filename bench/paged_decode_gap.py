"""Where paged decode stands against SDPA on a contiguous cache: page size, SM balance, fixed cost per call.

Three questions about the last few per cent of `bench/kernels.py`'s B = 64 decode (bench/NOTES_kernels.md
"v15"), each timed with the launcher's defaults on `bench/kernels.py` inputs (head-major pools,
rotating input sets bigger than L2, graph-replayed), SDPA on a contiguous cache in the same run:

1. `pages`: is it the paging? B = 64, the same contexts in shuffled pages of 16 (the engine's),
   32, 64 and 128 tokens, and in 16-token pages laid out in order (one contiguous stream per
   sequence and head, as SDPA reads).
2. `balance`: is it how the programs fall on the SMs? At B = 64 the 192 (sequence, KV head) pairs
   are 1.45 per SM on 132 SMs; B = 44, 88 and 132 make 1, 2 and 3 per SM exactly. Each batch runs
   the default launch, one split (one program per pair, as SDPA's cuDNN kernel) and two splits.
3. `fixed`: is it a fixed cost per call or a slower stream? B = 64 at 256 to 4,096 tokens, and a
   least-squares line through each kernel's times: the intercept is what a call costs before its
   bytes (launch, the first dependent reads, the tail), the slope the rate it streams at.

Every output is checked against the torch reference. Prints tables and writes JSON.

    python3 bench/paged_decode_gap.py --out bench/results/paged_decode_gap_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (HKV, HQ, SCALE, bench_graph, clocks_up, copy_bandwidth, decode_kv_bytes,  # noqa: E402
                           make_decode_set, rel, rotating_sets)
from bench.paged_decode_sweep import sdpa_ms  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

B = 64  # the batch bench/kernels.py compares at (the balance part takes its own)
# (name, page size, pages in order)
LAYOUTS = [("16 shuffled", 16, False), ("16 in order", 16, True), ("32 shuffled", 32, False),
           ("64 shuffled", 64, False), ("128 shuffled", 128, False)]
# Launch variants of the balance part: keyword arguments of paged_attention_triton.
ONE_SPLIT = dict(programs_per_sm=1, single_pass_len=1 << 30)


def two_splits(batch: int, length: int) -> dict:
    """The launcher's knobs that give exactly two splits at this batch and length, as its own plan says."""
    for per_sm in range(1, 64):
        kw = dict(programs_per_sm=per_sm, single_pass_len=0)
        if pa.plan(batch, HQ, HKV, 1, length, torch.device("cuda", 0), **kw)["splits"] == 2:
            return kw
    raise ValueError(f"no programs-per-SM value gives two splits at B = {batch}, L = {length}")


def timed_us(batch: int, length: int, sets: list[dict], **kw) -> float:
    """Checked against the reference on the first set, then graph-timed over all of them."""
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    s0 = sets[0]
    ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], lens, qsl, 1,
                              length, SCALE)
    out = pa.paged_attention_triton(s0["q"], s0["kc"], s0["vc"], s0["tables"], lens, qsl, 1, length, SCALE, **kw)
    err = rel(out, ref)
    assert err < 1e-2, (batch, length, kw, err)
    return 1e3 * bench_graph([lambda s=s: pa.paged_attention_triton(
        s["q"], s["kc"], s["vc"], s["tables"], lens, qsl, 1, length, SCALE, **kw) for s in sets])


def pages_part(lengths: list[int], gen: torch.Generator) -> list[dict]:
    rows = []
    print("\n| L | SDPA us | " + " | ".join(f"{name} pages" for name, _, _ in LAYOUTS) + " |")
    print("|---" * (2 + len(LAYOUTS)) + "|")
    for length in lengths:
        n_sets = rotating_sets(decode_kv_bytes(B, length))
        row = {"L": length, "sdpa_us": 1e3 * sdpa_ms(B, length, n_sets, gen), "us": {}}
        for name, page, in_order in LAYOUTS:
            sets = [make_decode_set(B, length, gen, in_order, page) for _ in range(n_sets)]
            row["us"][name] = timed_us(B, length, sets)
            del sets
            torch.cuda.empty_cache()
        rows.append(row)
        cells = " | ".join(f"{us:.2f} ({row['sdpa_us'] / us:.3f}x)" for us in row["us"].values())
        print(f"| {length} | {row['sdpa_us']:.2f} | {cells} |", flush=True)
    return rows


def balance_part(lengths: list[int], batches: list[int], gen: torch.Generator) -> list[dict]:
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("\n| L | B | pairs per SM | SDPA us (TB/s) | default (splits) | one split | two splits |")
    print("|---|---|---|---|---|---|---|")
    for length in lengths:
        for batch in batches:
            n_sets = rotating_sets(decode_kv_bytes(batch, length))
            sets = [make_decode_set(batch, length, gen) for _ in range(n_sets)]
            variants = {"default": {}, "one split": ONE_SPLIT, "two splits": two_splits(batch, length)}
            row = {"L": length, "B": batch, "pairs_per_sm": batch * HKV / sms,
                   "sdpa_us": 1e3 * sdpa_ms(batch, length, n_sets, gen), "us": {}, "splits": {}}
            for name, kw in variants.items():
                row["us"][name] = timed_us(batch, length, sets, **kw)
                row["splits"][name] = pa.plan(batch, HQ, HKV, 1, length, torch.device("cuda"),
                                              kw.get("programs_per_sm"), single_pass_len=kw.get("single_pass_len"))["splits"]
            del sets
            torch.cuda.empty_cache()
            rows.append(row)
            tbps = decode_kv_bytes(batch, length) / row["sdpa_us"] / 1e6
            cells = " | ".join(f"{us:.2f} ({row['sdpa_us'] / us:.3f}x)" for us in row["us"].values())
            print(f"| {length} | {batch} | {row['pairs_per_sm']:.2f} | {row['sdpa_us']:.2f} ({tbps:.2f}) | {cells} "
                  f"[{row['splits']['default']}] |", flush=True)
    return rows


def fixed_part(lengths: list[int], gen: torch.Generator) -> dict:
    rows = []
    print("\n| L | MB | SDPA us | paged us | x SDPA |")
    print("|---|---|---|---|---|")
    for length in lengths:
        kv_bytes = decode_kv_bytes(B, length)
        n_sets = rotating_sets(kv_bytes)
        sets = [make_decode_set(B, length, gen) for _ in range(n_sets)]
        row = {"L": length, "MB": kv_bytes / 1e6, "sdpa_us": 1e3 * sdpa_ms(B, length, n_sets, gen),
               "paged_us": timed_us(B, length, sets)}
        del sets
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"| {length} | {row['MB']:.1f} | {row['sdpa_us']:.2f} | {row['paged_us']:.2f} | "
              f"{row['sdpa_us'] / row['paged_us']:.3f} |", flush=True)
    mb = torch.tensor([r["MB"] for r in rows], dtype=torch.float64)
    design = torch.stack([torch.ones_like(mb), mb], 1)
    fits = {}
    for key in ("sdpa_us", "paged_us"):
        us = torch.tensor([r[key] for r in rows], dtype=torch.float64)
        intercept, slope = torch.linalg.lstsq(design, us[:, None]).solution[:, 0].tolist()
        fits[key[:-3]] = {"intercept_us": intercept, "us_per_MB": slope, "TBps": 1.0 / slope}
        print(f"{key[:-3]}: {intercept:.2f} us + {slope:.4f} us/MB ({1.0 / slope:.2f} TB/s)")
    return {"rows": rows, "fits": fits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="pages,balance,fixed")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="pages part")
    ap.add_argument("--balance-lengths", default="2048,8192")
    ap.add_argument("--batches", default="44,64,88,132", help="balance part")
    ap.add_argument("--fixed-lengths", default="256,512,768,1024,1536,2048,3072,4096")
    ap.add_argument("--out", default="bench/results/paged_decode_gap_h200.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    result: dict = {"device": torch.cuda.get_device_name(0), "copy_TBps": copy_bandwidth()["TBps"]}
    parts = args.parts.split(",")
    if "pages" in parts:
        result["pages"] = pages_part([int(x) for x in args.lengths.split(",")], gen)
    if "balance" in parts:
        result["balance"] = balance_part([int(x) for x in args.balance_lengths.split(",")],
                                         [int(x) for x in args.batches.split(",")], gen)
    if "fixed" in parts:
        result["fixed"] = fixed_part([int(x) for x in args.fixed_lengths.split(",")], gen)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
