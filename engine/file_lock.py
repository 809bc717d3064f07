"""An exclusive lock on a file, so parallel processes (test workers, two app servers) build a cached file once
instead of once each."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held until the block ends; the lock file itself stays (it is empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
        except ImportError:  # non-POSIX: callers still write atomically (rename), so no torn file is read
            pass
        yield
