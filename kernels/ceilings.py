"""The device's two roofline ceilings, measured here: peak FLOP/s and memory bandwidth.

A roofline is only honest against ceilings measured on the machine that ran the kernels, so the app
measures both when it starts (once per process): a dense matmul for FLOP/s and a large tensor copy
for bytes/s (a copy reads and writes every byte, so bytes moved = 2 x tensor size).

- CPU: fp32 matmuls (torch.mm and the engine's own linear op at each of its weight shapes) and a 64 MiB
  copy, with the torch thread count the engine uses; about 1 s.
- CUDA: a bf16 matmul and a 1 GiB device copy, timed with CUDA events; well under 1 s.

`REFERENCE_CEILINGS` holds values measured earlier on real GPUs, to look up instead of measuring
(and to show next to a CPU roofline for scale). Never datasheet numbers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

import torch


@dataclass(frozen=True, slots=True)
class Ceilings:
    peak_flops: float  # FLOP/s of a dense matmul at `dtype`
    peak_bytes_per_s: float  # bytes/s of a large copy (read + write counted)
    source: str  # how these numbers were obtained, in words
    dtype: str  # "float32", "bfloat16"

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the bandwidth slope meets the compute roof."""
        return self.peak_flops / self.peak_bytes_per_s

    def attainable(self, intensity: float) -> float:
        """The roofline: min(peak FLOP/s, bandwidth x intensity)."""
        return min(self.peak_flops, self.peak_bytes_per_s * intensity)

    def bound(self, intensity: float) -> str:
        return "compute-bound" if intensity >= self.ridge else "memory-bound"


@dataclass(frozen=True, slots=True)
class ReferenceDevice:
    """Numbers measured on a GPU we had (bench/kernels.py and the lead's runs)."""

    name: str
    ceilings: Ceilings
    notes: tuple[tuple[str, str], ...] = ()  # (what, measured value) for the table on the page
    # (kernel path key, ms): the median decode step of the roofline page's first scenario on each of
    # app.analysis.kernel_paths.PATHS, for servers that cannot run them all
    kernel_paths_ms: tuple[tuple[str, float], ...] = ()
    memory_bytes: float = 0.0  # device memory torch reports there (for "does this batch fit?")
    multiprocessors: int = 0  # SMs: how many programs fill it (the split-KV planner's input)


REFERENCE_CEILINGS: dict[str, ReferenceDevice] = {
    "NVIDIA H200": ReferenceDevice(
        "NVIDIA H200",
        Ceilings(790e12, 4.26e12, "table: measured on an H200 (bf16 dense matmul, device copy)", "bfloat16"),
        (("bf16 dense matmul", "≈ 790 TFLOP/s"),
         ("device copy (read + write)", "≈ 4.26 TB/s"),
         # The attention rows: one bench/kernels.py run (bench/results/kernels_h200_v32.json), 32k tokens a
         # prefill launch, B = 64 for decode.
         ("torch SDPA, causal prefill, 9 heads, D = 64", "247–436 TFLOP/s (L = 512 … 8192)"),
         ("torch SDPA, decode over the KV cache, B = 64", "2.8–4.3 TB/s (L = 1k … 32k)"),
         ("our Triton FA2 prefill (bench/kernels.py)", "0.94–0.97 × SDPA (L = 1024 … 8192; 0.85 × at 512)"),
         ("our Triton paged decode, B = 64 (bench/kernels.py)", "2.8–4.3 TB/s, 0.96–1.00 × SDPA (L = 1k … 32k)")),
        # app.analysis.kernel_paths.run_paths on the roofline page's first scenario, random bf16 weights, the
        # second of two passes (bench/results/kernel_paths_h200_v19.json): median decode step per kernel path.
        (("torch", 50.8), ("triton", 22.6), ("graphs", 1.07)),
        # torch.cuda.get_device_properties(0).total_memory there: 139.80 GiB
        139.80 * 2**30,
        132,  # torch.cuda.get_device_properties(0).multi_processor_count there
    ),
}


def lookup_ceilings(device_name: str) -> Ceilings | None:
    """Reference values for a GPU by name (exact, then substring: 'NVIDIA H200 NVL' -> H200)."""
    if device_name in REFERENCE_CEILINGS:
        return REFERENCE_CEILINGS[device_name].ceilings
    for name, ref in REFERENCE_CEILINGS.items():
        if name in device_name or device_name in name:
            return ref.ceilings
    return None


def memory_capacity(device: str | torch.device) -> float:
    """Bytes of memory the device has: a GPU's total memory, or the machine's RAM for the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# ---- measuring ----------------------------------------------------------------------------------

def _engine_linear_shapes() -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each linear a layer of the model runs on the CPU path, by name."""
    from engine.config import ModelConfig

    m = ModelConfig()
    qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    return {"fused q/k/v projection": (qkv, m.hidden_size),
            "output projection": (m.hidden_size, m.num_heads * m.head_dim),
            "fused gate/up projection": (2 * m.intermediate_size, m.hidden_size),
            "down projection": (m.hidden_size, m.intermediate_size)}


