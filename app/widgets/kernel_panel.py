"""The live kernel-timing panel for the selected step: a table and a bar chart."""
from __future__ import annotations

import streamlit as st

from engine.trace import StepRecord

from app.charts.kernels import kernel_bar, kernel_table
from app.theme import show_figure


def kernel_timing_panel(record: StepRecord | None, page: str, expanded: bool = False) -> None:
    with st.expander(":material/timer: Kernel timings for the selected step", expanded=expanded):
        if record is None or not record.kernels:
            st.caption("No kernels ran yet: step the engine first.")
            return
        total_ms = sum(k.seconds for k in record.kernels) * 1e3
        st.caption(f"Step {record.step} on **{record.backend}**: {record.num_batched_tokens} tokens, "
                   f"wall {record.wall_seconds * 1e3:.0f} ms, forward {record.forward_seconds * 1e3:.0f} ms, "
                   f"timed kernels {total_ms:.0f} ms. FLOP and byte counts are per call from the shapes; "
                   "GFLOP/s and GB/s are those counts over the measured time.")
        left, right = st.columns([1.1, 1])
        with left:
            show_figure(kernel_bar(record.kernels, record.step), key=f"{page}-kernels", height=360,
                        export_width=800)
        with right:
            st.dataframe(
                kernel_table(record.kernels), hide_index=True, height=360,
                column_config={
                    "kernel": st.column_config.TextColumn("kernel", width="medium"),
                    "backend": st.column_config.TextColumn("backend", width="small"),
                    "calls": st.column_config.NumberColumn("calls", width="small"),
                    "ms": st.column_config.NumberColumn("ms", format="%.2f", width="small"),
                    "GFLOP/s": st.column_config.NumberColumn("GFLOP/s", format="%.1f", width="small"),
                    "GB/s": st.column_config.NumberColumn("GB/s", format="%.2f", width="small"),
                    "% of kernels": st.column_config.ProgressColumn("share", format="%.0f%%", width="small",
                                                                    min_value=0, max_value=100),
                },
            )
