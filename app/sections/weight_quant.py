"""Sections of the weight-only quantization page (pages/15_weight_quantization.py composes them)."""
from __future__ import annotations

import streamlit as st

from engine.weight_quant.lab import (GROUPS, MAX_CALIBRATION_TOKENS, MAX_NEW_TOKENS, METHOD_LABELS, METHODS,
                                     LabResult, LabSettings, Progress, stored_lab)
from engine.result_store import StoredResult
from engine.weight_quant.texts import CALIBRATION_SETS, WINDOW
from engine.weights import LoadedWeights

from app.analysis.kv_math import weights_bytes
from app.analysis.weight_quant import (BENCH_COMMAND, H200, INPUT_LABELS, calibration_text, decode_bound_tok_s,
                                       fit_note, grid_text, group_text, layer_frame, load_bench, outlier_stats,
                                       result_json, results_frame, worst_ratio_layer)
from app.charts.weight_quant import (activation_figure, alpha_figure, bits_sweep_figure, layer_error_figure,
                                     method_color, quality_figure)
from app.formatting import NO_VALUE, fmt_bytes, fmt_duration
from app.runtime import device, device_label, dtype_name, shared_weights, weights_mode
from app.state import page_run, page_settings, progress_reporter, submitted_settings
from app.table_columns import differs_at_column, in_percent_points, share_column
from app.theme import show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation

CALIBRATION_HELP = {
    "chat": "conversations in the model's ChatML format, answered by the full model itself: the fine-tune's "
            "own behaviour",
    "prose": "ordinary English paragraphs, like the generic sets (C4, WikiText) most checkpoints are calibrated on",
    "random tokens": "uniformly random token ids: activations nothing like real text's",
}


def wq_explanation() -> None:
    cfg = shared_weights().config
    embedding_share = cfg.vocab_size * cfg.hidden_size / weights_bytes(cfg, 1)
    explanation(
        "Fewer bits per weight, chosen with a little data",
        [r"\hat W = s \cdot {(q - z)},\quad q = \operatorname{clamp}\!\left(\operatorname{round}\!\left(\tfrac{W}{s}\right)"
         r" + z,\; 0,\; 2^b - 1\right)",
         r"\text{AWQ: } \hat W = Q\!\left(W \operatorname{diag}(s)\right) \operatorname{diag}(s)^{-1},\quad "
         r"s_j = \overline{|x_j|}^{\,\alpha}",
         r"\text{GPTQ: } \min_{\hat W} \lVert X \hat W^{\top} - X W^{\top} \rVert^2,\quad H = 2 X^{\top} X",
         r"\text{decode tok/s} \le \frac{\text{bandwidth}}{\text{weight bytes}}"],
        [f"Each of SmolLM2's {cfg.num_layers} layers has 7 linear weight matrices. **Round-to-nearest** puts every "
         "weight on a grid of 2^b levels with one scale s and zero point z per group of input channels.",
         "**AWQ** runs the calibration text through the model first. A few input channels carry activations far "
         "larger than the rest; it scales their weights up before rounding (a finer grid for the weights that "
         "matter) and the activations down, searching α per layer.",
         "**GPTQ** rounds one input column at a time and moves each column's rounding error onto the columns not "
         "yet rounded, through the inverse Hessian of the calibration inputs: the layer's output changes as "
         "little as the grid allows. **GPTQ act-order** (add it to the methods) takes the columns with the largest "
         "inputs first, while the most columns remain to absorb their error.",
         "Both quantize layer by layer, each layer from the inputs it sees once the layers before it are "
         "quantized. **Calibrate on chat** (the fine-tune's own answers) or on generic prose and compare.",
         "**GPTQ fits the calibration text best and generalises less**: H from a few thousand tokens barely pins "
         "down 576 or 1,536 input channels, so it also fits that text's accidents (published runs use ~100k "
         "tokens). Try 512 against 4,096 calibration tokens; AWQ, which only needs each channel's mean, hardly moves.",
         "**Why bother**: a batch-1 decode step reads every weight once, so its time follows the checkpoint's "
         "bytes. A large model's linears are nearly all of it, so 4 bits shrink it almost 4× and decode speeds up "
         f"about as much; SmolLM2 keeps its 16-bit embedding ({embedding_share:.0%} of its weights), so here the "
         "checkpoint shrinks a little over 2× (measured in the table below)."],
        note="b bits; one FP16 scale and zero point per group of 32 or 64 input channels (128, the usual choice, "
             f"does not divide this model's {cfg.hidden_size} hidden channels) or per output channel (“per "
             "channel”: one per row of W); the embedding, "
             "tied to the LM head, and the norms stay in 16 bits, as GPTQ and AWQ checkpoints keep them.")


