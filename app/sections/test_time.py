"""Sections of the test-time compute page (pages/11_test_time_compute.py composes them)."""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import streamlit as st

from engine.config import EngineConfig
from engine.test_time import RULES, TestTimeEngine, accuracy_curve, load_tasks, run_task_set, single_sample_accuracy
from engine.test_time.tasks import answer_key
from engine.trace import StepRecord

from app.analysis.test_time import (ENGINE, MAX_SAMPLES, MAX_TEMPERATURE, MEASURE_MAX_TOKENS, MEASURE_N,
                                    MEASURE_TEMPERATURE, MODES, RunSettings, answer_counts, check_settings,
                                    load_bench, measure_setup, oracle_at, pass_at_n_closed_form, picks_by_sample,
                                    request_label, request_view, sample_rows, still_writing, task_settings)
from app.charts.block_tables import block_table_grid
from app.charts.test_time import answer_votes_figure, scaling_curve_figure, thinking_budget_figure
from app.formatting import fmt_duration, plural, step_line
from app.session import EngineSession
from app.state import page_cache, page_settings
from app.table_columns import column_px
from app.theme import show_figure
from app.widgets.controls import restart_with
from app.widgets.explain import explanation
from app.widgets.sample_strips import sample_strips

OWN = "Your own question (no right answer known)"
# Budget forcing's scoring rule, said once for the explanation and beside the samples.
ANSWER_RULE = ("Under budget forcing the answer is read only from what follows the cue “Final answer:”: a number "
               "in the thinking never counts. A sample still thinking has none yet, and one whose answer tokens ran "
               "out before a number (or before an expression's result, as in “3 + 4 equals”) has none.")


def default_settings() -> RunSettings:
    return task_settings(load_tasks()[0])


def engine_factory(settings: RunSettings) -> Callable[[EngineConfig, Any], TestTimeEngine]:
    """What the page's EngineSession builds: a TestTimeEngine with this run's budget, which knows the right
    answer of every task-set question (whatever request asks it: the form, the editor, a live request)."""
    answers = answer_key(load_tasks())
    return lambda config, weights: TestTimeEngine(config, weights, budget=settings.budget, answers=answers)


def current_settings(page: str) -> RunSettings:
    return page_settings(page, default_settings)


def test_time_explanation() -> None:
    explanation(
        "Inference-time compute scaling (best-of-N, self-consistency, s1 budget forcing)",
        [r"\text{pass@}N = 1 - {(1 - p)}^N",
         r"\hat{y}_{\text{maj}} = \arg\max_{y} \textstyle\sum_{i=1}^{N} [\,y_i = y\,]",
         r"\text{self-certainty}(s) = \tfrac{1}{|s|} \textstyle\sum_{i} \log p_\theta(s_i \mid s_{<i})",
         r"\text{cost} \approx N \cdot \bar{n}_{\text{out}} \text{ decode tokens}",
         r"n_{\text{think}} < n_{\min}:\ \langle\text{end}\rangle \to \text{“Wait,”}",
         r"n_{\min} \le n_{\text{think}} < n_{\max}:\ \langle\text{end}\rangle \to \text{“Final answer:”}",
         r"n_{\text{think}} = n_{\max}:\ \text{append “Final answer:”}"],
        ["**Best-of-N**: one request with `n = N`. The prompt is computed once; all N samples share its KV blocks "
         "(yellow in the block tables) and each writes its own tokens into blocks of its own (copy-on-write of the "
         "partly filled last prompt block).",
         "Three ways to choose: **majority vote** over the final answers (self-consistency), **self-certainty** "
         "(the sample the model itself found most likely: its mean token log-probability), and an **oracle** that "
         "knows the answer (pass@N: the ceiling a perfect verifier would reach).",
         "Self-certainty stands in for the seed's **process reward model**: no reward model is available "
         "here, so the model grades its own samples. Whether that helps is measured below, not assumed.",
         "**Budget forcing** (s1): an end of turn sampled before the minimum thinking budget is dropped and "
         "“ Wait,” written instead (orange). One sampled at or past the minimum is replaced by the answer cue "
         "“Final answer:” (green), so the model answers instead of stopping; a sample still thinking at the "
         "maximum gets the cue appended. After the cue it has the answer tokens, then the engine ends the turn. "
         "Forced tokens are computed by the next step like a small prefill chunk. " + ANSWER_RULE,
         "**Measure accuracy vs N** runs the whole task set on the real engine and draws the test-time scaling "
         "curve: accuracy against the tokens spent."],
        note="pass@N is what an oracle verifier reaches with N independent samples, each right with probability "
             "p; the prompt's KV is computed once whatever N is. Log-probabilities are of the model's own "
             "distribution (softmax of the logits at temperature 1), recorded by the engine as each token is sampled.",
    )


