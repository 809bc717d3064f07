"""Sections of the chunked prefill page (pages/09_chunked_prefill.py composes them)."""
from __future__ import annotations

import streamlit as st

from engine.trace import StepRecord

from app.analysis.chunked import compare_chunking, longest_prompt_request, median_gap, step_splits, worst_stall
from app.analysis.trace_metrics import cumulative_clock
from app.charts.chunked import (compare_gaps_figure, compare_steps_figure, iteration_time, token_gap_figure,
                                tokens_vs_budget)
from app.formatting import NO_VALUE, plural
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.explain import explanation
from app.widgets.request_table import request_state_table


def chunked_explanation() -> None:
    explanation(
        "Chunked prefill (SARATHI, vLLM, SGLang)",
        [r"\text{tokens}_s = \underbrace{d_s}_{\text{decodes, 1 each}} + \underbrace{c_s}_{\text{prompt chunk}}"
         r"\ \le\ \text{budget}",
         r"c_s = {\min(\text{prompt left},\ \text{budget} - d_s)}",
         r"T_s \approx T_{\text{weights}} + {\alpha \cdot \text{tokens}_s} \quad\allowbreak (\text{iteration time})",
         r"\text{gap between two tokens} = \textstyle\sum_{\text{steps between them}} T_s"],
        ["Every iteration computes at most **budget** tokens. Running requests decode first (1 token each); "
         "what is left of the budget goes to the next chunk of a waiting prompt (orange).",
         "A long prompt therefore never makes one huge iteration: the decodes keep getting a token every "
         "step, and each step stays close to the cost of a budget-sized batch.",
         "Without chunking (prefill-first) the whole prompt runs in one iteration and the decodes skip it: "
         "the other users see their text freeze for the whole prefill. Compare the worst stall below.",
         "The price: the long prompt's first token comes a few iterations later, and each chunk attends to "
         "the KV of the chunks before it (a prefill that reads the paged cache).",
         "Decode steps are memory-bound, so the decode tokens ride along almost for free in a chunk step."],
    )


def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    budget = session.engine.config.max_num_batched_tokens if session.engine else record.num_batched_tokens
    chunked = session.engine.config.chunked_prefill if session.engine else True
    worst = worst_stall(history)
    m = st.columns(5)
    # The knob's name in the help: as the label, "max_num_batched_tokens" broke at its underscore.
    m[0].metric("Token budget per step", budget, help="max_num_batched_tokens; chunked prefill "
                + ("on" if chunked else "off"))
    m[1].metric("Tokens this step", f"{record.num_batched_tokens} / {budget}",
                help=f"{record.num_prefill_tokens} prompt-chunk + {record.num_decode_tokens} decode")
    m[2].metric("Iteration time", f"{record.wall_seconds * 1e3:.0f} ms",
                help=f"forward pass {record.forward_seconds * 1e3:.0f} ms")
    median = median_gap(history)
    m[3].metric("Median time between tokens", NO_VALUE if median is None else f"{median * 1e3:.0f} ms",
                help="of the requests other than the longest prompt, up to this step")
    m[4].metric("Worst stall so far", f"{worst.gap_s * 1e3:.0f} ms" if worst else NO_VALUE,
                help=f"{worst.request_id} waited this long for its token at step {worst.step}" if worst else None)
    chunks = [s for s in record.batch if s.phase == "prefill"]
    notes = [f":material/splitscreen: **{s.request_id}** prompt chunk of {plural(s.num_tokens, 'token')} "
             f"(now {s.context_len} in its cache)" for s in chunks]
    decodes = [s.request_id for s in record.batch if s.phase == "decode"]
    if decodes:
        notes.append(f":material/arrow_forward: decoding alongside: {', '.join(decodes)}")
    stalled = [q.request_id for q in record.requests if q.status == "decode" and q.request_id not in
               {s.request_id for s in record.batch}]
    if stalled:
        notes.append(f":material/pause_circle: **stalled this step** (no token): {', '.join(stalled)}")
    if notes:
        st.markdown(" · ".join(notes))
    splits = step_splits(history)
    left, right = st.columns([1.3, 1])
    with left:
        show_figure(tokens_vs_budget(splits, budget, record.step), key="chunked-tokens", height=380,
                    export_width=850)
    with right:
        show_figure(iteration_time(splits, record.step), key="chunked-time", height=380, export_width=700)
    clock = cumulative_clock(history)
    gaps = token_gap_figure(history, session.request_order, clock[-1] if clock else None)
    show_figure(gaps, key="chunked-gaps", height=gaps.layout.height)
    st.caption("One strip per request, all on the same axes. Requests that decode in the same steps get the same "
               "gaps: an iteration made long by a prompt chunk (orange band) delays the next token of every "
               "running request at once, which is why the strips rise and fall together.")
    with st.expander("Requests at this step", expanded=False):
        request_state_table(record)


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("Chunked prefill vs prefill-first on the same requests")
    st.markdown("Two fresh engines run this scenario to the end. **Chunked**: the scenario's budget. "
                "**Prefill-first** (`chunked_prefill = False`): a whole prompt must fit one iteration, so its "
                "budget is raised to the longest prompt + its max_tokens (the engine refuses anything smaller).")
    runs = comparison_runner(
        session, page, button_label="Run both ways", button_key="chunked-compare",
        progress_text="Running with and without chunking…", step_text="Running both… step {n}", expected_steps=40,
        hint="Press **Run both ways** (two runs of the scenario; about 20–40 s on the CPU).",
        run=lambda on_progress: compare_chunking(session.scenario, shared_weights(), server_engine_settings(),
                                                 on_progress=on_progress),
        errors_of=lambda runs: (f"{r.label}: {e.message}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    on, off = runs["chunked"], runs["unchunked"]
    w_on, w_off = worst_stall(list(on.records)), worst_stall(list(off.records))
    long_id = longest_prompt_request(list(on.records))
    ttft = {k: next((q.ttft_seconds for q in r.records[-1].requests if q.request_id == long_id), -1.0)
            if r.records else -1.0 for k, r in runs.items()}
    m = st.columns(4)
    if w_on and w_off:
        m[0].metric("Worst stall, chunked", f"{w_on.gap_s * 1e3:.0f} ms",
                    delta=f"{(w_on.gap_s - w_off.gap_s) * 1e3:+.0f} ms vs prefill-first", delta_color="inverse",
                    help=f"{w_on.request_id} at step {w_on.step}")
        m[1].metric("Worst stall, prefill-first", f"{w_off.gap_s * 1e3:.0f} ms",
                    help=f"{w_off.request_id} at step {w_off.step}: the step that ran the whole prompt")
    m[2].metric(f"TTFT of {long_id}: chunked", f"{ttft['chunked'] * 1e3:.0f} ms",
                delta=f"{(ttft['chunked'] - ttft['unchunked']) * 1e3:+.0f} ms vs prefill-first",
                delta_color="inverse", help="what the long prompt pays for everyone else's smooth decode")
    m[3].metric(f"TTFT of {long_id}: prefill-first", f"{ttft['unchunked'] * 1e3:.0f} ms")
    gaps = compare_gaps_figure(runs, session.request_order)
    show_figure(gaps, key="chunked-compare-gaps", height=gaps.layout.height)
    show_figure(compare_steps_figure(runs), key="chunked-compare-steps", height=520)
    st.caption("Time is each run's own engine clock (summed step wall times). Both engines step alternately, "
               "so background load on a shared CPU falls on both; single steps can still be noisy.")
