"""Page header (title, what is live) and the session's error messages."""
from __future__ import annotations

import streamlit as st

from app.session import EngineSession


def page_header(title: str, summary: str, session: EngineSession | None = None) -> None:
    st.title(title)
    st.markdown(summary)
    if session is not None and session.engine is not None:
        e = session.engine
        st.caption(f":material/memory: **{e.model_config.name}** · {e.backend_description} · "
                   f"dtype {e.config.dtype} · scenario: *{session.scenario.name}*")


def _dismiss(session: EngineSession) -> None:
    session.clear_errors()


def show_errors(session: EngineSession, page: str) -> None:
    """Input problems as st.error; unexpected engine failures also get their traceback (folded)."""
    if not session.errors:
        return
    for err in session.errors:
        st.error(err.message, icon=":material/error:")
        if err.details:
            with st.expander("Details (traceback)"):
                st.code(err.details, language="text")
    st.button("Dismiss messages", key=f"{page}-dismiss", on_click=_dismiss, args=(session,))
