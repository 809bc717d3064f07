"""InferScope entry point: `python -m streamlit run app/main.py`.

Builds the navigation from `app.registry`, applies the page-wide look (wide layout, presentation
mode) and runs the selected page. Pages own their engines; this file never touches the model.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/, not the repo root, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.presentation import apply_presentation_css, presentation_controls, presentation_on  # noqa: E402
from app.registry import HOME, pages_by_section  # noqa: E402
from app.runtime import device  # noqa: E402
from app.widgets.sidebar import sidebar_status  # noqa: E402
from kernels.device_gate import gpu_work  # noqa: E402

st.set_page_config(page_title="InferScope", page_icon=":material/visibility:", layout="wide",
                   initial_sidebar_state="collapsed" if presentation_on() else "expanded")


def _page(spec) -> st.Page:  # noqa: ANN001 (PageSpec)
    # The default page's own url_path is never served (it lives at `/`), yet must be unique: it gets a private
    # one so the registry's `home` path can go to the redirect below.
    url_path = f"{spec.url_path}-default" if spec is HOME else spec.url_path
    return st.Page(spec.file, title=spec.title, icon=spec.icon, url_path=url_path, default=spec is HOME)


home = _page(HOME)


def _redirect_home() -> None:
    st.switch_page(home)


# Streamlit serves the default page at `/` only, so a visitor who types `/home` (the home page's name in the
# registry) got "Page not found". A hidden page at that path sends them to the home page instead.
home_alias = st.Page(_redirect_home, title=HOME.title, url_path=HOME.url_path, visibility="hidden")
nav = {"": [home, home_alias]}
nav.update({section: [_page(p) for p in specs] for section, specs in pages_by_section().items()})
current = st.navigation(nav, position="sidebar")

apply_presentation_css()
presentation_controls(nav, current)
sidebar_status()
# On a GPU each visitor's script run is GPU work that another visitor's CUDA graph capture must not overlap
# (kernels/device_gate.py); engine steps in Play's fragment reruns hold the gate themselves.
with gpu_work(device()):
    current.run()
