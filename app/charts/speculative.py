"""Speculative decoding charts: one verification round (drafts, p, q, what the target emits, the KV slots
kept and rolled back, and the rule that decided: min(1, p/q) with u when sampled, the argmax match when
greedy), acceptance and tokens per pass over steps, draft vs verify time, the closed form with the
measured point, the CPU benchmark and the drafter comparison."""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.analysis.speculative import (DRAFTER_LABELS, DrafterRun, RoundView, SpecPoint, expected_tokens_per_pass,
                                      predicted_speedup, speedup_vs_plain)
from app.charts.axes import step_range, step_ticks
from app.charts.colors import rgb_channels
from app.theme import MUTED

ACCEPTED = "#009E73"
REJECTED = "#D62728"
UNVERIFIED = "#B8BEC8"
BONUS = "#0072B2"
RESAMPLED = "#E69F00"
KEPT = "#56B4E9"
ROLLED = "#F3D0D0"
DRAFT_T = "#CC79A7"
VERIFY_T = "#0072B2"
VERDICT_COLORS = {"accepted": ACCEPTED, "rejected": REJECTED, "unverified": UNVERIFIED}
RUN_COLORS = {"plain": "#6B7280", "ngram": "#009E73", "early_exit": "#CC79A7", "draft_model": "#56B4E9"}
MONO = "'JetBrains Mono', Menlo, Consolas, monospace"


def _fill(color: str, alpha: float) -> str:
    r, g, b = rgb_channels(color)
    return f"rgba({r},{g},{b},{alpha})"


def _short(text: str) -> str:
    """A token's text cut to fit a chip, escaped for Plotly's HTML-ish labels."""
    return (text if len(text) <= 12 else text[:11] + "…").replace("<", "&lt;")


def _chip(fig: go.Figure, x: float, y0: float, y1: float, text: str, color: str, *, dash: str | None = None,
          strong: bool = False, hatch: bool = False) -> None:
    fig.add_shape(type="rect", x0=x - 0.44, x1=x + 0.44, y0=y0, y1=y1, row=1, col=1,
                  line=dict(color=color, width=3 if strong else 1.5, dash=dash),
                  fillcolor=_fill(color, 0.10 if hatch else 0.22))
    if hatch:
        fig.add_shape(type="line", x0=x - 0.44, x1=x + 0.44, y0=y0, y1=y1, row=1, col=1,
                      line=dict(color=color, width=1.5))
    fig.add_annotation(x=x, y=(y0 + y1) / 2, text=_short(text) or "∅", showarrow=False, row=1, col=1,
                       font=dict(family=MONO, size=14, color="#111827"))