# ---- settings ------------------------------------------------------------------------------------

def _apply(session: EngineSession, page: str) -> None:
    ss = st.session_state
    session.clear_input_errors()
    question = ss.get(f"{page}-question")
    tasks = {t.text: t for t in load_tasks()}
    own = question == OWN
    prompt = ss.get(f"{page}-prompt", "") if own else question
    answer = None if own else tasks[question].answer
    budget = None
    if ss.get(f"{page}-mode") == MODES[1]:
        budget = (int(ss.get(f"{page}-min", 0)), int(ss.get(f"{page}-max", 0)), int(ss.get(f"{page}-answer", 0)))
    try:
        settings = check_settings(prompt or "", answer, int(ss.get(f"{page}-n", 0)), float(ss.get(f"{page}-temp", 0.8)),
                                  int(ss.get(f"{page}-seed", 0)), int(ss.get(f"{page}-max-tokens", 24)), budget,
                                  session.weights.tokenizer)
    except ValueError as e:
        session.report(f"Run not started: {e} The run shown below is unchanged.")
        return
    restart_with(session, page, settings, engine_factory)


def settings_form(session: EngineSession, page: str) -> None:
    s = current_settings(page)
    questions = [t.text for t in load_tasks()] + [OWN]
    with st.expander(":material/tune: Question, N and thinking budget", expanded=True):
        with st.form(f"{page}-form", border=False):
            c = st.columns([1.4, 2.6])
            c[0].radio("Mode", MODES, index=1 if s.budget else 0, key=f"{page}-mode")
            c[1].selectbox("Question (from the task set, right answer known)", questions,
                           index=questions.index(s.prompt) if s.prompt in questions else len(questions) - 1,
                           key=f"{page}-question")
            c[1].text_input("Your own question (used when “Your own question” is picked)",
                            value="" if s.prompt in questions else s.prompt, key=f"{page}-prompt")
            # Two rows of four: seven knobs in one row wrapped their labels at 1280 pixels.
            k = st.columns(4)
            k[0].number_input("N samples", value=s.n, step=1, key=f"{page}-n", help=f"1 to {MAX_SAMPLES}")
            k[1].number_input("Temperature", min_value=0.0, max_value=MAX_TEMPERATURE, value=s.temperature,
                              step=0.1, key=f"{page}-temp", help=f"0 (greedy) to {MAX_TEMPERATURE:g}")
            k[2].number_input("Seed", value=s.seed, step=1, key=f"{page}-seed")
            k[3].number_input("Max tokens", value=s.max_tokens, step=4, key=f"{page}-max-tokens",
                              help="best-of-N: tokens per sample (budget forcing sets its own)")
            b = s.budget
            k = st.columns(4)
            k[0].number_input("Min thinking", value=b.min_thinking if b else 24, step=4, key=f"{page}-min",
                              help="budget forcing: an end of turn before this many thinking tokens becomes "
                                   "“ Wait,”; one at or after it becomes the answer cue")
            k[1].number_input("Max thinking", value=b.max_thinking if b else 48, step=4, key=f"{page}-max",
                              help="budget forcing: at this many thinking tokens the answer cue is appended")
            k[2].number_input("Answer tokens", value=b.answer_tokens if b else 6, step=1, key=f"{page}-answer",
                              help="budget forcing: tokens allowed after the cue, then the engine ends the turn")
            st.form_submit_button("Apply and restart", icon=":material/restart_alt:", on_click=_apply,
                                  args=(session, page))


# ---- the selected step ---------------------------------------------------------------------------

def _batch_line(record: StepRecord) -> str:
    if not record.batch:
        return f"Step {record.step}: nothing to compute."
    parts = []
    for b in record.batch:
        what = "prompt" if b.context_len - b.num_tokens == 0 else ("forced text + last token" if b.num_tokens > 1
                                                                  else "decode")
        parts.append(f"{b.request_id}: {plural(b.num_tokens, 'token')} ({what})")
    forced = [e for e in record.emitted if e.forced]
    tail = (f" · forced this step: {', '.join(sorted({e.request_id + ' ' + e.forced for e in forced}))}"
            if forced else "")
    return step_line(record, parts, tail)