def backend_line() -> None:
    where = device_label()
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) · quantization and scoring "
               "in fp32 on the CPU; each checkpoint's answer from the live engine on "
               f"{where} ({dtype_name()}) · the weights are **dequantized for the matmuls** (no W4A16 kernel here): "
               "errors and texts are real; the bytes and the decode bound are what a 4-bit kernel would read."
               + (" The full model is the GGUF's Q4_1 weights dequantized (the only copy we have: already rounded "
                  "once, in groups of 32 with a scale and a minimum); each method rounds those values again on its "
                  "own grid." if weights_mode() == "real" else ""))


# ---- settings ------------------------------------------------------------------------------------

def _key(page: str, name: str) -> str:
    return f"{page}-{name}"


def settings_form(page: str) -> LabSettings:
    """The form; returns the settings to show (the last ones that ran: a rejected form keeps them, with its
    message)."""
    shown: LabSettings = page_settings(page, LabSettings)
    with st.form(f"{page}-form", border=True):
        # The methods get most of the row, and their chips wrap: in a column a multiselect keeps them on one line
        # by default, and at 1024 pixels with the sidebar open the fourth (GPTQ act-order) scrolled out of sight.
        c = st.columns([3, 1, 1])
        methods = c[0].multiselect("Methods", list(METHODS), default=list(shown.methods),
                                   format_func=METHOD_LABELS.get, key=_key(page, "methods"), wrap=True)
        bits = c[1].selectbox("Bits", [8, 4, 3, 2], index=[8, 4, 3, 2].index(shown.bits), key=_key(page, "bits"))
        group = c[2].selectbox("Group", list(GROUPS), index=list(GROUPS).index(shown.group),
                               format_func=group_text, key=_key(page, "group"),
                               help="input channels sharing one scale and zero point; per channel: one per output "
                                    "channel, i.e. per row of W, across all its input channels")
        c = st.columns(3)
        calibration = c[0].selectbox("Calibration text", list(CALIBRATION_SETS),
                                     index=list(CALIBRATION_SETS).index(shown.calibration),
                                     key=_key(page, "calibration"),
                                     help=" · ".join(f"{k}: {v}" for k, v in CALIBRATION_HELP.items()))
        tokens = c[1].number_input("Calibration tokens", WINDOW, MAX_CALIBRATION_TOKENS, shown.calibration_tokens,
                                   step=WINDOW, key=_key(page, "tokens"),
                                   help=f"windows of {WINDOW} tokens; more is slower and steadier")
        new_tokens = c[2].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, shown.max_new_tokens,
                                       key=_key(page, "new-tokens"))
        prompt = st.text_input("Prompt each checkpoint answers (a chat message)", shown.prompt,
                               key=_key(page, "prompt"))
        submitted = st.form_submit_button("Quantize and measure", icon=":material/play_arrow:", type="primary")
    candidate = LabSettings(tuple(methods), int(bits), int(group), calibration, int(tokens), str(prompt),
                            int(new_tokens)) if submitted else None
    return submitted_settings(page, candidate)


def lab_run(weights: LoadedWeights, s: LabSettings, progress: Progress | None = None) -> StoredResult[LabResult]:
    """The lab at the server's device and dtype, read back from disk when it ran before: what the page runs and
    what `python3 -m app.prewarm` computes ahead of a class."""
    return stored_lab(weights, s, device(), dtype_name(), progress)


def get_result(page: str, s: LabSettings) -> LabResult | None:
    """The run for these settings (`page_run`: this tab's, the server's, or computed now with a progress bar)."""
    def run(bar) -> StoredResult[LabResult]:  # noqa: ANN001 (a Streamlit progress bar)
        return lab_run(shared_weights(), s, progress_reporter(bar))

    return page_run(page, s, run, "Quantizing…", "The run failed")


