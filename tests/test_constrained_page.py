"""The constrained decoding page under AppTest (random weights, CPU): stepped and scrubbed with the mask
picture of every token, a preset switch that restarts, hand-written grammars that are wrong as messages
that keep the run, the free-vs-masked comparison; plus the page's record-only analysis and charts."""
from __future__ import annotations

import dataclasses

import pytest
from streamlit.testing.v1 import AppTest

from engine.constrained import Constraint
from engine.constrained.presets import DATE, PERSON, PRESETS, SENTIMENT
from engine.tokenizer import default_tokenizer

from app.analysis.constrained import (MODES, LastMask, ModeRun, check_settings, last_mask, library, modes_for,
                                      preset_settings, summarize, token_rows)
from app.charts.constrained import MAX_TICK_LABELS, mask_figure, modes_figure, tick_angle
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app, session_of  # noqa: F401 (fixture)

PAGE, PREFIX = "12_constrained_decoding.py", "cd"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Apply and restart"


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "constrained-decoding")
    assert spec.available and spec.section == "Scheduling and decoding"


def test_settings_are_checked_before_anything_runs() -> None:
    tok = default_tokenizer()
    ok = check_settings("Name a colour.", SENTIMENT.constraint, True, 8, 0.0, 0, 1, tok)
    assert ok.scenario().requests[0].max_tokens == 8 and ok.constraint == SENTIMENT.constraint
    assert check_settings("Hi", None, False, 8, 0.0, 0, 1, tok).scenario().name == "free text"
    bad = [(("  ", None, True, 8, 0.0, 0, 1), "empty"), (("x" * 601, None, True, 8, 0.0, 0, 1), "600"),
           (("Hi", Constraint("regex", "([a-z"), True, 8, 0.0, 0, 1), "regular expression is not usable"),
           (("Hi", Constraint("json_schema", "{"), True, 8, 0.0, 0, 1), "not valid JSON"),
           (("Hi", Constraint("choice", " \n "), True, 8, 0.0, 0, 1), "no choices"),
           (("Hi", None, True, 0, 0.0, 0, 1), "Max tokens"), (("Hi", None, True, 8, 3.0, 0, 1), "Temperature"),
           (("Hi", None, True, 8, 0.0, 0, 2), "temperature above 0"), (("Hi", None, True, 8, 0.5, 0, 9), "Samples")]
    for args, match in bad:
        with pytest.raises(ValueError, match=match):
            check_settings(*args, tok)
    for message in (str(e) for e in [_error(a, tok) for a, _ in bad]):
        assert "Traceback" not in message and "\n" not in message
    runs = library(preset_settings())
    assert len({s.name for s in runs}) == 3 and runs[1].requests[0].n == 3 and len(runs[2].requests) == 3


def _error(args: tuple, tok) -> ValueError:  # noqa: ANN001
    try:
        check_settings(*args, tok)
    except ValueError as e:
        return e
    raise AssertionError(args)


def _sample(kinds: list[str]) -> dict:
    events = []
    for i, k in enumerate(kinds):
        forced = k == "forced"
        events.append({"step": i, "token": 100 + i, "kind": k, "allowed": None if forced else (1 if k == "only" else 50),
                       "chosen_prob": None if forced else 0.5, "masked_mass": None if forced else 0.25,
                       "top": [] if forced else [(100 + i, 0.5, k != "steered")], "mask_seconds": 0.0 if forced else 2e-5})
    return {"label": "r0", "status": "running", "finish_reason": "", "text": "", "events": events,
            "accepting": False, "error": "", "valid": None}


def test_summary_rows_and_charts_from_records() -> None:
    tok = default_tokenizer()
    sample = _sample(["free", "steered", "only", "forced", "forced", "free"])
    s = summarize(sample)
    assert s.tokens == 6 and s.kinds == {"free": 2, "steered": 1, "only": 1, "forced": 2} and s.masked_tokens == 4
    assert s.mean_mask_us == pytest.approx(20.0) and s.forbidden_mass == pytest.approx(0.25)
    # A slow first mask (a quarter of a second, as one sample's first took) moves the mean, not the median.
    sample["events"][0]["mask_seconds"] = 0.25
    slow = summarize(sample)
    assert slow.median_mask_seconds == pytest.approx(2e-5) and slow.slowest_mask == (0, 0.25)
    assert slow.mean_mask_us > 60_000 and slow.median_wait_seconds == pytest.approx(2e-5)
    sample["events"][0]["mask_seconds"] = 2e-5
    rows = token_rows(sample, tok)
    assert [r["tokens allowed"] for r in rows] == [50, 50, 1, None, None, 50]
    # The last mask, counted from 1; one before jump-forward tokens says how many followed it.
    assert last_mask(sample) == LastMask(50, 6, 0)
    assert last_mask(_sample(["free", "only", "forced", "forced"])) == LastMask(1, 2, 2)
    assert last_mask(_sample(["forced"])) is None
    assert rows[3]["how"] == "written by jump-forward" and rows[3]["mask (µs)"] is None
    fig = mask_figure(sample, tok.vocab_size, tok)
    assert {t.name for t in fig.data} == {"model's own choice", "steered by the mask", "the only token allowed",
                                          "written by jump-forward"}
    long = _sample(["free"] * 80)
    ticks = mask_figure(long, tok.vocab_size, tok).layout.xaxis2
    assert len(ticks.tickvals) <= MAX_TICK_LABELS and "every 5th" in ticks.title.text
    # Six short tokens lie level (a rotated "{" read as "("); 16 ticks of up to 8 characters turn.
    assert fig.layout.xaxis2.tickangle == 0 and ticks.tickangle == -60
    assert tick_angle(["{", "↵␣", '"', "name", '":']) == 0 and tick_angle(["abcdefgh"] * 12) == -60
    runs = [ModeRun(m, "{}", v, None, 10, st, 1.0, 0.001, {}, "eos") for m, v, st in
            zip(MODES[:3], (False, True, True), (10, 10, 7))]
    fig = modes_figure(runs)
    assert [x.split("<br>")[1] for x in fig.data[0].x] == ["not valid ✗", "valid ✓", "valid ✓"]
    assert modes_for(None) == () and modes_for(DATE.constraint) == MODES[:3] and modes_for(PERSON.constraint) == MODES


