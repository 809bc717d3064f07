"""Results that are the same every time for the same weights (the full model's own greedy text, which three
labs calibrate and score on), kept on disk beside the weight cache: a restarted app or a second process reads
them in milliseconds instead of generating them again (~40 s on a 2-core CPU).

An entry is keyed by a hash of the weights' bytes and of everything else the result depends on (the prompts,
lengths, device, dtype, torch's version, FORMAT), stored with that key and checked on reading, and written
atomically under a lock, so parallel processes compute it once and nobody reads a torn file. Anything that
goes wrong with the disk (unreadable entry, read-only cache) just means computing again."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine.file_lock import file_lock
from engine.weights import cache_dir

# Bump when what is stored changes meaning (a different generation rule), so old entries are not read.
FORMAT = 1
J = TypeVar("J")  # a JSON value: lists, numbers, strings
T = TypeVar("T")


def state_fingerprint(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """sha256 of every tensor's name, dtype, shape and bytes (~0.5 s for 135M fp32 parameters). None when a
    tensor is not in CPU memory: hashing a GPU's weights would mean copying them all over first."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name]
        if t.device.type != "cpu":
            return None
        t = t.detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else b"")
    return h.hexdigest()


def memo_dir() -> Path:
    return cache_dir().parent / "computed"


def entry_path(name: str, key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(_full_key(key), sort_keys=True).encode()).hexdigest()[:32]
    return memo_dir() / f"{name}-{digest}.json"


def disk_memo(name: str, key: Mapping[str, Any], build: Callable[[], J]) -> J:
    """`build()`'s JSON value for `key`, from disk when an earlier run stored it, else built and stored."""
    path, full = entry_path(name, key), _full_key(key)

    def write(value: J) -> None:
        write_atomically(path, json.dumps({"key": full, "value": value}).encode())

    return locked_memo(path, lambda: _read(path, full), build, write)


def locked_memo(path: Path, read: Callable[[], tuple[T] | None], build: Callable[[], T],
                write: Callable[[T], None]) -> T:
    """`read()`'s value when it has one, else `build()`'s, written with `write` for the next caller. The build
    runs under a lock beside `path`, so parallel processes build once and the others read what it wrote."""
    hit = read()
    if hit is not None:
        return hit[0]
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(path.with_suffix(".lock")))
        except OSError:  # no writable cache: compute without it
            return build()
        hit = read()  # another process stored it while we waited for the lock
        if hit is not None:
            return hit[0]
        value = build()
        write(value)
        return value


def write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file and a rename, so no reader sees half of it; a cache that
    cannot be written is only slower, so errors are swallowed."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is fine to share read-only
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _full_key(key: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "torch": torch.__version__, **key}


def _read(path: Path, full: dict[str, Any]) -> tuple[Any] | None:
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # The key round-tripped through JSON (tuples became lists), so compare it the same way.
    if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(full)) or "value" not in entry:
        return None
    return (entry["value"],)
