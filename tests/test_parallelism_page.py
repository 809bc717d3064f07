"""The parallelism page: registered, its tables and charts from a tiny run (and a fake H200 file written only into
a temporary directory), and the page under AppTest (random weights, CPU, a small run put in place of the default):
every section, sliders that redraw without running again, a degree that does not split and other bad input as
messages that keep the last results, and a failing run."""
from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from engine.parallel.expert_math import MOE_MODELS
from engine.parallel.lab import ParallelSettings, run_parallel_lab
from engine.parallel.tensor_parallel import shard_weights
from engine.tokenizer import default_tokenizer
from engine.weights import default_config

import app.sections.parallelism as section
from app.analysis.parallelism import (allowed_degrees, batches_where_tp_pays, break_even_latency_us,
                                      collective_counts, collective_frame, degree_frame, ep_fits, ep_frame,
                                      floor_fit_text, h200_stage_ms, imbalance_curve, lm_head_layers, load_h200,
                                      load_process_run, memory_frame, pass_times, replicated_bytes, result_json,
                                      split_rows, stage_frame, token_latency, tp_floor_frame, tp_projection)
from app.charts.parallelism import (ep_figure, gantt_figure, imbalance_figure, memory_figure, pass_figure,
                                    projection_figure, split_figure, tp_floor_figure)
from app.formatting import NO_VALUE
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)

PAGE, PREFIX = "19_parallelism.py", "par"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Shard, pipeline and measure"
SMALL = ParallelSettings(max_new_tokens=3, tp=3, pp=2, micro_batches=2, pipeline_tokens=2)
SUBHEADERS = ["Which degrees this model allows", "Tensor parallelism, live: one rank against 3",
              "The wire: what the collectives cost on a GPU",
              "Pipeline parallelism, live: 2 requests through 2 stages", "Expert parallelism, in arithmetic"]


def fake_h200(path: Path, tp_rows: bool = True) -> Path:
    """A file in bench/parallel.py's schema with made-up numbers, for the tests' temporary directories only."""
    rows = [{"tp": tp, "rank": r, "batch": b, "eager_ms": 9.0 / tp * (1 + b / 64), "graph_ms": 3.0 / tp * (1 + b / 64)}
            for tp in (1, 3) for r in range(tp) for b in (1, 16, 64)] if tp_rows else []
    path.write_text(json.dumps({
        "device": "NVIDIA H200 (test)", "torch": "2.x", "gpus": 1, "weights": "random", "dtype": "bfloat16",
        "context": 512, "tp_decode": rows,
        "pp_stage": [{"pp": 3, "stage": s, "first_layer": 10 * s, "last_layer": 10 * s + 9, "batch": 1,
                      "graph_ms": 1.0 + (s == 2)} for s in range(3)],
        "all_reduce": []}))
    return path


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "parallelism")
    assert spec.available and spec.section == "Serving" and spec.path == f"pages/{PAGE}"


def test_degree_table_of_the_real_shape() -> None:
    cfg = default_config(default_tokenizer())
    frame = degree_frame(cfg)
    assert list(frame["TP degree"]) == list(range(1, 9))
    assert allowed_degrees(cfg) == [1, 3] == list(frame[frame["Splits evenly"]]["TP degree"])
    assert frame.loc[1, "Does not divide evenly"] == "9 query heads, 3 KV heads"
    assert frame.loc[4, "Does not divide evenly"].endswith("49152 vocabulary rows") and frame.loc[2, "Does not divide evenly"] == NO_VALUE
    rows = split_rows(cfg, 3)
    assert [r.spans for r in rows][0] == ((0, 3), (3, 6), (6, 9))
    assert rows[2].spans[-1] == (384, 576) and rows[-1].spans[1] == (16384, 32768)
    assert lm_head_layers(cfg) == pytest.approx(8.0, rel=0.01)  # 49152 x 576 against one layer's matrices
    fig = split_figure(rows, 3)
    assert len(fig.data) == 3 and fig.data[0].text[0] == "0–2" and fig.layout.title.text


