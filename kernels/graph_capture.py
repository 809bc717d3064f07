"""CUDA graph capture with Python's garbage collector paused.

An engine dropped by a page or a test often lives on in a reference cycle until the collector runs, and
the collector runs whenever enough Python objects have been allocated, which a capture does plenty of.
If it runs during a capture, the dead engine's CUDA graphs are destroyed while a stream is capturing:
CUDA refuses (`operation not permitted when stream is capturing (function reset)` from torch's
CUDAGraph::reset), the old graphs leak, and freeing their memory and pinned buffers races the capture in
progress. `torch.cuda.graph` stopped collecting before a capture (torch.compiler.config.force_cudagraph_gc,
off by default, because a full collection per capture is slow), so every capture here pauses automatic
collection instead; garbage waits until the capture has ended.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

import torch


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
def capture_graph(graph: "torch.cuda.CUDAGraph", pool: object | None = None) -> Iterator[None]:
    """`torch.cuda.graph(graph, pool=pool)` with the collector paused for the whole capture."""
    with gc_paused(), torch.cuda.graph(graph, pool=pool):
        yield
