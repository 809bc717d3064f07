"""Latency SLOs and what a request's timing says against them.

TTFT is from the request's arrival (not from when the server got to it) to the end of the step that
produced its first token: queueing counts, as it does for a user. TPOT is the mean gap between its later
tokens, (last - first) / (tokens - 1). A request meets the SLO when both are within their targets;
attainment is the share that do, and goodput is the highest tested rate at which attainment, and every
lower tested rate's, still reaches the goal (DistServe's definition of the rate a server sustains).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float
    tpot_s: float
    goal: float = 0.9  # share of requests that must meet both targets

    def __post_init__(self) -> None:
        for name, value in (("TTFT target", self.ttft_s), ("TPOT target", self.tpot_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not (isinstance(self.goal, (int, float)) and 0 < self.goal <= 1):
            raise ValueError(f"attainment goal must be in (0, 1], got {self.goal!r}")


@dataclass(frozen=True, slots=True)
class RequestTiming:
    request_id: str
    arrival_s: float
    admitted_s: float  # start of the first step that computed any of its prompt
    first_token_s: float  # end of the step that sampled its first token
    finish_s: float  # end of the step that sampled its last token
    prompt_len: int
    output_tokens: int

    @property
    def queue_s(self) -> float:
        return self.admitted_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first; 0 for a one-token answer (nothing to pace)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    def meets_ttft(self, slo: SLO) -> bool:
        return self.ttft_s <= slo.ttft_s

    def meets_tpot(self, slo: SLO) -> bool:
        return self.tpot_s <= slo.tpot_s

    def meets(self, slo: SLO) -> bool:
        return self.meets_ttft(slo) and self.meets_tpot(slo)


def attainment(timings: Sequence[RequestTiming], slo: SLO) -> float:
    """Share of requests meeting both targets (0 for no requests)."""
    if not timings:
        return 0.0
    return sum(t.meets(slo) for t in timings) / len(timings)


def reaches_goal(share: float, goal: float) -> bool:
    """Whether an attainment reaches the goal (a float's last bit below it still does: 0.9 from 9 of 10)."""
    return share + 1e-12 >= goal


def goodput_rate(attainment_by_rate: Iterable[tuple[float, float]], goal: float) -> float | None:
    """The highest rate whose attainment reaches the goal with every lower tested rate reaching it too;
    None when even the lowest rate misses. A rate that passes above one that failed is luck of the draw,
    not capacity, so the first failure ends the search."""
    best = None
    for rate, share in sorted(attainment_by_rate):
        if not reaches_goal(share, goal):
            break
        best = rate
    return best


def passes_after_miss(attainment_by_rate: Iterable[tuple[float, float]], goal: float) -> list[float]:
    """Rates above the first one that misses the goal that reach it again: the passes `goodput_rate` does not
    count (with few requests attainment moves in coarse steps, and one late request decides a rate)."""
    missed, out = False, []
    for rate, share in sorted(attainment_by_rate):
        if not reaches_goal(share, goal):
            missed = True
        elif missed:
            out.append(rate)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation (numpy's default); nan for no values."""
    if not values:
        return math.nan
    return float(np.percentile(values, q))
