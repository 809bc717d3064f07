"""The device gate (kernels/device_gate.py): GPU work side by side, a CUDA graph capture alone. Threads and
events stand in for visitors; every wait has a timeout, so a deadlock fails the test instead of hanging it."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from kernels.device_gate import DeviceGate, GpuBusy

WAIT = 5.0


def _thread(fn) -> threading.Thread:  # noqa: ANN001
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_shared_sections_overlap() -> None:
    gate, inside, release = DeviceGate(), threading.Barrier(3, timeout=WAIT), threading.Event()

    def visitor() -> None:
        with gate.shared():
            inside.wait()  # both visitors are inside at once
            release.wait(WAIT)

    threads = [_thread(visitor) for _ in range(2)]
    inside.wait()
    release.set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


def test_a_capture_waits_for_other_threads_work_and_new_work_waits_for_it() -> None:
    gate, log = DeviceGate(), []
    in_step, end_step, capturing, end_capture = (threading.Event() for _ in range(4))

    def stepping() -> None:
        with gate.shared():
            in_step.set()
            end_step.wait(WAIT)
            log.append("step ends")

    def capturing_visitor() -> None:
        with gate.shared():  # a capture happens inside the capturing thread's own step
            with gate.exclusive(timeout_s=WAIT):
                log.append("capture starts")
                capturing.set()
                end_capture.wait(WAIT)
                log.append("capture ends")

    def late_visitor() -> None:
        with gate.shared():
            log.append("late step starts")

    a = _thread(stepping)
    in_step.wait(WAIT)
    b = _thread(capturing_visitor)
    time.sleep(0.1)
    assert log == []  # the capture waits for the step
    end_step.set()
    capturing.wait(WAIT)
    c = _thread(late_visitor)
    time.sleep(0.1)
    assert log == ["step ends", "capture starts"]  # new work waits for the capture
    end_capture.set()
    for t in (a, b, c):
        t.join(WAIT)
    assert log == ["step ends", "capture starts", "capture ends", "late step starts"]


def test_a_waiting_capture_holds_off_fresh_work_but_not_nested_work() -> None:
    gate, order = DeviceGate(), []
    in_step, nested_done, end_step = threading.Event(), threading.Event(), threading.Event()

    def stepping() -> None:
        with gate.shared():
            in_step.set()
            time.sleep(0.2)  # meanwhile another thread asks to capture
            with gate.shared():  # nested: goes on, or the capture and this step would wait for each other
                order.append("nested")
            nested_done.set()
            end_step.wait(WAIT)

    def capture() -> None:
        with gate.exclusive(timeout_s=WAIT):
            order.append("capture")

    a = _thread(stepping)
    in_step.wait(WAIT)
    b = _thread(capture)
    nested_done.wait(WAIT)
    assert order == ["nested"]
    end_step.set()
    for t in (a, b):
        t.join(WAIT)
    assert order == ["nested", "capture"]


def test_re_entrant_for_the_capturing_thread() -> None:
    gate = DeviceGate()
    with gate.exclusive(timeout_s=WAIT):
        with gate.exclusive(timeout_s=WAIT):
            with gate.shared():
                pass
    with gate.shared():
        with gate.exclusive(timeout_s=WAIT):
            pass


def test_two_threads_that_both_want_to_capture_take_turns() -> None:
    gate, started, done = DeviceGate(), threading.Barrier(2, timeout=WAIT), []

    def visitor(name: str) -> None:
        with gate.shared():
            started.wait()  # both hold shared sections before either asks to capture
            with gate.exclusive(timeout_s=WAIT):
                done.append(name)

    threads = [_thread(lambda n=n: visitor(n)) for n in ("a", "b")]
    for t in threads:
        t.join(2 * WAIT)
    assert sorted(done) == ["a", "b"]


def test_released_lets_a_capture_through_while_a_thread_waits_on_something_else() -> None:
    """Visitor 2 waits, inside its script run, for visitor 1's run of the same lab; visitor 1's run captures."""
    gate, lab_lock, done = DeviceGate(), threading.Lock(), []
    lab_lock.acquire()  # visitor 1 is running the lab

    def visitor2() -> None:
        with gate.shared():
            with gate.released():
                lab_lock.acquire()
            lab_lock.release()
            done.append("visitor 2")

    t = _thread(visitor2)
    time.sleep(0.1)
    with gate.shared():  # visitor 1's script run
        with gate.exclusive(timeout_s=WAIT):  # would time out if visitor 2's wait counted as GPU work
            done.append("capture")
    lab_lock.release()
    t.join(WAIT)
    assert done == ["capture", "visitor 2"]


def test_a_capture_that_waits_too_long_says_so_and_leaves_the_gate_usable() -> None:
    gate, in_step, end_step = DeviceGate(), threading.Event(), threading.Event()

    def stepping() -> None:
        with gate.shared():
            in_step.set()
            end_step.wait(WAIT)

    t = _thread(stepping)
    in_step.wait(WAIT)
    with pytest.raises(GpuBusy, match="busy"):
        with gate.exclusive(timeout_s=0.2):
            pass
    with gate.shared():  # no capture is left pending: fresh work goes on
        pass
    end_step.set()
    t.join(WAIT)
    with gate.exclusive(timeout_s=WAIT):
        pass


@pytest.mark.parametrize("device, gated", [("cuda", True), ("cuda:0", True), ("cpu", False)])
def test_gpu_work_enters_the_gate_only_on_a_gpu(device: str, gated: bool) -> None:
    from kernels.device_gate import DEVICE_GATE, gpu_work

    inside, release = threading.Event(), threading.Event()

    def working() -> None:
        with gpu_work(device):
            inside.set()
            release.wait(WAIT)

    t = _thread(working)
    inside.wait(WAIT)
    try:
        if gated:
            with pytest.raises(GpuBusy):
                with DEVICE_GATE.exclusive(timeout_s=0.1):
                    pass
        else:
            with DEVICE_GATE.exclusive(timeout_s=WAIT):
                pass
    finally:
        release.set()
        t.join(WAIT)


# ---- any mix of visitors: a property ------------------------------------------------------------------

class _Monitor:
    """Who is doing GPU work and who is capturing right now, and every moment the two overlapped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.working: set[int] = set()
        self.capturing: set[int] = set()
        self.clashes: list[str] = []

    def work(self, on: bool) -> None:
        me = threading.get_ident()
        with self._lock:
            if on and self.capturing - {me}:
                self.clashes.append("work began during another thread's capture")
            (self.working.add if on else self.working.discard)(me)

    def capture(self, on: bool) -> None:
        me = threading.get_ident()
        with self._lock:
            if on and self.working - {me}:
                self.clashes.append("a capture began during another thread's work")
            if on and self.capturing:
                self.clashes.append("two captures at once")
            (self.capturing.add if on else self.capturing.discard)(me)


