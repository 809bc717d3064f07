"""The explanation panel: the formula that governs a page (left) and what to look at (right)."""
from __future__ import annotations

from collections.abc import Sequence

import streamlit as st


def explanation(title: str, formulas: Sequence[str], look_for: Sequence[str], note: str = "",
                expanded: bool = True, name: str = "") -> None:
    """Always shown in full (`expanded` is accepted for older callers and ignored): the formula is
    the point of a page, so it should be on screen, not behind a click. A page with a second panel gives it a
    `name` (Streamlit keys are unique per page)."""
    with st.container(border=True):
        left, right = st.columns([1, 1.15], gap="large")
        with left:
            st.markdown(f"##### :material/school: {title}")
            # Inline math in display style rather than st.latex: KaTeX may break inline math after a
            # top-level relation or operator, so a formula wraps in a narrow column (a 1280-pixel projector,
            # a half-width window) instead of being cut off at the column's edge; display-mode formulas
            # never break. A parenthesised term is braced into one atom where the formula is written ("{(p \bmod
            # B)}"): KaTeX breaks after any top-level operator, and at 1280 pixels "(p mod" ended a line above
            # "B)". The container's key lets app/presentation.py space the formulas.
            with st.container(key=f"explain-formulas-{name}" if name else "explain-formulas"):
                for f in formulas:
                    st.markdown(f"$\\displaystyle {f}$")
            if note:
                st.caption(note)
        with right:
            st.markdown("**What to look for**")
            st.markdown("\n".join(f"- {item}" for item in look_for))
