"""Sections of the KV cache quantization and eviction page (pages/13_kv_compression.py composes them)."""
from __future__ import annotations

import html

import pandas as pd
import streamlit as st
import torch

from engine.kv_compression import FORMATS, KVLab, LabResult
from engine.kv_compression.lab import MAX_NEW_TOKENS, MAX_VARIANTS, ProgressFn, stored_lab_run
from engine.result_store import StoredResult
from engine.weights import LoadedWeights

from app.analysis.kv_compression import (FORMAT_CHOICES, OWN_PROMPT, POLICY_CHOICES, PRESETS, PROMPTS,
                                         RETRIEVAL_NEEDLES, LabSettings, answer_found, check_tokens,
                                         few_tokens_note, kept_counts, kl_chart_note, memory_frame, preset_rows,
                                         rows_to_variants, summary_frame)
from app.charts.kv_compression import (channel_figure, kept_map_figure, kl_positions_figure, roundtrip_figure,
                                       sink_figure, tradeoff_figure, variant_color)
from app.formatting import NO_VALUE, fmt_duration, fmt_two_significant, plural
from app.runtime import backend_summary, device, device_label, dtype_name, shared_weights, weights_mode
from app.state import page_run
from app.table_columns import in_percent_points, share_column
from app.theme import show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation

DEFAULT_PROMPT = next(iter(PROMPTS))
DEFAULT_PRESET = next(iter(PRESETS))
DEFAULT_TOKENS = 32


def kv_explanation() -> None:
    cfg = shared_weights().config
    explanation(
        "Fewer bits, or fewer tokens",
        [r"\text{KV bytes} = 2 \times L \times H_{kv} \times d \times \text{bits}/8 \times \text{tokens} + \text{scales}",
         r"\hat x = s \cdot q + z,\quad q = \operatorname{round}\!\left(\tfrac{x - z}{s}\right) \in \{0, \dots, 2^b - 1\}",
         r"\text{keep}(t) = \text{sinks} \cup \text{recent} \;\;[\,\cup\, \text{heavy hitters}\,]"],
        [f"SmolLM2 stores 2 × {cfg.num_layers} × {cfg.num_kv_heads} × {cfg.head_dim} numbers per token: "
         f"{2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2:,} bytes in BF16. **Quantization** stores them "
         "in 8, 4 or 2 bits with a scale per group; **eviction** keeps only some tokens.",
         "The prompt is prefilled once, exactly; its KV is then stored in each variant's format and cut to its "
         "budget. Every generated token reads only its own compressed cache (the new token's key and value too).",
         "**Memory against quality**: each variant fed the reference's text. KL is how far its next-token "
         "distribution moved; agreement is how often its top token stayed the same.",
         "**What each cache writes**: the same variants left to write their own text (greedy). A tiny KL can still "
         "flip a near-tie and send the text elsewhere; a large one garbles it.",
         "**Keys have outlier channels** (bright columns): a per-token INT2 scale is set by them and crushes the "
         "rest. KIVI scales keys per channel instead, and its error drops several-fold.",
         "**Eviction**: a sliding window loses the first tokens, where attention parks its spare weight (the "
         "sink); StreamingLLM keeps them; H2O also keeps the tokens that got the most attention."],
        note="KL(p‖q) = Σ p log(p/q) with p the reference's next-token distribution. L layers, H_kv KV heads, "
             "head dimension d, b bits, scale s and zero point z per group of 32 or 64 numbers (FP8 and INT8: one "
             "symmetric scale per token and head). Sinks: the first tokens; recent: the newest; heavy hitters: the "
             "older tokens with the most accumulated attention, per head.")


def backend_line() -> None:
    where = device_label()
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) on {where} · "
               f"reference cache in {dtype_name()} · the lab's attention is the **torch path on every device**: it "
               "dequantizes the stored codes, then attends (so its times show the cost of unfused dequantization, "
               "not a speed-up; the fused kernel that reads the codes is timed at the bottom of the page) · engine "
               f"backend: {backend_summary()}")


# ---- settings ------------------------------------------------------------------------------------

def _keys(page: str) -> dict[str, str]:
    return {k: f"{page}-{k}" for k in ("prompt-choice", "prompt", "preset", "rows", "editor-version", "tokens",
                                       "settings", "errors")}


