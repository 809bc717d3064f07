"""Roofline arithmetic: where a step's kernels sit, and what the model's shape predicts.

Two halves, both pure:
- from records: each kernel of a StepRecord as a point (arithmetic intensity = FLOPs / bytes,
  achieved FLOP/s = FLOPs / seconds), with its family and the step's phase;
- from the model's shape: FLOPs per token ~ 2 x parameters, bytes per decode step ~ weights + KV
  read, the decode linear layers' intensity as a function of batch size (~ batch at 2 bytes per
  number) and the batch where it crosses the ridge point.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from engine.config import ModelConfig
from engine.trace import StepRecord
from kernels.ceilings import Ceilings

from app.analysis.kv_math import kv_bytes_per_token

Family = Literal["linear", "lm_head", "attention", "elementwise", "other"]
StepPhase = Literal["prefill", "decode", "mixed", "idle"]

FAMILY_OF: dict[str, Family] = {
    "linear.qkv": "linear", "linear.o": "linear", "linear.gate_up": "linear", "linear.down": "linear",
    "lm_head": "lm_head", "attention.prefill": "attention", "attention.decode": "attention",
    "attention.paged": "attention", "rmsnorm": "elementwise", "rope": "elementwise", "silu_mul": "elementwise",
    "rope_store": "elementwise",  # RoPE fused with the KV-cache write
}
_ELEMENTWISE_HINTS = ("norm", "rope", "silu", "gelu", "add", "mul")


def kernel_family(name: str) -> Family:
    if name in FAMILY_OF:
        return FAMILY_OF[name]
    if name.startswith("linear"):
        return "linear"
    if name.startswith("attention"):
        return "attention"
    if any(h in name for h in _ELEMENTWISE_HINTS):
        return "elementwise"
    return "other"


def step_phase(record: StepRecord) -> StepPhase:
    pre, dec = record.num_prefill_tokens, record.num_decode_tokens
    if pre and dec:
        return "mixed"
    if pre:
        return "prefill"
    return "decode" if dec else "idle"


@dataclass(frozen=True, slots=True)
class KernelPoint:
    step: int
    phase: StepPhase
    name: str
    family: Family
    backend: str
    calls: int
    seconds: float
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def kernel_points(record: StepRecord) -> list[KernelPoint]:
    """The step's kernels that can sit on a roofline (they count FLOPs and bytes and took time)."""
    phase = step_phase(record)
    return [KernelPoint(record.step, phase, k.name, kernel_family(k.name), k.backend, k.calls, k.seconds,
                        k.flops, k.bytes)
            for k in record.kernels if k.flops > 0 and k.bytes > 0 and k.seconds > 0]


def family_points(points: list[KernelPoint]) -> list[KernelPoint]:
    """One point per (step, family): FLOPs, bytes and seconds summed (the 4 linear layers become one
    "linear layers" point, RMSNorm + RoPE + SiLU one "elementwise" point)."""
    groups: dict[tuple[int, str], list[KernelPoint]] = {}
    for pt in points:
        groups.setdefault((pt.step, pt.family), []).append(pt)
    out = []
    for (_, family), pts in groups.items():
        first = pts[0]
        name = first.name if len(pts) == 1 else f"{family} ({', '.join(p.name.split('.')[-1] for p in pts)})"
        out.append(KernelPoint(first.step, first.phase, name, first.family, first.backend, sum(p.calls for p in pts),
                               sum(p.seconds for p in pts), sum(p.flops for p in pts), sum(p.bytes for p in pts)))
    return out


def phase_points(points: list[KernelPoint]) -> list[KernelPoint]:
    """Points of many steps summed per (phase, kernel name): one marker per kernel for all decode
    steps, one for all prefill steps... (step = -1: it stands for several steps)."""
    groups: dict[tuple[str, str], list[KernelPoint]] = {}
    for pt in points:
        groups.setdefault((pt.phase, pt.name), []).append(pt)
    return [KernelPoint(-1, ph, name, pts[0].family, pts[0].backend, sum(p.calls for p in pts),
                        sum(p.seconds for p in pts), sum(p.flops for p in pts), sum(p.bytes for p in pts))
            for (ph, name), pts in groups.items()]


def above_roof(points: list[KernelPoint], c: Ceilings, factor: float = 1.1) -> list[KernelPoint]:
    """Points more than `factor` above the roof at their intensity, worst first. No kernel beats a true
    ceiling, so any such point says the ceilings were measured low (a busy shared machine)."""
    over = [p for p in points if p.flops_per_s > factor * c.attainable(p.intensity)]
    return sorted(over, key=lambda p: p.flops_per_s / c.attainable(p.intensity), reverse=True)


def unplottable_kernels(record: StepRecord) -> list[str]:
    """Kernels with no FLOPs (pure data movement: embedding gather, KV store) or no timing."""
    return [k.name for k in record.kernels if not (k.flops > 0 and k.bytes > 0 and k.seconds > 0)]


@dataclass(frozen=True, slots=True)
class StepTotals:
    flops: float
    bytes: float
    seconds: float  # summed kernel time

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds else 0.0


