"""Which cached tokens a sequence keeps when its KV cache has a token budget.

- `window`: the newest `budget` tokens (a sliding window). Once the first tokens leave, attention has
  nowhere to put the weight it used to park on them, and the text degrades.
- `sinks` (StreamingLLM, arXiv 2309.17453): the first `sinks` tokens (attention sinks) plus the newest.
- `h2o` (Heavy-Hitter Oracle, arXiv 2306.14048): the newest half of the budget plus the older tokens
  that have received the most attention so far, chosen per KV head.

Every policy keeps exactly `budget` tokens per head once the cache is over budget, so each head's
cache stays a dense [budget, D] tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PolicyKind = Literal["none", "window", "sinks", "h2o"]
POLICY_LABELS: dict[str, str] = {"none": "keep everything", "window": "sliding window",
                                 "sinks": "sinks + window (StreamingLLM)", "h2o": "heavy hitters + window (H2O)"}
MIN_BUDGET = 8


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    kind: PolicyKind = "none"
    budget: int = 0  # tokens kept per head (0 with kind "none")
    sinks: int = 4  # first tokens always kept by "sinks"
    recent_share: float = 0.5  # share of the budget that "h2o" keeps as the newest tokens

    def __post_init__(self) -> None:
        if self.kind not in POLICY_LABELS:
            raise ValueError(f"unknown eviction policy {self.kind!r}; choose one of {', '.join(POLICY_LABELS)}")
        if self.kind == "none":
            return
        if self.budget < MIN_BUDGET:
            raise ValueError(f"a KV budget of {self.budget} tokens is too small; keep at least {MIN_BUDGET}")
        if self.kind == "sinks" and not 1 <= self.sinks < self.budget:
            raise ValueError(f"attention sinks must be at least 1 and fewer than the budget ({self.budget}); "
                             f"got {self.sinks}")
        if self.kind == "h2o" and not 0.0 < self.recent_share < 1.0:
            raise ValueError(f"H2O's recent share must be between 0 and 1; got {self.recent_share}")

    @property
    def label(self) -> str:
        """Short enough for a table row: "window 64", "StreamingLLM 64 (4 sinks)", "H2O 64"."""
        if self.kind == "none":
            return POLICY_LABELS["none"]
        if self.kind == "sinks":
            return f"StreamingLLM {self.budget} ({self.sinks} sinks)"
        return f"{'window' if self.kind == 'window' else 'H2O'} {self.budget}"

    def select(self, positions: torch.Tensor, scores: torch.Tensor) -> torch.Tensor | None:
        """Indices [Hkv, budget] (ascending) of the tokens to keep, or None when nothing must go.

        positions [Hkv, n]: each cached token's place in the sequence (ascending per head);
        scores [Hkv, n]: attention each token has received so far (read by "h2o" only)."""
        hkv, n = positions.shape
        if self.kind == "none" or n <= self.budget:
            return None
        dev = positions.device
        if self.kind == "window":
            return torch.arange(n - self.budget, n, device=dev).expand(hkv, -1)
        if self.kind == "sinks":
            recent = torch.arange(n - (self.budget - self.sinks), n, device=dev)
            return torch.cat([torch.arange(self.sinks, device=dev), recent]).expand(hkv, -1)
        recent = max(1, int(round(self.budget * self.recent_share)))
        heavy = self.budget - recent
        older = scores[:, : n - recent]
        top = torch.topk(older, heavy, dim=1).indices if heavy else older.new_zeros((hkv, 0), dtype=torch.long)
        keep = torch.cat([top, torch.arange(n - recent, n, device=dev).expand(hkv, -1)], dim=1)
        return keep.sort(dim=1).values
