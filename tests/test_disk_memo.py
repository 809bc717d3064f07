"""The on-disk memo (engine/disk_memo.py): a value is built once per key and read back by later processes;
other weights, a changed key, a torn or foreign file, or an unwritable cache mean building again, never a
wrong value. And the full model's reference text goes through it."""
from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch

import engine.weight_quant.lab as wq_lab
from engine.disk_memo import disk_memo, entry_path, memo_dir, state_fingerprint


@pytest.fixture
def cache(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("INFERSCOPE_CACHE", str(tmp_path))
    return tmp_path


def _counting(value):  # noqa: ANN001, ANN202
    calls = []

    def build():  # noqa: ANN202
        calls.append(1)
        return value
    return build, calls


def test_a_value_is_built_once_and_read_back(cache) -> None:  # noqa: ANN001
    build, calls = _counting([[1, 2], [3]])
    assert disk_memo("t", {"a": 1}, build) == [[1, 2], [3]]
    assert disk_memo("t", {"a": 1}, build) == [[1, 2], [3]]
    assert len(calls) == 1
    assert entry_path("t", {"a": 1}).parent == memo_dir() and memo_dir().is_relative_to(cache)
    # Another key is another entry; a tuple and a list are the same key (keys are compared as JSON).
    assert disk_memo("t", {"a": 2}, build) == [[1, 2], [3]] and len(calls) == 2
    assert disk_memo("t", {"a": (1,)}, build) and disk_memo("t", {"a": [1]}, build) and len(calls) == 3


def test_a_torn_or_foreign_entry_is_built_again(cache) -> None:  # noqa: ANN001
    build, calls = _counting({"x": 1})
    path = entry_path("t", {"k": "v"})
    path.parent.mkdir(parents=True)
    path.write_text('{"key": ')  # a crash mid-write of an older, non-atomic writer
    assert disk_memo("t", {"k": "v"}, build) == {"x": 1} and len(calls) == 1
    stored = json.loads(path.read_text())
    stored["key"]["k"] = "other"  # the same file name holding another key's value (a hash prefix collision)
    path.write_text(json.dumps(stored))
    assert disk_memo("t", {"k": "v"}, build) == {"x": 1} and len(calls) == 2
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]  # no temp file left behind


def test_an_unwritable_cache_only_means_building_every_time(cache) -> None:  # noqa: ANN001
    (cache / "computed").write_text("a file where the folder should be")
    build, calls = _counting(7)
    assert disk_memo("t", {}, build) == 7 and disk_memo("t", {}, build) == 7 and len(calls) == 2


def test_parallel_callers_build_once(cache) -> None:  # noqa: ANN001
    calls, gate = [], threading.Event()

    def slow() -> int:
        calls.append(1)
        gate.wait(0.2)  # the others reach the lock while this one builds
        return 42
    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(disk_memo("t", {}, slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [42] * 4 and len(calls) == 1


def test_the_fingerprint_sees_every_byte_name_and_dtype() -> None:
    sd = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    base = state_fingerprint(sd)
    assert base == state_fingerprint({k: v.clone() for k, v in sd.items()})
    changed = dict(sd, a=sd["a"].clone())
    changed["a"][1, 2] = torch.nextafter(changed["a"][1, 2], torch.tensor(10.0))  # one ulp
    assert state_fingerprint(changed) != base
    assert state_fingerprint({"a2": sd["a"], "b": sd["b"]}) != base
    assert state_fingerprint(dict(sd, b=sd["b"].double())) != base
    assert state_fingerprint(dict(sd, a=sd["a"].reshape(3, 2))) != base
    assert state_fingerprint(dict(sd, b=torch.ones(4, device="meta"))) is None  # not in CPU memory


def test_reference_texts_are_read_back_from_disk_by_a_fresh_process(cache, tiny_weights, monkeypatch) -> None:  # noqa: ANN001
    weights = dataclasses.replace(tiny_weights, state_dict=dict(tiny_weights.state_dict))  # nothing remembered yet
    first = wq_lab.reference_texts(weights)
    assert any(p.name.startswith("reference-texts-") for p in memo_dir().iterdir())
    # A new process: nothing in memory, and generating is not allowed.
    fresh = dataclasses.replace(weights, state_dict=dict(weights.state_dict))
    monkeypatch.setattr(wq_lab, "greedy_answers", lambda *a, **k: pytest.fail("generated again"))
    assert dataclasses.astuple(wq_lab.reference_texts(fresh)) == dataclasses.astuple(first)
    # Other weights are other text.
    other = dict(weights.state_dict)
    other["model.norm.weight"] = other["model.norm.weight"] * 2
    with pytest.raises(pytest.fail.Exception, match="generated again"):
        wq_lab.reference_texts(dataclasses.replace(weights, state_dict=other))
