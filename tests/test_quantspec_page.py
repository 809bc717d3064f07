"""The speculative page's self-speculation section under AppTest (random weights, CPU): nothing runs until asked,
then every format's run, a redraw that does not run again, bad input as a message above the last results, and a
failing run that leaves the page up."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import app.sections.quantspec as section
from tests.apptest_helpers import assert_clean, open_page, random_app, submit_blank_prompt  # noqa: F401 (fixture)

PAGE, LAB = "07_speculative_decoding.py", "spec-qs"
SUBMIT = f"FormSubmitter:{LAB}-form-Self-speculate with every cache format"
TITLE = "Self-speculation with a quantized KV cache (QuantSpec)"


def test_section_runs_on_request_and_keeps_results_on_bad_input(random_app: AppTest,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert TITLE in [s.value for s in at.subheader]
    assert any("Self-speculate with every cache format" in c.value for c in at.caption)
    charts = len(at.get("plotly_chart"))
    at.number_input(key=f"{LAB}-tokens").set_value(6)
    at.number_input(key=f"{LAB}-gamma").set_value(3)
    at.button(key=SUBMIT).click().run()
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Same text as the target alone"] == "yes"
    assert len(at.get("plotly_chart")) == charts + 2
    table = at.dataframe[-1].value
    assert len(table) == 8 and list(table["same text"]) == ["yes"] * 8  # 4 formats, 16-bit and INT4 draft weights

    monkeypatch.setattr(section, "run_self_spec_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    at.radio(key=f"{LAB}-shown").set_value("int2").run()
    at.radio(key=f"{LAB}-bits").set_value(4).run()
    assert_clean(at)

    submit_blank_prompt(at, f"{LAB}-prompt", SUBMIT)
    assert "Same text as the target alone" in [m.label for m in at.metric]


def test_a_failing_run_is_a_message(random_app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the cache store is gone")

    monkeypatch.setattr(section, "run_self_spec_lab", broken)
    at = open_page(random_app, PAGE)
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert any("The self-speculation run failed: the cache store is gone" in e.value for e in at.error)
    assert TITLE in [s.value for s in at.subheader]


def test_the_best_run_is_the_smaller_cache_on_a_tie() -> None:
    """INT4 and INT8 draft caches both reached 5.00 tokens a pass: the metric named INT8 (the first), as if the
    best result needed the bigger cache."""
    import types
    from app.analysis.quantspec import best_run, draft_weights_label
    def run(fmt: str, tpp: float, b: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(kv_format=fmt, tokens_per_pass=tpp, draft_bytes_per_token=b)
    result = types.SimpleNamespace(runs=[run("int8", 5.0, 11880), run("int4", 5.0, 7200), run("int2", 3.0, 4320)])
    assert best_run(result).kv_format == "int4"
    assert draft_weights_label(16) == "the target's" and draft_weights_label(4) == "INT4"
