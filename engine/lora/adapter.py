"""A LoRA adapter: for each adapted linear W [d_out, d_in] of each layer, two small matrices
A [r, d_in] and B [d_out, r], so the fine-tuned layer computes W x + (alpha / r) * B (A x).

Files are safetensors with tensors `layers.{i}.{target}.A` / `.B` and the adapter's name, rank,
alpha, targets and free-form description in the metadata (key "inferscope", JSON), the layout the
training script (`training/train_lora.py`) writes and `engine/lora/` reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from engine.config import ModelConfig

# The seven linears of a Llama layer, in the order the engine fuses them (q, k, v | o | gate, up | down).
TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTERS_DIR = Path(__file__).resolve().parents[1] / "assets" / "adapters"
META_KEY = "inferscope"


def target_shape(cfg: ModelConfig, target: str) -> tuple[int, int]:
    """(d_out, d_in) of one linear of a layer."""
    h, kv, i = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    return {"q": (cfg.num_heads * cfg.head_dim, h), "k": (kv, h), "v": (kv, h), "o": (h, cfg.num_heads * cfg.head_dim),
            "gate": (i, h), "up": (i, h), "down": (h, i)}[target]


def hf_weight_name(layer: int, target: str) -> str:
    """The Hugging Face state-dict key of one adapted linear."""
    part = "self_attn" if target in ("q", "k", "v", "o") else "mlp"
    return f"model.layers.{layer}.{part}.{target}_proj.weight"


@dataclass(frozen=True, slots=True, eq=False)  # eq=False: never compare tensors
class LoraAdapter:
    name: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    # (layer, target) -> (A [rank, d_in], B [d_out, rank]), fp32 on the CPU
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    description: str = ""
    meta: Mapping[str, object] = field(default_factory=dict)  # training record: data, steps, loss, ...

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def num_params(self) -> int:
        return sum(a.numel() + b.numel() for a, b in self.weights.values())

    def nbytes(self, bytes_per_param: int = 2) -> int:
        return self.num_params * bytes_per_param

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.weights}))

    def delta(self, layer: int, target: str) -> torch.Tensor | None:
        """scale * B @ A [d_out, d_in]: what merging adds to W (None: this linear is not adapted)."""
        ab = self.weights.get((layer, target))
        return None if ab is None else self.scale * (ab[1].float() @ ab[0].float())

    def validate(self, cfg: ModelConfig) -> None:
        """ValueError naming what does not fit this model (a file trained for another model)."""
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"adapter {self.name!r}: rank must be a positive integer, got {self.rank!r}")
        bad = [t for t in self.targets if t not in TARGETS]
        if bad:
            raise ValueError(f"adapter {self.name!r}: unknown targets {bad}; expected some of {TARGETS}")
        for (layer, target), (a, b) in self.weights.items():
            if not 0 <= layer < cfg.num_layers or target not in self.targets:
                raise ValueError(f"adapter {self.name!r}: weights for layer {layer} {target!r} do not fit "
                                 f"{cfg.name} ({cfg.num_layers} layers, targets {self.targets})")
            d_out, d_in = target_shape(cfg, target)
            if tuple(a.shape) != (self.rank, d_in) or tuple(b.shape) != (d_out, self.rank):
                raise ValueError(f"adapter {self.name!r}: layer {layer} {target}: A {tuple(a.shape)} and B "
                                 f"{tuple(b.shape)}, expected ({self.rank}, {d_in}) and ({d_out}, {self.rank})")


def save_adapter(adapter: LoraAdapter, path: Path, dtype: torch.dtype = torch.float16) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for (layer, target), (a, b) in sorted(adapter.weights.items()):
        tensors[f"layers.{layer}.{target}.A"] = a.to(dtype).contiguous()
        tensors[f"layers.{layer}.{target}.B"] = b.to(dtype).contiguous()
    meta = {"name": adapter.name, "rank": adapter.rank, "alpha": adapter.alpha, "targets": list(adapter.targets),
            "description": adapter.description, "meta": dict(adapter.meta)}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})


def load_adapter(path: Path | str) -> LoraAdapter:
    """Read an adapter file; ValueError (naming the file) for anything that is not one of ours."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(META_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"{path.name} is not a safetensors adapter file: {e}") from e
    if raw is None:
        raise ValueError(f"{path.name} has no '{META_KEY}' metadata: not an InferScope LoRA adapter")
    try:
        meta = json.loads(raw)
        name, rank, alpha = str(meta["name"]), int(meta["rank"]), float(meta["alpha"])
        targets = tuple(meta["targets"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path.name}: adapter metadata is malformed ({e})") from e
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in tensors.items():
        parts = key.split(".")
        if len(parts) != 4 or parts[0] != "layers" or parts[3] not in ("A", "B"):
            raise ValueError(f"{path.name}: unexpected tensor {key!r}")
        if parts[3] == "B":
            continue
        b = tensors.get(f"layers.{parts[1]}.{parts[2]}.B")
        if b is None:
            raise ValueError(f"{path.name}: {key} has no matching B")
        weights[(int(parts[1]), parts[2])] = (a.float(), b.float())
    return LoraAdapter(name, rank, alpha, targets, weights, str(meta.get("description", "")),
                       dict(meta.get("meta", {})))


def random_adapter(cfg: ModelConfig, name: str, rank: int, targets: tuple[str, ...] = TARGETS,
                   alpha: float | None = None, seed: int = 0, std: float = 0.02) -> LoraAdapter:
    """An adapter of the right shapes with random A and B (both nonzero, unlike a fresh LoRA whose
    B starts at zero): timing runs at any rank and exactness tests, where behaviour does not matter."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(cfg.num_layers):
        for t in targets:
            d_out, d_in = target_shape(cfg, t)
            weights[(layer, t)] = (torch.randn(rank, d_in, generator=g) * std, torch.randn(d_out, rank, generator=g) * std)
    return LoraAdapter(name, rank, float(alpha if alpha is not None else 2 * rank), tuple(targets), weights,
                       f"random rank-{rank} adapter (seed {seed})")


def bundled_adapters() -> list[Path]:
    """The adapter files shipped in engine/assets/adapters/, by name."""
    return sorted(ADAPTERS_DIR.glob("*.safetensors"))
