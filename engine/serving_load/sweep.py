"""Several configurations, each serving the same workload at several request rates.

Runs go rate by rate, and within a rate configuration by configuration, so slow drift in the machine's
speed (another process, a warming CPU) falls on every configuration alike rather than on the last one.
Each configuration keeps one engine for all its runs. Warm-up runs come first and are thrown away: first
calls pay for allocation, and on a GPU for Triton compilation and CUDA graph capture.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from engine.serving_load.runner import LoadConfig, LoadRun, new_engine, run_load
from engine.serving_load.slo import SLO, goodput_rate
from engine.serving_load.workload import WorkloadSpec, make_requests
from engine.weights import LoadedWeights

MAX_RATES = 6
MAX_CONFIGS = 4


@dataclass(frozen=True, slots=True)
class SweepResult:
    workload: WorkloadSpec
    rates: tuple[float, ...]
    configs: tuple[LoadConfig, ...]
    runs: tuple[LoadRun, ...]
    backend: str
    seconds: float  # wall time of the whole sweep, warm-up included

    def run(self, label: str, rate: float) -> LoadRun:
        for r in self.runs:
            if r.config.label == label and math.isclose(r.rate, rate):
                return r
        raise KeyError((label, rate))

    def curve(self, label: str, slo: SLO) -> list[tuple[float, float]]:
        """(rate, attainment) for one configuration, by rate."""
        return [(rate, self.run(label, rate).attainment(slo)) for rate in self.rates]

    def goodput(self, label: str, slo: SLO) -> float | None:
        return goodput_rate(self.curve(label, slo), slo.goal)

    def leaders(self, slo: SLO) -> tuple[str, ...]:
        """The configurations with the highest goodput (ties broken by attainment summed over the rates), in
        the sweep's order: several when they tie on both, none when every configuration misses the goal at the
        lowest tested rate. Never a name's alphabetical order: that once crowned "batch cap 8" over an identical
        "batch cap 2"."""
        scored = {c.label: (self.goodput(c.label, slo), sum(a for _, a in self.curve(c.label, slo)))
                  for c in self.configs}
        scored = {label: s for label, s in scored.items() if s[0] is not None}
        if not scored:
            return ()
        top = max(scored.values())
        return tuple(label for label, s in scored.items() if s[0] == top[0] and math.isclose(s[1], top[1]))


def check_sweep(configs: Sequence[LoadConfig], rates: Sequence[float]) -> tuple[float, ...]:
    if not configs:
        raise ValueError("add at least one configuration")
    if len(configs) > MAX_CONFIGS:
        raise ValueError(f"at most {MAX_CONFIGS} configurations at once, got {len(configs)}")
    labels = [c.label for c in configs]
    if len(set(labels)) != len(labels):
        raise ValueError("configuration names must be different from each other")
    clean = sorted({float(r) for r in rates})
    if not clean:
        raise ValueError("give at least one request rate")
    if len(clean) > MAX_RATES:
        raise ValueError(f"at most {MAX_RATES} request rates at once, got {len(clean)}")
    bad = [r for r in clean if not (math.isfinite(r) and 0 < r <= 1000)]
    if bad:
        raise ValueError(f"request rates must be in (0, 1000] requests per second, got {bad[0]}")
    return tuple(clean)


def run_sweep(weights: LoadedWeights, server: Mapping[str, str], configs: Sequence[LoadConfig],
              workload: WorkloadSpec, rates: Sequence[float],
              progress: Callable[[float, str], None] | None = None) -> SweepResult:
    """Every configuration at every rate (validated first, so a bad setting costs no compute)."""
    t0 = time.perf_counter()
    clean = check_sweep(configs, rates)
    traces = {rate: make_requests(workload, rate) for rate in clean}
    for c in configs:
        c.check_fits(traces[clean[0]])
    # One engine per configuration for every rate: on a GPU its CUDA graphs are captured once, in the warm-up,
    # not inside the runs that are measured. Every rate's trace has the same lengths, so one pool fits all.
    engines = {c.label: new_engine(weights, server, c, traces[clean[0]]) for c in configs}
    if server.get("device", "cpu").startswith("cuda"):
        warm = [(c, traces[clean[-1]]) for c in configs]  # the busiest rate meets the most batch sizes
    else:  # no graphs to capture: one short run pays for first-call allocations
        warm = [(configs[0], make_requests(workload.with_requests(min(2, workload.num_requests)), clean[-1]))]
    total = len(warm) + len(configs) * len(clean)
    done = 0
    for c, trace in warm:
        if progress is not None:
            progress(done / total, f"warming up {c.label}")
        run_load(weights, server, c, trace, clean[-1], engine=engines[c.label])
        done += 1
    runs: list[LoadRun] = []
    for rate in clean:
        for c in configs:
            if progress is not None:
                progress(done / total, f"{c.label} at {rate:g} requests/s")
            runs.append(run_load(weights, server, c, traces[rate], rate, engine=engines[c.label]))
            done += 1
    if progress is not None:
        progress(1.0, "done")
    backend = runs[0].backend if runs else ""
    return SweepResult(workload, clean, tuple(configs), tuple(runs), backend, time.perf_counter() - t0)
