"""The speculative page's QuantSpec section: the model drafting for itself by reading a low-bit copy of its own KV
cache, verified by the same model reading the full cache (engine/speculative/quantspec.py), in every format."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
import torch

from engine.kv_compression.formats import FORMATS
from engine.kv_compression.lab import KVLab
from engine.prompt_checks import check_new_tokens, check_prompt
from engine.speculative.quantspec import (MAX_GAMMA, SELF_SPEC_FORMATS, SelfSpecLabResult, check_gamma, int4_weights,
                                          run_self_spec_lab)

from app.analysis.kv_quant_kernel import load_measured
from app.analysis.quantspec import CONTEXTS, best_run, draft_weights_label, runs_frame, speedup_frame
from app.charts.quantspec import rounds_figure, speedup_figure
from app.runtime import device, device_label, dtype_name, shared_weights
from app.sections.kv_compression import server_lab
from app.state import mark_requested, page_settings, progress_reporter, run_on_request, submitted_settings
from app.table_columns import in_percent_points, share_column
from app.theme import show_figure

MAX_PROMPT_CHARS = 1000
MAX_NEW_TOKENS = 64


@dataclass(frozen=True, slots=True)
class SelfSpecSettings:
    prompt: str = "Explain in two sentences why the sky is blue."
    gamma: int = 4
    max_new_tokens: int = 48

    def check(self) -> None:
        check_prompt(self.prompt, MAX_PROMPT_CHARS)
        check_new_tokens(self.max_new_tokens, MAX_NEW_TOKENS)
        check_gamma(self.gamma)


@st.cache_resource(show_spinner=False)
def _int4_draft_lab(weights_id: int, dev: str, dtype: str) -> KVLab:  # noqa: ARG001 (weights_id keys the cache)
    """The draft's model with INT4 decoder linears, prepared once per server (like the KV lab it shares stores with)."""
    return KVLab(int4_weights(shared_weights()), device=dev, dtype=getattr(torch, dtype))


def _form(lab: str) -> SelfSpecSettings:
    shown: SelfSpecSettings = page_settings(lab, SelfSpecSettings)
    with st.form(f"{lab}-form", border=True):
        c = st.columns([1, 1, 3])
        gamma = c[0].number_input("Draft length γ", 1, MAX_GAMMA, shown.gamma, key=f"{lab}-gamma",
                                  help="tokens the draft proposes before the target checks them")
        tokens = c[1].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, shown.max_new_tokens, key=f"{lab}-tokens")
        prompt = c[2].text_input("Prompt (a chat message)", shown.prompt, key=f"{lab}-prompt",
                                 help=f"up to {MAX_PROMPT_CHARS:,} characters; sent in the model's ChatML template")
        submitted = st.form_submit_button("Self-speculate with every cache format", icon=":material/play_arrow:",
                                          type="primary")
    candidate = None
    if submitted:
        mark_requested(lab)
        candidate = SelfSpecSettings(str(prompt), int(gamma), int(tokens))
    return submitted_settings(lab, candidate)


