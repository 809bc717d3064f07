"""The activation quantization page: registered, its tables and charts from a tiny run, and the page under AppTest
(random weights, CPU, a small run put in place of the default): every section, a redraw that runs nothing, bad
input and a failing run as messages that keep the last results."""
from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from engine.act_quant.lab import VARIANTS, ActLabSettings, run_lab

import app.sections.act_quant as section
from app.analysis.act_quant import (alpha_note, channel_view, fmt_times, fp8_speedup, median_channel_levels,
                                    outlier_frame, result_json, results_frame, worst_layer)
from app.charts.act_quant import (alpha_figure, channel_figure, outlier_ratio_figure, quality_figure, tick_label,
                                  variant_color)
from app.formatting import NO_VALUE
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app, submit_blank_prompt  # noqa: F401 (fixture)

PAGE, PREFIX = "18_activation_quantization.py", "aq"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Quantize and measure"
SMALL = ActLabSettings(variants=("int8-tensor", "int8-sq", "nvfp4"), sweep="int8-tensor", calibration_tokens=64,
                       max_new_tokens=3)


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "activation-quantization")
    assert spec.available and spec.section == "Serving post-trained models"


@pytest.fixture(scope="module")
def tiny_result(tiny_weights):  # noqa: ANN001, ANN201
    return run_lab(tiny_weights, ActLabSettings(calibration_tokens=128, max_new_tokens=4))


def test_tables_and_charts_of_a_run(tiny_result) -> None:  # noqa: ANN001
    frame = results_frame(tiny_result)
    assert list(frame["Format"]) == [v.label for v in tiny_result.outcomes]
    assert frame["Chat KL"].iloc[0] == pytest.approx(0, abs=1e-9) and (frame["Chat KL"].iloc[1:] > 0).all()
    assert frame["Answer leaves at"].iloc[0] == NO_VALUE and frame["A bits"].iloc[0] == 16
    outliers = outlier_frame(tiny_result)
    assert len(outliers) == 2 * 4 and (outliers[["mean", "max"]] >= 1).all().all()
    layer = worst_layer(tiny_result, "down", "max")
    view = channel_view(tiny_result, layer, "down", "max")
    assert len(view.before) == len(view.after) == 128 and len(view.outliers) == 1
    assert view.before[view.outliers[0]] == view.before.max()
    figs = [channel_figure(view), outlier_ratio_figure(outliers, "max"), quality_figure(tiny_result),
            alpha_figure(tiny_result)]
    for fig in figs:
        assert isinstance(fig, go.Figure) and fig.layout.title.text
        assert fig.layout.legend.y is None or fig.layout.legend.y < 0
    # Horizontal bars, one line of label each (three lines under upright bars were turned 90° on a projector).
    assert len(figs[2].data) == 2 and len(figs[2].data[0].y) == len(tiny_result.variants)
    assert figs[2].data[0].orientation == "h" and not any("<br>" in y for y in figs[2].data[0].y)
    assert len(figs[3].data[-2].x) == 10  # the sweep's alphas (then the lowest one's star)
    assert fp8_speedup() == pytest.approx(2, rel=0.01)
    assert {variant_color(v) for v in VARIANTS.values()} and not any("<br>" in tick_label(v) for v in VARIANTS.values())
    assert tick_label(VARIANTS["int8-sq"]) == "INT8 per-tensor + SQ"
    assert tick_label(VARIANTS["w8"]) == "INT8 weights only"
    data = json.loads(result_json(tiny_result))
    assert [v["key"] for v in data["variants"]] == [None, *tiny_result.settings.variants]
    assert len(data["alpha_sweep"]) == 10


def test_page_runs_and_keeps_results_on_bad_input(random_app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    random_app.session_state[f"{PREFIX}-settings"] = SMALL
    at = open_page(random_app, PAGE)
    assert_clean(at)
    heads = [s.value for s in at.subheader]
    assert heads[0].startswith("The difficulty: a few channels up to ") and heads[0].endswith("× the median")
    assert heads[1:] == ["What each format keeps", "What each format answers", "Why it matters"]
    # The heading's ratio is the run's largest, and the chart opens on the input that has it.
    top = max(at.session_state[f"page-cache:{PREFIX}"]["stored"].value.outliers, key=lambda r: r.max_ratio)
    assert heads[0] == f"The difficulty: a few channels up to {fmt_times(top.max_ratio)} the median"
    assert at.selectbox(key=f"{PREFIX}-input").value == top.input
    assert len(at.get("plotly_chart")) == 4  # channels, ratios, distance, alpha sweep
    text = " ".join(c.value for c in at.caption)
    assert "simulated in fp32" in text and "not measured here" in text
    # Another layer input and statistic redraw from the run (nothing runs again).
    monkeypatch.setattr(section, "stored_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    at.selectbox(key=f"{PREFIX}-input").set_value("down").run()
    at.radio(key=f"{PREFIX}-stat").set_value("mean").run()
    assert_clean(at)
    # Bad input: a message, and the results stay.
    submit_blank_prompt(at, f"{PREFIX}-prompt", SUBMIT, answered_by="the models")
    assert len(at.get("plotly_chart")) == 4
    at.multiselect(key=f"{PREFIX}-variants").set_value([])
    at.text_input(key=f"{PREFIX}-prompt").set_value("Name a colour.")
    at.button(key=SUBMIT).click().run()
    assert [e.value for e in at.error] == ["Pick at least one format. The results below are the last run's."]

    # A failing run is a message; the last results stay on screen.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(section, "stored_lab", broken)
    at.multiselect(key=f"{PREFIX}-variants").set_value(["fp8-tensor"])
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The run failed: out of memory (simulated)"]
    assert len(at.get("plotly_chart")) == 4


def test_ratios_have_one_format_and_extreme_alphas_are_explained() -> None:
    """"174.3×" sat beside "3,727×": one format everywhere. At α = 0 (or near 0 or 1) the page says why smoothing can
    hurt wherever α shows, not only in the sweep's caption."""
    assert [fmt_times(r) for r in (47450.2, 6001.0, 174.3, 3.24)] == ["47,450×", "6,001×", "174×", "3.2×"]
    assert "not “no smoothing”" in alpha_note(0.0) and "1 / max|W_j|" in alpha_note(0.0)
    assert "α = 0.1, s_j = max|X_j|^0.1 / max|W_j|^0.9" in alpha_note(0.1)
    assert alpha_note(0.5) is None and alpha_note(0.3) is None
    assert "into the weights' columns" in alpha_note(1.0) and alpha_note(0.9)


def test_a_run_at_alpha_zero_says_why_without_a_sweep(random_app: AppTest) -> None:
    random_app.session_state[f"{PREFIX}-settings"] = ActLabSettings(
        variants=("int8-tensor", "int8-sq"), alpha=0.0, sweep=None, calibration_tokens=64, max_new_tokens=2)
    at = open_page(random_app, PAGE)
    assert_clean(at)
    captions = [c.value for c in at.caption]
    assert sum(alpha_note(0.0) in c for c in captions) == 2  # under the channels and under the chat KL
    assert len(at.get("plotly_chart")) == 3  # no sweep chart, so no sweep caption either


def test_the_median_channels_share_of_int8_levels_reads_sensibly() -> None:
    """At 3,727× the caption printed "about 0.0 of its levels": below half a level it says the values round to 0."""
    assert "0.034 of one level: every value it holds rounds to zero" in median_channel_levels(3727)
    assert "about 4 of its 127 levels: most of its values round" in median_channel_levels(30)
    assert median_channel_levels(10).endswith("about 13 of its 127 levels.")
