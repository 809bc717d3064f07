"""The adapters resident on the engine's device: `max_loras` slots of stacked A and B matrices that the
batched LoRA kernel indexes by slot (S-LoRA's adapter memory, simplified).

Why slots: a multi-LoRA server keeps far more adapters on the host than fit next to the KV cache on the
device. A request can only run while its adapter is resident, so admission loads it into a free slot,
or into the least recently used slot no running request needs, and a request whose adapter finds every
slot pinned waits (later requests whose adapters are resident may go first).

Layout per layer and fused group (the engine's fused linears: qkv, o, gate_up, down): A [S, R_g, K],
B [S, N, R_g] with R_g = targets in the group x max_rank. Target j of a group owns columns
[j * max_rank, j * max_rank + rank) of A's rows / B's columns and its own output rows of B, so one
shrink and one expand serve the fused linear exactly. The adapter's scale alpha / r is folded into B.
Unlike S-LoRA's unified paging (ranks in pages beside the KV cache) every slot is padded to max_rank:
simpler, and it costs memory, not arithmetic correctness. The static tensors never move, so CUDA graphs
captured once read whatever adapters the slots hold at replay.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.lora.adapter import LoraAdapter, target_shape

# The engine's fused linears and the adapter targets each one holds, in output order.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv", ("q", "k", "v")), ("o", ("o",)), ("gate_up", ("gate", "up")), ("down", ("down",)))


@dataclass(frozen=True, slots=True)
class SlotEvent:
    step: int
    kind: str  # "load" | "evict"
    adapter: str
    slot: int
    nbytes: int


class AdapterSlots:
    def __init__(self, cfg: ModelConfig, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.cfg, self.max_loras, self.max_rank = cfg, max_loras, max_rank
        self.device, self.dtype = torch.device(device), dtype
        L, S = cfg.num_layers, max_loras
        self.A: dict[str, torch.Tensor] = {}
        self.B: dict[str, torch.Tensor] = {}
        self._rows: dict[str, dict[str, tuple[int, int]]] = {}  # group -> target -> output rows [lo, hi)
        for group, targets in GROUPS:
            d_in = target_shape(cfg, targets[0])[1]
            outs = [target_shape(cfg, t)[0] for t in targets]
            R = len(targets) * max_rank
            self.A[group] = torch.zeros(L, S, R, d_in, device=self.device, dtype=dtype)
            self.B[group] = torch.zeros(L, S, sum(outs), R, device=self.device, dtype=dtype)
            lo, rows = 0, {}
            for t, n in zip(targets, outs):
                rows[t] = (lo, lo + n)
                lo += n
            self._rows[group] = rows
        self.resident: list[str | None] = [None] * S
        self.pins = [0] * S  # running sequences using each slot
        self.last_use = [-1] * S
        self.events: list[SlotEvent] = []  # since the last drain_events()
        self.counters = {"loads": 0, "evictions": 0, "bytes_loaded": 0, "hits": 0}
        self._tick = 0

    # ---- queries -----------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.A.values(), *self.B.values()))

    def slot_of(self, name: str) -> int | None:
        return self.resident.index(name) if name in self.resident else None

    def group(self, layer: int, group: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [S, R_g, K], B [S, N, R_g]) of one layer's fused linear."""
        return self.A[group][layer], self.B[group][layer]

    def can_acquire(self, name: str) -> bool:
        return name in self.resident or any(p == 0 for p in self.pins)

    def adapter_bytes(self, adapter: LoraAdapter) -> int:
        """What loading copies to the device: the adapter's own A and B in the slots' dtype."""
        return adapter.num_params * torch.empty((), dtype=self.dtype).element_size()

    # ---- admission ---------------------------------------------------------------------------------
    def acquire(self, adapter: LoraAdapter, step: int = -1) -> int | None:
        """Pin a slot holding `adapter` for one running sequence, loading it first if needed; None when
        every slot is pinned by other adapters (the sequence waits)."""
        self._tick += 1
        slot = self.slot_of(adapter.name)
        if slot is None:
            free = [s for s in range(self.max_loras) if self.pins[s] == 0]
            if not free:
                return None
            # An empty slot first, else the least recently used one (S-LoRA's LRU over host-swapped adapters).
            slot = min(free, key=lambda s: (self.resident[s] is not None, self.last_use[s]))
            old = self.resident[slot]
            if old is not None:
                self.counters["evictions"] += 1
                self.events.append(SlotEvent(step, "evict", old, slot, 0))
            self._load(adapter, slot)
            self.counters["loads"] += 1
            nbytes = self.adapter_bytes(adapter)
            self.counters["bytes_loaded"] += nbytes
            self.events.append(SlotEvent(step, "load", adapter.name, slot, nbytes))
        else:
            self.counters["hits"] += 1
        self.pins[slot] += 1
        self.last_use[slot] = self._tick
        return slot

    def release(self, name: str) -> None:
        slot = self.slot_of(name)
        if slot is None or self.pins[slot] <= 0:
            raise ValueError(f"release of adapter {name!r}, which no running sequence holds")
        self.pins[slot] -= 1

    def drain_events(self) -> list[SlotEvent]:
        events, self.events = self.events, []
        return events

    def _load(self, adapter: LoraAdapter, slot: int) -> None:
        """Copy the adapter into `slot` (zeros where it has no weights: rank below max_rank, targets or
        layers it leaves out)."""
        if adapter.rank > self.max_rank:
            raise ValueError(f"adapter {adapter.name!r} has rank {adapter.rank} > max_lora_rank={self.max_rank}")
        r, R = adapter.rank, self.max_rank
        for group, targets in GROUPS:
            A, B = self.A[group][:, slot], self.B[group][:, slot]
            A.zero_()
            B.zero_()
            for j, t in enumerate(targets):
                lo, hi = self._rows[group][t]
                for layer in range(self.cfg.num_layers):
                    ab = adapter.weights.get((layer, t))
                    if ab is None:
                        continue
                    A[layer, j * R:j * R + r].copy_(ab[0].to(self.device, self.dtype))
                    B[layer, lo:hi, j * R:j * R + r].copy_((ab[1].float() * adapter.scale).to(self.device, self.dtype))
        self.resident[slot] = adapter.name

    def snapshot(self) -> dict:
        return {"max_loras": self.max_loras, "max_rank": self.max_rank, "resident": list(self.resident),
                "pins": list(self.pins), "nbytes": self.nbytes, "counters": dict(self.counters)}