def _load_prompt(page: str) -> None:
    k, ss = _keys(page), st.session_state
    choice = ss[k["prompt-choice"]]
    if choice in PROMPTS:
        ss[k["prompt"]] = PROMPTS[choice]


def _load_preset(page: str) -> None:
    k, ss = _keys(page), st.session_state
    ss[k["rows"]] = preset_rows(ss[k["preset"]])
    ss[k["editor-version"]] = ss.get(k["editor-version"], 0) + 1  # a new editor key: it shows the preset's rows


def default_settings() -> LabSettings:
    variants, _ = rows_to_variants(preset_rows(DEFAULT_PRESET), dtype_name())
    return LabSettings(DEFAULT_PROMPT, PROMPTS[DEFAULT_PROMPT], DEFAULT_TOKENS, tuple(variants))


def settings_form(page: str) -> LabSettings:
    """The prompt, the tokens to generate and the variant table; returns the settings to show (the last
    ones that ran: a rejected form keeps them, with its message)."""
    k, ss = _keys(page), st.session_state
    ss.setdefault(k["prompt"], PROMPTS[DEFAULT_PROMPT])
    ss.setdefault(k["rows"], preset_rows(DEFAULT_PRESET))
    ss.setdefault(k["settings"], default_settings())
    c = st.columns(2)
    c[0].selectbox("Prompt", [*PROMPTS, OWN_PROMPT], key=k["prompt-choice"], on_change=_load_prompt, args=(page,))
    c[1].selectbox("Compare", list(PRESETS), key=k["preset"], on_change=_load_preset, args=(page,),
                   help="Fills the table below; edit it to compare anything else.")
    with st.form(f"{page}-form", border=True):
        c = st.columns([3, 1])
        prompt = c[0].text_area("Prompt (sent as a chat message)", key=k["prompt"], height=110)
        tokens = c[1].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, DEFAULT_TOKENS, key=k["tokens"],
                                   help="Every variant runs this many steps (fewer if the reference ends its answer).")
        rows = st.data_editor(
            pd.DataFrame(ss[k["rows"]]), key=f"{page}-editor-{ss.get(k['editor-version'], 0)}", num_rows="dynamic",
            width="stretch", hide_index=True,  # errors count rows from 1, top to bottom
            placeholder=NO_VALUE,  # a budget the chosen policy does not use, rather than "None"
            column_config={
                "format": st.column_config.SelectboxColumn(
                    "Storage format", options=list(FORMAT_CHOICES), required=True,
                    help="reference = the engine's own precision; KIVI formats scale keys per channel"),
                "policy": st.column_config.SelectboxColumn(
                    "Eviction", options=list(POLICY_CHOICES), default="none",
                    help="none · window (newest only) · sinks (StreamingLLM) · h2o (heavy hitters)"),
                "budget": st.column_config.NumberColumn("Budget (tokens per head)", min_value=0, step=1,
                                                        help="tokens each head keeps; used by eviction policies"),
                "sinks": st.column_config.NumberColumn("Sinks", min_value=0, step=1,
                                                       help="first tokens the 'sinks' policy always keeps"),
            })
        st.caption(f"Up to {MAX_VARIANTS} rows; the reference (full cache, engine precision) is always added. "
                   "Budgets apply per KV head of every layer.")
        submitted = st.form_submit_button("Run on the model", icon=":material/play_arrow:", type="primary")
    if submitted:
        ss[k["errors"]] = _apply(page, str(prompt), int(tokens), rows.to_dict("records"))
    for err in ss.get(k["errors"], []):
        st.error(err, icon=":material/error:")
    return ss[k["settings"]]


def _apply(page: str, prompt: str, tokens: int, rows: list[dict]) -> list[str]:
    """New settings from the form, or the reasons they cannot run (the last run's results stay)."""
    k, ss = _keys(page), st.session_state
    # The editor keeps its own edits; writing them back into its data would apply them twice.
    variants, errors = rows_to_variants(rows, dtype_name())
    if not prompt.strip():
        errors.insert(0, "The prompt is empty: type something for the model to answer.")
    if (msg := check_tokens(tokens)) is not None:
        errors.append(msg)
    if not errors:
        ids = prompt_ids(prompt)
        try:
            server_lab().check(ids, variants, tokens)
        except ValueError as e:
            errors.append(str(e)[:1].upper() + str(e)[1:] + ".")
    if errors:
        return errors
    choice = ss.get(k["prompt-choice"], DEFAULT_PROMPT)
    name = choice if choice in PROMPTS and PROMPTS[choice] == prompt else OWN_PROMPT
    ss[k["settings"]] = LabSettings(name, prompt, tokens, tuple(variants))
    return []


