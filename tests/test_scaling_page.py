"""The test-time compute page under AppTest (random weights, CPU): N samples stepped and scrubbed, the
budget-forcing mode, bad input as a message that keeps the run, and the accuracy-vs-N measurement;
plus the page's record-only analysis."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from engine.test_time import load_tasks
from engine.tokenizer import default_tokenizer

from app.analysis.test_time import (MAX_TEMPERATURE, answer_counts, check_settings, library, measure_setup,
                                    request_label, sample_rows, still_writing, task_settings)
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app, session_of  # noqa: F401 (fixture)

PAGE, PREFIX = "11_test_time_compute.py", "ttc"


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "test-time-compute")
    assert spec.available and spec.section == "Test-time compute"


def test_settings_are_checked_before_anything_runs() -> None:
    tok = default_tokenizer()
    ok = check_settings("What is 3 + 4?", "7", 4, 0.8, 0, 24, None, tok)
    assert ok.scenario().requests[0].n == 4 and ok.budget is None
    assert check_settings("Hi", None, 1, 0.0, 0, 8, (8, 16, 4), tok).budget.max_thinking == 16
    for args, match in [(("  ", None, 4, 0.8, 0, 24, None), "empty"), (("x" * 601, None, 4, 0.8, 0, 24, None), "600"),
                        (("Hi", None, 17, 0.8, 0, 24, None), "N must"), (("Hi", None, 4, 0.0, 0, 24, None), "temperature"),
                        (("Hi", None, 4, 0.8, 0, 24, (20, 10, 4)), "budget"),
                        (("Hi", None, 4, 2.5, 0, 24, None), "between 0 and 2,")]:
        try:
            check_settings(*args, tok)
        except ValueError as e:
            assert match in str(e), (match, e)
        else:
            raise AssertionError(f"accepted {args}")
    assert check_settings("Hi", None, 4, MAX_TEMPERATURE, 0, 24, None, tok).temperature == 2.0
    scenarios = library(task_settings(load_tasks()[0]), load_tasks())
    assert len({s.name for s in scenarios}) == len(scenarios) and scenarios[0].requests[0].n == 8


def test_page_steps_samples_and_scrubs(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert any("torch" in c.value and "CPU" in c.value for c in at.caption)  # says it runs the CPU reference path
    # The widget takes what the settings check accepts (it took 5, which the check then refused).
    temp = at.number_input(key=f"{PREFIX}-temp")
    assert (temp.min, temp.max) == (0.0, MAX_TEMPERATURE)
    for _ in range(3):
        at.button(key=f"{PREFIX}-btn-step").click().run()
        assert_clean(at)
    session = session_of(at, PREFIX)
    assert [r.step for r in session.records] == [0, 1, 2]
    metrics = _metrics(at)
    assert metrics["Samples"] == "8" and metrics["Tokens spent"] == "24" and int(metrics["Shared prompt blocks"]) >= 1
    view = session.records[-1].extra("test_time")["requests"]["q"]
    assert view["truth"] == load_tasks()[0].answer
    rows = sample_rows(view)
    assert len(rows) == 8 and all(r["tokens"] == 3 for r in rows)
    # Every sample still writes after three tokens: a vote is provisional, and the page says so.
    assert still_writing(view) == 8 and "Majority vote so far" in metrics
    assert all(r["answer"] == "–" or r["answer"].endswith(" so far") for r in rows)
    assert answer_counts(view, finished_only=True) == {}
    assert len(at.get("plotly_chart")) >= 2  # block tables and the answer votes
    at.slider(key=f"{PREFIX}-scrub").set_value(0).run()
    assert_clean(at)
    assert len(session.records) == 3


def test_bad_input_keeps_the_run_then_budget_mode_forces(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    at.button(key=f"{PREFIX}-btn-step").click().run()
    submit = f"FormSubmitter:{PREFIX}-form-Apply and restart"
    for setup, message in [(lambda: at.number_input(key=f"{PREFIX}-n").set_value(99), "N must"),
                           (lambda: at.selectbox(key=f"{PREFIX}-question").set_value(
                               "Your own question (no right answer known)"), "prompt is empty")]:
        setup()
        at.button(key=submit).click().run()
        assert not at.exception
        assert any(message in e.value for e in at.error), [e.value for e in at.error]
        assert len(session_of(at, PREFIX).records) == 1  # what was computed is still there
    at.text_input(key=f"{PREFIX}-prompt").set_value("Count to three.")
    at.number_input(key=f"{PREFIX}-n").set_value(2)
    at.radio(key=f"{PREFIX}-mode").set_value("Budget forcing (s1)")
    at.number_input(key=f"{PREFIX}-min").set_value(30)
    at.number_input(key=f"{PREFIX}-max").set_value(10)
    at.button(key=submit).click().run()
    assert any("must not exceed" in e.value for e in at.error)
    assert len(session_of(at, PREFIX).records) == 1
    at.number_input(key=f"{PREFIX}-min").set_value(2)
    at.number_input(key=f"{PREFIX}-max").set_value(4)
    at.number_input(key=f"{PREFIX}-answer").set_value(2)
    at.button(key=submit).click().run()
    assert_clean(at)
    session = session_of(at, PREFIX)
    assert session.records == [] and session.scenario.requests[0].n == 2
    at.button(key=f"{PREFIX}-btn-end").click().run()
    assert_clean(at)
    view = session.records[-1].extra("test_time")["requests"]["q"]
    for s in view["samples"]:  # random weights never end early: the cap forces the cue, then the end
        labels = {lab for _, lab in s["forced"]}
        assert labels == {"cue", "end"} and s["thinking_tokens"] == 4 and s["finish_reason"] == "eos"
    assert any(e.forced == "cue" for r in session.records for e in r.emitted)
    assert len(at.get("plotly_chart")) >= 2  # the thinking-budget chart replaces the votes


def test_measure_accuracy_vs_n(random_app: AppTest, monkeypatch) -> None:  # noqa: ANN001
    # Two questions keep it short on random weights (which never stop early); the page code is the same.
    import app.sections.test_time as section
    monkeypatch.setattr(section, "load_tasks", lambda: load_tasks()[:2])
    at = open_page(random_app, PAGE)
    at.button(key=f"{PREFIX}-measure").click().run()
    assert_clean(at)
    run = at.session_state[f"page-cache:{PREFIX}"]["accuracy"]
    assert run.n == 8 and len(run.outcomes) == 2
    # It says which set-up it measured: a fixed one, not the form's (whose changes left "Measured now" unexplained).
    measured = next(c.value for c in at.caption if c.value.startswith("Measured in this session"))
    assert measure_setup(2) in measured and "8 samples each at temperature 0.8" in measured
    # N, the tokens each point spent (the chart's x), then one column per rule
    table = next(d.value for d in at.dataframe if "tokens per question" in d.value.columns)
    assert list(table["N"]) == [1, 2, 4, 8] and list(table.columns[:2]) == ["N", "tokens per question"]
    assert table["tokens per question"].is_monotonic_increasing and "majority vote" in table.columns


def test_the_request_picker_says_what_q_and_r0_are() -> None:
    assert request_label("q") == "q: the question set in the form"
    assert request_label("r0") == "r0: added with “Add a request now”"


def test_closed_form_pass_at_n_uses_each_questions_p() -> None:
    """The thin line beside the measured oracle: 1 - (1 - p)^N averaged over questions, each with its own p;
    at N = 1 it is the single-sample accuracy, and it never falls as N grows."""
    from engine.test_time import ScoredSample, TaskOutcome, TaskSetRun, accuracy_curve

    from app.analysis.test_time import oracle_at, pass_at_n_closed_form

    def outcome(right: int, of: int) -> TaskOutcome:
        return TaskOutcome("q", "1", tuple(ScoredSample(i, "", "1" if i < right else "2", -1.0, 4, i < right)
                                           for i in range(of)))

    run = TaskSetRun((outcome(2, 8), outcome(0, 8), outcome(8, 8)), 8, 0.0, 0, 0, None)
    closed = pass_at_n_closed_form(run, (1, 2, 4, 8))
    assert closed[1] == (0.25 + 0 + 1) / 3
    assert closed[4] == (1 - 0.75 ** 4 + 0 + 1) / 3
    assert [closed[k] for k in (1, 2, 4, 8)] == sorted(closed[k] for k in (1, 2, 4, 8))
    points = accuracy_curve(run, (1, 2, 4, 8))
    assert oracle_at(points, 1) == closed[1] and oracle_at(points, 8) == 2 / 3  # the one hopeless question stays wrong


def test_votes_of_running_samples_are_drawn_apart_from_final_ones() -> None:
    from app.charts.test_time import answer_votes_figure
    fig = answer_votes_figure({"4": 3, "5": 1}, "4", finished={"4": 1})
    bars = [t for t in fig.data if t.type == "bar"]
    assert [list(b.y) for b in bars] == [[1, 0], [2, 1]] and fig.layout.barmode == "stack"
    assert bars[1].name.startswith("still writing") and fig.layout.showlegend
    final = answer_votes_figure({"4": 3}, "4")
    assert len([t for t in final.data if t.type == "bar"]) == 1 and not final.layout.showlegend


def test_a_sample_line_says_none_yet_only_while_the_sample_writes() -> None:
    from app.widgets.sample_strips import sample_head_html
    base = dict(label="q#0", answer=None, correct=None, mean_logprob=-1.5, num_tokens=12)
    assert "answer <b>none yet</b> ·" in sample_head_html({**base, "finish_reason": ""}, [])
    done = sample_head_html({**base, "finish_reason": "stop"}, [])
    assert "answer <b>none</b> ·" in done and "✗" not in done  # no number written: nothing to mark
    running = sample_head_html({**base, "answer": "7", "correct": True, "finish_reason": ""}, ["majority vote"])
    assert "<b>7</b> so far ✓" in running and running.endswith("picked by majority vote")
