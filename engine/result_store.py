"""Lab results that take tens of seconds and come out the same every time for the same weights, settings and
code (the weight- and activation-quantization labs, the latent-cache lab), kept on disk beside the weight
cache with when they were computed and how long that took. A restarted app, or a second server for the same
class, shows them at once and can say where they came from.

The key holds everything the result depends on that the caller names (the weights' hash, the settings, the
device) plus a hash of the engine's and kernels' source, so a result computed by other code is never read
back. Entries are pickles (results are dataclasses holding numpy arrays): the cache is the user's own folder,
the same trust as the weight cache beside it. The newest KEPT entries stay; a file that does not unpickle
(an older class layout, a torn file) is computed again."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from engine.disk_memo import locked_memo, memo_dir, state_fingerprint, write_atomically
from engine.state_memo import StateDictMemo
from engine.weights import LoadedWeights

FORMAT = 1  # bump when an entry's layout changes
KEPT = 64  # entries kept (each a few MB at most); the least recently used go first
SUFFIX = ".pkl"
T = TypeVar("T")
_PACKAGES = ("engine", "kernels")  # the code a lab result comes from


@dataclass(frozen=True, slots=True)
class StoredResult(Generic[T]):
    value: T
    computed_at: float  # Unix time the computation finished
    seconds: float  # how long it took then
    from_disk: bool  # True: read back from an earlier run; False: computed by this call


@functools.cache
def code_fingerprint() -> str:
    """sha256 of every Python file of the engine and kernels packages (names and bytes); ~10 ms, once."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


_FINGERPRINTS: StateDictMemo[str | None] = StateDictMemo()


def weights_fingerprint(weights: LoadedWeights) -> str | None:
    """The weights' hash (~0.5 s, once per state dict); None for weights on a GPU, where hashing would copy
    them all over first."""
    return _FINGERPRINTS.get(weights.state_dict, lambda: state_fingerprint(weights.state_dict))


def computed_now(build: Callable[[], T]) -> StoredResult[T]:
    """`build()`'s value with its time, not stored."""
    t0 = time.perf_counter()
    value = build()
    return StoredResult(value, time.time(), time.perf_counter() - t0, False)


def stored_run(name: str, weights: LoadedWeights, settings: Hashable, build: Callable[[], T],
               **key: Any) -> StoredResult[T]:
    """A lab's run of `settings` on `weights` (`build()`), kept on disk under the weights' hash, the settings'
    repr (frozen dataclasses: every field) and `key` (device, dtype); computed now and not kept for weights on
    a GPU."""
    fingerprint = weights_fingerprint(weights)
    if fingerprint is None:
        return computed_now(build)
    return stored_result(name, {"weights": fingerprint, "settings": repr(settings), **key}, build)


def entry_path(name: str, key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(_full_key(key), sort_keys=True, default=repr).encode()).hexdigest()[:32]
    return memo_dir() / f"{name}-{digest}{SUFFIX}"


def stored_result(name: str, key: Mapping[str, Any], build: Callable[[], T]) -> StoredResult[T]:
    """`build()`'s value for `key` (JSON-like: strings, numbers, lists, dicts), from disk when an earlier run
    stored it, else built now and stored for the next one."""
    path, full = entry_path(name, key), _comparable(_full_key(key))

    def write(result: StoredResult[T]) -> None:
        try:
            data = pickle.dumps({"key": full, "value": result.value, "computed_at": result.computed_at,
                                 "seconds": result.seconds}, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):  # a value that cannot be stored is only slower
            return
        write_atomically(path, data)
        _prune(path.parent)

    return locked_memo(path, lambda: _read(path, full), lambda: computed_now(build), write)


def _full_key(key: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "torch": torch.__version__, "code": code_fingerprint(), **key}


def _comparable(key: dict[str, Any]) -> Any:
    # Compared the way it hashes (tuples as lists, anything else by repr), so equal keys match after a reload.
    return json.loads(json.dumps(key, sort_keys=True, default=repr))


def _read(path: Path, full: Any) -> tuple[StoredResult[Any]] | None:
    try:
        entry = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - missing, torn, or written by other code: compute again
        return None
    if not isinstance(entry, dict) or entry.get("key") != full or "value" not in entry:
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return (StoredResult(entry["value"], float(entry["computed_at"]), float(entry["seconds"]), True),)


def _prune(folder: Path) -> None:
    try:
        entries = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEPT:]:
            old.unlink()
            old.with_suffix(".lock").unlink(missing_ok=True)
    except OSError:
        pass
