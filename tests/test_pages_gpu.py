"""On a CUDA machine: what the attention roofline and FlashAttention-2 pages compute there, called
without Streamlit (the analysis behind the pages, which must report our Triton kernels, timed with CUDA
events, with their FLOPs and bytes); `test_app_gpu.py` runs the pages themselves there. (Skipped without
CUDA.)"""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels.ceilings import ceilings_for, lookup_ceilings, measure_ceilings

from app.analysis.flash_compare import compare_methods
from app.analysis.flash_qkv import LayerQKV
from app.analysis.roofline_math import family_points, kernel_points, linear_intensity, step_phase

pytestmark = pytest.mark.gpu
CFG = ModelConfig()


def test_ceilings_measured_on_the_gpu() -> None:
    """The roofline page's two ceilings, measured at start: bf16 tensor-core FLOP/s and copy bandwidth
    in the range an H100/H200-class part reaches (the H200 table: 790 TFLOP/s dense, 4.26 TB/s copy)."""
    c = measure_ceilings("cuda")
    assert c.dtype == "bfloat16" and "measured" in c.source
    assert 100e12 < c.peak_flops < 2e15, c
    assert 1e12 < c.peak_bytes_per_s < 10e12, c
    assert measure_ceilings("cuda") is c  # once per process, as the page relies on
    table = lookup_ceilings(torch.cuda.get_device_name())
    if table is not None:  # the same card: the measurement within a factor 2 of the table
        assert 0.5 < c.peak_flops / table.peak_flops < 2 and 0.5 < c.peak_bytes_per_s / table.peak_bytes_per_s < 2
        assert ceilings_for("cuda", prefer_table=True) is table


def _random_qkv(n: int, device: str, dtype: torch.dtype) -> LayerQKV:
    g = torch.Generator(device="cpu").manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
    q, k, v = (torch.randn(n, h, 64, generator=g).to(device=device, dtype=dtype) for h in (9, 3, 3))
    return LayerQKV(0, tuple(range(n)), q, k, v, 0.125)


def test_flash_page_times_the_triton_kernel() -> None:
    """The FlashAttention-2 page's table on a GPU: every CPU-era method plus our Triton FA2 kernel in
    the engine's dtype and in fp32, each with a measured time and an error against float64 naive
    attention within its dtype's tolerance."""
    results = compare_methods(_random_qkv(300, "cuda", torch.bfloat16), 16, 32, reps=3, engine_dtype=torch.bfloat16)
    by_name = {r.method: r for r in results}
    assert "Triton FA2 kernel (bfloat16)" in by_name and "Triton FA2 kernel (float32)" in by_name, list(by_name)
    for r in results:
        assert not r.error, r
        assert r.device == torch.cuda.get_device_name() and r.ms > 0, r
    assert by_name["Triton FA2 kernel (bfloat16)"].rel_err < 1e-2
    assert "64 x 64 tiles" in by_name["Triton FA2 kernel (bfloat16)"].what  # 300 tokens: the default tiles
    fp32 = by_name["Triton FA2 kernel (float32)"]
    assert "IEEE fp32" in fp32.what and fp32.rel_err < 1e-5  # the engine's setting (kernels/dispatch.py)
    assert by_name["torch SDPA"].rel_err < 1e-5  # fp32 inputs upcast from the same bf16 values
    assert [r.materialises_scores for r in results][:2] == [True, False]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_roofline_points_from_triton_kernel_timings(random_weights, dtype: str) -> None:  # noqa: ANN001
    """The roofline page's live markers on a GPU: a prefill step and decode steps of the engine with
    our Triton kernels, every attention call timed by CUDA events and counted, prefill attention far
    right of decode attention, decode linear layers at the batch's intensity."""
    engine = LLMEngine(EngineConfig(device="cuda", weights="random", dtype=dtype, kernel_backend="triton",
                                    num_blocks=128, max_num_batched_tokens=1024, max_model_len=1024),
                       random_weights)
    engine.add_request(list(range(1000, 1600)), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request(list(range(2000, 2300)), SamplingParams(max_tokens=4, ignore_eos=True))
    records = [engine.step() for _ in range(3)]
    prefill, decode = records[0], records[1]
    assert step_phase(prefill) == "prefill" and step_phase(decode) == "decode"
    assert "triton" in prefill.backend.lower()
    pre = {p.name: p for p in kernel_points(prefill)}
    dec = {p.name: p for p in kernel_points(decode)}
    for pts, name in ((pre, "attention.prefill"), (dec, "attention.decode")):
        att = pts[name]
        assert att.backend == "triton" and att.calls == CFG.num_layers, att
        assert att.seconds > 0 and att.flops > 0 and att.bytes > 0, att
    assert pre["attention.prefill"].intensity > 20 * dec["attention.decode"].intensity
    elem = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    for name in ("linear.qkv", "linear.o", "linear.gate_up", "linear.down"):
        assert dec[name].intensity == pytest.approx(linear_intensity(CFG, 2, elem), rel=0.1)
        assert pre[name].intensity > 20 * dec[name].intensity
    # The step's wall time bounds what its kernels' events measured (they ran inside it).
    for r in (prefill, decode):
        assert 0 < sum(k.seconds for k in r.kernels) <= r.wall_seconds * 1.05
        assert sum(p.flops for p in family_points(kernel_points(r))) > 0
