"""Streamlit glue for `EngineSession`: one per (browser session, page), kept in st.session_state.

Keyed by page so each page keeps its own timeline when a student moves between pages, and
session_state is per browser tab, so two students never share an engine.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable
from typing import Any, Callable, TypeVar

import streamlit as st

from app.formatting import fmt_duration
from app.runtime import device, dtype_name, server_engine_settings, shared_weights, weights_mode
from app.scenarios import Scenario
from app.session import EngineSession
from engine.result_store import StoredResult, computed_now
from kernels.device_gate import DEVICE_GATE

T = TypeVar("T")


def session_key(page: str) -> str:
    return f"engine-session:{page}"


def get_session(page: str, default: Scenario, engine_factory: Callable[..., Any] | None = None) -> EngineSession:
    """`engine_factory`: what the session builds (default `LLMEngine`; see `EngineSession.engine_factory`)."""
    key = session_key(page)
    session = st.session_state.get(key)
    if session is None:
        extra = {} if engine_factory is None else {"engine_factory": engine_factory}
        session = EngineSession.create(default, shared_weights(), server_engine_settings(), **extra)
        st.session_state[key] = session
    return session


def settings_key(page: str) -> str:
    return f"{page}-settings"


def page_settings(page: str, default: Callable[[], T]) -> T:
    """The run settings a settings-form page (test-time compute, constrained decoding) runs now: a frozen
    record kept per page, `default()` until the student applies others (`restart_with`)."""
    key = settings_key(page)
    if key not in st.session_state:
        st.session_state[key] = default()
    return st.session_state[key]


def submitted_settings(page: str, candidate: Any | None) -> Any:
    """A settings form's outcome: `candidate` (the form's settings when it was submitted, else None) becomes the
    page's settings if its `check()` passes; a rejected one is an error above the last settings that ran, which
    stay. Returns the settings to run (`page_settings(page, ...)` holds them)."""
    ss, error_key = st.session_state, f"{page}-error"
    if candidate is not None:
        try:
            candidate.check()
        except ValueError as e:
            ss[error_key] = str(e)[:1].upper() + str(e)[1:] + "."
        else:
            ss[error_key] = None
            ss[settings_key(page)] = candidate
    if err := ss.get(error_key):
        st.error(f"{err} The results below are the last run's.", icon=":material/error:")
    return ss[settings_key(page)]


def page_cache(page: str) -> dict:
    """A per-page dict for measured results (comparisons, timings) that must survive reruns."""
    key = f"page-cache:{page}"
    if key not in st.session_state:
        st.session_state[key] = {}
    return st.session_state[key]


def cached_by_kind(page: str, key: tuple, build: Callable[[], T]) -> T:
    """One entry per kind (`key[0]`) in the page cache, rebuilt only when the rest of its key changes: a
    page's heavy results (a trace, a comparison) survive reruns without piling up one per setting tried."""
    cache = page_cache(page)
    kind = key[0]
    if cache.get(kind, (None,))[0] != key:
        cache[kind] = (key, build())
    return cache[kind][1]


# The server-wide results of page runs: a plain dict, not st.cache_resource, which records the progress-bar
# calls made inside the cached function and replays them for the next session, where the bar belongs to
# another script run ("a streamlit element is called on some layout block created outside the function").
_SERVER_RUNS: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_SERVER_RUNS_KEPT = 8
_SERVER_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple, threading.Lock] = {}


def _server_run(key: tuple, run: Callable[[], Any]) -> Any:
    """`run()` once per key for the whole server (a second visitor asking while it runs waits for it);
    the last `_SERVER_RUNS_KEPT` results kept. A failing run stores nothing."""
    with _SERVER_LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    # Waiting for another visitor's run of the same settings is not GPU work: if that run captures a CUDA
    # graph, it must not wait for this thread in turn (kernels/device_gate.py).
    with DEVICE_GATE.released():
        lock.acquire()
    try:
        with _SERVER_LOCK:
            if key in _SERVER_RUNS:
                _SERVER_RUNS.move_to_end(key)
                return _SERVER_RUNS[key]
        result = run()
        with _SERVER_LOCK:
            _SERVER_RUNS[key] = result
            while len(_SERVER_RUNS) > _SERVER_RUNS_KEPT:
                _KEY_LOCKS.pop(_SERVER_RUNS.popitem(last=False)[0], None)
        return result
    finally:
        lock.release()


def progress_reporter(bar: Any) -> Callable[[str, float], None]:
    """The (message, share) callback the engine's labs report through, drawn on `page_run`'s progress bar."""
    def report(msg: str, frac: float) -> None:
        bar.progress(min(1.0, max(0.0, frac)), text=msg)

    return report


def page_run(page: str, key: Hashable, run: Callable[[Any], T | StoredResult[T]], start_text: str,
             failed: str) -> T | None:
    """A page's long run (the KV compression lab, the load test, the weight quantization lab) for settings
    `key`: from this tab's page cache, else from the server's (one result per page, weights, device and
    settings, the last 8 kept, so a class opening the page sees the first visitor's run), else run now.
    `run` gets the progress bar (`bar.progress(share, text=...)`) to report on. A failing run is an error
    message and the last result stays (None when there is none).

    A lab whose result is kept on disk returns a `StoredResult` (engine/result_store.py): read back from an
    earlier run, it comes with a caption saying when it was computed."""
    cache = page_cache(page)
    if cache.get("key") != key:
        bar = st.progress(0.0, text=start_text)
        try:
            server_key = (page, weights_mode(), device(), dtype_name(), repr(key))
            stored = _server_run(server_key, lambda: _as_stored(lambda: run(bar)))
        except Exception as e:  # noqa: BLE001 - the page must stay up, with the last run if there is one
            st.error(f"{failed}: {e}", icon=":material/error:")
            return _last_result(cache)
        finally:
            bar.empty()
        cache.update(key=key, stored=stored)
    if cache["stored"].from_disk:
        st.caption(f":material/history: {stored_caption(cache['stored'])}")
    return cache["stored"].value


def _last_result(cache: dict) -> Any:
    """The page cache's last result, None before any."""
    stored = cache.get("stored")
    return None if stored is None else stored.value


def stored_caption(stored: StoredResult[Any]) -> str:
    """Where a result read back from disk came from, in one sentence."""
    when = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(stored.computed_at))
    return (f"Read back from this machine's disk cache: the model computed this result on {when} "
            f"(in {fmt_duration(stored.seconds)}) with the same weights, settings and code. Change a setting "
            "to run it again.")


def _as_stored(run: Callable[[], T | StoredResult[T]]) -> StoredResult[T]:
    """A run's result with its provenance: the lab's own `StoredResult`, or a plain result timed now."""
    out = computed_now(run)
    return out.value if isinstance(out.value, StoredResult) else out


def mark_requested(key: str) -> None:
    """A section's form was submitted: from now on `run_on_request(key, ...)` runs (or shows) its result."""
    st.session_state[f"{key}-started"] = True


def run_on_request(key: str, settings: Hashable, run: Callable[[Any], T | StoredResult[T]], start_text: str,
                   failed: str, waiting: str) -> T | None:
    """`page_run` for a section that runs only when asked (a lab below a page's live engine, too slow to run on
    every visit): until its form was submitted in this tab (`mark_requested`) and with nothing cached, `waiting` as
    a caption saying what the button does, and None."""
    if not st.session_state.get(f"{key}-started") and _last_result(page_cache(key)) is None:
        st.caption(waiting)
        return None
    return page_run(key, settings, run, start_text, failed)
