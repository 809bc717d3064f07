"""Charts of the test-time compute page: the test-time scaling curve (accuracy vs tokens spent, one
line per selection rule) and each sample's thinking tokens against the budget."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from engine.test_time import RULES, CurvePoint

from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

RULE_COLORS = {RULES[0]: TECHNIQUE_COLOR, RULES[1]: BASELINE_COLOR, RULES[2]: MUTED}
RULE_DASH = {RULES[0]: "solid", RULES[1]: "solid", RULES[2]: "dot"}


def scaling_curve_figure(points: Sequence[CurvePoint], title: str = "Accuracy vs tokens spent",
                         closed_form: dict[int, float] | None = None) -> go.Figure:
    """One line per selection rule; `closed_form` (N -> pass@N = 1 - (1 - p)^N from each question's p) is
    drawn beside the measured oracle line, thin, so the formula and the measurement can be compared."""
    fig = go.Figure()
    for rule in RULES:
        pts = sorted((p for p in points if p.rule == rule), key=lambda p: p.k)
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[p.tokens_per_question for p in pts], y=[100 * p.accuracy for p in pts], name=rule,
            mode="lines+markers", line=dict(color=RULE_COLORS[rule], dash=RULE_DASH[rule], width=3),
            marker=dict(size=9),
            hovertemplate=[f"{rule}<br>N = {p.k}: {100 * p.accuracy:.0f} % right<br>{p.tokens_per_question:.0f} "
                           f"tokens per question<br>{p.groups} groups judged<extra></extra>" for p in pts]))
    ks = sorted({p.k for p in points})
    if closed_form:
        tokens_at = {p.k: p.tokens_per_question for p in points}
        drawn = [k for k in ks if k in closed_form]
        fig.add_trace(go.Scatter(
            x=[tokens_at[k] for k in drawn], y=[100 * closed_form[k] for k in drawn], name="1 − (1 − p)<sup>N</sup>",
            mode="lines", line=dict(color=MUTED, width=1.5, dash="dashdot"),
            hovertemplate=[f"closed form, each question's p<br>N = {k}: {100 * closed_form[k]:.0f} %<extra></extra>"
                           for k in drawn]))
    single = next((p for p in points if p.k == 1), None)
    if single is not None:
        fig.add_hline(y=100 * single.accuracy, line=dict(color=ACCENT, width=1, dash="dash"))
    # One tick per measured N, at its tokens: a log axis's own minor ticks read "2 3 … 9 100" here.
    tokens = {p.k: p.tokens_per_question for p in points}
    fig.update_layout(
        title=dict(text=title, subtitle=dict(text="N = " + ", ".join(map(str, ks)) + " samples per question; "
                                                  "dashed: one sample")),
        xaxis=dict(title="output tokens per question (log scale)", type="log", tickvals=[tokens[k] for k in ks],
                   ticktext=[f"{tokens[k]:.0f}<br>N = {k}" for k in ks], showgrid=False),
        yaxis=dict(title="questions right (%)", range=[0, 105]),
        margin=dict(l=70, r=20, t=80, b=80))
    return fig


def thinking_budget_figure(samples: Sequence[dict[str, Any]], budget: dict[str, Any]) -> go.Figure:
    """Horizontal bars: each sample's thinking tokens, the sampled and forced " Wait," parts, against
    the minimum and maximum budget lines."""
    labels = [s["label"] for s in samples]
    waits = [sum(1 for p, lab in s["forced"] if lab == "wait") for s in samples]
    thinking = [s["thinking_tokens"] for s in samples]
    sampled = [t - w for t, w in zip(thinking, waits)]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=labels, x=sampled, orientation="h", name="sampled thinking tokens",
                         marker_color=TECHNIQUE_COLOR))
    fig.add_trace(go.Bar(y=labels, x=waits, orientation="h", name="forced “Wait,” tokens", marker_color=ACCENT))
    # The budgets are named in the subtitle, not beside their lines: labels over the plot ran into the
    # legend, which sits there in a half-width column at 1280 pixels.
    lo, hi = budget["min_thinking"], budget["max_thinking"]
    for value in (lo, hi):
        fig.add_vline(x=value, line=dict(color=MUTED, width=2, dash="dash"))
    top = max([hi] + thinking) * 1.12 + 1
    fig.update_layout(barmode="stack", title=dict(text="Thinking tokens per sample", subtitle=dict(
                          text=f"dashed: the minimum ({lo}) and maximum ({hi}) budget")),
                      xaxis=dict(title="thinking tokens", range=[0, top]),
                      yaxis=dict(autorange="reversed", type="category"),
                      margin=dict(l=70, r=20, t=90, b=60))
    return fig


def answer_votes_figure(counts: dict[str, int], truth: str | None, finished: dict[str, int] | None = None) -> go.Figure:
    """Self-consistency as a bar per distinct answer; the right one (when known) in the technique colour.
    `finished`: the votes of samples that have ended (default: all of `counts`); the rest of each bar, faded,
    is running samples' answers so far, which may still change."""
    answers = list(counts)
    done = counts if finished is None else finished
    colors = [TECHNIQUE_COLOR if truth is not None and a == truth else MUTED for a in answers]
    fig = go.Figure(go.Bar(x=[f"“{a}”" for a in answers], y=[done.get(a, 0) for a in answers], marker_color=colors,
                           name="finished samples",
                           hovertemplate="answer %{x}: %{y} finished samples<extra></extra>"))
    provisional = [counts[a] - done.get(a, 0) for a in answers]
    if any(provisional):
        fig.add_bar(x=[f"“{a}”" for a in answers], y=provisional, marker=dict(color=colors, opacity=0.35,
                    pattern=dict(shape="/", fgcolor="white")), name="still writing (answer so far)",
                    hovertemplate="answer %{x}: %{y} running samples, answer so far<extra></extra>")
    fig.add_scatter(x=[f"“{a}”" for a in answers], y=[counts[a] for a in answers], mode="text",
                    text=[counts[a] for a in answers], textposition="top center", showlegend=False,
                    hoverinfo="skip", cliponaxis=False)
    if truth is None:
        sub = "free-form prompt: the right answer is unknown"
    else:
        sub = f"right answer: {truth} " + ("(green)" if truth in counts else "(no sample reached it)")
    top = max(counts.values(), default=1)
    fig.update_layout(title=dict(text="Votes per final answer", subtitle=dict(text=sub)), barmode="stack",
                      xaxis=dict(title="final answer", type="category"),
                      yaxis=dict(title="samples", range=[0, top * 1.25 + 0.5], dtick=1 if top <= 8 else None),
                      margin=dict(l=70, r=20, t=120 if any(provisional) else 90, b=60), showlegend=any(provisional),
                      # Above the bars, under the subtitle: below the axis it met the answers' labels.
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig
