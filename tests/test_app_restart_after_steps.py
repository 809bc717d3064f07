"""Restarting a page's engine from below its timeline, once the timeline is drawn.

The scenario editor ("Apply and restart the engine", the scenario upload) sits under the timeline
scrubber on every engine page. Restarting from there used to set the scrubber's own widget key after
the slider had been drawn in the same run, which Streamlit refuses
(StreamlitWidgetAlreadyInstantiatedError): the page showed a traceback instead of the new scenario.
It only happened with two or more recorded steps (before that there is no slider), so these tests step
twice first.
"""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.apptest_helpers import (ENGINE_PAGES, TINY_SCENARIO, assert_clean, open_page,  # noqa: F401 (fixture)
                                   random_app, session_of, upload_scenario)


def _step_twice(at: AppTest, prefix: str) -> None:
    for _ in range(2):
        at.button(key=f"{prefix}-btn-step").click().run()
        assert_clean(at)
    assert at.slider(key=f"{prefix}-scrub").value == 1


@pytest.mark.parametrize("page_file", list(ENGINE_PAGES))
def test_apply_and_restart_after_steps(random_app: AppTest, page_file: str) -> None:
    prefix = ENGINE_PAGES[page_file]
    at = open_page(random_app, page_file)
    _step_twice(at, prefix)
    before = session_of(at, prefix).scenario
    at.button(key=f"FormSubmitter:{prefix}-ed0-form-Apply and restart the engine").click().run()
    assert_clean(at)
    session = session_of(at, prefix)
    assert session.records == [] and session.scenario.requests == before.requests
    # The picker still shows the library scenario; a caption says what runs now.
    assert any(f"Running now: **{before.name} (edited)**" in c.value for c in at.caption)
    # The new timeline is followed from its first steps on.
    _step_twice(at, prefix)
    assert [r.step for r in session_of(at, prefix).records] == [0, 1]
    # And the picker's entry comes back with one click.
    at.button(key=f"{prefix}-pick-back").click().run()
    assert_clean(at)
    assert session_of(at, prefix).scenario == before and session_of(at, prefix).records == []
    assert not any("Running now" in c.value for c in at.caption)


def test_upload_after_steps(random_app: AppTest) -> None:
    at = open_page(random_app, "03_paged_attention.py")
    _step_twice(at, "paged")
    upload_scenario(at, "paged", json.dumps(TINY_SCENARIO).encode())
    assert_clean(at)
    session = session_of(at, "paged")
    assert session.scenario.name == "Tiny" and session.records == []
    assert any("Running now: **Tiny**" in c.value for c in at.caption)
    _step_twice(at, "paged")
