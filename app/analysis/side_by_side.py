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

    The order rotates every round, so each run goes first equally often: whichever ran first in a
    round was measured ~1.4x slower on the 2-core CI machine (the progress update and Streamlit's
    server thread compete with it), which inflated every page's headline speedup toward the run
    listed second.
    """
    runs = list(sessions.values())
    steps = 0
    while steps < max_steps and any(s.has_work for s in runs):
        first = steps % len(runs)
        for s in runs[first:] + runs[:first]:
            s.step()
        steps += 1
        if on_progress:
            on_progress(steps)
