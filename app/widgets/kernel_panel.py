"""The live kernel-timing panel for the selected step: a table and a bar chart."""
from __future__ import annotations

import streamlit as st

from engine.trace import StepRecord

from app.charts.kernels import kernel_bar, kernel_table
from app.formatting import NO_VALUE, fmt_duration, plural
from app.theme import show_figure


def kernel_timing_panel(record: StepRecord | None, page: str, expanded: bool = False,
                        title: str = "Kernel timings for the selected step") -> None:
    with st.expander(f":material/timer: {title}", expanded=expanded):
        if record is None or not record.kernels:
            st.caption("No kernels ran yet: step the engine first.")
            return
        total = sum(k.seconds for k in record.kernels)
        st.caption(f"Step {record.step} on **{record.backend}**: {plural(record.num_batched_tokens, 'token')}, "
                   f"wall {fmt_duration(record.wall_seconds)}, forward {fmt_duration(record.forward_seconds)}, "
                   f"timed kernels {fmt_duration(total)}. FLOP and byte counts are per call from the shapes; "
                   "GFLOP/s and GB/s are those counts over the measured time.")
        # Stacked, each full width: side by side in half a page the table's last columns were cut off.
        show_figure(kernel_bar(record.kernels, record.step), key=f"{page}-kernels", height=360)
        # A kernel with no FLOPs (embedding, a copy) has no FLOP rate: the placeholder prints "–" there, and the
        # rates stay numbers, so the columns sort by value.
        st.dataframe(
            kernel_table(record.kernels), hide_index=True, width="stretch", placeholder=NO_VALUE,
            column_config={
                "kernel": st.column_config.TextColumn("kernel", width="medium"),
                "backend": st.column_config.TextColumn("backend", width="small"),
                "calls": st.column_config.NumberColumn("calls", width="small"),
                # Three significant figures: a microsecond kernel is not "0.00 ms", an elementwise
                # kernel's 0.04 GFLOP/s is not "0.0".
                "ms": st.column_config.NumberColumn("ms", format="%.3g", width="small"),
                "GFLOP/s": st.column_config.NumberColumn("GFLOP/s", format="%.3g", width="small"),
                "GB/s": st.column_config.NumberColumn("GB/s", format="%.3g", width="small"),
                "% of kernels": st.column_config.ProgressColumn("share", format="%.0f%%", width="small",
                                                                min_value=0, max_value=100),
            },
        )
