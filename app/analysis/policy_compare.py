"""Run one scenario under static and continuous batching and keep both timelines.

The two engines are stepped alternately (one step each) so that background load on a shared CPU
falls on both runs alike; each run's throughput uses only its own step wall times.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.side_by_side import step_alternately
from app.scenarios import Scenario
from app.session import EngineSession, SessionError

POLICIES: tuple[str, ...] = ("static", "continuous")


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    records: tuple[StepRecord, ...]
    errors: tuple[SessionError, ...]


def compare_policies(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 400,
                     on_progress: Callable[[int], None] | None = None) -> dict[str, PolicyRun]:
    sessions = {p: EngineSession.create(scenario.with_engine(policy=p), weights, server) for p in POLICIES}
    step_alternately(sessions, max_steps, on_progress)
    return {p: PolicyRun(p, tuple(s.records), tuple(s.errors)) for p, s in sessions.items()}
