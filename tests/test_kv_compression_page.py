"""The KV cache quantization and eviction page under AppTest (random weights, CPU): the default run's
sections, the eviction preset with its kept-token map, bad input as messages that keep the last results;
plus the page's table parsing, memory table and charts on a small real lab run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

import engine.result_store as store
from engine.kv_compression import FORMATS, KVLab, Variant
from engine.kv_compression.policies import EvictionPolicy

from app.analysis.kv_compression import (PRESETS, REFERENCE, few_tokens_note, kept_counts, kl_chart_note,
                                         memory_frame, preset_rows, rows_to_variants, summary_frame)
from app.charts.kv_compression import (channel_figure, kept_map_figure, kl_positions_figure, roundtrip_figure,
                                       share_ticks, sink_figure, tradeoff_figure)
from app.registry import PAGES
from app.widgets.answer_rows import answer_rows_html, text_segments
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)

PAGE, PREFIX = "13_kv_compression.py", "kvq"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Run on the model"
SECTIONS = ["Memory against quality", "What each cache writes", "Why keys are harder to quantize than values",
            "Which tokens each policy keeps", "What fits",
            "Fewer bits, faster decoding? Only if the kernel reads the bits, and even then not for free"]


def _summary(at: AppTest):  # noqa: ANN202 (a DataFrame)
    """The results table (the variant editor is a dataframe too)."""
    return next(d.value for d in at.dataframe if "Variant" in d.value.columns)


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "kv-quantization-eviction")
    assert spec.available and spec.section == "Memory and attention"


def test_table_rows_become_variants_or_sentences() -> None:
    variants, errors = rows_to_variants(preset_rows("Storage formats"), "float32")
    assert not errors and [v.format for v in variants] == ["bf16", "fp8", "int8", "int4", "int2", "int2-kivi"]
    variants, errors = rows_to_variants(preset_rows("Eviction at a 64-token budget"), "float32")
    assert not errors and {v.format for v in variants} == {"fp32"}
    assert [v.policy.kind for v in variants] == ["window", "sinks", "h2o"] and variants[0].policy.budget == 64
    assert rows_to_variants([dict(format=REFERENCE, policy="none", budget=0, sinks=4)], "bfloat16")[0][0].format == "bf16"
    # An empty row the editor added is skipped, not an error.
    assert rows_to_variants([dict(format="int8"), dict(format=None, policy=None, budget=None, sinks=None)],
                            "float32") == ([Variant("int8")], [])
    bad = [([dict(format="int2-kivi", policy="h2o", budget=64, sinks=4)], "Row 1: .*cannot drop single tokens"),
           ([dict(format="int8", policy="window", budget=3, sinks=4)], "Row 1: a KV budget of 3 tokens is too small"),
           ([dict(format="int8"), dict(format="int8", policy="sinks", budget=64, sinks=64)], "Row 2: attention sinks"),
           ([dict(format="int8", policy="window", budget=float("nan"), sinks=4)], "Row 1: the budget is empty"),
           ([dict(format="int8", policy="window", budget=12.5, sinks=4)], "whole number"),
           ([dict(format="int8"), dict(format="int8")], "Row 2 repeats an earlier row"),
           ([dict(format="int8", policy="window", budget=8 + i, sinks=4) for i in range(7)], "at most 6"),
           ([], "at least one row")]
    for rows, match in bad:
        _, errors = rows_to_variants(rows, "float32")
        assert errors and any(__import__("re").search(match, e) for e in errors), (rows, errors)
        assert all("\n" not in e and "Traceback" not in e for e in errors)


def test_memory_table_follows_the_formula() -> None:
    from engine.config import ModelConfig
    frame = memory_frame(ModelConfig(), 1.0, 1024).set_index("Format")
    assert frame.loc["BF16", "Bytes per token"] == 2 * 30 * 3 * 64 * 2 == 23040
    assert frame.loc["FP32", "Fits vs BF16"] == pytest.approx(0.5)
    # INT4 in groups of 32: half a byte a number plus an fp16 scale and zero per 32 numbers.
    assert frame.loc["INT4 (groups of 32)", "Bytes per token"] == 2 * 30 * 3 * (32 + 2 * 2 * 2)
    assert frame.loc["BF16", "Tokens that fit"] == 2**30 // 23040
    assert frame.loc["BF16", "Sequences of 1,024 tokens"] == 2**30 // 23040 // 1024
    assert len(frame) == len(FORMATS)


@pytest.fixture(scope="module")
def small_run(random_weights):  # noqa: ANN001, ANN201
    lab = KVLab(random_weights)
    ids = random_weights.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about the sea. " * 6}])
    variants = [Variant("int4"), Variant("int2-kivi"), Variant("fp32", EvictionPolicy("sinks", 16, 2))]
    return lab.run(ids, variants, 6), random_weights


def test_summary_and_charts_of_a_run(small_run) -> None:  # noqa: ANN001
    result, weights = small_run
    frame = summary_frame(result)
    assert list(frame["Variant"])[0].startswith("Reference: FP32") and len(frame) == 4
    assert frame.loc[0, "Top-1 match"] == 1.0 and frame.loc[0, "KL (nats)"] == 0.0
    assert frame.loc[3, "Tokens"] == 16
    # Eviction shrinks the cache as surely as fewer bits: 16 of the reference's tokens, in FP32.
    held = int(result.variants[0].cached_tokens[-1])
    assert frame.loc[3, "Size vs BF16"] == pytest.approx(2 * 16 / held) and frame.loc[0, "Size vs BF16"] == 2
    assert frame.loc[1, "Bytes/token"] == pytest.approx(FORMATS["int4"].bytes_per_token(30, 3, 64))
    # Where a text leaves the reference's, counted from 1 as on the other pages.
    for i, r in enumerate(result.variants):
        div = r.first_divergence(result.reference_tokens)
        assert frame.loc[i, "Text leaves at"] == ("never" if div is None else f"token {div + 1}")
    assert frame.loc[0, "Text leaves at"] == "never"
    tok = weights.tokenizer
    figures = [tradeoff_figure(result), kl_positions_figure(result, tok.decode_token),
               channel_figure(result), roundtrip_figure(result, list(FORMATS)), sink_figure(result, 3, ["x"] * 400)]
    for fig in figures:
        assert isinstance(fig, go.Figure) and fig.layout.title.text
    assert len(figures[0].data) == 4 and len(figures[1].data) == 3  # the reference has no KL line
    # Round-trip errors as horizontal bars: each label at its own bar's end (upright, "50.9%42.5%" ran together).
    assert all(b.orientation == "h" and b.textposition == "outside" for b in figures[3].data)
    # The KL chart counts generated tokens from 1 too: the first point is the second token, the prefill's own
    # prediction (step 0) having seen no compressed cache.
    assert list(figures[1].data[0].x) == list(range(2, len(result.variants[1].kl) + 1))
    r = result.variants[3]
    counts = kept_counts(r.kept, r.kept.shape[0] - 1, result.prompt_len + r.kept.shape[0] - 1)
    assert counts.shape[0] == 30 and (counts.sum(axis=1) == 16 * 3).all()
    assert (counts[:, :2] == 3).all()  # the two sinks, in every head of every layer
    fig = kept_map_figure(counts, ["t"] * counts.shape[1], result.prompt_len, 3, "title")
    assert np.array_equal(np.asarray(fig.data[0].z), counts)
    # One flat band per head count: "none" gets a quarter of the colour bar (it had the bottom 1 %)
    scale = [tuple(stop) for stop in fig.data[0].colorscale]
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-0.5, 3.5) and scale[:2] == [(0.0, "#F1F3F6"), (0.25, "#F1F3F6")]


def test_text_segments_split_at_the_first_difference() -> None:
    decode = lambda ids: "".join(chr(97 + i) for i in ids)  # noqa: E731
    assert text_segments([0, 1, 2], [0, 1, 2], decode) == [("abc", True)]
    assert text_segments([0, 1, 5, 6], [0, 1, 2, 3], decode) == [("ab", True), ("fg", False)]
    assert text_segments([4], [0], decode) == [("e", False)]


def test_page_runs_then_evicts_and_bad_input_keeps_the_results(random_app: AppTest, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One AppTest (each page load runs the default comparison, ~12 s): the default run's sections, then the
    eviction preset, then bad input. Runs are kept in a folder of its own, so none is an earlier suite's."""
    monkeypatch.setattr(store, "memo_dir", lambda: tmp_path)
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert [s.value for s in at.subheader] == SECTIONS
    table = _summary(at)
    assert len(table) == 1 + len(PRESETS["Storage formats"])
    assert table["Variant"].iloc[0].startswith("Reference")
    assert "torch path on every device" in " ".join(c.value for c in at.caption)
    # trade-off, KL by position, channels, round-trip errors, sink; the fused kernel's H200 sweep, one call's times
    # and that call on the roofline
    assert len(at.get("plotly_chart")) == 8
    # No GPU here: the kernel section says so and shows the H200's measured call (six paths).
    assert any("No CUDA GPU on this server" in c.value for c in at.caption)
    kernel_call = next(d.value for d in at.dataframe if "bytes ratio" in d.value.columns)
    assert len(kernel_call) == 6 and kernel_call["path"].iloc[0] == "engine kernel · BF16"
    at.selectbox(key=f"{PREFIX}-preset").set_value("Eviction at a 64-token budget").run()
    at.number_input(key=f"{PREFIX}-tokens").set_value(4)
    at.button(key=SUBMIT).click().run()
    assert_clean(at)
    table = _summary(at)
    assert len(table) == 4 and (table["Tokens"].iloc[1:] == 64).all()
    picker = at.selectbox(key=f"{PREFIX}-evict-variant")
    assert picker.options[0].startswith("FP32 · window 64") and picker.value == "FP32 · H2O 64"
    assert len(at.get("plotly_chart")) == 9  # the kept-token map joins the eight
    # An empty prompt is a message; the eviction run stays on screen.
    at.text_area(key=f"{PREFIX}-prompt").set_value("   ")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The prompt is empty: type something for the model to answer."]
    assert len(_summary(at)) == 4
    # One token: nothing to scrub, every section still draws, and the page says why every variant looks lossless
    # and where the KL chart and the attention profile went.
    at.text_area(key=f"{PREFIX}-prompt").set_value("Say hi.")
    at.number_input(key=f"{PREFIX}-tokens").set_value(1)
    at.button(key=SUBMIT).click().run()
    assert_clean(at)
    assert [s.value for s in at.subheader] == SECTIONS and len(_summary(at)) == 4
    assert any(i.value == few_tokens_note(1, 1) for i in at.info)
    captions = [c.value for c in at.caption]
    assert kl_chart_note(1) in captions and any(c.startswith("No attention profile") for c in captions)
    assert not any("decoding every row together" in m.value for m in at.markdown)
    # A run that fails unexpectedly is a message; the page stays up with the last results.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    working = KVLab.run
    monkeypatch.setattr(KVLab, "run", broken)
    at.text_area(key=f"{PREFIX}-prompt").set_value("Say hello twice.")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The run failed: out of memory (simulated)"]
    assert len(_summary(at)) == 4
    monkeypatch.setattr(KVLab, "run", working)  # not undo(): that would also drop random_app's settings
    # Too long a prompt: the lab's own sentence.
    at.text_area(key=f"{PREFIX}-prompt").set_value("word " * 2000)
    at.button(key=SUBMIT).click().run()
    assert any("at most 1536" in e.value for e in at.error) and len(_summary(at)) == 4