@pytest.fixture(scope="module")
def tiny_result(tiny_weights):  # noqa: ANN001, ANN201
    # The tiny model has 4 query heads and 2 KV heads: TP 2 splits it; 2 layers: 2 stages at most.
    return run_parallel_lab(tiny_weights, ParallelSettings(max_new_tokens=4, tp=2, pp=2, micro_batches=3,
                                                           pipeline_tokens=3))


def test_split_rows_are_the_shards_ranges(tiny_weights) -> None:  # noqa: ANN001
    cfg = tiny_weights.config
    shards = shard_weights(cfg, tiny_weights.state_dict, 2)
    rows = split_rows(cfg, 2)
    for r, sh in enumerate(shards):
        assert rows[0].spans[r] == (sh.heads.start, sh.heads.stop)
        assert rows[1].spans[r] == (sh.kv_heads.start, sh.kv_heads.stop)
        assert rows[2].spans[r] == (sh.heads.start * cfg.head_dim, sh.heads.stop * cfg.head_dim)
        assert rows[3].spans[r] == (sh.channels.start, sh.channels.stop)
        assert rows[4].spans[r] == (sh.vocab.start, sh.vocab.stop)


def test_tables_and_charts_of_a_run(tiny_result, tiny_weights) -> None:  # noqa: ANN001
    r = tiny_result
    mem = memory_frame(r)
    assert list(mem["Where"]) == ["TP = 1: the one GPU", "TP = 2: rank 0", "TP = 2: rank 1"]
    assert mem["KV cache (MiB)"].iloc[1] == pytest.approx(mem["KV cache (MiB)"].iloc[0] / 2)
    norms = sum(t.numel() * t.element_size() for k, t in tiny_weights.state_dict.items() if k.endswith("norm.weight"))
    assert replicated_bytes(r) == norms  # one copy of the norms, what each rank holds in full
    assert collective_counts(r.sharded) == {"all_reduce": 2 * 2 + 1, "all_gather": 1}
    coll = collective_frame(r.sharded)
    assert list(coll["Per step"]) == [1, 2, 2, 1] and coll["Collective"].iloc[-1].startswith("all-gather")
    times = pass_times(r)
    assert [t.label.split(" ")[0] for t in times] == ["prefill", "decode"]
    assert all(len(t.per_rank) == 2 and t.critical <= t.serial + 1e-9 for t in times)
    stages = stage_frame(r, 20e-6)
    assert list(stages["Layers"]) == ["0–0", "1–1"] and list(stages["Also"]) == ["embedding", "LM head"]
    assert ((stages["Busy (%)"] > 0) & (stages["Busy (%)"] <= 100)).all()
    lat = token_latency(r.pipeline, 20e-6)
    assert lat.hops == 2 and lat.pipelined_ms == pytest.approx(lat.one_device_ms + 0.04)
    placed = r.placed(20e-6)
    gantt = gantt_figure(r, placed)
    assert sum(len(t.x) for t in gantt.data if t.x[0] is not None) == len(r.pipeline.tasks)
    assert gantt.data[-1].name == "prefill (step 0)"
    # A step number only on a bar wide enough for it (3 % of the timeline), never a cluster of tiny ones.
    end = max(p.end for p in placed)
    for t in gantt.data[:-1]:
        assert all((txt != "") == (w * 1e-3 >= 0.03 * end) for txt, w in zip(t.text, t.x)), t.name
    for fig in (memory_figure(mem), pass_figure(times, 2), gantt):
        assert isinstance(fig, go.Figure) and fig.layout.title.text and fig.layout.legend.y < 0
    data = json.loads(result_json(r, 20e-6))
    assert data["same_tokens"] == r.same_tokens and data["settings"]["tp"] == 2
    assert len(data["pipeline"]["tasks"]) == len(r.pipeline.tasks) and data["pipeline"]["assumed_hop_seconds"] == 20e-6