def test_page_steps_scrubs_and_shows_the_masks(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert any("torch" in c.value and "CPU" in c.value for c in at.caption)
    for _ in range(4):
        at.button(key=f"{PREFIX}-btn-step").click().run()
        assert_clean(at)
    session = session_of(at, PREFIX)
    view = session.records[-1].extra("constrained")["requests"]["r0"]
    events = view["samples"][0]["events"]
    assert view["constraint"]["name"] == PERSON.constraint.name and len(events) >= 3
    assert all(e["allowed"] is None or 1 <= e["allowed"] < 49152 for e in events)
    metrics = _metrics(at)
    assert int(metrics["Output tokens"]) == len(events)
    assert metrics["Allowed at the last mask"] == f"{last_mask(view['samples'][0]).allowed:,}"
    assert len(at.get("plotly_chart")) >= 1
    at.slider(key=f"{PREFIX}-scrub").set_value(1).run()
    assert_clean(at)
    assert len(session.records) == 4


def test_presets_restart_and_bad_grammars_keep_the_run(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    at.button(key=f"{PREFIX}-btn-step").click().run()
    at.selectbox(key=f"{PREFIX}-preset").set_value(SENTIMENT.name).run()
    assert_clean(at)
    session = session_of(at, PREFIX)
    assert session.records == [] and session.engine.constraint == SENTIMENT.constraint
    at.button(key=f"{PREFIX}-btn-step").click().run()
    for setup, message in [(lambda: at.text_area(key=f"{PREFIX}-spec").set_value(""), "no choices"),
                           (lambda: (at.radio(key=f"{PREFIX}-kind").set_value("regex"),
                                     at.text_area(key=f"{PREFIX}-spec").set_value("(unclosed")), "not usable"),
                           (lambda: (at.radio(key=f"{PREFIX}-kind").set_value("json_schema"),
                                     at.text_area(key=f"{PREFIX}-spec").set_value('{"type": ')), "not valid JSON")]:
        setup()
        at.button(key=SUBMIT).click().run()
        assert not at.exception
        assert any(message in e.value for e in at.error), [e.value for e in at.error]
        assert len(session_of(at, PREFIX).records) == 1  # what was computed is still there
        assert session_of(at, PREFIX).engine.constraint == SENTIMENT.constraint
    # A hand-written regex runs, and the preset picker says the run is no longer a preset.
    at.radio(key=f"{PREFIX}-kind").set_value("regex")
    at.text_area(key=f"{PREFIX}-spec").set_value("(yes|no)")
    at.number_input(key=f"{PREFIX}-max").set_value(4)
    at.button(key=SUBMIT).click().run()
    session = session_of(at, PREFIX)
    assert session.records == [] and session.engine.constraint.spec == "(yes|no)"
    assert at.selectbox(key=f"{PREFIX}-preset").value.startswith("Your own")
    at.button(key=f"{PREFIX}-btn-end").click().run()
    assert_clean(at)  # the messages went with the successful restart
    sample = session.records[-1].extra("constrained")["requests"]["r0"]["samples"][0]
    assert sample["text"] in ("yes", "no") and sample["valid"] is True


def test_comparison_runs_every_mode(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    at.selectbox(key=f"{PREFIX}-preset").set_value(SENTIMENT.name).run()
    at.button(key=f"{PREFIX}-compare").click().run()
    assert_clean(at)
    settings, runs = at.session_state[f"page-cache:{PREFIX}"]["modes"]
    assert settings.constraint == SENTIMENT.constraint and [r.mode for r in runs] == list(MODES[:3])
    masked = [r for r in runs if r.mode != MODES[0]]
    assert all(r.valid and r.text in SENTIMENT.constraint.choices() for r in masked)
    assert runs[2].steps <= runs[1].steps  # jump-forward never takes more steps
    assert any("fewer than the mask alone" in c.value for c in at.caption)


def test_every_preset_is_a_valid_constraint() -> None:
    assert len({p.name for p in PRESETS}) == len(PRESETS)
    for p in PRESETS:
        assert p.constraint.problem() is None, p.name
        assert dataclasses.replace(p.constraint, json_layout="compact").problem() is None


def test_the_free_mode_has_no_mask_time() -> None:
    """No grammar builds no mask: its row shows "–", not "0.0" ms of mask work beside the masked modes."""
    from app.analysis.constrained import mode_rows
    runs = [ModeRun(m, "{}", None, None, 4, 4, 0.1, 0.0 if m == MODES[0] else 0.002, {}, "eos") for m in MODES[:2]]
    rows = mode_rows(runs)
    assert rows[0]["mask time (ms)"] is None and rows[1]["mask time (ms)"] == 2.0
