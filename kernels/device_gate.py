"""One process, one GPU, several threads: ordinary GPU work runs side by side, a CUDA graph capture runs alone.

A GPU server gives every visitor's page its own Streamlit script thread, and each drives its own engines.
While one thread captures a CUDA graph, CUDA refuses a device-wide synchronize, a synchronous copy or an
allocation from any other thread (`operation not permitted when stream is capturing`) and, having refused,
invalidates the capture too (`operation failed due to a previous error during capture`): measured on the H200
with an eagerly stepping engine beside engines that capture (bench/capture_beside_other_sessions.py), in
CUDA's global and thread-local capture modes alike. So the gate is a readers-writer lock: `shared()` around
GPU work (a script run, an engine step), `exclusive()` around a capture. A capture waits until every other
thread has left its shared sections and new ones wait for the capture.

Re-entrant both ways (a capture happens inside the capturing thread's own step). A thread that waits for
the capture does not count against it, so two threads that both want to capture do not wait for each
other; `released()` lets a thread block on something else (another visitor's run of the same lab) without
holding up a capture. As a last guard against a wait nobody foresaw, `exclusive()` gives up after
`timeout_s` with GpuBusy, a message a page can show.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

EXCLUSIVE_TIMEOUT_S = 120.0


class GpuBusy(RuntimeError):
    """Other work kept the GPU for longer than a capture may wait."""


class DeviceGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared: dict[int, int] = {}  # thread -> depth of its shared sections
        self._owner: int | None = None  # the thread capturing
        self._owner_depth = 0
        self._waiting: set[int] = set()  # threads waiting to capture

    def _others_busy(self, me: int) -> bool:
        return any(t != me and t not in self._waiting for t in self._shared)

    def _open(self) -> bool:
        """Fresh shared work may start: no capture under way or asked for (else a stream of short steps from
        other visitors could keep a capture waiting for ever)."""
        return self._owner is None and not self._waiting

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """GPU work that may overlap other threads' GPU work, but not a capture."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me and not self._shared.get(me):
                self._cond.wait_for(self._open)
            self._shared[me] = self._shared.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._shared[me] -= 1
                if not self._shared[me]:
                    del self._shared[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, timeout_s: float | None = None) -> Iterator[None]:
        """No other thread's GPU work inside (the capturing thread's own shared sections do not count)."""
        me = threading.get_ident()
        timeout_s = EXCLUSIVE_TIMEOUT_S if timeout_s is None else timeout_s
        with self._cond:
            if self._owner == me:
                self._owner_depth += 1
            else:
                self._waiting.add(me)
                try:
                    if not self._cond.wait_for(lambda: self._owner is None and not self._others_busy(me),
                                               timeout=timeout_s):
                        raise GpuBusy(f"Another session kept the GPU busy for {timeout_s:.0f} s, so a CUDA graph "
                                      "could not be captured. Try again in a moment.")
                finally:
                    self._waiting.discard(me)
                    self._cond.notify_all()
                self._owner, self._owner_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._owner_depth -= 1
                if not self._owner_depth:
                    self._owner = None
                self._cond.notify_all()

    def captures_here(self) -> bool:
        """This thread holds the gate exclusively (it is inside its own capture session)."""
        with self._cond:
            return self._owner == threading.get_ident()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """This thread's shared sections put aside while it blocks on something else, then taken up again
        (waiting, like any fresh entry, for a capture under way)."""
        me = threading.get_ident()
        with self._cond:
            depth = self._shared.pop(me, 0)
            self._cond.notify_all()
        try:
            yield
        finally:
            if depth:
                with self._cond:
                    if self._owner != me:
                        self._cond.wait_for(self._open)
                    self._shared[me] = self._shared.get(me, 0) + depth


# The process's one gate (one GPU per process here; a gate per device would be the same code).
DEVICE_GATE = DeviceGate()


def gpu_work(device: "torch.device | str") -> contextlib.AbstractContextManager:
    """A shared section of the gate on a CUDA device; nothing on the CPU, where there are no captures."""
    return DEVICE_GATE.shared() if torch.device(device).type == "cuda" else contextlib.nullcontext()
