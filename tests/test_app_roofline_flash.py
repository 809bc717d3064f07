"""The attention roofline and FlashAttention-2 pages: their analysis code, their charts, the pages
themselves under Streamlit's AppTest. (Both pages in headless Chromium are in test_browser.py, which shares
one Streamlit server among all the browser tests.)
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from engine.forward_batch import build_forward_batch
from engine.sampling_params import SamplingParams
from engine.weights import cache_dir, find_gguf
from kernels.ceilings import REFERENCE_CEILINGS, Ceilings, ceilings_for, lookup_ceilings, measure_ceilings

from app.analysis.flash_compare import AttentionMemory, compare_methods
from app.analysis.flash_qkv import LayerQKV, last_token_logits, layer_qkv
from app.analysis.kernel_paths import (PATHS, PathRun, expected_steps, first_difference, run_paths, runnable_paths,
                                       summary_rows)
from app.analysis.roofline_math import (attention_decode_intensity, crossing_batch, decode_step, family_points,
                                        flops_per_token, kernel_points, linear_intensity, matmul_params,
                                        phase_points, step_phase, unplottable_kernels)
from app.charts.flash_tiles import method_chart, online_softmax_chart, score_matrix, tile_grid
from app.charts.kernel_paths import kernel_path_chart
from app.charts.roofline import (decode_intensity_chart, decode_throughput_chart, place_labels,
                                 request_latency_chart, roofline_chart, step_latency_chart)
from app.scenarios import RequestSpec, Scenario
from kernels.flash_trace import flash_attention_tiled, naive_attention

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig()
torch.set_num_threads(1)


# ---- ceilings ----------------------------------------------------------------------------------------

def test_cpu_ceilings_are_measured_once_and_plausible() -> None:
    t0 = time.perf_counter()
    c = measure_ceilings("cpu")
    assert time.perf_counter() - t0 < 10  # < 1-2 s on an idle machine; generous for a shared one
    assert c.dtype == "float32" and "measured" in c.source
    assert 1e8 < c.peak_flops < 1e13 and 1e8 < c.peak_bytes_per_s < 1e12
    assert measure_ceilings("cpu") is c  # cached per process
    assert c.ridge == pytest.approx(c.peak_flops / c.peak_bytes_per_s)
    assert c.attainable(c.ridge / 10) == pytest.approx(c.peak_bytes_per_s * c.ridge / 10)
    assert c.attainable(c.ridge * 10) == c.peak_flops
    assert c.bound(c.ridge / 2) == "memory-bound" and c.bound(c.ridge * 2) == "compute-bound"
    assert ceilings_for("cpu") is c


def test_reference_table_has_the_h200() -> None:
    h = lookup_ceilings("NVIDIA H200")
    assert h is not None and h.peak_flops == 790e12 and h.peak_bytes_per_s == 4.26e12
    assert lookup_ceilings("NVIDIA H200 NVL") is h
    assert lookup_ceilings("Some other GPU") is None
    assert 180 < h.ridge < 190
    assert any("SDPA" in what for what, _ in REFERENCE_CEILINGS["NVIDIA H200"].notes)


# ---- roofline arithmetic -----------------------------------------------------------------------------

def test_model_arithmetic() -> None:
    p = matmul_params(CFG)
    assert 130e6 < p < 140e6  # SmolLM2-135M, tied embedding counted once (as the LM head)
    assert flops_per_token(CFG) == 2 * p
    # Decode linear intensity ~ 2B / e while the batch is small next to the hidden size.
    for b in (1, 2, 4, 8):
        assert linear_intensity(CFG, b, 2) == pytest.approx(b, rel=0.03)
        assert linear_intensity(CFG, b, 4) == pytest.approx(b / 2, rel=0.03)
    assert attention_decode_intensity(CFG, 2) == 3.0  # 2 * 9 / (3 * 2)
    h = REFERENCE_CEILINGS["NVIDIA H200"].ceilings
    cross = crossing_batch(CFG, 2, h.ridge)
    assert cross is not None and linear_intensity(CFG, cross, 2) >= h.ridge > linear_intensity(CFG, cross - 1, 2)
    assert crossing_batch(CFG, 2, 1e6) is None  # never, whatever the batch
    step = decode_step(CFG, 4, 1000, 2)
    assert step.weight_bytes == 2 * p and step.kv_bytes == 4 * 1000 * 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 2
    assert step.intensity < linear_intensity(CFG, 4, 2)  # the KV read only lowers it
    assert step.seconds(h) == pytest.approx(step.bytes / h.peak_bytes_per_s)  # memory-bound


@pytest.fixture(scope="module")
def run_records(random_weights):  # noqa: ANN001
    """A long prompt then a few decode steps on the real engine (random weights)."""
    engine = LLMEngine(EngineConfig(num_blocks=64, max_num_batched_tokens=512, max_model_len=512), random_weights)
    engine.add_request(list(range(1000, 1200)), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request(list(range(2000, 2050)), SamplingParams(max_tokens=4, ignore_eos=True))
    return [engine.step() for _ in range(4)]


def test_prefill_kernels_sit_right_of_decode_kernels(run_records) -> None:  # noqa: ANN001
    prefill, decode = run_records[0], run_records[1]
    assert step_phase(prefill) == "prefill" and step_phase(decode) == "decode"
    pre = {p.name: p for p in kernel_points(prefill)}
    dec = {p.name: p for p in kernel_points(decode)}
    for name in ("linear.qkv", "linear.o", "linear.gate_up", "linear.down"):
        assert pre[name].intensity > 20 * dec[name].intensity
        assert dec[name].intensity == pytest.approx(linear_intensity(CFG, 2, 4) , rel=0.1)  # batch 2, fp32
    assert "attention.prefill" in pre and "attention.decode" in dec
    assert set(unplottable_kernels(prefill)) <= {"embedding", "kv_store"}
    # Summing per family or per phase conserves FLOPs and bytes.
    for pts in (kernel_points(prefill), kernel_points(decode)):
        fam = family_points(pts)
        assert sum(p.flops for p in fam) == pytest.approx(sum(p.flops for p in pts))
        assert sum(p.bytes for p in fam) == pytest.approx(sum(p.bytes for p in pts))
        assert len({p.family for p in fam}) == len(fam)
    merged = phase_points([p for r in run_records[1:] for p in kernel_points(r)])
    assert {p.phase for p in merged} == {"decode"} and all(p.step == -1 for p in merged)


def test_roofline_charts_build(run_records) -> None:  # noqa: ANN001
    c = Ceilings(50e9, 20e9, "test", "float32")
    now = family_points(kernel_points(run_records[1]))
    others = phase_points([p for r in run_records if r.step != 1 for p in kernel_points(r)])
    fig = roofline_chart(c, now, others, "t")
    names = [t.name or "" for t in fig.data]
    assert "ridge point" in names and any("this step" in n for n in names) and "other prefill steps (summed)" in names
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    intensity = decode_intensity_chart(CFG, 4, c, 8, 1024)
    assert intensity.layout.xaxis.type == "log" and intensity.layout.yaxis.type == "log"
    throughput = decode_throughput_chart(CFG, 4, c, 8, 1024)
    lo, hi = throughput.layout.xaxis.range  # batch 1 sits clear of the y axis's "0"
    assert lo < 0 < math.log10(4096) < hi
    # Two figures with one bottom margin: side by side, their plots are the same height.
    assert intensity.layout.margin.b == throughput.layout.margin.b
    step_latency_chart(run_records, 2)
    fig = request_latency_chart(run_records[-1], ["r0", "r1"])
    assert list(fig.data[0].x) == ["r0", "r1"]


def test_label_placement_avoids_collisions() -> None:
    items = [(1.0, 1e9, "linear layers", True), (1.0, 1.05e9, "lm_head", True), (1.0, 1.1e9, "rope", True)]
    pos = place_labels(items, (0.1, 100), (1e7, 1e11))
    shown = [p for p in pos if p]
    # Three labels at one spot: no two share a place, and at least two find one (a label with no free place
    # is left off; the hover still names its point).
    assert len(shown) >= 2 and len(set(shown)) == len(shown)


# ---- FlashAttention helpers --------------------------------------------------------------------------

def test_layer_qkv_is_the_engines_forward(random_weights) -> None:  # noqa: ANN001
    """The page's plain forward agrees with the engine's model: same logits for the last token."""
    ids = list(range(300, 340))
    engine = LLMEngine(EngineConfig(num_blocks=16, max_model_len=128), random_weights)
    batch = build_forward_batch([(ids, 0, list(range(len(ids))))], [], [len(ids) - 1], torch.device("cpu"))
    ref = engine.model.forward(batch, engine.pool)[0]
    assert torch.allclose(last_token_logits(random_weights, ids), ref, rtol=1e-4, atol=1e-4)
    qkv = layer_qkv(random_weights, ids, 5)
    assert qkv.q.shape == (40, 9, 64) and qkv.k.shape == (40, 3, 64) and qkv.v.shape == (40, 3, 64)
    assert qkv.scale == 64 ** -0.5 and qkv.layer == 5
    with pytest.raises(ValueError):
        layer_qkv(random_weights, ids, 30)
    with pytest.raises(ValueError):
        layer_qkv(random_weights, [], 0)


def _random_qkv(n: int = 120) -> LayerQKV:
    g = torch.Generator().manual_seed(0)
    return LayerQKV(0, tuple(range(n)), torch.randn(n, 9, 64, generator=g), torch.randn(n, 3, 64, generator=g),
                    torch.randn(n, 3, 64, generator=g), 0.125)


def test_compare_methods_all_exact() -> None:
    results = compare_methods(_random_qkv(), 16, 32, reps=1)
    assert [r.method.split(" (")[0] for r in results][:3] == ["naive softmax(QKᵀ)V", "torch SDPA",
                                                              "engine attention path"]
    assert any("re-enactment" in r.method for r in results)
    for r in results:
        assert not r.error and r.ms > 0 and r.rel_err < 1e-5, r
    assert [r.materialises_scores for r in results] == [True, False, False, False]
    mem = AttentionMemory(1024, 9, 2)
    assert mem.naive_scores_bytes == 9 * 1024 ** 2 * 2 and mem.flash_state_bytes == 9 * 1024 * 8


def test_cpu_methods_are_timed_on_one_thread(monkeypatch) -> None:  # noqa: ANN001
    """Two threads' barriers stall for a whole time slice whenever the browser shares the CPU (1 ms calls
    took 75-96 ms), so the CPU rows are timed on one thread, and the caller's thread count comes back."""
    from app.analysis import flash_compare

    seen: list[int] = []
    real_sdpa = flash_compare._sdpa

    def sdpa(*args):  # noqa: ANN002, ANN202
        seen.append(torch.get_num_threads())
        return real_sdpa(*args)

    monkeypatch.setattr(flash_compare, "_sdpa", sdpa)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = compare_methods(_random_qkv(), 16, 16, reps=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {flash_compare.CPU_TIMING_THREADS} == {1}
    assert all(r.device == "CPU, 1 thread" for r in results)


def test_method_timer_repeats_fast_calls_for_a_time_budget() -> None:
    """Best-of-`reps` is extended to MIN_SECONDS of calls (capped at MAX_REPS) so one burst of another
    process cannot set every sample; a single-rep method (the slow re-enactment) still runs once."""
    from app.analysis import flash_compare

    timer = flash_compare._timer(torch.device("cpu"))
    calls: list[int] = []

    def fast() -> torch.Tensor:
        calls.append(1)
        return torch.zeros(1)

    _, ms = timer(fast, 3)
    assert flash_compare.MAX_REPS + 1 >= len(calls) > 4 and ms >= 0  # warm-up + more than the 3 asked for
    calls.clear()
    timer(fast, 1)
    assert len(calls) == 2  # warm-up + one

    def slow() -> torch.Tensor:
        calls.append(1)
        time.sleep(flash_compare.MIN_SECONDS)
        return torch.zeros(1)

    calls.clear()
    _, ms = timer(slow, 3)
    assert len(calls) == 4 and ms >= flash_compare.MIN_SECONDS * 1e3  # the budget is spent: just the 3 asked for


@pytest.mark.parametrize("n", [1, 50, 700])  # 700 > the heatmap's 320 cells: the pooled path
def test_flash_charts_build(n: int) -> None:
    qkv = _random_qkv(n)
    trace = flash_attention_tiled(qkv.q, qkv.k, qkv.v, qkv.scale, 16, 16, trace_row=n - 1, trace_head=2)
    tile_grid(trace)
    row = (qkv.q[n - 1, 2] @ qkv.k[:, 0].T) * qkv.scale
    online_softmax_chart(trace, float(row.max()), float(torch.exp(row - row.max()).sum()))
    _, p = naive_attention(qkv.q, qkv.k, qkv.v, qkv.scale)
    s = (qkv.q[:, 2] @ qkv.k[:, 0].T) * qkv.scale
    for show in ("probabilities", "scores"):
        fig = score_matrix(p[2], s, trace, show)
        assert len(fig.data[0].z) <= 320
    method_chart(compare_methods(qkv, 64, 64, reps=1) if n <= 50 else [])


# ---- kernel paths ------------------------------------------------------------------------------------

def test_kernel_paths_on_the_cpu(tiny_weights) -> None:  # noqa: ANN001
    """On a CPU only the torch reference path runs; it runs the scenario to its end with kernel profiling
    off, and its decode steps are timed and counted."""
    runnable, missing = runnable_paths("cpu")
    assert [p.key for p in runnable] == ["torch"] and [p.key for p in missing] == ["triton", "graphs"]
    assert runnable_paths("cuda")[0] == list(PATHS)
    scenario = Scenario(name="two", engine={"num_blocks": 32, "max_model_len": 128},
                        requests=(RequestSpec("Hello there", max_tokens=6, ignore_eos=True),
                                  RequestSpec("Name a colour", max_tokens=4, arrival_step=1, ignore_eos=True)))
    assert expected_steps(scenario) == 8  # the longest request: 6 tokens, plus 2
    done = []
    runs = run_paths(scenario, tiny_weights, {"device": "cpu", "dtype": "float32", "weights": "random"}, runnable * 2,
                     50, done.append)
    assert done == list(range(1, len(done) + 1)) and len(done) >= 6
    for run in runs:
        assert not run.error and run.backend == "torch reference kernels on CPU"
        assert [len(ids) for _, ids in run.tokens] == [6, 4]
        # a decode-only step makes a token per running request; each request's first comes from its prefill
        assert len(run.decode_ms) <= run.decode_tokens <= 6 + 4 - 2
        assert len(run.decode_ms) >= 3 and all(t > 0 for t in run.decode_ms) and run.prefill_ms
        assert run.median_decode_ms > 0 and run.decode_tokens_per_s > 0
    assert first_difference(runs) == ""  # the same greedy tokens on both engines
    altered = dataclasses.replace(runs[1], tokens=(("r0", runs[1].tokens[0][1][:-1] + (-1,)), runs[1].tokens[1]))
    assert "from output token 5" in first_difference([runs[0], altered])
    fig = kernel_path_chart(runs)
    assert len(fig.data) == 2 * len(runs)
    rows = summary_rows(runs)
    assert rows[0]["decode steps"] == len(runs[0].decode_ms) and rows[0]["median decode step (ms)"] > 0
    # A path that ran no decode step (every request stopped at its first token) still gets a row and a chart row.
    empty = PathRun(PATHS[0], "torch reference kernels on CPU", (), (12.0,), 0, (("r0", (5,)),))
    assert summary_rows([empty])[0] == {"kernel path": "torch reference kernels", "ran on": "torch reference kernels on CPU",
                                        "decode steps": 0, "median decode step (ms)": None, "decode tokens/s": None,
                                        "prefill steps (ms)": "12"}
    assert kernel_path_chart([empty]).layout.yaxis.ticktext[0].endswith("no decode step")


# ---- the pages under AppTest -------------------------------------------------------------------------

@pytest.fixture()
def app_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real weights when this machine has them (a few seconds to load), else random ones."""
    have_real = find_gguf() is not None or (cache_dir() / "meta.json").is_file()
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", os.environ.get("INFERSCOPE_WEIGHTS", "real" if have_real else "random"))
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")


def _no_exception(at) -> None:  # noqa: ANN001
    assert not at.exception, [e.value for e in at.exception]


@pytest.mark.slow
def test_roofline_page_steps_and_scrubs(app_env) -> None:  # noqa: ANN001
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages/02_attention_roofline.py"), default_timeout=300)
    at.run()
    _no_exception(at)
    labels = [m.label for m in at.metric]
    assert "Peak compute π" in labels and "Memory bandwidth β" in labels and "Ridge point π/β" in labels
    assert any("torch reference kernels on CPU" in c.value for c in at.caption)
    for _ in range(4):
        at.button(key="roofline-btn-step").click().run()
        _no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Selected step"] == "3 (decode)"
    assert metrics["Mean TPOT"] != "–"
    assert len(at.get("plotly_chart")) >= 6  # roofline, step times, TTFT/TPOT, the calculator's two, parallel
    at.slider(key="roofline-scrub").set_value(0).run()  # back to the prefill: redrawn from its record
    _no_exception(at)
    assert {m.label: m.value for m in at.metric}["Selected step"] == "0 (prefill)"
    at.toggle(key="roofline-per-kernel").set_value(True).run()
    _no_exception(at)
    at.select_slider(key="roofline-calc-batch").set_value(512).run()
    at.radio(key="roofline-calc-device").set_value("NVIDIA H200 (table)").run()
    _no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Linear layers cross the ridge at"].startswith("B = ")
    # Decoding in parallel, with the calculator's ceilings: a 16-row pass is memory-bound on an H200, so 8 tokens
    # a pass is nearly 8x autoregressive decoding.
    at.select_slider(key="roofline-par-block").set_value(16).run()
    at.select_slider(key="roofline-par-per-pass").set_value(8).run()
    _no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Passes per block T"] == "2" and 7 < float(metrics["Speedup"].rstrip("×")) <= 8
    assert any("ceilings a pass turns compute-bound at" in c.value for c in at.caption)
    # The premise timed on this server's model (a short context keeps it quick): crosses on the chart, the
    # measured speedup beside the predicted one.
    at.select_slider(key="roofline-calc-ctx").set_value(128).run()
    at.button(key="roofline-par-measure").click().run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    speedup = next(m for m in at.metric if m.label == "Speedup")
    assert speedup.proto.delta.startswith("measured: ")
    assert any("Measured here (128-token context" in c.value for c in at.caption)
    # The scenario on every kernel path this CPU server has: the torch reference kernels only.
    at.button(key="roofline-paths-run").click().run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert any("only the torch reference kernels run here" in i.value for i in at.info)
    # What the GPU measured on every path, one row each, beside the one path this server ran.
    reference = next(d.value for d in at.dataframe if "median decode step, NVIDIA H200" in d.value.columns)
    assert list(reference["kernel path"]) == [p.label for p in PATHS]
    table = next(d.value for d in at.dataframe if "decode steps" in d.value.columns)
    assert list(table["kernel path"]) == ["torch reference kernels"]
    assert int(table["decode steps"][0]) >= 20 and float(table["median decode step (ms)"][0]) > 0
    # One path ran: the caption must not claim that every path agreed, nor talk about graph captures.
    captions = " ".join(c.value for c in at.caption)
    assert "Every path produced the same tokens" not in captions and "One kernel path ran here" in captions


@pytest.mark.slow
def test_flash_page_loads_and_reacts(app_env) -> None:  # noqa: ANN001
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages/05_flashattention.py"), default_timeout=300)
    at.run()
    _no_exception(at)
    assert not at.error
    assert any("torch reference path on the CPU" in c.value for c in at.caption)
    m = {x.label: x.value for x in at.metric}
    pairs, skipped = int(m["Tile pairs"]), int(m["Skipped by causality"])
    q_tiles = math.isqrt(pairs)
    assert q_tiles * q_tiles == pairs and skipped == q_tiles * (q_tiles - 1) // 2  # 16 x 16 tiles, square grid
    at.selectbox(key="flash-bm").set_value(32).run()
    at.selectbox(key="flash-bn").set_value(8).run()
    at.slider(key="flash-row").set_value(20).run()
    at.selectbox(key="flash-head").set_value(7).run()
    at.slider(key="flash-layer").set_value(0).run()
    at.radio(key="flash-show").set_value("scores").run()
    _no_exception(at)
    errors = [r for r in at.table[-1].value["rel. error"]]
    assert all(float(e) < 1e-5 for e in errors)
    submit = next(b for b in at.button if b.label == "Use this prompt")
    at.slider(key="flash-row").set_value(int(at.slider(key="flash-row").max))  # the last row of the long prompt
    at.text_area(key="flash-prompt").set_value("Hi")
    submit.click().run()  # a short prompt: fewer tokens than the selected row, which must follow
    _no_exception(at)
    assert int({x.label: x.value for x in at.metric}["Tile pairs"]) < pairs
    assert not at.warning, [w.value for w in at.warning]
    at.text_area(key="flash-prompt").set_value("   ")
    next(b for b in at.button if b.label == "Use this prompt").click().run()
    _no_exception(at)
    assert at.error  # an empty prompt is an error message, not a traceback


@pytest.mark.slow
def test_flash_page_decoding_section(app_env) -> None:  # noqa: ANN001
    """The section's controls change the dealing and the split count; the merge stays exact; the planner
    grid and the recorded timings draw."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages/05_flashattention.py"), default_timeout=300)
    at.run()
    assert not at.exception and not at.error
    assert any(h.value.startswith("Decoding: split-KV") for h in at.subheader)

    def metrics() -> dict[str, str]:
        return {m.label: m.value for m in at.metric}

    from kernels.split_kv_trace import launched_splits

    from app.analysis.split_kv import merge_bytes
    from app.formatting import fmt_bytes

    n = int(metrics()["Keys the decode row sees"].replace(",", ""))
    # 3 KV heads x the splits that run: the default S = 4 over the default 16-key tiles of the long prompt
    assert math.ceil(n / 16) >= 4 and int(metrics()["Programs at batch 1"]) == 3 * 4
    for splits in (1, 8):
        at.select_slider(key="flash-splits").set_value(splits).run()
        assert not at.exception
        m = metrics()
        runs = launched_splits(math.ceil(n / 16), splits)  # the engine's launcher drops splits without a tile
        assert int(m["Programs at batch 1"]) == 3 * runs and float(m["Merged vs one pass"]) < 1e-5
        assert (m["The merge reads"] == "nothing") == (splits == 1)
    at.radio(key="flash-split-layout").set_value("contiguous ranges").run()
    assert not at.exception and float(metrics()["Merged vs one pass"]) < 1e-5
    captions = " ".join(c.value for c in at.caption)
    assert "bench/results/split_kv_h200.json" in captions and "Split" in captions
    assert any("splits" in d.value.columns for d in at.dataframe)
    # 128-key tiles, S = 8: the metrics count the splits that run (2 for up to 256 keys), not the 8 asked for.
    at.selectbox(key="flash-bn").set_value(128).run()
    assert not at.exception
    m = {x.label: x for x in at.metric}
    runs = launched_splits(math.ceil(n / 128), 8)
    assert runs < 8 and int(m["Programs at batch 1"].value) == 3 * runs
    assert m["Programs at batch 1"].delta == f"{runs} of S = 8 splits run"
    assert m["The merge reads"].value == fmt_bytes(merge_bytes(9, runs, 64))

@pytest.mark.slow
@pytest.mark.parametrize("page_file", ["02_attention_roofline.py", "05_flashattention.py"])
def test_pages_open_through_the_navigation(app_env, page_file: str) -> None:  # noqa: ANN001
    """Registered in app/registry.py and reachable from app/main.py's st.navigation."""
    from streamlit.testing.v1 import AppTest

    from app.registry import available_pages

    assert f"pages/{page_file}" in [p.path for p in available_pages()]
    at = AppTest.from_file(str(ROOT / "app/main.py"), default_timeout=300)
    at.run()
    at.switch_page(f"../pages/{page_file}").run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value in ("Attention roofline", "FlashAttention-2")

