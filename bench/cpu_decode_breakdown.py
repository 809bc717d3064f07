"""Where a CPU decode step goes, kernel family by kernel family (the engine's own kernel timer).

16 requests with ~280-token prompts decode together (real model, fp32); the engine's StepRecords of
ten full-batch decode steps give each family's time per step. Prints a table and writes JSON.

    OMP_NUM_THREADS=2 python bench/cpu_decode_breakdown.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402

from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=280)
    ap.add_argument("--out", default="bench/results/cpu_decode_breakdown.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(num_blocks=600, max_num_seqs=args.requests, max_num_batched_tokens=512,
                                    max_model_len=1024, profile_kernels=True), load_weights("real"))
    for i in range(args.requests):
        engine.add_request(list(range(1000 + i, 1000 + i + args.prompt_len)), SamplingParams(max_tokens=40, ignore_eos=True))
    records = []
    while engine.has_work():
        records.append(engine.step())
    full = [r for r in records if len(r.batch) == args.requests and all(s.phase == "decode" for s in r.batch)][5:15]
    per_step: dict[str, float] = {}
    for r in full:
        for k in r.kernels:
            per_step[k.name] = per_step.get(k.name, 0.0) + k.seconds / len(full)
    wall = sum(r.wall_seconds for r in full) / len(full)
    print(f"{len(full)} decode steps of {args.requests} rows, ~{args.prompt_len + 20} tokens of context: "
          f"{wall * 1e3:.1f} ms a step")
    for name, secs in sorted(per_step.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22} {secs * 1e3:8.2f} ms")
    write_results(args.out, dict(threads=args.threads, requests=args.requests, step_ms=wall * 1e3,
                                   kernels_ms={k: v * 1e3 for k, v in per_step.items()}))


if __name__ == "__main__":
    main()