def _pause() -> None:
    time.sleep(0.0005)


def _capture(gate: DeviceGate, mon: _Monitor) -> None:
    with gate.exclusive(timeout_s=WAIT):
        mon.capture(True)
        _pause()
        mon.capture(False)


def _run_op(gate: DeviceGate, mon: _Monitor, op: str, elsewhere: threading.Lock) -> None:
    """One visitor action, as the app does it: a step (shared), a step that captures its graphs (shared, then
    exclusive inside), nested work, a capture outside any step (a bench script), a wait for another visitor's
    run of the same lab (released while waiting), each with the monitor told when GPU work really runs."""
    if op == "capture alone":
        _capture(gate, mon)
        return
    with gate.shared():
        mon.work(True)
        _pause()
        if op == "step that captures":
            mon.work(False)  # waiting to capture is not GPU work
            _capture(gate, mon)
            mon.work(True)
        elif op == "nested step":
            with gate.shared():
                _pause()
        elif op == "wait for another run":
            mon.work(False)
            with gate.released(), elsewhere:
                _pause()
            mon.work(True)
        _pause()
        mon.work(False)


OPS = ("step", "step that captures", "nested step", "capture alone", "wait for another run")


@settings(max_examples=40, deadline=None)
@given(programs=hst.lists(hst.lists(hst.sampled_from(OPS), min_size=1, max_size=5), min_size=2, max_size=4))
def test_any_mix_of_visitors_never_overlaps_a_capture_and_always_finishes(programs: list[list[str]]) -> None:
    gate, mon, elsewhere, failures = DeviceGate(), _Monitor(), threading.Lock(), []

    def visitor(program: list[str]) -> None:
        try:
            for op in program:
                _run_op(gate, mon, op, elsewhere)
        except Exception as e:  # noqa: BLE001 (GpuBusy here would mean the gate deadlocked)
            failures.append(repr(e))

    threads = [_thread(lambda p=p: visitor(p)) for p in programs]
    for t in threads:
        t.join(4 * WAIT)
    assert not any(t.is_alive() for t in threads), "a visitor never finished"
    assert not failures and not mon.clashes, (failures, mon.clashes[:3])