def _sampled_rule_panel(fig: go.Figure, r: RoundView) -> None:
    """Row 2 of a sampled round: min(1, p/q), the chance the rule keeps each draft, with the draw u."""
    g, ratios = r.g, r.ratios
    fig.add_bar(x=list(range(g)), y=ratios, marker_color=[VERDICT_COLORS[v] for v in r["verdicts"]], width=0.6,
                row=2, col=1, showlegend=False, customdata=list(zip(r["p"], r["q"])),
                hovertemplate="min(1, p/q) = %{y:.3f} (p %{customdata[0]:.3f}, q %{customdata[1]:.3f})"
                              "<extra></extra>")
    us = r["uniforms"] or [None] * g
    xs = [i for i in range(g) if us[i] is not None]
    if xs:
        fig.add_scatter(x=xs, y=[us[i] for i in xs], mode="markers", name="u ~ U[0, 1) (keep iff u < p/q)",
                        marker=dict(symbol="line-ew", size=34, line=dict(width=4, color="#111827")), row=2, col=1,
                        hovertemplate="u = %{y:.3f}<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color=MUTED, dash="dash", width=1), row=2, col=1)
    fig.update_yaxes(row=2, col=1, range=[0, 1.3], title_text="min(1, p/q)", tickvals=[0, 0.5, 1], fixedrange=True)


def _greedy_rule_panel(fig: go.Figure, r: RoundView) -> None:
    """Row 2 of a greedy round. The rule draws nothing: a draft is kept iff it is the target's argmax, so
    the panel marks that match (✓ / ✗) on a bar of the target's p(draft), which is there for scale only;
    a bar of min(1, p/q) here would read as a keep probability the rule never used."""
    g = r.g
    match = r.argmax_match
    # No bar after the rejection: those rows were conditioned on a token the target did not keep.
    p = [v if m is not None else 0.0 for v, m in zip(r["p"], match)]
    wanted = r["target_argmax_texts"]
    fig.add_bar(x=list(range(g)), y=p, marker_color=[VERDICT_COLORS[v] for v in r["verdicts"]], width=0.6,
                row=2, col=1, showlegend=False,
                customdata=[[r["draft_texts"][i].replace("<", "&lt;"), wanted[i].replace("<", "&lt;"),
                             "not checked" if match[i] is None else "= argmax: kept" if match[i]
                             else "≠ argmax: rejected"] for i in range(g)],
                hovertemplate="target p(%{customdata[0]}) = %{y:.3f} (T = 1)<br>target's argmax here: "
                              "%{customdata[1]} · %{customdata[2]}<extra></extra>")
    for i in range(g):
        top = p[i]
        if match[i] is None:
            text, color = "not checked", MUTED
        elif match[i]:
            text, color = "✓ argmax", ACCEPTED
        else:  # above the argmax's tick too (final_p >= p[i]: it is the most likely token there)
            text, color, top = f"✗ argmax was {_short(wanted[i])}", REJECTED, max(top, r["final_p"])
        fig.add_annotation(x=i, y=top + 0.1, row=2, col=1, showarrow=False, text=text, font=dict(size=12, color=color))
    i = r.rejected_index
    if i is not None:  # the argmax that replaced the rejected draft: final_p is its probability at that row
        fig.add_scatter(x=[i], y=[r["final_p"]], mode="markers", name="target's argmax (its p)", legendrank=1001,
                        marker=dict(symbol="line-ew", size=34, line=dict(width=4, color=RESAMPLED)), row=2, col=1,
                        customdata=[wanted[i].replace("<", "&lt;")],
                        hovertemplate="argmax %{customdata}: p = %{y:.3f}<extra></extra>")
    fig.update_yaxes(row=2, col=1, range=[0, 1.3], title_text="target p(draft)", tickvals=[0, 0.5, 1],
                     fixedrange=True)


def round_figure(r: RoundView, title: str | None = None) -> go.Figure:
    """Top: the drafts (coloured by verdict), what the target emits below them, and the KV slots the
    verification pass wrote (kept vs rolled back). Bottom, the rule that decided: sampled rounds show
    min(1, p/q) per draft with u marked; greedy rounds whether each draft was the target's argmax."""
    g, n = r.g, int(r["num_accepted"])
    pos = int(r["position"])
    sampled = r.sampled
    # Row 2's own title names the rule (short: subplot titles do not wrap, and must fit a 1280 px window).
    rule = ("sampled rule: keep a draft iff u < p/q (bar: min(1, p/q), the chance it is kept)" if sampled else
            "greedy rule: keep a draft iff it is the target's argmax (no random draw)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.6, 0.4], vertical_spacing=0.09,
                        subplot_titles=["", rule])
    # Row 1, band 3 (y 2.15-2.95): the drafter's proposal.
    for i in range(g):
        v = r["verdicts"][i]
        _chip(fig, i, 2.15, 2.95, r["draft_texts"][i], VERDICT_COLORS[v], dash="dot" if v == "unverified" else None,
              strong=v == "rejected")
        fig.add_annotation(x=i, y=2.04, text=f"q {r['q'][i]:.2f} · p {r['p'][i]:.2f}", showarrow=False, row=1,
                           col=1, font=dict(size=12, color="#374151"))
    # Band 2 (y 1.1-1.9): what the target emits this round.
    for i in range(n):
        _chip(fig, i, 1.1, 1.9, r["draft_texts"][i], ACCEPTED)
    kind = r["final_kind"]
    fx = n if kind == "resampled" else g
    _chip(fig, fx, 1.1, 1.9, r["final_text"], BONUS if kind == "bonus" else RESAMPLED, strong=True)
    how = ("bonus (all accepted)" if kind == "bonus"
           else "resampled from max(0, p−q)" if sampled else "target's argmax")
    fig.add_annotation(x=fx, y=1.0, text=f"<b>{how}</b> · p {r['final_p']:.2f}", showarrow=False, row=1, col=1,
                       font=dict(size=12, color=BONUS if kind == "bonus" else "#9A5B00"))
    emitted = r.emitted
    if emitted < n + 1:  # a stop condition ended the request inside the round
        fig.add_annotation(x=emitted - 0.5, y=1.5, text="stop", showarrow=False, row=1, col=1,
                           font=dict(color=REJECTED))
    # Band 1 (y 0.1-0.6): KV slots written by the verification pass: the last token's + one per draft.
    for j in range(-1, g):
        kept = j < n
        fig.add_shape(type="rect", x0=j - 0.44, x1=j + 0.44, y0=0.12, y1=0.62, row=1, col=1,
                      line=dict(color=KEPT if kept else REJECTED, width=1.5, dash=None if kept else "dot"),
                      fillcolor=_fill(KEPT, 0.35) if kept else _fill(REJECTED, 0.10))
        fig.add_annotation(x=j, y=0.37, text=f"{pos + j}" if kept else f"<s>{pos + j}</s> ✕", showarrow=False,
                           row=1, col=1, font=dict(size=12, color="#0B3B60" if kept else REJECTED))
    last_text = "last token"
    fig.add_annotation(x=-1, y=1.5, text=f"<i>{last_text}</i><br>(input row 0)", showarrow=False, row=1, col=1,
                       font=dict(size=12, color=MUTED))
    # Invisible markers for hover on the proposal chips.
    fig.add_scatter(x=list(range(g)), y=[2.55] * g, mode="markers", marker=dict(size=30, opacity=0), row=1, col=1,
                    showlegend=False,
                    customdata=[[r["draft_texts"][i], r["q"][i], r["p"][i], r["verdicts"][i],
                                 r["target_argmax_texts"][i]] for i in range(g)],
                    hovertemplate="draft %{customdata[0]}: q %{customdata[1]:.3f}, p %{customdata[2]:.3f}<br>"
                                  "%{customdata[3]} · target's argmax here: %{customdata[4]}<extra></extra>")
    fig.update_yaxes(row=1, col=1, range=[0, 3.05], tickvals=[0.37, 1.5, 2.55], showgrid=False, zeroline=False,
                     ticktext=["KV slots written", "target emits", "drafter proposes"], fixedrange=True)
    if sampled:
        _sampled_rule_panel(fig, r)
    else:
        _greedy_rule_panel(fig, r)
    labels = ["last token"] + [f"draft {i + 1}" for i in range(g)] + ["bonus slot"]
    fig.update_xaxes(tickvals=list(range(-1, g + 1)), ticktext=labels, range=[-1.55, g + 0.55], showgrid=False,
                     zeroline=False, row=2, col=1)
    fig.update_xaxes(showgrid=False, zeroline=False, row=1, col=1)
    # Legend swatches for the verdict colours.
    for name, c in (("accepted", ACCEPTED), ("rejected", REJECTED), ("unverified (after the rejection)", UNVERIFIED),
                    ("bonus", BONUS), ("resampled / corrected", RESAMPLED), ("KV slot kept", KEPT)):
        fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12, color=c), name=name,
                        row=1, col=1)
    mode = "sampled: keep draft iff u < p/q" if sampled else "greedy: keep draft iff it is the target's argmax"
    fig.update_layout(title=title or f"{r.request_id}: round at position {pos} ({mode})", bargap=0.3,
                      margin=dict(l=140))
    return fig


