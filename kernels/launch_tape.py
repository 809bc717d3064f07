"""Record the Triton launches of one call, then replay them with another layer's tensors.

Why: a prefill step runs attention eagerly between its CUDA-graph pieces, once per layer
(engine/piecewise_graphs.py), and each of those 30 calls costs the host far more than the GPU
work it launches: our wrapper (plan, scratch, checks), Triton's `JITFunction.run` (binding every
argument, the specialisation key, the cache lookup) and its C launcher, which asks Python and the
driver for every tensor's pointer (bench/NOTES_kernels.md v20 and v24: ~95 us for FA2, ~200 us
for paged attention with its merge). The 30 calls of one step differ only in which layer's
q / k / v and KV pool they read: the grid, every scalar, the batch's metadata tensors, the
scratch and the output buffer are the same. So layer 0 runs as usual while a tape records what
reached each launcher, and the other layers call the compiled kernels' launchers directly, every
pointer into layer 0's tensors moved by the distance to that layer's.

Correctness rests on three checks made at replay: each moving tensor has layer 0's shape,
strides and dtype (so every integer argument, and Triton's specialisation on them, is unchanged);
each moves by a multiple of 16 bytes (Triton specialises pointers on 16-byte alignment); and the
recording saw only launches through `launch` (a torch op or an autotuned launch in the recorded
call makes the tape refuse to replay, and the caller runs the call normally).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

_ACTIVE = threading.local()  # the tape recording on this thread, if any (Streamlit sessions are threads)


@dataclass(frozen=True, slots=True)
class _Pointer:
    """Stands in for a tensor where the launcher only asks for `data_ptr()` (a TMA descriptor's base)."""

    address: int

    def data_ptr(self) -> int:
        return self.address


@dataclass(frozen=True, slots=True)
class _Descriptor:
    """A host TMA descriptor over a moved base: the fields Triton's launcher reads to encode one."""

    base: _Pointer
    shape: list
    strides: list
    padding: str


@dataclass(frozen=True, slots=True)
class _Recorded:
    """One launch: the compiled kernel's launcher and its argument list, tensors kept alive."""

    launcher: Any
    function: int
    packed_metadata: Any
    grid: tuple[int, int, int]
    stream: int
    values: tuple  # the launcher's arguments; tensors as their addresses, descriptors as objects
    pointers: tuple[int, ...]  # indices into `values` that hold a tensor's address
    descriptors: tuple[int, ...]  # indices that hold a TMA descriptor
    keep: tuple  # the tensors recorded, so their memory stays theirs while the tape replays


def launch(jit_fn, grid, *args, **kwargs):
    """`jit_fn[grid](*args, **kwargs)`, recorded onto the tape this thread is recording, if any."""
    tape = getattr(_ACTIVE, "tape", None)
    compiled = jit_fn[grid](*args, **kwargs)
    if tape is not None:
        tape._add(jit_fn, compiled, grid, args, kwargs)
    return compiled


def note_untaped_work() -> None:
    """Called by code that does GPU work outside `launch` (a torch op a replay would skip)."""
    tape = getattr(_ACTIVE, "tape", None)
    if tape is not None:
        tape.replayable = False


def _hooked(hook) -> bool:
    """A launch hook is set: None or an empty chain (Triton 3.6 keeps a `HookChain` there) is none."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] a strided tensor can touch."""
    lo = t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else -1
    return lo, lo + (last + 1) * t.element_size()


class LaunchTape:
    """Launches recorded during one call (`recording`), bound to the tensors that move from one
    replay to the next (`bind`), replayed with their counterparts (`replay`)."""

    def __init__(self) -> None:
        self.launches: list[_Recorded] = []
        self.replayable = True
        self._bound: list[list[tuple[int, int, int, bool]]] | None = None  # per launch: (arg, mover, offset, descriptor?)
        self._movers: tuple[tuple[tuple, tuple, torch.dtype, int], ...] = ()

    @contextmanager
    def recording(self) -> Iterator["LaunchTape"]:
        if getattr(_ACTIVE, "tape", None) is not None:
            raise RuntimeError("a launch tape is already recording on this thread")
        from triton import knobs

        # A launch hook (a profiler) expects to see every launch; replays would go around it.
        if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            self.replayable = False
        _ACTIVE.tape = self
        try:
            yield self
        finally:
            _ACTIVE.tape = None

    def _add(self, jit_fn, compiled, grid, args: tuple, kwargs: dict) -> None:
        if compiled is None or callable(grid) or not hasattr(compiled, "packed_metadata"):
            self.replayable = False  # autotuned, or the interpreter: nothing to call directly
            return
        names = jit_fn.arg_names
        params = {k: v for k, v in kwargs.items() if k in names}
        bound = jit_fn.signature.bind(*args, **params)
        bound.apply_defaults()
        values, pointers, descriptors, keep = [], [], [], []
        for i, value in enumerate(bound.arguments.values()):
            if isinstance(value, torch.Tensor):
                pointers.append(i)
                keep.append(value)
                value = value.data_ptr()
            elif hasattr(value, "block_shape") and isinstance(getattr(value, "base", None), torch.Tensor):
                descriptors.append(i)
                keep.append(value.base)
            values.append(value)
        g = tuple(grid) + (1,) * (3 - len(grid))
        device = next((t.device for t in keep if t.device.type == "cuda"), None)
        stream = torch.cuda.current_stream(device).cuda_stream if device is not None else 0
        self.launches.append(_Recorded(compiled.run, compiled.function, compiled.packed_metadata, g, stream,
                                       tuple(values), tuple(pointers), tuple(descriptors), tuple(keep)))

    def bind(self, movers: Sequence[torch.Tensor]) -> None:
        """Name the recorded call's tensors that each replay replaces (a layer's q, k, v, K pool, V
        pool). Every recorded pointer inside one of them is stored as (which one, byte offset)."""
        spans = [_span(t) for t in movers]
        self._movers = tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.data_ptr()) for t in movers)
        bound = []
        for rec in self.launches:
            moved = []
            addresses = [(i, rec.values[i], False) for i in rec.pointers]
            addresses += [(i, rec.values[i].base.data_ptr(), True) for i in rec.descriptors]
            for i, addr, descriptor in addresses:
                owner = next((m for m, (lo, hi) in enumerate(spans) if lo <= addr < hi), None)
                if owner is not None:
                    moved.append((i, owner, addr - spans[owner][0], descriptor))
            bound.append(moved)
        self._bound = bound

    def replay(self, movers: Sequence[torch.Tensor]) -> bool:
        """Launch the tape again with `movers` in place of the bound ones; False (nothing launched)
        when that would not be the same call (see the module docstring)."""
        if not self.replayable or self._bound is None or not self.launches or len(movers) != len(self._movers):
            return False
        bases = []
        for t, (shape, stride, dtype, old) in zip(movers, self._movers):
            base = t.data_ptr()
            if t.dtype != dtype or (base - old) % 16 or tuple(t.shape) != shape or tuple(t.stride()) != stride:
                return False
            bases.append(base)
        for rec, moved in zip(self.launches, self._bound):
            values = list(rec.values)
            for i, owner, offset, descriptor in moved:
                address = bases[owner] + offset
                old = values[i]
                values[i] = _Descriptor(_Pointer(address), old.shape, old.strides, old.padding) if descriptor else address
            rec.launcher(*rec.grid, rec.stream, rec.function, rec.packed_metadata, None, None, None, *values)
        return True
