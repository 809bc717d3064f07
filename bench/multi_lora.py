"""Multi-LoRA serving vs one merged deployment per fine-tune, on the multi-LoRA page's scenarios.

Each scenario's requests (the three bundled adapters and the base model, all queued at once) are served
(1) by one engine with the adapters in device slots, every adapter's rows in the same batches, and (2) by
one plain engine per adapter on its merged weights, each serving only its requests, taking turns on the
device (`app.analysis.multi_lora.compare_deployments`, what the page's comparison runs). Reports forward
passes, engine time, throughput, mean time until a request is done, weights held, adapter loads and
evictions, and whether every request got the same tokens both ways.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/multi_lora.py          # CPU, real model, fp32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.analysis.multi_lora import BASE, compare_deployments, slot_history, summarize  # noqa: E402
from app.scenario_library import MULTI_LORA  # noqa: E402
from bench.results_io import write_results  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def tokens_by_request(run) -> list[list[int]]:  # noqa: ANN001 (a DeploymentRun)
    out: dict[str, list[int]] = {}
    for r in run.records:
        for e in r.emitted:
            out.setdefault(e.request_id, []).append(e.token_id)
    return [out.get(label, []) for label in run.labels]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="bench/results/multi_lora_cpu.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    weights = load_weights("real")
    server = {"device": "cpu", "dtype": "float32"}
    rows = []
    for scenario in MULTI_LORA:
        runs = compare_deployments(scenario, weights, server)
        (mixed,) = runs["multi-LoRA"]
        per = runs["one merged deployment per fine-tune"]
        # The same tokens both ways: each merged deployment's requests in the scenario's order.
        mixed_tokens = dict(zip(mixed.labels, tokens_by_request(mixed)))
        adapters = [r.adapter or BASE for r in scenario.requests]
        same = all(tokens_by_request(run) == [mixed_tokens[f"r{i}"] for i, a in enumerate(adapters) if a == run.name]
                   for run in per)
        events = slot_history(list(mixed.records))
        for name, group in runs.items():
            s = summarize(name, group)
            rows.append({"scenario": scenario.name, "max_loras": scenario.engine.get("max_loras"), "setup": name,
                         "forward_passes": s.forward_passes, "seconds": round(s.seconds, 3),
                         "tokens": s.output_tokens, "tok_s": round(s.tokens_per_second, 1),
                         "mean_batch": round(s.mean_batch, 2), "mean_done_s": round(s.mean_finish_s, 3),
                         "weights_mb": round(s.weights_bytes / 1e6, 1),
                         "adapter_loads": sum(e["kind"] == "load" for e in events) if name == "multi-LoRA" else None,
                         "evictions": sum(e["kind"] == "evict" for e in events) if name == "multi-LoRA" else None,
                         "same_tokens": same})
            r = rows[-1]
            print(f"{scenario.name[:44]:44s} {name[:36]:36s} {r['forward_passes']:4d} passes {r['seconds']:7.2f} s "
                  f"{r['tok_s']:6.1f} tok/s  batch {r['mean_batch']:4.1f}  done {r['mean_done_s']:6.2f} s  "
                  f"{r['weights_mb']:7.1f} MB  same tokens: {'yes' if same else 'NO'}")
    print("\n| scenario | set-up | passes | engine s | tok/s | mean batch | mean done s | weights MB | loads/evictions | same tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        le = f"{r['adapter_loads']}/{r['evictions']}" if r["adapter_loads"] is not None else "—"
        print(f"| {r['scenario']} | {r['setup']} | {r['forward_passes']} | {r['seconds']} | {r['tok_s']} | "
              f"{r['mean_batch']} | {r['mean_done_s']} | {r['weights_mb']} | {le} | {'yes' if r['same_tokens'] else 'no'} |")
    write_results(args.out, {'device': 'cpu', 'weights': 'real', 'threads': torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
