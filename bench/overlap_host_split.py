"""Where the host's time goes in an overlapped 256-request run, section by section.

`bench/step_profile.py` gives cProfile's view, which inflates Python-heavy code and hides time spent
inside C calls of a caller. This script instead wraps the engine's host sections with wall-clock
timers (about a microsecond a call) and runs `bench/throughput.py`'s workload on the overlapped
engine: one untimed pass, then `--passes` timed ones. It reports, per pass, how many milliseconds
each section took in all, and how long the host waited for the GPU (the decode pipeline's event
waits and the synchronous steps' synchronise): a host-bound run waits little.

    python3 bench/overlap_host_split.py --device cuda --weights random --num-requests 256
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402
from bench.throughput import add_engine_options, bench_engine, cuda_workload, run_workload  # noqa: E402


class SectionTimer:
    """Accumulates wall time per section name; `wrap` times every call of a bound method or function."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(engine, timer: SectionTimer) -> None:
    """Wrap the host sections of one engine (instance attributes, so other engines are untouched)."""
    import engine.engine as engine_module

    pipe = engine.overlap
    runner = engine.graph_runner
    engine.scheduler.schedule = timer.wrap("schedule", engine.scheduler.schedule)
    engine._run_step = timer.wrap("sync step (prefill): all", engine._run_step)
    engine._record = timer.wrap("record", engine._record)
    engine._sample_into = timer.wrap("sample_into (per row)", engine._sample_into)
    engine.model.forward = timer.wrap("model.forward (eager / piecewise launches)", engine.model.forward)
    if pipe is not None:
        pipe._launch = timer.wrap("decode launch: all", pipe._launch)
        pipe._collect = timer.wrap("decode collect: all", pipe._collect)
    if runner is not None:
        runner.replay_rows = timer.wrap("decode launch: replay_rows", runner.replay_rows)
        runner._replay = timer.wrap("decode launch: graph replay call", runner._replay)
    engine_module.build_forward_batch = timer.wrap("sync step: build_forward_batch", engine_module.build_forward_batch)
    kernels = engine.model.kernels
    kernels.prefill_attention = timer.wrap("attention launch: prefill (FA2)", kernels.prefill_attention)
    kernels.paged_attention = timer.wrap("attention launch: paged", kernels.paged_attention)
    if engine.model.piecewise is not None:
        engine.model.piecewise.hidden_states = timer.wrap("prefill: piecewise pass (all launches)",
                                                          engine.model.piecewise.hidden_states)
    graph_replay = torch.cuda.CUDAGraph.replay
    torch.cuda.CUDAGraph.replay = timer.wrap("CUDAGraph.replay calls (decode + prefill pieces)", graph_replay)
    # Host waits for the GPU: the pipeline's event waits and the synchronous steps' synchronise.
    event_sync = torch.cuda.Event.synchronize
    device_sync = torch.cuda.synchronize

    def waiting_event(self):
        t0 = time.perf_counter()
        event_sync(self)
        timer.seconds["wait for GPU (events)"] += time.perf_counter() - t0
        timer.calls["wait for GPU (events)"] += 1

    torch.cuda.Event.synchronize = waiting_event
    engine_module.torch.cuda.synchronize = timer.wrap("wait for GPU (synchronize)", device_sync)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_options(ap, device="cuda", weights="random", num_requests=256)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--no-overlap", dest="overlap", action="store_false")
    ap.add_argument("--out", default="bench/results/overlap_host_split.json")
    args = ap.parse_args()
    weights, reqs = cuda_workload(args, "overlapped decode and its CUDA graphs")
    engine = bench_engine(weights, reqs, args, cuda_graphs=True, overlap=args.overlap)
    run_workload(engine, reqs)  # untimed: every shape compiled and captured
    timer = SectionTimer()
    instrument(engine, timer)
    passes = []
    for _ in range(args.passes):
        timer.reset()
        secs, steps = run_workload(engine, reqs)
        passes.append(dict(seconds=secs, steps=steps, sections_ms={k: 1e3 * v for k, v in timer.seconds.items()},
                           calls=dict(timer.calls)))
    names = list(passes[0]["sections_ms"])
    print(f"overlap={args.overlap}, {len(reqs)} requests; passes: "
          + ", ".join(f"{1e3 * p['seconds']:.1f} ms ({p['steps']} steps)" for p in passes))
    print(f"{'section':<46} {'calls':>7} " + " ".join(f"{'pass ' + str(i + 1):>9}" for i in range(len(passes))))
    for name in sorted(names, key=lambda n: -passes[0]["sections_ms"][n]):
        print(f"{name:<46} {passes[0]['calls'][name]:>7} "
              + " ".join(f"{p['sections_ms'].get(name, 0.0):>9.1f}" for p in passes))
    med = statistics.median(p["seconds"] for p in passes)
    print(f"median pass {1e3 * med:.1f} ms")
    write_results(args.out, dict(device=args.device, torch=torch.__version__, overlap=args.overlap,
                                 requests=len(reqs), passes=passes))


if __name__ == "__main__":
    main()
