"""Replayed attention launches in prefill steps, on and off, in one process (CUDA only).

In a piecewise prefill step (engine/piecewise_graphs.py) layers 1.. can replay layer 0's attention
launches from a tape (kernels/launch_tape.py, `EngineConfig.replay_attention_launches`) instead of
going through the kernels' wrappers and Triton's launch path. Two runs of `bench/throughput.py`, one
with `--no-launch-replay`, cannot tell that apart: the GPU machine's host speed moves by tens of
percent between processes (and even between a process's first and second minute). So this script
builds both engines in one process, on `bench/throughput.py`'s workload, and alternates their passes
(on, off, on, off, ...), reporting per engine the median pass, the median time of its synchronous
(prefill) steps and the tokens a second. Then one request alone, a prompt of each `--prompt-lens`
length generating one token: the wall time of that prefill step (the request's time to first
token on an idle engine), alternated the same way.

    python3 bench/launch_replay_ab.py --device cuda --weights random --num-requests 256
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.overlap_host_split import SectionTimer  # noqa: E402
from bench.results_io import write_results  # noqa: E402
from bench.throughput import add_engine_options, bench_engine, cuda_workload, run_workload  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_options(ap, device="cuda", weights="random", num_requests=256)
    ap.add_argument("--rounds", type=int, default=6, help="timed passes per engine, alternated")
    ap.add_argument("--no-overlap", dest="overlap", action="store_false")
    ap.add_argument("--prompt-lens", type=lambda s: [int(x) for x in s.split(",")], default=[32, 128, 480])
    ap.add_argument("--out", default="bench/results/launch_replay_ab.json")
    args = ap.parse_args()
    weights, reqs = cuda_workload(args, "piecewise prefill graphs")
    useful = sum(r.max_tokens for r in reqs)
    engines, sync = {}, {}
    for replay in (True, False):
        args.replay_launches = replay
        engine = bench_engine(weights, reqs, args, cuda_graphs=True, overlap=args.overlap)
        run_workload(engine, reqs)  # untimed: every shape compiled and captured
        # The synchronous steps: an overlapped run's prefill steps.
        sync[replay] = SectionTimer()
        engine._run_step = sync[replay].wrap("sync", engine._run_step)
        engines[replay] = engine
    passes: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.rounds):
        for replay in (True, False):
            timer = sync[replay]
            timer.reset()
            secs, steps = run_workload(engines[replay], reqs)
            passes[replay].append(dict(seconds=secs, steps=steps, sync_seconds=timer.seconds["sync"],
                                       sync_steps=timer.calls["sync"]))
    rows = []
    for replay in (True, False):
        p = passes[replay]
        secs = statistics.median(x["seconds"] for x in p)
        rows.append(dict(replay=replay, median_pass_ms=1e3 * secs,
                         median_sync_steps_ms=1e3 * statistics.median(x["sync_seconds"] for x in p),
                         sync_steps=p[-1]["sync_steps"], steps=p[-1]["steps"], tok_per_s=useful / secs,
                         replayed_layers=engines[replay].model.piecewise.replayed_layers, passes=p))
    print(f"{torch.cuda.get_device_name()}, {len(reqs)} requests, overlap={args.overlap}, {args.rounds} alternated "
          f"passes each")
    print(f"{'attention launches in prefill steps':<40} {'pass ms':>8} {'sync steps ms':>14} {'steps':>6} {'tok/s':>9}")
    for r in rows:
        name = "layer 0's replayed (tape)" if r["replay"] else "every layer through the wrappers"
        print(f"{name:<40} {r['median_pass_ms']:>8.1f} {r['median_sync_steps_ms']:>9.1f} ({r['sync_steps']:>2}) "
              f"{r['steps']:>6} {r['tok_per_s']:>9.0f}")
    print(f"speed-up of the pass: {rows[1]['median_pass_ms'] / rows[0]['median_pass_ms']:.3f}x")
    alone = [prompt_alone(engines, n, args.rounds * 4) for n in args.prompt_lens]
    print(f"{'one prompt alone, 1 token':<26} {'replayed ms':>12} {'wrappers ms':>12} {'speed-up':>9}")
    for a in alone:
        print(f"{a['prompt_len']:>8} tokens{'':<12} {a['replayed_ms']:>12.2f} {a['wrappers_ms']:>12.2f} "
              f"{a['wrappers_ms'] / a['replayed_ms']:>8.2f}x")
    write_results(args.out, dict(device=torch.cuda.get_device_name(), torch=torch.__version__, overlap=args.overlap,
                                 requests=len(reqs), rows=rows, prompt_alone=alone))


def prompt_alone(engines: dict, n: int, rounds: int) -> dict:
    """Median wall time of the one prefill step of an n-token prompt asking for one token, per engine."""
    prompt = [10 + (7 * i) % 40000 for i in range(n)]
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds + 1):
        for replay, engine in engines.items():
            torch.cuda.synchronize()
            engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
            t0 = time.perf_counter()
            while engine.has_work():
                engine.step()
            torch.cuda.synchronize()
            if r:  # the first round captures this prompt's graph bucket
                times[replay].append(time.perf_counter() - t0)
    return dict(prompt_len=n, replayed_ms=1e3 * statistics.median(times[True]),
                wrappers_ms=1e3 * statistics.median(times[False]), rounds=rounds)


if __name__ == "__main__":
    main()