def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord], page: str) -> None:
    extra = record.extra("test_time") or {}
    ids = list(extra.get("requests", {}))
    if not ids:
        st.caption("No request yet.")
        return
    rid = (st.selectbox("Request to show", ids, format_func=request_label, key=f"{page}-request",
                        help="q is the run the form above starts; r0, r1, … are requests added with “Add a request "
                             "now”, numbered as they arrived")
           if len(ids) > 1 else ids[0])
    view = request_view(extra, rid)
    samples = view["samples"]
    prev_view = request_view(history[-2].extra("test_time"), rid) if len(history) > 1 else None
    previous = {s["label"]: len(s["token_ids"]) for s in prev_view["samples"]} if prev_view else {}
    counts = answer_counts(view)
    picks = view["picks"]
    shared = max((s["shared_blocks"] for s in samples), default=0)
    m = st.columns(6)
    m[0].metric("Samples", len(samples), help="one request with n = N: the samples share its prompt")
    m[1].metric("Tokens spent", sum(s["num_tokens"] for s in samples),
                help="output tokens of all samples so far (forced ones included): the test-time compute")
    m[2].metric("Shared prompt blocks", shared, help="blocks every sample's table points at (ref count > 1)")
    m[3].metric("Distinct answers", len(counts), help="different final answers among the samples so far")

    def _answer(idx: int | None) -> str:
        return "–" if idx is None or samples[idx]["answer"] is None else samples[idx]["answer"]

    writing = still_writing(view)
    so_far = (f" so far ({writing} of {len(samples)} still writing: each counts the answer in its text so far, "
              "which may change; final once all have ended)") if writing else ""
    top = max(counts.values(), default=0)
    tied = sum(c == top for c in counts.values())
    # A tie is decided by the order the answers first appeared (engine/test_time/answers.py): said, or a 1-1
    # vote read as a win.
    m[4].metric("Majority vote" + (" so far" if writing else ""), _answer(picks["majority"]),
                delta=f"{tied}-way tie: first answer wins" if tied > 1 else None,
                delta_color="off", delta_arrow="off",
                help="the most frequent final answer (self-consistency); on a tie, the one that appeared in the "
                     "lowest-numbered sample" + so_far)
    m[5].metric("Self-certainty pick" + (" so far" if writing else ""), _answer(picks["self_certainty"]),
                help="the answer of the sample with the highest mean log-probability among those that have an "
                     "answer (one without a number cannot be picked)" + so_far)
    truth = view["truth"]
    if truth is not None:
        right = {k: (v is not None and samples[v]["correct"]) for k, v in picks.items()}
        st.markdown(f"Right answer **{truth}** · {'so far: ' if writing else ''}majority vote "
                    f"{'✓' if right['majority'] else '✗'} · "
                    f"self-certainty {'✓' if right['self_certainty'] else '✗'} · oracle (any sample right) "
                    f"{'✓' if right['oracle'] else '✗'}")
    st.markdown(_batch_line(record))
    sample_strips(samples, previous, picks_by_sample(view), session.weights.tokenizer)
    if view["budget"]:
        st.caption(ANSWER_RULE)
    left, right = st.columns(2)
    with left:
        show_figure(block_table_grid(record, session.request_order), key="ttc-block-tables", height=360,
                    export_width=700)
    with right:
        if view["budget"]:
            show_figure(thinking_budget_figure(samples, view["budget"]), key="ttc-budget", height=360,
                        export_width=700)
        else:
            show_figure(answer_votes_figure(counts, truth, answer_counts(view, finished_only=True)), key="ttc-votes",
                        height=360, export_width=700)
    text, num = st.column_config.TextColumn, st.column_config.NumberColumn
    # Set widths, so that "picked by" keeps room for all three rules ("majority vote, self-certainty, oracle")
    # instead of an even share of the row that cut it after the first; each the least its header and cells need
    # ("120 so far", "aborted"), as at 1024 pixels with the sidebar open (a 690-pixel page) the nine took 796.
    st.dataframe(pd.DataFrame(sample_rows(view)), hide_index=True, width="stretch", column_config={
        "sample": text(width=54), "status": text(width=58, help="running, or why it ended"),
        "answer": text(width=68, help="the final answer parsed from its text"),
        "right?": text(width=46, help="against the task's known answer"),
        "mean log p": num(format="%.3f", width=76, help="mean log-probability of its tokens: the self-certainty score"),
        "tokens": num(width=52), "forced": num(width=50, help="tokens the engine forced (budget forcing)"),
        "blocks (shared + own)": text("blocks", width=52, help="KV blocks: shared with the other samples + its own"),
        # A quarter wider in presentation mode (column_px): there "oracle" was cut.
        "picked by": text(width=column_px(214), help="the rules that pick this sample's answer"),
    })


