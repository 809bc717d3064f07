"""Plain data for the weight-only quantization page: the results table, per-layer errors, the activation
profile's outliers, the decode-speed bound from the bytes, and the run as JSON."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from app.formatting import MIB, NO_VALUE, first_difference_text
from engine.weight_quant.lab import METHOD_LABELS, LabResult, VariantOutcome
from kernels.ceilings import REFERENCE_CEILINGS

H200 = REFERENCE_CEILINGS["NVIDIA H200"].ceilings
BENCH_PATH = Path(__file__).resolve().parents[2] / "bench" / "results" / "weight_quant_cpu.json"
BENCH_COMMAND = "OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/weight_quant.py"
INPUT_LABELS = {"qkv": "q, k, v (after the attention norm)", "o": "o (attention output)",
                "gate_up": "gate, up (after the MLP norm)", "down": "down (SwiGLU output)"}


# The methods that fit their rounding to the calibration text; round-to-nearest looks at the weights alone.
CALIBRATED = ("awq", "gptq", "gptq_act")
GPTQ_METHODS = ("gptq", "gptq_act")


def group_text(group: int) -> str:
    """The form's option for a grid ("per channel" matches the checkpoints' labels, "INT4 per channel")."""
    return "per channel" if group == 0 else str(group)


def grid_text(group: int) -> str:
    """How the scales are shared, in words; "per channel" explained once, here."""
    return ("one scale per output channel (per channel: a whole row of W)" if group == 0
            else f"groups of {group} input channels")


def calibration_text(methods: tuple[str, ...], tokens: int, calibration: str) -> str:
    """What the calibration text is for in this run: only AWQ and GPTQ fit their rounding to it; with
    round-to-nearest alone it only measures the layers' errors and the activation profile."""
    used = [METHOD_LABELS[m] for m in methods if m in CALIBRATED]
    where = f"{tokens:,} tokens of **{calibration}** text"
    if not used:
        return (f"round-to-nearest uses no calibration: {where} only measure each layer's output error and the "
                "activation profile below")
    names = " and ".join(used) if len(used) <= 2 else ", ".join(used[:-1]) + " and " + used[-1]
    return f"{names} calibrated on {where}" + (" (round-to-nearest uses none)" if "rtn" in methods else "")


def fit_note(methods: tuple[str, ...]) -> str:
    """The closing sentence under the per-layer errors, about the methods that ran: only GPTQ fits the calibration
    text itself, so only then is overfitting it the risk to point at."""
    if any(m in GPTQ_METHODS for m in methods):
        return ("a method can fit the calibration text much better than it fits text it never saw, which is "
                "GPTQ's risk with few calibration tokens.")
    if "awq" in methods:
        rtn = " and round-to-nearest nothing" if "rtn" in methods else ""
        return (f"AWQ takes only each channel's mean |x| and one α per layer from the calibration text{rtn}, so "
                "little here is fitted to it: add GPTQ to see a method that is.")
    return ("round-to-nearest never looks at the calibration text, so nothing here is fitted to it: add GPTQ to see "
            "a method that is.")


def decode_bound_tok_s(weight_bytes: int, bytes_per_s: float = H200.peak_bytes_per_s) -> float:
    """Batch-1 decode reads every weight once per token: at best bandwidth / bytes tokens per second."""
    return bytes_per_s / weight_bytes


def answer_note(v: VariantOutcome) -> str:
    """Where its answer leaves the full model's."""
    return NO_VALUE if v.method is None else first_difference_text(v.first_difference)


def results_frame(result: LabResult) -> pd.DataFrame:
    rows = []
    for v in result.outcomes:
        chat, prose = v.scores["chat"], v.scores["prose"]
        rows.append({
            "Weights": v.label,
            "Bits/weight": v.bits_per_weight,
            "MiB": v.weight_bytes / MIB,
            "H200 tok/s bound": decode_bound_tok_s(v.weight_bytes),
            "Chat KL": chat.kl,
            "Chat top-1": chat.top1,
            "Chat answers ppl": chat.perplexity,
            "Prose KL": prose.kl,
            "Prose ppl": prose.perplexity,
            "Answer leaves at": answer_note(v),
            "Quantize s": v.seconds if v.method else None,
        })
    return pd.DataFrame(rows)


def layer_frame(result: LabResult) -> pd.DataFrame:
    """One row per (method, layer, layer input): the output's relative error on the calibration inputs."""
    rows = [{"method": METHOD_LABELS[v.method], "layer": r.layer, "input": r.input, "rel_error": r.rel_error,
             "alpha": r.alpha} for v in result.variants if v.method for r in v.reports]
    return pd.DataFrame(rows, columns=["method", "layer", "input", "rel_error", "alpha"])


def outlier_stats(profile: dict[tuple[int, str], np.ndarray], layer: int, inp: str,
                  top_share: float = 0.01) -> tuple[np.ndarray, float, int]:
    """The mean |x| per channel, how many times the median the largest is, and how many channels make up the
    top `top_share` (at least one)."""
    m = profile[(layer, inp)]
    return m, float(m.max() / max(float(np.median(m)), 1e-12)), max(1, int(round(top_share * len(m))))


def worst_ratio_layer(profile: dict[tuple[int, str], np.ndarray], inp: str) -> int:
    """The layer whose `inp` has the most extreme channel (max / median): the default one to look at."""
    layers = sorted({layer for layer, name in profile if name == inp})
    return max(layers, key=lambda layer: outlier_stats(profile, layer, inp)[1])


def result_json(result: LabResult) -> str:
    s = result.settings
    return json.dumps({
        "settings": {"methods": list(s.methods), "bits": s.bits, "group": s.group, "calibration": s.calibration,
                     "calibration_tokens": s.calibration_tokens, "prompt": s.prompt,
                     "max_new_tokens": s.max_new_tokens},
        "device": result.device,
        "variants": [{"label": v.label, "method": v.method, "weight_bytes": v.weight_bytes,
                      "bits_per_weight": v.bits_per_weight, "answer": v.answer_text,
                      "first_difference": v.first_difference, "quantize_seconds": v.seconds,
                      "scores": {d: {"kl": sc.kl, "top1": sc.top1, "nll": sc.nll, "tokens": sc.tokens}
                                 for d, sc in v.scores.items()},
                      "layers": [{"layer": r.layer, "input": r.input, "rel_error": r.rel_error, "alpha": r.alpha}
                                 for r in v.reports]}
                     for v in result.outcomes],
    }, indent=1)


def load_bench(path: Path = BENCH_PATH) -> pd.DataFrame | None:
    """Every bit width and calibration set bench/weight_quant.py measured on the real model: one row per
    (bits, calibration, method), or None when the file is missing or not what the bench writes."""
    try:
        data = json.loads(path.read_text())
        if data.get("weights") != "real":
            return None
        frame = pd.DataFrame([{"bits": int(r["bits"]), "calibration": str(r["calibration"]),
                               "method": METHOD_LABELS[r["method"]], "bits_per_weight": float(r["bits_per_weight"]),
                               "mib": float(r["mb"]) * 1e6 / MIB,  # the bench writes decimal MB
                               "chat_kl": float(r["chat_kl"]), "prose_kl": float(r["prose_kl"]),
                               "chat_top1": float(r["chat_top1"])} for r in data["rows"]])
        return frame if len(frame) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