def prompt_ids(prompt: str) -> list[int]:
    return shared_weights().tokenizer.chat_prompt_ids(prompt)


@st.cache_resource(show_spinner=False)
def _lab(weights_id: int, dev: str, dtype: str) -> KVLab:  # noqa: ARG001 (weights_id keys the cache)
    return KVLab(shared_weights(), device=dev, dtype=getattr(torch, dtype))


def server_lab() -> KVLab:
    return _lab(id(shared_weights().state_dict), device(), dtype_name())


def lab_run(weights: LoadedWeights, s: LabSettings, progress: ProgressFn | None = None,
            lab: KVLab | None = None) -> StoredResult[LabResult]:
    """The lab at the server's device and dtype, read back from disk when it ran before: what the page runs and
    what `python3 -m app.prewarm` computes ahead of a class. `lab`: one built on `weights` already (the page's
    server-wide one)."""
    lab = lab or KVLab(weights, device=device(), dtype=getattr(torch, dtype_name()))
    return stored_lab_run(lab, weights, weights.tokenizer.chat_prompt_ids(s.prompt), s.variants, s.max_new_tokens,
                          progress)


def get_result(page: str, s: LabSettings) -> LabResult:
    """The run for these settings (`page_run`: this tab's, the server's, from disk, or computed now with a
    progress bar); a failure with nothing run before stops the page after its message."""
    def run(bar) -> StoredResult[LabResult]:  # noqa: ANN001 (a Streamlit progress bar)
        def progress(done: int, total: int) -> None:
            bar.progress(done / max(1, total), text=f"Generating token {done + 1} of {total + 1} for every variant…")

        return lab_run(shared_weights(), s, progress, server_lab())

    result = page_run(page, (s.prompt, s.max_new_tokens, s.variants), run, "Running every variant on the model…",
                      "The run failed")
    if result is None:
        st.stop()
    return result


# ---- results -------------------------------------------------------------------------------------

