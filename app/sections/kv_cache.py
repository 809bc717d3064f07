"""Sections of the KV cache page (pages/01_kv_cache.py composes them)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.config import ModelConfig
from engine.trace import StepRecord

from app.analysis.cache_timing import measure_cache_vs_recompute
from app.analysis.kv_math import (DTYPE_BYTES, attention_variants, kv_bytes_per_token, mla_latent_dims,
                                  variant_bytes_per_token)
from app.analysis.trace_metrics import fullest_before
from app.charts.kv_cache import bytes_vs_tokens, cache_timing, head_variants, kv_growth, long_context
from app.formatting import fmt_bytes
from app.runtime import server_engine_settings, shared_weights
from app.session import EngineSession
from app.state import page_cache
from app.theme import show_figure
from app.widgets.explain import explanation
from app.widgets.request_table import request_state_table
from app.widgets.token_strip import cache_token_strip

CONTEXTS = [8 * 1024, 32 * 1024, 128 * 1024]
LONG_PROMPT = (
    "Read this and summarise it in one sentence. A key-value cache stores, for every layer of a transformer, "
    "the key and value vectors of every token the model has already processed. When the model generates the "
    "next token it only needs the query of that new token and can read all earlier keys and values from the "
    "cache instead of recomputing them. Without the cache, producing token number t means running the whole "
    "sequence of t tokens through every layer again, so the work per token grows with the length of the text, "
    "and the total work for a long answer grows with the square of its length. The price of the cache is "
    "memory: it grows by the same number of bytes with every token, for every sequence in the batch."
)
SHORT_PROMPT = "Why is the sky blue?"


def formula_section(cfg: ModelConfig, elem: int) -> None:
    b = kv_bytes_per_token(cfg, elem)
    explanation(
        "The KV cache byte formula, evaluated for the live model",
        [r"\text{KV bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} "
         r"\times \text{bytes per number}",
         rf"= 2 \times {cfg.num_layers} \times {cfg.num_kv_heads} \times {cfg.head_dim} \times {elem}"
         rf" = {b:,}\ \text{{bytes}} \approx {b / 1024:.1f}\ \text{{KiB}}"],
        [f"The 2 is K and V. {cfg.name} has {cfg.num_heads} query heads but only {cfg.num_kv_heads} KV heads "
         f"(grouped-query attention): each KV head serves {cfg.num_heads // cfg.num_kv_heads} query heads.",
         f"This server runs fp32 (4 bytes); at bf16/fp16 the same token costs "
         f"{kv_bytes_per_token(cfg, 2):,} bytes ({kv_bytes_per_token(cfg, 2) / 1024:.1f} KiB).",
         "Step the engine below: the cache grows by exactly one token's worth per sequence per decode step, "
         "and by a whole prompt's worth in a prefill step.",
         "The dashed line is what the paged pool has reserved: it rises in block-size jumps."],
    )


def growth_section(session: EngineSession, record: StepRecord | None, history: list[StepRecord]) -> None:
    st.subheader("The cache growing, step by step")
    cfg = session.engine.model_config
    per_token = kv_bytes_per_token(cfg, session.kv_bytes_per_element)
    if record is None:
        st.caption("Step the engine to see the cache fill.")
        return
    pool = record.pool
    c = st.columns(4)
    c[0].metric("Tokens in the cache", f"{pool.filled_tokens:,}")
    c[1].metric("KV bytes in use", fmt_bytes(pool.filled_tokens * per_token),
                help=f"{pool.filled_tokens} tokens × {per_token:,} bytes")
    c[2].metric("Reserved by blocks", fmt_bytes(pool.allocated_tokens * per_token),
                help=f"{pool.used_blocks} blocks × {pool.block_size} slots × {per_token:,} bytes")
    c[3].metric("Whole pool", fmt_bytes(pool.num_blocks * pool.block_size * per_token),
                help=f"{pool.num_blocks} blocks allocated up front as one tensor")
    if fullest := fullest_before(record, history, lambda pool: pool.filled_tokens):
        full = fullest.pool
        st.info(f"Every request has finished and its blocks went back to the pool, so the cache holds nothing now. "
                f"It held most at step {fullest.step}: {full.filled_tokens:,} tokens, "
                f"{fmt_bytes(full.filled_tokens * per_token)}; drag the timeline there, or read the chart below.",
                icon=":material/history:")
    left, right = st.columns([1.4, 1])
    with left:
        show_figure(kv_growth(history, per_token, session.request_order), key="kv-growth", height=380,
                    export_width=900)
    with right:
        show_figure(bytes_vs_tokens(history, per_token), key="kv-bytes-tokens", height=380, export_width=700)
    cache_token_strip(session, record, "kv")
    with st.expander("Requests at this step"):
        request_state_table(record, per_token)


def variants_section(cfg: ModelConfig) -> None:
    st.subheader("MHA vs GQA vs MQA vs MLA, and long contexts")
    d_c, d_r = mla_latent_dims(cfg)
    st.markdown(f"Same model, same {cfg.num_heads} query heads: only what the cache keeps changes, K and V for "
                f"every KV head or (MLA) one latent of {d_c} numbers plus a {d_r}-number rotary key shared by all "
                "heads, at DeepSeek-V3's proportions. The actual model uses GQA.")
    left, right = st.columns(2)
    with left:
        show_figure(head_variants(cfg), key="kv-variants", height=400, export_width=800)
    with right:
        # One above the other: side by side, at 1280 pixels the four dtypes took two lines.
        batch = st.select_slider("Batch (concurrent sequences)", [1, 8, 32, 128], value=8, key="kv-batch")
        dtype = st.radio("KV dtype", ["fp16", "bf16", "fp32", "fp8"], horizontal=True, key="kv-dtype")
        show_figure(long_context(cfg, CONTEXTS, batch, dtype), key="kv-long", height=360, export_width=800)
    rows = []
    for v in attention_variants(cfg):
        for ctx in CONTEXTS:
            rows.append({"variant": v.name, "cached per token and layer": v.short, "context": f"{ctx // 1024}k",
                         **{f"batch {bsz}": fmt_bytes(variant_bytes_per_token(cfg, v, DTYPE_BYTES[dtype]) * ctx * bsz)
                            for bsz in (1, 8, 32, 128)}})
    with st.expander(f"Sizing table at {dtype}"):
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption(f"{cfg.name} itself was trained for {cfg.max_position_embeddings:,} tokens; the 32k and 128k "
               "contexts (chart and table) are the arithmetic for a model of this shape, which is how you size a "
               "real deployment.")


def timing_section(page: str) -> None:
    st.subheader("Decoding with vs without the cache, timed on the model")
    st.markdown("**Without** a cache, every new token means running the whole sequence so far through the "
                "model again (a fresh prefill). **With** the cache, each step computes one token and reads the "
                "rest. Both run here, on the real engine, stepped alternately so background load hits both.")
    cache = page_cache(page)
    c = st.columns([1, 1, 1.2])
    n = c[0].select_slider("Tokens to generate", [8, 16, 32, 48, 64], value=48, key="kv-timing-n")
    which = c[1].radio("Prompt", ["short (~40 tokens)", "long (~180 tokens)"], key="kv-timing-prompt",
                       help="Short: the context doubles while decoding, so the recompute cost visibly grows. "
                            "Long: every recompute is expensive from the start.")
    prompt = LONG_PROMPT if which.startswith("long") else SHORT_PROMPT
    if c[2].button("Measure both ways", icon=":material/timer:", key="kv-timing-run", type="primary"):
        bar = st.progress(0.0, text="Decoding with and without the cache…")
        cache["timing"] = measure_cache_vs_recompute(
            shared_weights(), server_engine_settings(), [{"role": "user", "content": prompt}], int(n),
            on_progress=lambda f: bar.progress(f, text=f"Decoding with and without the cache… {f:.0%}"))
        bar.empty()
    t = cache.get("timing")
    if t is None:
        st.caption("Press **Measure both ways** (about 10–20 s on an idle CPU: both decoders run on the model).")
        return
    tot_with, tot_without = sum(t.with_cache_ms), sum(t.without_cache_ms)
    m = st.columns(4)
    m[0].metric("With cache, total", f"{tot_with / 1e3:.2f} s")
    m[1].metric("Without cache, total", f"{tot_without / 1e3:.2f} s")
    m[2].metric("Speed-up from the cache", f"{tot_without / tot_with:.1f}×" if tot_with else "–")
    m[3].metric("Same tokens both ways", "yes" if t.same_tokens else "NO",
                help="Greedy decoding: the cache must not change the output")
    show_figure(cache_timing(t), key="kv-timing", height=400)
    st.caption(f"Prompt {t.prompt_len} tokens. Token 1 is the prompt's prefill in both runs. "
               f"Generated text: “{t.text.strip()[:160]}”")