def test_answer_rows_keep_each_answer_on_its_own_row() -> None:
    """A newline in an answer is a grey ⏎ inside its row: raw line breaks left blank gaps (and a blank line once
    ended the HTML block, dropping the rest of the answer out of its row)."""
    words = {1: "Hi", 2: "\n\n", 3: "there", 4: "<b>"}
    decode = lambda ids: "".join(words[i] for i in ids)  # noqa: E731
    out = answer_rows_html([("full", "#000", [1, 2, 3]), ("other", "#111", [1, 2, 4])], [1, 2, 3], decode, "t")
    assert "\n" not in out and out.count('class="t-row"') == 2 and out.count("⏎") == 4
    assert "&lt;b&gt;" in out and '<span class="t-diff">&lt;b&gt;</span>' in out


def test_one_or_two_generated_tokens_are_explained() -> None:
    """The first token comes from the exact prefill: with one, every variant reads 100 % and KL 0, and the page says
    why instead of showing a lossless-looking table and silently dropping the KL chart."""
    assert "Tokens to generate is 1" in few_tokens_note(1, 1) and "at least 2 tokens" in few_tokens_note(1, 1)
    assert few_tokens_note(1, 32).startswith("The reference ended its answer at its first token")
    assert few_tokens_note(2, 32) is None
    assert "single point" in kl_chart_note(2) and kl_chart_note(1) and kl_chart_note(3) is None