def test_h200_file_and_the_assumed_wire(tmp_path: Path) -> None:
    assert load_h200(tmp_path / "missing.json") is None
    (tmp_path / "broken.json").write_text("{")
    assert load_h200(tmp_path / "broken.json") is None
    assert load_h200(fake_h200(tmp_path / "empty.json", tp_rows=False)) is None
    bench = load_h200(fake_h200(tmp_path / "h200.json"))
    assert bench is not None and bench.context == 512 and bench.all_reduce.empty and len(bench.pp_stage) == 3
    proj = tp_projection(bench, 3, 61, 1, 10.0)
    assert list(proj["batch"]) == [1, 16, 64]
    assert proj["wire_ms"].iloc[0] == pytest.approx(0.62)
    assert proj["projected_ms"].iloc[0] == pytest.approx(1.0 * (1 + 1 / 64) + 0.62)
    assert break_even_latency_us(proj.iloc[0], 62) == pytest.approx((3 - 1) * (1 + 1 / 64) * 1e3 / 62)
    assert h200_stage_ms(bench, 3) == [1.0, 1.0, 2.0] and h200_stage_ms(bench, 2) is None
    fig = projection_figure(proj, 3, 10.0, 62)
    assert "assumed" in fig.data[-1].name and list(fig.data[-1].base) == list(proj["rank_ms"])


def test_the_captions_say_where_tp_pays_as_the_chart_shows_it() -> None:
    """The caption said 'a 135M model is far too small to gain from TP' beside a chart with TP ahead at batch 256."""
    import pandas as pd

    def proj(projected: list[float]) -> pd.DataFrame:
        return pd.DataFrame({"batch": [1, 16, 64, 256], "tp1_ms": [3.2, 3.6, 3.9, 4.7], "projected_ms": projected})

    assert batches_where_tp_pays(proj([3.5, 3.7, 4.0, 4.5])) == [256]
    one = section._where_tp_pays(proj([3.5, 3.7, 4.0, 4.5]), 10)
    assert "ahead only at batch 256 (by 200 µs a step)" in one and "too small" in one
    some = section._where_tp_pays(proj([3.5, 3.5, 3.8, 4.5]), 10)
    assert "ahead only at batches 16, 64 and 256 (by 200 µs a step at 256)" in some
    assert "loses at every batch measured" in section._where_tp_pays(proj([4.0, 4.0, 4.0, 5.0]), 50)
    assert "ahead at every batch measured" in section._where_tp_pays(proj([3.0, 3.0, 3.0, 3.0]), 1)
    text = section._rank_speedup_text({1: (1.15, 1.0), 16: (1.77, 1.79), 64: (2.5, 2.9), 256: (7.2, 5.9)}, 3)
    assert "at most 1.22× as fast as the whole step (batch 256), far from 3×" in text
    assert text.endswith("at batches 16 and 64 it is no faster at all.")
    assert section._rank_speedup_text({1: (2.0, 1.0)}, 3).endswith("(batch 1), far from 3×.")


def test_the_process_run_from_the_cpu_bench(tmp_path: Path) -> None:
    """The CPU bench's run over real processes (bench/parallel.py writes `distributed` and gloo `all_reduce` rows)."""
    assert load_process_run(tmp_path / "missing.json") is None
    (tmp_path / "none.json").write_text(json.dumps({"distributed": []}))
    assert load_process_run(tmp_path / "none.json") is None
    data = {"cpu_cores": 2, "distributed": [{"tp": 3, "same_tokens_as_one_process": True, "decode_compute_ms": 21.0,
                                             "decode_wire_ms": 190.0, "collectives_per_step": 62,
                                             "one_process_critical_ms": 13.0}],
            "all_reduce": [{"backend": "gloo", "ranks": 2, "bytes": 36864, "us": 600.0},
                           {"backend": "gloo", "ranks": 2, "bytes": 2304, "us": 500.0},
                           {"backend": "gloo", "ranks": 3, "bytes": 2304, "us": 2000.0}]}
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    run = load_process_run(tmp_path / "cpu.json")
    assert run is not None and run.same_tokens and run.tp == 3 and run.cores == 2
    assert run.all_reduce_us == {2: 500.0, 3: 2000.0}  # the smallest message per group size


