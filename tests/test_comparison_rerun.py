"""comparison_runner reruns the script once it has stored a fresh result, so what a page draws above
the button (the speculative page's closed-form chart and its measured-speedup marker ◇) shows that
result as soon as the run finishes, not one interaction later. The speculative page's metric row
keeps every value short enough for one line."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)


def _page_with_a_comparison() -> None:
    """A page in miniature: a line drawn above the button reads the stored result, as the closed-form
    section does; `run` counts its calls so the test can see the rerun does not run it again."""
    from types import SimpleNamespace

    import streamlit as st

    from app.state import page_cache
    from app.widgets.comparison import comparison_runner

    stored = page_cache("t").get("compare")
    st.markdown(f"above: {stored[1] if stored else 'nothing yet'}")
    st.session_state.setdefault("calls", 0)

    def run(on_progress):  # noqa: ANN001, ANN202
        st.session_state["calls"] += 1
        on_progress(1)
        return f"result {st.session_state['calls']}"

    session = SimpleNamespace(scenario=SimpleNamespace(to_json=lambda: "{}"))
    runs = comparison_runner(session, "t", button_label="Compare", button_key="go", progress_text="…",
                             step_text="step {n}", expected_steps=1, hint="press Compare", run=run,
                             errors_of=lambda runs: [])
    st.markdown(f"below: {runs}")


def test_the_result_reaches_what_is_drawn_above_the_button() -> None:
    at = AppTest.from_function(_page_with_a_comparison, default_timeout=60).run()
    assert [m.value for m in at.markdown] == ["above: nothing yet", "below: None"]
    at.button(key="go").click().run()
    assert not at.exception, at.exception
    assert [m.value for m in at.markdown] == ["above: result 1", "below: result 1"]
    assert at.session_state["calls"] == 1  # the rerun redrew the page; it did not run the comparison again
    at.run()  # an unrelated rerun keeps the stored result and runs nothing
    assert [m.value for m in at.markdown] == ["above: result 1", "below: result 1"]
    assert at.session_state["calls"] == 1


def _closed_form(at: AppTest) -> dict:
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if any("predicted speedup vs γ" in str(a.get("text", "")) for a in spec["layout"].get("annotations", [])):
            return spec
    raise AssertionError("no closed-form chart")


@pytest.mark.slow
def test_speculative_page_marks_the_measured_speedup_right_after_the_run(random_app: AppTest) -> None:
    at = open_page(random_app, "07_speculative_decoding.py")
    # A short scenario keeps the four engines of the comparison quick on random weights.
    session = at.session_state["engine-session:spec"]
    short = session.scenario.with_requests([session.scenario.requests[0].__class__(
        "The cat sat on the mat. The cat sat on the", max_tokens=8, ignore_eos=True, request_id="copy")])
    assert session.reset(short)
    at.button(key="spec-btn-end").click().run()
    assert_clean(at)
    names = [t.get("name") for t in _closed_form(at)["data"]]
    assert "measured speedup" not in names
    at.button(key="spec-compare").click().run()  # one click, no other interaction
    assert_clean(at)
    names = [t.get("name") for t in _closed_form(at)["data"]]
    assert "measured speedup" in names
    # The five-metric row: short values, the detail in the grey delta chips.
    metrics = {m.label: m for m in at.metric}
    assert "Draft / verify time" not in metrics
    drafting = metrics["Time drafting"]
    assert drafting.delta.startswith("verifying ") and len(drafting.value) <= 10
    assert "γ" not in metrics["Drafter"].value and metrics["Drafter"].delta.startswith("γ ")
    # Five labels in a row fit one line each on a 1280 px projector in presentation mode.
    assert all(len(label) <= 18 for label in list(metrics)[:5]), list(metrics)
    assert metrics["This step"].delta == "tokens / rounds"