def acceptance_figure(series: list[SpecPoint], selected: int | None = None) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steps = [p.step for p in series]
    fig.add_scatter(x=steps, y=[p.alpha for p in series], name="α",
                    mode="lines+markers", line=dict(color=ACCEPTED, width=3), connectgaps=False,
                    hovertemplate="step %{x}: α = %{y:.2f}<extra></extra>")
    fig.add_scatter(x=steps, y=[p.accepted_fraction for p in series], name="accepted / drafted",
                    mode="lines", line=dict(color=ACCEPTED, width=2, dash="dot"),
                    hovertemplate="step %{x}: %{y:.2f} of drafts accepted<extra></extra>")
    fig.add_scatter(x=steps, y=[p.tokens_per_pass for p in series], name="tokens per target pass (right)",
                    mode="lines+markers", line=dict(color=BONUS, width=3), secondary_y=True,
                    hovertemplate="step %{x}: %{y:.2f} tokens per pass<extra></extra>")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    top = math.ceil(max([2.0] + [p.tokens_per_pass or 0 for p in series]) * 1.05)
    fig.update_yaxes(title_text="acceptance (cumulative)", range=[0, 1.05], secondary_y=False)
    fig.update_yaxes(title_text="tokens per pass", range=[0, top], dtick=1, secondary_y=True, showgrid=False)
    fig.update_layout(title="Acceptance and tokens per target pass, so far", xaxis_title="engine step")
    fig.update_xaxes(**step_ticks(len(series)), **step_range((p.step for p in series), selected))
    return fig


