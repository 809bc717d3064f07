"""Plain data for the KV cache quantization and eviction page: prompts, variant presets, the settings
table turned into `Variant`s (with one sentence per bad row), and the tables the page shows."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.config import ModelConfig
from engine.kv_compression import FORMATS, EvictionPolicy, LabResult, Variant
from engine.kv_compression.lab import MAX_NEW_TOKENS, MAX_VARIANTS
from engine.kv_compression.policies import POLICY_LABELS
from engine.kv_compression.prompts import RETRIEVAL_ANSWER, RETRIEVAL_GUARD, RETRIEVAL_NOTE

from app.formatting import GIB

REFERENCE = "reference"  # the format column's word for "the engine's own precision" (fp32 on a CPU, bf16 on a GPU)

PROMPTS: dict[str, str] = {
    "Find two details in a long note": RETRIEVAL_NOTE,
    "Explain a concept": "Explain in a short paragraph why the sky is blue during the day and red at sunset.",
    "Write a list": "List five tips for keeping a small vegetable garden healthy, one sentence each.",
}
OWN_PROMPT = "Your own prompt (edit below)"

# Rows of the variant table: format, policy, budget, sinks. "reference" stands for the engine's precision.
PRESETS: dict[str, list[dict]] = {
    "Storage formats": [dict(format=f) for f in ("bf16", "fp8", "int8", "int4", "int2", "int2-kivi")],
    "Eviction at a 64-token budget": [dict(format=REFERENCE, policy=p, budget=64) for p in ("window", "sinks", "h2o")],
    "Quantize and evict": [dict(format="int4"), dict(format=REFERENCE, policy="h2o", budget=128),
                           dict(format="int4", policy="h2o", budget=128), dict(format="int8", policy="sinks", budget=128)],
}
FORMAT_CHOICES = (REFERENCE, *FORMATS)
POLICY_CHOICES = tuple(POLICY_LABELS)
DEFAULT_BUDGET, DEFAULT_SINKS = 64, 4
BF16_NAME = "bf16"


@dataclass(frozen=True, slots=True)
class LabSettings:
    """What the page runs: a prompt, how many tokens, and the variants (the reference is always added)."""

    prompt_name: str
    prompt: str
    max_new_tokens: int
    variants: tuple[Variant, ...]


def preset_rows(name: str) -> list[dict]:
    """A preset's rows with every column filled (the editor shows all four)."""
    return [dict(format=r["format"], policy=r.get("policy", "none"), budget=int(r.get("budget", DEFAULT_BUDGET)),
                 sinks=int(r.get("sinks", DEFAULT_SINKS))) for r in PRESETS[name]]


def reference_format(dtype: str) -> str:
    return "fp32" if dtype == "float32" else "bf16"


def rows_to_variants(rows: Sequence[Mapping], dtype: str) -> tuple[list[Variant], list[str]]:
    """The table's rows as variants, and one sentence per row that cannot run ("Row 2: ...")."""
    variants: list[Variant] = []
    errors: list[str] = []
    for i, row in enumerate(rows, start=1):
        fmt = row.get("format")
        if fmt is None or (isinstance(fmt, float) and np.isnan(fmt)) or fmt == "":
            continue  # an empty row the editor added
        fmt = reference_format(dtype) if fmt == REFERENCE else str(fmt)
        kind = str(row.get("policy") or "none")
        try:
            budget = _whole(row.get("budget"), "budget") if kind != "none" else 0
            sinks = _whole(row.get("sinks"), "sinks") if kind == "sinks" else DEFAULT_SINKS
            variants.append(Variant(fmt, EvictionPolicy(kind, budget, sinks)))  # type: ignore[arg-type]
        except ValueError as e:
            errors.append(f"Row {i}: {e}")
    if not errors:
        seen: set[Variant] = set()
        for i, v in enumerate(variants, start=1):
            if v in seen:
                errors.append(f"Row {i} repeats an earlier row ({v.label}).")
            seen.add(v)
        if len(variants) > MAX_VARIANTS:
            errors.append(f"Compare at most {MAX_VARIANTS} variants at once; the table has {len(variants)}.")
        if not variants:
            errors.append("Add at least one row: a format (and, if you like, an eviction policy) to compare.")
    return variants, errors


