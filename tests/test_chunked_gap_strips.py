"""The chunked prefill page's time-between-tokens charts: one strip per request on shared axes (requests
decoding in the same steps have identical gaps, so one overlaid plot hid all but the top line), orange
bands over the steps that ran a prompt chunk, and the worst stall labelled in its own request's strip."""
from __future__ import annotations

import pytest

from app.analysis.chunked import ChunkRun, compare_chunking, median_gap, token_gaps, worst_stall
from app.analysis.trace_metrics import cumulative_clock
from app.charts.chunked import (PREFILL_BAND, compare_gaps_figure, gap_figure_height, gap_request_ids,
                                token_gap_figure)
from app.scenario_library import CHUNKED_PREFILL

SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}
ORDER = ["chat1", "chat2", "chat3", "long"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(random_weights) -> dict[str, ChunkRun]:  # noqa: ANN001
    return compare_chunking(CHUNKED_PREFILL[0], random_weights, SERVER)


def _strip_of(trace) -> int:  # noqa: ANN001
    axis = trace.yaxis[1:]
    return int(axis) if axis else 1


def test_one_strip_per_request_in_session_order(runs) -> None:  # noqa: ANN001
    records = list(runs["chunked"].records)
    gaps = token_gaps(records)
    ids = gap_request_ids(gaps, ORDER)
    assert ids == [r for r in ORDER if any(g.request_id == r for g in gaps)]
    fig = token_gap_figure(records, ORDER, cumulative_clock(records)[-1])
    lines = [t for t in fig.data if t.x and t.x[0] is not None]
    assert [t.name for t in lines] == ids
    # Each request in its own strip, every strip on one y range (the stalls compare by height).
    assert [_strip_of(t) for t in lines] == list(range(1, len(ids) + 1))
    ranges = {tuple(fig.layout[f"yaxis{i if i > 1 else ''}"].range) for i in range(1, len(ids) + 1)}
    assert len(ranges) == 1
    top = max(g.gap_s for g in gaps) * 1e3
    (lo, hi), = ranges
    assert lo == 0 and hi > top
    # Two or three round ticks, none above the highest point (one at a strip's top edge met the "0" of the
    # strip above).
    ticks = list(fig.layout.yaxis.tickvals)
    assert ticks[0] == 0 and 2 <= len(ticks) <= 3 and ticks[-1] <= top
    assert all(t == ticks[1] * i for i, t in enumerate(ticks))
    # The strip labels name the requests; the height grows with the number of strips.
    labels = [a.text for a in fig.layout.annotations]
    assert all(f"<b>{r}</b>" in labels for r in ids)
    assert gap_figure_height(len(ids) + 1) > gap_figure_height(len(ids))
    assert fig.layout.height == gap_figure_height(len(ids))  # the section shows it at its own height
    # The shared y-axis title hangs a fixed distance left of the plot (at a fraction of its width it sat on
    # the tick labels of a narrow chart), inside the left margin.
    (y_title,) = [a for a in fig.layout.annotations if a.text == "ms since the previous token"]
    assert (y_title.x, y_title.xanchor, y_title.xref) == (0, "right", "paper") and y_title.xshift <= -36
    assert fig.layout.margin.l >= -y_title.xshift + 20


def test_bands_cover_exactly_the_steps_with_a_prompt_chunk(runs) -> None:  # noqa: ANN001
    records = list(runs["chunked"].records)
    fig = token_gap_figure(records, ORDER)
    ids = gap_request_ids(token_gaps(records), ORDER)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert bands and all(s.fillcolor == PREFILL_BAND for s in bands)
    clock = cumulative_clock(records)
    starts = [0.0] + clock[:-1]
    covered = sorted({(s.x0, s.x1) for s in bands})
    # Every prefill step's interval lies inside one band and every decode-only step's outside all of them.
    for r, t0, t1 in zip(records, starts, clock):
        inside = any(a - 1e-9 <= t0 and t1 <= b + 1e-9 for a, b in covered)
        assert inside == (r.num_prefill_tokens > 0), r.step
    # Each band is drawn in every strip.
    assert len(bands) == len(covered) * len(ids)


def test_worst_stall_is_labelled_in_its_request_strip(runs) -> None:  # noqa: ANN001
    records = list(runs["unchunked"].records)
    worst = worst_stall(records)
    assert worst is not None
    fig = token_gap_figure(records, ORDER)
    ids = gap_request_ids(token_gaps(records), ORDER)
    note = next(a for a in fig.layout.annotations if a.text.startswith("worst stall"))
    row = ids.index(worst.request_id) + 1
    assert note.yref == ("y" if row == 1 else f"y{row}")
    assert note.x == pytest.approx(worst.time_s) and note.y == pytest.approx(worst.gap_s * 1e3)


def test_comparison_puts_the_same_request_side_by_side(runs) -> None:  # noqa: ANN001
    fig = compare_gaps_figure(runs, ORDER)
    all_gaps = [g for r in runs.values() for g in token_gaps(list(r.records))]
    ids = gap_request_ids(all_gaps, ORDER)
    lines = [t for t in fig.data if t.x and t.x[0] is not None]
    assert len(lines) == 2 * len(ids)
    # Every axis shared: a stall of the same length is the same height in both columns.
    yranges = {tuple(a.range) for a in fig.select_yaxes()}
    assert len(yranges) == 1
    titles = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("chunked prefill, budget") for t in titles)
    assert any(t.startswith("prefill-first") for t in titles)
    assert sum(t.startswith("worst ") for t in titles) == 2


def test_no_gaps_yet_says_so(runs) -> None:  # noqa: ANN001
    records = list(runs["chunked"].records)[:1]
    fig = token_gap_figure(records, ORDER)
    assert any("no request has two tokens yet" in a.text for a in fig.layout.annotations)
    assert fig.layout.yaxis.showticklabels is False  # no made-up scale under the note
    # and the metric beside it has no median to show (it printed "0 ms")
    assert median_gap(records) is None and median_gap(list(runs["chunked"].records)) > 0
