"""Every page under Streamlit's AppTest on a CUDA machine: random weights in bf16, the server's
Triton kernels, each step's kernels timed with CUDA events. `test_pages_gpu.py` checks what the
roofline and FlashAttention-2 pages compute on a GPU; this runs the pages themselves there, through
the real navigation, as a lecturer's GPU server would. (Skipped without CUDA. The GPU machine has no
Streamlit or Plotly: the README says how they travel there as wheels.)
"""
from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest

from app.analysis.kernel_paths import PATHS
from app.analysis.parallel_decoding import MEASURED_ROWS
from app.analysis.pass_timing import PassTiming
from tests.apptest_helpers import ENGINE_PAGES, assert_clean, new_app, open_page, session_of

pytestmark = pytest.mark.gpu
STEPS = 3


@pytest.fixture()
def gpu_app(monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "random")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cuda")
    return new_app()


def _texts(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def test_home_says_triton_on_the_gpu(gpu_app: AppTest) -> None:
    at = gpu_app.run()
    assert_clean(at)
    text = _texts(at)
    assert f"Triton kernels on {torch.cuda.get_device_name()}" in text, text[:500]
    assert "torch reference path on the CPU" not in text


def _worker_records(record):  # noqa: ANN001, ANN202 - a StepRecord, or a disaggregated tick of them
    if hasattr(record, "kernels"):
        return [record]
    return [s.record for s in (*record.prefill_steps, record.decode_step) if s is not None and s.record.batch]


@pytest.mark.parametrize("page_file", list(ENGINE_PAGES))
def test_engine_page_steps_on_triton_kernels(gpu_app: AppTest, page_file: str) -> None:
    """The page steps its live engine on the GPU; each step's record names the Triton backend and
    carries kernel timings (CUDA events) with FLOPs, which the kernel panel draws; scrubbing back
    redraws from the records."""
    prefix = ENGINE_PAGES[page_file]
    at = open_page(gpu_app, page_file)
    assert_clean(at)
    for _ in range(STEPS):
        at.button(key=f"{prefix}-btn-step").click().run()
        assert_clean(at)
    session = session_of(at, prefix)
    assert session.engine.device.type == "cuda"
    assert [r.step for r in session.records] == list(range(STEPS))
    records = [w for r in session.records for w in _worker_records(r)]
    assert records
    for r in records:
        assert r.backend == f"Triton kernels on {torch.cuda.get_device_name()}", r.backend
        attention = [k for k in r.kernels if "attention" in k.name]
        assert attention and all(k.backend == "triton" and k.seconds > 0 and k.flops > 0 for k in attention), \
            [(k.name, k.backend, k.seconds, k.flops) for k in r.kernels]
    assert any(f"on **{records[-1].backend}**" in c.value for c in at.caption)  # the kernel panel's caption
    at.slider(key=f"{prefix}-scrub").set_value(0).run()
    assert_clean(at)
    assert len(session.records) == STEPS


def test_roofline_page_measures_the_gpu(gpu_app: AppTest) -> None:
    """The roofline page's ceilings come from this GPU (a bf16 matmul and a device copy), not the CPU."""
    at = open_page(gpu_app, "02_attention_roofline.py")
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Peak compute π"].endswith("TFLOP/s"), metrics
    assert metrics["Memory bandwidth β"].endswith("TB/s"), metrics
    assert any("bfloat16" in c.value and "measured" in c.value for c in at.caption)
    # Decoding in parallel: the premise timed on this GPU, each pass replayed from a CUDA graph. A pass over 128
    # rows costs a small multiple of a one-row pass (the weights are read once for all rows), unlike on a CPU
    # core, where it is tens of times.
    at.button(key="roofline-par-measure").click().run()
    assert_clean(at)
    passes = at.session_state["page-cache:roofline"]["parallel-passes"]
    assert [p.rows for p in passes] == list(MEASURED_ROWS)
    assert passes[-1].seconds < 3 * passes[0].seconds and all(p.timing is PassTiming.GRAPH for p in passes), passes
    assert any("replayed from a CUDA graph" in c.value for c in at.caption)
    assert next(m for m in at.metric if m.label == "Speedup").proto.delta.startswith("measured: ")


def test_flash_page_times_our_triton_kernel(gpu_app: AppTest) -> None:
    """The FlashAttention-2 page's comparison on a GPU lists our Triton FA2 kernel, with an error
    within bf16 tolerance, beside naive attention and SDPA."""
    at = open_page(gpu_app, "05_flashattention.py")
    assert_clean(at)
    table = at.table[-1].value  # indexed by method
    rows = table["rel. error"].to_dict()
    assert "Triton FA2 kernel (bfloat16)" in rows, list(rows)
    assert float(rows["Triton FA2 kernel (bfloat16)"]) < 1e-2
    assert set(table["device"]) >= {torch.cuda.get_device_name()}


def test_flash_page_runs_our_split_kv_decode_kernel(gpu_app: AppTest) -> None:
    """The decoding section runs the engine's Triton decode kernel on the prompt's newest row through a
    shuffled paged pool: as planned for batch 1 (the default prompt is shorter than a 256-key split, so one
    split), asked for more splits, and forced to one; every launch within bf16 tolerance of float64."""
    at = open_page(gpu_app, "05_flashattention.py")
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "launch" in d.value.columns)
    runs = dict(zip(table["launch"], table["splits"]))
    assert runs["as the engine plans batch 1"] == 1 and runs["one split"] == 1, runs
    assert runs["asked for 4"] >= 2, runs  # two 128-key tiles at the default prompt's length
    assert all(float(e) < 1e-2 for e in table["rel. error vs float64"]), list(table["rel. error vs float64"])
    at.select_slider(key="flash-splits").set_value(1).run()
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "launch" in d.value.columns)
    assert dict(zip(table["launch"], table["splits"]))["asked for 1"] == 1


