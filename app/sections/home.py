"""The home page: what InferScope is, what is live on this server, and a link to every topic."""
from __future__ import annotations

import streamlit as st

from app.analysis.kv_math import kv_bytes_per_token, weights_bytes
from app.formatting import fmt_bytes
from app.registry import pages_by_section
from app.runtime import backend_summary, device, dtype_name, shared_weights, weights_mode


def render_home() -> None:
    st.title("InferScope")
    st.markdown(
        "#### Watch a real LLM inference engine work, one iteration at a time\n"
        "Every page drives **our own paged-KV inference engine** running a real model. Each press of "
        "**Step** runs one real scheduler + forward-pass iteration and records a *StepRecord*: the batch, "
        "the tokens, the block tables, the KV pool, per-kernel timings. The charts draw those records, so "
        "the **timeline scrubber** can show any earlier step again without re-running anything.")

    weights = shared_weights()
    cfg = weights.config
    elem = 4 if dtype_name() == "float32" else 2
    with st.container(border=True):
        st.markdown("##### :material/sensors: Live on this server")
        c = st.columns([1.6, 1, 1, 1])
        model = cfg.name if weights_mode() == "real" else f"random weights ({cfg.name} shape)"
        c[0].metric("Model", model, help=weights.source)
        c[1].metric("Device", device().upper())
        c[2].metric("Weights", fmt_bytes(weights_bytes(cfg, elem)), help=f"{dtype_name()} parameters")
        c[3].metric("KV cache per token", fmt_bytes(kv_bytes_per_token(cfg, elem)),
                    help="2 × layers × KV heads × head dim × bytes")
        st.markdown(f":material/bolt: **Kernels:** {backend_summary()}  \n"
                    f":material/info: {cfg.num_layers} layers, {cfg.num_heads} query heads, {cfg.num_kv_heads} KV "
                    f"heads (GQA), head dim {cfg.head_dim}, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size:,}. "
                    f"Weights: {weights.source}.")
        if device() == "cpu":
            st.info("This server has no GPU, so the engine runs the **torch reference path on the CPU** in fp32: "
                    "the same scheduler, block manager and model code as on a GPU, with plain torch kernels. "
                    "A decode step takes about 50–150 ms and prefilling a few hundred prompt tokens up to a "
                    "second, so the ready-made scenarios are small.", icon=":material/computer:")

    st.markdown("### Topics")
    for section, specs in pages_by_section(include_planned=True).items():
        st.markdown(f"**{section}**")
        for spec in specs:
            if spec.available:
                st.page_link(str(spec.file), label=f"{spec.title}: {spec.summary}", icon=spec.icon)
            else:
                st.markdown(f"<span style='color:#9CA3AF'>{spec.title} (coming): {spec.summary}</span>",
                            unsafe_allow_html=True)

    with st.expander(":material/help: How every page works", expanded=True):
        st.markdown(
            "- **Step** runs one engine iteration; **Play** keeps stepping (choose the speed), **Pause** stops, "
            "**Reset** starts a fresh engine on the same scenario, **Run to end** finishes every request.\n"
            "- The **timeline** slider redraws any recorded step from its record.\n"
            "- **Scenario and requests** holds ready-made scenarios, an editable request table, engine knobs, "
            "and JSON upload/download; **Add a request now** injects a request into the running engine.\n"
            "- **Kernel timings** show where the selected step's time went.\n"
            "- Every chart's camera icon downloads a PNG at 3× resolution; **Presentation mode** (sidebar) "
            "enlarges everything for a projector.\n"
            "- Each browser tab has its own engines: two students never see each other's requests.")
