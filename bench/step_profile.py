"""Where the wall time of a throughput run goes, step by step: GPU (forward, synchronised) vs host.

Runs `bench/throughput.py`'s mixed workload on a warmed engine (the second pass is the one
measured, as there), then splits every step's wall time into the forward pass (launch to
synchronise) and the rest (scheduling, batch building, sampling, records), grouped by step kind:
graph-replayed decode steps and eager steps with prefill tokens. On CUDA it runs twice: plain, and
with overlapped decode (there a step's "fwd" is its GPU time from CUDA events, and the host work
largely runs at the same time, so wall < fwd + host). A cProfile of a third pass lists
the host functions that cost most. Prints tables and writes JSON.

    python3 bench/step_profile.py --device cuda --weights random --num-requests 256
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402

from bench.throughput import add_engine_options, apply_device_defaults, bench_engine, run_workload  # noqa: E402
from bench.workload import BenchRequest, mixed_requests  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def step_kind(record) -> str:
    if any(s.phase == "prefill" for s in record.batch):
        return "with prefill (eager)"
    return "decode only"


def profile_workload(weights, reqs: list[BenchRequest], args, cuda_graphs: bool, overlap: bool = False) -> dict:
    engine = bench_engine(weights, reqs, args, cuda_graphs, overlap=overlap)
    run_workload(engine, reqs)  # warm-up pass
    groups: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    first: list[dict] = []

    def on_step(r) -> None:
        groups[step_kind(r)].append((r.wall_seconds, r.forward_seconds, sum(s.num_tokens for s in r.batch)))
        if len(first) < args.first_steps:
            first.append(dict(step=r.step, kind=step_kind(r), tokens=sum(s.num_tokens for s in r.batch),
                              wall_ms=round(1e3 * r.wall_seconds, 3), forward_ms=round(1e3 * r.forward_seconds, 3)))

    gc_seconds = [0.0]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:  # time spent in Python's cyclic garbage collector
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_seconds[0] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    secs, steps = run_workload(engine, reqs, on_step)
    gc.callbacks.remove(on_gc)
    table = {}
    for kind, rows in groups.items():
        n = len(rows)
        wall = sum(r[0] for r in rows)
        fwd = sum(r[1] for r in rows)
        table[kind] = dict(steps=n, wall_ms=1e3 * wall / n, forward_ms=1e3 * fwd / n, host_ms=1e3 * (wall - fwd) / n,
                           tokens_per_step=sum(r[2] for r in rows) / n, total_s=wall)
    prof = cProfile.Profile()
    prof.enable()
    run_workload(engine, reqs)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
    kernels = ""
    if args.kernels and torch.cuda.is_available():
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            run_workload(engine, reqs)
        kernels = p.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.top)
    useful = sum(r.max_tokens for r in reqs)
    return dict(requests=len(reqs), cuda_graphs=cuda_graphs, overlap=overlap, gc_seconds=gc_seconds[0],
                first_steps=first, seconds=secs, steps=steps, tok_per_s=useful / secs,
                by_kind=table, cprofile_top=text.getvalue(), kernels_top=kernels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_options(ap, device="cuda", weights="random", num_requests=256)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kernels", action="store_true", help="also a torch.profiler pass: GPU time per kernel")
    ap.add_argument("--skip-batch1", action="store_true")
    ap.add_argument("--first-steps", type=int, default=8, help="steps listed one by one")
    ap.add_argument("--out", default="bench/results/step_profile.json")
    args = ap.parse_args()
    cuda = apply_device_defaults(args)
    weights = load_weights(args.weights)
    reqs = mixed_requests(args.num_requests)
    one = [BenchRequest(reqs[0].prompt_ids[:32], args.batch1_tokens)]
    results = []
    for overlap in ([False, True] if cuda else [False]):
        if not args.skip_batch1:
            results.append(profile_workload(weights, one, args, cuda, overlap))
        results.append(profile_workload(weights, reqs, args, cuda, overlap))
    for res in results:
        print(f"\n{res['requests']} request(s), graphs={res['cuda_graphs']}, overlap={res['overlap']}: "
              f"{res['tok_per_s']:.0f} tok/s, "
              f"{res['steps']} steps in {res['seconds']:.3f} s")
        print(f"{'step kind':<22} {'steps':>6} {'tokens':>8} {'wall ms':>8} {'fwd ms':>8} {'host ms':>8} {'total s':>8}")
        print(f"garbage collector: {1e3 * res['gc_seconds']:.1f} ms; first steps:")
        for f in res["first_steps"]:
            print(f"  step {f['step']:>3} {f['kind']:<22} {f['tokens']:>6} tokens  wall {f['wall_ms']:>8.3f} ms  "
                  f"fwd {f['forward_ms']:>8.3f} ms")
        for kind, t in res["by_kind"].items():
            print(f"{kind:<22} {t['steps']:>6} {t['tokens_per_step']:>8.0f} {t['wall_ms']:>8.3f} {t['forward_ms']:>8.3f} "
                  f"{t['host_ms']:>8.3f} {t['total_s']:>8.3f}")
        print(res["cprofile_top"])
        print(res["kernels_top"])
    write_results(args.out, dict(device=args.device, torch=torch.__version__, results=results))


if __name__ == "__main__":
    main()
