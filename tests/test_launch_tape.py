"""The launch tape (kernels/launch_tape.py) on the CPU: what it records through `launch`, which pointers
a replay moves and by how much, and every case in which it must refuse to replay. The real kernels are
replayed on the GPU in tests/test_engine_gpu.py."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import launch_tape
from kernels.launch_tape import LaunchTape, launch, note_untaped_work


class FakeLauncher:
    """Stands in for a compiled kernel's C launcher: keeps each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args) -> None:
        self.calls.append(args)


class FakeJit:
    """A `JITFunction` as far as `launch` uses it: `arg_names`, `signature`, `[grid](...)` returning the
    compiled kernel (which has `run`, `function` and `packed_metadata`)."""

    def __init__(self, fn) -> None:
        self.signature = inspect.signature(fn)
        self.arg_names = list(self.signature.parameters)
        self.launcher = FakeLauncher()
        self.compiled = SimpleNamespace(run=self.launcher, function=7, packed_metadata=(4, 1, 0))
        self.direct: list[tuple] = []  # launches through [grid]

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.direct.append((grid, args, kwargs))
            return self.compiled
        return run


def _kernel(q, k_cache, meta, out, n, scale, BLOCK: int = 16, FLAG: bool = False):  # noqa: N803
    pass


def _layers(n: int = 3):
    """Per-layer q (separate tensors) and KV pool views (one tensor, like engine/kv_pool.py)."""
    qs = [torch.randn(8, 4, 16) for _ in range(n)]
    pool = torch.randn(n, 2, 10, 4, 16)
    return qs, [(pool[i, 0], pool[i, 1]) for i in range(n)]


def _record(jit, q, kc, meta, out):
    tape = LaunchTape()
    with tape.recording():
        launch(jit, (3, 2), q[2:], kc, meta, out, 5, 0.125, BLOCK=32, num_warps=4)
    return tape


def test_launch_without_a_tape_is_a_plain_launch():
    jit = FakeJit(_kernel)
    q = torch.randn(4)
    assert launch(jit, (1,), q, q, q, q, 1, 1.0, BLOCK=16) is jit.compiled
    assert len(jit.direct) == 1 and not jit.launcher.calls


def test_replay_moves_pointers_into_the_movers_and_nothing_else():
    jit = FakeJit(_kernel)
    qs, kvs = _layers()
    meta, out = torch.zeros(5, dtype=torch.int32), torch.empty(8, 4, 16)
    tape = _record(jit, qs[0], kvs[0][0], meta, out)
    tape.bind((qs[0], *kvs[0]))
    assert tape.replay((qs[2], *kvs[2]))
    (call,) = jit.launcher.calls
    grid, stream, function, metadata, hooks, args = call[:3], call[3], call[4], call[5], call[6:9], call[9:]
    assert grid == (3, 2, 1) and stream == 0 and function == 7 and metadata == (4, 1, 0) and hooks == (None,) * 3
    # q[2:] of layer 2, layer 2's K pool; the metadata and the output stay; the scalars and
    # constexprs (defaults applied, launch options dropped) in signature order.
    assert args == (qs[2][2:].data_ptr(), kvs[2][0].data_ptr(), meta.data_ptr(), out.data_ptr(), 5, 0.125, 32, False)