# ---- results -------------------------------------------------------------------------------------

def summary_section(result: LabResult, page: str) -> None:
    s = result.settings
    st.subheader("Size against quality")
    st.markdown(f"Every linear of every layer on **INT{s.bits}**, {grid_text(s.group)}; "
                f"{calibration_text(s.methods, result.calibration_windows * WINDOW, s.calibration)}. Scored on "
                "held-out text against the full model: chat answers the full model wrote (the fine-tune's "
                "behaviour) and plain prose.")
    cols = st.columns(len(result.outcomes))
    ref = result.reference
    for col, v in zip(cols, result.outcomes):
        delta = None if v.method is None else f"-{1 - v.weight_bytes / ref.weight_bytes:.0%} bytes"
        col.metric(v.label.split(" · ")[0], fmt_bytes(v.weight_bytes), delta, delta_color="off",
                   help=f"{v.bits_per_weight:.2f} bits per linear weight; chat KL {v.scores['chat'].kl:.3g} nats")
    frame = results_frame(result)
    # Every checkpoint has the grid said above ("INT4, groups of 64"): the rows name the method, as the metrics
    # do, and the label column stays as narrow as "Full precision (16-bit)".
    frame["Weights"] = frame["Weights"].str.split(" · ").str[0]
    num = st.column_config.NumberColumn
    weights = st.column_config.TextColumn(width=136)
    # Two tables with set widths, what a checkpoint costs and what it keeps: at 1024 pixels with the sidebar
    # open (a 690-pixel page) all eleven columns in one table took 817 and hid the last three.
    st.dataframe(frame[["Weights", "Bits/weight", "MiB", "H200 tok/s bound", "Quantize s"]], hide_index=True,
                 width="stretch", placeholder=NO_VALUE, column_config={
        "Weights": weights,
        "Bits/weight": num("Bits per weight", format="%.2f", width=98,
                           help="bits per linear weight, scales and zero points included"),
        "MiB": num(format="%.1f", width=48, help="the whole checkpoint: embedding and norms in 16 bits"),
        "H200 tok/s bound": num("H200 decode bound (tok/s)", format="%,.0f", width=170, help=(
            f"at most: batch-1 decode reads every weight once, so {H200.peak_bytes_per_s / 1e12:.2f} TB/s (the "
            "H200's measured copy bandwidth) / checkpoint bytes")),
        "Quantize s": num("Quantizing took (s)", format="%.1f", width=122,
                          help="seconds to quantize all 30 layers here"),
    })
    quality = ["Weights", "Chat KL", "Chat top-1", "Chat answers ppl", "Prose KL", "Prose ppl", "Answer leaves at"]
    st.dataframe(in_percent_points(frame[quality], "Chat top-1"), hide_index=True, width="stretch",
                 placeholder=NO_VALUE, column_config={
        "Weights": weights,
        "Chat KL": num(format="%.3g", width=60, help="mean KL(full ‖ quantized) per answer token, in nats"),
        "Chat top-1": share_column(width=86, help="how often its top token is the full model's"),
        "Chat answers ppl": num("Chat ppl", format="%.2f", width=62, help="perplexity of the full model's own "
                                                                          "answers: how surely it would still write "
                                                                          "them"),
        "Prose KL": num(format="%.3g", width=62, help="mean KL(full ‖ quantized) per token of held-out prose"),
        "Prose ppl": num(format="%.2f", width=66, help="perplexity of held-out prose"),
        "Answer leaves at": differs_at_column("its greedy answer to the prompt"),
    })
    show_figure(quality_figure(result), key=f"{page}-quality", height=430)
    best = min(result.variants, key=lambda v: v.scores["chat"].kl, default=None)
    if best is not None:
        st.caption(f"Closest to the full model on chat answers: **{best.label}** (KL {best.scores['chat'].kl:.3g} nats, "
                   f"top-1 {best.scores['chat'].top1:.1%}). The decode bound: {decode_bound_tok_s(ref.weight_bytes):,.0f} "
                   f"tok/s in 16 bits against {decode_bound_tok_s(best.weight_bytes):,.0f} at {best.bits_per_weight:.2f} "
                   "bits, before the KV cache and the kernels' own overheads.")


