"""The collectives tensor and pipeline parallelism need, run in one process, and what they would send.

On the CPU the ranks of a tensor-parallel group are list entries that take turns; an all-reduce here is their
partial results summed in rank order (NCCL's ring gives every rank the same sum too). What crosses the wire is
counted at the serving precision (bf16 on a GPU), with the standard ring formulas: an all-reduce of N bytes
sends 2 (p - 1) / p x N per rank, an all-gather of N bytes in all (p - 1) / p x N.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import torch

SERVING_BYTES = 2  # bf16 activations on the GPU


def ring_all_reduce_bytes(payload_bytes: int, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `payload_bytes` (reduce-scatter, then all-gather)."""
    return 2 * (ranks - 1) / ranks * payload_bytes if ranks > 1 else 0.0


def all_gather_bytes(total_bytes: int, ranks: int) -> float:
    """Bytes each rank sends to assemble `total_bytes` gathered from all ranks."""
    return (ranks - 1) / ranks * total_bytes if ranks > 1 else 0.0


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    kind: str  # "all_reduce" or "all_gather"
    site: str  # where in the model: "embed", "attn.3", "mlp.3", "logits"
    payload_bytes: int  # the tensor each rank ends up with, at SERVING_BYTES per element
    sent_bytes_per_rank: float
    seconds: float = 0.0  # measured on a real wire (distributed.py); 0 in one process, where nothing is sent


class Group(Protocol):
    """What the tensor-parallel model needs of its group: the partials of the ranks held here (all of them in one
    process, one in a distributed group) in, the whole result out; every call recorded since `reset`."""

    size: int
    calls: list[CollectiveCall]

    def reset(self) -> None: ...

    def all_reduce(self, parts: list[torch.Tensor], site: str) -> torch.Tensor: ...

    def all_gather(self, parts: list[torch.Tensor], site: str) -> torch.Tensor: ...


class InProcessGroup:
    """`size` ranks in this process; records every collective since the last `reset`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[CollectiveCall] = []

    def reset(self) -> None:
        self.calls = []

    def all_reduce(self, parts: list[torch.Tensor], site: str) -> torch.Tensor:
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        payload = total.numel() * SERVING_BYTES
        if self.size > 1:  # one rank does not communicate
            self.calls.append(CollectiveCall("all_reduce", site, payload, ring_all_reduce_bytes(payload, self.size)))
        return total

    def all_gather(self, parts: list[torch.Tensor], site: str) -> torch.Tensor:
        """Rank slices concatenated along the last dimension."""
        out = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        payload = out.numel() * SERVING_BYTES
        if self.size > 1:
            self.calls.append(CollectiveCall("all_gather", site, payload, all_gather_bytes(payload, self.size)))
        return out

    def summary(self) -> dict[str, int]:
        return dict(Counter(c.kind for c in self.calls))
