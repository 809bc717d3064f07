"""The FlashAttention-2 page as a lecturer puts it on a projector: one memory number per N whatever widget
shows it, integer token axes and a readable ratio for a 1-token prompt, a followed row that follows a new
prompt, no change arrow on a share, controls that stay while the prompt box is empty, charts whose text
follows the (presentation) theme. Chart and analysis checks run in milliseconds; the page ones drive
pages/05_flashattention.py under Streamlit's AppTest."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from streamlit.proto.Metric_pb2 import Metric as MetricProto

from engine.weights import cache_dir, find_gguf
from kernels.flash_trace import flash_attention_tiled, naive_attention

from app.analysis import flash_compare
from app.analysis.flash_compare import AttentionMemory, CpuCache, MethodResult, largest_cpu_cache, memory_table
from app.analysis.flash_qkv import LayerQKV
from app.charts.axes import index_ticks
from app.charts.flash_tiles import (MIN_SCORE_SPAN, RESCALE_LABELS_MAX_TILES, method_chart, online_softmax_chart,
                                   score_matrix, tile_grid)
from app.theme import FONT_SIZE, PRESENT_FONT_SIZE

ROOT = Path(__file__).resolve().parents[1]
PAGE = str(ROOT / "pages/05_flashattention.py")
torch.set_num_threads(1)


def _qkv(n: int) -> LayerQKV:
    g = torch.Generator().manual_seed(n)
    return LayerQKV(0, tuple(range(n)), torch.randn(n, 9, 64, generator=g) * 2, torch.randn(n, 3, 64, generator=g) * 2,
                    torch.randn(n, 3, 64, generator=g), 0.125)


def _exact(qkv: LayerQKV, row: int, head: int) -> tuple[float, float]:
    s = (qkv.q[row, head] @ qkv.k[: row + 1, head // 3].T) * qkv.scale
    return float(s.max()), float(torch.exp(s - s.max()).sum())


# ---- analysis ----------------------------------------------------------------------------------------

def test_memory_uses_one_dtype_per_quantity() -> None:
    """S and P, m and l: each in its one stated dtype, so the metric and the table's row for this N are the
    same record (fp32 in the metric and bf16 in the table gave 866.6 KiB and 433.3 KiB for N = 157)."""
    assert (flash_compare.MATRIX_DTYPE, flash_compare.MATRIX_ELEM) == ("fp32", 4)
    assert (flash_compare.STATE_DTYPE, flash_compare.STATE_ELEM) == ("fp32", 4)
    here = AttentionMemory(157, 9)
    assert here.naive_bytes == 2 * 9 * 157 ** 2 * 4 and here.flash_state_bytes == 9 * 157 * 2 * 4
    rows = memory_table(157, 9)
    assert rows[0] == here and [r.seq_len for r in rows] == [157, 4096, 32768, 131072]
    assert all(r.ratio == r.seq_len for r in rows)  # (2 N² numbers) / (2 N numbers), same dtype
    assert AttentionMemory(1, 9).ratio == 1.0
    assert [r.seq_len for r in memory_table(4096, 9)] == [4096, 32768, 131072]  # no duplicate row


def test_tile_shares_name_their_units() -> None:
    """N = 157 in 128 × 128 tiles: one of four tile pairs is skipped (25 % of the pairs), but it holds only
    128 × 29 of the N² scores (15 %): the computed 85 % and the skipped 15 % of the scores make N², the tile
    share does not add to them."""
    from app.analysis.flashattention_tiles import tile_shares

    qkv = _qkv(157)
    trace = flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 128, 128)
    shares = tile_shares(trace)
    assert (shares.pairs, shares.skipped_pairs, shares.skipped_pair_share) == (4, 1, 0.25)
    assert shares.skipped_scores == 128 * 29 and shares.scores == 157 ** 2
    assert shares.computed_scores + shares.skipped_scores == shares.scores
    assert round(shares.computed_score_share, 2) == 0.85 and round(shares.skipped_score_share, 2) == 0.15
    assert tile_shares(flash_attention_tiled(qkv.q[:1], qkv.k[:1], qkv.v[:1], qkv.scale, 16, 16)).skipped_pairs == 0


def test_largest_cpu_cache_reads_sysfs(tmp_path: Path) -> None:
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "64K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert largest_cpu_cache.__wrapped__(str(tmp_path)) == CpuCache(3, 32 * 1024 ** 2)
    assert largest_cpu_cache.__wrapped__(str(tmp_path / "missing")) is None


def test_cache_sentence_depends_on_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fixed "fits in the caches" claim: at N = 1024 S and P (72 MiB) exceed a 32 MiB L3."""
    from app.sections import flashattention as fa

    monkeypatch.setattr(fa, "largest_cpu_cache", lambda: CpuCache(3, 32 * 1024 ** 2))
    assert "within this CPU's 32.0 MiB L3 cache" in fa.cache_sentence(157, 9)
    long = fa.cache_sentence(1024, 9)
    assert "72.0 MiB" in long and "more than this CPU's 32.0 MiB L3 cache" in long
    monkeypatch.setattr(fa, "largest_cpu_cache", lambda: None)
    assert "cache" not in fa.cache_sentence(1024, 9)


