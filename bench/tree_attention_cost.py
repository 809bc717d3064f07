"""What a draft tree's mask costs paged attention (GPU): one sequence after a cached context, its last q_len rows
causal or under a tree mask, 30 launches (a layer's worth each, distinct K/V) replayed from one CUDA graph, at the
engine's default plan and with more splits.

`python3 bench/tree_attention_cost.py` (writes bench/results/tree_attention_cost_<gpu>.json)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
from kernels.paged_attention_triton import _plan, _sm_count, paged_attention_triton  # noqa: E402
from kernels.quant_decode_timing import graph_time_us  # noqa: E402

HQ, HKV, D, PAGE, LAYERS = 9, 3, 64, 16, 30
VARIANTS = {"causal": {}, "tree": {"tree": True}, "tree, min_partition 64": {"tree": True, "min_partition": 64}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = _sm_count(torch.device("cuda"))
    name = torch.cuda.get_device_name()
    print(f"{name}: paged attention over a {args.context}-token context, us per launch (graph of {LAYERS})")
    rows = []
    for q_len in (1, 4, 16, 128):
        n = args.context + q_len
        blocks = -(-n // PAGE)
        kv = [tuple(torch.randn(blocks, HKV, PAGE, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                    .transpose(1, 2) for _ in range(2)) for _ in range(LAYERS)]  # the engine's head-major pool
        q = torch.randn(q_len, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        tables = torch.arange(blocks, device="cuda", dtype=torch.int32)[None]
        seq_lens = torch.tensor([n], device="cuda", dtype=torch.int32)
        qsl = torch.tensor([0, q_len], device="cuda", dtype=torch.int32)
        mask = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool, device="cuda"))  # a chain: same answer
        for label, v in VARIANTS.items():
            if q_len == 1 and v.get("tree"):
                continue
            kw = {"tree_masks": (mask,)} if v.get("tree") else {}
            if "min_partition" in v:
                kw["min_partition"] = v["min_partition"]
            outs = [torch.empty_like(q) for _ in kv]
            calls = [lambda kc=kc, vc=vc, o=o: paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, q_len, n,
                                                                      0.125, out=o, **kw)
                     for (kc, vc), o in zip(kv, outs)]
            us = graph_time_us(calls, reps=50)
            plan = _plan(1, HQ, HKV, q_len, n, sms, None, kw.get("min_partition"), None, None, None, False)
            print(f"q_len {q_len:4d}  {label:24s} {us:7.2f} us  ({plan['splits']} splits of {plan['partition']})",
                  flush=True)
            rows.append({"q_len": q_len, "variant": label, "us": us, "splits": plan["splits"],
                         "partition": plan["partition"]})
    out = args.out or default_results_path("tree_attention_cost", name)
    write_results_and_out(out, {"device": name, "context": args.context, "rows": rows,
                                "command": "python3 " + " ".join(sys.argv)})


if __name__ == "__main__":
    main()
