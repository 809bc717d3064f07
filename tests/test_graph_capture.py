"""CUDA graph captures (kernels/graph_capture.py). The collector pause: garbage made inside waits until the
block ends, nesting and threads restore the collector's state once, and on a GPU a dead engine's graphs are
never destroyed while another engine captures. The wait for the GPU: bounded, then a back-off."""
from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from kernels import graph_capture
from kernels.device_gate import DEVICE_GATE, GpuBusy
from kernels.graph_capture import capture_session, gc_paused


class _Cycle:
    """A self-referencing object that only the collector can free; records when it was freed."""
    def __init__(self, log: list[str], tag: str) -> None:
        self.me, self.log, self.tag = self, log, tag

    def __del__(self) -> None:
        self.log.append(self.tag)


@pytest.fixture
def eager_collector():
    """Collect after every allocation of a container, so that a pause is the only thing stopping it."""
    old, was = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    yield
    gc.set_threshold(*old)
    (gc.enable if was else gc.disable)()


def test_garbage_made_inside_waits_until_the_block_ends(eager_collector) -> None:
    freed: list[str] = []
    with gc_paused():
        _Cycle(freed, "inside")
        for _ in range(1000):
            [[] for _ in range(3)]  # allocations that would trigger a collection
        assert freed == [] and not gc.isenabled()
    assert gc.isenabled()
    for _ in range(10):
        [[] for _ in range(3)]
    assert freed == ["inside"]


def test_nesting_and_a_disabled_collector_are_restored(eager_collector) -> None:
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds the pause
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()  # it was off before: left off


def test_overlapping_blocks_in_two_threads(eager_collector) -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        entered.wait(5)
    assert not gc.isenabled()  # this thread left first; the other one still captures
    release.set()
    t.join(5)
    assert gc.isenabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_dead_engines_graphs_are_not_freed_during_a_capture(random_weights, eager_collector) -> None:
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    gc.set_threshold(200, 5, 1)  # a full collection every ~1,000 allocations: often, yet bearable
    seen_capturing: list[bool] = []

    class _Witness:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            seen_capturing.append(torch.cuda.is_current_stream_capturing())

    def run_engine() -> LLMEngine:
        engine = LLMEngine(EngineConfig(weights="random", device="cuda", num_blocks=128, max_model_len=256,
                                        cuda_graphs=True, profile_kernels=False), random_weights)
        engine.add_request(list(range(1, 40)), SamplingParams(max_tokens=6, ignore_eos=True))
        while engine.has_work():
            engine.step()
        return engine

    for _ in range(3):
        dead = run_engine()
        dead.witness = _Witness()  # freed with the engine, by the collector (a cycle)
        dead.witness.engine = dead
        del dead
    gc.collect()
    assert seen_capturing and not any(seen_capturing)


@pytest.fixture
def quick_capture_wait(monkeypatch):  # noqa: ANN201
    """Captures wait 0.1 s for the GPU and back off for 30 s (a test moves the back-off's end by hand)."""
    monkeypatch.setattr(graph_capture, "CAPTURE_WAIT_S", 0.1)
    monkeypatch.setattr(graph_capture, "BACKOFF_S", 30.0)
    monkeypatch.setattr(graph_capture, "_busy_until", 0.0)


def _other_visitor_holds_the_gpu() -> tuple[threading.Event, threading.Thread]:
    holding, release = threading.Event(), threading.Event()

    def other() -> None:
        with DEVICE_GATE.shared():
            holding.set()
            release.wait(30)

    t = threading.Thread(target=other, daemon=True)
    t.start()
    assert holding.wait(5)
    return release, t


def test_a_capture_that_gave_up_backs_off_then_waits_again(quick_capture_wait) -> None:
    """A capture gives up after CAPTURE_WAIT_S while another visitor's long run holds the GPU; during the
    back-off the next ones give up at once (no step stalls again, nobody's fresh work waits behind them);
    after it they wait again, and get the GPU once it is free."""
    release, other = _other_visitor_holds_the_gpu()
    try:
        t0 = time.perf_counter()
        with pytest.raises(GpuBusy, match="busy for"):
            with capture_session():
                pass
        waited = time.perf_counter() - t0
        t0 = time.perf_counter()
        with pytest.raises(GpuBusy, match="long work"):
            with capture_session():
                pass
        at_once = time.perf_counter() - t0
    finally:
        release.set()
        other.join(5)
    assert waited >= 0.1 and at_once < 0.05
    with pytest.raises(GpuBusy, match="long work"):  # the GPU is free, but the back-off has not ended
        with capture_session():
            pass
    graph_capture._busy_until = 0.0  # the back-off over
    with capture_session():
        assert DEVICE_GATE.captures_here()


def test_a_session_in_progress_is_never_refused_by_a_back_off(quick_capture_wait) -> None:
    """Another thread's capture gave up while this one was capturing: this thread's nested captures (its
    graphs inside one warm-up-and-capture session) go on, since its warm-up has already run."""
    with capture_session():
        graph_capture._busy_until = time.monotonic() + 30  # as if another visitor's capture just gave up
        with capture_session():
            assert DEVICE_GATE.captures_here()
    assert not DEVICE_GATE.captures_here()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_capture_beside_another_visitors_steps(random_weights) -> None:
    """Two Streamlit visitors on one GPU server, as threads: one steps an engine eagerly (syncs, allocations)
    while the other builds engines that capture CUDA graphs. With the device gate neither side fails and the
    graph engines' tokens equal a run made alone (bench/capture_beside_other_sessions.py also runs it ungated)."""
    from bench.capture_beside_other_sessions import graph_engine_tokens, run_with_gate

    alone = {r: graph_engine_tokens(random_weights, seed=r) for r in range(2)}
    res = run_with_gate(random_weights, "on", 2, alone)
    assert res["graph_errors"] == [] and res["eager_errors"] == []
    assert res["graph_runs_equal_to_alone"] == 2 and res["eager_steps_meanwhile"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_steps_run_eagerly_while_the_gpu_is_never_free_to_capture(random_weights, monkeypatch) -> None:
    """Another visitor holds the GPU past the capture's patience: the graph engine's steps run eagerly instead
    (decode and piecewise prefill alike), with the same tokens, and capture once the GPU is free."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    def tokens(graphs: bool) -> tuple[LLMEngine, list]:
        engine = LLMEngine(EngineConfig(weights="random", device="cuda", num_blocks=128, max_model_len=256,
                                        cuda_graphs=graphs, profile_kernels=False), random_weights)
        rids = [engine.add_request(list(range(1 + 7 * i, 30 + 11 * i)), SamplingParams(max_tokens=8, ignore_eos=True))
                for i in range(3)]
        while engine.has_work():
            engine.step()
        return engine, [engine.result(r).token_ids for r in rids]

    _, eager = tokens(False)
    monkeypatch.setattr(graph_capture, "CAPTURE_WAIT_S", 0.05)
    monkeypatch.setattr(graph_capture, "BACKOFF_S", 0.0)  # every step tries (and fails) to capture again
    monkeypatch.setattr(graph_capture, "_busy_until", 0.0)
    release, other = _other_visitor_holds_the_gpu()
    try:
        busy, busy_tokens = tokens(True)
    finally:
        release.set()
        other.join(5)
    assert busy_tokens == eager and not busy.graph_runner.graphs  # nothing was captured, nothing failed
    free, free_tokens = tokens(True)
    assert free_tokens == eager and free.graph_runner.graphs
