"""The engine's multi-LoRA bookkeeping: adapters registered on the host, the device slots, which slot each
running sequence uses, and each step's row-to-slot map for the batched LoRA kernel.

The scheduler calls `can_admit` / `on_admit` / `on_release`; the engine asks `row_slots` when it
packs a batch and `snapshot` for the step record. Nothing here runs the model.
"""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.lora.adapter import LoraAdapter
from engine.lora.slots import AdapterSlots, SlotEvent
from engine.sequence import Sequence


class LoraManager:
    def __init__(self, cfg: ModelConfig, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model_config = cfg
        self.slots = AdapterSlots(cfg, max_loras, max_rank, device, dtype)
        self.adapters: dict[str, LoraAdapter] = {}  # every registered adapter, on the host
        self._slot_of_seq: dict[int, int] = {}
        self.waiting_for_slot: set[str] = set()  # labels of sequences skipped at admission this step
        self.events: list[SlotEvent] = []  # this step's loads and evictions

    # ---- the host registry -------------------------------------------------------------------------
    def register(self, adapter: LoraAdapter) -> None:
        """ValueError (and nothing registered) for an adapter that does not fit this model or the slots."""
        if not isinstance(adapter, LoraAdapter):
            raise ValueError("register_adapter needs a LoraAdapter (engine.lora.load_adapter reads a file)")
        if not adapter.name or not isinstance(adapter.name, str):
            raise ValueError("an adapter needs a non-empty name")
        adapter.validate(self.model_config)
        if adapter.rank > self.slots.max_rank:
            raise ValueError(f"adapter {adapter.name!r} has rank {adapter.rank}, above this engine's "
                             f"max_lora_rank={self.slots.max_rank}")
        old = self.adapters.get(adapter.name)
        if old is not None and old is not adapter:
            if any(self.slots.resident[s] == adapter.name for s in self._slot_of_seq.values()):
                raise ValueError(f"adapter {adapter.name!r} is in use by running requests; register under a new name")
            slot = self.slots.slot_of(adapter.name)
            if slot is not None:  # a stale copy must not be served: drop it from its slot
                self.slots.resident[slot] = None
        self.adapters[adapter.name] = adapter

    def check(self, name: str | None) -> None:
        if name is not None and name not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise ValueError(f"adapter {name!r} is not registered (registered: {known})")

    # ---- scheduler hooks ---------------------------------------------------------------------------
    def begin_step(self) -> None:
        self.waiting_for_slot = set()
        self.events = self.slots.drain_events()

    def can_admit(self, seq: Sequence) -> bool:
        if seq.adapter is None or self.slots.can_acquire(seq.adapter):
            return True
        self.waiting_for_slot.add(seq.label)
        return False

    def on_admit(self, seq: Sequence, step: int = -1) -> None:
        if seq.adapter is None:
            return
        slot = self.slots.acquire(self.adapters[seq.adapter], step)
        if slot is None:  # can_admit said yes in this same step; nothing may have changed in between
            raise RuntimeError(f"no slot for adapter {seq.adapter!r} after can_admit")
        self._slot_of_seq[seq.seq_id] = slot
        self.events += self.slots.drain_events()

    def on_release(self, seq: Sequence) -> None:
        if self._slot_of_seq.pop(seq.seq_id, None) is not None:
            self.slots.release(seq.adapter)

    # ---- batches -----------------------------------------------------------------------------------
    def row_slots(self, seqs_and_rows: list[tuple[Sequence, int]]) -> list[int] | None:
        """The slot of every row of a packed batch (sequences in row order with their row counts), or
        None when no row runs an adapter (the pass then launches no LoRA kernel at all)."""
        out: list[int] = []
        any_adapter = False
        for seq, n in seqs_and_rows:
            s = self._slot_of_seq.get(seq.seq_id, -1)
            any_adapter |= s >= 0
            out += [s] * n
        return out if any_adapter else None

    def snapshot(self, running: list[Sequence]) -> dict:
        return {**self.slots.snapshot(),
                "registered": {n: {"rank": a.rank, "targets": list(a.targets), "params": a.num_params,
                                   "description": a.description} for n, a in self.adapters.items()},
                "running": {s.label: s.adapter for s in running if s.adapter is not None},
                "waiting_for_slot": sorted(self.waiting_for_slot),
                "events": [{"step": e.step, "kind": e.kind, "adapter": e.adapter, "slot": e.slot, "bytes": e.nbytes}
                           for e in self.events]}
