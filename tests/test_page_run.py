"""`app.state._server_run`, the server-wide store behind `page_run`: one run per key for the whole server, the
last few kept, nothing stored for a failing run; and a second browser session opening a page whose run is
stored gets the result, not an error (st.cache_resource replayed the first session's progress-bar calls into
the second session's script, which Streamlit refuses)."""
from __future__ import annotations

import threading
import time

import pytest

from app import state
from kernels.device_gate import DEVICE_GATE
from tests.apptest_helpers import assert_clean, new_app, open_page


def test_one_run_per_key_last_ones_kept_failures_not_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_SERVER_RUNS", type(state._SERVER_RUNS)())
    calls: list[int] = []

    def run(i: int):
        return lambda: calls.append(i) or i * 10

    assert state._server_run(("p", 1), run(1)) == 10
    assert state._server_run(("p", 1), run(1)) == 10 and calls == [1]
    for i in range(2, 2 + state._SERVER_RUNS_KEPT):
        state._server_run(("p", i), run(i))
    assert ("p", 1) not in state._SERVER_RUNS and len(state._SERVER_RUNS) == state._SERVER_RUNS_KEPT
    with pytest.raises(RuntimeError):
        state._server_run(("p", "bad"), lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert ("p", "bad") not in state._SERVER_RUNS
    assert state._server_run(("p", "bad"), run(7)) == 70  # a later try runs again


def test_a_second_session_gets_the_stored_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_lora_merge_page import SMALL

    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "random")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    for _ in range(2):
        at = new_app()
        at.session_state["lm-settings"] = SMALL
        at = open_page(at, "16_lora_merge.py")
        assert_clean(at)
        assert len(at.get("plotly_chart")) >= 3


def test_waiting_for_another_visitors_run_does_not_hold_up_its_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU server each script run is a shared section of the device gate. Visitor 2 asks for the run that
    visitor 1 is computing and waits; visitor 1's run then captures a CUDA graph, which waits for every other
    thread's shared sections, so visitor 2's wait must not count as one (or both would wait for ever)."""
    monkeypatch.setattr(state, "_SERVER_RUNS", type(state._SERVER_RUNS)())
    key, started, got = ("gate", 1), threading.Event(), {}

    def run() -> str:
        started.set()
        time.sleep(0.3)  # visitor 2 is waiting for this run by now
        with DEVICE_GATE.exclusive(timeout_s=5):
            return "captured"

    def visitor2() -> None:
        started.wait(5)
        with DEVICE_GATE.shared():
            got["result"] = state._server_run(key, lambda: "computed twice")

    t = threading.Thread(target=visitor2, daemon=True)
    t.start()
    with DEVICE_GATE.shared():
        assert state._server_run(key, run) == "captured"
    t.join(5)
    assert got == {"result": "captured"}
