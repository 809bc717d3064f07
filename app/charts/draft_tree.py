"""Tree speculation charts: one round's draft tree (networkx layout, drawn with Plotly), its tree
attention mask, tokens per round over steps, the measured verification cost of a tree of N nodes,
and Medusa vs EAGLE vs plain on the same requests."""
from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.analysis.radix import tidy_layout
from app.analysis.speculative import DrafterRun, speedup_vs_plain
from app.analysis.tree_spec import FINAL, ROOT, TreePoint, VerifyCost, draft_tree_graph, mask_labels, round_tree
from app.charts.axes import step_range, step_ticks
from app.charts.speculative import ACCEPTED, BONUS, REJECTED, RESAMPLED, UNVERIFIED
from app.formatting import plural
from app.theme import MUTED, TREE_LABEL_PX

ROOT_COLOR = "#374151"
STATUS_COLORS = {"accepted": ACCEPTED, "rejected": REJECTED, "unreached": UNVERIFIED, "root": ROOT_COLOR,
                 "bonus": BONUS, "resampled": RESAMPLED}
STATUS_NAMES = {"accepted": "accepted (on the kept path)", "rejected": "checked and rejected",
                "unreached": "never reached (parent rejected)", "bonus": "bonus token (all of a path kept)",
                "resampled": "target's own token (no child matched)"}
RUN_COLORS = {"plain": "#6B7280", "medusa": "#E69F00", "eagle": "#009E73"}
# Short enough for one line at presentation size in a full-width column at 1280 px (a longer one was cut).
TREE_NUMBERS = "grey: q, the drafter's probability of each token · ◆ p: the target's probability of its own token"


def prob_text(p: float) -> str:
    """Two decimals, but never "0.00" for a token the tree kept: the drafter gave it some probability.
    Escaped: Plotly would read "<0.01" as the start of a tag."""
    return "&lt;0.01" if 0 < p < 0.005 else f"{p:.2f}"


