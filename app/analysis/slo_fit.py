"""Latency targets fitted to the machine that ran a sweep: when every configuration misses the goal even at the
lowest tested rate (a busy laptop decodes slower than the page's defaults assume), the page offers targets
loosened just enough that one configuration reaches it there, so the higher rates can still tell them apart."""
from __future__ import annotations

import math

from engine.serving_load import SLO, LoadRun, SweepResult, reaches_goal

# Targets a lecturer can read aloud: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten.
ROUND_STEPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
HEADROOM = 1.2  # above the measured figure: a run again on the same machine varies by a few per cent
MAX_TTFT_S = 120.0  # the page's number inputs stop here
MAX_TPOT_S = 10.0


def round_up(x: float) -> float:
    """The smallest round number (`ROUND_STEPS` times a power of ten) at or above x > 0."""
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"round_up needs a positive number, got {x!r}")
    exponent = math.floor(math.log10(x))
    for step in ROUND_STEPS:
        value = round(step * 10.0 ** exponent, 12)  # 1.2e-1, not 0.12000000000000001
        if value >= x * (1 - 1e-12):
            return value
    return round(10.0 ** (exponent + 1), 12)


def _loosened(current: float, measured: float, cap: float) -> float:
    """The current target, or the measured figure with headroom rounded up where that is looser."""
    if not math.isfinite(measured) or measured <= 0:
        return current  # nothing to pace (one-token answers): the target never binds
    return min(cap, max(current, round_up(HEADROOM * measured)))


def _targets_for(run: LoadRun, slo: SLO) -> SLO:
    """Targets under which this run reaches the goal: its goal-percentile TTFT and TPOT, or, where the requests
    that miss one target are not the ones that miss the other, its slowest request's."""
    q = 100 * slo.goal
    fitted = SLO(_loosened(slo.ttft_s, run.ttft_percentile(q), MAX_TTFT_S),
                 _loosened(slo.tpot_s, run.tpot_percentile(q), MAX_TPOT_S), slo.goal)
    if reaches_goal(run.attainment(fitted), slo.goal):
        return fitted
    return SLO(_loosened(slo.ttft_s, run.ttft_percentile(100), MAX_TTFT_S),
               _loosened(slo.tpot_s, run.tpot_percentile(100), MAX_TPOT_S), slo.goal)


def fitted_targets(result: SweepResult, slo: SLO) -> SLO:
    """The targets that loosen `slo` least (by the larger of the two ratios) while one configuration reaches the
    goal at the lowest tested rate; a target already met there stays as it is. The goal itself never moves."""
    rate = min(result.rates)
    candidates = [_targets_for(result.run(c.label, rate), slo) for c in result.configs]
    return min(candidates, key=lambda t: (max(t.ttft_s / slo.ttft_s, t.tpot_s / slo.tpot_s), t.ttft_s, t.tpot_s))
