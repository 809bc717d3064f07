"""Sections of the radix prefix cache page (pages/06_radix_prefix_cache.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.trace import StepRecord

from app.analysis.radix import admissions, cache_series, compare_prefix_cache, lock_owners, radix_snapshot
from app.charts.radix_tree import cache_compare_figure, cache_series_figure, radix_tree_figure, tree_height
from app.runtime import server_engine_settings, shared_weights
from app.scenarios import RequestSpec
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.explain import explanation
from app.widgets.request_table import request_state_table


def radix_explanation() -> None:
    explanation(
        "Prefix caching and RadixAttention (SGLang)",
        [r"\text{cached}(p) = B \cdot k^{*}, \quad\allowbreak k^{*} = \max\{k : p_{1..kB} \text{ is a path from the root}\}",
         r"k \le \left\lfloor \tfrac{|p|-1}{B} \right\rfloor \quad\allowbreak (B = \text{block size})",
         r"\text{prefill tokens computed} = |p| - \text{cached}(p)",
         r"\text{token hit rate} = \frac{\sum_r \text{cached}(p_r)}{\sum_r |p_r|}"],
        ["Each node owns a run of whole KV blocks (B tokens each) and is labelled with the text they hold; "
         "a path from the root spells a cached prompt prefix. A new request walks down the tree and shares "
         "the blocks it matches: its prefill starts after them.",
         "**Few-shot**: the first request computes the ~150-token example block; the later ones hang a short "
         "branch under it and skip almost all their prefill. **Unrelated** prompts: every admission misses.",
         "**Multi-turn chat**: turn 2's prompt is turn 1's prompt + answer + a new question, so the whole "
         "conversation so far comes from the tree (the node grows instead of re-prefilling).",
         "Solid blue boxes are **locked** (on a running request's path: never evicted). Dashed grey boxes are "
         "**evictable**. With a small pool, unlocked leaves are evicted least-recently-used first; red dotted "
         "boxes were evicted in the selected step.",
         "The last token of a prompt is always computed (its logits give the first output token), so at most "
         "⌊(|p|−1)/B⌋ blocks can hit."],
    )


def tree_section(session: EngineSession, record: StepRecord) -> None:
    snap = radix_snapshot(record)
    if snap is None:
        st.warning("This scenario runs with the prefix cache off (enable_prefix_cache = false): there is no "
                   "tree to draw. Pick a ready-made scenario or upload one with it on.", icon=":material/info:")
        return
    c = snap["counters"]
    admitted = c["hits"] + c["misses"]
    m = st.columns(6)
    m[0].metric("Tree nodes", snap["num_nodes"], help="not counting the empty root")
    m[1].metric("Cached blocks", f"{snap['num_blocks']} / {record.pool.num_blocks}",
                help=f"{snap['num_tokens']} tokens held by the tree, of a {record.pool.num_blocks}-block pool")
    m[2].metric("Evictable blocks", snap["num_evictable_blocks"], help="blocks no running request is using")
    m[3].metric("Hits / admissions", f"{c['hits']} / {admitted}",
                help="an admission is a hit when at least one block matched")
    m[4].metric("Prompt tokens from cache", f"{c['tokens_saved']} / {c['tokens_requested']}",
                help="tokens the forward passes did not compute, of all admitted prompt tokens")
    m[5].metric("Evictions so far", c["evictions"], help=f"{c['evicted_blocks']} blocks, {c['freed_blocks']} freed")
    notes = []
    for s in record.batch:
        if s.phase == "prefill" and s.num_cached_tokens and s.context_len - s.num_tokens == s.num_cached_tokens:
            notes.append(f":material/bolt: **{s.request_id}** matched {s.num_cached_tokens} tokens "
                         f"({s.num_cached_tokens // snap['block_size']} blocks) and computed only {s.num_tokens}")
        elif s.phase == "prefill" and s.context_len == s.num_tokens:
            notes.append(f":material/close: **{s.request_id}** missed: prefilled all {s.num_tokens} tokens")
    if snap["evicted_this_step"]:
        ev = snap["evicted_this_step"]
        notes.append(f":material/delete: **evicted** {len(ev)} node{'s' * (len(ev) != 1)} "
                     f"({sum(len(e['blocks']) for e in ev)} blocks, {sum(e['freed_blocks'] for e in ev)} "
                     "back on the free list) to make room")
    if notes:
        st.markdown("  \n".join(notes))
    owners = lock_owners(record)
    fig = radix_tree_figure(snap, owners, record.step, session.weights.tokenizer.decode)
    show_figure(fig, key="radix-tree", height=tree_height(snap))
    st.caption("Node label: its tokens' text, start … end (<s> / </s> = ChatML's im_start / im_end, ⏎ = "
               "newline) · blocks and tokens · locks (running requests whose path goes through it) · step of its "
               "last access. Hover a node for its physical blocks and full text.")
    bs = session.engine.config.block_size if session.engine is not None else None
    if bs:
        st.caption(f"The tree shares whole KV blocks of {bs} tokens: where two prompts part in the middle of a "
                   "block, that block cannot be shared, so sibling leaves can start with the same few words. Their "
                   "common whole blocks sit in the parent.")


def history_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    points = cache_series(history)
    if not points:
        return
    st.subheader("Hits and prefill saved over time")
    show_figure(cache_series_figure(points, record.step), key="radix-series", height=400)
    rows = admissions(history)
    with st.expander("Every admission: prompt tokens, from cache, computed", expanded=False):
        if rows:
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        request_state_table(record)


def follow_up_section(session: EngineSession, record: StepRecord | None) -> None:
    """Feed a finished answer back: the next turn's prompt = this request's prompt + answer + a new
    user message, as raw ChatML, so the tree can serve the whole conversation so far."""
    if session.engine is None or not session.engine.config.enable_prefix_cache:
        return
    done = [q for q in (record.requests if record else ()) if q.status == "finished" and q.request_id in session.specs]
    with st.popover("Continue a finished chat", icon=":material/forum:", disabled=not done):
        if not done:
            return
        with st.form("radix-follow-form", border=False):
            # The newest finished turn first picked: continuing a three-turn chat from its first turn surprised.
            rid = st.selectbox("Conversation", [q.request_id for q in done], index=len(done) - 1,
                               key="radix-follow-id")
            message = st.text_input("Next user message", "Say that again more simply.", key="radix-follow-msg")
            go = st.form_submit_button(f"Send (arrives at step {session.engine.step_index})")
        if go and not str(message).strip():  # said like "Add a request now" says it, not silently dropped
            session.report("Message not sent: the next user message is empty; type what the user says next.")
            st.rerun()
        if go and str(message).strip():
            tok = session.weights.tokenizer
            answer = session.engine.tokenizer.decode(session.generated_token_ids(rid, len(session.records) - 1))
            prompt = tok.decode(session.prompt_token_ids(rid)) + answer
            if not answer.endswith("<|im_end|>"):
                prompt += "<|im_end|>"
            prompt += f"\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
            n = 1
            while f"{rid}+{n}" in session.specs:
                n += 1
            session.add_live_request(RequestSpec(prompt, chat=False, max_tokens=8, ignore_eos=True,
                                                 request_id=f"{rid}+{n}"))
            st.rerun()


def compare_section(session: EngineSession, page: str) -> None:
    st.subheader("The same requests with the cache on and off")
    st.markdown("Two fresh engines run this scenario to the end, identical except for `enable_prefix_cache`. "
                "Prefill work is counted from what the forward passes really computed; time is measured.")
    runs = comparison_runner(
        session, page, button_label="Run with and without the cache", button_key="radix-compare",
        progress_text="Running the scenario twice…", step_text="Running both… step {n}", expected_steps=40,
        hint="Press **Run with and without the cache** (two runs of the scenario; about 10–30 s on the CPU).",
        run=lambda on_progress: compare_prefix_cache(session.scenario, shared_weights(), server_engine_settings(),
                                                     on_progress=on_progress),
        errors_of=lambda runs: (f"{r.label}: {e.message}" for r in runs.values() for e in r.errors))
    if runs is None:
        return
    on, off = runs["cache on"], runs["cache off"]
    # Two to a row: four "1.18 s vs 2.80 s" values in one row wrapped their units onto a second line at 1280 px.
    m = [*st.columns(2), *st.columns(2)]
    saved = off.prefill_tokens - on.prefill_tokens
    m[0].metric("Prefill tokens computed", f"{on.prefill_tokens} vs {off.prefill_tokens}",
                delta=f"-{saved} tokens" if saved else "no saving", delta_color="inverse" if saved else "off",
                help="cache on vs cache off")
    m[1].metric("Prefill forward time", f"{on.prefill_seconds:.2f} s vs {off.prefill_seconds:.2f} s",
                delta=f"{(on.prefill_seconds - off.prefill_seconds) * 1e3:+.0f} ms", delta_color="inverse",
                help="forward time of each step, times its share of prefill tokens, summed; cache on vs off")
    ttft_on, ttft_off = on.ttft(), off.ttft()
    common = [r for r in ttft_on if r in ttft_off]
    mean = lambda d: sum(d[r] for r in common) / len(common) if common else 0.0  # noqa: E731
    m[2].metric("Mean time to first token", f"{mean(ttft_on) * 1e3:.0f} vs {mean(ttft_off) * 1e3:.0f} ms",
                delta=f"{(mean(ttft_on) - mean(ttft_off)) * 1e3:+.0f} ms", delta_color="inverse")
    m[3].metric("Whole run (engine clock)", f"{on.engine_seconds:.2f} vs {off.engine_seconds:.2f} s",
                help=f"{len(on.records)} and {len(off.records)} steps")
    show_figure(cache_compare_figure(runs), key="radix-compare-fig", height=400)
    st.caption("Same greedy requests both ways; the cache changes only how much of each prompt is computed. "
               "On a shared 2-core CPU small differences in time are noise; the token counts are exact.")
