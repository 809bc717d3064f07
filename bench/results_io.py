"""Where every benchmark's JSON goes: one helper, so each script's last lines stay one call."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def device_tag(gpu_name: str | None = None) -> str:
    """The card a result came from, for its file name: 'h200' for "NVIDIA H200", 'h100' for "NVIDIA H100 80GB
    HBM3", a slug of the whole name for others ("NVIDIA GeForce RTX 4090": 'geforce_rtx_4090'), 'cpu' without
    CUDA. The device tool hands out H100s as well as H200s, so no default may assume the card."""
    if gpu_name is None:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
        gpu_name = torch.cuda.get_device_name()
    words = re.sub(r"(?i)\bnvidia\b", " ", gpu_name).split()
    if words and re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", words[0]):  # a model number first: H100, A100, L40S
        return words[0].lower()
    return re.sub(r"[^a-z0-9]+", "_", " ".join(words).lower()).strip("_") or "cuda"


def default_results_path(stem: str, gpu_name: str | None = None) -> Path:
    """bench/results/<stem>_<device tag>.json."""
    return RESULTS / f"{stem}_{device_tag(gpu_name)}.json"


def engine_results_path(stem: str, cuda: bool, tag: str = "") -> Path:
    """bench/results/<stem>_cuda_<card>[_<tag>].json or <stem>_cpu[_<tag>].json: for benches that run the engine
    on either device (a CPU run on a GPU machine is still a CPU result, so the flag decides, not the machine)."""
    where = f"cuda_{device_tag()}" if cuda else "cpu"
    return RESULTS / f"{stem}_{where}{'_' + tag if tag else ''}.json"


def write_results(path: str | Path, data: dict) -> Path:
    """Write `data` as indented JSON (parent folders created) and say where. What JSON has no type for (a
    torch dtype, a launch plan) is written as its str."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {out}")
    return out


def write_results_and_out(path: str | Path, data: dict) -> Path:
    """`write_results`, and a copy under the same name in $OUT when it is set (the device tool brings back what a
    run leaves there) and `path` is not in $OUT already."""
    out = write_results(path, data)
    if os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() != out.resolve().parent:
        write_results(Path(os.environ["OUT"]) / out.name, data)
    return out