def step_totals(record: StepRecord) -> StepTotals:
    ks = record.kernels
    return StepTotals(sum(k.flops for k in ks), sum(k.bytes for k in ks), sum(k.seconds for k in ks))


# ---- the model's shape ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LinearShape:
    name: str
    out_features: int
    in_features: int
    per_model: int  # how many times it runs per token (layers, or 1 for the LM head)

    @property
    def params(self) -> int:
        return self.out_features * self.in_features * self.per_model


def linear_shapes(cfg: ModelConfig) -> list[LinearShape]:
    """The matmuls of one token's forward pass, fused the way the engine runs them."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    L = cfg.num_layers
    return [LinearShape("linear.qkv", q + 2 * kv, h, L), LinearShape("linear.o", h, q, L),
            LinearShape("linear.gate_up", 2 * cfg.intermediate_size, h, L),
            LinearShape("linear.down", h, cfg.intermediate_size, L),
            LinearShape("lm_head", cfg.vocab_size, h, 1)]


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (tied embedding counted once, as the LM head)."""
    return sum(s.params for s in linear_shapes(cfg))


def flops_per_token(cfg: ModelConfig, context: int = 0) -> float:
    """2 x matmul parameters, plus attention: 2 matmuls x 2 FLOPs x heads x head dim per cached token."""
    return 2 * matmul_params(cfg) + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def linear_intensity(cfg: ModelConfig, batch: int, elem: int) -> float:
    """All linear layers of one step with `batch` rows: FLOPs / (weights + inputs + outputs) bytes.
    For batch << hidden size this is ~ 2 x batch / elem: ~ batch at bf16, batch / 2 at fp32."""
    flops = sum(2 * batch * s.params for s in linear_shapes(cfg))
    nbytes = sum(s.per_model * (s.out_features * s.in_features + batch * (s.in_features + s.out_features))
                 for s in linear_shapes(cfg)) * elem
    return flops / nbytes


def attention_decode_intensity(cfg: ModelConfig, elem: int) -> float:
    """Decode attention reads every cached K and V once per step for 2 x 2 x Hq x D FLOPs per token:
    2 Hq / (Hkv x elem) FLOP/byte, whatever the batch or context (GQA's group size helps)."""
    return 2 * cfg.num_heads / (cfg.num_kv_heads * elem)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """One decode step of `batch` sequences with `context` cached tokens each."""

    batch: int
    context: int
    elem: int
    flops: float
    weight_bytes: float
    kv_bytes: float
    # Inputs and outputs of the linear layers: counted as `linear_intensity` counts them, so the whole
    # step's intensity can never rise above its linear layers' (it did at context 0 without them).
    activation_bytes: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def seconds(self, c: Ceilings) -> float:
        """Roofline time: the slower of doing the FLOPs at peak and moving the bytes at peak."""
        return max(self.flops / c.peak_flops, self.bytes / c.peak_bytes_per_s)

    def bound(self, c: Ceilings) -> str:
        return c.bound(self.intensity)


def decode_step(cfg: ModelConfig, batch: int, context: int, elem: int) -> DecodeStep:
    """FLOPs ~ batch x 2 x params (+ attention); bytes ~ all weights once + every sequence's KV (+ the
    linear layers' input and output rows)."""
    flops = batch * flops_per_token(cfg, context)
    weights = matmul_params(cfg) * elem
    kv = batch * context * kv_bytes_per_token(cfg, elem)
    activations = batch * sum(s.per_model * (s.in_features + s.out_features) for s in linear_shapes(cfg)) * elem
    return DecodeStep(batch, context, elem, flops, weights, kv, activations)


def smallest_reaching(intensity: Callable[[int], float], ridge: float, limit: int = 1 << 16) -> int | None:
    """The smallest n >= 1 with intensity(n) >= ridge (compute-bound from there on), by bisection: `intensity`
    must not fall as n grows. None if it stays below the ridge up to `limit`."""
    if intensity(limit) < ridge:
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if intensity(mid) >= ridge:
            hi = mid
        else:
            lo = mid + 1
    return lo


def crossing_batch(cfg: ModelConfig, elem: int, ridge: float, limit: int = 1 << 16) -> int | None:
    """The smallest batch whose decode linear layers reach the ridge point (compute-bound from there
    on), or None if they never do below `limit` (intensity saturates at ~ 2 N K / (elem (N + K)))."""
    return smallest_reaching(lambda b: linear_intensity(cfg, b, elem), ridge, limit)


def prefill_linear_intensity(cfg: ModelConfig, prompt_tokens: int, elem: int) -> float:
    """A prefill of L tokens is the same matmuls with L rows: intensity ~ L at bf16."""
    return linear_intensity(cfg, prompt_tokens, elem)


def log_range(lo: float, hi: float, n: int = 200) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def log_integers(lo: int, hi: int, n: int) -> list[int]:
    """`log_range` rounded to whole numbers (batch sizes, block lengths), each once, in order."""
    return sorted({int(round(x)) for x in log_range(lo, hi, n)})