# ---- accuracy vs N -------------------------------------------------------------------------------

def _measure(session: EngineSession, page: str) -> None:
    config = EngineConfig(**{**ENGINE, "num_blocks": 1024, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                             "profile_kernels": False, "trace_detail": "light"}, **session.server)
    try:
        run = run_task_set(load_tasks(), MEASURE_N, weights=session.weights, temperature=MEASURE_TEMPERATURE,
                           max_tokens=MEASURE_MAX_TOKENS, config=config)
    except Exception as e:  # noqa: BLE001 (a failed measurement is a message; the page and its run stay)
        session.report(f"Measuring accuracy vs N failed: {type(e).__name__}: {e}")
        return
    page_cache(page)["accuracy"] = run


def accuracy_section(session: EngineSession, page: str) -> None:
    st.subheader("Accuracy vs N: the test-time scaling curve")
    tasks = load_tasks()
    st.caption(f"{measure_setup(len(tasks))} (one request with n = {MEASURE_N} per question, all in one "
               f"continuous batch of {len(tasks) * MEASURE_N} sequences), whatever the form above is set to: the "
               "curve is the task set's. N = 1, 2, 4 reuse those samples in disjoint groups, so every point is an "
               "average, not one lucky draw. About ten seconds on 2 CPU cores.")
    st.button("Measure accuracy vs N", key=f"{page}-measure", icon=":material/query_stats:", on_click=_measure,
              args=(session, page))
    run = page_cache(page).get("accuracy")
    if run is None:
        st.caption("Not measured yet in this session.")
    else:
        points = accuracy_curve(run, (1, 2, 4, 8))
        closed = pass_at_n_closed_form(run, (1, 2, 4, 8))
        show_figure(scaling_curve_figure(points, closed_form=closed), key="ttc-scaling", height=400)
        table = pd.DataFrame([{"N": p.k, "rule": p.rule, "accuracy (%)": 100 * p.accuracy,
                               "tokens per question": p.tokens_per_question} for p in points])
        # In the legend's order (a pivot sorts its columns by name, putting the oracle between the other two).
        rules = [r for r in RULES if r in set(table["rule"])]
        wide = table.pivot(index="N", columns="rule", values="accuracy (%)").reset_index()[["N", *rules]]
        # The x axis of the chart: every rule reads the same N samples, so one token count per N.
        wide.insert(1, "tokens per question", table.groupby("N")["tokens per question"].first().to_numpy())
        st.dataframe(wide, hide_index=True, width="stretch", column_config={
            "tokens per question": st.column_config.NumberColumn(format="%.0f"),
            **{r: st.column_config.NumberColumn(format="%.1f%%", help="questions right") for r in rules}})
        best = max(points, key=lambda p: p.accuracy if p.rule != "oracle (pass@N)" else -1)
        st.caption(f"Measured in this session on the set-up above ({measure_setup(len(run.outcomes))}; the form's "
                   f"settings do not change it): {fmt_duration(run.wall_seconds)}, {run.steps} engine steps, "
                   f"{run.tokens_computed:,} tokens computed; one sample is right "
                   f"{100 * single_sample_accuracy(run):.0f} % "
                   f"of the time; the best real rule here is {best.rule} at N = {best.k} "
                   f"({100 * best.accuracy:.0f} %). The oracle line is what a perfect verifier would reach; the "
                   f"thin line is the panel's 1 − (1 − p)^N with each question's p measured here "
                   f"({100 * closed[8]:.0f} % at N = 8 against {100 * oracle_at(points, 8):.0f} % measured: the "
                   f"formula draws with replacement, the groups here without, so at N = 8 the oracle is right "
                   f"wherever any of a question's 8 samples is).")
    bench = load_bench()
    if bench and bench.get("budget"):
        with st.expander(":material/table_chart: Benchmark on this machine: accuracy vs thinking budget "
                         "(bench/test_time_compute.py)"):
            st.dataframe(pd.DataFrame(bench["budget"]), hide_index=True, width="stretch")
            st.caption(bench.get("note", ""))
