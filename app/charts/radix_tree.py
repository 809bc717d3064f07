"""Radix prefix cache charts: the tree (networkx graph, tidy top-down layout, drawn with Plotly
shapes so outlines can be dashed), hit rate and tokens saved over time, and cache on vs off."""
from __future__ import annotations

import html
import re
from typing import Any, Callable

import networkx as nx
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.analysis.radix import CachePoint, CacheRun, tidy_layout, tree_graph
from app.charts.axes import step_range, step_ticks
from app.charts.colors import tint
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR, TREE_LABEL_PX

LOCKED = "#0072B2"
EVICTABLE = "#9CA3AF"
GHOST = "#D62728"
ROOT = "#374151"
TOUCHED = "#E69F00"
BOX_W, BOX_H = 0.9, 0.78
RUN_COLORS = {"cache on": TECHNIQUE_COLOR, "cache off": BASELINE_COLOR}


def _visible(text: str) -> str:
    return text.replace("<|im_start|>", "<s>").replace("<|im_end|>", "</s>").replace("\n", "⏎")


def _short(text: str, limit: int) -> str:
    """One line of token text: ChatML markers short, newlines visible, long spans as head … tail,
    HTML-escaped (Plotly would read <|im_start|> as a tag and drop it)."""
    t = _visible(text)
    if len(t) > limit:
        head = max(limit * 3 // 5, 4)
        t = t[:head] + " … " + t[-(limit - head - 2):]
    return html.escape(t)


# The newline mark is about two characters wide in the labels' font: counted as one, a leaf ending in two of
# them ("…Sentiment:</s>⏎<s>assistant⏎”") ran past its box at 1280 pixels.
WIDE_CHARS = {"⏎": 2.0}


def label_width(line: str) -> float:
    """A label line's width in average characters (CHAR_PX each)."""
    return sum(WIDE_CHARS.get(c, 1.0) for c in line)


def _head(t: str, width: float) -> str:
    """The longest start of `t` at most `width` characters wide."""
    used = 0.0
    for i, c in enumerate(t):
        used += WIDE_CHARS.get(c, 1.0)
        if used > width:
            return t[:i]
    return t


def _two_lines(text: str, per_line: int) -> str:
    """Node text on up to two lines: the start of the span, then its end (what it starts and ends with)."""
    t = _visible(text)
    if label_width(t) <= per_line:
        return "“" + html.escape(t) + "”"
    first = _head(t, per_line)
    if label_width(t) - label_width(first) <= per_line:
        return "“" + html.escape(first) + "<br>" + html.escape(t[len(first):]) + "”"
    tail = _head(t[::-1], per_line - 1)[::-1]
    return "“" + html.escape(_head(t, per_line - 1)) + "…<br>…" + html.escape(tail) + "”"


def _wrap_facts(facts: list[str], width: int) -> str:
    """Join a node's facts with " · ", starting a new line before one that would pass `width`
    visible characters (tags such as <b> take no room), so a narrow box stacks them instead of
    letting the last one run over its edge."""
    lines: list[str] = []
    for fact in facts:
        if lines and len(re.sub(r"<[^>]+>", "", lines[-1] + " · " + fact)) <= width:
            lines[-1] += " · " + fact
        else:
            lines.append(fact)
    return "<br>".join(lines)


def _style(d: dict[str, Any], is_root: bool, step: int) -> tuple[str, str, str, float]:
    """fill, line colour, dash, line width for a node."""
    if is_root:
        return ROOT, ROOT, "solid", 2
    if d["ghost"]:
        return "rgba(214,39,40,0.06)", GHOST, "dot", 2
    if d["lock_ref"] > 0:
        return tint(LOCKED, 0.28), LOCKED, "solid", 3.5
    edge = TOUCHED if d.get("last_access_step") == step else EVICTABLE
    return "#F3F4F6", edge, "dash", 2.5 if edge == TOUCHED else 1.8


# Measured in Chromium on the narrowest page the app is laid out for, a 1024-pixel projector with the sidebar
# open: the tree's plot area is 596 pixels wide (740 at 1280 pixels) and token text at TREE_LABEL_PX takes up
# to 6 pixels a character, so ~99 characters span it. (Sized for 1280 pixels, sibling labels ran into each
# other at 1024.) Presentation mode's larger text (17 px, ~7.9 pixels a character) gets the sidebar's width
# too: 844 pixels at 1024, ~107 characters, so a line that fits the normal page fits there as well.
PLOT_PX, CHAR_PX = 596, 6.0
CHARS_ACROSS = int(PLOT_PX / CHAR_PX)
MIN_SLOTS = 3.5  # the x range never spans fewer leaf slots, so a young tree's boxes stay box-sized


def tree_slots(leaves: int) -> float:
    """Leaf slots the x range spans: the leaves' unit slots plus 0.55 beyond the outer boxes' centres."""
    return max(leaves + 0.1, MIN_SLOTS)


def label_chars(leaves: int) -> int:
    """Characters one label line may hold: a box is 0.9 of a slot, less the quote mark or ellipsis each
    line of token text gets. (Counting the leaves alone, not the 3.5-slot minimum, let a two-leaf tree's
    lines run past their boxes and into each other at 1280 pixels.)"""
    return max(8, min(36, int(0.9 * CHARS_ACROSS / tree_slots(leaves)) - 2))


def radix_tree_figure(snapshot: dict[str, Any], owners: dict[int, list[str]], step: int,
                      decode: Callable[[list[int]], str] | None = None) -> go.Figure:
    """`decode` (the tokenizer's) labels evicted nodes with their text; the snapshot has none for them."""
    g = tree_graph(snapshot)
    root = snapshot["nodes"][0]["id"]
    pos = tidy_layout(g, root)
    leaves = max(sum(1 for n in g if g.out_degree(n) == 0), 1)
    depth = -min((y for _, y in pos.values()), default=0)
    limit = label_chars(leaves)
    facts_width = max(limit, 22)  # "3 blk = 24 tok" and "last used at step 12" stay whole
    bs = snapshot["block_size"]
    fig = go.Figure()
    ex, ey = [], []
    for a, b in g.edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ex += [x0, x0, x1, x1, None]
        ey += [y0 - BOX_H / 2, (y0 + y1) / 2, (y0 + y1) / 2, y1 + BOX_H / 2, None]
    fig.add_scatter(x=ex, y=ey, mode="lines", line=dict(color="#CBD5E1", width=1.6), hoverinfo="skip",
                    showlegend=False)
    xs, ys, labels, hovers = [], [], [], []
    for n, d in g.nodes(data=True):
        x, y = pos[n]
        is_root = n == root
        fill, line, dash, width = _style(d, is_root, step)
        fig.add_shape(type="rect", x0=x - BOX_W / 2, x1=x + BOX_W / 2, y0=y - BOX_H / 2, y1=y + BOX_H / 2,
                      fillcolor=fill, line=dict(color=line, dash=dash, width=width), layer="below")
        blocks = len(d.get("blocks", ()))
        if is_root:
            label = f"<b>root</b><br>{snapshot['num_blocks']} blocks cached"
            hover = (f"root: {snapshot['num_nodes']} nodes, {snapshot['num_blocks']} blocks, "
                     f"{snapshot['num_tokens']} tokens cached")
        elif d["ghost"]:
            text = decode(d["tokens"]) if decode else ""
            head = _wrap_facts(["<b>✕ evicted</b>", f"last used at step {d['last_access_step']}"], facts_width)
            label = f"{head}<br>{_two_lines(text, limit)}<br>{blocks} blk"
            hover = (f"evicted in step {step}: {blocks} blocks ({d['freed_blocks']} freed), "
                     f"last used step {d['last_access_step']}")
        else:
            who = owners.get(d["id"], [])
            lock = f"<b>locked ×{d['lock_ref']}</b>" if d["lock_ref"] else "unlocked"
            facts = [f"{blocks} blk = {len(d['tokens'])} tok", lock, f"last used at step {d['last_access_step']}"]
            label = f"{_two_lines(d['text'], limit)}<br>{_wrap_facts(facts, facts_width)}"
            hover = (f"node {d['id']}: {len(d['tokens'])} tokens = {blocks} blocks of {bs} "
                     f"(physical {list(d['blocks'])[:8]}{'…' if blocks > 8 else ''})<br>"
                     f"lock_ref {d['lock_ref']}" + (f" (path of {', '.join(who)})" if who else "") +
                     f"<br>last access: step {d['last_access_step']}<br>"
                     + ("evictable: frees " + str(d["freeable_blocks"]) + " blocks" if d["evictable"] else "in use")
                     + f"<br>“{_short(d['text'], 240)}”")
        xs.append(x)
        ys.append(y)
        labels.append(label)
        hovers.append(hover)
    fig.add_scatter(x=xs, y=ys, mode="markers+text", text=labels, textposition="middle center",
                    marker=dict(size=26, opacity=0), textfont=dict(size=TREE_LABEL_PX, color="#111827"),
                    hovertext=hovers, hoverinfo="text", showlegend=False)
    for name, color, dash in (("locked (a running request's path)", LOCKED, "solid"),
                              ("evictable (unlocked)", EVICTABLE, "dash"),
                              ("touched this step", TOUCHED, "dash"), ("evicted this step", GHOST, "dot")):
        fig.add_scatter(x=[None], y=[None], mode="lines", line=dict(color=color, dash=dash, width=3), name=name)
    evicted = len(snapshot.get("evicted_this_step", ()))
    nn = snapshot["num_nodes"]
    title = (f"Radix tree after step {step}: {nn} node{'s' * (nn != 1)}, {snapshot['num_blocks']} blocks "
             f"({snapshot['num_evictable_blocks']} evictable)")
    if evicted:
        title += f" · {evicted} evicted this step"
    fig.update_layout(title=title, showlegend=True, hovermode="closest")
    xs_all = [x for x, _ in pos.values()]
    # At least MIN_SLOTS wide, so a young tree's one or two boxes do not stretch across the page.
    mid, half = (min(xs_all) + max(xs_all)) / 2, tree_slots(leaves) / 2
    fig.update_xaxes(visible=False, range=[mid - half, mid + half])
    fig.update_yaxes(visible=False, range=[-depth - 0.5, 0.5])
    # The root's label must be readable on its dark fill (same node order as the loop above).
    fig.data[1].textfont.color = ["white" if n == root else "#111827" for n in g.nodes]
    return fig


def tree_height(snapshot: dict[str, Any] | None) -> int:
    if not snapshot:
        return 300
    g = tree_graph(snapshot)
    depth = max(nx.shortest_path_length(g, snapshot["nodes"][0]["id"]).values(), default=0)
    return 170 + 125 * (depth + 1)


def cache_series_figure(points: list[CachePoint], selected: int | None = None) -> go.Figure:
    """Left: cumulative prompt tokens computed vs served from the tree. Right: hit rates."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.09,
                        subplot_titles=("Prompt tokens: computed vs cached",
                                        "Hit rate (cumulative)"))
    steps = [p.step for p in points]
    fig.add_scatter(x=steps, y=[p.prefill_computed for p in points], name="prefill tokens computed",
                    line=dict(color=ACCENT, width=3, shape="hv"), row=1, col=1,
                    hovertemplate="step %{x}: %{y} computed<extra></extra>")
    fig.add_scatter(x=steps, y=[p.tokens_saved for p in points], name="served from cache (not computed)",
                    line=dict(color="#009E73", width=3, shape="hv"), row=1, col=1,
                    hovertemplate="step %{x}: %{y} from cache<extra></extra>")
    fig.add_bar(x=steps, y=[p.saved_this_step for p in points], name="saved in this step",
                marker_color=tint("#009E73", 0.35), width=0.5, row=1, col=1,
                hovertemplate="step %{x}: %{y} tokens saved<extra></extra>")
    fig.add_scatter(x=steps, y=[p.hit_rate * 100 for p in points], name="requests that hit (%)",
                    line=dict(color="#0072B2", width=3, shape="hv"), row=1, col=2,
                    hovertemplate="step %{x}: %{y:.0f}% of admissions hit<extra></extra>")
    fig.add_scatter(x=steps, y=[p.token_hit_rate * 100 for p in points], name="prompt tokens from cache (%)",
                    line=dict(color="#56B4E9", width=3, dash="dash", shape="hv"), row=1, col=2,
                    hovertemplate="step %{x}: %{y:.0f}% of prompt tokens<extra></extra>")
    ev = [p for i, p in enumerate(points) if i and p.evictions > points[i - 1].evictions]
    if ev:
        # Along the bottom, not on a hit-rate line: an eviction has no hit rate, and on the line its height
        # read as one.
        fig.add_scatter(x=[p.step for p in ev], y=[2] * len(ev), mode="markers",
                        marker=dict(symbol="x", size=13, color="#D62728"), name="step with an eviction", row=1,
                        col=2, customdata=[p.evictions for p in ev],
                        hovertemplate="step %{x}: the tree evicted (%{customdata} evictions so far)<extra></extra>")
    if selected is not None:
        for col in (1, 2):
            fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2), row=1, col=col)
    fig.update_yaxes(title_text="tokens (cumulative)", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="%", range=[0, 105], row=1, col=2)
    fig.update_xaxes(title_text="engine step", **step_ticks(len(points)),
                     **step_range((p.step for p in points), selected))
    fig.update_layout(legend=dict(yanchor="top", y=-0.2, xanchor="left", x=0.0), margin=dict(t=60, b=90))
    return fig


def cache_compare_figure(runs: dict[str, CacheRun]) -> go.Figure:
    """Cumulative prefill tokens computed per step, and measured TTFT per request, cache on vs off."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.09,
                        subplot_titles=("Prefill tokens computed (cumulative)", "Time to first token per request"))
    for label, run in runs.items():
        color = RUN_COLORS.get(label, MUTED)
        total = 0
        xs, ys = [], []
        for r in run.records:
            total += r.num_prefill_tokens
            xs.append(r.step)
            ys.append(total)
        fig.add_scatter(x=xs, y=ys, name=label, legendgroup=label, line=dict(color=color, width=3, shape="hv"),
                        hovertemplate="step %{x}: %{y} prefill tokens<extra>" + label + "</extra>", row=1, col=1)
        ttft = run.ttft()
        fig.add_bar(x=list(ttft), y=[v * 1e3 for v in ttft.values()], name=label, legendgroup=label,
                    showlegend=False, marker_color=color,
                    hovertemplate="%{x}: %{y:.0f} ms<extra>" + label + "</extra>", row=1, col=2)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="ms (engine clock)", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="engine step", row=1, col=1)
    fig.update_layout(barmode="group", legend=dict(yanchor="top", y=-0.18, xanchor="left", x=0.0),
                      margin=dict(t=60, b=80))
    return fig