def quantspec_section(page: str) -> None:
    lab = f"{page}-qs"
    st.subheader("Self-speculation with a quantized KV cache (QuantSpec)")
    st.markdown("No draft model at all: the **draft is the model itself reading a low-bit copy of its own KV "
                "cache**, and the target is the same model reading the full cache. At long contexts most of a "
                "decode step's bytes are cache, so a draft step that reads a 4-bit copy is cheap, and because the "
                "draft *is* the model, its guesses are mostly right. After each round both caches keep only the "
                "committed tokens; the draft's copy of them is the target's exact K and V, stored in the low-bit "
                "format. QuantSpec's draft also reads its weights in 4 bits: each format runs again with the "
                "decoder's linears rounded to INT4. The output is the target's own greedy text: the draft only "
                "decides how many target passes it takes.")
    settings = _form(lab)

    def run(bar) -> SelfSpecLabResult:  # noqa: ANN001 (a Streamlit progress bar)
        ids = shared_weights().tokenizer.chat_prompt_ids(settings.prompt)
        return run_self_spec_lab(server_lab(), ids, settings.gamma, settings.max_new_tokens,
                                 draft_lab=_int4_draft_lab(id(shared_weights().state_dict), device(), dtype_name()),
                                 progress=progress_reporter(bar))

    result = run_on_request(lab, settings, run, "Self-speculating…", "The self-speculation run failed",
                            "Press **Self-speculate with every cache format** (about 30 s on an idle 2-core CPU: the "
                            "target alone, then FP8, INT8, INT4 and INT2 draft caches with the model's weights and "
                            "with INT4 weights, each draft verified by the target).")
    if result is None:
        return
    same = all(r.tokens == result.plain for r in result.runs)
    best = best_run(result)
    c = st.columns(4)
    c[0].metric("Same text as the target alone", "yes" if same else "NO",
                help="self-speculation is lossless: every format's text against the target decoding alone, one "
                     "token a pass, on the same path (the table says which, if one differs: in bf16 a near-tie "
                     "between two tokens can be decided differently by a one-token and a several-token pass)")
    c[1].metric("Best tokens per target pass", f"{best.tokens_per_pass:.2f}",
                help=f"{FORMATS[best.kv_format].label} cache, {draft_weights_label(best.draft_weight_bits)} "
                     "weights; plain decoding is 1")
    c[2].metric("Its acceptance", f"{best.acceptance:.0%}", help="drafted tokens the target kept")
    c[3].metric("Its cache per token", f"{best.draft_bytes_per_token / 1024:.1f} KiB",
                help=f"the stored format's codes and scales; the target's: {best.target_bytes_per_token / 1024:.1f} "
                     "KiB")
    text, num = st.column_config.TextColumn, st.column_config.NumberColumn
    # Explicit widths and short headers (the details in the tooltips): all nine columns fit on a projector.
    st.dataframe(in_percent_points(runs_frame(result), "acceptance"), hide_index=True, width="stretch",
                 height="content", column_config={
        "draft's cache": text(width=190, help="the draft's KV cache: the target's, stored in this format"),
        "draft's weights": text("weights", width=84, help="the draft's decoder linears"),  # "the target's" whole
        "cache bytes/token": num("bytes/token", width=88, help="the draft's cache per token, codes and scales"),
        "drafted": num(width=64), "accepted": num(width=70),
        "acceptance": share_column(bar=False, width=84, help="accepted / drafted"),
        "target passes": num("passes", width=60, help="verification passes of the target"),
        "tokens a pass": num("tokens/pass", format="%.2f", width=86, help="tokens written per target pass"),
        "same text": text("same", width=54, help="the same text as plain decoding"),
    })
    c = st.columns([2, 1.4, 2])
    shown = c[0].radio("Rounds of the draft cache", list(SELF_SPEC_FORMATS), index=SELF_SPEC_FORMATS.index("int4"),
                       horizontal=True, key=f"{lab}-shown", format_func=lambda f: FORMATS[f].label.split(" (")[0])
    bits = c[1].radio("with draft weights", list(result.weight_bits), horizontal=True, key=f"{lab}-bits",
                      format_func=draft_weights_label)
    show_figure(rounds_figure(result.run(shown, bits), shared_weights().tokenizer.decode), key=f"{lab}-rounds",
                height=400, export_width=1100)
    show_figure(speedup_figure(speedup_frame(shared_weights().config, result)), key=f"{lab}-speedup", height=420,
                export_width=1100)
    worst = min(result.runs, key=lambda r: r.acceptance)
    st.caption(f"Measured on {device_label()}: the acceptance and the text. Modeled: the speed-up, from the bytes a "
               f"step reads at {CONTEXTS[0] // 1024}k to {CONTEXTS[-1] // 1024}k tokens of context (this run's was "
               f"{result.prompt_tokens} + {len(result.plain)} tokens, where the weights dominate and a draft step "
               "costs about a target step). Fewer bits make cheaper drafts; that they are also wrong more often "
               "shows over many tokens, and one short answer is a small sample (it can rank the formats either "
               f"way): here {FORMATS[worst.kv_format].label} with {draft_weights_label(worst.draft_weight_bits)} "
               f"weights kept the least, {worst.acceptance:.0%} of its drafts. Lines of two formats with the same "
               "bytes and the same acceptance coincide; the later one is drawn with rings. "
               "INT4 weights here are round-to-nearest in groups of 32 "
               "without calibration (QuantSpec's are calibrated; the weight page's AWQ and GPTQ keep more). A plain "
               "loop on the model's prepared weights and the KV lab's cache stores, one sequence, not the paged "
               "engine." + _kernel_caveat())


def _kernel_caveat() -> str:
    """What the fused low-bit decode kernel measured, against this section's bytes-only model."""
    measured = load_measured()
    if measured is None:
        return ""
    name, timings = measured
    longest = max(timings, key=lambda t: (t.context, t.batch))
    return (f" The model assumes a draft step's time follows its bytes; our fused Triton kernel that reads low-bit "
            f"caches measured INT4 at {longest.speedup('int4'):.2f}× the BF16 kernel's speed on an {name} "
            f"(batch {longest.batch}, {longest.context // 1024}k tokens; the KV cache quantization page), so the "
            "curves are what a kernel with cheaper conversions would buy.")
