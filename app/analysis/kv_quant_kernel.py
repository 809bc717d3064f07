"""Plain data for the KV compression page's kernel section: the H200's measured timings (bench/kv_quant_decode.py's
JSON) read back as `QuantDecodeTimings`, and the tables the section shows."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from engine.kv_compression.formats import FORMATS
from kernels.ceilings import Ceilings
from kernels.quant_decode_timing import BF16_BYTES_PER_TOKEN, D, HQ, FormatTiming, QuantDecodeTimings

MEASURED_H200 = Path(__file__).resolve().parents[2] / "bench" / "results" / "kv_quant_decode_h200.json"
BENCH_COMMAND = "python3 bench/kv_quant_decode.py"
ENGINE_LABEL = "engine kernel · BF16"
UNFUSED_LABEL = "INT4 → BF16 copy → engine kernel"


def fused_label(fmt: str) -> str:
    return f"fused kernel · {FORMATS[fmt].label.split(' (')[0]}"


def load_measured(path: Path = MEASURED_H200) -> tuple[str, list[QuantDecodeTimings]] | None:
    """(device name, timings per shape) from a bench run, or None when there is no such file."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    timings = [QuantDecodeTimings(
        r["B"], r["L"], data["device"], r["engine_bf16_us"], r["unfused_int4_us"],
        tuple(FormatTiming(fmt, f["bytes_per_token"], f["us"], f["rel_err"]) for fmt, f in r["formats"].items()),
        r["splits_fused"]) for r in data["rows"]]
    return data["device"], timings


def call_frame(t: QuantDecodeTimings) -> pd.DataFrame:
    """One decode attention call at t's shape, one row per path: bytes it must read, time, speed-up."""
    tokens = t.batch * t.context
    rows = [dict(path=ENGINE_LABEL, fmt="bf16", bytes_per_token=BF16_BYTES_PER_TOKEN, us=t.engine_bf16_us,
                 error=float("nan"))]
    rows += [dict(path=fused_label(f.fmt), fmt=f.fmt, bytes_per_token=f.bytes_per_token, us=f.us, error=f.rel_err)
             for f in t.formats]
    int4 = t.format("int4")
    rows.append(dict(path=UNFUSED_LABEL, fmt="unfused", bytes_per_token=int4.bytes_per_token, us=t.unfused_int4_us,
                     error=float("nan")))
    frame = pd.DataFrame(rows)
    frame["KV read (MB)"] = frame["bytes_per_token"] * tokens / 1e6  # traffic, beside TB/s: decimal
    frame["speed-up"] = t.engine_bf16_us / frame["us"]
    frame["bytes ratio"] = BF16_BYTES_PER_TOKEN / frame["bytes_per_token"]
    frame["TB/s"] = frame["bytes_per_token"] * tokens / (frame["us"] * 1e-6) / 1e12
    frame.loc[frame["fmt"] == "unfused", ["TB/s", "bytes ratio"]] = float("nan")  # it also writes and reads a copy
    return frame


def sweep_frame(timings: Sequence[QuantDecodeTimings], batch: int) -> pd.DataFrame:
    """Speed-up of each fused format over the engine's BF16 kernel, by context, at one batch size."""
    rows = [dict(context=t.context, fmt=f.fmt, us=f.us, speedup=t.speedup(f.fmt),
                 ideal=BF16_BYTES_PER_TOKEN / f.bytes_per_token)
            for t in timings if t.batch == batch for f in t.formats]
    return pd.DataFrame(rows)


def call_flops(batch: int, context: int) -> float:
    """FLOPs of one decode attention call: q·K and p·V, 2 FLOPs a multiply-add, every query head over every key."""
    return 2 * 2 * batch * HQ * context * D


def roofline_frame(t: QuantDecodeTimings, c: Ceilings) -> pd.DataFrame:
    """The engine kernel and the fused formats as roofline points: FLOPs per pool byte read (intensity), achieved
    FLOP/s, and the share of the bandwidth roof at that intensity they reach."""
    frame = call_frame(t)
    frame = frame[frame["fmt"] != "unfused"].drop_duplicates("fmt")  # the engine's BF16 stands for BF16
    tokens = t.batch * t.context
    flops = call_flops(t.batch, t.context)
    frame = frame.assign(intensity=flops / (frame["bytes_per_token"] * tokens), flops_per_s=flops / (frame["us"] * 1e-6))
    frame["of_roof"] = frame["flops_per_s"] / [c.attainable(i) for i in frame["intensity"]]
    return frame[["path", "fmt", "intensity", "flops_per_s", "of_roof", "us"]].reset_index(drop=True)
