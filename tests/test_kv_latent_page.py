"""The KV page's MLA section under AppTest (random weights, CPU, two latent ranks put in place of the sweep):
the arithmetic before any run, the live retrofit on request, bad input as a message above the last results,
and a failing run that leaves the page up."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import app.sections.kv_latent as section
from engine.kv_latent.lab import run_latent_lab
from tests.apptest_helpers import assert_clean, open_page, random_app, submit_blank_prompt  # noqa: F401 (fixture)

PAGE, LAB = "01_kv_cache.py", "kv-mla"
SUBMIT = f"FormSubmitter:{LAB}-form-Factor, score and answer"


def _small(weights, settings, progress=None):  # noqa: ANN001, ANN202
    return run_latent_lab(weights, settings, progress, ranks=(192, 64))


def test_section_runs_on_request_and_keeps_results_on_bad_input(random_app: AppTest,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(section, "stored_latent_lab", _small)
    at = open_page(random_app, PAGE)
    assert_clean(at)
    subheaders = [s.value for s in at.subheader]
    assert "MHA vs GQA vs MQA vs MLA, and long contexts" in subheaders
    assert "MLA: cache one latent, rebuild K and V from it" in subheaders
    assert any("Factor, score and answer" in c.value for c in at.caption)  # nothing runs until asked
    charts = len(at.get("plotly_chart"))

    at.selectbox(key=f"{LAB}-rank").set_value(64)
    at.number_input(key=f"{LAB}-tokens").set_value(4)
    at.button(key=SUBMIT).click().run()
    assert_clean(at)
    labels = [m.label for m in at.metric]
    assert "Numbers per token and layer" in labels and "Rebuilding K from latents" in labels
    assert next(m for m in at.metric if m.label == "Numbers per token and layer").value == "64"
    assert len(at.get("plotly_chart")) == charts + 2
    assert any("At the same cache size" in m.value for m in at.markdown)

    # Another domain redraws from the same run.
    monkeypatch.setattr(section, "stored_latent_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    at.radio(key=f"{LAB}-domain").set_value("prose").run()
    assert_clean(at)

    # Bad input: the message, and the last results stay.
    submit_blank_prompt(at, f"{LAB}-prompt", SUBMIT)
    assert "Numbers per token and layer" in [m.label for m in at.metric]


def test_a_failing_run_is_a_message(random_app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the SVD did not converge")

    monkeypatch.setattr(section, "stored_latent_lab", broken)
    at = open_page(random_app, PAGE)
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert any("The latent-cache run failed: the SVD did not converge" in e.value for e in at.error)
    assert "MLA: cache one latent, rebuild K and V from it" in [s.value for s in at.subheader]
