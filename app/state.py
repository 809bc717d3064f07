"""Streamlit glue for `EngineSession`: one per (browser session, page), kept in st.session_state.

Keyed by page so each page keeps its own timeline when a student moves between pages, and
session_state is per browser tab, so two students never share an engine.
"""
from __future__ import annotations

import streamlit as st

from app.runtime import server_engine_settings, shared_weights
from app.scenarios import Scenario
from app.session import EngineSession


def session_key(page: str) -> str:
    return f"engine-session:{page}"


def get_session(page: str, default: Scenario) -> EngineSession:
    key = session_key(page)
    session = st.session_state.get(key)
    if session is None:
        session = EngineSession.create(default, shared_weights(), server_engine_settings())
        st.session_state[key] = session
    return session


def page_cache(page: str) -> dict:
    """A per-page dict for measured results (comparisons, timings) that must survive reruns."""
    key = f"page-cache:{page}"
    if key not in st.session_state:
        st.session_state[key] = {}
    return st.session_state[key]