def test_where_tp_pays_for_a_big_model() -> None:
    """At the H200's measured bandwidth and capacity: Llama 3.1 70B's 141 GB of bf16 weights just fit one GPU's
    139.8 GiB, 405B's need 8; the bytes halve with each doubling of TP while the wire stays the same."""
    from engine.parallel.tp_scaling import DENSE_MODELS
    from kernels.ceilings import REFERENCE_CEILINGS
    ref = REFERENCE_CEILINGS["NVIDIA H200"]
    m = next(x for x in DENSE_MODELS if x.name == "Llama 3.1 70B")
    f = tp_floor_frame(m, 1, 4096, ref.ceilings.peak_bytes_per_s, ref.memory_bytes, 10.0)
    assert list(f["tp"]) == [1, 2, 4, 8] and f["fits"].all()
    big = next(x for x in DENSE_MODELS if x.name == "Llama 3.1 405B")
    huge = tp_floor_frame(big, 1, 4096, ref.ceilings.peak_bytes_per_s, ref.memory_bytes, 10.0)
    assert list(huge["fits"]) == [False, False, False, True]
    assert f["wire_ms"].iloc[0] == 0 and f["wire_ms"].iloc[1] == pytest.approx((2 * 80 + 2) * 10 / 1e3)
    assert f["read_ms"].iloc[2] == pytest.approx(f["read_ms"].iloc[1] / 2, rel=1e-9)
    assert list(f["step_ms"]) == sorted(f["step_ms"], reverse=True)
    fig = tp_floor_figure(huge, big.name, 10.0)
    assert "does not fit" in fig.layout.annotations[0].text and len(fig.data) == 2
    assert floor_fit_text(huge, ref.memory_bytes).startswith("the fastest that fits is TP = 8")


def test_what_does_not_fit_is_named() -> None:
    """405B at batch 128 and 65,536 tokens: at TP = 8 its weights fit an H200 (~94 GiB), the KV cache does not. The
    page said "no degree up to 8 fits its weights"; it names the KV cache now, and the weights only when they fail."""
    from engine.parallel.tp_scaling import DENSE_MODELS
    from kernels.ceilings import REFERENCE_CEILINGS
    ref = REFERENCE_CEILINGS["NVIDIA H200"]
    big = next(x for x in DENSE_MODELS if x.name == "Llama 3.1 405B")
    crowded = tp_floor_frame(big, 128, 65536, ref.ceilings.peak_bytes_per_s, ref.memory_bytes, 10.0)
    assert not crowded["fits"].any()
    text = floor_fit_text(crowded, ref.memory_bytes)
    assert text.startswith("no degree up to 8 fits: at TP = 8 its weights fit (94.") and "KV cache" in text
    assert "fits even its weights" not in text
    weights_only = floor_fit_text(crowded[crowded["tp"] <= 4], ref.memory_bytes)
    assert weights_only.startswith("no degree up to 4 fits even its weights on H200s (189.0 GiB a GPU at TP = 4")
    labels = [a.text for a in tp_floor_figure(crowded, big.name, 10.0).layout.annotations]
    assert labels[-1] == "598.5 GiB: does not fit<br>(94.5 weights + 504.0 KV)"


def test_expert_arithmetic() -> None:
    frame = ep_frame()
    mixtral, deepseek = MOE_MODELS[0], MOE_MODELS[-1]
    assert not ep_fits(mixtral, 16) and ep_fits(deepseek, 32)
    assert list(frame[frame["Model"] == mixtral.name]["GPUs"]) == [8]
    assert list(frame[frame["Model"] == deepseek.name]["GPUs"]) == [8, 16, 32]
    assert (frame["EP weights per GPU (GiB)"] >= frame["TP weights per GPU (GiB)"]).all()
    fig = ep_figure(frame, deepseek.name)
    assert len(fig.data) == 4 and len(fig.data[0].x) == 3
    curve = imbalance_curve(deepseek, 8, (0.0, 1.0), tokens=(16, 256), draws=20)
    assert len(curve) == 4 and (curve["ratio"] >= 1).all()
    uniform, skewed = curve[curve["skew"] == 0], curve[curve["skew"] == 1.0]
    assert uniform["ratio"].iloc[0] > uniform["ratio"].iloc[1]  # more tokens even out a uniform router
    assert skewed["ratio"].iloc[1] > uniform["ratio"].iloc[1]  # but not a skewed one
    fig = imbalance_figure(curve, 256, 1.0)
    assert fig.data[-1].text[0].startswith("×") and fig.layout.title.text