def summary_section(s: LabSettings, result: LabResult, page: str) -> None:
    tok = shared_weights().tokenizer
    n_var = len(result.variants) - 1
    st.subheader("Memory against quality")
    generated = len(result.reference_tokens)
    # With one token nothing is decoded: "decoding every row together 1.22 µs" timed an empty loop.
    decoding = (f"decoding every row together {fmt_duration(result.decode_seconds)}" if generated > 1 else
                "no decode step (the one token comes from the prefill)")
    st.markdown(f"{plural(result.prompt_len, 'prompt token')}, {plural(generated, 'generated token')} "
                f"for the reference and for each of {plural(n_var, 'variant')} (twice: fed the reference's text, "
                f"and free). Prefill {fmt_duration(result.prefill_seconds)}, {decoding}.")
    if (note := few_tokens_note(generated, s.max_new_tokens)) is not None:
        st.info(note, icon=":material/info:")
    reference = server_lab().reference
    if reference in s.variants:
        st.caption(f"{reference.label} is the reference on this server (the engine's precision), "
                   "so that row runs once, as the reference.")
    st.markdown(f"**Reference answer:** {html.escape(tok.decode(list(result.reference_tokens), skip_special_tokens=True))}")
    frame = summary_frame(result)
    # At 1024 pixels with the sidebar open the eight columns took 759 of 690 pixels and hid "Attn ms", so the
    # share is a plain percent under "Top-1" (the chart below labels it too) and "Text leaves at" reads "Differs
    # at" (as on the weight page), their detail in help. With a bar, the eviction run's longer names ("BF16 ·
    # StreamingLLM 64 (4 sinks)") still took 707.
    # KL as text, two significant figures with their trailing zeros: "%.2g" printed "3" beside "1.3".
    shown = in_percent_points(frame, "Top-1 match").assign(
        **{"KL (nats)": frame["KL (nats)"].map(fmt_two_significant)})
    st.dataframe(shown, hide_index=True, width="stretch", column_config={
        "Bytes/token": st.column_config.NumberColumn(format="%,.0f", help="measured: the cache's tensors (codes, "
                                                     "scales, zero points) over the tokens it holds; KIVI's "
                                                     "newest keys wait in FP16 for a full group, so it is a "
                                                     "little above the formula in “What fits”"),
        "Tokens": st.column_config.NumberColumn(help="tokens each KV head of every layer holds after the run"),
        "Size vs BF16": st.column_config.NumberColumn("vs BF16", format="%.2f×", help="its cache's size over a "
                                                      "BF16 cache of every token (quantization and eviction "
                                                      "together): 0.25× is four times smaller"),
        "Top-1 match": share_column("Top-1", bar=False, width=64, help="top-1 match: share of positions where its "
                                    "top token is the reference's (fed the reference's text)"),
        "KL (nats)": st.column_config.TextColumn(alignment="right", help="mean KL(reference ‖ variant) of the "
                                                   "next-token distributions"),
        "Text leaves at": st.column_config.TextColumn("Differs at", width=70, help="first token where its own "
                                                      "greedy text leaves the reference's (counted from 1)"),
        "Attn ms": st.column_config.NumberColumn(format="%.1f", help="per decode step: reading (dequantizing) the "
                                                 "cache and attending, all 30 layers, torch path"),
    })
    st.caption("Columns: bytes per cached token; tokens held per head; its size against a full BF16 cache of "
               "every token; how often the top token matched the reference's; mean KL from the reference; where "
               "its own text first differs; attention time per decode step (torch path, dequantize then attend).")
    needles = RETRIEVAL_NEEDLES.get(s.prompt_name)
    if needles:
        found = []
        for r in result.variants:
            hits = answer_found(r.free_tokens, tok.decode, needles)
            found.append(f"{r.variant.label}: " + ", ".join(("✓ " if ok else "✗ ") + n for n, ok in hits.items()))
        st.caption("Does each variant's own answer contain the two details? " + " · ".join(found))
    show_figure(tradeoff_figure(result), key=f"{page}-tradeoff", height=420)


def texts_section(result: LabResult) -> None:
    tok = shared_weights().tokenizer
    st.subheader("What each cache writes")
    st.caption("Greedy decoding with each variant's own cache. Plain text matches the reference; the "
               "highlighted rest is where it went its own way.")
    answer_rows([(r.variant.label, variant_color(i), r.free_tokens) for i, r in enumerate(result.variants)],
                result.reference_tokens, tok.decode, "kvq")


def positions_section(result: LabResult, page: str) -> None:
    tok = shared_weights().tokenizer
    if (note := kl_chart_note(len(result.reference_tokens))) is not None:
        st.caption(note)
        return
    show_figure(kl_positions_figure(result, tok.decode_token), key=f"{page}-kl", height=400)


def quantization_section(result: LabResult, page: str) -> None:
    st.subheader("Why keys are harder to quantize than values")
    show_figure(channel_figure(result), key=f"{page}-channels", height=440)
    show_figure(roundtrip_figure(result, list(FORMATS)), key=f"{page}-roundtrip", height=380)
    kivi, plain = result.roundtrip_error["int2-kivi"][0].mean(), result.roundtrip_error["int2"][0].mean()
    st.caption(f"On this prompt's cache, INT2 keys scaled per token lose {plain:.0%} of their norm and scaled per "
               f"channel (KIVI) {kivi:.0%}; values, scaled per token in both, are the same. The newest keys (fewer "
               "than 32) wait in FP16 until their group fills: that is why KIVI's measured bytes per token in the "
               "results table sit a little above the formula in “What fits”, where INT2 and INT2 KIVI are equal "
               "(a key scale per channel every 32 tokens costs what one per 32 numbers of a row does).")


