"""CUDA graph captures: alone on the GPU, and with Python's garbage collector paused.

Alone: another thread's synchronize or allocation during a capture fails and invalidates the capture
(kernels/device_gate.py). Collector: an engine dropped by a page or a test often lives on in a reference cycle
until the collector runs, and the collector runs whenever enough Python objects have been allocated, which a
capture does plenty of. If it ran during a capture, the dead engine's graphs would be destroyed while a stream
is capturing; CUDA refuses (`operation not permitted when stream is capturing (function reset)` from torch's
CUDAGraph::reset) and invalidates the capture (`operation failed due to a previous error during capture`,
reproduced on the H200 by tests/test_graph_capture.py with the pause switched off). `torch.cuda.graph` no
longer collects before a capture (torch.compiler.config.force_cudagraph_gc, off by default, because a full
collection per capture is slow), so captures here pause automatic collection; garbage waits until they end.

A capture waits at most CAPTURE_WAIT_S for the GPU, then GpuBusy (the engines then run the step eagerly), and
for BACKOFF_S after that captures give up at once rather than stall every step while someone's long run lasts.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Iterator

import torch

from kernels.device_gate import DEVICE_GATE, GpuBusy


# Captures can overlap in time (Streamlit runs each session's script in its own thread), and the
# collector's switch is process-wide: the first block to enter turns it off, the last to leave restores it.
_lock = threading.Lock()
_depth = 0
_was_enabled = True


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block (an explicit `gc.collect()` still works); the
    collector's previous state is restored when the last such block, in any thread, has ended."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


# How long a capture waits for the other visitors' GPU work to pause. Their steps take milliseconds, so a
# longer wait means someone's long run (a lab) holds the GPU: the step that wanted the graph runs eagerly, and
# for BACKOFF_S after that no capture waits at all. Without the back-off every step of this visitor would stall
# for CAPTURE_WAIT_S while that run lasts, and hold everyone's fresh GPU work behind its waiting capture as long.
CAPTURE_WAIT_S = 5.0
BACKOFF_S = 15.0
_busy_until = 0.0  # time.monotonic() before which captures give up at once


@contextlib.contextmanager
def capture_session() -> Iterator[None]:
    """Around one or more captures: no other thread's GPU work (kernels/device_gate.py) and no collection.
    Raises GpuBusy before anything runs when the GPU was not free within CAPTURE_WAIT_S, or at once during
    the back-off after such a wait; a thread already inside its own session is never refused."""
    global _busy_until
    with contextlib.ExitStack() as stack:
        if not DEVICE_GATE.captures_here():  # (a re-entry is counted and never waits)
            with _lock:
                if time.monotonic() < _busy_until:
                    raise GpuBusy("Another session is running long work on the GPU, so a CUDA graph cannot be "
                                  "captured now. Try again in a moment.")
        try:
            stack.enter_context(DEVICE_GATE.exclusive(timeout_s=CAPTURE_WAIT_S))
        except GpuBusy:
            with _lock:
                _busy_until = time.monotonic() + BACKOFF_S
            raise
        stack.enter_context(gc_paused())
        yield


@contextlib.contextmanager
def capture_graph(graph: "torch.cuda.CUDAGraph", pool: object | None = None) -> Iterator[None]:
    """`torch.cuda.graph(graph, pool=pool)` inside a capture session."""
    with capture_session(), torch.cuda.graph(graph, pool=pool):
        yield
