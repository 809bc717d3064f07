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
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

import torch

from kernels.device_gate import DEVICE_GATE


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


@contextlib.contextmanager
def capture_session() -> Iterator[None]:
    """Around one or more captures: no other thread's GPU work (kernels/device_gate.py) and no collection."""
    with DEVICE_GATE.exclusive(), gc_paused():
        yield


@contextlib.contextmanager
def capture_graph(graph: "torch.cuda.CUDAGraph", pool: object | None = None) -> Iterator[None]:
    """`torch.cuda.graph(graph, pool=pool)` inside a capture session."""
    with capture_session(), torch.cuda.graph(graph, pool=pool):
        yield