def test_sink_chart_axes_and_labels_read_apart() -> None:
    """The right panel's axis on its right (its title sat over the left panel's bars), ticks with the decimals
    their step needs (".0%" read "0%, 1%, 1%, 2%"), and position 0's label off the line on a white ground."""
    from types import SimpleNamespace
    assert share_ticks(0.02) == {"tickmode": "linear", "tick0": 0, "dtick": 0.005, "tickformat": ".1%"}
    assert share_ticks(0.03)["dtick"] == 0.01 and share_ticks(0.03)["tickformat"] == ".0%"  # 0%, 1%, 2%, 3%
    assert share_ticks(0.8)["tickformat"] == ".0%" and share_ticks(0.004)["tickformat"] == ".1%"
    assert share_ticks(0.001)["tickformat"] == ".2%"
    flat = np.full(40, 0.025)  # layer 0: position 0 no higher than the rest
    result = SimpleNamespace(sink_share=np.linspace(0.01, 0.7, 30), last_attention=np.tile(flat, (30, 1)))
    fig = sink_figure(result, 0, ["x"] * 40)
    assert fig.layout.yaxis2.side == "right" and fig.layout.yaxis2.tickformat == ".1%"
    assert fig.layout.yaxis.tickformat == ".0%"
    [label] = fig.layout.annotations
    assert label.text == "position 0: 2.5%" and label.ay < 0 and label.bgcolor
    sink = flat.copy()
    sink[0] = 0.6
    result.last_attention = np.tile(sink, (30, 1))
    assert sink_figure(result, 20, ["x"] * 40).layout.annotations[0].ay == 0  # above the rest: beside the marker


def test_a_variant_on_an_earlier_ones_spot_is_drawn_smaller() -> None:
    from app.charts.kv_compression import _covers_earlier
    xs, ys = [100.0, 50.0, 50.5, 25.0], [1e-6, 0.01, 0.0102, 0.5]
    assert [_covers_earlier(xs, ys, i) for i in range(4)] == [False, False, True, False]