def _label(text: str, limit: int = 11) -> str:
    text = text.replace("<", "&lt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def draft_tree_figure(r: dict[str, Any], title: str | None = None) -> go.Figure:
    """Left to right: root (the last sampled token), the drafted nodes by depth, and the token the
    round added after the accepted path. Node text: token and drafter probability q (the final token: the
    target's probability p), named in the subtitle."""
    g = draft_tree_graph(r)
    pos = {n: (-y, -x) for n, (x, y) in tidy_layout(g, ROOT).items()}  # depth on x, leaves down the page
    fig = go.Figure()
    path = set(r["accepted_path"])
    for kind, width, color, dash in (("other", 1.4, "#CBD5E1", None), ("path", 4.0, ACCEPTED, None),
                                     ("final", 2.5, BONUS if r["final_kind"] == "bonus" else RESAMPLED, "dot")):
        ex, ey = [], []
        for a, b in g.edges:
            k = "final" if b == FINAL else ("path" if b in path else "other")
            if k != kind:
                continue
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ex += [x0, (x0 + x1) / 2, (x0 + x1) / 2, x1, None]
            ey += [y0, y0, y1, y1, None]
        fig.add_scatter(x=ex, y=ey, mode="lines", line=dict(color=color, width=width, dash=dash), hoverinfo="skip",
                        showlegend=False)
    for status in ("root", "accepted", "rejected", "unreached", "bonus", "resampled"):
        nodes = [n for n, d in g.nodes(data=True) if d["status"] == status]
        if not nodes:
            continue
        xs = [pos[n][0] for n in nodes]
        ys = [pos[n][1] for n in nodes]
        texts, hovers = [], []
        for n in nodes:
            d = g.nodes[n]
            if n == ROOT:
                texts.append(f"<b>{_label(d['text'])}</b>")
                hovers.append(f"root: the last sampled token “{d['text']}” (row 0 of the pass)")
            elif n == FINAL:
                texts.append(f"<b>{_label(d['text'])}</b> p {prob_text(d['p'])}")
                hovers.append(f"{STATUS_NAMES[status]}: “{d['text']}”, target p = {d['p']:.3f}")
            else:
                # q in grey at the token's size: a fixed 10 px span stayed 10 px in presentation mode.
                texts.append(f"{_label(d['text'])} <span style='color:{MUTED}'>{prob_text(d['q'])}</span>")
                hovers.append(f"node {n} (row {d['row']}, depth {d['depth']}): “{d['text']}”<br>"
                              f"q = {d['q']:.3f}, path probability {d['path_prob']:.3f}<br>"
                              f"target's argmax after it: “{d['argmax']}”<br>{STATUS_NAMES[status]}")
        fig.add_scatter(x=xs, y=ys, mode="markers",
                        marker=dict(size=16 if status in ("root", "bonus", "resampled") else 13,
                                    color=STATUS_COLORS[status], line=dict(color="white", width=1.5),
                                    symbol="diamond" if status in ("bonus", "resampled") else "circle"),
                        hovertext=hovers, hoverinfo="text",
                        name=STATUS_NAMES.get(status, "root (last sampled token)"))
        # Labels as annotations on a white ground: an edge leaving a node runs right along its row,
        # and as trace text the label sat on that line; now the line starts where the label ends.
        for x, y, text in zip(xs, ys, texts):
            fig.add_annotation(x=x, y=y, text=text, showarrow=False, xanchor="left", xshift=9,
                               font=dict(size=TREE_LABEL_PX, color="#111827"), bgcolor="rgba(255,255,255,0.92)",
                               borderpad=1)
    depth = max(x for x, _ in pos.values())
    leaves = -min(y for _, y in pos.values())
    fig.update_xaxes(visible=False, range=[-0.3, depth + 0.9])
    fig.update_yaxes(visible=False, range=[-leaves - 0.7, 0.7])
    # The numbers beside the nodes, named: on a projector a rejected node's "0.90" beside the final token's
    # "p 0.52" read as a contradiction. They are two models' probabilities of two different tokens.
    fig.update_layout(title=dict(text=title or "Draft tree", subtitle=dict(text=TREE_NUMBERS)), hovermode="closest",
                      legend=dict(orientation="h", yanchor="top", y=-0.02, xanchor="left", x=0))
    return fig


def tree_height(r: dict[str, Any] | None) -> int:
    if not r:
        return 420
    leaves = sum(1 for i in range(len(r["tree"]["parents"])) if i not in r["tree"]["parents"]) + 1
    return int(min(900, max(380, 140 + 24 * leaves)))


def tree_mask_figure(r: dict[str, Any]) -> go.Figure:
    """The [1 + N] x [1 + N] tree attention mask over this pass's rows (the cached context, visible to
    every row, is left out). Cells on the accepted path's rows are green."""
    m = round_tree(r).mask().int().tolist()
    keep = {0} | {1 + i for i in r["accepted_path"]}
    z = [[(2 if (i in keep and v) else v) for v in row] for i, row in enumerate(m)]
    labels = mask_labels(r)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(labels))), y=list(range(len(labels))), zmin=0, zmax=2, showscale=False, xgap=1, ygap=1,
        colorscale=[[0, "#F8FAFC"], [0.33, "#F8FAFC"], [0.34, "#94A3B8"], [0.66, "#94A3B8"], [0.67, ACCEPTED],
                    [1, ACCEPTED]],
        customdata=[[[labels[i], labels[j]] for j in range(len(labels))] for i in range(len(labels))],
        hovertemplate="row %{customdata[0]} → key %{customdata[1]}: %{z}<extra>0 hidden · 1 visible · "
                      "2 visible, accepted path</extra>"))
    ticks = [("root" if i == 0 else f"n{i - 1}") for i in range(len(labels))]
    step = 1 if len(labels) <= 26 else 4
    # Column labels stand upright once there are more than a dozen: side by side, 25 of them ("n10", "n11", ...)
    # ran into one string over the 11-pixel columns of a half-width chart at 1280 pixels.
    fig.update_xaxes(title="key (all rows see the context too)", side="top",
                     tickvals=list(range(0, len(labels), step)), ticktext=ticks[::step],
                     tickangle=-90 if len(labels) > 12 else 0, tickfont=dict(size=10))
    fig.update_yaxes(title="query row", autorange="reversed", tickvals=list(range(0, len(labels), step)),
                     ticktext=ticks[::step], tickfont=dict(size=10))
    fig.update_layout(title=dict(text=f"Tree attention mask: {len(labels)} rows",  # short: a half-width column
                                 y=0.02, yanchor="bottom", font=dict(size=14)), margin=dict(t=70, b=60))
    return fig


