"""Sections of the constrained decoding page (pages/12_constrained_decoding.py composes them)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pandas as pd
import streamlit as st

from engine.config import EngineConfig
from engine.constrained import ConstrainedEngine, Constraint
from engine.constrained.presets import PRESETS
from engine.trace import StepRecord

from app.analysis.constrained import (MAX_OUTPUT_TOKENS, MAX_SAMPLES, MODES, ModeRun, RunSettings, bench_tables,
                                      check_settings, last_mask, load_bench, mode_rows, modes_for, preset_by_name,
                                      preset_settings, request_view, run_modes, summarize, token_rows)
from app.charts.constrained import mask_figure, modes_figure
from app.formatting import NO_VALUE, fmt_duration, plural, step_line
from app.session import EngineSession
from app.state import page_cache, page_settings
from app.theme import show_figure
from app.widgets.constrained_strip import constrained_strips
from app.widgets.controls import restart_with
from app.widgets.explain import explanation

OWN = "Your own (edit below)"
KIND_LABELS = {"json_schema": "JSON schema", "regex": "Regular expression", "choice": "Choice (one per line)",
               "none": "None (free text)"}


def engine_factory(settings: RunSettings) -> Callable[[EngineConfig, Any], ConstrainedEngine]:
    return lambda config, weights: ConstrainedEngine(config, weights, constraint=settings.constraint,
                                                     jump_forward=settings.jump_forward,
                                                     early_masks=settings.early_masks)


def current_settings(page: str) -> RunSettings:
    return page_settings(page, preset_settings)


def constrained_explanation() -> None:
    explanation(
        "Constrained decoding: mask, then sample",
        [r"A(s) = \{\, t \in V : \text{out} \cdot t \in \operatorname{Pre}(L(G)) \,\}",
         r"\tilde p(t \mid x) = \frac{p(t \mid x)\,[\,t \in A(s)\,]}{\sum_{u \in A(s)} p(u \mid x)}",
         r"|A(s)| = 1 \Rightarrow \text{no choice: write it (jump-forward)}"],
        ["Before every sampled token the grammar G (a JSON schema, a regular expression or a list of choices) "
         "computes A(s), the tokens that keep the output a prefix of a valid string; every other logit becomes "
         "−∞. Whatever is then sampled, greedy or not, the output stays valid.",
         "**Blue** tokens were the model's own first choice; **orange** ones were steered: the model's favourite "
         "was forbidden (hover a token for its five favourites, ✗ = forbidden).",
         "**Grey**: the grammar allowed one token, so a whole forward pass decided nothing. **Jump-forward** "
         "writes such text without sampling (**green**); the next step computes it as a small chunk.",
         "The lower chart is the probability the model put on forbidden tokens: where it is high the grammar "
         "overrides the model, and the answer may be valid yet wrong.",
         "**Early masks** (on by default): the next mask is computed on a worker thread while the model runs, so "
         "“Sampling waited” stays near zero however long the mask takes; that is why the speed cost is "
         "avoidable.",
         "**Compare** runs the same prompt free, masked and with jump-forward: validity, steps and the cost of "
         "the mask."],
        note=f"Pre(L(G)): every prefix of a string the grammar accepts; out · t: the output so far with token t "
             f"appended. Masks come from llguidance (the grammar engine behind the guidance backend of vLLM and SGLang): it "
             f"walks a trie of the vocabulary's byte strings against the grammar's state, so a mask over "
             f"{49152:,} tokens costs about 0.1 to 1 ms on a 2-core CPU, more while other work shares it "
             f"(“Every output token” times each one). "
             f"Probabilities are the model's own (softmax of its logits, "
             f"temperature 1) before the mask.",
    )


# ---- settings ------------------------------------------------------------------------------------

def _keys(page: str) -> dict[str, str]:
    return {k: f"{page}-{k}" for k in ("preset", "prompt", "kind", "spec", "layout", "jf", "max", "temp", "seed", "n",
                                       "early")}


def _load_form(page: str, s: RunSettings) -> None:
    k, ss = _keys(page), st.session_state
    ss[k["prompt"]] = s.prompt
    ss[k["kind"]] = s.constraint.kind if s.constraint else "none"
    ss[k["spec"]] = s.constraint.spec if s.constraint else ""
    ss[k["layout"]] = s.constraint.json_layout if s.constraint else "flexible"
    ss[k["jf"]] = s.jump_forward
    ss[k["early"]] = s.early_masks
    ss[k["max"]], ss[k["temp"]], ss[k["seed"]], ss[k["n"]] = s.max_tokens, s.temperature, s.seed, s.n


def _pick_preset(session: EngineSession, page: str) -> None:
    name = st.session_state[_keys(page)["preset"]]
    preset = preset_by_name(name)
    if preset is None:  # "your own": keep the fields as they are, to be edited
        return
    session.clear_input_errors()
    settings = dataclasses.replace(preset_settings(preset, jump_forward=bool(st.session_state.get(_keys(page)["jf"], True))),
                                   early_masks=bool(st.session_state.get(_keys(page)["early"], True)))
    _load_form(page, settings)
    restart_with(session, page, settings, engine_factory)


def _apply(session: EngineSession, page: str) -> None:
    k, ss = _keys(page), st.session_state
    session.clear_input_errors()
    kind = ss.get(k["kind"], "none")
    constraint = None if kind == "none" else Constraint(kind, ss.get(k["spec"], ""), json_layout=ss.get(k["layout"], "flexible"))
    preset = preset_by_name(ss.get(k["preset"], ""))
    if preset is not None and (constraint is None or constraint.spec != preset.constraint.spec
                               or ss.get(k["prompt"], "") != preset.prompt):
        ss[k["preset"]] = OWN  # edited: no longer the preset it started from
    elif preset is not None:
        constraint = Constraint(kind, constraint.spec, preset.constraint.name, constraint.json_layout)
    try:
        settings = check_settings(ss.get(k["prompt"], ""), constraint, bool(ss.get(k["jf"], True)),
                                  int(ss.get(k["max"], 0)), float(ss.get(k["temp"], 0.0)), int(ss.get(k["seed"], 0)),
                                  int(ss.get(k["n"], 1)), session.weights.tokenizer,
                                  preset.name if preset is not None and ss[k["preset"]] != OWN else "",
                                  bool(ss.get(k["early"], True)))
    except ValueError as e:
        session.report(f"Run not started: {e} The run shown below is unchanged.")
        return
    restart_with(session, page, settings, engine_factory)


def settings_form(session: EngineSession, page: str) -> None:
    k, ss = _keys(page), st.session_state
    s = current_settings(page)
    if k["prompt"] not in ss:
        _load_form(page, s)
    names = [p.name for p in PRESETS] + [OWN]
    ss.setdefault(k["preset"], s.preset if s.preset in names else OWN)
    with st.expander(":material/tune: Prompt and grammar", expanded=True):
        c = st.columns([2, 3])
        c[0].selectbox("Preset (starts it at once)", names, key=k["preset"], on_change=_pick_preset,
                       args=(session, page))
        preset = preset_by_name(ss[k["preset"]])
        if preset is not None:
            c[1].caption(f":material/lightbulb: {preset.lesson}")
        with st.form(f"{page}-form", border=False):
            st.text_area("Prompt (a user turn of the chat template)", key=k["prompt"], height=80)
            c = st.columns([1.1, 2.9])
            c[0].radio("Grammar", list(KIND_LABELS), format_func=KIND_LABELS.get, key=k["kind"])
            c[1].text_area("JSON schema, regular expression, or choices (one per line)", key=k["spec"], height=180)
            g = st.columns([1.2, 1.3, 1, 1, 1])
            g[0].radio("JSON layout", ["flexible", "compact"], key=k["layout"], horizontal=True,
                       help="flexible: whitespace allowed between JSON tokens, so the model lays the JSON out as it "
                            "learned to; compact: none, so jump-forward can write more, but the model is pushed "
                            "off its own layout")
            g[1].toggle("Jump-forward", key=k["jf"],
                        help="write text the grammar allows in one way only without sampling it")
            g[2].number_input("Max tokens", step=8, key=k["max"], help=f"1 to {MAX_OUTPUT_TOKENS}")
            g[3].number_input("Temperature", step=0.1, key=k["temp"], help="0 = greedy")
            g[4].number_input("Samples", step=1, key=k["n"], help=f"1 to {MAX_SAMPLES}; more than 1 needs a temperature")
            h = st.columns([1, 3])
            h[0].number_input("Seed", step=1, key=k["seed"])
            h[1].toggle("Early masks: the next mask is computed during the forward pass", key=k["early"],
                        help="on: as soon as a token is sampled, a worker thread computes the grammar's next mask "
                             "while the model runs (llguidance releases Python's lock), so sampling rarely waits; "
                             "off: the mask is computed after the forward pass and sampling waits for all of it")
            st.form_submit_button("Apply and restart", icon=":material/restart_alt:", on_click=_apply,
                                  args=(session, page))


# ---- the selected step ---------------------------------------------------------------------------

def _forced_before(extra: dict[str, Any], step: int) -> dict[str, int]:
    """Sample label -> tokens jump-forward wrote in `step` (the next step computes them as one chunk)."""
    out: dict[str, int] = {}
    for view in extra.get("requests", {}).values():
        for s in view["samples"]:
            n = sum(1 for e in s["events"] if e["kind"] == "forced" and e["step"] == step)
            if n:
                out[s["label"]] = n
    return out


def _batch_line(record: StepRecord) -> str:
    if not record.batch:
        return f"Step {record.step}: nothing to compute."
    forced_last_step = _forced_before(record.extra("constrained") or {}, record.step - 1)
    parts = []
    for b in record.batch:
        if b.context_len == b.num_tokens:
            what = "prompt"
        elif b.request_id in forced_last_step:
            what = f"the last sampled token + {plural(forced_last_step[b.request_id], 'token')} of jump-forward text"
        elif b.num_tokens > 1:
            what = "a chunk: the prompt's rest, or a recompute"
        else:
            what = "decode"
        parts.append(f"{b.request_id}: {plural(b.num_tokens, 'token')} ({what})")
    forced = sum(1 for e in record.emitted if e.forced)
    tail = f" · jump-forward wrote {plural(forced, 'token')}" if forced else ""
    return step_line(record, parts, tail)


def step_section(session: EngineSession, record: StepRecord, history: list[StepRecord], page: str) -> None:
    extra = record.extra("constrained") or {}
    ids = list(extra.get("requests", {}))
    if not ids:
        st.caption("No request yet.")
        return
    rid = st.selectbox("Request", ids, key=f"{page}-request") if len(ids) > 1 else ids[0]
    view = request_view(extra, rid)
    samples = view["samples"]
    if not samples or not samples[0]["events"]:
        st.markdown(_batch_line(record))
        st.caption("The prompt is being computed; the first output token and its mask come with the next step.")
        return
    prev = request_view(history[-2].extra("constrained"), rid) if len(history) > 1 else None
    previous = {s["label"]: len(s["events"]) for s in prev["samples"]} if prev else {}
    s0 = samples[0]
    summary = summarize(s0)
    last = last_mask(s0)
    kinds = summary.kinds
    m = st.columns(6)
    m[0].metric("Output tokens", summary.tokens, help=f"of {s0['label']}")
    m[1].metric("Steered", kinds.get("steered", 0), help="tokens where the model's first choice was forbidden")
    m[2].metric("No choice", kinds.get("only", 0) + kinds.get("forced", 0),
                help="tokens the grammar allowed in one way only: sampled anyway (grey) or written by jump-forward "
                     "(green)")
    vocab = f"of the {session.engine.tokenizer.vocab_size:,} tokens of the vocabulary"
    m[3].metric("Allowed at the last mask", NO_VALUE if last is None else f"{last.allowed:,}",
                help=vocab if last is None else f"{vocab}, at output token {last.token}" + (
                    f"; jump-forward wrote the {plural(last.forced_after, 'token')} after it, which need no mask"
                    if last.forced_after else ""))
    slow_at, slow_s = summary.slowest_mask
    m[4].metric("Mask per token", fmt_duration(summary.median_mask_seconds) if summary.masked_tokens else "–",
                help="llguidance computing the grammar's bitmask, and its unpacking: the median over this sample's "
                     f"{plural(summary.masked_tokens, 'masked token')} (the slowest, masked token {slow_at + 1}, took "
                     f"{fmt_duration(slow_s)}; all of them {fmt_duration(summary.mask_seconds)}). With the "
                     "statistics this page draws (the model's softmax, its top 5 and the forbidden probability) the "
                     f"logits hook took {fmt_duration(summary.median_hook_seconds)} a token; this step took "
                     f"{fmt_duration(record.wall_seconds)}")
    m[5].metric("Sampling waited", fmt_duration(summary.median_wait_seconds) if summary.masked_tokens else "–",
                help="per token (median), how long sampling waited for the mask after the forward pass: all of the "
                     "mask's time when it is computed then, little when it was computed early (the toggle “Early "
                     "masks”)")
    constraint = view["constraint"]
    if constraint is not None:
        compile_s = view.get("compile_seconds")
        st.caption(f"Grammar: **{constraint['name'] or constraint['kind']}** ({constraint['kind'].replace('_', ' ')}"
                   f"{', ' + constraint['json_layout'] + ' JSON' if constraint['kind'] == 'json_schema' else ''}), "
                   f"jump-forward {'on' if view['jump_forward'] else 'off'}, early masks "
                   f"{'on' if view.get('early_masks') else 'off'}"
                   + (f"; its matcher was built in {fmt_duration(compile_s)}" if compile_s else ""))
    st.markdown(_batch_line(record))
    constrained_strips(samples, previous, session.weights.tokenizer)
    label = st.selectbox("Sample", [s["label"] for s in samples], key=f"{page}-sample") if len(samples) > 1 else s0["label"]
    sample = next(s for s in samples if s["label"] == label)
    show_figure(mask_figure(sample, session.engine.tokenizer.vocab_size, session.weights.tokenizer),
                key="cd-mask", height=540)
    with st.expander(":material/table_rows: Every output token: allowed, wanted, written"):
        st.dataframe(pd.DataFrame(token_rows(sample, session.weights.tokenizer)), hide_index=True, width="stretch",
                     placeholder=NO_VALUE)
        st.caption(f"{NO_VALUE}: no value. A token written by jump-forward had no model pass; with no grammar there "
                   "is no mask.")


# ---- free vs masked vs jump-forward --------------------------------------------------------------

def _compare(session: EngineSession, page: str) -> None:
    settings = current_settings(page)
    try:
        runs = run_modes(settings, session.weights, session.server)
    except Exception as e:  # noqa: BLE001 (a failed comparison is a message; the page and its run stay)
        session.report(f"The comparison failed: {type(e).__name__}: {e}")
        return
    page_cache(page)["modes"] = (settings, runs)


def _masked_verdict(runs: list) -> str:
    """A masked run is valid unless it stopped before the grammar was complete (max tokens), which the mask
    cannot prevent: it only keeps what is written a prefix of a valid string."""
    cut = [r.mode for r in runs if not r.valid and r.finish_reason == "length"]
    broken = [f"{r.mode} (ended by {r.finish_reason})" for r in runs if not r.valid and r.finish_reason != "length"]
    if not cut and not broken:
        return {1: "The masked run is valid.", 2: "Both masked runs are valid."}.get(len(runs),
                                                                                    "Every masked run is valid.")
    out = ""
    if cut:
        out += (f"{' and '.join(cut)} stopped at max tokens before the grammar was complete: the mask keeps the "
                "output a prefix of a valid string, only the end of the grammar makes it whole (raise max tokens, or "
                "bound strings with maxLength). ")
    if broken:
        out += f"Not valid although the grammar ended them: {', '.join(broken)}; that is a bug. "
    return out.strip()


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("Free vs masked vs jump-forward")
    settings = current_settings(page)
    if settings.constraint is None:
        st.caption("The run above has no grammar: pick one to compare.")
        return
    modes = modes_for(settings.constraint)
    judged = " (JSON may have whitespace anywhere)" if settings.constraint.kind == "json_schema" else ""
    st.caption(f"The current prompt, greedy, on {len(modes)} fresh engines: {', '.join(modes)}. Every output is "
               f"judged by the current grammar{judged}. A few seconds on 2 CPU cores.")
    st.button("Run the comparison", key=f"{page}-compare", icon=":material/compare_arrows:", on_click=_compare,
              args=(session, page))
    cached = page_cache(page).get("modes")
    if cached is None:
        st.caption("Not run yet in this session.")
        return
    ran_with, runs = cached
    if ran_with != settings:
        st.caption(":material/info: Measured for an earlier prompt or grammar; run it again for the current one.")
    show_figure(modes_figure(runs), key="cd-modes", height=380)
    _modes_table(runs)
    free = next((r for r in runs if r.mode == MODES[0]), None)
    jf = next((r for r in runs if r.mode == MODES[2]), None)
    masked = next((r for r in runs if r.mode == MODES[1]), None)
    if free and masked and jf:
        saved = masked.steps - jf.steps
        steps = (f"Jump-forward took {plural(saved, 'step')} fewer than the mask alone ({masked.steps} → {jf.steps})"
                 if saved > 0 else f"Jump-forward saved no step here ({masked.steps} → {jf.steps})")
        if jf.text != masked.text:
            steps += ", and wrote a different text: forced text is computed as one chunk, which may round differently"
        verdict = _masked_verdict([r for r in runs if r.mode != MODES[0]])
        # Whitespace aside, masked runs that differ wrote different values (the compact layout once gave an age
        # the prompt did not): said here, a lecturer need not spot it in the answers.
        written = {"".join(r.text.split()) for r in runs if r.mode != MODES[0] and r.valid}
        values = (" Here the valid masked runs do not all write the same values (compare their answers): each "
                  "layout or forced chunk changes what the model reads before it picks one." if len(written) > 1
                  else "")
        st.caption(f"Free text {'is' if free.valid else 'is not'} valid. {verdict} {steps}; the "
                   f"masks cost {1e3 * masked.mask_seconds:.1f} ms in all against {masked.wall_seconds:.2f} s of "
                   "engine time. Valid means the shape the grammar asks for, not that the values are right: the "
                   f"mask leaves the choice of each value to the model.{values}")
    bench = load_bench()
    if bench and bench.get("greedy"):
        greedy, sampled = bench_tables(bench)
        with st.expander(":material/table_chart: Benchmark on this machine: every preset, every mode "
                         "(bench/constrained_decoding.py)"):
            _bench_greedy(pd.DataFrame(greedy), page)
            if sampled:
                st.markdown("**Sampled answers that are valid** (one request with several samples at a temperature, "
                            "per preset):")
                st.dataframe(pd.DataFrame(sampled), hide_index=True, width="stretch")
            if bench.get("note"):
                st.caption(bench["note"])


# The columns the live comparison and the benchmark share, with the same short headers and widths.
_SHARED_COLUMNS = {
    "valid": st.column_config.TextColumn(width=52, help="the output matches the grammar"),
    "engine steps": st.column_config.NumberColumn(
        "steps", width=56, help="engine steps (jump-forward writes several tokens in one)"),
    "output tokens": st.column_config.NumberColumn("tokens", width=60, help="output tokens"),
}


def _answers_in_pairs(answers: list[tuple[str, str]]) -> None:
    """(mode, text) pairs two to a row, so that modes side by side line up; each text wrapped and whole."""
    for i in range(0, len(answers), 2):
        for col, (mode, text) in zip(st.columns(2), answers[i:i + 2]):
            with col:
                st.caption(mode)
                st.code(text or "(nothing)", language=None, wrap_lines=True)


def _bench_greedy(frame: pd.DataFrame, page: str) -> None:
    """Every preset greedy in every mode: the numbers in a table that fits the expander, and one preset's answers
    below it, wrapped and whole (a text column pushed the table far past the page's edge)."""
    num, text = st.column_config.NumberColumn, st.column_config.TextColumn
    st.dataframe(frame.drop(columns="text"), hide_index=True, width="stretch", placeholder=NO_VALUE,
                 column_config=_SHARED_COLUMNS | {
        "preset": text(width=240), "mode": text(width=170),
        "mask µs (mean)": num("mask µs", format="%,.0f", width=70, help="mean time to build one token mask"),
        "mask share of step time (%)": num("mask share", format="%.2f%%", width=84,
                                           help="the masks' share of the engine's step time"),
    })
    preset = st.selectbox("The answers of", list(dict.fromkeys(frame["preset"])), key=f"{page}-bench-preset")
    rows = frame[frame["preset"] == preset]
    _answers_in_pairs(list(zip(rows["mode"], rows["text"])))


def _modes_table(runs: list[ModeRun]) -> None:
    """The numbers in a table whose ten columns fit at projector width; what each mode wrote below it, wrapped
    and whole (in a table column the JSON was cut off and pushed the table past the page's edge)."""
    rows = pd.DataFrame(mode_rows(runs))
    num, text = st.column_config.NumberColumn, st.column_config.TextColumn
    st.dataframe(rows.drop(columns="text"), hide_index=True, width="stretch", placeholder=NO_VALUE,
                 column_config=_SHARED_COLUMNS | {
        "mode": text(width=190),
        "parses as JSON": text("JSON", width=52, help="the output parses as JSON"),
        "time (s)": num(format="%.2f", width=64, help="engine time, seconds"),
        "mask time (ms)": num("masks (ms)", format="%.1f", width=80,
                              help="time spent building the token masks, milliseconds"),
        "forced": num(width=58, help="tokens written by jump-forward, with no choice to make"),
        "steered": num(width=64, help="tokens where the mask overrode the model's own first choice"),
        "ended by": text(width=84),
    })
    st.markdown("**What each mode wrote**")
    _answers_in_pairs([(r.mode, r.text) for r in runs])
