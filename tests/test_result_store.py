"""Lab results kept on disk (engine/result_store.py): built once per key and read back by a later process
with when and how long; another key, other code, a torn file or an unpicklable value mean building again
(never a wrong value); the newest entries stay. The weight-quantization lab's stored run, and the app's page
reading it back after a server restart, saying so, and running nothing."""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest

import engine.result_store as store
import engine.weight_quant.lab as wq_lab
from app import state
from engine.result_store import StoredResult, entry_path, stored_result
from engine.weight_quant.lab import LabSettings, stored_lab
from tests.apptest_helpers import assert_clean, new_app, open_page, random_app  # noqa: F401 (fixture)
from tests.test_weight_quant_page import PAGE, PREFIX

# The cheapest run: one method, two tokens.
ONE_METHOD = LabSettings(methods=("rtn",), bits=4, group=64, calibration_tokens=64, max_new_tokens=2)


@pytest.fixture
def folder(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setattr(store, "memo_dir", lambda: tmp_path)
    return tmp_path


def _counting(value):  # noqa: ANN001, ANN202
    calls = []

    def build():  # noqa: ANN202
        calls.append(1)
        time.sleep(0.01)
        return value
    return build, calls


def test_built_once_then_read_back_with_when_and_how_long(folder) -> None:  # noqa: ANN001
    value = {"profile": np.arange(4.0), "label": "AWQ"}
    build, calls = _counting(value)
    first = stored_result("lab", {"settings": "a"}, build)
    assert not first.from_disk and first.seconds >= 0.01 and abs(first.computed_at - time.time()) < 5
    again = stored_result("lab", {"settings": "a"}, build)
    assert again.from_disk and len(calls) == 1
    assert (again.computed_at, again.seconds) == (first.computed_at, first.seconds)
    assert again.value["label"] == "AWQ" and np.array_equal(again.value["profile"], value["profile"])
    assert entry_path("lab", {"settings": "a"}).parent == folder
    assert not stored_result("lab", {"settings": "b"}, build).from_disk and len(calls) == 2


def test_other_code_is_another_key(folder, monkeypatch) -> None:  # noqa: ANN001
    build, calls = _counting(1)
    stored_result("lab", {}, build)
    monkeypatch.setattr(store, "code_fingerprint", lambda: "edited engine")
    assert not stored_result("lab", {}, build).from_disk and len(calls) == 2


def test_the_code_fingerprint_covers_the_engine_and_kernels() -> None:
    assert len(store.code_fingerprint()) == 64 and store.code_fingerprint() == store.code_fingerprint()
    assert set(store._PACKAGES) == {"engine", "kernels"}


def test_a_torn_or_foreign_file_is_built_again(folder) -> None:  # noqa: ANN001
    build, calls = _counting([1, 2])
    path = entry_path("lab", {"k": 1})
    path.write_bytes(b"\x80\x05 not a whole pickle")
    assert stored_result("lab", {"k": 1}, build) == StoredResult([1, 2], pytest.approx(time.time(), abs=5),
                                                                 pytest.approx(0.01, abs=1), False)
    # The same file name holding another key's value (a hash prefix collision) is not read as this key's.
    other = entry_path("lab", {"k": 2})
    stored_result("lab", {"k": 2}, _counting([9])[0])
    os.replace(other, path)
    assert stored_result("lab", {"k": 1}, build).value == [1, 2] and len(calls) == 2


def test_a_value_that_cannot_be_pickled_is_only_slower(folder) -> None:  # noqa: ANN001
    build, calls = _counting(lambda: None)  # a lambda does not pickle
    assert not stored_result("lab", {}, build).from_disk
    assert not stored_result("lab", {}, build).from_disk and len(calls) == 2


def test_the_newest_entries_stay(folder, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(store, "KEPT", 3)
    for i in range(5):
        stored_result("lab", {"i": i}, lambda i=i: i)
        os.utime(entry_path("lab", {"i": i}), (1_000 + i, 1_000 + i))  # written in this order
    stored_result("lab", {"i": 0}, lambda: 0)  # evicted, so built again, and newest now
    kept = sorted(p.name for p in folder.glob("*.pkl"))
    assert kept == sorted(entry_path("lab", {"i": i}).name for i in (0, 3, 4))
    assert stored_result("lab", {"i": 3}, lambda: -1).value == 3  # reading refreshes, and reads the stored one


def test_a_lab_run_is_kept_per_weights_and_settings(tiny_weights, folder) -> None:  # noqa: ANN001
    s = LabSettings(methods=("rtn",), bits=3, group=32, calibration_tokens=64, max_new_tokens=4)
    first = stored_lab(tiny_weights, s)
    again = stored_lab(tiny_weights, s)
    assert not first.from_disk and again.from_disk
    assert again.value.variants[0].scores == first.value.variants[0].scores
    assert again.value.reference.answer_ids == first.value.reference.answer_ids
    assert not stored_lab(tiny_weights, dataclasses.replace(s, bits=4)).from_disk
    # Other weights (one tensor changed) are another entry.
    sd = dict(tiny_weights.state_dict)
    sd["model.norm.weight"] = sd["model.norm.weight"] * 1.5
    assert not stored_lab(dataclasses.replace(tiny_weights, state_dict=sd), s).from_disk
    with pytest.raises(ValueError, match="calibration tokens"):  # settings are checked before anything else
        stored_lab(tiny_weights, dataclasses.replace(s, calibration_tokens=5))


def test_a_restarted_server_shows_the_stored_run_and_says_so(random_app, folder, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(state, "_SERVER_RUNS", type(state._SERVER_RUNS)())
    random_app.session_state[f"{PREFIX}-settings"] = ONE_METHOD
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert not any("disk cache" in c.value for c in at.caption)
    labels = [m.label for m in at.metric]
    assert len(list(folder.glob("weight-quant-lab-*.pkl"))) == 1

    # A new server process: nothing in memory, the run on disk. It is shown without running anything.
    monkeypatch.setattr(state, "_SERVER_RUNS", type(state._SERVER_RUNS)())
    monkeypatch.setattr(wq_lab, "run_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    at = new_app()
    at.session_state[f"{PREFIX}-settings"] = ONE_METHOD
    at = open_page(at, PAGE)
    assert_clean(at)
    assert [m.label for m in at.metric] == labels
    assert any("Read back from this machine's disk cache" in c.value for c in at.caption)
