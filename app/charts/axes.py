"""Axis helpers shared by chart families."""
from __future__ import annotations

import math
from collections.abc import Iterable

from engine.trace import StepRecord


def step_ticks(records: list[StepRecord] | int, max_ticks: int = 16) -> dict:
    """Integer ticks for an 'engine step' axis (Plotly would otherwise label 0.5 steps); pass the
    records or the number of steps the axis spans."""
    n = max(records if isinstance(records, int) else len(records), 1)
    return {"tick0": 0, "dtick": max(1, math.ceil(n / max_ticks))}


def step_range(steps: Iterable[int], selected: int | None = None) -> dict:
    """An 'engine step' axis from step 0 to the last of `steps` and the `selected` step (at least 1), half a step
    of room each side. Around a single point, e.g. the timeline scrubbed back to step 0, Plotly's own range ran
    from -1 to 1: a negative step on the axis and the one point lost on the edge of an empty chart."""
    return {"range": [-0.5, max(*steps, selected or 0, 1) + 0.5]}


def step_line_mode(num_steps: int) -> str:
    """Plotly's mode for a series over engine steps: a line alone through a single point draws nothing (charts
    scrubbed to step 0, the prefill, were blank under metrics that had values), so markers until there are two."""
    return "lines+markers" if num_steps == 1 else "lines"


def index_ticks(count: int, max_labels: int = 10) -> dict:
    """Integer ticks for an axis of `count` token or tile indices: every 1, 2, 5, 10, 20, ... so at most
    `max_labels` labels, never rotated. Plotly's own ticks put 0.5 steps (or -0.4 ... 0.4 around a single
    cell) on axes of things that only come in whole numbers, and labelled all 20 tiles of a half-width grid
    sideways."""
    step = 1 if count <= max_labels else int(nice_at_least(count / max_labels))
    return {"tickmode": "linear", "tick0": 0, "dtick": step, "tickangle": 0}


def nice_at_least(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is at least x (> 0)."""
    base = 10.0 ** math.floor(math.log10(x))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= x * (1 - 1e-12))


def ticks_up_to(top: float) -> list[float]:
    """Two or three round ticks from 0 (a 1-2-5 step), none above `top` (> 0): for the strips of a
    shared-axis chart, whose top tick would otherwise meet the "0" of the strip above."""
    step = nice_at_least(top / 2)
    if step > top:  # 464: a step of 500 would leave the 0 alone; the 1-2-5 value below it is 200
        step = nice_at_least(step / 2.5)
    return [i * step for i in range(int(top // step) + 1)]


def log_axis(si: bool = False) -> dict:
    """Log-axis settings that read on a projector: one labelled tick per power of ten (Plotly's
    default also labels the 2s and 5s between them, so a '5' left of '1' means 0.5), unlabelled
    minor grid lines in between, and SI prefixes for rates (k, M, G, T: Plotly's default writes 1e9
    as '1B', which next to 'FLOP/B' reads as bytes) or plain numbers for ratios and counts."""
    return {"type": "log", "dtick": 1, "tickformat": "~s" if si else "~g",
            "minor": {"dtick": "D1", "showgrid": True, "gridcolor": "rgba(0,0,0,0.04)"}}


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(exponent: int) -> str:
    """10^k as a tick reads it: plain from 0.001 to 1000, '10⁻⁶' beyond (not '0.000001', which has to be
    counted)."""
    if -3 <= exponent <= 3:
        return f"{10.0 ** exponent:g}"
    return "10" + str(exponent).translate(_SUPERSCRIPT)


def decade_ticks(lo: float, hi: float, zero_at: float | None = None) -> dict:
    """One labelled tick per power of ten in [lo, hi] (> 0) on a log axis, written by `power_label`. `zero_at`:
    where a chart draws an exact zero (a log axis has none); that tick reads '0' instead of its power."""
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    vals = [10.0 ** k for k in range(first, last + 1)]
    text = [power_label(k) for k in range(first, last + 1)]
    if zero_at is not None:
        k = round(math.log10(zero_at))
        if first <= k <= last:
            text[k - first] = "0"
    return {"tickmode": "array", "tickvals": vals, "ticktext": text}


def one_two_five_ticks(lo: float, hi: float) -> dict:
    """Ticks at 1, 2 and 5 x 10^k (and 3 up to a span of 30x) in [lo, hi] (> 0), for a short log axis, where
    `log_axis`'s one tick per power of ten left a single label ("10000") to read the points against.
    Empty (keep `log_axis`'s) for a span over 2.5 decades, where they would crowd, or one with fewer than two
    such values in it; a span of 4x or more always has two."""
    if hi / lo > 10 ** 2.5:
        return {}
    # Up to ~1.5 decades, 3 too: with 1-2-5 only, points at 2,900 on a 2,000-20,000 axis had no tick near them.
    mantissas = (1, 2, 3, 5) if hi / lo < 30 else (1, 2, 5)
    vals = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            for m in mantissas if lo <= m * 10.0 ** k <= hi]
    if len(vals) < 2:  # a span too short for two round values: Plotly's own ticks are better than one
        return {}
    return {"tickmode": "array", "tickvals": vals, "ticktext": [f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in vals]}