def test_ratio_and_plural_formatting() -> None:
    from app.formatting import plural
    from app.sections.flashattention import _times

    assert [_times(x) for x in (0.5, 1, 2.5, 78, 1024)] == ["0.5×", "1×", "2.5×", "78×", "1,024×"]
    assert [plural(1, "token"), plural(2, "token"), plural(1024, "key")] == ["1 token", "2 tokens", "1,024 keys"]


# ---- charts ------------------------------------------------------------------------------------------

def test_index_ticks_are_whole_and_sparse() -> None:
    for count in (1, 2, 9, 20, 64, 157, 1024):
        t = index_ticks(count)
        assert t["tick0"] == 0 and t["tickangle"] == 0 and isinstance(t["dtick"], int) and t["dtick"] >= 1
        assert count / t["dtick"] <= 10
        assert str(t["dtick"])[0] in "125" and set(str(t["dtick"])[1:]) <= {"0"}


@pytest.mark.parametrize("n", [1, 2, 157])
def test_score_matrix_axes_and_row_line(n: int) -> None:
    """Integer ticks (no −0.4 … 0.4 around one cell) and a followed-row line that ends at the matrix."""
    qkv = _qkv(n)
    trace = flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 16, 16, trace_row=n - 1, trace_head=2)
    _, p = naive_attention(qkv.q, qkv.k, qkv.v, qkv.scale)
    s = (qkv.q[:, 2] @ qkv.k[:, 0].T) * qkv.scale
    for show in ("probabilities", "scores"):
        fig = score_matrix(p[2], s, trace, show)
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            assert axis.tickmode == "linear" and axis.tick0 == 0 and axis.dtick >= 1 and float(axis.dtick).is_integer()
            assert sorted(axis.range) == [-0.5, n - 0.5] and axis.constrain == "domain"
        row_line = [sh for sh in fig.layout.shapes if sh.y0 == n - 1 and sh.y1 == n - 1]
        assert len(row_line) == 1 and (row_line[0].x0, row_line[0].x1) == (-0.5, n - 0.5)
        assert row_line[0].xref in (None, "x")  # data coordinates, not the plot's (wider) domain


def test_tile_grid_labels_every_kth_tile_upright() -> None:
    """157 tokens in 8-key tiles: 20 K tiles, labelled every 2nd, never rotated."""
    qkv = _qkv(157)
    fig = tile_grid(flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 64, 8, trace_row=156))
    assert fig.layout.xaxis.dtick == 2 and fig.layout.xaxis.tickangle == 0
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.tickangle == 0
    assert fig.layout.yaxis.scaleratio == 8  # a 64-row tile is 8 times as tall as an 8-key one
    one = _qkv(1)  # ... but with one token both hold that token: a square cell, not a sliver
    fig = tile_grid(flash_attention_tiled(one.q, one.k, one.v, one.scale, 64, 8, trace_row=0))
    assert fig.layout.yaxis.scaleratio == 1 and fig.layout.xaxis.range == (-0.5, 0.5)


