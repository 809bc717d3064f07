"""Per-call kernel timing with FLOP and byte counts, aggregated per step.

On the CPU a call is timed with the host clock. On CUDA it is bracketed by CUDA events that are
only read when the step is drained, so timing adds no host-device synchronisation per call.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from engine.trace import KernelTiming


@dataclass(slots=True)
class _Pending:
    name: str
    backend: str
    flops: float
    bytes: float
    seconds: float = 0.0
    start: "torch.cuda.Event | None" = None
    end: "torch.cuda.Event | None" = None


class KernelTimer:
    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device = device
        self.enabled = enabled
        self._pending: list[_Pending] = []

    @contextmanager
    def timed(self, name: str, backend: str, flops: float = 0.0, nbytes: float = 0.0) -> Iterator[None]:
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not self.enabled or capturing:
            yield
            return
        rec = _Pending(name, backend, float(flops), float(nbytes))
        if self.device.type == "cuda":
            rec.start = torch.cuda.Event(enable_timing=True)
            rec.end = torch.cuda.Event(enable_timing=True)
            rec.start.record()
            yield
            rec.end.record()
        else:
            t0 = time.perf_counter()
            yield
            rec.seconds = time.perf_counter() - t0
        self._pending.append(rec)

    def add(self, name: str, backend: str, seconds: float, flops: float = 0.0, nbytes: float = 0.0) -> None:
        """Record a region timed elsewhere (a CUDA graph replay, say)."""
        if self.enabled:
            self._pending.append(_Pending(name, backend, float(flops), float(nbytes), seconds))

    def add_cuda_region(self, name: str, backend: str, host_start: float) -> None:
        """A region whose work is already queued (a graph replay): time it by synchronising."""
        if self.enabled:
            torch.cuda.synchronize(self.device)
            self._pending.append(_Pending(name, backend, 0.0, 0.0, time.perf_counter() - host_start))

    def drain(self) -> tuple[KernelTiming, ...]:
        """Aggregate everything since the last drain by (name, backend)."""
        if not self._pending:
            return ()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for r in self._pending:
            secs = r.start.elapsed_time(r.end) / 1e3 if r.start is not None else r.seconds
            a = agg[(r.name, r.backend)]
            a[0] += 1
            a[1] += secs
            a[2] += r.flops
            a[3] += r.bytes
        self._pending.clear()
        return tuple(KernelTiming(n, b, int(a[0]), a[1], a[2], a[3]) for (n, b), a in agg.items())
