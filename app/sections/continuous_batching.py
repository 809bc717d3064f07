"""Sections of the continuous batching page (pages/04_continuous_batching.py composes them)."""
from __future__ import annotations

import statistics

import streamlit as st

from engine.trace import StepRecord

from app.analysis.policy_compare import compare_policies
from app.analysis.trace_metrics import request_latencies, throughput
from app.charts.batching import batch_at_step, batch_over_steps
from app.charts.gantt import gantt
from app.charts.latency import latency_comparison
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.explain import explanation
from app.widgets.request_table import request_state_table


def batching_explanation() -> None:
    explanation(
        "Iteration-level scheduling (Orca, vLLM)",
        [r"\text{tokens}_s = \underbrace{\#\,\text{decodes}}_{1 \text{ each}} + \sum \text{prompt chunks}",
         r"\text{tokens}_s \le \text{max\_num\_batched\_tokens}",
         r"\text{throughput} = \frac{\text{generated tokens}}{\sum_s \text{step wall time}}"],
        ["The scheduler runs before every forward pass: finished sequences leave, waiting ones join, and each "
         "running sequence brings its computed tokens up to its known tokens under the token budget.",
         "A decode step is memory-bound: reading the weights costs about the same for 1 or 8 sequences, so a "
         "fuller batch gives more tokens per second almost for free.",
         "In the Gantt, orange is prefill (the prompt), blue is decode, red is preempted: when the KV pool runs "
         "out, the running request admitted last loses its blocks and is recomputed later (a request still "
         "waiting holds no blocks to give, so it just keeps waiting).",
         "Static batching admits a new batch only when the whole previous batch has finished: short requests "
         "wait for the longest one, and the batch empties out as requests finish."],
    )


def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    waiting = [q for q in record.requests if q.status in ("waiting", "preempted") and q.arrival_step <= record.step]
    done = [q for q in record.requests if q.status == "finished"]
    c = st.columns(5)
    c[0].metric("Sequences in this step's batch", len(record.batch))
    c[1].metric("Tokens computed", record.num_batched_tokens,
                help=f"{record.num_prefill_tokens} prefill + {record.num_decode_tokens} decode")
    c[2].metric("Waiting", len(waiting))
    c[3].metric("Finished", f"{len(done)} / {len(record.requests)}")
    c[4].metric("Throughput so far", f"{throughput(history):.1f} tok/s", help="generated tokens / summed step time")
    joined = [s.request_id for s in record.batch if s.phase == "prefill"]
    notes = []
    if joined:
        notes.append(f":material/login: prefilling: {', '.join(joined)}")
    if record.finished:
        notes.append(f":material/check_circle: finished: {', '.join(record.finished)}")
    if record.preempted:
        notes.append(f":material/warning: **preempted** (blocks freed, will recompute): {', '.join(record.preempted)}")
    if notes:
        st.markdown(" · ".join(notes))
    left, right = st.columns([1, 1.6])
    with left:
        show_figure(batch_at_step(record, session.request_order), key="cb-batch-now", height=360,
                    export_width=700)
    with right:
        show_figure(batch_over_steps(history, session.request_order, record.step), key="cb-batch-all",
                    height=360, export_width=1000)
    show_figure(gantt(history, session.request_order, record.step,
                      title=f"Every request over time ({session.scenario.engine_config().policy} batching)",
                      max_step=session.records[-1].step),
                key="cb-gantt", height=120 + 42 * max(len(session.request_order), 3))
    with st.expander("Requests at this step", expanded=False):
        request_state_table(record)


def comparison_section(session: EngineSession, page: str) -> None:
    st.subheader("Static vs continuous batching on the same requests")
    st.markdown("Both policies run the scenario's requests to the end on two fresh engines (same model, same "
                "knobs, only the policy differs). Throughput and latency are measured from each run's own step times.")
    # Measured: the same 28-step continuous run read 36.6 tok/s as the process's first run and 44.7 tok/s as
    # its second; on a shared CI host the live run and these differed by half.
    st.caption("Step times are wall-clock time on this machine, so the live run above and these two can differ by "
               "tens of percent: the first steps in a process pay for warm-up, and other work on the host slows "
               "any step. Compare the two policies with each other, run side by side, step for step.")
    runs = comparison_runner(
        session, page, button_label="Run both policies", button_key="cb-compare",
        progress_text="Running static and continuous batching…", step_text="Running both policies… step {n}",
        expected_steps=120,
        hint="Press **Run both policies** (each run is a few dozen steps; about 10–30 s on the CPU).",
        run=lambda on_progress: compare_policies(session.scenario, shared_weights(), server_engine_settings(),
                                                 on_progress=on_progress),
        errors_of=lambda runs: (f"{r.policy}: {e.message}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    m = st.columns(len(runs) * 2)
    for i, (policy, run) in enumerate(runs.items()):
        lat = request_latencies(list(run.records))
        m[2 * i].metric(f"{policy}: throughput", f"{throughput(list(run.records)):.1f} tok/s",
                        help=f"{len(run.records)} steps")
        m[2 * i + 1].metric(f"{policy}: mean latency",
                            f"{statistics.mean(x.e2e_s for x in lat):.2f} s" if lat else "–")
    last = max((r.records[-1].step for r in runs.values() if r.records), default=0)
    cols = st.columns(len(runs))
    for col, (policy, run) in zip(cols, runs.items()):
        with col:
            fig = gantt(list(run.records), session.request_order, None,
                        title=f"{policy} batching: {len(run.records)} steps", max_step=last)
            height = 110 + 38 * max(len(session.request_order), 3)
            show_figure(fig, key=f"cb-gantt-{policy}", height=height, export_width=800)
    show_figure(latency_comparison(runs), key="cb-latency", height=380)
