"""The run-a-comparison block of a page: a button that runs it under a progress bar, the results kept
in the page cache (with the scenario they were measured on), and the captions around them."""
from __future__ import annotations

import json
from typing import Callable, Iterable, TypeVar

import streamlit as st

from app.session import EngineSession
from app.state import page_cache

R = TypeVar("R")


def comparison_runner(session: EngineSession, page: str, *, button_label: str, button_key: str, progress_text: str,
                      step_text: str, expected_steps: int, hint: str,
                      run: Callable[[Callable[[int], None]], R], errors_of: Callable[[R], Iterable[str]]) -> R | None:
    """Draw the button and, when pressed, call `run(on_progress)`, store its result for this page and
    rerun the script (so what the page draws above this block shows the fresh result too).

    `progress_text` is the bar's text before the first step; after step n it reads
    `step_text.format(n=n)`, the bar full at `expected_steps`. Returns the stored runs (with a caption
    when they were measured on an earlier version of the scenario, and `errors_of(runs)` shown as
    errors), or None after showing the "press the button" caption `hint` when nothing is stored.
    """
    cache = page_cache(page)
    key = session.scenario.to_json()
    if st.button(button_label, icon=":material/compare_arrows:", key=button_key, type="primary"):
        bar = st.progress(0, text=progress_text)
        cache["compare"] = (key, run(lambda n: bar.progress(min(n / expected_steps, 1.0),
                                                             text=step_text.format(n=n))))
        bar.empty()
        # Sections drawn above this block in the same run (the speculative page's closed-form chart marks
        # the measured speedup) rendered before the result existed: rerun so every one of them sees it.
        st.rerun()
    stored = cache.get("compare")
    if stored is None:
        st.caption(hint)
        return None
    scenario_json, runs = stored
    if scenario_json != key:
        earlier = json.loads(scenario_json).get("name")
        st.caption("These results are for an earlier version of the scenario; run again to refresh."
                   if earlier == session.scenario.name else
                   f"These results are for another scenario, “{earlier}”; run again for this one.")
    for message in errors_of(runs):
        st.error(message)
    return runs