def test_tensor_parallel_degree_one_reads_sensibly(random_app: AppTest, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """TP = 1 compares nothing: no "one rank against 1", no "the same tokens on 1 and on 1 ranks", no "each rank
    holds 100.0 % of the weights ... lets a model too large for one GPU run"; and one request is "1 request"."""
    import dataclasses
    monkeypatch.setattr(section, "H200_FILE", tmp_path / "none.json")
    monkeypatch.setattr(section, "CPU_FILE", tmp_path / "none.json")
    random_app.session_state[f"{PREFIX}-settings"] = section.PageSettings(
        dataclasses.replace(SMALL, tp=1, micro_batches=1))
    at = open_page(random_app, PAGE)
    assert_clean(at)
    heads = [s.value for s in at.subheader]
    assert heads[1] == "Tensor parallelism, live: TP = 1, one rank, nothing split"
    assert heads[3] == "Pipeline parallelism, live: 1 request through 2 stages"
    assert not at.success and any("At TP = 1 one rank holds the whole model" in i.value for i in at.info)
    text = " ".join(m.value for m in at.markdown)
    assert "At TP = 1 one rank holds all the weights" in text and "Each rank holds" not in text
    gantt = next(c for c in at.get("plotly_chart") if "pipeline stage" in c.proto.spec)
    assert "1 request through 2 pipeline stages" in gantt.proto.spec


def test_page_runs_and_keeps_results_on_bad_input(random_app: AppTest, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(section, "H200_FILE", tmp_path / "none.json")
    monkeypatch.setattr(section, "CPU_FILE", tmp_path / "none.json")
    random_app.session_state[f"{PREFIX}-settings"] = section.PageSettings(SMALL)
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert [s.value for s in at.subheader] == SUBHEADERS
    assert len(at.get("plotly_chart")) == 7  # split, memory, passes, big-model floor, Gantt, EP, imbalance
    text = " ".join(c.value for c in at.caption)
    assert "take turns in one" in text and "computed, not run" in text
    assert any("No H200 measurement here yet" in i.value for i in at.info)
    assert len(at.success) == 1 and "on 1 and on 3 ranks" in at.success[0].value
    assert [m.label for m in at.metric][:3] == ["All requests, 2 GPUs", "One token's latency", "Bubble (measured)"]

    # The sliders redraw from the run (nothing runs again); an H200 file adds its chart.
    monkeypatch.setattr(section, "run_parallel_lab",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    monkeypatch.setattr(section, "H200_FILE", fake_h200(tmp_path / "h200.json"))
    at.slider(key=f"{PREFIX}-hop").set_value(150).run()
    at.slider(key=f"{PREFIX}-latency").set_value(30).run()
    at.select_slider(key=f"{PREFIX}-ep-tokens").set_value(64).run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 8
    assert "The all-reduces were not measured" in " ".join(c.value for c in at.caption)

    # A degree that does not split the heads: its message, the degree table and the last results stay.
    at.selectbox(key=f"{PREFIX}-tp").set_value(2)
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert error.startswith("SmolLM2") and "cannot run tensor-parallel over 2 ranks" in error
    assert "9 query heads do not split evenly over 2 ranks" in error and "Degrees that work for it: 1, 3." in error
    assert error.endswith("The results below are the last run's.") and ".." not in error
    assert at.subheader[0].value == "Which degrees this model allows" and len(at.dataframe) >= 1
    assert len(at.get("plotly_chart")) == 8
    at.selectbox(key=f"{PREFIX}-tp").set_value(3)
    at.text_input(key=f"{PREFIX}-prompt").set_value("   ")
    at.button(key=SUBMIT).click().run()
    assert [e.value for e in at.error] == ["The prompt is empty: type something for the model to answer. "
                                           "The results below are the last run's."]

    # A failing run is a message; the last results stay on screen.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(section, "run_parallel_lab", broken)
    at.text_input(key=f"{PREFIX}-prompt").set_value("Name a colour.")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The run failed: out of memory (simulated)"]
    assert len(at.get("plotly_chart")) == 8