def test_online_softmax_chart_readable_with_one_tile() -> None:
    """Row 0 sees one key: the score axis spans at least MIN_SCORE_SPAN (not a thousandth), the grey future
    tiles have a legend entry, and no text carries a fixed font size (it follows the presentation theme)."""
    qkv = _qkv(157)
    trace = flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 64, 8, trace_row=0, trace_head=7)
    fig = online_softmax_chart(trace, *_exact(qkv, 0, 7))
    lo, hi = fig.layout.yaxis.range
    assert hi - lo >= MIN_SCORE_SPAN
    assert any(t.name == "tile wholly in this row's future" for t in fig.data)
    assert len(fig.layout.shapes) >= 7  # the grey band: K tiles 1-7 lie in row 0's future
    # The whole-row labels follow the theme; only the rescale factors keep a set (and scaled) 12 px.
    assert fig.layout.annotations and all(a.font.size is None for a in fig.layout.annotations
                                          if not a.text.startswith("×"))
    assert fig.layout.xaxis2.dtick == 1 and fig.layout.xaxis2.tickangle == 0
    one = _qkv(1)
    single = flash_attention_tiled(one.q, one.k, one.v, one.scale, 16, 16, trace_row=0, trace_head=7)
    fig = online_softmax_chart(single, *_exact(one, 0, 7))
    lo, hi = fig.layout.yaxis.range
    assert hi - lo >= MIN_SCORE_SPAN and not any(t.name == "tile wholly in this row's future" for t in fig.data)


def test_rescale_factors_keep_a_readable_size() -> None:
    """Plotly shrinks "outside" bar text to the bar's width (6-pixel factors over thin bars), and the running
    sum's line ran through it: the factors are annotations with a white halo at 12 px up to
    RESCALE_LABELS_MAX_TILES K tiles, one line up beside a rescaled neighbour, and are left to the hover
    beyond; the bars stay clear of the whole-row labels, which sit on a backdrop."""
    qkv = _qkv(157)
    for block_n, labelled in ((16, True), (8, False)):  # 10 K tiles, 20 K tiles
        trace = flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 16, block_n, trace_row=156, trace_head=3)
        fig = online_softmax_chart(trace, *_exact(qkv, 156, 3))
        (bars,) = [t for t in fig.data if t.type == "bar"]
        assert len(bars.x) >= 1  # the row's max grows at least once after its first tile
        factors = [a for a in fig.layout.annotations if a.text.startswith("×")]
        assert bool(factors) == labelled == (len(trace.row_steps) <= RESCALE_LABELS_MAX_TILES)
        if labelled:
            assert [a.x for a in factors] == list(bars.x)
            # A halo round the letters, not a box: a box cut gaps into the running sum's line.
            assert all(a.font.shadow and not a.bgcolor and a.font.size >= 12 and a.yanchor == "bottom"
                       for a in factors)
            # Tiles 6 and 7 both rescale (see the page's screenshot): the second label sits a line higher.
            for a, b in zip(factors, factors[1:]):
                if b.x == a.x + 1:
                    assert b.yshift - a.yshift >= 16 and b.y >= a.y
        whole_row = [a for a in fig.layout.annotations if "whole row" in a.text]
        assert len(whole_row) == 2 and all(a.bgcolor for a in whole_row)
        # The factors (at most 1) stay in the lower half, under the whole-row line of l and its label.
        assert fig.layout.yaxis3.range[1] >= 2 and fig.layout.yaxis2.range[1] < 1.5 * whole_row[1].y


def _result(name: str, ms: float) -> MethodResult:
    return MethodResult(name, "what", "CPU, 1 thread", "float32", ms, 5e-7, False)


def test_method_chart_is_a_dot_plot() -> None:
    """Dots, never bars; a linear axis ending at the data for a narrow spread, a log axis with one label per
    power of ten (app.charts.axes.log_axis) for a wide one; units in the axis title."""
    narrow = method_chart([_result("naive", 2.03), _result("sdpa", 1.51), _result("re-enactment", 19.3)])
    assert [t.type for t in narrow.data] == ["scatter"] and narrow.data[0].mode == "markers+text"
    assert narrow.layout.xaxis.type in (None, "linear") and narrow.layout.xaxis.range[0] == 0
    assert 19.3 < narrow.layout.xaxis.range[1] < 19.3 * 1.2  # not running on to 100
    assert "(ms" in narrow.layout.xaxis.title.text
    assert narrow.data[0].textposition[2] == "middle left"  # the slowest dot's label sits on its left
    wide = method_chart([_result("Triton FA2 kernel", 0.02), _result("re-enactment", 50.0)])
    assert wide.layout.xaxis.type == "log" and wide.layout.xaxis.dtick == 1 and "log scale" in wide.layout.xaxis.title.text
    assert not method_chart([]).data  # nothing ran: an empty chart, not an exception


