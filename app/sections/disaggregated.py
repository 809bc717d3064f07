"""Sections of the disaggregated prefill/decode page (pages/10_disaggregated.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.disaggregated import ClusterStepRecord

from app.analysis.disaggregated import (ServingRun, coinciding_requests, compare_serving, first_moments,
                                        handoffs_until, latest_prefill_step, latest_records, median, pool_at_send,
                                        worst_gap)
from app.charts.block_pool import block_pool_grid
from app.charts.disaggregated import compare_gaps_figure, compare_ttft_figure, first_moments_figure, worker_timeline
from app.formatting import NO_VALUE, fmt_block_ids, fmt_duration, plural
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.explain import explanation
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_table import TTFT_COLUMN, ttft_ms

# Nominal link speeds (one direction) for the "what would it take over ..." line: datasheet figures, said so
# on the page; only the shared-memory copy is measured here.
NOMINAL_LINKS_GB_S: tuple[tuple[str, float], ...] = (("NVLink 4 (H100)", 450.0), ("PCIe 5 ×16", 64.0),
                                                     ("400 Gb/s RDMA", 50.0))


def disaggregated_explanation() -> None:
    explanation(
        "Disaggregated prefill/decode (DistServe, Splitwise, Mooncake, NVIDIA Dynamo)",
        [r"\text{KV to move} = 2 \cdot n_{\text{layers}} \cdot H_{kv} \cdot d_{\text{head}} \cdot b "
         r"\cdot n_{\text{prompt}}",
         r"\text{TTFT} = t_{\text{queue at prefill}} + T_{\text{prefill}}(n_{\text{prompt}})",
         r"\text{TBT}_{\text{colocated}} = T_{\text{decode}} + T_{\text{prefill}}\ \text{(when a prompt lands)}",
         r"\text{TBT}_{\text{disaggregated}} = T_{\text{decode}}",
         r"t_{\text{handoff}} = \text{KV to move} \,/\, \text{link bandwidth}"],
        ["Two engines with their own KV pools: the **prefill worker** computes each prompt and its first token, "
         "then the prompt's K and V blocks are copied out (here through a shared-memory segment) and into blocks "
         "of the **decode worker**'s pool, which decodes the rest.",
         "The decode worker never computes a prompt token: its iterations stay short and even, so a long prompt "
         "arriving no longer freezes everyone else's text (compare the three runs below).",
         "The arrows in the timeline are the handoffs. Their block ids differ on the two sides: each pool hands "
         "out its own free blocks, and the decode worker's block table points at the copies.",
         "The price: the KV must travel (megabytes per request), a second model replica, and a prompt waits for "
         "the prefill worker when several arrive together.",
         "The tokens are the same as on one engine: the check below compares them."],
        note="Both workers run here on one machine, taking turns; each keeps its own clock (its measured step "
             "times plus the time it waited for work), the way two GPUs would run side by side.",
    )


def _mb(nbytes: float) -> str:
    """KV moved between the workers, in decimal MB: traffic, read beside GB/s and link speeds (app/formatting.py)."""
    return f"{nbytes / 1e6:.1f} MB"


def _worker_line(record: ClusterStepRecord) -> str:
    parts = []
    for s in record.prefill_steps:
        ids = ", ".join(dict.fromkeys(b.request_id for b in s.record.batch)) or "nothing"
        running = f"; running until {fmt_duration(s.end)}" if s.end > record.clock else ""
        parts.append(f":material/input: prefill worker: step {s.record.step} on **{ids}** "
                     f"({plural(s.record.num_prefill_tokens, 'prompt token')}, {fmt_duration(s.end - s.start)}{running})")
    for h in record.taken:
        parts.append(f":material/download: **{h.request_id}**'s KV taken: {plural(h.prompt_len, 'token')}, "
                     f"{_mb(h.nbytes)}, prefill blocks {fmt_block_ids(h.src_blocks)} → decode blocks "
                     f"{fmt_block_ids(h.dst_blocks)}")
    d = record.decode_step
    if d is not None:
        ids = [b.request_id for b in d.record.batch]
        what = f"one token each for {', '.join(ids)}" if len(ids) > 1 else f"one token for {''.join(ids)}"
        parts.append(f":material/arrow_forward: decode worker: step {d.record.step}, {what} "
                     f"({fmt_duration(d.end - d.start)})")
    return " · ".join(parts)


def step_section(session: EngineSession, record: ClusterStepRecord, history: list[ClusterStepRecord]) -> None:
    prefill_rec, decode_rec = latest_records(history)
    handed = handoffs_until(history)
    stages = [q.stage for q in record.requests]
    counters = (decode_rec.extra("counters") or {}) if decode_rec else {}
    in_flight = [q.request_id for q in record.requests if q.stage == "transfer"]
    m = st.columns(6)
    m[0].metric("Run clock", fmt_duration(record.clock), help="the decode worker's clock after this tick")
    m[1].metric("Still decoding", stages.count("decode"), help="requests in the decode worker's batch after this "
                "tick (a request that wrote its last token in this tick has left)")
    # Not yet arrived is "waiting" too (arrival_time -1): the metric counts only the requests that are here.
    prefilling = sum(q.stage in ("waiting", "prefill") and q.arrival_time >= 0 for q in record.requests)
    m[2].metric("Prefilling", prefilling,
                help="arrived requests without a first token yet, queued or in a prefill (one still running on the prefill "
                     "worker's clock counts here)")
    m[3].metric("KV in flight", len(in_flight),
                help="first token out, KV sent, not yet taken by the decode worker: "
                     + (", ".join(in_flight) or "none now"))
    m[4].metric("KV handed over", _mb(sum(h.nbytes for h in handed)),
                help=f"{plural(len(handed), 'handoff')} taken by the decode worker so far")
    m[5].metric("Prefill on decode", counters.get("prefill_tokens_computed", 0),
                help="prompt tokens the decode worker computed itself: 0 unless it had to recompute after a "
                     "preemption; every prompt came as KV")
    line = _worker_line(record)
    if line:
        st.markdown(line)
    show_figure(worker_timeline(history, session.request_order), key="disagg-timeline", height=330)
    left, right = st.columns(2)
    taken_blocks = {b for h in record.taken for b in h.dst_blocks}
    with left:
        step, sent = latest_prefill_step(history)
        if step is not None:
            if step.end > record.clock:  # still computing on its clock: its prompts hold their blocks
                view, outline = pool_at_send(step.record, sent), {b for h in sent for b in h.src_blocks}
                ids = ", ".join(h.request_id for h in sent) or "its prompts"
                note = f"computing {ids} until {fmt_duration(step.end)}; outlined: its blocks"
            else:
                view = step.record
                outline = {b for h in sent for b in h.src_blocks if h.sent_at > _previous_clock(history)}
                note = "outlined: freed this tick, once their KV was sent"
            fig = block_pool_grid(view, session.request_order, outline)
            fig.update_layout(title=dict(text=f"Prefill worker's pool, its step {step.record.step}",
                                         subtitle=dict(text=note)))
            show_figure(fig, key="disagg-prefill-pool", height=360, export_width=700)
        else:
            st.caption("The prefill worker has not run yet.")
    with right:
        if decode_rec is not None:
            fig = block_pool_grid(decode_rec, session.request_order, taken_blocks)
            fig.update_layout(title=dict(text=f"Decode worker's pool, its step {decode_rec.step}",
                                         subtitle=dict(text="outlined: KV taken in this tick")))
            show_figure(fig, key="disagg-decode-pool", height=360, export_width=700)
        else:
            st.caption("The decode worker has not taken a request yet.")
    moments = first_moments(history)
    if moments:
        show_figure(first_moments_figure(moments, session.request_order), key="disagg-moments",
                    height=230 + 56 * len(moments))  # two-line labels per row, a five-entry legend
        _handoff_table(handed, session)
    with st.expander("Requests at this tick", expanded=False):
        _request_table(record)
    kernel_timing_panel(decode_rec, "disagg-decode", title="Kernel timings: the decode worker's latest step")
    kernel_timing_panel(prefill_rec, "disagg-prefill", title="Kernel timings: the prefill worker's latest step")


def _previous_clock(history: list[ClusterStepRecord]) -> float:
    return history[-2].clock if len(history) > 1 else -1.0


def _handoff_table(handed: list, session: EngineSession) -> None:  # noqa: ANN001 (KVHandoff)
    rows = [{"request": h.request_id, "prompt tokens": h.prompt_len, "prefill blocks": fmt_block_ids(h.src_blocks),
             "decode blocks": fmt_block_ids(h.dst_blocks), "MB": h.nbytes / 1e6,
             "copy out (ms)": h.send_seconds * 1e3, "copy in (ms)": h.receive_seconds * 1e3,
             "GB/s": h.nbytes / max(h.send_seconds + h.receive_seconds, 1e-9) / 1e9,
             "waited (ms)": h.waited_seconds * 1e3} for h in handed]
    # Short headers with the long names in their help: written out, the nine columns ran past a 1024-pixel page.
    num = st.column_config.NumberColumn
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "prompt tokens": num("prompt", help="prompt tokens"),
        "MB": num(format="%.2f", help="the request's KV: whole blocks, K and V, every layer"),
        "copy out (ms)": num("out (ms)", format="%.2f", help="copy out: prefill worker's pool to the transport"),
        "copy in (ms)": num("in (ms)", format="%.2f", help="copy in: transport to the decode worker's pool"),
        "GB/s": num(format="%.2f", help="MB over the two copies' time"),
        "waited (ms)": num("waited (ms)", format="%.2f",
                           help="from the end of the prefill step until the copy in starts")})
    big = max(handed, key=lambda h: h.nbytes)
    links = ", ".join(f"{name} {fmt_duration(big.nbytes / (gb * 1e9))}" for name, gb in NOMINAL_LINKS_GB_S)
    cfg, b = session.engine.model_config, session.kv_bytes_per_element
    per_token = cfg.kv_bytes_per_token(b)
    blocks = len(big.src_blocks)
    st.caption(f"KV per token: 2 × {cfg.num_layers} layers × {cfg.num_kv_heads} KV heads × {cfg.head_dim} × {b} bytes "
               f"= {per_token:,} bytes. Whole blocks move: {big.request_id}'s {big.prompt_len} tokens fill "
               f"{plural(blocks, 'block')} of {session.engine.config.block_size}, {_mb(big.nbytes)}. "
               f"Copy out and copy in are measured ({handed[0].transport}); “waited” runs from the end of the "
               f"prefill step to the decode worker starting the copy in. The three add up to the handoff in the "
               f"chart above; the copy out happens inside the prefill step, before its first token. "
               f"The same {_mb(big.nbytes)} at nominal "
               f"link speeds: {links}.")


def _request_table(record: ClusterStepRecord) -> None:
    rows = [{"request": q.request_id, "stage": q.stage, "prompt": q.prompt_len, "generated": q.output_len,
             "TTFT": ttft_ms(q.ttft_seconds), "text so far": q.text} for q in record.requests]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", placeholder=NO_VALUE,
                 column_config={"TTFT": TTFT_COLUMN, "text so far": st.column_config.TextColumn(width="large")})


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("The same requests served three ways")
    st.markdown("Three fresh runs of this scenario to the end: **colocated** (one engine without chunked "
                "prefill, so each prompt is computed in one step; its token budget is raised to the longest "
                "request where needed), **colocated with chunked prefill** (one engine, budget 64, as on the "
                "chunked prefill page) and **disaggregated** (the two workers above, as configured).")
    runs = comparison_runner(
        session, page, button_label="Run three ways", button_key="disagg-compare",
        progress_text="Running colocated, chunked and disaggregated…", step_text="Running all three… step {n}",
        expected_steps=40, hint="Press **Run three ways** (three runs of the scenario; about 20–60 s on the CPU).",
        run=lambda on_progress: compare_serving(session.scenario, shared_weights(), server_engine_settings(),
                                                on_progress=on_progress),
        errors_of=lambda runs: (f"{r.label}: {e}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    long_id = _longest_prompt(session)
    m = st.columns(len(runs) + 1)
    for col, (key, run) in zip(m, runs.items()):
        rest = [g for g in run.gaps if g.request_id != long_id]
        worst = worst_gap(rest)
        col.metric(f"Worst stall: {key}", f"{worst.gap_s * 1e3:.0f} ms" if worst else "–",
                   help=f"median time between tokens {median([g.gap_s for g in rest]) * 1e3:.0f} ms; "
                        f"TTFT of {long_id}: {fmt_duration(run.ttft_of(long_id))}; {plural(run.devices, 'model replica')}")
    reference = dict(runs["colocated"].outputs)
    same = all(dict(r.outputs) == reference for r in runs.values())
    m[-1].metric("Same tokens all three ways", "yes" if same else "no",
                 help="every request's generated token ids compared with the colocated run"
                      + ("" if all(session.specs[r].temperature == 0 for r in reference if r in session.specs)
                         else " (sampling with a seed gives the same draws too)"))
    if not same:
        st.error("The three runs produced different tokens: that is a bug, please report the scenario.")
    gaps = compare_gaps_figure(runs, session.request_order, long_id)
    show_figure(gaps, key="disagg-compare-gaps", height=gaps.layout.height)
    st.caption(f"{long_id} (the longest prompt) is left out of these panels: its wait is its TTFT, charted below. "
               "Orange bands: iterations of the colocated engine that ran prompt tokens."
               + _stacked_lines(runs, long_id))
    show_figure(compare_ttft_figure(runs, session.request_order), key="disagg-compare-ttft",
                height=220 + 45 * len(reference))
    st.caption("Each run's times are its own clock. The disaggregated run uses two model replicas for the work one "
               "colocated engine does: it buys even decode iterations (and lets each pool be sized and batched "
               "for its own phase), not more tokens per GPU.")


def _longest_prompt(session: EngineSession) -> str | None:
    last = session.records[-1] if session.records else None
    if last is not None and last.requests:
        return max(last.requests, key=lambda q: q.prompt_len).request_id
    lengths = {label: len(session.prompt_token_ids(label)) for label in session.request_order}
    return max(lengths, key=lengths.get) if lengths else None


def _stacked_lines(runs: dict[str, ServingRun], exclude: str | None) -> str:
    """A sentence naming the requests whose lines coincide, panel by panel (once when every panel has the same):
    the legend lists them all and the chart seemed to show one."""
    stacked = coinciding_requests(runs, exclude)
    named = {key: "; ".join(", ".join(ids) for ids in groups) for key, groups in stacked.items() if groups}
    if not named:
        return ""
    if len(named) == len(runs) and len(set(named.values())) == 1:
        return f" {next(iter(named.values()))}: decoded in the same iterations, so their lines lie on top of each other."
    where = "; ".join(f"{key}: {names}" for key, names in named.items())
    return f" Decoded in the same iterations, so their lines lie on top of each other: {where}."
