"""Sections of the activation quantization page (pages/18_activation_quantization.py composes them)."""
from __future__ import annotations

import streamlit as st

from engine.act_quant.lab import (ALPHAS, EVAL_CHAT, MAX_CALIBRATION_TOKENS, MAX_NEW_TOKENS, SWEEPABLE, VARIANTS,
                                  ActLabResult, ActLabSettings, Progress, stored_lab)
from engine.result_store import StoredResult
from engine.weight_quant.texts import WINDOW
from engine.weights import LoadedWeights

from app.analysis.act_quant import (H200_PEAKS, INPUT_LABELS, STAT_LABELS, alpha_note, channel_view, fmt_times,
                                    fp8_speedup, median_channel_levels, outlier_frame, result_json, results_frame,
                                    worst_layer)
from app.charts.act_quant import alpha_figure, channel_figure, outlier_ratio_figure, quality_figure, variant_color
from app.formatting import fmt_duration
from app.runtime import device, device_label, shared_weights, weights_mode
from app.state import page_run, page_settings, progress_reporter, submitted_settings
from app.table_columns import column_px, differs_at_column, in_percent_points, share_column
from app.theme import show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation


def aq_explanation() -> None:
    explanation(
        "Low-precision activations, and the few channels that make it hard",
        [r"\hat x = s \cdot \operatorname{round}\!\left(\tfrac{x}{s}\right),\quad "
         r"s_{\text{INT8}} = \tfrac{\max|x|}{127},\quad s_{\text{FP8}} = \tfrac{\max|x|}{448}",
         r"\text{NVFP4: } \hat x_i = s_b \cdot \operatorname{E2M1}\!\left(\tfrac{x_i}{s_b}\right),\quad "
         r"s_b = \operatorname{E4M3}\!\left(\tfrac{\max_{i \in b}|x_i|}{6}\right),\ |b| = 16",
         r"X W^{\top} = \left(X \operatorname{diag}(s)^{-1}\right)\left(\operatorname{diag}(s)\, W^{\top}\right)",
         r"s_j = \frac{\max|X_j|^{\alpha}}{\max|W_j|^{\,1-\alpha}}"],
        ["A tensor core multiplies two low-precision operands, so **both** the weights and the layer's input "
         "(the activations) must be on the grid: FP8 E4M3 (largest value 448, 3 mantissa bits), INT8, or FP4 "
         "E2M1 (only ±0, 0.5, 1, 1.5, 2, 3, 4, 6), which needs a scale per small block.",
         "Weights are easy: fixed, smooth, per output channel. Activations are not: **a few input channels are "
         "tens to thousands of times larger than the rest**, on every token. One scale per tensor must cover "
         "them, and every other channel is left a handful of levels (or rounds to zero).",
         "**Per-token** scales help a little (each row its own max); **block scales** (FP4) isolate an outlier "
         "to its block of 16 or 32; **SmoothQuant** divides each channel by s_j and multiplies the weights' "
         "column by it, the same product, so the outliers move into the weights, which take them better.",
         "Look at the channel chart (orange: the outliers), then at the distance chart: per-tensor INT8 without "
         "smoothing against with it, and FP8 against FP4."],
        note="Fake quantization: each tensor is rounded to the format and dequantized, and the matmuls run in fp32 "
             "on the CPU. The numbers are what the format can hold; there is no FP8 or FP4 GEMM here. The "
             "embedding, norms, attention scores and KV cache stay in full precision. Per-tensor activation scales "
             "(INT8, FP8, and NVFP4's fp32 scale above its block scales) are calibrated once on the calibration "
             "text, as deployed checkpoints ship them; per-token and block scales are computed on the fly.")


def backend_line() -> None:
    where = "" if device() == "cpu" else f" (also on this GPU server, whose engine runs on {device_label()})"
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) · **simulated in fp32 on "
               f"the CPU**{where}: weights and each linear's input rounded to the format, then an fp32 matmul (a "
               "low-precision GEMM computes the same products; a CPU has no FP8 or FP4 tensor cores) · "
               "every answer from the same dense pass, token by token.")


# ---- settings ------------------------------------------------------------------------------------

def _key(page: str, name: str) -> str:
    return f"{page}-{name}"