# ---- the page under AppTest --------------------------------------------------------------------------

@pytest.fixture()
def flash_app(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The page on the CPU, on real weights where this machine has them, else on random ones."""
    from streamlit.testing.v1 import AppTest

    have_real = find_gguf() is not None or (cache_dir() / "meta.json").is_file()
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", os.environ.get("INFERSCOPE_WEIGHTS", "real" if have_real else "random"))
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    _clean(at)
    return at


def _clean(at) -> None:  # noqa: ANN001
    assert not at.exception, [e.value for e in at.exception]


def _metrics(at) -> dict[str, str]:  # noqa: ANN001
    return {m.label: m.value for m in at.metric}


def _submit(at, prompt: str, chat: bool | None = None) -> None:  # noqa: ANN001
    if chat is not None:
        at.checkbox(key="flash-chat").set_value(chat)
    at.text_area(key="flash-prompt").set_value(prompt)
    next(b for b in at.button if b.label == "Use this prompt").click().run()
    _clean(at)


def _chart(at, title: str) -> dict:  # noqa: ANN001
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if title in str(spec["layout"].get("title", {}).get("text", "")):
            return spec
    raise AssertionError(f"no chart titled {title!r}")


def _n(at) -> int:  # noqa: ANN001
    caption = next(c.value for c in at.caption if "→ N = " in c.value)
    return int(caption.split("→ N = ")[1].split(" ")[0].replace(",", ""))


@pytest.mark.slow
def test_page_memory_numbers_agree(flash_app) -> None:  # noqa: ANN001
    at = flash_app
    n = _n(at)
    m = _metrics(at)
    table = at.dataframe[0].value
    this = table[table["N"] == f"{n:,} (prompt)"].iloc[0]
    assert m["Naive: S and P for this layer (fp32)"] == this["naive S + P"]
    assert m["FA2: m and l for this layer (fp32)"] == this["FA2 m, l"]
    assert m["Ratio"] == f"{n:,}×"
    caption = next(c.value for c in at.caption if c.value.startswith("Per layer"))
    assert "S and P in fp32" in caption and "m and l in fp32" in caption and "in bf16." not in caption
    # No arrow on a share of the grid: it is not a change.
    skipped = next(x for x in at.metric if x.label == "Skipped by causality")
    assert "never loaded" in skipped.delta and skipped.proto.direction == MetricProto.MetricDirection.NONE
    # Two shares in two units, each named: of tile pairs beside of the N² scores (25 % and 85 % read as 110 %).
    assert "of tile pairs" in skipped.delta
    scores = next(x for x in at.metric if x.label == "Scores computed")
    assert scores.value.endswith("of N²") and scores.delta.endswith(f"of {n * n:,} scores")


@pytest.mark.slow
def test_page_one_token_prompt(flash_app) -> None:  # noqa: ANN001
    at = flash_app
    _submit(at, "Hi", chat=False)
    assert any(c.value.startswith("1 token → N = 1 query row and 1 key per head.") for c in at.caption)
    m = _metrics(at)
    assert m["Ratio"] == "1×" and m["Naive: S and P for this layer (fp32)"] == "72 B"
    assert at.number_input(key="flash-row-only").disabled  # the row control keeps its place
    matrix = _chart(at, "The 1×1 matrix")
    for axis in ("xaxis", "yaxis"):
        ax = matrix["layout"][axis]
        assert ax["tick0"] == 0 and ax["dtick"] == 1 and sorted(ax["range"]) == [-0.5, 0.5]
    assert any("a single K tile" in c.value for c in at.caption)
    # The split-KV caption says what its chart shows: one key, one tile, one split whatever S asks.
    at.selectbox(key="flash-bn").set_value(128).run()
    at.select_slider(key="flash-splits").set_value(8).run()
    _clean(at)
    split = next(c.value for c in at.caption if "one split runs whatever S asks" in c.value)
    assert "stay visible" not in split and int(_metrics(at)["Programs at batch 1"]) == 3
    _submit(at, "Hello there", chat=False)  # two tokens: ticks at 0 and 1, never at 0.5
    ax = _chart(at, "The 2×2 matrix")["layout"]["xaxis"]
    assert ax["dtick"] == 1 and ax["range"] == [-0.5, 1.5]


@pytest.mark.slow
def test_page_followed_row_follows_a_new_prompt(flash_app) -> None:  # noqa: ANN001
    at = flash_app
    n = _n(at)
    assert at.slider(key="flash-row").value == n - 1  # first visit: the last row
    at.slider(key="flash-row").set_value(20).run()
    _clean(at)
    assert at.slider(key="flash-row").value == 20
    at.selectbox(key="flash-bm").set_value(32).run()  # other controls keep the chosen row
    assert at.slider(key="flash-row").value == 20
    _submit(at, "Hi", chat=False)  # one token: row 0, the only one
    _submit(at, "word " * 1500, chat=True)  # 1024 tokens: the last row again, not row 0
    n = _n(at)
    assert n == 1024 and at.slider(key="flash-row").value == 1023 and at.slider(key="flash-row").max == 1023
    assert any(c.value.startswith("Row 1023 visits") for c in at.caption)
    cache = next(c.value for c in at.caption if c.value.startswith("All heads of layer"))
    assert "72.0 MiB for this layer at N = 1,024" in cache and "At a few hundred tokens" not in cache
    assert len(at.warning) == 1 and at.warning[0].value.endswith("tokens; this page uses the first 1,024.")
    _submit(at, "")  # emptied: the same 1024 tokens stay, the same row, and the cut is not announced again
    assert [e.value for e in at.error][0].endswith("the last prompt (1,024 tokens).") and not at.warning
    assert at.slider(key="flash-row").value == 1023


@pytest.mark.slow
def test_page_empty_prompt_keeps_the_controls(flash_app) -> None:  # noqa: ANN001
    at = flash_app
    before = _metrics(at)
    charts = len(at.get("plotly_chart"))
    _submit(at, "   ")
    assert [e.value for e in at.error] == [
        f"Type a prompt: FlashAttention needs at least one token. Until then the page shows the last prompt "
        f"({_n(at)} tokens)."]
    assert {s.key for s in at.slider} >= {"flash-layer", "flash-row"}
    assert {s.key for s in at.selectbox} >= {"flash-head", "flash-bm", "flash-bn"}
    assert _metrics(at) == before and len(at.get("plotly_chart")) == charts


@pytest.mark.slow
def test_page_charts_follow_presentation_mode(flash_app) -> None:  # noqa: ANN001
    """In presentation mode every chart of the page gets the larger template, and the row chart's labels
    carry no fixed size of their own (make_subplots set its titles to 16 px, the annotations were 11 px),
    but for the rescale factors' 12 px, which grow with the rest."""
    at = flash_app
    at.session_state["presentation"] = True
    at.run()
    _clean(at)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(specs) >= 4
    assert all(s["layout"]["template"]["layout"]["font"]["size"] == 20 for s in specs)
    online = next(s for s in specs if any("Running max" in a.get("text", "") for a in s["layout"].get("annotations", [])))
    labels = online["layout"]["annotations"]
    assert all("size" not in a.get("font", {}) for a in labels if not a["text"].startswith("×"))
    factors = [a for a in labels if a["text"].startswith("×")]
    assert factors and all(a["font"]["size"] == round(12 * PRESENT_FONT_SIZE / FONT_SIZE) for a in factors)


def test_kernel_tiles_text_follows_the_kernel_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings caption names the GPU kernel's tiles from its configs, so a retune cannot leave it stale."""
    import kernels.prefill_attention_triton as fa

    assert flash_compare.kernel_tiles_text() == "64 × 64 tiles (128 × 64 for prompts over 2,048 tokens)"
    monkeypatch.setattr(fa, "LONG_FROM", 4096)
    monkeypatch.setattr(fa, "LONG_CONFIG", dict(fa.LONG_CONFIG, BLOCK_N=32))
    assert flash_compare.kernel_tiles_text() == "64 × 64 tiles (128 × 32 for prompts over 4,096 tokens)"
