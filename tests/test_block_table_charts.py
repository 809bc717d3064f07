"""The logical → physical graph keeps its block labels apart: at 1280 pixels the labels of 11 blocks in a
276-pixel chart ran into each other ("0 | 1", "1 | 2", ... in the browser's overlap check)."""
from __future__ import annotations

from hypothesis import given, strategies as st

from app.charts.block_tables import (BLOCK_LABEL_PX, GRAPH_MARGIN_PX, GRAPH_MAX_PX, GRAPH_Y_SPAN, block_table_grid,
                                     graph_height, label_stride, mapping_graph, mapping_graph_height)
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams


@given(st.integers(1, 400), st.integers(120, 700))
def test_labelled_blocks_stand_apart_and_the_chart_stays_bounded(num_blocks: int, at_least: int) -> None:
    height = graph_height(num_blocks, at_least)
    assert at_least <= height <= max(at_least, GRAPH_MAX_PX)
    stride = label_stride(num_blocks, height)
    if num_blocks > 1:
        apart = stride * (height - GRAPH_MARGIN_PX) / GRAPH_Y_SPAN / (num_blocks - 1)
        assert apart >= BLOCK_LABEL_PX - 1e-6
    if stride > 1:  # labels are thinned only once the chart is as tall as it may get
        assert height == max(at_least, GRAPH_MAX_PX)


def test_every_block_labelled_while_they_fit(tiny_weights) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineConfig(num_blocks=64, block_size=2, max_model_len=256), tiny_weights)
    engine.add_request("one two three four five six seven eight nine ten eleven twelve", SamplingParams(max_tokens=8))
    engine.add_request("a b c d e f g h i j k l m n o p q r s t", SamplingParams(max_tokens=8, n=2, temperature=1.0,
                                                                                  seed=1))
    record = engine.step()
    blocks = sorted({b for t in record.block_tables for b in t.block_ids})
    assert len(blocks) >= 11  # as many as the page had when its labels collided
    h = mapping_graph_height(record, 276)
    fig = mapping_graph(record, ["r0", "r1"], h)
    labels = [t for t in fig.data[-1].text if t]
    assert labels == [str(b) for b in blocks]
    assert len(fig.data[-1].hovertext) == len(blocks)


def test_an_empty_table_panel_says_why(tiny_weights) -> None:  # noqa: ANN001
    """Before a prompt is admitted nothing holds blocks; after the last request finishes its blocks are free
    again, and the panel says so instead of looking broken."""
    engine = LLMEngine(EngineConfig(num_blocks=16, block_size=4, max_model_len=64), tiny_weights)
    engine.add_request("one two three", SamplingParams(max_tokens=2, ignore_eos=True))
    records = [engine.step() for _ in range(3)]
    assert records[0].block_tables and not records[-1].block_tables
    text = block_table_grid(records[-1], ["r0"]).layout.annotations[0].text
    assert text == "all requests finished: their blocks are on the free list"
