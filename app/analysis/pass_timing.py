"""Timing one forward pass of the live model over a fixed batch: on a GPU replayed from a CUDA graph, on a
CPU launched as it is.

Why graphs on a GPU: an eager pass of this model launches ~400 small kernels from Python, 14-27 ms of host
time on an H100 while the GPU works for 0.5-1.3 ms. Timed that way a pass over 1 row and one over 128 rows
cost the same, and the chart would show Python rather than the hardware. A serving engine replays
fixed-shape passes from graphs (engine/cuda_graphs.py), so the replayed time is what a pass costs there.
On a CPU the arithmetic itself dominates, and the wall-clock time of the eager pass is the cost.
"""
from __future__ import annotations

import enum
import functools
import time
from typing import Callable

import torch

from engine.engine import LLMEngine
from engine.forward_batch import ForwardBatch
from engine.kv_pool import KVPool
from kernels.device_gate import GpuBusy
from kernels.graph_capture import capture_graph

PassTimer = Callable[[], float]  # runs the pass once and returns its seconds


class PassTiming(enum.Enum):
    """How a pass was timed."""

    GRAPH = "replayed from a CUDA graph"
    EAGER = "an eager pass"  # a CPU: the arithmetic is the cost
    EAGER_ON_GPU = "an eager pass on a GPU"  # no graph could be captured: the time is mostly Python's launches


_NOTES = {
    PassTiming.GRAPH: ("Each pass is replayed from a CUDA graph, as a serving engine runs one: launched one kernel "
                       "at a time from Python, every size took about as long as its ~400 launches, and the chart "
                       "would show that."),
    PassTiming.EAGER_ON_GPU: ("These passes ran one kernel at a time from Python: no CUDA graph could be captured "
                              "(another session's long run may hold the GPU). Each time is then mostly the ~400 "
                              "launches, which hide what the rows cost; measure again once the GPU is free."),
}


def timing_note(timing: PassTiming) -> str:
    """The sentence a caption adds about how its passes were timed ("" for eager passes on a CPU)."""
    return _NOTES.get(timing, "")


def pass_timers(engine: LLMEngine, batches: list[ForwardBatch],
                pool: KVPool) -> tuple[list[PassTimer], PassTiming]:
    """One timer per batch, and how they time: CUDA graph replays on a GPU, eager passes on the wall clock on a
    CPU. A GPU whose graphs cannot be captured now (another session's long run holds it: GpuBusy; a path that
    cannot be captured: RuntimeError) falls back to eager passes, which `timing_note` then says."""
    eager = [functools.partial(_eager_seconds, engine, b, pool) for b in batches]
    if engine.device.type != "cuda":
        return eager, PassTiming.EAGER
    from kernels.paged_attention_triton import last_tree_mask_buffers  # Triton: only where there is a GPU

    timers = []
    try:
        for batch in batches:
            engine.model.forward(batch, pool)  # compiles and first allocations happen outside the capture
            torch.cuda.synchronize(engine.device)
            graph = torch.cuda.CUDAGraph()
            with capture_graph(graph):
                engine.model.forward(batch, pool)
            # The graph reads the batch's and the pool's tensors and, for a tree batch, the masks the attention
            # kernel flattened into its own cache, which the next batch's masks replace: all held with the graph.
            keep = (batch, pool, last_tree_mask_buffers() if batch.tree_masks else ())
            timers.append(functools.partial(_replay_seconds, graph, keep))
    except (GpuBusy, RuntimeError):
        return eager, PassTiming.EAGER_ON_GPU
    return timers, PassTiming.GRAPH


def _eager_seconds(engine: LLMEngine, batch: ForwardBatch, pool: KVPool) -> float:
    t0 = time.perf_counter()
    engine.model.forward(batch, pool)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - t0


def _replay_seconds(graph: torch.cuda.CUDAGraph, inputs: tuple[object, ...]) -> float:
    del inputs  # only kept alive with the graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3
