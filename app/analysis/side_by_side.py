"""Run several engine sessions of the same requests side by side, for a comparison.

Not pure like the rest of `app.analysis`: it steps live engines, but draws nothing.
"""
from __future__ import annotations

from typing import Callable, Hashable, Mapping, TypeVar

from app.session import EngineSession

K = TypeVar("K", bound=Hashable)


def step_alternately(sessions: Mapping[K, EngineSession], max_steps: int,
                     on_progress: Callable[[int], None] | None = None) -> None:
    """Step every session once per round, in turn, until none has work left or `max_steps` rounds ran.

    Alternating (rather than running one session to the end, then the next) matters for the timings:
    background load on a shared CPU comes and goes, and stepping the runs in turn makes it fall on
    both (all) runs alike, so each run's step wall times stay comparable. `on_progress` gets the number
    of rounds done after each round.
    """
    steps = 0
    while steps < max_steps and any(s.has_work for s in sessions.values()):
        for s in sessions.values():
            s.step()
        steps += 1
        if on_progress:
            on_progress(steps)