def tokens_per_round_figure(points: list[TreePoint], selected: int | None = None, num_steps: int = 0) -> go.Figure:
    fig = go.Figure()
    if points:
        fig.add_scatter(x=[p.step for p in points], y=[p.tokens for p in points], mode="markers", name="one round",
                        marker=dict(size=8, color=ACCEPTED, opacity=0.55),
                        customdata=[[p.request_id, plural(p.nodes, "node"), p.depth] for p in points],
                        hovertemplate="step %{x}, %{customdata[0]}: %{y} tokens from a tree of %{customdata[1]} "
                                      "(depth %{customdata[2]})<extra></extra>")
        run, total = [], 0
        for i, p in enumerate(points, 1):
            total += p.tokens
            run.append(total / i)
        fig.add_scatter(x=[p.step for p in points], y=run, mode="lines", name="mean so far",
                        line=dict(color=BONUS, width=3), hovertemplate="mean %{y:.2f} tokens per pass<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color=MUTED, dash="dot", width=1), annotation_text="plain decoding",
                  annotation_position="bottom right")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    top = max([3] + [p.tokens for p in points])
    fig.update_layout(title=dict(text="Tokens per target pass", subtitle=dict(text="accepted path + 1, every round")),
                      xaxis_title="engine step",
                      yaxis=dict(title="tokens", range=[0, top + 0.5], dtick=1))
    fig.update_xaxes(**step_ticks(max(num_steps, 1)), **step_range(range(num_steps), selected))
    return fig


def verify_cost_figure(costs: list[VerifyCost], plain_seconds: float | None = None,
                       taus: dict[str, list[tuple[int, float]]] | None = None) -> go.Figure:
    """Left: the measured time of one verification pass vs the tree's node count. Right (if the bench
    file has them): tokens per pass and speedup vs node budget from bench/spec.py."""
    cols = 2 if taus else 1
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.1,
                        subplot_titles=["one target pass vs tree nodes (measured now)"]
                        + (["tokens per pass vs node budget (bench/spec.py)"] if taus else []))
    base = costs[0].seconds if costs else None
    # The repeats' spread as a bar: on a shared CPU a single burst of load moves a point by tens of ms.
    spread = all(c.fastest == c.fastest and c.slowest == c.slowest for c in costs)
    error = dict(type="data", symmetric=False, color="#0072B2", thickness=1.5, width=5,
                 array=[(c.slowest - c.seconds) * 1e3 for c in costs],
                 arrayminus=[(c.seconds - c.fastest) * 1e3 for c in costs]) if spread else None
    fig.add_scatter(x=[c.nodes for c in costs], y=[c.seconds * 1e3 for c in costs], mode="lines+markers",
                    line=dict(color="#0072B2", width=3), marker=dict(size=9), name="verification pass (median)",
                    error_y=error,
                    customdata=[[plural(c.nodes, "node"), c.seconds / base if base else math.nan, c.fastest * 1e3,
                                 c.slowest * 1e3] for c in costs],
                    hovertemplate="%{customdata[0]}: median %{y:.3g} ms (%{customdata[1]:.2f}× a 1-row decode)"
                                  + ("<br>fastest %{customdata[2]:.3g}, slowest %{customdata[3]:.3g} ms" if spread
                                     else "") + "<extra></extra>",
                    row=1, col=1)
    fig.update_xaxes(title_text="tree nodes (rows = nodes + 1)", row=1, col=1)
    fig.update_yaxes(title_text="ms per pass", rangemode="tozero", row=1, col=1)
    if taus:
        for name, pts in taus.items():
            pts = sorted(pts)
            fig.add_scatter(x=[n for n, _ in pts], y=[t for _, t in pts], mode="lines+markers", name=name,
                            line=dict(color=RUN_COLORS.get(name.split()[0].lower(), MUTED), width=3), row=1, col=2,
                            hovertemplate=name + ", %{x} nodes: %{y:.2f} tokens per pass<extra></extra>")
        fig.update_xaxes(title_text="node budget", row=1, col=2)
        fig.update_yaxes(title_text="tokens per pass", rangemode="tozero", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0), margin=dict(b=100))
    return fig


def tree_compare_figure(runs: dict[str, DrafterRun]) -> go.Figure:
    keys = list(runs)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["tokens per target pass", "measured speedup vs plain"])
    names = [runs[k].label for k in keys]
    colors = [RUN_COLORS.get(k, MUTED) for k in keys]
    tpp = [runs[k].tokens_per_pass for k in keys]
    sp = [speedup_vs_plain(runs, k) for k in keys]
    for col, ys, fmt in ((1, tpp, "{:.2f}"), (2, sp, "{:.2f}×")):
        fig.add_bar(x=names, y=[y if y is not None else 0 for y in ys], marker_color=colors, showlegend=False,
                    text=[fmt.format(y) if y is not None else "–" for y in ys], textposition="outside",
                    row=1, col=col, hovertemplate="%{x}: %{text}<extra></extra>")
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(title="Medusa vs EAGLE vs plain decoding on the same requests (greedy output identical)")
    return fig