def time_split_figure(series: list[SpecPoint], selected: int | None = None) -> go.Figure:
    fig = go.Figure()
    steps = [p.step for p in series]
    fig.add_bar(x=steps, y=[p.draft_seconds * 1e3 for p in series], name="drafting", marker_color=DRAFT_T,
                hovertemplate="step %{x}: drafting %{y:.1f} ms<extra></extra>")
    fig.add_bar(x=steps, y=[p.verify_seconds * 1e3 for p in series], name="verification pass + rule",
                marker_color=VERIFY_T, hovertemplate="step %{x}: verify %{y:.0f} ms<extra></extra>")
    # A step whose drafter found nothing to propose decodes one plain token: shown, or it looked like no work.
    if any(p.plain_seconds for p in series):
        fig.add_bar(x=steps, y=[p.plain_seconds * 1e3 for p in series], name="plain decode (no draft)",
                    marker_color=MUTED, hovertemplate="step %{x}: plain decode %{y:.0f} ms<extra></extra>")
    # A step with no decode at all (only prompts computed) has no bar: named, or it read as a 0 ms step.
    for p in series:
        if not (p.draft_seconds or p.verify_seconds or p.plain_seconds):
            # On a white ground: scrubbed to that step, the selected step's dotted line ran through the words.
            fig.add_annotation(x=p.step, y=0, yanchor="bottom", text="prefill only", textangle=-90,
                               showarrow=False, font=dict(color=MUTED), bgcolor="rgba(255,255,255,0.9)")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    fig.update_layout(title="Draft vs verify time per step", barmode="stack", bargap=0.15, xaxis_title="engine step",
                      yaxis=dict(title="ms", rangemode="nonnegative"))
    fig.update_xaxes(**step_ticks(len(series)), **step_range((p.step for p in series), selected))
    return fig


def _cost_ratio(c: float) -> str:
    """A drafter's cost per draft over a target pass, as a title reads it: prompt lookup's is a few
    microseconds against tens of milliseconds, which `.2g` printed as "9e-05"."""
    return "< 0.001" if 0 < c < 0.001 else f"= {c:.2g}"