def settings_form(page: str) -> ActLabSettings:
    """The form; returns the settings to show (the last that ran: a rejected form keeps them, with its message)."""
    shown: ActLabSettings = page_settings(page, ActLabSettings)
    sweeps = [None, *SWEEPABLE]
    with st.form(f"{page}-form", border=True):
        variants = st.multiselect("Formats", list(VARIANTS), default=list(shown.variants),
                                  format_func=lambda k: VARIANTS[k].label, key=_key(page, "variants"))
        c = st.columns([1, 1.6, 1, 1])
        alpha = c[0].number_input("SmoothQuant α", 0.0, 1.0, float(shown.alpha), step=0.05, format="%.2f",
                                  key=_key(page, "alpha"), help="for the + SmoothQuant formats: s_j = "
                                  "max|X_j|^α / max|W_j|^(1−α)")
        sweep = c[1].selectbox("α sweep on", sweeps, index=sweeps.index(shown.sweep),
                               format_func=lambda k: "no sweep" if k is None else VARIANTS[k].label,
                               key=_key(page, "sweep"), help=f"α = {ALPHAS[0]:g} … {ALPHAS[-1]:g}, "
                               "scored on chat answers")
        tokens = c[2].number_input("Calibration tokens", WINDOW, MAX_CALIBRATION_TOKENS, shown.calibration_tokens,
                                   step=WINDOW, key=_key(page, "tokens"),
                                   help=f"chat text in windows of {WINDOW}: each channel's max |x| and mean |x|")
        new_tokens = c[3].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, shown.max_new_tokens,
                                       key=_key(page, "new-tokens"))
        prompt = st.text_input("Prompt each format answers (a chat message)", shown.prompt, key=_key(page, "prompt"))
        submitted = st.form_submit_button("Quantize and measure", icon=":material/play_arrow:", type="primary")
    candidate = ActLabSettings(tuple(variants), float(alpha), sweep, int(tokens), str(prompt),
                               int(new_tokens)) if submitted else None
    return submitted_settings(page, candidate)


def lab_run(weights: LoadedWeights, s: ActLabSettings,
            progress: Progress | None = None) -> StoredResult[ActLabResult]:
    """The lab, read back from disk when it ran before: what the page runs and what `python3 -m app.prewarm`
    computes ahead of a class."""
    return stored_lab(weights, s, progress)


def get_result(page: str, s: ActLabSettings) -> ActLabResult | None:
    def run(bar) -> StoredResult[ActLabResult]:  # noqa: ANN001 (a Streamlit progress bar)
        return lab_run(shared_weights(), s, progress_reporter(bar))

    return page_run(page, s, run, "Quantizing…", "The run failed")


# ---- results -------------------------------------------------------------------------------------

def outliers_section(result: ActLabResult, page: str) -> None:
    # The heading's number and the chart's first view come from the run: a fixed "hundreds of times" sat above a
    # default view (the first input) whose largest channel was 30x the median.
    top = max(result.outliers, key=lambda r: r.max_ratio)
    st.subheader(f"The difficulty: a few channels up to {fmt_times(top.max_ratio)} the median")
    cfg = shared_weights().config
    c = st.columns([1.3, 1, 2])
    inputs = list(INPUT_LABELS)
    inp = c[0].selectbox("Layer input", inputs, index=inputs.index(top.input), format_func=INPUT_LABELS.get,
                         key=f"{page}-input")
    stat = c[1].radio("Per channel", ["max", "mean"], format_func=STAT_LABELS.get, horizontal=True,
                      key=f"{page}-stat")
    layer = c[2].slider("Layer", 0, cfg.num_layers - 1, worst_layer(result, inp, stat),
                        key=f"{page}-layer-{inp}-{stat}")
    view = channel_view(result, layer, inp, stat)
    show_figure(channel_figure(view), key=f"{page}-channels", height=520)
    note = alpha_note(result.settings.alpha)
    st.caption(f"SmoothQuant at α = {result.settings.alpha:g} divides channel j by s_j (and multiplies the weights "
               f"that read it by s_j): the largest {STAT_LABELS[stat]} goes from {fmt_times(view.ratio_before)} to "
               f"{fmt_times(view.ratio_after)} the median." + (f" {note}" if note else "")
               + (" " + median_channel_levels(view.ratio_before) if stat == "max" else ""))
    show_figure(outlier_ratio_figure(outlier_frame(result), stat), key=f"{page}-ratios", height=420)


