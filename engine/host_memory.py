"""Keep freed host memory for reuse instead of handing it back to the OS after every step (glibc).

A CPU forward pass allocates and frees multi-megabyte temporaries in every layer (the decode
attention's gathered K/V pages: ~4 MB each at 16 rows of ~300 tokens). glibc's defaults decide
per process, from the order of earlier allocations, whether such blocks come from fresh `mmap`
pages or from the heap, and it trims the heap's free top back to the OS: when they are fresh
pages, every use faults them in again. Measured on the 2-core CI machine (16 decode rows, 30
layers of the CPU reference attention, one process each): about half the processes ran at
27-29 ms a pass with ~0.19 M minor page faults, the other half at 79-112 ms with ~1.4 M; with the
two thresholds below, every process ran at 27-30 ms.

Fixing both thresholds keeps blocks up to 32 MB on the heap and keeps up to 256 MB of free heap
for reuse. That is process-wide, so it costs the host process that much memory that could have
been returned; the engine calls it when it is built.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed value on 64-bit
_TRIM_THRESHOLD_BYTES = 256 << 20

_applied = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once per process; False where there is no glibc
    `mallopt` (not Linux, or another C library), which leaves the allocator as it was."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success.
    _applied = (mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
                and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1)
    return _applied
