"""The KV compression page's kernel section off the GPU: the H200's measured timings read back from the bench's
JSON, the tables and charts built from them, and the sentence that sums them up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.analysis.kv_quant_kernel import MEASURED_H200, call_frame, load_measured, sweep_frame
from app.charts.kv_quant_kernel import call_figure, sweep_figure
from kernels.quant_decode_timing import BF16_BYTES_PER_TOKEN, FormatTiming, QuantDecodeTimings


def _timings(batch: int, context: int, engine_us: float, fused_us: dict[str, float]) -> QuantDecodeTimings:
    sizes = {"bf16": 768, "fp8": 396, "int8": 396, "int4": 240}
    return QuantDecodeTimings(batch, context, "test GPU", engine_us, 20 * engine_us,
                              tuple(FormatTiming(f, sizes[f], us, 1e-3) for f, us in fused_us.items()), 2)


def test_call_frame_compares_every_path_with_the_engine_kernel() -> None:
    t = _timings(64, 8192, 100.0, {"bf16": 100.0, "fp8": 50.0, "int8": 80.0, "int4": 200.0})
    frame = call_frame(t)
    assert list(frame["fmt"]) == ["bf16", "bf16", "fp8", "int8", "int4", "unfused"]
    assert list(frame["speed-up"].round(3)) == [1.0, 1.0, 2.0, 1.25, 0.5, 0.05]
    assert frame["bytes ratio"].iloc[4] == pytest.approx(BF16_BYTES_PER_TOKEN / 240)
    assert frame["KV read (MB)"].iloc[2] == pytest.approx(64 * 8192 * 396 / 1e6)
    assert frame["TB/s"].iloc[2] == pytest.approx(64 * 8192 * 396 / 50e-6 / 1e12)
    assert frame["TB/s"].isna().iloc[-1]  # the unfused path also writes and reads a copy: no pool bandwidth
    fig = call_figure(frame, 64, 8192, "test")
    assert len(fig.data[0].y) == 6 and fig.data[0].y[-1] == frame["path"].iloc[0]  # the engine's bar on top


def test_sweep_frame_keeps_one_batch() -> None:
    timings = [_timings(64, L, 100.0, {"bf16": 100.0, "fp8": 50.0, "int8": 80.0, "int4": 200.0})
               for L in (1024, 4096)] + [_timings(1, 4096, 10.0, {"bf16": 10.0, "fp8": 9.0, "int8": 9.0, "int4": 9.0})]
    frame = sweep_frame(timings, 64)
    assert sorted(frame["context"].unique()) == [1024, 4096] and len(frame) == 8
    fig = sweep_figure(frame, 64, "test")
    assert {t.name for t in fig.data if t.showlegend is not False} == {"BF16", "FP8", "INT8", "INT4"}


def test_measured_h200_file_reads_back() -> None:
    """The committed bench run reads back whole: every shape with all four formats, each checked against the
    reference where the bench checked it."""
    device, timings = load_measured()
    data = json.loads(Path(MEASURED_H200).read_text())
    assert device == data["device"] and len(timings) == len(data["rows"])
    for t in timings:
        assert {f.fmt for f in t.formats} == {"bf16", "fp8", "int8", "int4"}
        assert all(f.us > 0 for f in t.formats) and t.engine_bf16_us > 0
        if t.context <= 8192:
            assert all(f.rel_err < 2e-2 for f in t.formats)


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert load_measured(tmp_path / "absent.json") is None


def test_roofline_points_divide_the_call_flops_by_the_pool_bytes() -> None:
    """Each format at FLOPs per pool byte and achieved FLOP/s; a kernel that streams at the roof's bandwidth
    reaches 100 % of it, and FP8 and INT8 (the same bytes) share an intensity."""
    from app.analysis.kv_quant_kernel import call_flops, roofline_frame
    from app.charts.kv_quant_kernel import roofline_figure
    from kernels.ceilings import Ceilings

    c = Ceilings(1e15, 4e12, "test", "bfloat16")
    tokens = 64 * 8192
    at_roof_us = tokens * 768 / 4e12 * 1e6  # BF16's bytes at exactly the roof's bandwidth
    t = _timings(64, 8192, at_roof_us, {"bf16": 2 * at_roof_us, "fp8": at_roof_us, "int8": 2 * at_roof_us,
                                        "int4": at_roof_us})
    frame = roofline_frame(t, c)
    assert list(frame["fmt"]) == ["bf16", "fp8", "int8", "int4"]  # the engine's BF16 point stands for BF16
    assert call_flops(64, 8192) == 4 * 64 * 9 * 8192 * 64
    assert frame["intensity"].iloc[0] == pytest.approx(call_flops(64, 8192) / (tokens * 768))
    assert frame["intensity"].iloc[1] == frame["intensity"].iloc[2]
    assert frame["of_roof"].iloc[0] == pytest.approx(1.0)
    assert frame["of_roof"].iloc[1] == pytest.approx(396 / 768)  # half the bytes in the same time: half the roof
    fig = roofline_figure(frame, c, 64, 8192, "test")
    labels = {tr.name: tr.textposition for tr in fig.data if tr.mode == "markers+text"}
    assert len(labels) == 4 and {labels["fused kernel · FP8 e4m3"], labels["fused kernel · INT8"]} == {
        "top center", "bottom center"}
    # The upper twin rings the lower one's dot instead of hiding under it.
    symbols = {tr.textposition: tr.marker.symbol for tr in fig.data if tr.name in ("fused kernel · FP8 e4m3",
                                                                                     "fused kernel · INT8")}
    assert symbols == {"top center": "circle-open", "bottom center": None}
