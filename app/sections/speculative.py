"""Sections of the speculative decoding page (pages/07_speculative_decoding.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.trace import StepRecord

from app.analysis.speculative import (ALL_DRAFTERS_BENCH, BENCH_COMMAND, DRAFTER_LABELS, bench_c, bench_drafter_label,
                                      bench_rows, bench_setup, chain_rows, closed_form_caption, compare_drafters,
                                      cost_options, current_gamma, expected_tokens_per_pass, load_bench, measured_c,
                                      other_bench_note, predicted_speedup, round_sentence, rule_caption, spec_series,
                                      speedup_vs_plain, step_rounds, step_skipped)
from app.charts.speculative import (acceptance_figure, bench_figure, closed_form_figure, compare_figure,
                                    round_figure, time_split_figure)
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.state import page_cache
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.decoding_mode import DECODING_MODES, apply_decoding_mode, default_mode_index
from app.widgets.explain import explanation
from app.widgets.request_editor import load_scenario
from app.widgets.request_table import request_state_table
from app.widgets.round_picker import latest_rounds, pick_round
from app.widgets.spec_metrics import drafting_time_metric, step_tokens_metric

SKIP_REASONS = {"no_match": "prompt lookup found no earlier occurrence of the last tokens",
                "no_free_blocks": "no KV room for a draft", "token_budget": "the step's token budget ran out"}


def speculative_explanation() -> None:
    explanation(
        "Speculative sampling (Leviathan et al. 2023; Chen et al. 2023)",
        [r"\text{keep draft } x_i \sim q \ \text{ iff }\ u_i < \min\!\Big(1, \tfrac{p(x_i)}{q(x_i)}\Big),"
         r"\quad\allowbreak u_i \sim U[0, 1)",
         r"\text{first rejection: } x \sim \frac{\max(0,\ p - q)}{\sum_x \max(0,\ p(x) - q(x))}",
         r"\text{all kept: a bonus token } x \sim p \text{ from the last row}",
         r"\mathbb{E}[\text{tokens per target pass}] = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}",
         r"{\text{speedup} = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}},\quad\allowbreak "
         r"{c = \frac{\text{cost of one draft}}{\text{cost of one target pass}}}"],
        ["A cheap **drafter** proposes γ tokens; the **target** scores all of them in **one** pass (1 + γ rows "
         "instead of 1). Decode is memory-bound, so that pass costs about as much as a normal one.",
         "Drafts are checked left to right: **green** kept, the first **red** one rejected and replaced "
         "(orange), the rest **grey** (never checked). If all survive, the last row gives a **bonus** token "
         "(blue): a round always emits at least one token, at most γ + 1.",
         "The rule keeps the output distributed **exactly** as the target's p: greedy runs emit the very "
         "tokens plain greedy decoding emits (the comparison below checks it).",
         "The KV slots of rejected drafts were written by the verification pass and are **rolled back** (✕).",
         "**Prompt lookup** (n-gram) copies what followed the last few tokens earlier in the text: c ≈ 0, "
         "α high when the answer repeats the prompt (copy-edit, summarise), near useless in open chat. "
         "**Early exit** (the target's first layers) costs c ≈ 0.6 with 16 of the 30 and agrees rarely on a "
         "135M model. The **distilled draft model** (2 layers trained here to imitate the target, sharing its "
         "embeddings) is cheaper (c ≈ 0.1 to 0.2) but agrees rarely too (α ≈ 0.13 in the benchmark below), so on "
         "this CPU it stays a little slower than plain decoding. How often each agrees depends on the text: the "
         "benchmark table below measures α over several prompts; one short scenario can make two drafters look "
         "alike, or rank them the other way."],
        note="α is measured like the benchmark: accepted / (accepted + rejections), the per-draft acceptance "
             "probability of the i.i.d. model.",
    )


# ---- controls ------------------------------------------------------------------------------------

def spec_controls(session: EngineSession, page: str) -> None:
    """Drafter, γ, draft layers and greedy/sampled for every request, applied by restarting the engine."""
    cfg = session.scenario.engine_config()
    with st.form(key=f"{page}-spec-form", border=True):
        # The button has its own row: in a sixth of the row its text was cut ("Apply an…") at 1280 px,
        # and on a projector the enlarged labels squeezed every knob.
        c = st.columns([1.6, 1.3, 1.2, 1.9], vertical_alignment="bottom")
        drafters = ["ngram", "early_exit", "draft_model", "none"]
        drafter = c[0].selectbox("Drafter", drafters,
                                 index=drafters.index(cfg.spec_drafter) if cfg.spec_drafter in drafters else 0,
                                 format_func=lambda d: DRAFTER_LABELS[d] if d != "none" else "none (plain decoding)",
                                 key=f"{page}-spec-drafter")
        gamma = c[1].slider("γ (drafts per round)", 1, 8, max(1, min(cfg.spec_gamma, 8)), key=f"{page}-spec-gamma")
        layers = c[2].number_input("Early-exit layers (of 30)", 1, 29, min(cfg.spec_draft_layers, 29),
                                   key=f"{page}-spec-layers")
        mode = c[3].selectbox("Decoding (all requests)", DECODING_MODES, index=default_mode_index(session.scenario),
                              key=f"{page}-spec-mode")
        applied = st.form_submit_button("Apply and restart", icon=":material/restart_alt:", type="primary")
    if applied:
        scenario = session.scenario.with_engine(spec_drafter=drafter, spec_gamma=int(gamma),
                                                spec_draft_layers=int(layers))
        scenario = apply_decoding_mode(scenario, mode)
        if load_scenario(session, page, scenario):
            st.rerun()


# ---- the selected step -----------------------------------------------------------------------------

def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord], page: str) -> None:
    cfg = session.engine.config if session.engine else session.scenario.engine_config()
    series = spec_series(history)
    last = series[-1] if series else None
    rounds = step_rounds(record)
    m = st.columns(5)
    short = {"ngram": "n-gram", "early_exit": "early exit", "draft_model": "draft model", "none": "none"}
    # Values stay short (one line in a fifth of a 1600 px page); the detail goes in the grey delta chip.
    drafting = cfg.spec_drafter != "none"
    layers = f" · {cfg.spec_draft_layers} layers" if cfg.spec_drafter == "early_exit" else ""
    m[0].metric("Drafter", short.get(cfg.spec_drafter, cfg.spec_drafter),
                delta=f"γ {cfg.spec_gamma}{layers}" if drafting else None, delta_color="off", delta_arrow="off",
                help=(f"γ = {cfg.spec_gamma} drafts per round" + (f", the first {cfg.spec_draft_layers} of 30 layers"
                                                                  if layers else "")) if drafting else None)
    m[1].metric("α so far", f"{last.alpha:.2f}" if last and last.alpha is not None else "–",
                help=f"accepted {last.accepted} / (accepted + {last.rejected_rounds} rejections); "
                     f"{last.drafted} drafted" if last else None)
    # Labels fit one line in a fifth of a 1280 px projector page in presentation mode (~18 characters).
    m[2].metric("Tokens per pass", f"{last.tokens_per_pass:.2f}" if last and last.tokens_per_pass else "–",
                help="decode tokens emitted / target-model decode passes, per request (plain decoding: 1.00)")
    drafting_time_metric(m[3], sum(p.draft_seconds for p in series), sum(p.verify_seconds for p in series),
                         "summed over the steps so far: the drafter's time, and the verification passes + rule")
    step_tokens_metric(m[4], len(record.emitted), len(rounds), record.wall_seconds, "speculative rounds")
    if cfg.spec_drafter == "none":
        st.info("Plain decoding (no drafter): pick a drafter above to see verification rounds.",
                icon=":material/info:")
    elif cfg.spec_drafter in ("medusa", "eagle"):
        st.info("Medusa and EAGLE draft trees, not chains: their rounds are drawn on the **Medusa and EAGLE** "
                "page.", icon=":material/park:")
    notes = [f":material/block: **{s['request_id']}** decoded plainly (γ {s['gamma']}): "
             f"{SKIP_REASONS.get(s['reason'], s['reason'])}" for s in step_skipped(record)]
    prefill = [s.request_id for s in record.batch if s.phase == "prefill"]
    if prefill:
        notes.append(f":material/input: prefill this step (no drafts yet): {', '.join(prefill)}")
    if notes:
        st.markdown(" · ".join(notes))
    rounds, shown_step = latest_rounds(record, history, step_rounds, "verification round")
    if rounds:
        chosen = pick_round(rounds, [r.request_id for r in rounds], f"{page}-round-pick", "Round of request")
        st.markdown(round_sentence(chosen))
        show_figure(round_figure(chosen, f"Step {shown_step} · {chosen.request_id}: the verification round at "
                                         f"position {chosen['position']} ({chosen['mode']})"),
                    key=f"{page}-round", height=520)
        st.caption(rule_caption(chosen))
    else:
        st.caption("No verification round yet: step on (or scrub forward) to a decode step.")
    left, right = st.columns([1.3, 1])
    with left:
        show_figure(acceptance_figure(series, record.step), key=f"{page}-acceptance", height=380, export_width=850)
    with right:
        show_figure(time_split_figure(series, record.step), key=f"{page}-times", height=380, export_width=700)
    with st.expander("Requests at this step", expanded=False):
        request_state_table(record)


def closed_form_section(session: EngineSession, history: list[StepRecord], page: str) -> None:
    st.subheader("The closed form vs this run")
    cfg = session.engine.config if session.engine else session.scenario.engine_config()
    series = spec_series(history)
    last = series[-1] if series else None
    alpha = last.alpha if last and last.alpha is not None else None
    bench = load_bench()
    c_live = measured_c(history)
    c_bench = bench_c(bench, cfg.spec_drafter)
    options = cost_options(c_live, bench, cfg.spec_drafter, cfg.spec_draft_layers)
    # The engine's γ: the last round of a request can draft fewer (capped by its max_tokens), which made the
    # prediction jump to "γ = 3" after Run to end in a γ = 4 scenario.
    gamma = cfg.spec_gamma if cfg.spec_gamma > 0 else current_gamma(history, cfg.spec_gamma)
    left, right = st.columns([1, 2.6], vertical_alignment="top")
    with left:
        alpha_src = "measured"
        if alpha is None:
            alpha_src = "assumed (no round yet)"
            alpha = 0.7
        start = float(round(min(alpha, 0.99), 2))
        alpha = st.slider("α (override to explore)", 0.0, 0.99, start, 0.01, key=f"{page}-alpha-{round(alpha, 2)}",
                          help=f"starts at the {alpha_src} α of this run up to the selected step")
        legend_src = "assumed" if alpha_src != "measured" else ("chosen" if abs(alpha - start) > 0.005 else "measured")
        if options:
            # Keyed by the choices offered: when this run's own c appears (or the benchmark's drops out as another
            # drafter's), the choice starts again at the preferred one instead of keeping an older pick.
            labels = [o.source for o in options]
            src = st.radio("c (draft cost / target pass cost)", labels,
                           key=f"{page}-c-src-{'-'.join(o.source.split()[-1] for o in options)}")
            chosen = options[labels.index(src)]
            c, why = chosen.value, f"{chosen.source}: {chosen.why}"
        else:
            c, why = 0.0, "assumed: no round yet and no benchmark row for this drafter"
        st.markdown(f"**c = {c:.3g}** ({why})  \n"
                    f"c this run: {'–' if c_live is None else f'{c_live:.3g}'} · "
                    f"benchmark mean for {bench_drafter_label(bench, cfg.spec_drafter)}: "
                    f"{'–' if c_bench is None else f'{c_bench:.3g}'}")
        st.caption("This run's c = (draft seconds / drafted tokens) / (verify seconds / verifying steps). "
                   "The verify time here includes the 1 + γ rows of the pass, so it is a little above a plain "
                   "decode pass (the benchmark's v).")
        st.metric(f"Predicted at γ = {gamma}", f"{expected_tokens_per_pass(alpha, gamma):.2f} tok/pass",
                  delta=f"{predicted_speedup(alpha, gamma, c):.2f}× speedup", delta_color="off",
                  delta_arrow="off")
    with right:
        stored = page_cache(page).get("compare")
        measured_sp = None
        if stored and stored[0] == session.scenario.to_json() and cfg.spec_drafter in stored[1]:
            measured_sp = speedup_vs_plain(stored[1], cfg.spec_drafter)
        show_figure(closed_form_figure(alpha, gamma, c, last.tokens_per_pass if last and last.rounds else None,
                                       measured_sp, alpha_source=legend_src),
                    key=f"{page}-closed-form", height=430, export_width=1000)
    st.caption(closed_form_caption(cfg.spec_drafter))


def bench_section() -> None:
    bench = load_bench()
    with st.expander(":material/table_chart: The CPU benchmark: bench/results/spec_cpu.json (measured vs predicted)",
                     expanded=True):
        if not bench:
            st.caption(f"No benchmark file: run `{BENCH_COMMAND}`.")
            return
        st.caption(f"`{bench.get('command', 'bench/spec.py')}` · {bench.get('model')} on {bench.get('device')}, "
                   f"greedy, batch 1: {bench_setup(bench)}; early exit = first {bench.get('draft_layers')} of 30 layers"
                   + (", distilled draft model = 2 layers of its own" if any(
                       r["drafter"] == "draft_model" for r in bench.get("rows", [])) else "")
                   + ". c measured per drafted token; v = verification pass / plain pass.")
        show_figure(bench_figure(bench), key="spec-bench", height=420)
        df = pd.DataFrame(bench_rows(bench))
        # A column of ticks says one thing when every row has one: the caption says it, and the eleven columns
        # of a 1024-pixel page with the sidebar open become ten, which fit without scrolling sideways.
        all_same = bool(df["same tokens as plain"].all()) if len(df) else False
        if all_same:
            df = df.drop(columns="same tokens as plain")
        # Short headers, explained in the caption: all eleven columns fit in the expander on a projector.
        num = st.column_config.NumberColumn
        # Every row in sight (at the default height the last rows scrolled out, one cut in half).
        st.dataframe(df, hide_index=True, width="stretch", height="content", column_config={
            "workload": st.column_config.TextColumn(width=64),
            "drafter": st.column_config.TextColumn(width=150),
            "γ": num(width=34), "α": num(format="%.2f", width=44, help="measured acceptance rate"),
            "tokens/pass measured": num("τ", format="%.2f", width=44, help="tokens per verification pass, measured"),
            "tokens/pass predicted": num("τ formula", format="%.2f", width=70,
                                         help="(1 − α^(γ+1)) / (1 − α) with the measured α"),
            # Two significant digits (analysis.speculative.cost_text): "%.3f" printed prompt lookup's 7e-5 as
            # "0.000", which reads as free.
            "c": st.column_config.TextColumn(width=58, alignment="right", help=(
                "the cost of drafting one token, in target passes (prompt lookup's, a dictionary lookup, is "
                "around 1e-4)")),
            "speedup measured": num("speedup", format="%.2f", width=66, help="measured, vs plain decoding"),
            "speedup predicted": num("formula", format="%.2f", width=62,
                                     help="the closed form with the measured α and c, verification free"),
            "predicted with measured v": num("with v", format="%.2f", width=56,
                                             help="the closed form with the verification pass's measured cost v"),
            "same tokens as plain": st.column_config.CheckboxColumn("same", width=50,
                                                                    help="the same tokens as plain decoding"),
        })
        below = [r["v"] for r in chain_rows(bench) if r.get("v") is not None and r["v"] < 1]
        noise = (f" Where the measured v is below 1 ({min(below):.2f} to {max(below):.2f}), \"with v\" reads above "
                 "\"formula\": that is timing noise, since a pass over more tokens costs no less than a plain one."
                 if below else "")
        st.caption("τ: tokens per verification pass, measured and by the closed form; speedup: measured, by the "
                   "closed form, and by the closed form with the verification pass's measured cost v; "
                   + ("every row produced the same tokens as plain decoding." if all_same else
                      "same: identical tokens to plain decoding.") + noise
                   + other_bench_note(bench, load_bench(ALL_DRAFTERS_BENCH),
                                      f"The Medusa and EAGLE page's table (bench/results/{ALL_DRAFTERS_BENCH.name})"))


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("Drafters compared on the same requests")
    cfg = session.scenario.engine_config()
    st.markdown(f"Fresh engines run this scenario to the end: **plain decoding**, **prompt lookup**, "
                f"**early exit** ({cfg.spec_draft_layers} layers) and the **distilled draft model**, each with "
                f"γ = {cfg.spec_gamma or 4}. Load the "
                "*copy-edit* scenario and then the *open chat* one to see where n-gram lookup shines and where "
                "it does not.")
    runs = comparison_runner(
        session, page, button_label="Run all drafters", button_key="spec-compare",
        progress_text="Running plain, prompt lookup, early exit and the draft model…",
        step_text="Running every drafter… round {n}",
        expected_steps=50, hint="Press **Run all drafters** (one run of the scenario each; about 30–120 s on the CPU).",
        run=lambda on_progress: compare_drafters(session.scenario, shared_weights(), server_engine_settings(),
                                                 on_progress=on_progress),
        errors_of=lambda runs: (f"{r.label}: {e.message}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    m = st.columns(len(runs))
    plain_texts = dict(runs["plain"].texts)
    for col, (k, r) in zip(m, runs.items()):
        sp = speedup_vs_plain(runs, k)
        same = dict(r.texts) == plain_texts
        col.metric(r.label, f"{sp:.2f}×" if sp else "–",
                   delta=None if k == "plain" else f"α {r.alpha:.2f} · {r.tokens_per_pass:.2f} tok/pass"
                   if r.alpha is not None else f"{r.tokens_per_pass:.2f} tok/pass",
                   delta_color="off", delta_arrow="off",
                   help=f"decode time per token {r.decode_seconds_per_token * 1e3:.0f} ms; "
                        f"{len(r.records)} steps" if r.decode_seconds_per_token else None)
        if k != "plain":
            greedy = all(s.temperature == 0 for s in session.scenario.requests)
            col.caption(("same text as plain decoding ✓" if same else "text differs from plain")
                        + ("" if greedy else " (sampled: the same distribution, not the same draws)"))
    show_figure(compare_figure(runs), key="spec-compare-bars", height=380)
    st.caption("Speedup = plain's decode time per token / this run's (steps with a prefill left out: they are "
               "the same for all of them). The engines step alternately, so background load on a shared CPU falls "
               "on all of them; single runs are still noisy.")
