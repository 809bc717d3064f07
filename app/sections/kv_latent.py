"""The KV cache page's MLA section: the arithmetic of a latent cache on released models, then MLA's idea tried on
the live model (its K and V projections factored through a latent, the cache holding only the latent)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.kv_latent.lab import (KIND_LABELS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, RANKS, LatentLabResult,
                                  LatentSettings, Progress, full_rank, stored_latent_lab)
from engine.result_store import StoredResult
from engine.weights import LoadedWeights

from app.analysis.kv_math import PUBLISHED_CACHES
from app.charts.kv_latent import KIND_COLORS, published_figure, spectrum_figure, tradeoff_figure
from app.formatting import NO_VALUE, fmt_bytes, fmt_duration, plural
from app.runtime import shared_weights
from app.state import mark_requested, page_settings, progress_reporter, run_on_request, submitted_settings
from app.table_columns import in_percent_points, share_column
from app.theme import show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation

CONTEXT = 128 * 1024
BF16 = 2


def mla_section(page: str) -> None:
    """The explanation, the released models, then the live retrofit (run on request)."""
    st.subheader("MLA: cache one latent, rebuild K and V from it")
    explanation(
        "Multi-head latent attention (DeepSeek-V2, V3)",
        [r"c_t = W^{DKV} x_t \quad \text{(cached)}",
         r"k^{(h)}_t = W^{UK}_h\, c_t, \qquad v^{(h)}_t = W^{UV}_h\, c_t",
         r"q^{(h)\top} k^{(h)}_t = \big(W^{UK\top}_h q^{(h)}\big)^{\top} c_t",
         r"\text{bytes per token} = L\,{(d_c + d_R)}\, b \;\;\text{vs}\;\; 2 L\, H_{kv}\, d_h\, b"],
        ["**GQA and MQA shrink the cache by sharing heads**; MLA shrinks it by caching one small vector $c_t$ per "
         "token and layer, from which every head's K and V are rebuilt by an up-projection.",
         "**Absorption**: $W^{UK}$ can be folded into the query projection (third line) and $W^{UV}$ into the output "
         "projection, so attention runs on the latents directly: nothing is rebuilt at decode time.",
         "**RoPE does not absorb**: a rotation that depends on the position sits between $W^{UK}$ and the score. "
         "MLA keeps RoPE out of the latent and adds a small rotary key of $d_R$ numbers, shared by all heads.",
         "**Below, on the live model**: SmolLM2 was trained with GQA, not MLA. Its K and V projections are "
         "factored through a latent after the fact (SVD), the cache then holds only the latent, and the model's "
         "quality is measured at each latent size, against sharing heads (MQA) at the same size."],
        note="$c_t$ is $d_c$ numbers, all a layer caches for token $t$. DeepSeek-V3: $L$ = 61 layers, $d_c$ = 512, "
             "$d_R$ = 64, so 576 numbers a token and layer where its 128 heads would cache 128 × (192 + 128) = 40,960 "
             "as MHA. $b$ is bytes per number (2 in bf16).",
        name="mla")
    show_figure(published_figure(BF16, CONTEXT), key=f"{page}-published", height=380, export_width=1100)
    v3 = next(m for m in PUBLISHED_CACHES if m.kind == "MLA")
    mha = next(m for m in PUBLISHED_CACHES if m.name.startswith("DeepSeek") and m.kind == "MHA")
    l70 = next(m for m in PUBLISHED_CACHES if m.name == "Llama 3.1 70B")
    st.caption(f"From each model's published config.json, at bf16. DeepSeek-V3 caches "
               f"{mha.numbers_per_layer // v3.numbers_per_layer}× less than its heads would as MHA, and "
               f"{l70.bytes_per_token(BF16) / v3.bytes_per_token(BF16):.1f}× less per token than Llama 3.1 70B, "
               "a model a tenth its size.")
    with st.expander("The released models' caches, as a table"):
        rows = [{"model": m.name, "cache": m.kind, "layers": m.layers, "numbers a token and layer": m.shape,
                 "per token (bf16)": fmt_bytes(m.bytes_per_token(BF16)),
                 f"one {CONTEXT // 1024}k request": fmt_bytes(m.bytes_per_token(BF16) * CONTEXT)}
                for m in PUBLISHED_CACHES]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    latent_lab_section(page)


# ---- the live retrofit -----------------------------------------------------------------------------

def _settings_form(page: str) -> LatentSettings:
    lab = f"{page}-mla"
    shown: LatentSettings = page_settings(lab, LatentSettings)
    with st.form(f"{lab}-form", border=True):
        c = st.columns([1.2, 1.6, 1])
        ranks = sorted(RANKS)
        rank = c[0].selectbox("Latent rank for the answer", ranks, index=ranks.index(shown.answer_rank)
                              if shown.answer_rank in ranks else 0, key=f"{lab}-rank",
                              help=f"numbers cached per token and layer (the model's own K and V: "
                                   f"{full_rank(shared_weights().config)})")
        methods = ["aware", "plain"]
        method = c[1].radio("Factorisation", methods, index=methods.index(shown.answer_method), horizontal=True,
                            format_func=lambda m: KIND_LABELS[m].removeprefix("latent, "), key=f"{lab}-method",
                            help="plain: the SVD of the weights; activation-aware: of the K and V the "
                                 "calibration text produces")
        new_tokens = c[2].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, shown.max_new_tokens,
                                       key=f"{lab}-tokens")
        prompt = st.text_input("Prompt (answered by the model as trained, the latent cache and MQA)", shown.prompt,
                               key=f"{lab}-prompt",
                               help=f"up to {MAX_PROMPT_CHARS:,} characters; sent in the model's ChatML template")
        submitted = st.form_submit_button("Factor, score and answer", icon=":material/play_arrow:", type="primary")
    candidate = None
    if submitted:
        mark_requested(lab)
        candidate = LatentSettings(prompt=str(prompt), max_new_tokens=int(new_tokens), answer_rank=int(rank),
                                   answer_method=method)
    return submitted_settings(lab, candidate)


def lab_run(weights: LoadedWeights, s: LatentSettings,
            progress: Progress | None = None) -> StoredResult[LatentLabResult]:
    """The latent-cache lab, read back from disk when it ran before: what the page runs and what
    `python3 -m app.prewarm` computes ahead of a class."""
    return stored_latent_lab(weights, s, progress)


def latent_lab_section(page: str) -> None:
    lab = f"{page}-mla"
    st.markdown("#### A latent cache on the live model")
    st.markdown("Each layer's K and V projections (W_k and W_v stacked: "
                f"{full_rank(shared_weights().config)} × {shared_weights().config.hidden_size}) are factored as "
                "**up · down** by a truncated SVD: **down** makes the latent the cache keeps, **up** rebuilds K and V "
                "from it. *Plain* SVD keeps as much of the weights as it can; *activation-aware* SVD keeps as much of "
                "the K and V the model actually produces on calibration text, which is what attention reads.")
    settings = _settings_form(page)

    def run(bar) -> StoredResult[LatentLabResult]:  # noqa: ANN001 (a Streamlit progress bar)
        return lab_run(shared_weights(), settings, progress_reporter(bar))

    result = run_on_request(lab, settings, run, "Factoring and scoring…", "The latent-cache run failed",
                            "Press **Factor, score and answer** (about 30 s on an idle 2-core CPU the first time: the "
                            "full model writes its calibration and evaluation text once, then every latent size is "
                            "scored).")
    if result is None:
        return
    _answers(result)
    domain = st.radio("Scored on", ["chat", "prose"], horizontal=True, key=f"{lab}-domain",
                      format_func=lambda d: {"chat": "chat answers the full model wrote",
                                             "prose": "prose"}[d])
    show_figure(tradeoff_figure(result, domain), key=f"{lab}-tradeoff", height=460, export_width=1100)
    _findings(result, domain)
    left, right = st.columns([1.1, 1])
    with left:
        show_figure(spectrum_figure(result), key=f"{lab}-spectrum", height=420, export_width=900)
    with right:
        st.markdown("**Why plain SVD fails.** The weights are not low-rank (the grey band climbs slowly), and "
                    "worse, plain SVD treats every input direction alike while a few hidden channels carry most of "
                    "the activations (the outliers the quantization pages meet). Weighted by what the text really "
                    "feeds in, the K and V the model produces are close to low-rank (green): that is the part "
                    "worth keeping, and MLA trains its latent to be exactly that.")
        st.markdown("**Absorbed and rebuilt.** V is absorbed here as in MLA: attention averages the cached "
                    "latents with its weights and each head applies up_v once to the average, so V is never rebuilt. "
                    "K is rebuilt for every cached token at every step, because RoPE rotates it by its position "
                    "after up_k; a trained MLA keeps RoPE in a separate small key so that up_k folds into the query "
                    "projection too.")
    with st.expander("Every cache layout scored"):
        frame = _points_frame(result)
        top1 = [c for c in frame.columns if c.endswith(" top-1")]
        num = st.column_config.NumberColumn
        # Shares in percent points, numbers so that each column sorts by value; – where a layout has no spectrum.
        # Short headers (the meanings in the tooltips): all eight columns fit the expander on a projector.
        st.dataframe(in_percent_points(frame, "share of GQA's cache", "spectrum kept", *top1), hide_index=True,
                     width="stretch", placeholder=NO_VALUE, column_config={
                         "numbers a token and layer": num("numbers", help="numbers cached per token and layer"),
                         "share of GQA's cache": share_column("vs GQA", bar=False, help="share of GQA's cache"),
                         "spectrum kept": num("spectrum", format="%.1f%%",
                                              help="share of the spectrum the latent keeps, mean over layers"),
                         **{c: num(c.replace(" (nats)", ""), help="mean KL per token, in nats")
                            for c in frame.columns if c.endswith(" KL (nats)")},
                         **{c: num(format="%.1f%%", help="how often its top token is the full model's")
                            for c in top1}})
    st.caption(f"Calibration: 1,024 tokens of the chat text the weight and activation pages use; scored on "
               f"{plural(result.points[0].scores['chat'].tokens, 'chat token')} and "
               f"{plural(result.points[0].scores['prose'].tokens, 'prose token')} the model did not calibrate on. "
               f"The latent decoder is a plain fp32 loop over the layers on the CPU, not the paged engine. Run took "
               f"{fmt_duration(result.seconds)}.")


def _answers(result: LatentLabResult) -> None:
    decode = shared_weights().tokenizer.decode
    full, chosen, mqa = result.answers
    c = st.columns(4)
    per = chosen.run.cache_numbers_per_token // result.layers
    c[0].metric("Numbers per token and layer", f"{per}", f"{per / result.full_rank - 1:+.0%} vs GQA",
                delta_color="inverse", help="what the latent decoder's cache tensors hold for each token, per layer")
    c[1].metric("Per token at bf16", fmt_bytes(chosen.run.cache_numbers_per_token * BF16),
                help=f"GQA as trained: {fmt_bytes(full.run.cache_numbers_per_token * BF16)}")
    c[2].metric("Cache after the answer (fp32)", fmt_bytes(chosen.run.cache_bytes),
                help="measured: the bytes of the latent decoder's cache tensors (fp32 here: twice the bf16 figure "
                     "beside it, per token) once the answer is "
                     f"written; the model as trained held {fmt_bytes(full.run.cache_bytes)} for its answer")
    c[3].metric("Rebuilding K from latents", f"{chosen.run.rebuild_flops / 1e9:.2f} GFLOP",
                help="every step multiplies every cached latent by up_k again (RoPE sits between it and the score, "
                     "so it cannot be absorbed): the total over this answer. V is never rebuilt: attention averages "
                     "the latents and up_v is applied once per head to the average.")
    colors = [KIND_COLORS["full"], KIND_COLORS[result.settings.answer_method], KIND_COLORS["mqa"]]
    answer_rows([(a.label, color, a.run.tokens) for a, color in zip(result.answers, colors)], full.run.tokens,
                decode, "kvl")
    words = []
    for a in (chosen, mqa):
        said = ("the same answer" if a.differs_at is None
                else f"leaves the trained model's answer at token {a.differs_at + 1}")
        # A broken cache can make the model write one token over and over ("--------" for MQA here): say it is
        # the model's real output, or the row reads like a placeholder.
        tokens = list(a.run.tokens)
        if len(tokens) >= 4 and len(set(tokens)) == 1:
            said += f" and writes {decode(tokens[:1])!r} {len(tokens)} times: the model's real output, collapsed"
        words.append(f"{a.label[:1].upper()}{a.label[1:]}: {said}")
    st.caption("Greedy, from the prompt in ChatML. Plain text matches the model as trained (its cache rebuilt "
               "from K and V themselves); the highlighted rest is where an answer leaves it. " + "; ".join(words) + ".")


def _findings(result: LatentLabResult, domain: str) -> None:
    mqa = next((p for p in result.points if p.kind == "mqa"), None)
    same = result.point("aware", mqa.rank) if mqa else None
    if mqa is None or same is None:
        return
    a, m = same.scores[domain], mqa.scores[domain]
    st.markdown(f"**At the same cache size ({mqa.rank} numbers a token and layer, a third of GQA's)**: the "
                f"activation-aware latent stays at KL {a.kl:.2f} nats and agrees with the full model on "
                f"{a.top1:.0%} of next tokens; averaging the three KV heads into one (MQA) gives KL {m.kl:.2f} and "
                f"{m.top1:.0%}. A latent shared by all heads keeps far more than one shared head, which is MLA's "
                "case against GQA and MQA. Neither retrofit is trained: MLA learns its latent, and GQA checkpoints "
                "made by pooling heads are uptrained afterwards.")


def _points_frame(result: LatentLabResult) -> pd.DataFrame:
    rows = []
    for p in sorted(result.points, key=lambda p: (-p.rank, p.kind)):
        row = {"cache layout": p.label, "numbers a token and layer": p.rank,
               "share of GQA's cache": p.rank / result.full_rank, "spectrum kept": p.kept_energy}
        for d, s in p.scores.items():
            row[f"{d} KL (nats)"] = round(s.kl, 4)
            row[f"{d} top-1"] = s.top1
        rows.append(row)
    return pd.DataFrame(rows)
