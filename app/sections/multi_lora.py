"""Sections of the multi-LoRA serving page (pages/17_multi_lora.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.lora.adapter import ADAPTERS_DIR
from engine.trace import StepRecord

from app.analysis.multi_lora import (BASE, adapter_of, bundled, compare_deployments, lora_extras, lora_seconds,
                                     row_segments, slot_history, summarize, waiting_steps)
from app.charts.multi_lora import adapter_timeline, batch_rows_figure, comparison_figure, slots_figure
from app.formatting import fmt_bytes, fmt_duration, literal_markdown
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.explain import explanation


def lora_explanation() -> None:
    explanation(
        "One base model, many fine-tunes in one batch (Punica, S-LoRA)",
        # Short pieces: the theory box's formula column is about 330 pixels wide at 1280, and KaTeX breaks a long
        # line at its operators (the sum landed on its own line, under its brace label).
        [r"y_t = W x_t + B_{s_t} A_{s_t} x_t",
         r"s_t = \text{the adapter of row } t",
         r"Y = \underbrace{W X}_{\text{one GEMM}} + \sum_{a} \underbrace{B_a (A_a X_a)}_{\text{rows of } a}",
         r"\text{extra FLOPs per token} = 2r\,{(d_\text{in} + d_\text{out})} \ll 2\,d_\text{in} d_\text{out}"],
        ["Every request names a LoRA fine-tune (or none). The base weights W are read **once per step for the "
         "whole batch**; each adapter's small A and B only touch its own rows (A shrinks a row to rank r, B expands "
         "it back). That is SGMV, Punica's "
         "segmented gather matrix-vector product: a batch keeps the size it would have with one model.",
         "The device holds a few adapters at a time (**slots**). A request can only start once its adapter is in "
         "a slot: admission loads it there (from host memory) or evicts the least recently used adapter that no "
         "running request needs. Open squares mark requests that were ready but found every slot busy.",
         "Prefix caching keeps adapters apart: the same prompt gives different keys and values under another "
         "adapter, so cached KV is only shared between requests of the same adapter.",
         "The alternative is **one merged deployment per fine-tune**. On one device they take turns, each with a "
         "small batch; the comparison at the bottom measures both on the same requests."],
        note="The rows of a step are packed as the engine packs them: sequences prefilling from position 0 first, "
             "then decodes. Adapters are padded to the slots' rank (S-LoRA pages them by rank instead).",
    )


def missing_adapters_warning() -> None:
    if not bundled():
        st.warning(f"No trained adapters found in `{ADAPTERS_DIR}`: requests that name one are refused. Train them "
                   "with `python -m training.train_lora --adapter all`.", icon=":material/warning:")


def adapters_table() -> None:
    rows = [{"adapter": a.name, "what it learned": a.description, "rank": a.rank, "targets": ", ".join(a.targets),
             "parameters": f"{a.num_params:,}", "size (fp16)": fmt_bytes(a.nbytes(2))}
            for a in bundled().values()]
    if rows:
        # A static table: its cells wrap, so what each adapter learned is read whole on a projector instead
        # of pushing the size columns off the right edge of a scrolling grid.
        st.table(pd.DataFrame(rows).set_index("adapter"))


def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    names = sorted(bundled())
    lora = lora_extras(record)
    segments = row_segments(record, lambda label: adapter_of(session, label))
    in_batch = sorted({s.adapter for s in segments})
    lora_s, all_s = lora_seconds(record)
    c = st.columns(5)
    c[0].metric("Rows in this step's batch", sum(s.rows for s in segments),
                help="tokens computed this step (a decode is one row, a prompt chunk many)")
    c[1].metric("Adapters in the batch", len([a for a in in_batch if a != BASE]),
                help="distinct LoRA adapters whose rows share this forward pass" +
                     (" (plus base-model rows)" if BASE in in_batch else ""))
    c[2].metric("LoRA kernels", f"{lora_s / all_s:.0%}" if all_s > 0 else "–",
                help=f"{fmt_duration(lora_s)} of {fmt_duration(all_s)} timed in kernels this step went to the "
                     "shrink/expand of the adapters (lora.*); the rest is the base model")
    waiting = lora.get("waiting_for_slot", [])
    c[3].metric("Waiting for a slot", len(waiting), help=", ".join(waiting) or "nobody")
    counters = lora.get("counters", {})
    c[4].metric("Adapter loads so far", counters.get("loads", 0),
                help=f"{counters.get('evictions', 0)} evictions; {fmt_bytes(counters.get('bytes_loaded', 0))} "
                     "copied to the device")
    notes = []
    for e in lora.get("events", []):
        verb = "loaded into" if e["kind"] == "load" else "evicted from"
        notes.append(f":material/{'download' if e['kind'] == 'load' else 'logout'}: **{e['adapter']}** {verb} "
                     f"slot {e['slot']}" + (f" ({fmt_bytes(e['bytes'])})" if e["bytes"] else ""))
    if waiting:
        notes.append(f":material/hourglass_top: ready but no free slot: {', '.join(waiting)}")
    if notes:
        st.markdown(" · ".join(notes))
    left, right = st.columns([3, 1.3])
    with left:
        show_figure(batch_rows_figure(segments, names), key="ml-rows", height=300, export_width=900)
    with right:
        show_figure(slots_figure(record, names), key="ml-slots", height=300, export_width=450)
    order = session.request_order
    show_figure(adapter_timeline(history, order, lambda label: adapter_of(session, label), waiting_steps(history),
                                 slot_history(history), names, selected=record.step),
                key="ml-timeline", height=140 + 34 * max(len(order), 3))
    answers_table(session, record)


def answers_table(session: EngineSession, record: StepRecord) -> None:
    rows = [{"request": q.request_id, "adapter": adapter_of(session, q.request_id), "status": q.status,
             "generated": q.output_len, "answer so far": literal_markdown(q.text)} for q in record.requests]
    # A static table, so each answer wraps onto as many lines as it needs: a data grid cut 40-token answers
    # off at the column's edge. Its cells render Markdown, so the text is escaped (a "- " answer became bullets).
    st.table(pd.DataFrame(rows).set_index("request"))


def comparison_section(session: EngineSession, page: str) -> None:
    st.subheader("Mixed batches vs one merged deployment per fine-tune")
    st.markdown("The scenario's requests, all queued at once, served two ways on this machine: **multi-LoRA** "
                "(one engine, the base weights once, every adapter's rows in the same batches) and **one merged "
                "deployment per fine-tune** (each adapter merged into its own copy of the weights, serving only its "
                "own requests; on one device the deployments take turns).")
    runs = comparison_runner(
        session, page, button_label="Run both set-ups", button_key="ml-compare",
        progress_text="Serving the requests both ways…", step_text="Serving the requests both ways… step {n}",
        expected_steps=140, hint="Press **Run both set-ups** (a few dozen steps each; about 30–60 s on the CPU).",
        run=lambda on_progress: compare_deployments(session.scenario, shared_weights(), server_engine_settings(),
                                                    on_progress=on_progress),
        errors_of=lambda runs: (e for group in runs.values() for run in group for e in run.errors))
    if runs is None:
        return
    summaries = [summarize(name, group) for name, group in runs.items()]
    c = st.columns(len(summaries) * 2)
    for i, s in enumerate(summaries):
        c[2 * i].metric(f"{s.name}: throughput", f"{s.tokens_per_second:.1f} tok/s",
                        help=f"{s.output_tokens} tokens in {fmt_duration(s.seconds)} of engine time, "
                             f"{s.forward_passes} forward passes, {s.mean_batch:.1f} sequences per batch on average")
        c[2 * i + 1].metric(f"{s.name}: weights", fmt_bytes(s.weights_bytes),
                            help="what the set-up keeps in memory for the model: one base copy plus the adapters, "
                                 "or one whole checkpoint per fine-tune")
    show_figure(comparison_figure(summaries), key="ml-compare-chart", height=360)
    st.caption("Finish time: seconds of engine time from the start until a request's last token, averaged over "
               "the requests.")
    per = runs.get("one merged deployment per fine-tune", [])
    if per:
        st.caption("Merged deployments, in turn: " + " · ".join(
            f"{run.name}: {len(run.labels)} request{'s' if len(run.labels) != 1 else ''}, {len(run.records)} steps, "
            f"{fmt_duration(run.seconds)}" for run in per))