def eviction_section(result: LabResult, page: str) -> None:
    weights = shared_weights()
    cfg, tok = weights.config, weights.tokenizer
    evicting = [(i, r) for i, r in enumerate(result.variants) if r.kept is not None]
    st.subheader("Which tokens each policy keeps")
    labels = [repr(tok.decode_token(t)) for t in (*result.prompt_ids, *result.reference_tokens)]
    if evicting:
        c = st.columns([2, 1])
        names = [r.variant.label for _, r in evicting]
        # The last one first: presets list H2O last, whose scattered heavy hitters are the picture worth seeing.
        pick = c[0].selectbox("Variant", names, index=len(names) - 1, key=f"{page}-evict-variant")
        i, r = evicting[names.index(pick)]
        steps = r.kept.shape[0]
        step = (c[1].slider("After generated token", 0, steps - 1, steps - 1, key=f"{page}-evict-step",
                            help="0: the prompt alone; N: once the Nth generated token (counted from 1, as the "
                                 "table and the KL chart count) is in the cache. The last token is never cached: "
                                 "nothing is generated after it")
                if steps > 1 else 0)  # a one-token run has nothing to scrub (and a slider needs min < max)
        length = result.prompt_len + step
        counts = kept_counts(r.kept, step, length)
        show_figure(kept_map_figure(counts, labels[:length], result.prompt_len, cfg.num_kv_heads,
                                    f"{r.variant.label}: the cache after generated token {step}" if step else
                                    f"{r.variant.label}: the cache of the prompt alone"),
                    key=f"{page}-kept", height=460)
    else:
        st.info("No variant in this run evicts tokens. Pick “Eviction at a 64-token budget” above (or set a "
                "policy in the table) to see which tokens each policy keeps.", icon=":material/info:")
    if len(result.reference_tokens) < 2:  # the profile is of generated tokens' attention: there is none
        st.caption("No attention profile: no token was generated after the prefill, so none attended over the "
                   "cache (see the note at the top).")
        return
    layer = st.slider("Layer for the attention profile", 0, cfg.num_layers - 1, min(20, cfg.num_layers - 1),
                      key=f"{page}-sink-layer")
    show_figure(sink_figure(result, layer, labels), key=f"{page}-sink", height=380)
    deep = result.sink_share[cfg.num_layers // 2:].mean()
    st.caption(f"With the reference cache, from layer {cfg.num_layers // 2} on, generated tokens put {deep:.0%} of "
               "their attention on position 0 on average (every query head), whatever it says: softmax must put "
               "its weight somewhere, and the first token, seen by every query, becomes the sink. Evict it and "
               "that weight lands on real tokens.")


def memory_section(page: str) -> None:
    cfg = shared_weights().config
    st.subheader("What fits")
    c = st.columns([1, 1, 3])
    gib = c[0].number_input("KV budget (GiB)", 0.5, 1024.0, 40.0, step=0.5, key=f"{page}-gib",
                            help="e.g. an 80 GB GPU minus weights and activations")
    context = c[1].number_input("Context per sequence (tokens)", 256, 1_000_000, 8192, step=256, key=f"{page}-ctx")
    frame = memory_frame(cfg, float(gib), int(context))
    # At 1024 pixels with the sidebar open the six columns took 750 of 690 pixels, so the headers are shorter
    # (the bits and bytes as the results table above writes them), the full names in their tooltips.
    st.dataframe(frame, hide_index=True, width="stretch", column_config={
        "Bits per number": st.column_config.NumberColumn("Bits", width=50, help="bits per stored number (scales "
                                                         "and zero points not counted)"),
        "Bytes per token": st.column_config.NumberColumn("Bytes/token", format="%,.0f", help="bytes per token of "
                                                         "context, all layers' K and V, scales included"),
        # Not "vs BF16": the results table above uses that header for size (INT4 0.31×), this one is capacity.
        "Fits vs BF16": st.column_config.NumberColumn(format="%.2f×", help="tokens this format holds in the budget "
                                                      "over what BF16 holds: BF16's bytes per token over its own"),
        "Tokens that fit": st.column_config.NumberColumn(format="%,d", help=f"tokens of context the {gib:g} GiB "
                                                         "budget holds"),
        f"Sequences of {int(context):,} tokens": st.column_config.NumberColumn(
            f"Sequences of {int(context):,}", format="%,d",
            help=f"sequences of {int(context):,} tokens that fit in the budget at once"),
    })
    st.caption("By the formula, scales and zero points included (FP16 each); KIVI's FP16 keys that wait for "
               "their group (at most 31 a sequence, whatever its length) are left out. "
               "Eviction multiplies the same way: a "
               "budget of B tokens per sequence holds any context in B tokens' bytes, at the quality measured above.")
