"""Plain data for the activation quantization page: the results table, the outliers per layer input, one input's
channels before and after smoothing, NVIDIA's published H200 peaks, and the run as JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from app.formatting import NO_VALUE, first_difference_text
from engine.act_quant.lab import ActLabResult, VariantOutcome

Stat = Literal["mean", "max"]
STAT_LABELS: dict[Stat, str] = {"mean": "mean |x|", "max": "max |x|"}
INPUT_LABELS = {"qkv": "q, k, v (after the attention norm)", "o": "o (attention output)",
                "gate_up": "gate, up (after the MLP norm)", "down": "down (SwiGLU output)"}
TOP_SHARE = 0.01  # the channels marked as outliers: the top 1 % (at least one)
# SmoothQuant's α this near 0 or 1 behaves like the end itself, whose surprises the page explains wherever α shows.
ALPHA_LOW, ALPHA_HIGH = 0.1, 0.9


def fmt_times(ratio: float) -> str:
    """A largest / median ratio, one format page-wide: whole numbers with separators from 10 on ("174×",
    "3,727×"), one decimal below ("3.2×"). "174.3×" beside "3,727×" read as two kinds of number."""
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


def alpha_note(alpha: float) -> str | None:
    """Why SmoothQuant at an extreme α can do worse than no smoothing (None for α in between). The sweep's caption
    said it, but only with a sweep; a run at α = 0 showed the damage with no word on why."""
    if alpha <= ALPHA_LOW:
        formula = f"s_j = max|X_j|^{alpha:g} / max|W_j|^{1 - alpha:g}"
        near = "" if alpha == 0 else f" (at α = {alpha:g}, {formula} is close to it)"
        return ("At α = 0 SmoothQuant is not “no smoothing”: s_j = 1 / max|W_j|" + near + ", which multiplies "
                "each activation channel by its weights' largest entry. That can spread the channels further apart "
                "than they were, and do worse than not smoothing at all.")
    if alpha >= ALPHA_HIGH:
        near = "" if alpha == 1 else f" (at α = {alpha:g}, close to it)"
        return ("At α = 1, s_j = max|X_j|" + near + ": every activation channel is divided down to a largest value "
                "of about 1, and the outliers move whole into the weights' columns, whose per-channel grid then "
                "suffers instead.")
    return None


@dataclass(frozen=True, slots=True)
class VendorPeak:
    """A dense tensor-core peak from NVIDIA's H200 datasheet (the sparse figures are twice these). Not measured
    here: the CPU has no tensor cores, and the app's own H200 measurement is bf16 only (~790 TFLOP/s)."""

    precision: str
    tflops: float


H200_PEAKS = (VendorPeak("BF16", 989.0), VendorPeak("FP8", 1979.0))


def fp8_speedup() -> float:
    peaks = {p.precision: p.tflops for p in H200_PEAKS}
    return peaks["FP8"] / peaks["BF16"]


def answer_note(v: VariantOutcome) -> str:
    return NO_VALUE if v.variant is None else first_difference_text(v.first_difference)


def results_frame(result: ActLabResult) -> pd.DataFrame:
    rows = []
    for v in result.outcomes:
        chat, prose = v.scores["chat"], v.scores["prose"]
        rows.append({"Format": v.label, "W bits": v.bits_per_weight, "A bits": v.bits_per_activation,
                     "Chat KL": chat.kl, "Chat top-1": chat.top1,
                     "Prose KL": prose.kl, "Prose top-1": prose.top1, "Answer leaves at": answer_note(v)})
    return pd.DataFrame(rows)


def outlier_frame(result: ActLabResult) -> pd.DataFrame:
    """One row per (layer, layer input): largest channel / median channel, before and after smoothing."""
    return pd.DataFrame([{"layer": o.layer, "input": o.input, "mean": o.mean_ratio, "max": o.max_ratio,
                          "mean_smoothed": o.mean_ratio_smoothed, "max_smoothed": o.max_ratio_smoothed}
                         for o in result.outliers],
                        columns=["layer", "input", "mean", "max", "mean_smoothed", "max_smoothed"])


@dataclass(frozen=True, slots=True, eq=False)
class ChannelView:
    """One layer input's channels: a statistic before and after dividing by SmoothQuant's s, the outlier
    channels (the top 1 % before smoothing) and the largest / median ratio of each."""

    layer: int
    input: str
    stat: Stat
    before: np.ndarray
    after: np.ndarray
    outliers: np.ndarray  # channel indices
    ratio_before: float
    ratio_after: float


def _ratio(m: np.ndarray) -> float:
    return float(m.max() / max(float(np.median(m)), 1e-12))


def channel_view(result: ActLabResult, layer: int, inp: str, stat: Stat) -> ChannelView:
    key = (layer, inp)
    before = (result.mean_profile if stat == "mean" else result.max_profile)[key]
    after = before / result.scales[key].numpy()
    top = max(1, int(round(TOP_SHARE * len(before))))
    return ChannelView(layer, inp, stat, before, after, np.argsort(before)[::-1][:top], _ratio(before), _ratio(after))


def median_channel_levels(ratio: float) -> str:
    """What a per-tensor INT8 scale (max|x| / 127) leaves the median channel when the largest channel is `ratio`
    times it. Below one level the count itself is meaningless ("about 0.0 of its levels" was printed for 3,727×):
    say that its values round to zero."""
    levels = 127 / max(ratio, 1.0)
    if levels < 0.5:
        return (f"A per-tensor INT8 scale is max|x| / 127, so before smoothing the median channel here spans "
                f"{levels:.2g} of one level: every value it holds rounds to zero.")
    crowded = ": most of its values round to a handful of numbers." if levels < 127 / 20 else "."
    return (f"A per-tensor INT8 scale is max|x| / 127, so before smoothing the median channel here spans about "
            f"{levels:.0f} of its 127 levels{crowded}")


def worst_layer(result: ActLabResult, inp: str, stat: Stat = "max") -> int:
    """The layer whose `inp` has the most extreme channel: the default one to look at."""
    frame = outlier_frame(result)
    rows = frame[frame["input"] == inp]
    return int(rows.loc[rows[stat].idxmax(), "layer"]) if len(rows) else 0


def result_json(result: ActLabResult) -> str:
    s = result.settings
    return json.dumps({
        "settings": {"variants": list(s.variants), "alpha": s.alpha, "sweep": s.sweep,
                     "calibration_tokens": s.calibration_tokens, "prompt": s.prompt,
                     "max_new_tokens": s.max_new_tokens},
        "simulation": "fake quantization: values rounded to each format, matmuls in fp32 on the CPU",
        "seconds": result.seconds,
        "variants": [{"key": v.key, "label": v.label, "bits_per_weight": v.bits_per_weight,
                      "bits_per_activation": v.bits_per_activation, "answer": v.answer_text,
                      "first_difference": v.first_difference,
                      "scores": {d: {"kl": sc.kl, "top1": sc.top1, "nll": sc.nll, "tokens": sc.tokens}
                                 for d, sc in v.scores.items()}} for v in result.outcomes],
        "alpha_sweep": [{"alpha": p.alpha, "chat_kl": p.chat_kl, "chat_top1": p.chat_top1} for p in result.sweep],
        "outliers": outlier_frame(result).to_dict(orient="records"),
    }, indent=1)