def _best_seconds(fns: dict[str, Callable[[], None]], rounds: int, budget_s: float) -> dict[str, float]:
    """Best wall time of each function (the best run is the least disturbed one on a shared machine), run in
    turn for up to `rounds` rounds, stopping early once `budget_s` is spent.

    Interleaving matters on a shared machine: a burst of load from another process slows whichever
    functions run during it, and taking turns spreads every function across the same quiet and busy
    moments instead of timing one of them only in a busy window."""
    for fn in fns.values():
        fn()  # warm-up: allocation, page faults, oneDNN primitive creation
    best = dict.fromkeys(fns, float("inf"))
    start = time.perf_counter()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


def _measure_cpu(dtype: torch.dtype) -> Ceilings:
    """The fastest of the dense matmuls the engine could run, and a copy far larger than any cache.

    The engine's CPU linears run oneDNN's inner product on packed weights (kernels/cpu_linear.py),
    which beats torch.mm's MKL sgemm on a small CPU, so a ceiling from torch.mm alone put the
    engine's prefill linears above the roof. Nor is one weight shape the fastest everywhere: timed one
    at a time on this development machine, the fused gate/up projection ran 6 % slower than the
    output projection. And on the CI machine, with a browser test running beside it, the engine's
    linears measured 1.17x a ceiling taken once, in a short window, from gate/up alone. So the roof is
    the fastest of a square torch.mm and the engine's own op at each of its weight shapes, with a full
    prefill chunk's rows, timed in turns."""
    from kernels.cpu_linear import cpu_linear, pack_linear_weight

    n, rows = 768, 512
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    fns: dict[str, Callable[[], None]] = {f"{n}³ torch.mm": lambda: torch.mm(a, b, out=c)}
    flops = {f"{n}³ torch.mm": 2 * n ** 3}
    for proj, (out_f, in_f) in _engine_linear_shapes().items():
        x = torch.randn(rows, in_f, dtype=dtype)
        w = pack_linear_weight(torch.randn(out_f, in_f, dtype=dtype))
        label = f"{proj} {rows}×{in_f} · {in_f}×{out_f} (the engine's oneDNN linear)"
        fns[label] = partial(cpu_linear, x, w)
        flops[label] = 2 * rows * out_f * in_f
    numel = 16 * 1024 * 1024  # 64 MiB of fp32: far larger than any CPU cache
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _best_seconds({**fns, "copy": lambda: dst.copy_(src)}, rounds=8, budget_s=1.2)
    rates = {label: flops[label] / seconds[label] for label in fns}
    fastest = max(rates, key=rates.__getitem__)
    threads = torch.get_num_threads()
    name = str(dtype).removeprefix("torch.")
    return Ceilings(rates[fastest], 2 * src.numel() * src.element_size() / seconds["copy"],
                    f"measured now on this CPU ({threads} torch thread{'s' if threads != 1 else ''}): "
                    f"the fastest {name} matmul was the {fastest}; 64 MiB copy", name)


def _measure_cuda(device: torch.device, dtype: torch.dtype) -> Ceilings:
    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def timed(fn: Callable[[], None], reps: int) -> float:
        fn()
        torch.cuda.synchronize(device)
        best = float("inf")
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    mm = timed(partial(torch.mm, a, b), reps=10)
    del a, b
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)  # 1 GiB: far beyond L2
    dst = torch.empty_like(src)
    cp = timed(partial(dst.copy_, src), reps=10)
    del src, dst
    name = torch.cuda.get_device_name(device)
    return Ceilings(2 * n ** 3 / mm, 2 * (1 << 30) / cp,
                    f"measured now on {name}: {n}³ {str(dtype).removeprefix('torch.')} matmul, 1 GiB device copy",
                    str(dtype).removeprefix("torch."))


@lru_cache(maxsize=8)
def _measure_cached(device: str, dtype: str) -> Ceilings:
    dev = torch.device(device)
    dt = getattr(torch, dtype)
    if dev.type == "cuda":
        return _measure_cuda(dev, dt)
    return _measure_cpu(dt)


def measure_ceilings(device: str | torch.device = "cpu", dtype: str | None = None, *,
                     fresh: bool = False) -> Ceilings:
    """Peak FLOP/s and bandwidth of `device`, measured once per process (`fresh=True` re-measures).

    dtype defaults to what the engine runs there: float32 on the CPU, bfloat16 on CUDA."""
    dev = torch.device(device)
    if dtype is None:
        dtype = "bfloat16" if dev.type == "cuda" else "float32"
    key = (str(dev), dtype)
    if fresh:
        _measure_cached.cache_clear()
    return _measure_cached(*key)


def ceilings_for(device: str | torch.device, prefer_table: bool = False) -> Ceilings:
    """Measured ceilings, or the reference table's values for this GPU when `prefer_table` and the GPU
    is known (saves the measurement; the source string says which)."""
    dev = torch.device(device)
    if prefer_table and dev.type == "cuda":
        known = lookup_ceilings(torch.cuda.get_device_name(dev))
        if known is not None:
            return known
    return measure_ceilings(dev)
