"""Presentation mode: larger type and no sidebar, for a projector. Charts switch to the larger
Plotly template through `app.theme.show_figure`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import streamlit as st
from streamlit.navigation.page import StreamlitPage

KEY = "presentation"
GO_KEY = "presentation-go"
CARRY_KEY = "presentation-carry"

_BASE_CSS = """
<style>
  /* Plotly charts get breathing room; metric values line up. */
  [data-testid="stMainBlockContainer"] { padding-top: 2.2rem; padding-bottom: 3rem; }
  [data-testid="stPlotlyChart"] { margin-bottom: 0.4rem; }
  [data-testid="stMetricValue"] { font-variant-numeric: tabular-nums; }
  /* A metric too wide for its column wraps instead of ending in "…": five or six metrics share a row on
     several pages, and in presentation mode, or at a projector's 1280 pixels, values such as "287 MFLOP"
     or a model name were cut off. */
  [data-testid="stMetricValue"] .stMarkdownEllipsis, [data-testid="stMetricLabel"] .stMarkdownEllipsis,
  [data-testid="stMetricDelta"] .stMarkdownEllipsis, [data-testid="stMetricValue"] p,
  [data-testid="stMetricLabel"] p, [data-testid="stMetricDelta"] p {
    white-space: normal !important; overflow: visible; text-overflow: clip; overflow-wrap: break-word;
  }
  [data-testid="stMetricValue"] p { line-height: 1.15; }
  /* A row whose columns each hold one widget or one metric (no deltas) is lined up at the bottom: a label
     that wraps onto a second line ("Budget (max_num_batched_tokens)", "Context per sequence (cached tokens)")
     then grows upward instead of pushing its box or value below its neighbours'. Rows with more in a column
     (a caption), with metric deltas, or with a tall element (a text area, a chart, a table), whose heights
     differ for other reasons, stay top-aligned. */
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] [data-testid="stWidgetLabel"],
  > [data-testid="stColumn"] [data-testid="stMetric"]):not(:has(> [data-testid="stColumn"] >
  [data-testid="stVerticalBlock"] > :nth-child(2), [data-testid="stMetricDelta"], [data-testid="stTextArea"],
  [data-testid="stPlotlyChart"], [data-testid="stDataFrame"])) > [data-testid="stColumn"] >
  [data-testid="stVerticalBlock"] { justify-content: flex-end; }
  /* Rows of five or more metrics: a smaller value, so "136 / 321" or "162 GFLOP/s" stays on one line at a
     projector's 1280 pixels. */
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(5)) [data-testid="stMetricValue"],
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(5)) [data-testid="stMetricValue"] * {
    font-size: 1.8rem;
  }
  /* The explanation panel's formulas are inline math that wraps (app/widgets/explain.py): a hanging indent
     sets the continuation lines of a wrapped formula apart from the next formula. */
  [class*="st-key-explain-formulas"] [data-testid="stMarkdownContainer"] p {
    padding-left: 1.5em; text-indent: -1.5em; margin-bottom: 0.7rem; line-height: 1.9;
  }
  /* A small projector (1024 pixels) with the sidebar open left the page 564 pixels: Streamlit's wide layout
     pads it by 80 pixels a side, and two charts side by side got about 280 each, too narrow for their titles,
     legends and tree labels. Below 1200 pixels the padding shrinks, and in a page narrower than the one a
     1280-pixel projector gives (820 pixels, where every chart is checked), a row that holds a chart or a table
     stacks its columns, so each gets the page's whole width. */
  @media (max-width: 1199px) {
    [data-testid="stMainBlockContainer"] { padding-left: 1rem; padding-right: 1rem; }
  }
  [data-testid="stMainBlockContainer"] { container: page / inline-size; }
%(stack_normal)s  /* The home page's topic links carry a one-line summary: let it wrap rather than end in "…". */
  [data-testid="stMainBlockContainer"] [data-testid="stPageLink"] .stMarkdownEllipsis,
  [data-testid="stMainBlockContainer"] [data-testid="stPageLink"] p {
    white-space: normal !important; overflow: visible; text-overflow: clip;
  }
</style>
"""

_PRESENT_CSS = """
<style>
  /* Text a quarter larger needs a quarter more width: the rows stack below 975 pixels of page. */
