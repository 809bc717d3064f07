"""The roofline page's last section: what decoding in parallel (a diffusion LLM) does to the roofline, with the
ceilings, weight precision and context the calculator above it was set to."""
from __future__ import annotations

import streamlit as st

from app.analysis.parallel_decoding import (BLOCKS, MEASURE_REPEATS, TOKENS_PER_PASS, compute_bound_block, estimate,
                                            measure_passes, measured_speedup)
from app.analysis.pass_timing import timing_note
from app.charts.parallel_decoding import parallel_decoding_chart
from app.formatting import fmt_duration
from app.sections.roofline import CalculatorChoice
from app.session import EngineSession
from app.state import page_cache
from app.theme import show_figure


def parallel_decoding_section(session: EngineSession, choice: CalculatorChoice, page: str) -> None:
    cfg = session.weights.config
    st.subheader("Decoding in parallel: what a diffusion LLM does to the roofline")
    st.markdown(
        "Autoregressive decoding of one sequence reads every weight for **one** row: far left on the roofline. A "
        "diffusion LLM (Inception's Mercury, LLaDA) starts a block of **K** positions as noise and refines all of "
        "them in each of **T** passes, keeping K / T tokens per pass on average. A pass over K rows is a small "
        "prefill: while it is memory-bound it costs about one decode step, so K / T tokens per pass are nearly "
        "K / T times the speed. Past the ridge every extra row costs time and the gain fades. "
        f"The ceilings, precision and context ({choice.context:,} cached tokens) are the calculator's above.")
    k = st.columns(2)
    block = k[0].select_slider("Block length K", BLOCKS, value=64, key=f"{page}-par-block")
    per_pass = k[1].select_slider("Tokens kept per pass (K / T)", TOKENS_PER_PASS, value=4,
                                  key=f"{page}-par-per-pass")
    e = estimate(cfg, choice.ceilings, block, per_pass, choice.context, choice.elem)
    cache = page_cache(page)
    if st.button("Time passes over 1 to 128 rows on this server's model", icon=":material/timer:",
                 key=f"{page}-par-measure"):
        if session.engine is None:
            st.error("No engine: fix the settings above first.")
        else:
            try:
                with st.spinner("Timing forward passes over 1 to 128 rows…"):
                    cache["parallel-passes"] = measure_passes(session.engine, choice.context)
            except (RuntimeError, ValueError) as err:  # e.g. out of memory: say so, keep the last timings
                st.error(f"The timing failed: {err}")
    measured = cache.get("parallel-passes")
    seen = measured_speedup(measured, block, per_pass) if measured else None
    m = st.columns(4)
    m[0].metric("Passes per block T", f"{e.passes}", help=f"K / (tokens per pass) = {block} / {per_pass}")
    m[1].metric("Predicted pass time", fmt_duration(e.pass_seconds), delta=e.pass_bound, delta_color="off",
                delta_arrow="up" if e.pass_bound == "compute-bound" else "down",
                help=f"max(FLOPs/π, bytes/β) for {block} rows over {choice.context:,} cached tokens")
    m[2].metric("Predicted tokens/s", f"{e.tokens_per_s:,.0f}", help="tokens per pass ÷ the pass time")
    m[3].metric("Speedup", f"{e.speedup:.3g}×", delta=None if seen is None else f"measured: {seen:.2g}×",
                delta_color="off", delta_arrow="off",
                help=f"over autoregressive decoding of one sequence, one token per step: "
                     f"{e.autoregressive_tokens_per_s:,.0f} tokens/s")
    show_figure(parallel_decoding_chart(cfg, choice.elem, choice.ceilings, choice.context, block, per_pass,
                                        measured), key=f"{page}-parallel", height=560)
    turn = compute_bound_block(cfg, choice.ceilings, choice.context, choice.elem)
    where = choice.ceilings_name
    if turn is None:
        reach = f"With {where}'s ceilings a pass stays memory-bound at any block length shown."
    else:
        reach = (f"With {where}'s ceilings a pass turns compute-bound at {turn:,} rows: below that, rows are "
                 f"nearly free and tokens per pass is the speedup; above it, a pass costs more with every row.")
    if measured:
        one, most = measured[0], measured[-1]
        how = timing_note(one.timing)
        timed = (f" Measured here ({one.context:,}-token context, the median of {MEASURE_REPEATS} passes each): one "
                 f"row {fmt_duration(one.seconds)}, {most.rows} rows {fmt_duration(most.seconds)} "
                 f"({most.seconds / one.seconds:.2g}× the time for {most.rows}× the rows); the black crosses are "
                 f"{per_pass} token{'s' if per_pass > 1 else ''} per pass at those times."
                 + (f" {how}" if how else ""))
    else:
        timed = (" The premise can be measured on this server's model: the button times real forward passes over 1 "
                 "to 128 rows (the tree speculation pages' verification pass).")
    st.caption(reach + timed + " The lines are arithmetic, not a run: SmolLM2 is autoregressive and cannot denoise a "
               "block, and how many tokens per pass keep the text good is the diffusion model's own business.")
