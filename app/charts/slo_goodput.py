"""Charts of the latency-SLO page: SLO attainment against request rate with each configuration's goodput,
latency percentiles and throughput against rate, and one run up close (every request's TTFT against its
TPOT, and a timeline of waiting, prefill and decoding next to the batch the engine ran)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.serving_load import SLO, LoadRun, SweepResult

from app.analysis.slo_goodput import latency_texts
from app.charts.axes import nice_at_least
from app.charts.colors import tint
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

CONFIG_COLORS = ("#0072B2", TECHNIQUE_COLOR, BASELINE_COLOR, "#E69F00")
MET_COLOR = TECHNIQUE_COLOR
MISSED_COLOR = ACCENT
WAIT_COLOR = "#C9CED6"
PREFILL_COLOR = "#E69F00"
DECODE_COLOR = "#0072B2"


def config_color(i: int) -> str:
    return CONFIG_COLORS[i % len(CONFIG_COLORS)]


def _rate_axis(rates: tuple[float, ...]) -> dict:
    """Log when the rates span more than 4x (they usually double), with a tick at every tested rate."""
    axis = dict(title="request rate (requests per second)", tickmode="array", tickvals=list(rates),
                ticktext=[f"{r:g}" for r in rates])
    if len(rates) > 1 and max(rates) / min(rates) > 4:
        axis.update(type="log")
    return axis


def attainment_figure(result: SweepResult, slo: SLO) -> go.Figure:
    """Share of requests meeting both targets, per configuration, against the rate; the star is goodput."""
    fig = go.Figure()
    for i, c in enumerate(result.configs):
        curve = result.curve(c.label, slo)
        fig.add_trace(go.Scatter(
            x=[r for r, _ in curve], y=[100 * a for _, a in curve], mode="lines+markers", name=c.label,
            line=dict(color=config_color(i), width=3), marker=dict(size=9),
            hovertemplate=f"<b>{c.label}</b><br>%{{x:g}} req/s: %{{y:.0f}} % met the SLO<extra></extra>"))
        good = result.goodput(c.label, slo)
        if good is not None:
            share = dict(curve)[good]
            fig.add_trace(go.Scatter(
                x=[good], y=[100 * share], mode="markers", showlegend=False,
                # Each later star smaller, so configurations tied at one point all show (the last one covered
                # the first).
                marker=dict(symbol="star", size=max(10, 24 - 5 * i), color=config_color(i),
                            line=dict(width=1.5, color="white")),
                hovertemplate=f"<b>{c.label}</b>: goodput {good:g} req/s<br>the highest rate at the goal, "
                              "every lower rate at it too<extra></extra>"))
    fig.add_hline(y=100 * slo.goal, line=dict(color=MUTED, dash="dash", width=1.5))
    # Named in the right margin: inside the plot its label sat under the markers at the highest rate, where the
    # curves usually cross the goal.
    fig.add_annotation(x=1, xref="paper", xanchor="left", xshift=6, y=100 * slo.goal, yref="y", showarrow=False,
                       text=f"goal<br>{slo.goal:.0%}", align="left", font=dict(color=MUTED))
    # At 1024 pixels with the sidebar open the subtitle ran past the chart's edge: goodput's definition moved to
    # the caption under the chart (slo_goodput section) and the star's hover.
    fig.update_layout(
        title=dict(text="SLO attainment against load", subtitle=dict(
            text=f"Requests with TTFT ≤ {slo.ttft_s:g} s and TPOT ≤ {1000 * slo.tpot_s:g} ms · "
                 "★ each configuration's goodput")),
        xaxis=_rate_axis(result.rates), yaxis=dict(title="requests meeting the SLO (%)", range=[-3, 105]),
        margin=dict(r=70))
    return fig


def latency_figure(result: SweepResult, slo: SLO) -> go.Figure:
    """TTFT and TPOT at the goal's percentile, and output throughput, against the rate."""
    q = slo.goal * 100
    # "output tokens/s": at 1024 pixels with the sidebar open "output tokens per second" was wider than its panel
    # and ran into the top tick label of the panel's y axis.
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=(
        f"TTFT p{q:g} (s)", f"TPOT p{q:g} (ms)", "output tokens/s"))
    for i, c in enumerate(result.configs):
        runs = [result.run(c.label, r) for r in result.rates]
        for col, ys in ((1, [r.ttft_percentile(q) for r in runs]), (2, [1000 * r.tpot_percentile(q) for r in runs]),
                        (3, [r.throughput_tok_s for r in runs])):
            fig.add_trace(go.Scatter(x=list(result.rates), y=ys, mode="lines+markers", name=c.label,
                                     legendgroup=c.label, showlegend=col == 1,
                                     line=dict(color=config_color(i), width=2.5), marker=dict(size=7),
                                     hovertemplate=f"<b>{c.label}</b><br>%{{x:g}} req/s: %{{y:.3g}}<extra></extra>"),
                          row=1, col=col)
    # The targets are named in the subtitle: a "target" label on the line sat on the first rate's marker.
    fig.add_hline(y=slo.ttft_s, row=1, col=1, line=dict(color=MISSED_COLOR, dash="dash", width=1.5))
    fig.add_hline(y=1000 * slo.tpot_s, row=1, col=2, line=dict(color=MISSED_COLOR, dash="dash", width=1.5))
    axis = _rate_axis(result.rates)
    for col in (1, 2, 3):
        fig.update_xaxes(**{**axis, "title": "req/s"}, row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    # The legend goes below: above the plot it would sit on the subplot titles.
    # Shorter: at 1024 pixels with the sidebar open the subtitle ran past the chart's edge.
    fig.update_layout(title=dict(text="Latency and throughput against load", subtitle=dict(
        text="TTFT climbs first (queueing); bigger batches: higher TPOT, more tokens/s · dashed: SLO targets")),
        legend=dict(orientation="h", y=-0.3, yanchor="top", x=0.5, xanchor="center"),
        margin=dict(t=125))  # title, subtitle, then the subplot titles below them
    return fig


def request_scatter_figure(run: LoadRun, slo: SLO) -> go.Figure:
    """Every request of one run: TTFT (x) against TPOT (y); the shaded corner meets both targets."""
    fig = go.Figure()
    ttft = [t.ttft_s for t in run.timings]
    tpot = [1000 * t.tpot_s for t in run.timings]
    x_top = max([slo.ttft_s, *ttft]) * 1.1
    y_top = max([1000 * slo.tpot_s, *tpot]) * 1.1
    fig.add_shape(type="rect", x0=0, y0=0, x1=slo.ttft_s, y1=1000 * slo.tpot_s, line=dict(width=0),
                  fillcolor=tint(MET_COLOR, 0.15), layer="below")
    for met, name, color in ((True, "met the SLO", MET_COLOR), (False, "missed", MISSED_COLOR)):
        ts = [t for t in run.timings if t.meets(slo) == met]
        fig.add_trace(go.Scatter(
            x=[t.ttft_s for t in ts], y=[1000 * t.tpot_s for t in ts], mode="markers", name=f"{name} ({len(ts)})",
            marker=dict(size=11, color=color, symbol="circle" if met else "x", line=dict(width=1, color="white")),
            customdata=[[t.request_id, t.prompt_len, t.output_tokens, t.queue_s, *latency_texts(t, slo)] for t in ts],
            hovertemplate=("<b>%{customdata[0]}</b>: %{customdata[1]}-token prompt, %{customdata[2]} tokens<br>"
                           "waited %{customdata[3]:.2f} s · TTFT %{customdata[4]} s · TPOT %{customdata[5]} ms"
                           "<extra></extra>")))
    fig.update_layout(
        title=dict(text="Each request against the targets", subtitle=dict(
            text=f"{run.config.label} at {run.rate:g} req/s; shaded: both within target")),
        xaxis=dict(title="TTFT (s, from arrival)", range=[0, x_top]),
        yaxis=dict(title="TPOT (ms per token after the first)", range=[0, y_top]))
    return fig


def timeline_figure(run: LoadRun, slo: SLO) -> go.Figure:
    """One bar per request on engine time: waiting, prefill until the first token, decoding; below it, how many
    sequences and prompt tokens each step carried."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.06,
                        specs=[[{}], [{"secondary_y": True}]])
    timings = sorted(run.timings, key=lambda t: t.arrival_s)
    ids = [t.request_id for t in timings]
    phases = (("waiting", WAIT_COLOR, lambda t: (t.arrival_s, t.admitted_s)),
              ("prefill → first token", PREFILL_COLOR, lambda t: (t.admitted_s, t.first_token_s)),
              ("decoding", DECODE_COLOR, lambda t: (t.first_token_s, t.finish_s)))
    for name, color, span in phases:
        spans = [span(t) for t in timings]
        fig.add_trace(go.Bar(
            y=ids, x=[b - a for a, b in spans], base=[a for a, _ in spans], orientation="h", name=name,
            marker=dict(color=color, line=dict(width=0)),
            customdata=[[a, b, *latency_texts(t, slo)] for (a, b), t in zip(spans, timings)],
            hovertemplate=(f"<b>%{{y}}</b> {name}: %{{customdata[0]:.2f}}–%{{customdata[1]:.2f}} s"
                           "<br>TTFT %{customdata[2]} s · TPOT %{customdata[3]} ms<extra></extra>")),
            row=1, col=1)
    missed = [t for t in timings if not t.meets(slo)]
    fig.add_trace(go.Scatter(x=[t.finish_s for t in missed], y=[t.request_id for t in missed], mode="markers",
                             name="missed the SLO", marker=dict(symbol="x", size=10, color=MISSED_COLOR),
                             hovertemplate="<b>%{y}</b> missed the SLO<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[t.arrival_s for t in timings], y=ids, mode="markers", name="arrival",
                             marker=dict(symbol="triangle-right", size=9, color=MUTED),
                             hovertemplate="<b>%{y}</b> arrives at %{x:.2f} s<extra></extra>"), row=1, col=1)
    xs = [s.start_s for s in run.steps]
    # The line on the overlaying (secondary) axis, which Plotly draws above the primary one's bars: the other
    # way round the prompt bars covered it (one sequence, then two, read as nothing running). The axes swap
    # sides so that sequences still read on the left.
    fig.add_trace(go.Scatter(x=xs, y=[s.num_seqs for s in run.steps], mode="lines", line_shape="hv",
                             name="sequences in the step", line=dict(color=DECODE_COLOR, width=2),
                             hovertemplate="%{x:.2f} s: %{y} sequences<extra></extra>"), row=2, col=1, secondary_y=True)
    fig.add_trace(go.Bar(x=xs, y=[s.prefill_tokens for s in run.steps], width=[s.seconds for s in run.steps],
                         name="prompt tokens in the step", marker=dict(color=tint(PREFILL_COLOR, 0.6), line=dict(width=0)),
                         offset=0, hovertemplate="%{x:.2f} s: %{y} prompt tokens<extra></extra>"), row=2, col=1)
    fig.update_layout(
        barmode="overlay", bargap=0.25,
        title=dict(text="The run on engine time", subtitle=dict(
            text=f"{run.config.label} at {run.rate:g} req/s · batch cap {run.config.max_num_seqs}, "
                 f"token budget {run.config.max_num_batched_tokens}")))
    fig.update_yaxes(autorange="reversed", title="request", row=1, col=1, tickfont=dict(size=11))
    # Whole numbers at a set step: as the overlaying axis Plotly lined its ticks up with the prompt tokens'
    # (0, 0.96, 1.92 sequences).
    most = max((s.num_seqs for s in run.steps), default=1)
    fig.update_yaxes(title="sequences", rangemode="tozero", tickmode="linear", tick0=0,
                     dtick=1 if most <= 3 else nice_at_least(most / 3), side="left", row=2, col=1, secondary_y=True)
    fig.update_yaxes(title="prompt tokens", rangemode="tozero", showgrid=False, nticks=3, side="right", row=2, col=1,
                     secondary_y=False)
    fig.update_xaxes(title="engine time (s)", row=2, col=1)
    return fig
