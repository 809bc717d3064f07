"""Where every benchmark's JSON goes: one helper, so each script's last lines stay one call."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_results(path: str | Path, data: dict) -> Path:
    """Write `data` as indented JSON (parent folders created) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return out


def write_results_and_out(path: str | Path, data: dict) -> Path:
    """`write_results`, and a copy under the same name in $OUT when it is set (the device tool brings back what a
    run leaves there)."""
    out = write_results(path, data)
    if os.environ.get("OUT"):
        write_results(Path(os.environ["OUT"]) / Path(path).name, data)
    return out
