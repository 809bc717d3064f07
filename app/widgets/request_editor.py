"""Scenario picker, JSON upload/download, request table editor and a live "add request" form.

Loading, uploading or applying an edit builds a fresh engine (a new timeline). Adding a request
live keeps the timeline: the request arrives at the engine's next step. Every bad input becomes
one st.error naming the request and field; nothing already computed is lost.
"""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import pandas as pd
import streamlit as st

from engine.config import DRAFTERS, EngineConfig

from app.scenarios import (RequestSpec, Scenario, ScenarioError, parse_request, require_unique_ids,
                           scenario_from_json)
from app.session import EngineSession
from app.widgets.controls import follow_latest

# request_id is the name a scenario gives a request ("A-turn1", "shot3"): the radix page labels the tree
# with it, so a restart from the editor must not replace it with r0, r1, ...
COLUMNS = ["request_id", "prompt", "chat", "max_tokens", "arrival_step", "temperature", "top_k", "top_p", "seed", "n",
           "ignore_eos", "stop"]
_DEFAULTS = {f.name: f.default for f in fields(RequestSpec)}
MAX_LIVE_N = 8  # samples a request added from the popover may ask for, where the engine serves several


def _version_key(page: str) -> str:
    return f"{page}-scenario-version"


def load_scenario(session: EngineSession, page: str, scenario: Scenario) -> bool:
    """Restart the page's engine on `scenario` (a new timeline); the editor's widgets follow it."""
    return _load(session, page, scenario)


def _load(session: EngineSession, page: str, scenario: Scenario) -> bool:
    if not session.reset(scenario):
        return False
    st.session_state[_version_key(page)] = st.session_state.get(_version_key(page), 0) + 1
    st.session_state[f"{page}-playing"] = False
    follow_latest(page)
    return True


def columns_for(scenario: Scenario) -> list[str]:
    """The editor's columns: an adapter column only where the engine serves LoRA adapters."""
    return COLUMNS[:1] + ["adapter"] + COLUMNS[1:] if "max_loras" in scenario.engine else COLUMNS


def requests_frame(requests: tuple[RequestSpec, ...], columns: list[str] = COLUMNS) -> pd.DataFrame:
    rows = []
    for r in requests:
        d = r.to_dict()
        d["stop"] = d["stop"][0] if d["stop"] else ""
        d["adapter"] = r.adapter or ""
        rows.append({c: d[c] for c in columns})
    df = pd.DataFrame(rows, columns=columns)
    # Nullable integers: a column of unset seeds is empty cells, not the word "None" (object dtype).
    df["seed"] = df["seed"].astype("Int64")
    return df


def _clean(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):  # numpy scalars from the data editor
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def requests_from_frame(df: pd.DataFrame) -> list[RequestSpec]:
    """Rows of the edited table as validated RequestSpecs; blank rows are skipped."""
    specs: list[RequestSpec] = []
    columns = [c for c in columns_for(Scenario("", (), {"max_loras": 1})) if c in df.columns]
    for i, row in enumerate(df.to_dict("records")):
        raw = {c: _clean(row.get(c)) for c in columns}
        if not raw.get("prompt") or not str(raw["prompt"]).strip():
            if all(raw[c] in (None, "", False) for c in columns if c != "prompt"):
                continue
            raise ScenarioError(f"request {i + 1}: 'prompt' is required")
        data = {k: (v if v is not None else _DEFAULTS[k]) for k, v in raw.items()}
        data["seed"] = raw["seed"]
        name = str(raw["request_id"] or "").strip()
        data["request_id"] = name or None  # an empty cell: named by position
        stop = str(data.pop("stop") or "")
        data["stop"] = [stop] if stop else []
        for key in ("temperature", "top_p"):
            data[key] = float(data[key])
        if "adapter" in data:
            data["adapter"] = str(raw["adapter"] or "").strip() or None
        specs.append(parse_request(data, i))
    if not specs:
        raise ScenarioError("the scenario needs at least one request with a prompt")
    require_unique_ids(specs, "request names", " (or left empty for r0, r1, ...)")
    return specs


