"""Sections of the latency-SLO page (pages/14_slo_goodput.py composes them)."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st
import torch

from engine.serving_load import SLO, WORKLOADS, SweepResult, run_sweep
from engine.serving_load.sweep import MAX_CONFIGS, check_sweep
from engine.serving_load.workload import make_requests

from app.analysis.slo_fit import fitted_targets
from app.analysis.slo_goodput import (DEFAULT_PRESET, PRESETS, SweepSettings, default_rates, default_slo,
                                      default_workload, faster_than, format_rates, goodput_text, miss_reasons,
                                      parse_rates, passes_after_miss_text, preset_rows, requests_frame,
                                      rows_to_configs, runs_frame, workload_line)
from app.charts.slo_goodput import attainment_figure, latency_figure, request_scatter_figure, timeline_figure
from app.formatting import fmt_duration, plural
from app.runtime import backend_summary, device, server_engine_settings, shared_weights, weights_mode
from app.state import page_run
from app.table_columns import in_percent_points, share_column
from app.theme import show_figure
from app.widgets.explain import explanation

MAX_PAGE_REQUESTS = 48  # of the engine's 64: a sweep on the CPU costs about a second per request per run


def default_requests() -> int:
    return 6 if device() == "cpu" else 48


def slo_explanation() -> None:
    explanation(
        "Goodput: the load you can serve within the SLO",
        [r"\text{TTFT}_i = t_{\text{first token}} - t_{\text{arrival}}",
         r"\text{TPOT}_i = \frac{t_{\text{last token}} - t_{\text{first token}}}{n_i - 1}",
         r"\text{attainment}(\lambda) = \frac{\#\{i : \text{TTFT}_i \le T_1 \wedge \text{TPOT}_i \le T_2\}}{N}",
         r"\text{goodput} = \max\{\lambda : \text{attainment}(\lambda') \ge \text{goal} \text{ for every tested } "
         r"\lambda' \le \lambda\}"],
        ["**TTFT counts the queue.** Below capacity it is one prefill; past it, requests wait for a slot and "
         "TTFT climbs steeply while TPOT barely moves.",
         "**The batch cap** sets how many requests share a step. Decode steps are memory-bound, so a bigger batch "
         "costs little more per step: more tokens per second, a slightly slower TPOT, and far less queueing.",
         "**The token budget** caps the tokens one step computes. Small budgets cut long prompts into chunks, so "
         "running requests keep their pace (TPOT) while new ones wait longer for their first token (TTFT).",
         "**Output caps** end long answers early: slots free sooner, which helps everyone queued behind them.",
         "**Goodput stops at the first miss.** A rate that passes above one that failed was the luck of one run, "
         "not capacity a server can promise.",
         "**Throughput is not goodput.** The configuration with the most tokens per second can still miss the SLO; "
         "change the targets on the right of the results and watch the winner change (no re-run needed)."],
        note="λ: requests per second (Poisson arrivals), T₁ and T₂: the TTFT and TPOT targets, n_i: the tokens "
             "request i generated. Every step is the real model; the engine clock adds up measured step times and "
             "skips idle gaps to the next arrival, so a run at 0.5 req/s does not take real minutes.")


def backend_line() -> None:
    dev = device()
    if dev == "cpu":
        # Not a fixed figure: a step measured 50 ms on an idle 2-core machine and 65-100 ms while a browser shared it.
        where = ("the CPU with the torch reference path: a decode step of this model costs tens of milliseconds "
                 "here (the runs' TPOT below measures it; an H200 with Triton kernels and CUDA graphs: about 1 ms), "
                 "so the rates and targets are CPU-sized")
    else:
        where = f"{torch.cuda.get_device_name(torch.device(dev))} ({backend_summary()}, CUDA graphs on)"
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) on {where}. Kernel "
               "profiling is off during runs: it synchronises every launch, and an SLO is about served speed.")


# ---- settings ------------------------------------------------------------------------------------

def _keys(page: str) -> dict[str, str]:
    return {k: f"{page}-{k}" for k in ("workload", "requests", "seed", "rates", "preset", "rows", "editor-version",
                                       "settings", "errors", "ttft", "tpot", "goal", "pick-config", "pick-rate")}


def _load_preset(page: str) -> None:
    k, ss = _keys(page), st.session_state
    ss[k["rows"]] = preset_rows(ss[k["preset"]])
    ss[k["editor-version"]] = ss.get(k["editor-version"], 0) + 1  # a new editor key: it shows the preset's rows


def default_settings() -> SweepSettings:
    configs, _ = rows_to_configs(preset_rows(DEFAULT_PRESET))
    return SweepSettings(default_workload(device()), default_requests(), 0, default_rates(device()), tuple(configs))


def settings_form(page: str) -> SweepSettings:
    """Workload, rates and the configuration table; returns the settings to show (the last ones that ran: a
    rejected form keeps them, with its message)."""
    k, ss = _keys(page), st.session_state
    ss.setdefault(k["rows"], preset_rows(DEFAULT_PRESET))
    ss.setdefault(k["settings"], default_settings())
    ss.setdefault(k["rates"], format_rates(default_rates(device())))
    st.selectbox("Compare", list(PRESETS), key=k["preset"], on_change=_load_preset, args=(page,),
                 help="Fills the configuration table below; edit it to compare anything else.")
    with st.form(f"{page}-form", border=True):
        c = st.columns([2.5, 1, 0.9, 1.8])  # the workload names whole at 1280 px
        workload = c[0].selectbox("Workload", list(WORKLOADS), index=list(WORKLOADS).index(default_workload(device())),
                                  key=k["workload"])
        requests = c[1].number_input("Requests", 1, MAX_PAGE_REQUESTS, default_requests(), key=k["requests"],
                                     help="per run; every configuration and rate serves the same requests")
        seed = c[2].number_input("Seed", 0, 10_000, 0, key=k["seed"], help="draws the lengths and arrival gaps")
        rates = c[3].text_input("Request rates (req/s)", key=k["rates"],
                                help="comma-separated; each rate is one run per configuration")
        rows = st.data_editor(
            pd.DataFrame(ss[k["rows"]]), key=f"{page}-editor-{ss.get(k['editor-version'], 0)}", num_rows="dynamic",
            width="stretch", hide_index=True,  # errors count rows from 1, top to bottom
            column_config={
                "name": st.column_config.TextColumn("Name", required=True, help="labels the charts"),
                "batch_cap": st.column_config.NumberColumn("Batch cap", min_value=1, max_value=64, step=1,
                                                           help="max_num_seqs: sequences in one step"),
                "token_budget": st.column_config.NumberColumn("Token budget", min_value=16, max_value=8192, step=16,
                                                              help="max_num_batched_tokens: tokens one step computes"),
                "chunked": st.column_config.CheckboxColumn("Chunked prefill", default=True,
                                                           help="off: a prompt must fit one step's budget"),
                "output_cap": st.column_config.NumberColumn("Output cap", min_value=0, step=1,
                                                            help="0 = none; else answers stop at this many tokens"),
            })
        st.caption(f"Up to {MAX_CONFIGS} configurations. The KV pool of each run holds a full batch of the longest "
                   "requests, so nothing is preempted: these runs measure scheduling (the KV cache page shows "
                   "memory pressure).")
        submitted = st.form_submit_button("Run the load test", icon=":material/play_arrow:", type="primary")
    if submitted:
        ss[k["errors"]] = _apply(page, str(workload), int(requests), int(seed), str(rates), rows.to_dict("records"))
    for err in ss.get(k["errors"], []):
        st.error(err, icon=":material/error:")
    return ss[k["settings"]]


def _apply(page: str, workload: str, requests: int, seed: int, rates_text: str, rows: list[dict]) -> list[str]:
    """New settings from the form, or the reasons they cannot run (the last run's results stay)."""
    k, ss = _keys(page), st.session_state
    configs, errors = rows_to_configs(rows)
    rates, rate_error = parse_rates(rates_text)
    if rate_error:
        errors.append(rate_error)
    if not 1 <= requests <= MAX_PAGE_REQUESTS:
        errors.append(f"Requests must be between 1 and {MAX_PAGE_REQUESTS}.")
    if not errors:
        try:
            check_sweep(configs, rates)
            trace = make_requests(WORKLOADS[workload].with_requests(requests, seed), rates[0])
            for c in configs:
                c.check_fits(trace)
        except ValueError as e:
            errors.append(str(e)[:1].upper() + str(e)[1:] + ".")
    if errors:
        return errors
    ss[k["settings"]] = SweepSettings(workload, requests, seed, rates, tuple(configs))
    return []


def slo_controls(page: str) -> SLO:
    """The targets, outside the form: changing them re-reads the runs, it does not re-run them."""
    k = _keys(page)
    base = default_slo(device())
    st.markdown("**Latency targets** (change them freely: the runs are re-read, not re-run)")
    c = st.columns(3)
    ttft = c[0].number_input("TTFT target (s)", 0.001, 120.0, base.ttft_s, step=0.05, format="%.3g", key=k["ttft"])
    tpot = c[1].number_input("TPOT target (ms)", 0.1, 10_000.0, 1000 * base.tpot_s, step=5.0, format="%.3g",
                             key=k["tpot"])
    goal = c[2].slider("Attainment goal (%)", 50, 100, int(round(100 * base.goal)), step=5, key=k["goal"],
                       help="share of requests that must meet both targets for a rate to count")
    return SLO(float(ttft), float(tpot) / 1000, goal / 100)


def get_result(page: str, s: SweepSettings) -> SweepResult | None:
    """The sweep for these settings (`page_run`: this tab's, the server's, or run now with a progress bar).
    None when it failed and nothing ran before (the page then shows only the message)."""
    server = server_engine_settings()
    workload = WORKLOADS[s.workload].with_requests(s.num_requests, s.seed)

    def run(bar) -> SweepResult:  # noqa: ANN001 (a Streamlit progress bar)
        def progress(share: float, what: str) -> None:
            bar.progress(min(1.0, share), text=f"Serving {plural(s.num_requests, 'request')}: {what}…")

        return run_sweep(shared_weights(), server, s.configs, workload, s.rates, progress=progress)

    runs = len(s.rates) * len(s.configs)
    return page_run(page, s, run, f"Running {plural(runs, 'load test')} on the model…", "The load test failed")


# ---- results -------------------------------------------------------------------------------------

def _set_targets(page: str, targets: SLO) -> None:
    """The fit button's callback: it runs before the next rerun draws the number inputs, so they may change."""
    k, ss = _keys(page), st.session_state
    ss[k["ttft"]], ss[k["tpot"]] = targets.ttft_s, round(1000 * targets.tpot_s, 9)


def summary_section(s: SweepSettings, result: SweepResult, slo: SLO, page: str) -> None:
    st.subheader("Goodput of each configuration")
    st.caption(f"{workload_line(s.workload, s.num_requests)} · {plural(len(result.runs), 'run')} of the real engine "
               f"in {fmt_duration(result.seconds)} · backend: {result.backend}")
    cols = st.columns(len(result.configs))
    top_rate = max(result.rates)
    for col, c in zip(cols, result.configs):
        good = result.goodput(c.label, slo)
        at_top = result.run(c.label, top_rate)
        col.metric(c.label, goodput_text(good, result.rates),
                   help=f"highest tested rate at which at least {slo.goal:.0%} of requests meet both targets, "
                        "and so do they at every lower tested rate")
        col.caption(f"at {top_rate:g} req/s: {at_top.attainment(slo):.0%} met, "
                    f"{at_top.throughput_tok_s:,.0f} output tok/s")
    if why := passes_after_miss_text(result, slo, s.num_requests):
        st.caption(why)
    leaders = result.leaders(slo)
    if not leaders:
        st.warning(f"No configuration reaches {slo.goal:.0%} at {min(result.rates):g} req/s with these targets. "
                   "Loosen the targets, or add lower rates and run again.", icon=":material/warning:")
        fit = fitted_targets(result, slo)
        st.button(f"Fit the targets to this machine: TTFT {fit.ttft_s:g} s, TPOT {1000 * fit.tpot_s:g} ms",
                  key=f"{page}-fit", icon=":material/tune:", on_click=_set_targets, args=(page, fit),
                  help="targets just loose enough for one configuration to reach the goal at the lowest rate: its "
                       "measured latencies there plus 20 %, rounded up (a target already met stays). The runs are "
                       "re-read, not re-run.")
        return
    good = goodput_text(result.goodput(leaders[0], slo), result.rates)
    if len(leaders) > 1:
        st.markdown(f"Highest goodput: a tie between {' and '.join(f'**{c}**' for c in leaders)}, {good} each: "
                    "the same share of requests met the targets at every rate.")
        return
    faster = faster_than(result, leaders[0], top_rate)
    note = ("" if faster is None else f" The most tokens per second at {top_rate:g} req/s came from **{faster}**: "
            "throughput and goodput pick different winners here.")
    st.markdown(f"Highest goodput: **{leaders[0]}**, {good}.{note}")


def curves_section(result: SweepResult, slo: SLO, page: str) -> None:
    show_figure(attainment_figure(result, slo), key=f"{page}-attainment", height=420)
    st.caption(f"★ Goodput: the highest tested rate at which at least {slo.goal:.0%} of requests meet both "
               "targets, and so do they at every lower tested rate (a pass above a miss is luck, not capacity).")
    show_figure(latency_figure(result, slo), key=f"{page}-latency", height=380)


def run_section(result: SweepResult, slo: SLO, page: str) -> None:
    k = _keys(page)
    st.subheader("One run up close")
    c = st.columns([2, 3])
    labels = [cfg.label for cfg in result.configs]
    label = c[0].selectbox("Configuration", labels, key=k["pick-config"])
    rate = c[1].select_slider("Request rate (req/s)", options=list(result.rates), value=max(result.rates),
                              format_func=lambda r: f"{r:g}", key=k["pick-rate"]) if len(result.rates) > 1 \
        else result.rates[0]
    run = result.run(label, rate)
    misses = miss_reasons(run, slo)
    missed = sum(misses.values())
    st.markdown(f"**{label} at {rate:g} req/s:** {run.attainment(slo):.0%} of {plural(len(run.timings), 'request')} met "
                f"the SLO" + (f" (missed: {', '.join(f'{v} {n}' for n, v in misses.items() if v)})" if missed else "")
                + f"; {plural(len(run.steps), 'step')}, engine busy {run.busy_share:.0%} of "
                f"{fmt_duration(run.makespan_s)}, {run.throughput_tok_s:,.0f} output tokens per second."
                + (f" CUDA graph capture inside this run: {fmt_duration(run.capture_s)} (a batch size the "
                   "warm-up did not meet)." if run.capture_s > 0 else ""))
    left, right = st.columns([5, 6])
    with left:
        show_figure(request_scatter_figure(run, slo), key=f"{page}-scatter", height=440, export_width=700)
    with right:
        # Short headers with the units in their tooltips: all eight columns fit beside the scatter on a projector.
        st.dataframe(requests_frame(run, slo), hide_index=True, width="stretch",
                     height=min(440, 35 * (len(run.timings) + 1) + 3), column_config={
            "request": st.column_config.TextColumn("req", width=42),
            "arrives (s)": st.column_config.NumberColumn("arrives", format="%.2f", width=58,
                                                         help="seconds after the run started"),
            "prompt": st.column_config.NumberColumn("prompt", width=54, help="prompt tokens"),
            "answer": st.column_config.NumberColumn("answer", width=56, help="tokens generated"),
            "waited (s)": st.column_config.NumberColumn("waited", format="%.2f", width=56,
                                                        help="seconds from arrival to its first scheduled step"),
            # Written beside the targets (three decimals, more where 1.000 would hide a miss of a 1 s target).
            "TTFT (s)": st.column_config.TextColumn("TTFT", width=56, help="seconds", alignment="right"),
            "TPOT (ms)": st.column_config.TextColumn("TPOT", width=50, help="milliseconds", alignment="right"),
            "meets SLO": st.column_config.TextColumn("SLO", width=64, help="met, or which target it missed"),
        })
    show_figure(timeline_figure(run, slo), key=f"{page}-timeline", height=380 + 14 * len(run.timings))
    st.caption("Engine time is the sum of measured step times; when nothing is running it skips to the next "
               "arrival. Grey: waiting for a slot; orange: prefill (several steps when chunked) up to the first "
               "token; blue: decoding. Below: how many sequences each step carried, and its prompt tokens.")


def table_section(result: SweepResult, slo: SLO, page: str) -> None:
    st.subheader("Every run")
    frame = runs_frame(result, slo)
    # Short headers (the units in the caption and tooltips): all eleven columns fit at projector width. At 1024
    # pixels with the sidebar open they took 753 of 690 pixels, so "SLO met" is a number (the attainment chart
    # above draws the same shares), the goal's percentile reads "p90" beside "TTFT p50" and "TPOT p50", and each
    # width is its header's or widest value's, plus the cell padding.
    q = f"p{100 * slo.goal:g}"
    st.caption(f"TTFT in seconds, TPOT in milliseconds: the median (p50) and the goal's percentile ({q}) over the "
               "run's requests.")
    st.dataframe(in_percent_points(frame, "SLO met", "busy"), hide_index=True, width="stretch", column_config={
        "rate (req/s)": st.column_config.NumberColumn("req/s", format="%g", width=48, help="arrival rate"),
        "SLO met": share_column(bar=False, width=64, help="share of requests within both targets"),
        **{c: _latency_column(c, q) for c in frame.columns if "TTFT" in c or "TPOT" in c},
        "output tok/s": st.column_config.NumberColumn("tok/s", format="%.0f", width=48,
                                                      help="output tokens per second of run"),
        # Not "goodput", which the metrics above read as the highest offered rate still at the goal.
        "good req/s": st.column_config.NumberColumn("met req/s", format="%.2f", width=72, help=(
            "requests that met the SLO per second of this run; with a few Poisson arrivals, which can come "
            "faster than the offered rate, it can read above that rate. The goodput above is the other "
            "reading: the highest offered rate whose runs still meet the attainment goal")),
        "busy": share_column(bar=False, width=48, help="share of the run the engine was computing"),
        "steps": st.column_config.NumberColumn(width=48, help="engine steps in the run"),
    })
    st.download_button("Download the runs (JSON)", data=json.dumps(sweep_json(result, slo), indent=1),
                       file_name="inferscope-slo-goodput.json", mime="application/json", key=f"{page}-download",
                       icon=":material/download:")


def _latency_column(column: str, goal_percentile: str) -> object:
    """The runs table's column for "TTFT p50 (s)" and the like: the median under its own name, the goal's
    percentile as "p90" right after it (the full name in its tooltip)."""
    name, unit = column.split(" (")[0], "seconds" if column.startswith("TTFT") else "milliseconds"
    median = name.endswith(" p50")
    return st.column_config.NumberColumn(name if median else goal_percentile,
                                         format="%.3f" if column.startswith("TTFT") else "%.1f",
                                         width=(66 if column.startswith("TTFT") else 68) if median else 54,
                                         help=f"{name} over the run's requests, in {unit}")


def sweep_json(result: SweepResult, slo: SLO) -> dict:
    """Settings, targets and every request's timing: enough to redraw every chart elsewhere."""
    return {
        "workload": result.workload.name, "num_requests": result.workload.num_requests, "seed": result.workload.seed,
        "backend": result.backend, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "goal": slo.goal},
        "goodput_req_s": {c.label: result.goodput(c.label, slo) for c in result.configs},
        "runs": [{"configuration": r.config.label, "batch_cap": r.config.max_num_seqs,
                  "token_budget": r.config.max_num_batched_tokens, "chunked_prefill": r.config.chunked_prefill,
                  "output_cap": r.config.output_cap, "rate_req_s": r.rate, "attainment": r.attainment(slo),
                  "requests": [{"id": t.request_id, "arrival_s": t.arrival_s, "admitted_s": t.admitted_s,
                                "first_token_s": t.first_token_s, "finish_s": t.finish_s, "prompt_len": t.prompt_len,
                                "output_tokens": t.output_tokens} for t in r.timings]}
                 for r in result.runs],
    }