def test_replay_moves_a_tma_descriptor_base():
    from triton.tools.tensor_descriptor import TensorDescriptor

    jit = FakeJit(_kernel)
    qs, kvs = _layers()
    meta, out = torch.zeros(5, dtype=torch.int32), torch.empty(8, 4, 16)
    desc = TensorDescriptor(qs[0][1:].view(7, 64), [7, 64], [64, 1], [16, 64])
    tape = LaunchTape()
    with tape.recording():
        launch(jit, (1,), desc, kvs[0][1], meta, out, 5, 0.5)
    tape.bind((qs[0], *kvs[0]))
    assert tape.replay((qs[1], *kvs[1]))
    moved = jit.launcher.calls[0][9]
    assert moved.base.data_ptr() == qs[1][1:].data_ptr()
    assert (moved.shape, moved.strides, moved.padding) == ([7, 64], [64, 1], "zero")
    assert jit.launcher.calls[0][10] == kvs[1][1].data_ptr()


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "alignment", "count"])
def test_replay_refuses_a_mover_that_is_not_the_same_call(change):
    jit = FakeJit(_kernel)
    qs, kvs = _layers()
    meta, out = torch.zeros(5, dtype=torch.int32), torch.empty(8, 4, 16)
    tape = _record(jit, qs[0], kvs[0][0], meta, out)
    tape.bind((qs[0], *kvs[0]))
    big = torch.randn(9 * 4 * 16 + 1)
    other = {"shape": torch.randn(9, 4, 16),
             "stride": torch.randn(4, 8, 16).transpose(0, 1),
             "dtype": torch.randn(8, 4, 16, dtype=torch.float64),
             "alignment": big[1:1 + 8 * 4 * 16].view(8, 4, 16)}.get(change)
    movers = (qs[1], *kvs[1])[:2] if change == "count" else (other, *kvs[1])
    assert not tape.replay(movers)
    assert not jit.launcher.calls


def test_a_tape_refuses_after_untaped_work_or_an_autotuned_launch():
    jit = FakeJit(_kernel)
    qs, kvs = _layers()
    meta, out = torch.zeros(5, dtype=torch.int32), torch.empty(8, 4, 16)
    for spoil in (note_untaped_work,
                  lambda: launch(jit, lambda meta: (1,), qs[0], kvs[0][0], meta, out, 5, 0.1)):
        tape = LaunchTape()
        with tape.recording():
            launch(jit, (1,), qs[0], kvs[0][0], meta, out, 5, 0.1)
            spoil()
        tape.bind((qs[0], *kvs[0]))
        assert not tape.replay((qs[1], *kvs[1]))
    assert not jit.launcher.calls
    assert getattr(launch_tape._ACTIVE, "tape", None) is None  # recording ended with its block


def test_an_empty_tape_never_replays_and_tapes_do_not_nest():
    tape = LaunchTape()
    with tape.recording():
        with pytest.raises(RuntimeError, match="already recording"):
            with LaunchTape().recording():
                pass
    tape.bind(())
    assert not tape.replay(())


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_pointer_moves_with_the_mover_it_points_into(data):
    """Random movers carved out of one buffer (16-byte multiples apart, like layers of a pool) and random
    recorded pointers: a pointer inside mover m moves by exactly m's move, any other stays."""
    elems = 4096
    buf = torch.zeros(2 * elems, dtype=torch.float32)
    n = data.draw(st.integers(1, 4))
    size = 64  # elements per mover
    starts0 = sorted(data.draw(st.lists(st.integers(0, elems // size - 1), min_size=n, max_size=n, unique=True)))
    old = [buf[s * size:(s + 1) * size] for s in starts0]
    ends = [elems + data.draw(st.integers(0, elems // size - 1)) * size for _ in range(n)]
    new = [buf[e:e + size] for e in ends]
    outside = torch.zeros(8)
    picks = data.draw(st.lists(st.tuples(st.integers(-1, n - 1), st.integers(0, size - 1)), min_size=1, max_size=6))
    args = [outside if m < 0 else old[m][off:] for m, off in picks]

    def fn(*a):
        pass
    fn.__signature__ = inspect.Signature([inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for i in range(len(args))])
    jit = FakeJit(fn)
    tape = LaunchTape()
    with tape.recording():
        launch(jit, (1,), *args)
    tape.bind(old)
    assert tape.replay(new)
    got = jit.launcher.calls[0][9:]
    for (m, off), value in zip(picks, got):
        want = outside.data_ptr() if m < 0 else new[m].data_ptr() + off * 4
        assert value == want


def test_a_launch_hook_keeps_every_launch_going_through_triton():
    """A profiler's hook (Triton's launch_enter_hook) must see every launch: no replays while one is set."""
    from triton import knobs

    jit = FakeJit(_kernel)
    qs, kvs = _layers()
    meta, out = torch.zeros(5, dtype=torch.int32), torch.empty(8, 4, 16)

    def hook(metadata) -> None:
        pass
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        tape = _record(jit, qs[0], kvs[0][0], meta, out)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    tape.bind((qs[0], *kvs[0]))
    assert not tape.replay((qs[1], *kvs[1]))