%(stack_present)s  html, body, [data-testid="stAppViewContainer"] { font-size: 20px; }
  [data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"] { display: none !important; }
  [data-testid="stMainBlockContainer"] { max-width: 100% !important; padding-left: 2.5rem; padding-right: 2.5rem; }
  h1 { font-size: 2.6rem !important; }
  h2 { font-size: 2.0rem !important; }
  h3 { font-size: 1.6rem !important; }
  [data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.2rem; }
  /* Metric values are markdown too: keep them big (the rule above would shrink them). */
  [data-testid="stMetricValue"], [data-testid="stMetricValue"] * { font-size: 2.6rem !important; }
  /* Rows of four, and of five or more, metrics: sizes that keep most values on one line at 1280 pixels. */
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(4)) [data-testid="stMetricValue"],
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(4)) [data-testid="stMetricValue"] * {
    font-size: 2.2rem !important;
  }
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(5)) [data-testid="stMetricValue"],
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"]:nth-child(5)) [data-testid="stMetricValue"] * {
    font-size: 1.9rem !important;
  }
  [data-testid="stMetricLabel"] p { font-size: 1.05rem !important; }
  /* What the form holds (a prompt, "128" in a select box) grew with nothing else: as large as the labels. */
  [data-testid="stMainBlockContainer"] input, [data-testid="stMainBlockContainer"] textarea,
  [data-testid="stMainBlockContainer"] [data-baseweb="select"] * { font-size: 1.05rem !important; }
</style>
"""


def _stack_rows_below(page_px: int) -> str:
    """CSS: in a page narrower than `page_px` (the main block's width), each row that holds a chart or a table
    stacks its columns."""
    row = ('[data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] :is([data-testid="stPlotlyChart"], '
           '[data-testid="stDataFrame"]))')
    return (f"  @container page (max-width: {page_px}px) {{\n    {row} {{ flex-wrap: wrap; }}\n"
            f"    {row} > [data-testid=\"stColumn\"] {{ min-width: 100%; flex: 1 1 100%; }}\n  }}\n")


# Presentation mode sets the page's text at 20 pixels instead of Streamlit's 16 (_PRESENT_CSS), tables' included.
PRESENT_TEXT_SCALE = 20 / 16
STACK_BELOW_PX = 780  # a 1280-pixel projector with the sidebar open leaves 820, where every chart is checked
PRESENT_STACK_BELOW_PX = round(STACK_BELOW_PX * PRESENT_TEXT_SCALE)  # 975: the same for text a quarter larger
_BASE_CSS = _BASE_CSS.replace("%(stack_normal)s", _stack_rows_below(STACK_BELOW_PX))
_PRESENT_CSS = _PRESENT_CSS.replace("%(stack_present)s", _stack_rows_below(PRESENT_STACK_BELOW_PX))


def presentation_on() -> bool:
    if st.session_state.pop(CARRY_KEY, False):  # set before a switch of page, which drops the toggle's state
        st.session_state[KEY] = True
    return bool(st.session_state.get(KEY, False))


def _exit() -> None:
    st.session_state[KEY] = False


def apply_presentation_css() -> None:
    st.markdown(_BASE_CSS, unsafe_allow_html=True)
    if presentation_on():
        st.markdown(_PRESENT_CSS, unsafe_allow_html=True)


def presentation_controls(pages: Mapping[str, Sequence[StreamlitPage]], current: StreamlitPage) -> None:
    """The toggle lives in the sidebar; while the sidebar is hidden, an exit button and a page picker (`pages`:
    the navigation's, by section) sit on the page, so a lecturer changes topic without leaving the mode. A
    select box rather than a menu of links: a menu stayed open over the next page."""
    st.sidebar.toggle("Presentation mode", key=KEY, help="Larger fonts and charts, sidebar hidden")
    if not presentation_on():
        return
    listed = {p.url_path: p for entries in pages.values() for p in entries if p.visibility != "hidden"}
    picked = st.session_state.get(GO_KEY)
    if picked in listed and picked != current.url_path:
        st.session_state[CARRY_KEY] = True  # a switch from inside a run forgets the toggle: carry it over
        st.switch_page(listed[picked])
    st.session_state[GO_KEY] = current.url_path  # the picker shows the page on screen
    with st.container(horizontal=True, gap="small", vertical_alignment="center"):
        st.button("Exit presentation mode", key="presentation-exit", icon=":material/close_fullscreen:",
                  on_click=_exit, type="tertiary")
        st.selectbox("Go to page", list(listed), format_func=lambda path: listed[path].title, key=GO_KEY,
                     label_visibility="collapsed", width=360)
