"""The weight-only quantization page: registered, its tables and charts from a small run, and the page under
AppTest (random weights, CPU, a small run put in place of the default): every section, bad input and a failing
run as messages that keep the last results."""
from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from engine.weight_quant.lab import LabSettings, run_lab

import app.sections.weight_quant as section
from app.analysis.weight_quant import (BENCH_PATH, calibration_text, decode_bound_tok_s, fit_note, grid_text,
                                       group_text, layer_frame, load_bench, outlier_stats, result_json,
                                       results_frame, worst_ratio_layer)
from app.charts.weight_quant import (activation_figure, alpha_figure, bits_sweep_figure, layer_error_figure,
                                     quality_figure)
from app.formatting import NO_VALUE
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app, submit_blank_prompt  # noqa: F401 (fixture)

PAGE, PREFIX = "15_weight_quantization.py", "wq"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Quantize and measure"
SMALL = LabSettings(methods=("rtn", "awq"), bits=4, group=64, calibration_tokens=64, max_new_tokens=4)


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "weight-quantization")
    assert spec.available and spec.section == "Serving post-trained models"


def test_the_committed_bench_file_draws_every_bit_width(tmp_path) -> None:  # noqa: ANN001
    frame = load_bench(BENCH_PATH)
    assert frame is not None and sorted(set(frame["bits"])) == [3, 4, 8]
    assert set(frame["method"]) == {"Round-to-nearest", "AWQ", "GPTQ"} and set(frame["calibration"]) == {"chat", "prose"}
    fig = bits_sweep_figure(frame)
    assert len(fig.data) == 6 and fig.layout.title.text
    bad = tmp_path / "bad.json"
    for text in ("not json", '{"weights": "real", "rows": [{"bits": 4}]}', '{"weights": "random", "rows": []}'):
        bad.write_text(text)
        assert load_bench(bad) is None, text
    assert load_bench(tmp_path / "missing.json") is None


@pytest.fixture(scope="module")
def tiny_result(tiny_weights):  # noqa: ANN001, ANN201
    return run_lab(tiny_weights, LabSettings(bits=3, group=32, calibration_tokens=128, max_new_tokens=6))


def test_tables_and_charts_of_a_run(tiny_result) -> None:  # noqa: ANN001
    frame = results_frame(tiny_result)
    assert list(frame["Weights"]) == [v.label for v in tiny_result.outcomes] and len(frame) == 4
    assert frame["Chat KL"].iloc[0] == pytest.approx(0, abs=1e-9) and (frame["Chat KL"].iloc[1:] > 0).all()
    assert frame["Answer leaves at"].iloc[0] == NO_VALUE
    # The decode bound is bandwidth over bytes: fewer bytes, a higher bound.
    assert (frame["H200 tok/s bound"].iloc[1:] > frame["H200 tok/s bound"].iloc[0]).all()
    assert decode_bound_tok_s(1_000_000, 4e12) == pytest.approx(4e6)
    layers = layer_frame(tiny_result)
    assert len(layers) == 3 * 2 * 4 and layers[layers["method"] == "AWQ"]["alpha"].notna().all()
    inp = "down"
    layer = worst_ratio_layer(tiny_result.profile, inp)
    mags, ratio, top = outlier_stats(tiny_result.profile, layer, inp)
    assert ratio >= 1 and top >= 1 and len(mags) == 128
    figs = [quality_figure(tiny_result), layer_error_figure(layers), alpha_figure(layers),
            activation_figure(mags, top, layer, inp, ratio)]
    for fig in figs:
        assert isinstance(fig, go.Figure) and fig.layout.title.text
    assert len(figs[0].data) == 2 and len(figs[0].data[0].x) == 3 and len(figs[1].data) == 3 * 4
    data = json.loads(result_json(tiny_result))
    assert [v["method"] for v in data["variants"]] == [None, "rtn", "awq", "gptq"]


def test_texts_follow_the_methods_that_ran() -> None:
    """Round-to-nearest alone is calibrated on nothing, and GPTQ's overfitting is named only when GPTQ ran; the grid
    is "per channel" in the form, the sentence and the checkpoints' labels ("INT2 per channel")."""
    alone = calibration_text(("rtn",), 2048, "chat")
    assert alone.startswith("round-to-nearest uses no calibration: 2,048 tokens") and "calibrated on" not in alone
    assert calibration_text(("rtn", "awq", "gptq"), 2048, "chat") == ("AWQ and GPTQ calibrated on 2,048 tokens of "
                                                                       "**chat** text (round-to-nearest uses none)")
    assert calibration_text(("gptq",), 512, "prose") == "GPTQ calibrated on 512 tokens of **prose** text"
    assert "GPTQ's risk" in fit_note(("rtn", "gptq_act")) and "GPTQ's risk" not in fit_note(("rtn",))
    assert fit_note(("rtn",)).startswith("round-to-nearest never looks") and "AWQ" in fit_note(("awq",))
    from engine.weight_quant.grid import Grid
    assert group_text(0) == "per channel" and Grid(2, 0).label == "INT2 per channel"
    assert grid_text(0).startswith("one scale per output channel (per channel") and grid_text(32).startswith("groups")


def test_page_runs_and_keeps_results_on_bad_input(random_app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One AppTest with a small run in place of the default (the default takes ~50 s on this CPU)."""
    random_app.session_state[f"{PREFIX}-settings"] = SMALL
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert [s.value for s in at.subheader] == ["Size against quality", "What each checkpoint answers",
                                               "Why some weights matter more: activation outliers"]
    assert [m.label for m in at.metric] == ["Full precision (16-bit)", "Round-to-nearest", "AWQ"]
    # The texts follow the methods that ran: AWQ calibrated, round-to-nearest not; no GPTQ, so not its risk.
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "AWQ calibrated on" in text and "(round-to-nearest uses none)" in text and "GPTQ's risk" not in text
    assert at.selectbox(key=f"{PREFIX}-group").options == ["per channel", "32", "64"]
    assert len(at.get("plotly_chart")) == 5  # distance, every bit width (bench), layer errors, alphas, channels
    assert "CPU" in " ".join(c.value for c in at.caption)
    # Another layer input redraws from the run (nothing runs again).
    monkeypatch.setattr(section, "stored_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    at.selectbox(key=f"{PREFIX}-outlier-input").set_value("down").run()
    assert_clean(at)
    # Bad input: a message, and the results stay.
    submit_blank_prompt(at, f"{PREFIX}-prompt", SUBMIT, answered_by="the models")
    assert len(at.metric) == 3
    # A failing run is a message; the last results stay on screen.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(section, "stored_lab", broken)
    at.text_input(key=f"{PREFIX}-prompt").set_value("Name a colour.")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The run failed: out of memory (simulated)"]
    assert len(at.metric) == 3 and len(at.get("plotly_chart")) == 5
