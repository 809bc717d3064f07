"""What is live, in the sidebar of every page."""
from __future__ import annotations

import streamlit as st

from app.runtime import backend_summary, device, weights_mode


def sidebar_status() -> None:
    with st.sidebar:
        st.divider()
        weights = "SmolLM2-135M-Instruct (real weights)" if weights_mode() == "real" else "random weights (test mode)"
        st.caption(f":material/memory: **Model:** {weights}  \n"
                   f":material/developer_board: **Device:** {device()}  \n"
                   f":material/bolt: **Kernels:** {backend_summary('auto')}")
