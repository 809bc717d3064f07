"""Where tensor parallelism pays: a decode step's floor for published dense models at TP = 1 .. 8, in arithmetic.

SmolLM2's step is far too small for TP to pay (the page measures that). For a large model a decode step at small
batch is bound by reading the weights and the KV cache from memory, and TP divides those bytes over the GPUs while
adding 2 all-reduces per layer. The floor here is bytes over the device's memory bandwidth (the caller passes it:
the page takes the H200's measured device copy, kernels.ceilings.REFERENCE_CEILINGS) plus the collectives at an
assumed latency. Compute and kernel overheads are left
out, so the real step is slower; the shape of the trade is what this shows.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DenseShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params_b: float  # published, billions
    source: str


# From the models' published configuration files (config.json).
DENSE_MODELS: tuple[DenseShape, ...] = (
    DenseShape("Llama 3.1 8B", 32, 4096, 32, 8, 128, 8.03, "meta-llama/Llama-3.1-8B config.json"),
    DenseShape("Llama 3.1 70B", 80, 8192, 64, 8, 128, 70.6, "meta-llama/Llama-3.1-70B config.json"),
    DenseShape("Llama 3.1 405B", 126, 16384, 128, 8, 128, 405.9, "meta-llama/Llama-3.1-405B config.json"),
)


@dataclass(frozen=True, slots=True)
class TpFloor:
    model: str
    tp: int
    weights_gb: float  # per GPU
    kv_gb: float  # per GPU, for the batch at the context
    read_ms: float  # weights + KV read once at the bandwidth
    wire_ms: float  # (2 x layers + 2) collectives at the assumed latency
    fits: bool  # weights + KV within one GPU's memory

    @property
    def step_ms(self) -> float:
        return self.read_ms + self.wire_ms


def tp_floor(m: DenseShape, tp: int, batch: int, context: int, bytes_per_s: float, memory_bytes: float,
             allreduce_us: float, bytes_per_param: int = 2) -> TpFloor:
    """Every weight is split over the `tp` GPUs (vocabulary-parallel embedding and head included); each GPU holds
    kv_heads / tp KV heads (at least one: past the KV-head count they are copied, as serving engines do)."""
    if tp < 1:
        raise ValueError("tp must be at least 1")
    weights = m.params_b * 1e9 * bytes_per_param / tp
    kv_heads = max(1, m.kv_heads // tp)
    kv = batch * context * 2 * m.layers * kv_heads * m.head_dim * bytes_per_param
    read_ms = (weights + kv) / bytes_per_s * 1e3
    wire_ms = (2 * m.layers + 2) * allreduce_us / 1e3 if tp > 1 else 0.0
    return TpFloor(m.name, tp, weights / 1e9, kv / 1e9, read_ms, wire_ms, weights + kv <= memory_bytes)