def test_roofline_page_times_every_kernel_path(gpu_app: AppTest) -> None:
    """On a GPU the roofline page runs its scenario on all three kernel paths; replaying each decode step
    as one CUDA graph beats launching its few hundred kernels one by one (the page's first scenario on an
    H200: 1.07 against 22.6 ms a decode step, bench/results/kernel_paths_h200_v19.json)."""
    at = open_page(gpu_app, "02_attention_roofline.py")
    at.button(key="roofline-paths-run").click().run()
    assert_clean(at)
    assert not any("no CUDA GPU" in i.value for i in at.info)
    table = next(d.value for d in at.dataframe if "kernel path" in d.value.columns)
    assert list(table["kernel path"]) == [p.label for p in PATHS]
    ran_on = dict(zip(table["kernel path"], table["ran on"]))
    assert ran_on["Triton kernels in CUDA graphs"] == f"Triton kernels on {torch.cuda.get_device_name()}"
    assert ran_on["torch reference kernels"].startswith("torch reference kernels on cuda")
    median = dict(zip(table["kernel path"], table["median decode step (ms)"]))
    assert median["Triton kernels in CUDA graphs"] < median["Triton kernels, one launch each"] / 2, median


def test_kv_compression_page_on_the_gpu(gpu_app: AppTest) -> None:
    """The KV quantization page runs its lab on the GPU in bf16 and says its attention is the torch path."""
    at = open_page(gpu_app, "13_kv_compression.py")
    assert_clean(at)
    text = _texts(at)
    assert torch.cuda.get_device_name() in text and "torch path on every device" in text
    assert "reference cache in bfloat16" in text
    summary = next(d.value for d in at.dataframe if "Variant" in d.value.columns)  # not the variant editor
    # The storage-format preset's BF16 row is the reference here, so it runs once, as the reference.
    assert len(summary) == 6 and summary["Variant"].iloc[0] == "Reference: BF16"
    assert "BF16 is the reference on this server" in text


