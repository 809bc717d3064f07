"""The KV cache page's "Bytes vs tokens" chart: every step on the formula's line, and the label of the
latest step on the side of its point that has room."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams

from app.charts.kv_cache import MIB, bytes_vs_tokens


def test_latest_step_label_stays_on_the_chart(random_weights) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineConfig(num_blocks=16, max_model_len=128), random_weights)
    engine.add_request(list(range(100, 130)), SamplingParams(max_tokens=4, ignore_eos=True))
    records = []
    while engine.has_work():
        records.append(engine.step())
    per_token = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, fp32
    toks = [r.pool.filled_tokens for r in records]
    assert toks[-2] > 0 and toks[-1] == 0  # the last step finished the request and gave its blocks back

    growing = bytes_vs_tokens(records[:-1], per_token)
    (label,) = growing.layout.annotations
    assert label.text == f"step {records[-2].step}" and label.ax < 0 and label.xanchor == "right"
    assert label.y == toks[-2] * per_token / MIB  # on the formula's line

    freed = bytes_vs_tokens(records, per_token)
    (label,) = freed.layout.annotations
    # At the origin: pointing right, into the chart (up and left it ran off over the y axis).
    assert (label.x, label.ax, label.xanchor) == (0, 40, "left")
    assert label.text == f"step {records[-1].step}: every block freed"


def test_charts_of_one_step_draw_points(random_weights) -> None:  # noqa: ANN001
    """Scrubbed to step 0 (the prefill) a chart has one point per trace: as lines alone they drew nothing under
    metrics saying 1.9 MiB in use."""
    from app.charts.batching import batch_over_steps
    from app.charts.kv_cache import kv_growth
    engine = LLMEngine(EngineConfig(num_blocks=16, max_model_len=128), random_weights)
    engine.add_request(list(range(100, 130)), SamplingParams(max_tokens=4, ignore_eos=True))
    first = [engine.step()]
    assert all("markers" in t.mode for t in kv_growth(first, 2 * 30 * 3 * 64 * 4, ["r0"]).data)
    # and its step axis starts at step 0 (Plotly ran it from -1 around the one point)
    assert kv_growth(first, 2 * 30 * 3 * 64 * 4, ["r0"]).layout.xaxis.range == (-0.5, 1.5)
    assert "markers" in batch_over_steps(first, ["r0"]).data[-1].mode
    both = [*first, engine.step()]
    assert all(t.mode == "lines" for t in kv_growth(both, 2 * 30 * 3 * 64 * 4, ["r0"]).data)
    # Held and reserved are both drawn as steps, so the held area never rises above the reserved line between two
    # steps (a sloped area did, where a prompt landed).
    assert all(t.line.shape == "hv" for t in kv_growth(both, 2 * 30 * 3 * 64 * 4, ["r0"]).data)


def test_a_trend_inside_the_noise_is_called_flat() -> None:
    """Per-token decode times on a busy CPU scatter by milliseconds: a fitted slope through them is named only
    when the line moves more over the run than the points scatter around it."""
    from app.analysis.cache_timing import CacheTiming
    from app.charts.kv_cache import cache_timing
    n = 24
    noisy = tuple(50.0 + (7.0 if i % 2 else -7.0) - 0.05 * i for i in range(n))  # drift 1.2 ms, scatter 7 ms
    growing = tuple(50.0 + 4.0 * i for i in range(n))
    t = CacheTiming(20, tuple(range(20, 20 + n)), noisy, growing, (1,) * n, tuple(range(20, 20 + n)), True, "")
    names = [tr.name for tr in cache_timing(t).data if tr.name and tr.name.startswith("trend")]
    assert names == ["trend +4 ms per token", "trend: flat (drift within the noise)"]