def quality_section(result: ActLabResult, page: str) -> None:
    st.subheader("What each format keeps")
    st.markdown(f"Scored on held-out text against the full model: {EVAL_CHAT} chat answers the full model wrote "
                f"and a paragraph of prose; calibrated on {result.calibration_tokens:,} tokens of chat. W and A: "
                "bits per weight and per activation, block scales included.")
    show_figure(quality_figure(result), key=f"{page}-quality", height=500)
    frame = in_percent_points(results_frame(result), "Chat top-1", "Prose top-1")
    # One column for both widths ("4.5 / 4.5", like the formats' W4A4), shares as plain percents and set widths:
    # at 1024 pixels with the sidebar open (a 690-pixel page) the table took 732 and hid "Answer leaves at".
    frame.insert(1, "W / A bits", [f"{w:.3g} / {a:.3g}" for w, a in zip(frame.pop("W bits"), frame.pop("A bits"))])
    num = st.column_config.NumberColumn
    st.dataframe(frame, hide_index=True, width="stretch", column_config={
        # A quarter wider in presentation mode (column_px): there "W8A8 INT8 per-tensor + SmoothQuant" was cut.
        "Format": st.column_config.TextColumn(width=column_px(232)),
        "W / A bits": st.column_config.TextColumn(width=70, help="bits per weight / per activation, block scales "
                                                             "included (16: left in BF16)"),
        "Chat KL": num(format="%.3g", width=60, help="mean KL(full ‖ quantized) per answer token"),
        "Chat top-1": share_column(bar=False, width=72, help="how often its top token is the full model's"),
        "Prose KL": num(format="%.3g", width=62),
        "Prose top-1": share_column(bar=False, width=78),
        "Answer leaves at": differs_at_column(),
    })
    by = {v.key: v.scores["chat"].kl for v in result.variants}
    notes = []
    if "int8-tensor" in by and "int8-sq" in by:
        notes.append(f"SmoothQuant takes W8A8 per-tensor from {by['int8-tensor']:.3g} to {by['int8-sq']:.3g} nats")
    if "fp8-tensor" in by and (fp4 := [k for k in ("nvfp4", "mxfp4") if k in by]):
        notes.append(f"FP8 per-tensor {by['fp8-tensor']:.3g} against "
                     + " · ".join(f"{VARIANTS[k].label.split()[-1]} {by[k]:.3g}" for k in fp4))
    # Why SmoothQuant lost, when α is at an extreme: said here too, where the loss shows (no sweep, no sweep caption).
    note = alpha_note(result.settings.alpha) if any(v.variant.smooth for v in result.variants) else None
    parts = (["Chat KL: " + "; ".join(notes) + "."] if notes else []) + ([note] if note else [])
    if parts:
        st.caption(" ".join(parts))


def sweep_section(result: ActLabResult, page: str) -> None:
    if not result.sweep:
        return
    show_figure(alpha_figure(result), key=f"{page}-alpha-chart", height=420)
    best, base = result.best_alpha, result.sweep_baseline
    st.caption(f"Lowest chat KL at α = {best.alpha:g} ({best.chat_kl:.3g} nats"
               + (f", against {base.chat_kl:.3g} without smoothing" if base else "") + "). "
               "s_j = max|X_j|^α / max|W_j|^(1−α): "
               "small α leaves the activations' outliers where they are, and at α = 0 it is not “no smoothing” "
               "but s_j = 1 / max|W_j|, which multiplies each activation channel by its weights' largest entry, "
               "so it can do worse than not smoothing at all; large α piles the outliers onto the weights' "
               "columns, whose per-channel grid then suffers instead. SmoothQuant's paper picks 0.5 for most "
               "models.")


def texts_section(result: ActLabResult) -> None:
    decode = shared_weights().tokenizer.decode
    st.subheader("What each format answers")
    st.caption(f"“{result.settings.prompt}”, greedy, through the same fp32 dense pass with each format's fake "
               "quantization. Plain text matches the full model's answer; the highlighted rest is where it went "
               "its own way.")
    answer_rows([(v.label, variant_color(v.variant), v.answer_ids) for v in result.outcomes],
                result.reference.answer_ids, decode, "aq")


def why_section() -> None:
    st.subheader("Why it matters")
    peaks = " · ".join(f"{p.precision} {p.tflops:,.0f} TFLOP/s" for p in H200_PEAKS)
    st.markdown(
        f"On NVIDIA's published peak numbers for the H200 (dense tensor-core math: {peaks}), **FP8 is "
        f"{fp8_speedup():.0f}× BF16**, and an FP8 matmul reads half the bytes of its operands. Prefill and large "
        "batches are compute-bound, so that is where FP8 pays; weight-only quantization only helps the "
        "memory-bound decode. Hopper has no FP4 tensor cores: **FP4 (NVFP4, MXFP4) arrives with Blackwell**.")
    st.caption("These are the vendor's datasheet figures (the sparse ones are twice these), not measured here: this "
               "CPU has no tensor cores, and the app's own H200 measurement covers BF16 only (~790 TFLOP/s).")


def download_section(result: ActLabResult, page: str) -> None:
    st.download_button("Download this run (JSON)", result_json(result), file_name="activation_quantization.json",
                       mime="application/json", icon=":material/download:", key=f"{page}-download")
    st.caption(f"The whole run took {fmt_duration(result.seconds)} here (the first run on a server includes the "
               "full model writing its reference text, ~20 s); it is kept for everyone on this server and on "
               "this machine's disk, so a class opening the page or a restarted server sees it at once.")
