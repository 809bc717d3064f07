"""One colour, one meaning on the continuous batching page: the Gantts colour by phase, the batch charts by
request, the static-vs-continuous bars by policy, and no colour stands for two of these.

The figures are the page's own chart builders fed with real runs of the page's scenarios (the tiny random
Llama: the real scheduler and pool, a few seconds for all three). Colours are compared perceptually (tests/color_distance.py),
for normal vision and simulated red-green colour blindness, not only as hex strings.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import plotly.graph_objects as go
import pytest

from engine.trace import StepRecord

from app.analysis.policy_compare import PolicyRun, compare_policies
from app.charts.batching import batch_at_step, batch_over_steps
from app.charts.gantt import gantt
from app.charts.latency import POLICY_COLORS, latency_comparison
from app.scenario_library import CONTINUOUS_BATCHING
from app.session import EngineSession
from app.theme import (BASELINE_COLOR, CACHE_COLOR, FREE_COLOR, REQUEST_COLORS, SHARED_COLOR, STATUS_COLORS,
                       TECHNIQUE_COLOR, request_color)

from tests.color_distance import VISIONS, _ciede2000, color_distance

SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}
# The first requests get the palette's most distinct colours; the largest scenario on the page has this many.
FIRST_N = max(len(s.requests) for s in CONTINUOUS_BATCHING)
PHASES = tuple(STATUS_COLORS.values())
# CIEDE2000 floors. Colours in one chart (requests in one stack) must differ clearly; colours with different
# meanings on one screen must not pass for each other. Red-green colour blindness squeezes every hue onto a
# blue-yellow axis, so its floors are lower (and still far from 0, which is what r0 = decode blue was).
SAME_CHART = {"normal": 20.0, "deuteranopia": 8.0, "protanopia": 8.0}
OTHER_MEANING = {"normal": 15.0, "deuteranopia": 5.0, "protanopia": 5.0}


@dataclass(frozen=True)
class PageRun:
    records: list[StepRecord]
    request_order: list[str]


def _assert_apart(a: str, b: str, floors: dict[str, float], what: str) -> None:
    for vision in VISIONS:
        d = color_distance(a, b, vision)
        assert d >= floors[vision], f"{what}: {a} and {b} are only {d:.1f} apart ({vision})"


def _bar_colors(fig: go.Figure) -> list[tuple[str, str]]:
    """(label, colour) for every bar a figure draws: the y label for per-bar colour lists, else the trace name."""
    out = []
    for t in fig.data:
        if t.type != "bar":
            continue
        color = t.marker.color
        if isinstance(color, str):
            out.append((t.name, color))
        else:
            out.extend(zip(t.y, color))
    return out


@pytest.fixture(scope="module", params=range(len(CONTINUOUS_BATCHING)),
                ids=[s.name for s in CONTINUOUS_BATCHING])
def page_run(request, tiny_weights, one_torch_thread) -> tuple[PageRun, dict[str, PolicyRun]]:  # noqa: ANN001
    """The page's step charts show the scenario's own policy (continuous), so its comparison run stands in for
    the stepped session: one engine run fewer."""
    scenario = CONTINUOUS_BATCHING[request.param]
    assert scenario.engine_config().policy == "continuous"
    runs = compare_policies(scenario, tiny_weights, SERVER)
    assert all(r.records and not r.errors for r in runs.values())
    order = EngineSession.create(scenario, tiny_weights, SERVER).request_order
    return PageRun(list(runs["continuous"].records), order), runs


def _request_colors(page: PageRun) -> dict[str, str]:
    """Request id -> colour over both batch charts at every step; one colour per request or the test fails."""
    seen: dict[str, set[str]] = {}
    figs = [batch_over_steps(page.records, page.request_order)]
    figs += [batch_at_step(r, page.request_order) for r in page.records]
    for fig in figs:
        for rid, color in _bar_colors(fig):
            seen.setdefault(rid, set()).add(color)
    assert all(len(c) == 1 for c in seen.values()), f"a request changes colour between charts: {seen}"
    return {rid: next(iter(c)) for rid, c in seen.items()}


def _policy_colors(runs: dict[str, PolicyRun]) -> dict[str, str]:
    seen: dict[str, set[str]] = {}
    for t in latency_comparison(runs).data:
        seen.setdefault(t.legendgroup or t.x[0], set()).add(t.marker.color)
    assert all(len(c) == 1 for c in seen.values()), f"a policy changes colour between subplots: {seen}"
    return {p: next(iter(c)) for p, c in seen.items()}


def test_gantts_colour_by_phase_only(page_run) -> None:  # noqa: ANN001
    page, runs = page_run
    for run in runs.values():
        for t in gantt(list(run.records), page.request_order).data:
            if t.type == "bar":
                assert t.marker.color == STATUS_COLORS[t.name]


def test_request_colours_are_never_phase_colours(page_run) -> None:  # noqa: ANN001
    page, _ = page_run
    colors = _request_colors(page)
    assert set(colors) == set(page.request_order)
    assert len(set(colors.values())) == len(colors), "two requests share a colour"
    for (r1, c1), (r2, c2) in itertools.combinations(colors.items(), 2):
        _assert_apart(c1, c2, SAME_CHART, f"{r1} vs {r2}")
    for rid, c in colors.items():
        for phase, p in STATUS_COLORS.items():
            _assert_apart(c, p, OTHER_MEANING, f"request {rid} vs phase {phase}")


def test_policy_colours_are_neither_phases_nor_requests(page_run) -> None:  # noqa: ANN001
    page, runs = page_run
    policies = _policy_colors(runs)
    assert set(policies) == {"static", "continuous"}
    _assert_apart(policies["static"], policies["continuous"], SAME_CHART, "static vs continuous")
    requests = _request_colors(page)
    for policy, c in policies.items():
        for phase, p in STATUS_COLORS.items():
            _assert_apart(c, p, OTHER_MEANING, f"policy {policy} vs phase {phase}")
        for rid, r in requests.items():
            _assert_apart(c, r, OTHER_MEANING, f"policy {policy} vs request {rid}")


def test_batch_legend_swatches_are_solid(page_run) -> None:  # noqa: ANN001
    """Hatching means prefill, so a request's legend swatch is its solid (decode) bar when it has one."""
    page, _ = page_run
    fig = batch_over_steps(page.records, page.request_order)
    bars = [t for t in fig.data if t.type == "bar"]
    legend = [t for t in bars if t.showlegend is not False]
    assert sorted(t.name for t in legend) == sorted({t.name for t in bars})  # every request, once
    for t in legend:
        decoded = any(b.name == t.name and not b.marker.pattern.shape for b in bars)
        assert (t.marker.pattern.shape or "") == ("" if decoded else "/")


