"""Step / Play / Pause / Reset, a speed control and a run-to-end button for one page's engine.

Play is a `st.fragment(run_every=...)` ticker: each tick steps the engine once and asks for a full
rerun so every chart redraws; it stops itself when the engine has no work left. Buttons act through
callbacks, which run before the page script, so the page always draws the state after the action.
"""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from app.session import EngineSession
from app.state import settings_key

SPEEDS: dict[str, float] = {"slow (1.5 s)": 1.5, "normal (0.6 s)": 0.6, "fast (0.2 s)": 0.2}
RUN_TO_END_LIMIT = 400


def _keys(page: str) -> dict[str, str]:
    return {name: f"{page}-{name}" for name in ("playing", "speed", "ticks-seen", "full-runs")}


def follow_latest(page: str) -> None:
    """Point the timeline scrubber at the newest record the next time it is drawn.

    A request, not the slider's own key: the scenario editor restarts the engine from below the
    timeline, after the slider has been drawn in that run, and Streamlit refuses a widget's key being
    set once the widget exists (StreamlitWidgetAlreadyInstantiatedError). `timeline_scrubber` honours
    the request before it draws the slider."""
    st.session_state[follow_key(page)] = True


def follow_key(page: str) -> str:
    """The session key of `follow_latest`'s request, read (and cleared) by `timeline_scrubber`."""
    return f"{page}-scrub-follow"


def restart_with(session: EngineSession, page: str, settings: Any, factory: Callable[[Any], Any]) -> bool:
    """Rebuild the page's engine for `settings` (a record with `scenario()`) through `factory(settings)`, keep
    them as the page's settings and follow the new timeline. On a rejected engine config the old engine,
    factory and settings stay (the session records the message)."""
    old = session.engine_factory
    session.engine_factory = factory(settings)
    if not session.reset(settings.scenario()):
        session.engine_factory = old
        return False
    st.session_state[settings_key(page)] = settings
    st.session_state[_keys(page)["playing"]] = False
    follow_latest(page)
    return True


def _step(session: EngineSession, page: str) -> None:
    # A bad-input message has been read by the time the student steps on: it goes (a traceback stays).
    session.clear_input_errors()
    session.step()
    follow_latest(page)


def _run_to_end(session: EngineSession, page: str) -> None:
    st.session_state[_keys(page)["playing"]] = False
    session.clear_input_errors()
    session.run(RUN_TO_END_LIMIT)
    follow_latest(page)


def _reset(session: EngineSession, page: str) -> None:
    st.session_state[_keys(page)["playing"]] = False
    session.reset()
    follow_latest(page)


def _set_playing(page: str, value: bool) -> None:
    st.session_state[_keys(page)["playing"]] = value


def _pause(session: EngineSession, page: str) -> None:
    # A Pause click can interrupt a tick between its engine step and its follow_latest, which left the
    # view one step behind the records ("3 steps recorded" showing step 1): point it at the newest.
    _set_playing(page, False)
    follow_latest(page)


def engine_controls(session: EngineSession, page: str) -> None:
    k = _keys(page)
    st.session_state.setdefault(k["playing"], False)
    # Counts full runs of this page so the ticker can tell a timer tick from a full rerun.
    st.session_state[k["full-runs"]] = st.session_state.get(k["full-runs"], 0) + 1
    playing = bool(st.session_state[k["playing"]]) and session.has_work
    if not session.has_work:
        st.session_state[k["playing"]] = False

    # A wrapping row of buttons as wide as their labels: in columns they shrank to "S.", "P.", "Ru…" at 1024
    # pixels with the sidebar open; here the speed slider moves to a line of its own instead.
    with st.container(horizontal=True, wrap=True, vertical_alignment="bottom", gap="small"):
        st.button("Step", key=f"{page}-btn-step", icon=":material/skip_next:", on_click=_step,
                  args=(session, page), disabled=not session.has_work or playing,
                  help="Run one real engine iteration on the model")
        st.button("Play", key=f"{page}-btn-play", icon=":material/play_arrow:", on_click=_set_playing,
                  args=(page, True), disabled=not session.has_work or playing)
        st.button("Pause", key=f"{page}-btn-pause", icon=":material/pause:", on_click=_pause,
                  args=(session, page), disabled=not playing)
        st.button("Reset", key=f"{page}-btn-reset", icon=":material/restart_alt:", on_click=_reset,
                  args=(session, page), help="New engine, same scenario: the timeline starts again from step 0")
        st.button("Run to end", key=f"{page}-btn-end", icon=":material/fast_forward:", on_click=_run_to_end,
                  args=(session, page), disabled=not session.has_work or playing,
                  help=f"Step until every request finishes (at most {RUN_TO_END_LIMIT} steps)")
        st.session_state.setdefault(k["speed"], "normal (0.6 s)")
        st.select_slider("Play speed (pause between steps)", options=list(SPEEDS), key=k["speed"], width=280)
    if playing:
        _ticker(session, page, SPEEDS[st.session_state[k["speed"]]])


def _ticker(session: EngineSession, page: str, interval: float) -> None:
    k = _keys(page)

    @st.fragment(run_every=interval)
    def tick() -> None:
        full_runs = st.session_state.get(k["full-runs"], 0)
        if st.session_state.get(k["ticks-seen"]) != full_runs:
            # First execution is part of a full page run: just arm the timer.
            st.session_state[k["ticks-seen"]] = full_runs
            st.caption(":material/autoplay: playing…")
            return
        if not st.session_state.get(k["playing"]):
            return
        if session.step() is None:
            st.session_state[k["playing"]] = False
        follow_latest(page)
        st.rerun(scope="app")

    tick()
