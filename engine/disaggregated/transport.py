"""How the prompt's KV travels from the prefill worker's pool to the decode worker's.

- `SharedMemoryTransport` (CPU): the blocks are gathered straight into a POSIX shared-memory segment
  that any process on the machine can attach by name (the "hand-rolled shm" handoff of seed chapter
  10), and the receiver copies them from the segment into blocks of its own pool. Both workers live in
  one process here, but the bytes really go through the segment, copied once each way.
- `DeviceCopyTransport` (CUDA): both workers share this machine's one GPU, so the handoff is a device
  copy; between two GPUs it would be NVLink or RDMA (NIXL, Mooncake) doing the same job.

A transport ships one request's blocks: `send` returns a `Parcel`, `receive_into` writes it into
blocks of another pool and releases whatever held it, `discard` releases it unread; `in_flight`
counts parcels sent and not yet received.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Protocol

import torch

from engine.kv_pool import KVPool


@dataclass(frozen=True, slots=True)
class Parcel:
    """A request's KV on its way: where it is held, and what it looks like."""

    key: str  # the shared-memory segment's name, or the in-memory slot's key
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    send_seconds: float  # measured: copying the blocks out of the sender's pool into the transport
    via: str = ""  # how it travels, in words (the transport's name unless it had to fall back)


class Transport(Protocol):
    name: str

    def send(self, pool: KVPool, blocks: list[int]) -> Parcel: ...

    def receive_into(self, parcel: Parcel, pool: KVPool, blocks: list[int]) -> float: ...

    def discard(self, parcel: Parcel) -> None: ...

    @property
    def in_flight(self) -> int: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _view(shm: shared_memory.SharedMemory, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    # Through bytes: bfloat16 has no NumPy type, and frombuffer of a dtype needs one.
    return torch.frombuffer(shm.buf, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)


class SharedMemoryTransport:
    """A shared-memory segment per parcel in flight. A received parcel's segment is kept for the next one
    that fits, as servers keep registered staging buffers: a fresh segment's pages fault in on first
    touch, which made a 14 MB handoff 5x slower than copying into a segment already mapped."""

    name = "shared memory (POSIX shm)"
    KEEP = 4  # spare segments kept mapped

    def __init__(self) -> None:
        self._open: dict[str, shared_memory.SharedMemory] = {}
        self._spare: list[shared_memory.SharedMemory] = []
        # Parcels that could not get a segment (a container's /dev/shm is often 64 MB): they wait in this
        # process's memory instead, so a full /dev/shm slows nothing down and loses nothing.
        self._private: dict[str, torch.Tensor] = {}

    def _segment(self, nbytes: int) -> shared_memory.SharedMemory:
        fits = [s for s in self._spare if s.size >= nbytes]
        if fits:
            shm = min(fits, key=lambda s: s.size)
            self._spare.remove(shm)
            return shm
        return shared_memory.SharedMemory(create=True, size=max(nbytes, 1))

    def send(self, pool: KVPool, blocks: list[int]) -> Parcel:
        t0 = time.perf_counter()
        shape, dtype = pool.blocks_shape(len(blocks)), pool.data.dtype
        nbytes = math.prod(shape) * pool.data.element_size()
        try:
            shm = self._segment(nbytes)
        except OSError as e:  # no room in /dev/shm (or no /dev/shm at all)
            key = f"private-{len(self._private)}-{time.perf_counter_ns()}"
            self._private[key] = pool.read_blocks(blocks).cpu()
            return Parcel(key, shape, dtype, nbytes, time.perf_counter() - t0,
                          f"process memory (shared memory unavailable: {e.strerror or e})")
        view = _view(shm, shape, dtype, nbytes)
        if pool.data.device.type == "cpu":
            pool.read_blocks(blocks, out=view)  # gathered straight into the segment
        else:
            view.copy_(pool.read_blocks(blocks).cpu())
        del view  # a live view would keep the segment's buffer exported (close() refuses)
        self._open[shm.name] = shm
        return Parcel(shm.name, shape, dtype, nbytes, time.perf_counter() - t0, self.name)

    def receive_into(self, parcel: Parcel, pool: KVPool, blocks: list[int]) -> float:
        t0 = time.perf_counter()
        if parcel.key in self._private:
            pool.write_blocks(blocks, self._private.pop(parcel.key))
            return time.perf_counter() - t0
        shm = self._open.pop(parcel.key)
        try:
            view = _view(shm, parcel.shape, parcel.dtype, parcel.nbytes)
            pool.write_blocks(blocks, view)
            _sync(pool.data.device)
            del view
        finally:
            self._release(shm)
        return time.perf_counter() - t0

    def _release(self, shm: shared_memory.SharedMemory) -> None:
        self._spare.append(shm)
        if len(self._spare) > self.KEEP:  # drop the smallest: the big ones are the expensive ones to fault in
            small = min(self._spare, key=lambda s: s.size)
            self._spare.remove(small)
            small.close()
            small.unlink()

    def discard(self, parcel: Parcel) -> None:
        self._private.pop(parcel.key, None)
        shm = self._open.pop(parcel.key, None)
        if shm is not None:
            self._release(shm)

    @property
    def in_flight(self) -> int:
        return len(self._open) + len(self._private)

    def close(self) -> None:
        """Unlink every segment, in flight or spare."""
        for shm in [*self._open.values(), *self._spare]:
            shm.close()
            shm.unlink()
        self._open.clear()
        self._spare.clear()
        self._private.clear()

    def __del__(self) -> None:  # a dropped session must not leave segments in /dev/shm
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the resource tracker cleans up
            pass


class DeviceCopyTransport:
    """The blocks gathered into a device buffer, which the receiver copies into its pool."""

    name = "device copy (one GPU)"

    def __init__(self) -> None:
        self._open: dict[str, torch.Tensor] = {}
        self._next = 0

    def send(self, pool: KVPool, blocks: list[int]) -> Parcel:
        t0 = time.perf_counter()
        buf = pool.read_blocks(blocks)
        _sync(buf.device)
        key = f"parcel-{self._next}"
        self._next += 1
        self._open[key] = buf
        return Parcel(key, tuple(buf.shape), buf.dtype, buf.numel() * buf.element_size(), time.perf_counter() - t0,
                      self.name)

    def receive_into(self, parcel: Parcel, pool: KVPool, blocks: list[int]) -> float:
        t0 = time.perf_counter()
        pool.write_blocks(blocks, self._open.pop(parcel.key))
        _sync(pool.data.device)
        return time.perf_counter() - t0

    def discard(self, parcel: Parcel) -> None:
        self._open.pop(parcel.key, None)

    @property
    def in_flight(self) -> int:
        return len(self._open)


def transport_for(device: torch.device) -> SharedMemoryTransport | DeviceCopyTransport:
    return DeviceCopyTransport() if device.type == "cuda" else SharedMemoryTransport()
