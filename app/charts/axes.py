"""Axis helpers shared by chart families."""
from __future__ import annotations

import math

from engine.trace import StepRecord


def step_ticks(records: list[StepRecord] | int, max_ticks: int = 16) -> dict:
    """Integer ticks for an 'engine step' axis (Plotly would otherwise label 0.5 steps); pass the
    records or the number of steps the axis spans."""
    n = max(records if isinstance(records, int) else len(records), 1)
    return {"tick0": 0, "dtick": max(1, math.ceil(n / max_ticks))}
