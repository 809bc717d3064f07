"""Time one decode attention call over a BF16, FP8, INT8 and INT4 KV pool on the GPU (the KV compression page
and bench/kv_quant_decode.py both call `time_quant_decode`).

Inputs are SmolLM2's decode shape (9 query heads, 3 KV heads of dim 64) over shuffled 16-token pages in the
engine's head-major layout. Each call is replayed from a CUDA graph (launch overhead out, as in the engine's
decode) over enough independent input sets that together they hold 4x the L2, so no call finds its pool still
cached by the one before: the time is what streaming the pool from HBM costs. Triton is imported only when
timing, so a CPU-only app can read measured records without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from engine.kv_compression.formats import get_format
from kernels.graph_capture import capture_graph
from kernels.paged_decode_quant_ref import paged_decode_quant_ref
from kernels.quant_kv_pool import KERNEL_FORMATS, QuantizedPool, quantize_pool

HQ, HKV, D, PAGE = 9, 3, 64, 16
L2_BYTES = 60 * 2**20  # a little above the H200's 50 MB L2
BF16_BYTES_PER_TOKEN = 2 * HKV * D * 2


@dataclass(frozen=True, slots=True)
class FormatTiming:
    """The fused kernel reading a pool in one format."""

    fmt: str
    bytes_per_token: int  # K and V of all KV heads, scales and zero points included
    us: float  # per call
    rel_err: float  # against the reference in fp32 (dequantize, then attend)


@dataclass(frozen=True, slots=True)
class QuantDecodeTimings:
    """One decode attention call at (batch, context) in every format, next to the engine's BF16 kernel."""

    batch: int
    context: int
    device: str
    engine_bf16_us: float  # kernels/paged_attention_triton.py on a BF16 pool: what the engine runs
    unfused_int4_us: float  # the INT4 pool dequantized into a BF16 copy, then the engine's kernel
    formats: tuple[FormatTiming, ...]
    splits: int  # how many ways the fused kernel splits each context (split-KV)

    def format(self, name: str) -> FormatTiming:
        return next(f for f in self.formats if f.fmt == name)

    def speedup(self, name: str) -> float:
        """How many times faster than the engine's BF16 kernel."""
        return self.engine_bf16_us / self.format(name).us

    def bandwidth_tbps(self, name: str) -> float:
        """Pool bytes read per second by the fused kernel in this format."""
        f = self.format(name)
        return self.batch * self.context * f.bytes_per_token / (f.us * 1e-6) / 1e12


def rotating_sets(bytes_per_set: int) -> int:
    return max(1, math.ceil(4 * L2_BYTES / bytes_per_set))


def _decode_set(batch: int, context: int, gen: torch.Generator) -> dict:
    pages = batch * (-(-context // PAGE))
    kc, vc = (torch.randn(pages, HKV, PAGE, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
              for _ in range(2))
    tables = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(batch, -1)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    return {"q": q, "kc": kc, "vc": vc, "tables": tables}


def graph_time_us(calls: list[Callable[[], object]], reps: int = 100) -> float:
    """Median microseconds per call of `calls`, all replayed from one CUDA graph."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        for c in calls:
            c()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


def _format_sets(fmt: str, batch: int, context: int, gen: torch.Generator) -> list[dict]:
    per_token = get_format(fmt).bytes_per_token(1, HKV, D)  # one layer's K and V, scales included
    sets = []
    for _ in range(rotating_sets(batch * context * per_token)):
        s = _decode_set(batch, context, gen)
        sets.append({"q": s["q"], "tables": s["tables"], "pool": quantize_pool(s["kc"], s["vc"], fmt)})
    return sets


def time_quant_decode(batch: int, context: int, *, seed: int = 0, reps: int = 100,
                      check_upto: int = 8192) -> QuantDecodeTimings:
    """Time every format at this shape (CUDA only). Contexts up to `check_upto` also check the fused kernel
    against its reference."""
    if not torch.cuda.is_available():
        raise RuntimeError("the Triton decode kernels need a CUDA GPU")
    import kernels.paged_attention_triton as pa
    from kernels.paged_decode_quant_triton import decode_splits, paged_decode_quant_triton

    if batch < 1 or context < 1:
        raise ValueError("batch and context must be at least 1")
    dev = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scale = D ** -0.5
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=dev)

    sets = [_decode_set(batch, context, gen) for _ in range(rotating_sets(batch * context * BF16_BYTES_PER_TOKEN))]
    engine_us = graph_time_us([
        lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], lens, starts, 1, context, scale)
        for s in sets], reps)
    del sets

    timings, unfused_us = [], float("nan")
    for fmt in KERNEL_FORMATS:
        sets = _format_sets(fmt, batch, context, gen)
        first = sets[0]
        pool: QuantizedPool = first["pool"]
        err = float("nan")
        if context <= check_upto:
            ref = paged_decode_quant_ref(first["q"].float(), pool, first["tables"], lens, context, scale)
            out = paged_decode_quant_triton(first["q"], pool, first["tables"], lens, context, scale)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
        us = graph_time_us([
            lambda s=s: paged_decode_quant_triton(s["q"], s["pool"], s["tables"], lens, context, scale)
            for s in sets], reps)
        timings.append(FormatTiming(fmt, pool.bytes_per_token(), us, err))
        if fmt == "int4":
            def unfused(s=first):  # what the lab's torch path does: a BF16 copy of the whole pool, then attention
                kc, vc = s["pool"].dequantized(torch.bfloat16)
                return pa.paged_attention_triton(s["q"], kc, vc, s["tables"], lens, starts, 1, context, scale)
            unfused_us = graph_time_us([unfused], reps)
        del sets, first, pool
    torch.cuda.empty_cache()
    return QuantDecodeTimings(batch, context, torch.cuda.get_device_name(dev), engine_us, unfused_us,
                              tuple(timings), decode_splits(batch, HQ, HKV, context, dev))