def closed_form_figure(alpha: float, gamma: int, c: float, measured_tpp: float | None = None,
                       measured_speedup: float | None = None, max_gamma: int = 10,
                       alpha_source: str = "measured") -> go.Figure:
    """`alpha_source` names where α came from in the legend: "measured", "assumed" (no round yet) or
    "chosen" (the slider moved away from the measured value)."""
    gammas = list(range(0, max_gamma + 1))
    # Room between the panels for the right one's y-axis title: at 0.09 it sat against the left panel's "10".
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=["E[tokens per target pass] vs γ", f"predicted speedup vs γ (c {_cost_ratio(c)})"])
    for a in (0.2, 0.5, 0.8, 0.95):
        if abs(a - alpha) < 0.02:
            continue
        for col, f in ((1, lambda g, a=a: expected_tokens_per_pass(a, g)),
                       (2, lambda g, a=a: predicted_speedup(a, g, c))):
            fig.add_scatter(x=gammas, y=[f(g) for g in gammas], mode="lines", line=dict(color="#C9CED6", width=1.5),
                            name=f"α = {a}", legendgroup=f"ref{a}", showlegend=False, row=1, col=col,
                            hovertemplate=f"α = {a}, γ = %{{x}}: %{{y:.2f}}<extra></extra>")
            # Just above the line's right end, inside the plot: hung off the end, the left panel's labels ran
            # into the right panel's y-axis title in a half-width column.
            fig.add_annotation(x=max_gamma, y=f(max_gamma), text=f"α={a}", showarrow=False, xanchor="right",
                               yanchor="bottom", font=dict(size=11, color=MUTED), row=1, col=col)
    fig.add_scatter(x=gammas, y=[expected_tokens_per_pass(alpha, g) for g in gammas], mode="lines",
                    line=dict(color=BONUS, width=3.5), name=f"closed form at {alpha_source} α = {alpha:.2f}", row=1, col=1,
                    hovertemplate="γ = %{x}: %{y:.2f} tokens per pass<extra></extra>")
    fig.add_scatter(x=gammas, y=[predicted_speedup(alpha, g, c) for g in gammas], mode="lines",
                    line=dict(color=BONUS, width=3.5), showlegend=False, row=1, col=2,
                    hovertemplate="γ = %{x}: speedup %{y:.2f}×<extra></extra>")
    fig.add_scatter(x=[gamma], y=[expected_tokens_per_pass(alpha, gamma)], mode="markers", row=1, col=1,
                    marker=dict(size=13, color="white", line=dict(color=BONUS, width=3)),
                    name=f"predicted at γ = {gamma}", hovertemplate="predicted %{y:.2f}<extra></extra>")
    if measured_tpp is not None:
        fig.add_scatter(x=[gamma], y=[measured_tpp], mode="markers", row=1, col=1, name="measured, this run",
                        marker=dict(size=15, color="#D55E00", symbol="diamond"),
                        hovertemplate="measured %{y:.2f} tokens per pass<extra></extra>")
    fig.add_scatter(x=[gamma], y=[predicted_speedup(alpha, gamma, c)], mode="markers", row=1, col=2,
                    marker=dict(size=13, color="white", line=dict(color=BONUS, width=3)), showlegend=False,
                    hovertemplate="predicted %{y:.2f}×<extra></extra>")
    if measured_speedup is not None:
        fig.add_scatter(x=[gamma], y=[measured_speedup], mode="markers", row=1, col=2, name="measured speedup",
                        marker=dict(size=15, color="#D55E00", symbol="diamond-open", line=dict(width=3)),
                        hovertemplate="measured %{y:.2f}× (drafter comparison)<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color=MUTED, dash="dash", width=1), row=1, col=2,
                  annotation_text="break-even", annotation_position="bottom right")
    fig.update_xaxes(title_text="γ (drafts per round)", dtick=1, range=[-0.3, max_gamma + 0.4])
    fig.update_yaxes(title_text="tokens per pass", rangemode="tozero", row=1, col=1)
    # A short title, the unit on the ticks: "× plain decoding" was squeezed between the two panels.
    fig.update_yaxes(title_text="speedup", ticksuffix="×", rangemode="tozero", row=1, col=2)
    fig.update_layout(margin=dict(t=50, b=110), legend=dict(yanchor="top", y=-0.22, xanchor="left", x=0.0))
    return fig


