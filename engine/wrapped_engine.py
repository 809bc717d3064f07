"""`EngineWrapper`: an LLMEngine with one feature's picture added to every step's record.

Test-time compute and constrained decoding each wrap an engine this way: everything but what they add
(config, tokenizer, step_index, counters, ...) is the inner engine's, so a page's EngineSession drives the
wrapper like any engine; `step()` returns the inner StepRecord with one more extra, `snapshot()` under
`EXTRA`, unless the engine traces light (no per-step picture; a benchmark reads `snapshot()` once).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from engine.engine import LLMEngine
from engine.sequence import Sequence
from engine.trace import StepRecord


class EngineWrapper:
    EXTRA: str = ""  # the record extra's key

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._seqs: dict[str, list[Sequence]] = {}  # request id -> its samples, once all exist

    def __getattr__(self, name: str) -> Any:  # config, model_config, tokenizer, step_index, counters, ...
        return getattr(self.__dict__["engine"], name)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> StepRecord:
        record = self.engine.step()
        if self.engine.config.trace_detail == "light":
            return record
        return dataclasses.replace(record, extras=record.extras + ((self.EXTRA, self.snapshot()),))

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def sequences(self, request_id: str) -> list[Sequence]:
        """The request's samples in index order (kept once all n exist: a snapshot asks every step)."""
        seqs = self._seqs.get(request_id)
        if seqs is None:
            seqs = sorted((s for s in self.engine.sequences if s.request_id == request_id), key=lambda s: s.index)
            if seqs and len(seqs) == seqs[0].params.n:
                self._seqs[request_id] = seqs
        return seqs
