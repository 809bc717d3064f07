"""What split-KV (Flash-Decoding) buys the engine's paged decode kernel, by batch size and context (H200).

For each batch B and context L: the launcher's default plan (its split count from `plan`), the same
kernel forced to one program per (sequence, KV head) (`programs_per_sm=0`: no split, no merge), and
SDPA on a contiguous cache as a reference. Same inputs as `bench/kernels.py` (shuffled 16-token pages
in the engine's CUDA layout, rotating input sets bigger than L2, graph-replayed), so the B = 64 row
matches its decode table. The FlashAttention page shows this JSON on a machine without a GPU.

    python3 bench/split_kv.py                       # writes bench/results/split_kv_h200.json
    python3 bench/split_kv.py --batches 1 --lengths 1024,8192 --out /tmp/split.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (HKV, HQ, SCALE, bench_graph, clocks_up, decode_call_bytes, decode_kv_bytes,  # noqa: E402
                           make_decode_set, rel, rotating_sets)
from bench.paged_decode_sweep import sdpa_ms  # noqa: E402 (the faster of SDPA's two GQA decode paths)
from bench.results_io import write_results  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402


def measure(B: int, L: int, gen: torch.Generator) -> dict:
    kv_bytes = decode_kv_bytes(B, L)
    n_sets = rotating_sets(kv_bytes)
    sets = [make_decode_set(B, L, gen) for _ in range(n_sets)]
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")

    def calls(**kw):  # noqa: ANN003, ANN202
        return [lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, L, SCALE, **kw)
                for s in sets]

    s0 = sets[0]
    ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], sl, qsl, 1, L, SCALE)
    errs = {name: rel(pa.paged_attention_triton(s0["q"], s0["kc"], s0["vc"], s0["tables"], sl, qsl, 1, L, SCALE, **kw),
                      ref)
            for name, kw in (("split", {}), ("one", {"programs_per_sm": 0}))}
    del ref
    plan = pa.plan(B, HQ, HKV, 1, L, torch.device("cuda"))
    split_ms = bench_graph(calls())
    one_ms = bench_graph(calls(programs_per_sm=0))
    del sets, s0
    torch.cuda.empty_cache()
    sdpa = sdpa_ms(B, L, n_sets, gen)
    nbytes = decode_call_bytes(B, L)
    return {"B": B, "L": L, "splits": plan["splits"], "programs": plan["splits"] * B * HKV,
            "one_split_programs": B * HKV, "split_ms": split_ms, "one_split_ms": one_ms, "sdpa_ms": sdpa,
            "split_TBps": nbytes / (split_ms * 1e-3) / 1e12, "one_split_TBps": nbytes / (one_ms * 1e-3) / 1e12,
            "speedup_from_splits": one_ms / split_ms, "rel_err": errs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--out", default="bench/results/split_kv_h200.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'B':>4} {'L':>6} {'splits':>6} {'programs':>8} {'split us':>9} {'1 split us':>10} {'gain':>6} "
          f"{'SDPA us':>8} {'TB/s':>6}")
    for B in (int(x) for x in args.batches.split(",")):
        for L in (int(x) for x in args.lengths.split(",")):
            r = measure(B, L, gen)
            rows.append(r)
            print(f"{B:>4} {L:>6} {r['splits']:>6} {r['programs']:>8} {1e3 * r['split_ms']:>9.1f} "
                  f"{1e3 * r['one_split_ms']:>10.1f} {r['speedup_from_splits']:>5.2f}x {1e3 * r['sdpa_ms']:>8.1f} "
                  f"{r['split_TBps']:>6.2f}", flush=True)
    write_results(args.out, {"device": torch.cuda.get_device_name(0), "sms": sms,
                             "command": "python3 bench/split_kv.py", "rows": rows})


if __name__ == "__main__":
    main()
