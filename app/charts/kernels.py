"""Where one step's time went: per-kernel milliseconds, achieved GFLOP/s and GB/s."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.trace import KernelTiming

from app.formatting import fmt_duration

BACKEND_COLORS = {"torch": "#0072B2", "triton": "#D55E00", "cuda-graph": "#009E73"}


def kernel_table(kernels: tuple[KernelTiming, ...] | list[KernelTiming]) -> pd.DataFrame:
    rows = []
    for k in kernels:
        s = k.seconds
        rows.append({
            "kernel": k.name, "backend": k.backend, "calls": k.calls, "ms": s * 1e3,
            "GFLOP/s": k.flops / s / 1e9 if s > 0 and k.flops else None,
            "GB/s": k.bytes / s / 1e9 if s > 0 and k.bytes else None,
        })
    df = pd.DataFrame(rows, columns=["kernel", "backend", "calls", "ms", "GFLOP/s", "GB/s"])
    if not df.empty:
        total = df["ms"].sum()
        df["% of kernels"] = 100 * df["ms"] / total if total > 0 else 0.0
        df = df.sort_values("ms", ascending=False, ignore_index=True)
    return df


def kernel_bar(kernels: tuple[KernelTiming, ...] | list[KernelTiming], step: int) -> go.Figure:
    df = kernel_table(kernels).sort_values("ms")
    fig = go.Figure()
    for backend, part in df.groupby("backend", sort=False):
        fig.add_bar(
            y=part["kernel"], x=part["ms"], orientation="h", name=f"{backend}",
            marker_color=BACKEND_COLORS.get(str(backend), "#6B7280"),
            text=[f"{fmt_duration(ms / 1e3)} · {c}×" for ms, c in zip(part["ms"], part["calls"])], textposition="outside",
            customdata=part[["calls", "GFLOP/s", "GB/s"]].fillna(0).to_numpy(),
            hovertemplate="<b>%{y}</b><br>%{x:.2f} ms in %{customdata[0]} calls<br>"
                          "%{customdata[1]:.3g} GFLOP/s · %{customdata[2]:.3g} GB/s<extra>%{fullData.name}</extra>",
        )
    fig.update_layout(title=f"Kernel time in step {step}", xaxis_title="milliseconds (summed over calls)",
                      barmode="stack", legend_title_text="backend")
    fig.update_xaxes(range=[0, (df["ms"].max() if not df.empty else 1) * 1.3])
    return fig
