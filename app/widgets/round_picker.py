"""Which speculative round a page draws: the selected step's, else the latest one before it, and
one request's among several (a radio that keeps its choice while the user steps)."""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import streamlit as st

from engine.trace import StepRecord

R = TypeVar("R")


def latest_rounds(record: StepRecord, history: list[StepRecord], rounds_of: Callable[[StepRecord], list[R]],
                  what: str) -> tuple[list[R], int]:
    """(rounds, the step they are from): `record`'s, or the most recent earlier step's with a caption."""
    rounds = rounds_of(record)
    if rounds:
        return rounds, record.step
    for earlier in reversed(history[:-1]):
        rounds = rounds_of(earlier)
        if rounds:
            st.caption(f"No {what} in step {record.step}; below is the latest one, from step {earlier.step}.")
            return rounds, earlier.step
    return [], record.step


def pick_round(rounds: Sequence[R], request_ids: list[str], key: str, label: str) -> R:
    if len(rounds) == 1:
        return rounds[0]
    if st.session_state.get(key) not in request_ids:
        st.session_state[key] = request_ids[0]
    st.radio(label, request_ids, horizontal=True, key=key)
    return rounds[request_ids.index(st.session_state[key])]
