"""Paged decode at the engine's shapes: ragged contexts under a graph bucket, new plan vs the v9 one.

A decode step's graph is captured for `max_model_len` (2,048), so the launch plan is made for that
bucket while the real contexts are shorter and ragged (the throughput workload: 16-400 tokens).
This times the launcher's defaults against the settings before v10 (page ids by `tl.load` per
tile, up to 16 programs per SM, 128-key tiles, 2 stages; bench/NOTES_kernels.md "v10") on the
same inputs, twice each in alternation, graph-replayed over 4 rotating input sets. Prints a table
and writes JSON.

    python3 bench/paged_decode_ragged_ab.py --out bench/results/paged_decode_short_ab_h200.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import HKV, HQ, SCALE, bench_graph, make_decode_set, rel  # noqa: E402
from bench.results_io import write_results  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

# (batch, shortest context, longest context, graph bucket)
CASES = ((256, 16, 400, 2048), (128, 16, 400, 2048), (64, 16, 400, 2048), (32, 16, 400, 2048),
         (8, 16, 400, 2048), (1, 16, 400, 2048), (256, 800, 2000, 2048), (64, 1500, 2048, 2048))
V9_DECODE = {"PAGE_LOADS": "loop", "TARGET_PROGRAMS_PER_SM": 16, "NUM_STAGES": 2, "BLOCK_N": 128}


def use_settings(values: dict[str, object]) -> None:
    """Set the decode entry of each of the launcher's per-mode tables."""
    for table, value in values.items():
        getattr(pa, table)["decode"] = value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/paged_decode_short_ab.json")
    args = ap.parse_args()
    new = {table: getattr(pa, table)["decode"] for table in V9_DECODE}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{'B':>4} {'contexts':>10} {'bucket':>6} {'v9 us':>13} {'new us':>13} {'v9 plan':>10} {'new plan':>10}")
    for batch, lo, hi, bucket in CASES:
        lens = torch.randint(lo, hi + 1, (batch,), generator=gen, device="cuda").to(torch.int32)
        # Pools sized for the bucket, as the graph's block tables are; the real lengths are shorter.
        sets = [(s["q"], s["kc"], s["vc"], s["tables"]) for s in (make_decode_set(batch, bucket, gen) for _ in range(4))]
        qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        q, kc, vc, tables = sets[0]
        ref = paged_attention_ref(q.float(), kc.float(), vc.float(), tables, lens, qsl, 1, bucket, SCALE)
        row: dict = {"B": batch, "contexts": [lo, hi], "bucket": bucket}
        for name, settings in (("v9", V9_DECODE), ("new", new), ("v9_again", V9_DECODE), ("new_again", new)):
            use_settings(settings)
            out = pa.paged_attention_triton(q, kc, vc, tables, lens, qsl, 1, bucket, SCALE)
            row[f"{name}_rel_err"] = rel(out, ref)
            row[f"{name}_us"] = 1e3 * bench_graph([lambda s=s: pa.paged_attention_triton(
                s[0], s[1], s[2], s[3], lens, qsl, 1, bucket, SCALE) for s in sets])
            row[f"{name}_plan"] = pa.plan(batch, HQ, HKV, 1, bucket, q.device)
        use_settings(new)
        plans = [f"s{row[k]['splits']}/n{row[k]['BLOCK_N']}" for k in ("v9_plan", "new_plan")]
        print(f"{batch:>4} {lo:>4}-{hi:<5} {bucket:>6} {row['v9_us']:>6.1f}/{row['v9_again_us']:<6.1f} "
              f"{row['new_us']:>6.1f}/{row['new_again_us']:<6.1f} {plans[0]:>10} {plans[1]:>10}")
        rows.append(row)
    write_results(args.out, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
