"""The timeline scrubber: pick any recorded step and every chart redraws from its StepRecord.

Nothing is re-run: the slider only chooses an index into the session's records.
"""
from __future__ import annotations

import streamlit as st

from engine.trace import StepRecord

from app.session import EngineSession
from app.widgets.controls import follow_key


def timeline_scrubber(session: EngineSession, page: str) -> StepRecord | None:
    """Returns the selected record (the newest by default), or None before the first step."""
    key = f"{page}-scrub"
    n = len(session.records)
    # A step, a reset or a restart asked to show the newest record (app.widgets.controls.follow_latest).
    follow = st.session_state.pop(follow_key(page), False)
    if n == 0:
        if session.has_work:
            st.info("Press **Step** (or **Play**) to run the first engine iteration on the model.",
                    icon=":material/info:")
        else:  # Step and Play are disabled: say what would enable them instead
            st.info("No request is queued, so there is nothing to step: add one with **Add a request now**, or pick "
                    "or edit a scenario under **Scenario and requests**.", icon=":material/info:")
        return None
    if n == 1:
        st.session_state[key] = 0
        st.caption("1 step recorded · showing step 0 (step again to get a timeline you can scrub)")
        return session.records[0]
    current = st.session_state.get(key)
    if follow or not isinstance(current, int) or not 0 <= current < n:
        st.session_state[key] = n - 1
    st.slider(f"Timeline: {n} steps recorded; pick any to redraw it from its record (nothing re-runs)",
              min_value=0, max_value=n - 1, key=key, format="step %d")
    return session.records[st.session_state[key]]


def history_until(session: EngineSession, record: StepRecord | None) -> list[StepRecord]:
    """The records up to and including the selected one: time-series charts replay to the scrubber."""
    if record is None:
        return []
    return session.records[: record.step + 1 - session.records[0].step]