def test_the_palettes_keep_the_rule_for_the_first_requests() -> None:
    """The theme-level rule the figures rely on, for every page that colours requests (the block pool, the
    batch charts, chunked prefill's lines): request colours avoid the phases, the comparison pair and the
    block pool's own colours; the first FIRST_N requests also differ clearly from one another."""
    assert FIRST_N <= len(REQUEST_COLORS)
    assert len(set(REQUEST_COLORS)) == len(REQUEST_COLORS)
    reserved = {*PHASES, TECHNIQUE_COLOR, BASELINE_COLOR, SHARED_COLOR, CACHE_COLOR, FREE_COLOR}
    assert not reserved & set(REQUEST_COLORS)
    first = REQUEST_COLORS[:FIRST_N]
    for a, b in itertools.combinations(first, 2):
        _assert_apart(a, b, SAME_CHART, "requests")
    for c in REQUEST_COLORS:
        for p in (*PHASES, TECHNIQUE_COLOR, BASELINE_COLOR, SHARED_COLOR):
            _assert_apart(c, p, OTHER_MEANING, "request vs reserved colour")
    assert set(POLICY_COLORS.values()) == {TECHNIQUE_COLOR, BASELINE_COLOR}
    order = [f"r{i}" for i in range(FIRST_N)]
    assert [request_color(r, order) for r in order] == list(first)


def test_distance_sees_what_colour_blind_viewers_see() -> None:
    """The helper itself: Sharma et al.'s CIEDE2000 reference pair, and red vs green that a deuteranope
    cannot tell apart while blue vs orange stays distinct for everyone."""
    assert _ciede2000((50, 2.6772, -79.7751), (50, 0, -82.7485)) == pytest.approx(2.0425, abs=1e-4)
    assert color_distance("#D62728", "#2CA02C") > 50
    assert color_distance("#D62728", "#2CA02C", "deuteranopia") < 6
    assert min(color_distance("#0072B2", "#E69F00", v) for v in VISIONS) > 50