def _engine_inputs(scenario: Scenario, prefix: str) -> dict[str, Any]:
    cfg = scenario.engine_config()
    c = st.columns(4)
    out: dict[str, Any] = {}
    out["block_size"] = c[0].selectbox("block_size (tokens)", [1, 2, 4, 8, 16, 32, 64],
                                       index=[1, 2, 4, 8, 16, 32, 64].index(cfg.block_size)
                                       if cfg.block_size in (1, 2, 4, 8, 16, 32, 64) else 4, key=f"{prefix}-bs")
    out["num_blocks"] = c[1].number_input("num_blocks", 1, 4096, cfg.num_blocks, key=f"{prefix}-nb")
    out["max_num_seqs"] = c[2].number_input("max_num_seqs", 1, 256, cfg.max_num_seqs, key=f"{prefix}-ms")
    out["max_num_batched_tokens"] = c[3].number_input("max_num_batched_tokens (token budget)", 1, 8192,
                                                      cfg.max_num_batched_tokens, key=f"{prefix}-mbt")
    c = st.columns(4)
    out["max_model_len"] = c[0].number_input("max_model_len", 8, 8192, cfg.max_model_len, key=f"{prefix}-mml")
    out["policy"] = c[1].radio("policy", ["continuous", "static"], index=["continuous", "static"].index(cfg.policy),
                               horizontal=True, key=f"{prefix}-pol")
    out["chunked_prefill"] = c[2].checkbox("chunked prefill", cfg.chunked_prefill, key=f"{prefix}-cp")
    if "max_loras" in scenario.engine:  # multi-LoRA scenarios: how many adapters fit on the device at once
        out["max_loras"] = c[3].number_input("max_loras (adapter slots on the device)", 1, 8, cfg.max_loras,
                                             key=f"{prefix}-ml")
    if "spec_drafter" in scenario.engine:  # speculative-decoding scenarios show their drafter knobs
        c = st.columns(4)
        drafters = list(DRAFTERS)
        out["spec_drafter"] = c[0].selectbox("spec_drafter", drafters, index=drafters.index(cfg.spec_drafter),
                                             key=f"{prefix}-sd")
        out["spec_gamma"] = c[1].number_input("spec_gamma (drafts per round; trees: 0 = off)", 0, 16,
                                              cfg.spec_gamma, key=f"{prefix}-sg")
        if cfg.spec_drafter in ("medusa", "eagle"):
            out["spec_tree_nodes"] = c[2].number_input("spec_tree_nodes", 1, 128, cfg.spec_tree_nodes,
                                                       key=f"{prefix}-tn")
            c2 = st.columns(4)
            out["spec_tree_depth"] = c2[0].number_input("spec_tree_depth (EAGLE)", 1, 16, cfg.spec_tree_depth,
                                                        key=f"{prefix}-td")
            out["spec_tree_topk"] = c2[1].number_input("spec_tree_topk", 1, 16, cfg.spec_tree_topk,
                                                       key=f"{prefix}-tk")
        else:
            out["spec_draft_layers"] = c[2].number_input("spec_draft_layers (early exit)", 1, 30,
                                                         cfg.spec_draft_layers, key=f"{prefix}-sl")
    return {k: (int(v) if isinstance(v, float) else v) for k, v in out.items()}


def scenario_editor(session: EngineSession, page: str, library: list[Scenario]) -> None:
    version = st.session_state.setdefault(_version_key(page), 0)
    with st.expander(":material/tune: Scenario and requests", expanded=False):
        _picker(session, page, library)
        _uploader(session, page)
        st.divider()
        prefix = f"{page}-ed{version}"
        with st.form(key=f"{prefix}-form", border=False):
            st.markdown("**Requests** (edit cells, add or delete rows; prompts go through the chat template "
                        "when *chat* is ticked)")
            edited = st.data_editor(
                requests_frame(session.scenario.requests, columns_for(session.scenario)), key=f"{prefix}-table",
                num_rows="dynamic",
                hide_index=True, width="stretch", placeholder="",  # empty cells mean "default", not "None"
                column_config={
                    # Name and prompt pinned: the sampling fields scroll into view beside the prompt they belong to
                    # (twelve fields do not fit 1280 pixels without cutting every header to a few letters).
                    "prompt": st.column_config.TextColumn("prompt", width="medium", required=True, pinned=True),
                    "max_tokens": st.column_config.NumberColumn("max_tokens", min_value=1, max_value=1024, step=1),
                    "arrival_step": st.column_config.NumberColumn("arrival step", min_value=0, step=1),
                    "temperature": st.column_config.NumberColumn("temperature", min_value=0.0, max_value=5.0, step=0.1),
                    "top_k": st.column_config.NumberColumn("top_k", min_value=0, step=1),
                    "top_p": st.column_config.NumberColumn("top_p", min_value=0.01, max_value=1.0, step=0.05),
                    "seed": st.column_config.NumberColumn("seed", step=1, help="empty: a fresh random seed"),
                    "n": st.column_config.NumberColumn("n (samples)", min_value=1, max_value=8, step=1),
                    "stop": st.column_config.TextColumn("stop string"),
                    "request_id": st.column_config.TextColumn("name", width="small", help="empty: r0, r1, ... by position",
                                                              pinned=True),
                    "adapter": st.column_config.SelectboxColumn(
                        "adapter", options=["", *getattr(session.engine, "adapter_names", ())],
                        help="the LoRA adapter this request runs with; empty: the base model"),
                },
            )
            st.markdown("**Engine**")
            knobs = _engine_inputs(session.scenario, prefix)
            applied = st.form_submit_button("Apply and restart the engine", icon=":material/restart_alt:", type="primary")
        if applied:
            try:
                specs = requests_from_frame(edited)
                EngineConfig(**{**session.scenario.engine, **knobs})
            except (ScenarioError, ValueError) as e:
                st.error(f"Not applied: {e}", icon=":material/error:")
            else:
                _load(session, page, Scenario(session.scenario.name + " (edited)" if "(edited)" not in session.scenario.name
                                              else session.scenario.name, tuple(specs),
                                              {**session.scenario.engine, **knobs}, session.scenario.description))
                st.rerun()
        st.download_button("Download this scenario (JSON)", session.scenario.to_json(), key=f"{page}-download",
                           file_name=f"{page}-scenario.json", mime="application/json", icon=":material/download:")
    _live_add(session, page)


