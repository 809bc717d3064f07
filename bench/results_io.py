"""Where every benchmark's JSON goes: one helper, so each script's last lines stay one call."""
from __future__ import annotations

import json
from pathlib import Path


def write_results(path: str | Path, data: dict) -> Path:
    """Write `data` as indented JSON (parent folders created) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return out
