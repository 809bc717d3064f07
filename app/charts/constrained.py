"""Charts of the constrained decoding page: per output token, how many tokens the grammar allowed and how
much of the model's probability it forbade; and the same prompt's cost free, masked and with jump-forward."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.tokenizer import Tokenizer

from app.analysis.constrained import KIND_NAMES, ModeRun
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

KIND_COLORS = {"free": "#0072B2", "unconstrained": "#0072B2", "steered": ACCENT, "only": MUTED,
               "forced": TECHNIQUE_COLOR}


MAX_TICK_LABELS = 18
# One width for every kind's bars: overlaid traces otherwise size their bars from their own x spacing, and
# forced tokens three positions apart drew bars three positions wide.
BAR_WIDTH = 0.8


def _short(text: str) -> str:
    return text if len(text) <= 8 else text[:7] + "…"


# Characters of tick text that fit level under the chart (a full-width plot is about 740 pixels at 1280, a
# 12-pixel label about 7 pixels a character).
LEVEL_TICK_CHARS = 100


def tick_angle(texts: Sequence[str]) -> int:
    """Level when every label fits in its slot, else -60 degrees: a rotated one-character token read badly
    ("{" turned into "(", "↵␣" lay on its side)."""
    slot = max((len(t) for t in texts), default=0) + 2
    return 0 if slot * len(texts) <= LEVEL_TICK_CHARS else -60


def _nth(k: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(k, f"{k}th")


def _allowed_height(event: dict[str, Any], vocab_size: int) -> int:
    if event["kind"] == "unconstrained":
        return vocab_size
    return event["allowed"] or 1


def _allowed_text(event: dict[str, Any]) -> str:
    if event["kind"] == "unconstrained":
        return "no grammar: every token allowed"
    if event["allowed"] is None:
        return "written without sampling"
    return f"{event['allowed']:,} tokens allowed"


def mask_figure(sample: dict[str, Any], vocab_size: int, tokenizer: Tokenizer,
                title: str = "What the grammar allowed, token by token") -> go.Figure:
    """Top: tokens allowed at each output position (log scale; the whole vocabulary is the dotted line),
    one colour per way the token was decided; jump-forward tokens (no mask, no sampling) sit at 1. Bottom:
    the probability the model put on tokens the grammar forbade there."""
    events = sample["events"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.08)
    xs = list(range(len(events)))
    labels = [tokenizer.decode_token(e["token"]) for e in events]
    for kind in ("free", "unconstrained", "steered", "only", "forced"):
        idx = [i for i, e in enumerate(events) if e["kind"] == kind]
        if not idx:
            continue
        # No grammar: the whole vocabulary was allowed. Forced: nothing was sampled; drawn at 1, the one way on.
        fig.add_trace(go.Bar(
            x=idx, y=[_allowed_height(events[i], vocab_size) for i in idx], name=KIND_NAMES[kind],
            marker_color=KIND_COLORS[kind], width=BAR_WIDTH,
            hovertemplate=[f"#{i} “{labels[i]}”<br>{KIND_NAMES[kind]}<br>{_allowed_text(events[i])}<extra></extra>"
                           for i in idx]),
            row=1, col=1)
        masked = [i for i in idx if events[i]["masked_mass"] is not None]
        if masked:
            fig.add_trace(go.Bar(
                x=masked, y=[100 * events[i]["masked_mass"] for i in masked], marker_color=KIND_COLORS[kind],
                width=BAR_WIDTH,
                showlegend=False, name=KIND_NAMES[kind],
                hovertemplate=[f"#{i} “{labels[i]}”<br>{100 * events[i]['masked_mass']:.1f} % of the model's "
                               "probability was on forbidden tokens<extra></extra>" for i in masked]),
                row=2, col=1)
    fig.add_hline(y=vocab_size, line=dict(color=MUTED, width=1, dash="dot"), row=1, col=1)
    # Token texts as ticks, every k-th once they would crowd (about 18 fit a projector-wide chart at -60
    # degrees); the hover still names every token.
    stride = -(-len(events) // MAX_TICK_LABELS) if events else 1
    shown = xs[::stride]
    texts = [_short(labels[i]) for i in shown]
    tick = dict(tickvals=shown, ticktext=texts, tickangle=tick_angle(texts),
                title="output token" if stride == 1 else f"output token (every {_nth(stride)} labelled)")
    fig.update_layout(
        barmode="overlay", bargap=0.15,
        title=dict(text=title, subtitle=dict(text=f"dotted: the whole vocabulary ({vocab_size:,} tokens)")),
        # From 10^-0.5: a token with one choice (or none: jump-forward) still gets a visible bar of height 1.
        yaxis=dict(title="tokens allowed", type="log", range=[-0.5, 4.9], tickvals=[1, 10, 100, 1000, 10000],
                   ticktext=["1", "10", "100", "1k", "10k"]),
        yaxis2=dict(title="p forbidden (%)", range=[0, 105]),
        xaxis2=dict(**tick), margin=dict(l=70, r=20, t=90, b=90),
        legend=dict(orientation="h", y=-0.3, yanchor="top"))  # pinned under the axis title (theme.place_legend)
    return fig


def modes_figure(runs: Sequence[ModeRun], title: str = "The same prompt, with and without the grammar") -> go.Figure:
    """Engine steps per mode (bars), output tokens as a marker on each, valid or not in the bar's label."""
    colors = [BASELINE_COLOR, "#0072B2", TECHNIQUE_COLOR, "#56B4E9"]
    fig = go.Figure()
    # Validity goes in the category label: a label over the bar sat under the output-token diamond.
    names = [f"{r.mode}<br>{'–' if r.valid is None else ('valid ✓' if r.valid else 'not valid ✗')}" for r in runs]
    fig.add_trace(go.Bar(
        x=names, y=[r.steps for r in runs], name="engine steps",
        marker_color=[colors[i % len(colors)] for i in range(len(runs))],
        text=[f"{r.steps} steps" for r in runs], textposition="inside", insidetextanchor="start",
        hovertemplate=[f"{r.mode}<br>{r.steps} steps, {r.output_tokens} output tokens<br>{r.wall_seconds:.2f} s"
                       "<extra></extra>" for r in runs]))
    fig.add_trace(go.Scatter(x=names, y=[r.output_tokens for r in runs], name="output tokens",
                             mode="markers", marker=dict(symbol="diamond", size=13, color="#111827")))
    top = max([r.steps for r in runs] + [r.output_tokens for r in runs] + [1])
    fig.update_layout(title=dict(text=title, subtitle=dict(text="bars: engine steps · diamonds: output tokens · "
                                                                "under each: valid under the grammar?")),
                      yaxis=dict(title="count", range=[0, top * 1.25]), xaxis=dict(type="category"),
                      margin=dict(l=70, r=20, t=90, b=80), showlegend=False)
    return fig