def test_kv_compression_page_times_the_fused_kernel_live(gpu_app: AppTest) -> None:
    """On a GPU the page's kernel section times the fused low-bit decode kernel at the shape asked for: every
    path measured, each format's output checked against dequantize-then-attend."""
    at = open_page(gpu_app, "13_kv_compression.py")
    assert_clean(at)
    charts = len(at.get("plotly_chart"))
    at.selectbox(key="kvq-qk-b").set_value(8)
    at.selectbox(key="kvq-qk-l").set_value(4096)
    at.button(key="FormSubmitter:kvq-qk-form-Time the kernels on this GPU").click().run(timeout=300)
    assert_clean(at)
    frame = next(d.value for d in at.dataframe if "bytes ratio" in d.value.columns)
    assert len(frame) == 6 and (frame["us"] > 0).all()
    fused = frame[frame["path"].str.startswith("fused kernel")]
    assert len(fused) == 4 and (fused["error"] < 2e-2).all(), fused
    assert len(at.get("plotly_chart")) == charts + 2  # the live call's bars and its roofline


def test_slo_page_on_the_gpu(gpu_app: AppTest) -> None:
    """The latency-SLO page's default sweep on the GPU: GPU-sized rates and targets, Triton with CUDA graphs."""
    at = open_page(gpu_app, "14_slo_goodput.py")
    assert_clean(at)
    text = _texts(at)
    assert torch.cuda.get_device_name() in text and "CUDA graphs on" in text
    assert [m.label for m in at.metric] == ["batch cap 2", "batch cap 8"]
    runs = next(d.value for d in at.dataframe if "rate (req/s)" in d.value.columns)
    assert sorted(set(runs["rate (req/s)"])) == [25.0, 50.0, 100.0, 200.0]
    assert (runs["TPOT p50 (ms)"] < 10).all()  # graphs: milliseconds per token, not the CPU's ~50


def test_weight_quantization_page_on_the_gpu(gpu_app: AppTest) -> None:
    """The weight-quantization page's default run with the answers from the engine on the GPU (bf16, Triton);
    the quantization and scoring stay on the CPU in fp32, and the page says so."""
    at = open_page(gpu_app, "15_weight_quantization.py")
    assert_clean(at)
    text = _texts(at)
    assert torch.cuda.get_device_name() in text and "(bfloat16)" in text and "quantization and scoring in fp32" in text
    assert [m.label for m in at.metric] == ["Full precision (16-bit)", "Round-to-nearest", "AWQ", "GPTQ"]
    assert len(at.get("plotly_chart")) == 5  # the CPU bench's every-bit-width chart among them


@pytest.mark.parametrize("page_file", ["15_weight_quantization.py", "16_lora_merge.py", "18_activation_quantization.py",
                                       "19_parallelism.py"])
def test_lab_pages_run_their_default_on_a_gpu_server(gpu_app: AppTest, page_file: str) -> None:
    """The calibrate-and-compare pages run their default lab on a GPU server (random bf16 weights there) without
    an error; those that run the live engine say which GPU."""
    at = open_page(gpu_app, page_file)
    assert_clean(at)
    text = _texts(at)
    if page_file not in ("18_activation_quantization.py", "19_parallelism.py"):  # those labs run in fp32 on the CPU
        assert torch.cuda.get_device_name() in text, text[:800]


def test_quantspec_section_on_the_gpu(gpu_app: AppTest) -> None:
    """The speculative page's self-speculation lab on a GPU server (bf16, the KV lab on CUDA): every format with
    16-bit and INT4 draft weights runs, and each text is the target's own."""
    at = open_page(gpu_app, "07_speculative_decoding.py")
    assert_clean(at)
    at.number_input(key="spec-qs-tokens").set_value(8)
    at.button(key="FormSubmitter:spec-qs-form-Self-speculate with every cache format").click().run(timeout=300)
    assert_clean(at)
    table = at.dataframe[-1].value
    assert len(table) == 8, table
    assert {m.label for m in at.metric} >= {"Same text as the target alone", "Best tokens per target pass"}


def test_latent_kv_section_on_the_gpu(gpu_app: AppTest) -> None:
    """The KV cache page's MLA lab on a GPU server: the factoring and the latent decoder run there too."""
    at = open_page(gpu_app, "01_kv_cache.py")
    assert_clean(at)
    at.selectbox(key="kv-mla-rank").set_value(64)
    at.number_input(key="kv-mla-tokens").set_value(4)
    at.button(key="FormSubmitter:kv-mla-form-Factor, score and answer").click().run(timeout=300)
    assert_clean(at)
    assert next(m for m in at.metric if m.label == "Numbers per token and layer").value == "64"
