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
        value = float(f"{step * 10.0 ** exponent:.6g}")  # 0.12, not 0.12000000000000001
        if value >= x * (1 - 1e-12):
            return value
    return float(f"{10.0 ** (exponent + 1):.6g}")


def _loosened(current: float, needed: float, cap: float) -> float:
    """The current target where the needed figure is within it (no-one asked to move a target that holds),
    else the needed figure with headroom, rounded up."""
    if needed <= current:
        return current
    return min(cap, round_up(HEADROOM * needed))


def _targets_for(run: LoadRun, slo: SLO) -> SLO:
    """The targets that loosen `slo` least while this run reaches the goal. Enough requests must meet both
    targets at once, and the slow first tokens and the slow paces can belong to different requests, so each
    request's TTFT is tried as the TTFT target, with the TPOT target the slowest pace among the fastest
    requests that then count."""
    timings = run.timings
    need = min(len(timings), math.ceil(slo.goal * len(timings) - 1e-9))
    best: SLO | None = None
    for t in timings:
        ttft = _loosened(slo.ttft_s, t.ttft_s, MAX_TTFT_S)
        paces = sorted(u.tpot_s for u in timings if u.ttft_s <= ttft)
        if len(paces) < need:
            continue
        tpot = _loosened(slo.tpot_s, paces[need - 1], MAX_TPOT_S) if need else slo.tpot_s
        candidate = SLO(ttft, tpot, slo.goal)
        if not reaches_goal(run.attainment(candidate), slo.goal):
            continue  # a target held at its cap
        if best is None or _cost(candidate, slo) < _cost(best, slo):
            best = candidate
    return best or SLO(MAX_TTFT_S, MAX_TPOT_S, slo.goal)


def _cost(targets: SLO, slo: SLO) -> tuple[int, float, float]:
    """How far targets loosen `slo`: how many of the two move (a target enough requests meet on their own stays,
    the other takes up the slack), then the larger of the two ratios, then their sum."""
    ratios = (targets.ttft_s / slo.ttft_s, targets.tpot_s / slo.tpot_s)
    return (sum(r > 1 for r in ratios), max(ratios), sum(ratios))


def fitted_targets(result: SweepResult, slo: SLO) -> SLO:
    """The targets that loosen `slo` least (`_cost`) while one configuration reaches the goal at the lowest tested
    rate; a target that enough requests meet there on their own stays. The goal itself never moves."""
    rate = min(result.rates)
    candidates = [_targets_for(result.run(c.label, rate), slo) for c in result.configs]
    return min(candidates, key=lambda t: _cost(t, slo))