def bits_section(page: str) -> None:
    """The size/quality trade-off across bit widths, from the bench's file (a page run covers one width)."""
    frame = load_bench()
    if frame is None:
        st.caption(f"No benchmark file for every bit width yet: run `{BENCH_COMMAND}`.")
        return
    show_figure(bits_sweep_figure(frame), key=f"{page}-bits-chart", height=440)
    four = frame[(frame["bits"] == 4) & (frame["calibration"] == "chat")].set_index("method")["chat_kl"]
    eight = frame.loc[frame["bits"] == 8, "chat_kl"]
    # From the file: "within a thousandth of a nat" was written above round-to-nearest's measured 0.00135.
    at_eight = (f"At 8 bits every method stays within {eight.max():.2g} nats of the full model; " if len(eight)
                else "")
    st.caption(f"From `{BENCH_COMMAND}` (the real model on a 2-core CPU, 2,048 calibration tokens). {at_eight}"
               + ("at" if at_eight else "At") + " 4 bits the method matters"
               + (f" (chat KL: {' · '.join(f'{m} {k:.3g}' for m, k in four.items())})" if len(four) else "")
               + "; at 3 bits none keeps the answers. Only this page's run above is live.")


def texts_section(result: LabResult) -> None:
    decode = shared_weights().tokenizer.decode
    st.subheader("What each checkpoint answers")
    st.caption(f"“{result.settings.prompt}”, greedy, from the live engine. Plain text matches the full model's "
               "answer; the highlighted rest is where the quantized model went its own way.")
    answer_rows([(v.label, method_color(v.method), v.answer_ids) for v in result.outcomes],
                result.reference.answer_ids, decode, "wq")


def layers_section(result: LabResult, page: str) -> None:
    frame = layer_frame(result)
    if frame.empty:
        return
    show_figure(layer_error_figure(frame), key=f"{page}-layers", height=420)
    means = frame.groupby("method", sort=False)["rel_error"].mean()
    chat = {METHOD_LABELS[v.method]: v.scores["chat"].kl for v in result.variants if v.method}
    st.caption("Mean output error on the calibration inputs: " + " · ".join(f"{m} {e:.1%}" for m, e in means.items())
               + ". Against the held-out chat KL above (" + " · ".join(f"{m} {k:.3g}" for m, k in chat.items())
               + "): " + fit_note(result.settings.methods))
    if (frame["method"] == "AWQ").any():
        show_figure(alpha_figure(frame), key=f"{page}-alpha", height=330)


def outliers_section(result: LabResult, page: str) -> None:
    st.subheader("Why some weights matter more: activation outliers")
    cfg = shared_weights().config
    c = st.columns([1, 2])
    inputs = list(INPUT_LABELS)
    inp = c[0].selectbox("Layer input", inputs, format_func=INPUT_LABELS.get, key=f"{page}-outlier-input")
    default = worst_ratio_layer(result.profile, inp)
    layer = c[1].slider("Layer", 0, cfg.num_layers - 1, default, key=f"{page}-outlier-layer-{inp}")
    magnitudes, ratio, top = outlier_stats(result.profile, layer, inp)
    show_figure(activation_figure(magnitudes, top, layer, inp, ratio), key=f"{page}-outliers", height=380)
    st.caption("A weight's rounding error reaches the output multiplied by its input: the weights that read the "
               "orange channels matter most. AWQ scales exactly those up before rounding; GPTQ sees them as large "
               "entries of H = 2XᵀX and moves error away from them.")


def download_section(result: LabResult, page: str) -> None:
    st.download_button("Download this run (JSON)", result_json(result), file_name="weight_quantization.json",
                       mime="application/json", icon=":material/download:", key=f"{page}-download")
    took = sum(v.seconds for v in result.variants)
    st.caption(f"Quantizing alone took {fmt_duration(took)} here (the “Quantizing took” column; the run's time at "
               "the top also covers writing the calibration text, scoring and the greedy answers); "
               "the run is kept for everyone on this server "
               "and on this machine's disk, so a class opening the page or a restarted server sees it at once.")

