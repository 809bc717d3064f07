"""Sections of the Medusa and EAGLE page (pages/08_medusa_eagle.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.trace import StepRecord

from app.analysis.speculative import (ALL_DRAFTERS_BENCH, ALL_DRAFTERS_BENCH_COMMAND, BENCH_PATH, DRAFTER_LABELS,
                                      bench_setup, load_bench, other_bench_note, speedup_vs_plain)
from app.analysis.tree_spec import (TREE_LABELS, compare_tree_drafters, cost_caption, mask_caption,
                                    mean_tokens_per_round, round_sentence, training_summary, tree_rounds, tree_series,
                                    verify_cost_sweep)
from app.charts.draft_tree import (draft_tree_figure, tokens_per_round_figure, tree_compare_figure, tree_height,
                                   tree_mask_figure, verify_cost_figure)
from app.formatting import plural
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

TREE_DRAFTERS = ("eagle", "medusa")
COST_REPEATS = 5  # verification passes per tree size: the median of five rides out most bursts of load


def tree_explanation() -> None:
    explanation(
        "Tree speculation: Medusa (Cai et al. 2024) and EAGLE (Li et al. 2024)",
        [r"\text{Medusa head } k:\ \ h^{(k)}_t = h_t + {\operatorname{SiLU}(W_k h_t + b_k)}",
         r"x_{t+2+k} \sim \operatorname{softmax}(W_{\text{LM}}\, h^{(k)}_t)",
         r"\text{EAGLE:}\ \ \hat f_{t+1} = \operatorname{Layer}\big(\operatorname{fc}[f_t;\, e(x_{t+1})]\big)",
         r"x_{t+2} \sim \operatorname{softmax}(W_{\text{LM}}\, \hat f_{t+1})",
         r"\text{mask}_{ij} = 1 \iff j = i \text{ or } j \text{ is an ancestor of } i",
         r"\text{position}(i) = \text{start} + \text{depth}(i)",
         r"\tau = \text{tokens per target pass} = \text{accepted path} + 1"],
        ["Both drafters read the target's **own hidden state** (its final-normed feature), so no second model "
         "runs: a Medusa head is one small block, EAGLE one decoder layer of 30. Every draft still goes "
         "through the tied LM head, a fifth of this small model's weights, so here drafting costs a real share "
         "of a pass (Time drafting, below). Medusa: K independent heads, each guessing one position further; a "
         "**static** tree "
         "of their top-k combinations. EAGLE: one decoder layer run autoregressively on its own predicted "
         "features, expanding the likeliest nodes (a **dynamic** tree, EAGLE-2 style).",
         "The whole tree goes through **one** target pass: siblings share a position but each row sees only "
         "its ancestors (the mask on the right). Greedy: follow the child that equals the target's argmax, "
         "**green**; checked children that did not match are **red**, branches never reached **grey**.",
         "The round adds the accepted path plus one token of the target's own (◆): τ tokens for one pass.",
         "KV: every node was written to its own slot; the accepted path's slots are **moved** next to the "
         "context and all the rest rolled back, so the block table looks as if plain decoding had run.",
         "Bigger trees raise τ but the verification pass grows with the rows (the cost chart below)."],
        note="The heads were trained here, on the CPU, by self-distillation: see 'How the heads were trained'.",
    )


# ---- controls ------------------------------------------------------------------------------------

def tree_controls(session: EngineSession, page: str) -> None:
    cfg = session.scenario.engine_config()
    with st.form(key=f"{page}-tree-form", border=True):
        # The button has its own row: in a sixth of the row its text was cut ("Apply an…") at 1280 px,
        # and on a projector the enlarged labels squeezed every knob.
        c = st.columns([1.4, 1.1, 1.1, 1.1, 1.7], vertical_alignment="bottom")
        options = list(TREE_DRAFTERS) + ["none"]
        current = cfg.spec_drafter if cfg.spec_drafter in options else "eagle"
        drafter = c[0].selectbox("Drafter", options, index=options.index(current),
                                 format_func=lambda d: TREE_LABELS.get(d, "none (plain decoding)"),
                                 key=f"{page}-tree-drafter")
        nodes = c[1].slider("Tree nodes", 1, 64, min(cfg.spec_tree_nodes, 64), key=f"{page}-tree-nodes",
                            help="node budget: the likeliest nodes are kept (rows verified = nodes + 1)")
        depth = c[2].slider("Depth (EAGLE)", 1, 8, min(cfg.spec_tree_depth, 8), key=f"{page}-tree-depth")
        topk = c[3].slider("Top-k", 1, 8, min(cfg.spec_tree_topk, 8), key=f"{page}-tree-topk",
                           help="EAGLE: nodes expanded per depth and children per node; Medusa: ranks of each "
                                "head the static tree may use")
        mode = c[4].selectbox("Decoding (all requests)", DECODING_MODES, index=default_mode_index(session.scenario),
                              key=f"{page}-tree-mode")
        applied = st.form_submit_button("Apply and restart", icon=":material/restart_alt:", type="primary")
    if applied:
        scenario = session.scenario.with_engine(spec_drafter=drafter, spec_gamma=1, spec_tree_nodes=int(nodes),
                                                spec_tree_depth=int(depth), spec_tree_topk=int(topk))
        scenario = apply_decoding_mode(scenario, mode)
        if load_scenario(session, page, scenario):
            st.rerun()


# ---- the selected step ---------------------------------------------------------------------------

def tree_step_section(session: EngineSession, record: StepRecord, history: list[StepRecord], page: str) -> None:
    cfg = session.engine.config if session.engine else session.scenario.engine_config()
    points = tree_series(history)
    m = st.columns(5)
    drafting = cfg.spec_drafter in TREE_DRAFTERS
    shape = plural(cfg.spec_tree_nodes, "node") + (f", depth {cfg.spec_tree_depth}, top-{cfg.spec_tree_topk}"
                                                   if cfg.spec_drafter == "eagle" else
                                                   f", top-{cfg.spec_tree_topk} per head")
    # As on the speculative page: a short value, the tree's shape in the grey chip beneath it.
    m[0].metric("Drafter", TREE_LABELS.get(cfg.spec_drafter, cfg.spec_drafter),
                delta=plural(cfg.spec_tree_nodes, "node") if drafting else None, delta_color="off", delta_arrow="off",
                help=shape if drafting else None)
    tau = mean_tokens_per_round(points)
    m[1].metric("τ so far", f"{tau:.2f}" if tau else "–", help="mean tokens per verification pass (accepted + 1)")
    m[2].metric("Rounds", len(points))
    drafting_time_metric(m[3], sum(p.draft_seconds for p in points), sum(p.verify_seconds for p in points),
                         "summed over the rounds so far: the drafter's heads, and the tree verification passes")
    step_tokens_metric(m[4], len(record.emitted), len(tree_rounds(record)), record.wall_seconds, "trees")
    if cfg.spec_drafter not in TREE_DRAFTERS:
        st.info("Plain decoding or a chain drafter: pick Medusa or EAGLE above to see draft trees.",
                icon=":material/info:")
    rounds, shown = latest_rounds(record, history, tree_rounds, "tree verified")
    if not rounds:
        st.caption("No tree yet: the first step is the prompt's prefill. Step on.")
        show_figure(tokens_per_round_figure(points, record.step, len(history)), key=f"{page}-tau", height=340)
    else:
        chosen = pick_round(rounds, [r["request_id"] for r in rounds], f"{page}-tree-pick", "Tree of request")
        st.markdown(round_sentence(chosen))
        show_figure(draft_tree_figure(chosen, f"Step {shown} · {chosen['request_id']}: the draft tree at position "
                                              f"{chosen['position']} ({chosen['mode']})"),
                    key=f"{page}-tree", height=tree_height(chosen), export_width=1400)
        left, right = st.columns([1, 1.25])
        with left:
            show_figure(tree_mask_figure(chosen), key=f"{page}-mask", height=470, export_width=800)
            st.caption(mask_caption(chosen))
        with right:
            show_figure(tokens_per_round_figure(points, record.step, len(history)), key=f"{page}-tau", height=470)
    with st.expander("Requests at this step", expanded=False):
        request_state_table(record)


# ---- knobs and their cost ------------------------------------------------------------------------

def _bench_taus() -> dict[str, list[tuple[int, float]]]:
    bench = load_bench(ALL_DRAFTERS_BENCH) or {}
    out: dict[str, list[tuple[int, float]]] = {}
    for r in bench.get("rows", []):
        if r["drafter"] in TREE_DRAFTERS and r["workload"] == "unseen":
            out.setdefault(f"{TREE_LABELS[r['drafter']]} (unseen prompts)", []).append(
                (r["gamma"], r["tokens_per_pass"]))
    return out


def cost_section(session: EngineSession, page: str) -> None:
    st.subheader("Tree size vs verification cost")
    st.markdown("A bigger tree catches more continuations, but every node is one more row in the target pass. "
                "This measures one verification pass over a 128-token context on **this server's model** for "
                "trees of 0 (plain decode) to 64 nodes; the right panel is τ from the benchmark.")
    cache = page_cache(page)
    if st.button("Measure verification cost", icon=":material/timer:", key=f"{page}-cost"):
        if session.engine is None:
            st.error("No engine: fix the settings above first.")
        else:
            with st.spinner("Timing target passes with 0–64 tree rows…"):
                cache["cost"] = verify_cost_sweep(session.engine, repeats=COST_REPEATS)
    costs = cache.get("cost")
    if costs:
        show_figure(verify_cost_figure(costs, taus=_bench_taus() or None), key=f"{page}-cost-fig", height=400)
        st.caption(cost_caption(costs))
    else:
        st.caption("Press **Measure verification cost** (a few seconds on the CPU).")


def bench_section() -> None:
    bench = load_bench(ALL_DRAFTERS_BENCH)
    with st.expander(":material/table_chart: The CPU benchmark: every drafter on the same prompts "
                     f"(bench/results/{ALL_DRAFTERS_BENCH.name})", expanded=True):
        if not bench or not any(r["drafter"] in TREE_DRAFTERS for r in bench.get("rows", [])):
            st.caption(f"No benchmark file yet: run `{ALL_DRAFTERS_BENCH_COMMAND}`.")
            return
        rows = []
        for r in bench["rows"]:
            if r["drafter"] == "plain":
                continue
            tree = r["drafter"] in TREE_DRAFTERS
            rows.append({"workload": r["workload"], "drafter": DRAFTER_LABELS.get(r["drafter"], r["drafter"]),
                         "γ or nodes": plural(r["gamma"], "node") if tree else f"γ = {r['gamma']}",
                         "tokens per pass (τ)": r["tokens_per_pass"], "speedup": r["speedup"],
                         "same tokens as plain": r["identical_to_plain"]})
        st.caption(f"`{bench.get('command')}` · greedy, batch 1: {bench_setup(bench)}; 'unseen' prompts are on "
                   "topics and in phrasings the heads were not trained on. τ is exact (greedy, counted); the "
                   "speed-up is wall time on a 2-core CPU and moves by tens of percent between runs, so two rows "
                   "with the same τ can differ in it: read small speed-up differences as noise."
                   + other_bench_note(bench, load_bench(BENCH_PATH),
                                      f"The speculative decoding page's table (bench/results/{BENCH_PATH.name})"))
        # One workload at a time, every row of it in view: all of them at once scrolled inside a fixed height,
        # and the tree drafters (the rows this page is about) sat below the fold.
        workloads = list(dict.fromkeys(r["workload"] for r in rows))
        shown = st.segmented_control("Workload", workloads, default=workloads[0], key="tree-bench-workload") \
            or workloads[0]
        st.dataframe(pd.DataFrame([r for r in rows if r["workload"] == shown]).drop(columns="workload"),
                     hide_index=True, width="stretch", height="content", column_config={
                         c: st.column_config.NumberColumn(c, format="%.2f")
                         for c in ("tokens per pass (τ)", "speedup")})


def training_section() -> None:
    with st.expander(":material/model_training: How the heads were trained", expanded=False):
        for name, title in (("medusa", "Medusa heads"), ("eagle", "EAGLE layer"), ("draft_model", "Draft model")):
            st.markdown(f"**{title}** · {training_summary(name)}")
        st.caption("Data: `python -m training.generate_data` (the model answers 2,196 templated prompts greedily: "
                   "topics x kinds of request, other topics x other kinds, copy-style tasks over its own earlier "
                   "answers, and the two lists crossed; then one prefill pass records its hidden state at every "
                   "position); scripts and logs: "
                   "`training/`, `engine/assets/spec_heads/*.log.json`. Drafting uses the 8192 most frequent "
                   "answer tokens as its LM head (`training/draft_vocab.py`): a full 49152-row head costs a "
                   "quarter of a target pass per row on the CPU. Verification always uses the full vocabulary.")


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("Medusa vs EAGLE on the same requests")
    cfg = session.scenario.engine_config()
    st.markdown(f"Three fresh engines run this scenario to the end: **plain decoding**, **Medusa** and **EAGLE**, "
                f"each tree with the knobs above ({plural(cfg.spec_tree_nodes, 'node')}).")
    runs = comparison_runner(
        session, page, button_label="Run all three", button_key=f"{page}-compare",
        progress_text="Running plain, Medusa and EAGLE…", step_text="Running all three… round {n}",
        expected_steps=40, hint="Press **Run all three** (about 30–90 s on the CPU).",
        run=lambda on_progress: compare_tree_drafters(session.scenario, shared_weights(), server_engine_settings(),
                                                      on_progress=on_progress),
        errors_of=lambda runs: (f"{r.label}: {e.message}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    cols = st.columns(len(runs))
    plain_texts = dict(runs["plain"].texts)
    for col, (k, r) in zip(cols, runs.items()):
        sp = speedup_vs_plain(runs, k)
        col.metric(r.label, f"{sp:.2f}×" if sp else "–", delta=f"{r.tokens_per_pass:.2f} tok/pass",
                   delta_color="off", delta_arrow="off")
        if k != "plain":
            greedy = all(s.temperature == 0 for s in session.scenario.requests)
            col.caption(("same text as plain decoding ✓" if dict(r.texts) == plain_texts else "text differs from plain")
                        + ("" if greedy else " (sampled: same distribution, not the same draws)"))
    show_figure(tree_compare_figure(runs), key=f"{page}-compare-bars", height=380)