def _whole(value, name: str) -> int:  # noqa: ANN001 (a cell: int, float or None)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        raise ValueError(f"the {name} is empty")
    if float(value) != int(float(value)):
        raise ValueError(f"the {name} must be a whole number of tokens; got {value}")
    return int(float(value))


def check_tokens(max_new_tokens: int) -> str | None:
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        return f"Tokens to generate must be between 1 and {MAX_NEW_TOKENS}."
    return None


def few_tokens_note(generated: int, requested: int) -> str | None:
    """Why every variant looks lossless when the run generated one token (None from two on): the first token
    comes from the exact prefill, so no variant's compressed cache was ever read."""
    if generated >= 2:
        return None
    why = ("Tokens to generate is 1" if requested < 2 else
           "The reference ended its answer at its first token")
    return (f"{why}, and the first token comes from the exact prefill: no variant ever read its compressed cache. "
            "That is why every variant shows 100 % top-1 match and KL 0, and why there is no per-token KL chart "
            "and no attention profile. Generate at least 2 tokens to measure the caches.")


def kl_chart_note(generated: int) -> str | None:
    """Why the per-token KL chart is left out (None when it is drawn: 3 generated tokens or more)."""
    if generated >= 3:
        return None
    if generated < 2:
        return "No per-token KL chart: no generated token read a compressed cache (see the note above)."
    return ("No per-token KL chart: only token 2 read a compressed cache (token 1 comes from the exact prefill), "
            "so it would be a single point, and its KL is the table's KL column. Generate 3 tokens or more to "
            "see the distance token by token.")


# ---- tables ------------------------------------------------------------------------------------------

def summary_frame(result: LabResult) -> pd.DataFrame:
    """One row per variant: its memory and how far its predictions moved from the reference's."""
    rows = []
    ref_tokens = result.reference_tokens
    for r in result.variants:
        div = r.first_divergence(ref_tokens)
        rows.append({
            "Variant": ("Reference: " if r.is_reference else "") + r.variant.label,
            "Bytes/token": r.bytes_per_token,
            "Tokens": int(r.cached_tokens[-1]),
            "Size vs BF16": result.size_vs_bf16(r),
            "Top-1 match": r.top1_agreement,
            "KL (nats)": r.mean_kl,
            # Counted from 1, as the weight, activation, LoRA and latent-cache pages count.
            "Text leaves at": "never" if div is None else f"token {div + 1}",
            "Attn ms": 1000 * r.attention_seconds,
        })
    return pd.DataFrame(rows)


def memory_frame(cfg: ModelConfig, gib: float, context: int) -> pd.DataFrame:
    """Each format's bytes per token by the formula, and what a KV budget of `gib` GiB holds."""
    rows = []
    bf16 = FORMATS[BF16_NAME].bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    for fmt in FORMATS.values():
        b = fmt.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        tokens = gib * GIB / b
        rows.append({"Format": fmt.label, "Bits per number": fmt.bits, "Bytes per token": b,
                     "Fits vs BF16": bf16 / b, "Tokens that fit": int(tokens),
                     f"Sequences of {context:,} tokens": int(tokens // context)})
    return pd.DataFrame(rows)


def kept_counts(kept: np.ndarray, step: int, length: int) -> np.ndarray:
    """[layers, length]: how many KV heads of each layer hold each position after `step`."""
    return kept[step, :, :, :length].sum(axis=1)


def answer_found(tokens: Sequence[int], decode, needles: Sequence[str]) -> dict[str, bool]:  # noqa: ANN001
    text = decode(list(tokens))
    return {n: n in text for n in needles}


RETRIEVAL_NEEDLES = {"Find two details in a long note": (RETRIEVAL_ANSWER, RETRIEVAL_GUARD)}
