"""Which tensor- and pipeline-parallel degrees a model allows, and why the others fail.

Tensor parallelism gives every rank whole attention heads (splitting a head would split its softmax) and an
equal share of the MLP's channels and of the vocabulary. With 9 query heads and 3 KV heads SmolLM2-135M splits
over 1 or 3 GPUs; 2, 4 or 8 fail on the heads. Pipeline parallelism gives each stage whole layers; uneven
stages are allowed (the slowest stage sets the pace, and the page shows it).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig

MAX_TP = 8
MAX_PP = 6


@dataclass(frozen=True, slots=True)
class DegreeCheck:
    degree: int
    ok: bool
    reasons: tuple[str, ...]  # why it fails (empty when ok)


def tp_reasons(cfg: ModelConfig, tp: int) -> tuple[str, ...]:
    """Every divisibility rule tensor parallelism of this degree breaks."""
    rules = (("query heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads),
             ("MLP channels", cfg.intermediate_size), ("vocabulary rows", cfg.vocab_size))
    return tuple(f"{n} {what} do not split evenly over {tp} ranks" for what, n in rules if n % tp)


def tp_options(cfg: ModelConfig, max_tp: int = MAX_TP) -> list[DegreeCheck]:
    return [DegreeCheck(t, not tp_reasons(cfg, t), tp_reasons(cfg, t)) for t in range(1, max_tp + 1)]


def check_degrees(cfg: ModelConfig, tp: int, pp: int) -> None:
    """ValueError with a message a page shows as is."""
    if not 1 <= tp <= MAX_TP:
        raise ValueError(f"tensor-parallel degree must be 1 to {MAX_TP}")
    reasons = tp_reasons(cfg, tp)
    if reasons:
        ok = ", ".join(str(c.degree) for c in tp_options(cfg) if c.ok)
        raise ValueError(f"{cfg.name} cannot run tensor-parallel over {tp} ranks: {'; '.join(reasons)}. "
                         f"Degrees that work for it: {ok}.")
    if not 1 <= pp <= min(MAX_PP, cfg.num_layers):
        raise ValueError(f"pipeline-parallel degree must be 1 to {min(MAX_PP, cfg.num_layers)}")


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges, the first stages one layer longer when pp does not divide num_layers."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (s < extra)
        out.append(range(start, start + n))
        start += n
    return out