def bench_figure(bench: dict) -> go.Figure:
    """Measured vs predicted speedup over γ, per workload and drafter."""
    workloads = [w for w in ("copy", "chat", "unseen") if any(r["workload"] == w for r in bench["rows"])]
    fig = make_subplots(rows=1, cols=len(workloads), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"“{w}” workload" for w in workloads])
    for col, w in enumerate(workloads, start=1):
        for d in ("ngram", "early_exit", "draft_model"):
            rows = sorted((r for r in bench["rows"] if r["workload"] == w and r["drafter"] == d),
                          key=lambda r: r["gamma"])
            if not rows:
                continue
            gs = [r["gamma"] for r in rows]
            color = RUN_COLORS[d]
            fig.add_scatter(x=gs, y=[r["speedup"] for r in rows], mode="lines+markers",
                            name=f"{DRAFTER_LABELS[d]}: measured",
                            legendgroup=d + "m", showlegend=col == 1, line=dict(color=color, width=3),
                            marker=dict(size=9), row=1, col=col,
                            customdata=[[r["alpha"], r["tokens_per_pass"]] for r in rows],
                            hovertemplate="γ %{x}: %{y:.2f}× (α %{customdata[0]:.2f}, "
                                          "%{customdata[1]:.2f} tokens/pass)<extra></extra>")
            fig.add_scatter(x=gs, y=[r["predicted_speedup"] for r in rows], mode="lines+markers",
                            name=f"{DRAFTER_LABELS[d]}: closed form", legendgroup=d + "p", showlegend=col == 1,
                            line=dict(color=color, width=2, dash="dash"), marker=dict(size=7, symbol="circle-open"),
                            row=1, col=col, hovertemplate="γ %{x}: predicted %{y:.2f}×<extra></extra>")
        fig.add_hline(y=1.0, line=dict(color=MUTED, dash="dot", width=1), row=1, col=col)
        fig.update_xaxes(title_text="γ", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="speedup vs plain decoding", rangemode="tozero", row=1, col=1)
    fig.update_layout(title="Measured speedup vs the closed form (greedy, batch 1)", margin=dict(t=80, b=110),
                      legend=dict(yanchor="top", y=-0.2, xanchor="left", x=0.0))
    return fig


def compare_figure(runs: dict[str, DrafterRun]) -> go.Figure:
    """A row per drafter, a panel per measure, the drafters named once on the shared y axis: as upright
    columns their names ("distilled draft model, γ = 4") slanted under the next panel's names at 1280 pixels."""
    keys = list(runs)
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=["α (acceptance)", "tokens per target pass", "measured speedup vs plain"])
    names = [runs[k].label for k in keys]
    colors = [RUN_COLORS[k] for k in keys]
    alphas = [runs[k].alpha if k != "plain" else None for k in keys]
    tpp = [runs[k].tokens_per_pass for k in keys]
    sp = [speedup_vs_plain(runs, k) for k in keys]
    for col, xs, fmt in ((1, alphas, "{:.2f}"), (2, tpp, "{:.2f}"), (3, sp, "{:.2f}×")):
        fig.add_bar(y=names, x=[x if x is not None else 0 for x in xs], orientation="h", marker_color=colors,
                    showlegend=False, text=[fmt.format(x) if x is not None else "–" for x in xs],
                    textposition="outside", constraintext="none", cliponaxis=False,
                    row=1, col=col, hovertemplate="%{y}: %{text}<extra></extra>")
    top2 = max([t for t in tpp if t] + [1.0]) * 1.3
    top3 = max([s for s in sp if s] + [1.0]) * 1.3
    fig.update_xaxes(range=[0, 1.3], row=1, col=1)
    fig.update_xaxes(range=[0, top2], row=1, col=2)
    fig.update_xaxes(range=[0, top3], row=1, col=3)
    fig.update_yaxes(autorange="reversed")  # the first drafter (plain decoding) on top
    fig.add_vline(x=1.0, line=dict(color=MUTED, dash="dot", width=1), row=1, col=3)
    fig.update_layout(margin=dict(t=70), bargap=0.35)
    return fig
