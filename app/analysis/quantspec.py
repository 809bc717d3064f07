"""What self-speculation with a quantized KV cache would save, from a measured run and the bytes a step reads.

A decode step at batch 1 is memory-bound: it takes about (weights + KV cache) / bandwidth. The draft reads its
weights (16-bit, or INT4 as in QuantSpec: both are run, each with its own measured acceptance) and the cache in its
low-bit format; the verification pass reads what a target step reads (γ + 1 tokens are still memory-bound). So
with c the draft step's bytes over the target step's, a run of T tokens in R rounds costs Σ_rounds (γ_r · c + 1)
target steps against T for plain decoding. The acceptance is the run's, measured; the bytes are arithmetic, over a
range of contexts (the measured run's own context is short, where weights dominate and c is near 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from engine.config import ModelConfig
from engine.kv_compression.formats import FORMATS
from engine.speculative.quantspec import DRAFT_WEIGHT_GROUP, SelfSpecLabResult, SelfSpecRun

from app.analysis.kv_math import weights_bytes

CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072)
TARGET_BYTES = 2  # the target as a GPU serves it: bf16 weights and bf16 KV


@dataclass(frozen=True, slots=True)
class StepBytes:
    weights: float
    kv: float

    @property
    def total(self) -> float:
        return self.weights + self.kv


def target_step(cfg: ModelConfig, context: int) -> StepBytes:
    return StepBytes(weights_bytes(cfg, TARGET_BYTES), cfg.kv_bytes_per_token(TARGET_BYTES) * context)


def effective_weight_bits(weight_bits: int, group: int = DRAFT_WEIGHT_GROUP) -> float:
    """Bits a weight costs in memory: 16, or the code plus its group's fp16 scale and zero point shared by `group`."""
    return 16.0 if weight_bits >= 16 else weight_bits + 2 * 16 / group


def draft_step(cfg: ModelConfig, context: int, run: SelfSpecRun) -> StepBytes:
    """The draft's bytes: its decoder linears at the run's draft weight width (with their scales), the embedding
    (also the LM head) at 16 bits, its cache at the run's measured bytes per token (the stored format's codes, scales
    and zero points, whatever precision the lab's reference runs in)."""
    embedding = cfg.vocab_size * cfg.hidden_size * TARGET_BYTES
    linears = weights_bytes(cfg, TARGET_BYTES) - embedding
    bits = effective_weight_bits(run.draft_weight_bits)
    return StepBytes(embedding + linears * bits / 16, run.draft_bytes_per_token * context)


def cost_ratio(cfg: ModelConfig, context: int, run: SelfSpecRun) -> float:
    return draft_step(cfg, context, run).total / target_step(cfg, context).total


def modeled_speedup(cfg: ModelConfig, context: int, run: SelfSpecRun) -> float:
    """Plain decoding's target steps over self-speculation's (Σ γ_r c + 1), for the run's rounds."""
    c = cost_ratio(cfg, context, run)
    tokens = sum(len(r.committed) for r in run.rounds)
    return tokens / sum(len(r.drafted) * c + 1 for r in run.rounds) if run.rounds else 1.0


def speedup_frame(cfg: ModelConfig, result: SelfSpecLabResult) -> pd.DataFrame:
    """Each run's modeled speed-up at every context, with its own draft weights (the acceptance is that run's)."""
    rows = [{"format": r.kv_format, "label": FORMATS[r.kv_format].label, "context": ctx,
             "weights": r.draft_weight_bits, "cost ratio": cost_ratio(cfg, ctx, r),
             "speedup": modeled_speedup(cfg, ctx, r)}
            for r in result.runs for ctx in CONTEXTS]
    return pd.DataFrame(rows)


def draft_weights_label(bits: int) -> str:
    """The draft's weights: the target's own (whatever precision the server runs: fp32 on a CPU, where "16-bit"
    was wrong) or rounded to INT4."""
    return "the target's" if bits == 16 else f"INT{bits}"


def best_run(result: SelfSpecLabResult) -> SelfSpecRun:
    """Most tokens per target pass; on a tie the smaller draft cache (INT4 ties INT8 at 7.0 against 11.6 KiB a
    token: naming INT8 said the best result needed the bigger cache)."""
    return max(result.runs, key=lambda r: (round(r.tokens_per_pass, 6), -r.draft_bytes_per_token))


def runs_frame(result: SelfSpecLabResult) -> pd.DataFrame:
    rows = []
    for r in result.runs:
        rows.append({"draft's cache": FORMATS[r.kv_format].label,
                     "draft's weights": draft_weights_label(r.draft_weight_bits),
                     "cache bytes/token": round(r.draft_bytes_per_token), "drafted": r.drafted,
                     "accepted": r.accepted, "acceptance": r.acceptance, "target passes": len(r.rounds),
                     "tokens a pass": round(r.tokens_per_pass, 2),
                     "same text": "yes" if r.tokens == result.plain else "NO"})
    return pd.DataFrame(rows)