def _picker(session: EngineSession, page: str, library: list[Scenario]) -> None:
    names = [s.name for s in library]
    key = f"{page}-pick"

    def on_pick() -> None:
        chosen = next(s for s in library if s.name == st.session_state[key])
        _load(session, page, chosen)

    if key not in st.session_state:
        st.session_state[key] = session.scenario.name if session.scenario.name in names else names[0]
    st.selectbox("Ready-made scenario (loading one restarts the engine)", names, key=key, on_change=on_pick)
    if session.scenario.name != st.session_state[key]:  # edited below or uploaded: the picker alone would mislead
        c = st.columns([3, 1], vertical_alignment="center")
        c[0].caption(f"Running now: **{session.scenario.name}**.")
        # Picking the shown entry again is no change for the selectbox, so going back needs its own button.
        c[1].button("Back to the ready-made one", key=f"{page}-pick-back", on_click=on_pick, icon=":material/undo:",
                    width="stretch")


def _uploader(session: EngineSession, page: str) -> None:
    up = st.file_uploader("…or upload a scenario JSON (the same format as the download below)", type=["json"],
                          key=f"{page}-upload", max_upload_size=1)  # MB; scenarios are a few KB
    seen_key, error_key = f"{page}-upload-seen", f"{page}-upload-error"
    if up is None:
        st.session_state.pop(error_key, None)
        return
    if st.session_state.get(seen_key) != up.file_id:  # parse each upload once, not on every rerun
        st.session_state[seen_key] = up.file_id
        try:
            scenario = scenario_from_json(up.getvalue())
        except ScenarioError as e:
            st.session_state[error_key] = f"Could not use {up.name}: {e}"
        else:
            st.session_state.pop(error_key, None)
            _load(session, page, scenario)
            st.rerun()
    if st.session_state.get(error_key):
        st.error(st.session_state[error_key], icon=":material/error:")


def _live_add(session: EngineSession, page: str) -> None:
    """Inject a request into the running engine: continuous batching picks it up next step."""
    if session.engine is None:
        return
    prefix = f"{page}-live"
    with st.popover("Add a request now", icon=":material/add:"):
        with st.form(key=f"{prefix}-form", border=False):
            prompt = st.text_input("Prompt", "What is a GPU?", key=f"{prefix}-prompt")
            c = st.columns(3)
            max_tokens = c[0].number_input("max_tokens", 1, 512, 12, key=f"{prefix}-mt")
            temperature = c[1].number_input("temperature", 0.0, 5.0, 0.0, 0.1, key=f"{prefix}-t")
            max_n = getattr(session.engine, "max_request_n", MAX_LIVE_N)  # the disaggregated engine serves n = 1
            n = c[2].number_input("n", 1, max_n, 1, key=f"{prefix}-n", disabled=max_n == 1,
                                  help="samples of this prompt" + (" (this engine serves one per request)"
                                                                   if max_n == 1 else ""))
            names = getattr(session.engine, "adapter_names", ())
            adapter = (st.selectbox("LoRA adapter", ["(base model)", *names], key=f"{prefix}-adapter")
                       if names else "(base model)")
            go = st.form_submit_button(f"Add (arrives at step {session.engine.step_index})")
        if go:
            if not str(prompt).strip():
                session.report("Request not added: the prompt must not be empty")
            else:
                try:
                    spec = RequestSpec(str(prompt), max_tokens=int(max_tokens), temperature=float(temperature),
                                       n=int(n), ignore_eos=True,
                                       adapter=None if adapter == "(base model)" else adapter)
                    spec.sampling_params()
                except ValueError as e:
                    session.report(f"Request not added: {e}")
                else:
                    session.add_live_request(spec)
            st.rerun()
