"""One browser session's engine for one page: build it from a scenario, step it, keep its records.

Pure Python (no Streamlit) so it is easy to test. The rule that makes scrubbing free: records are
only ever appended; nothing here re-runs a step to redraw it. Errors are kept as messages for the
page to show, and never discard records already computed.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.scenarios import RequestSpec, Scenario

MAX_RECORDS = 2000  # a safety net: a forgotten Play on a long scenario must not eat the server


@dataclass
class SessionError:
    message: str
    details: str = ""  # a traceback for unexpected failures; empty for bad input


@dataclass
class EngineSession:
    scenario: Scenario
    weights: LoadedWeights
    server: dict[str, str]
    engine: LLMEngine | None = None
    records: list[StepRecord] = field(default_factory=list)  # or the factory's records (ClusterStepRecord)
    errors: list[SessionError] = field(default_factory=list)
    request_order: list[str] = field(default_factory=list)  # labels in the order they were added
    specs: dict[str, RequestSpec] = field(default_factory=dict)  # label -> the spec it came from
    built_seconds: float = 0.0
    # What `reset` builds from the scenario's config: an LLMEngine, or anything with its add_request /
    # step / has_work / step_index (the disaggregated page's two-worker engine, whose records are ticks).
    engine_factory: Callable[[EngineConfig, LoadedWeights], Any] = LLMEngine

    @classmethod
    def create(cls, scenario: Scenario, weights: LoadedWeights, server: dict[str, str],
               engine_factory: Callable[[EngineConfig, LoadedWeights], Any] = LLMEngine) -> "EngineSession":
        s = cls(scenario=scenario, weights=weights, server=server, engine_factory=engine_factory)
        s.reset()
        return s

    # ---- lifecycle -------------------------------------------------------------------------------
    def reset(self, scenario: Scenario | None = None) -> bool:
        """Fresh engine and empty timeline for `scenario` (default: the current one). On a bad engine
        config the old engine and records stay and the error is recorded. So they do when a new scenario
        has a request the new engine refuses (a pool too small for it, chunked prefill turned off under a
        small token budget): the run on screen is not traded for a scenario that would run without it."""
        changing = self.engine is not None and scenario is not None and scenario != self.scenario
        scenario = scenario or self.scenario
        t0 = time.perf_counter()
        try:
            engine = self.engine_factory(scenario.engine_config(**self.server), self.weights)
        except ValueError as e:
            self.errors.append(SessionError(f"Engine settings rejected: {e}"))
            return False
        before = (self.scenario, self.engine, self.records, self.errors, self.request_order, self.specs)
        self.scenario, self.engine = scenario, engine
        self.records, self.errors, self.request_order, self.specs = [], [], [], {}
        for spec in scenario.requests:
            self.add_request(spec)
        refused = [e.message for e in self.errors]
        if changing and refused:
            self.scenario, self.engine, self.records, self.errors, self.request_order, self.specs = before
            for message in refused:
                self.report(f"The scenario was not applied, so the run below is the one before. {message}")
            return False
        self.built_seconds = time.perf_counter() - t0
        return True

    def add_request(self, spec: RequestSpec) -> str | None:
        """Queue one request; a ValueError becomes an error message and nothing else changes."""
        assert self.engine is not None
        try:
            # `adapter` only when set: other pages' engines (the disaggregated pair) take no such argument.
            extra = {"adapter": spec.adapter} if spec.adapter is not None else {}
            rid = self.engine.add_request(spec.engine_prompt(), spec.sampling_params(),
                                          arrival_step=spec.arrival_step, request_id=spec.request_id, **extra)
        except ValueError as e:
            label = spec.request_id or f"“{_short(spec.prompt)}”"
            self.report(f"Request {label} was not added: {e}{_fix_hint(str(e))}")
            return None
        labels = [rid] if spec.n == 1 else [f"{rid}#{i}" for i in range(spec.n)]
        self.request_order.extend(labels)
        self.specs.update({label: spec for label in labels})
        return rid

    def add_live_request(self, spec: RequestSpec) -> str | None:
        """A request arriving now (at the engine's next step), while the run is in progress."""
        assert self.engine is not None
        now = self.engine.step_index
        return self.add_request(RequestSpec(**{**spec.to_dict(), "stop": tuple(spec.stop), "arrival_step": now}))

    # ---- stepping --------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.engine is not None and self.engine.has_work() and len(self.records) < MAX_RECORDS

    def step(self) -> StepRecord | None:
        if not self.has_work:
            return None
        assert self.engine is not None
        try:
            record = self.engine.step()
        except Exception as e:  # an engine bug must not take the page (or the other records) down
            self.errors.append(SessionError(f"engine.step() failed: {type(e).__name__}: {e}",
                                            traceback.format_exc()))
            return None
        self.records.append(record)
        return record

    def run(self, max_steps: int) -> int:
        """Step up to `max_steps` times while there is work; returns how many steps ran."""
        n = 0
        while n < max_steps and self.step() is not None:
            n += 1
        return n

    def report(self, message: str, details: str = "") -> None:
        """Add a message for the page, once: the same bad input submitted twice is one message, not two
        stacked copies."""
        if all(e.message != message for e in self.errors):
            self.errors.append(SessionError(message, details))

    def clear_input_errors(self) -> None:
        """Forget messages about bad input (the student has moved on); keep unexpected failures, which
        carry a traceback, until dismissed."""
        self.errors = [e for e in self.errors if e.details]

    def clear_errors(self) -> None:
        self.errors.clear()

    # ---- views -----------------------------------------------------------------------------------
    def record_at(self, index: int) -> StepRecord | None:
        if not self.records:
            return None
        return self.records[max(0, min(index, len(self.records) - 1))]

    def prompt_token_ids(self, label: str) -> list[int]:
        """The prompt as the engine tokenised it (chat template included)."""
        spec = self.specs[label]
        tok = self.weights.tokenizer
        prompt = spec.engine_prompt()
        return tok.apply_chat_template(prompt) if isinstance(prompt, list) else tok.encode(prompt)

    def generated_token_ids(self, label: str, upto: int) -> list[int]:
        """Tokens sampled for `label` in records 0..upto (inclusive), in order."""
        return [e.token_id for r in self.records[: upto + 1] for e in r.emitted if e.request_id == label]

    @property
    def kv_bytes_per_element(self) -> int:
        """Bytes of one cached K or V number at the engine's dtype (4 on the CPU fp32 path)."""
        return torch.empty((), dtype=getattr(torch, self.server.get("dtype", "float32"))).element_size()


def _short(prompt: str, limit: int = 40) -> str:
    """The prompt's start for a message: whole words, no trailing space, an ellipsis when cut."""
    text = " ".join(prompt.split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip() + " …"


def _fix_hint(error: str) -> str:
    """Where the knob is that would let the request in, for the errors a student can fix on the page."""
    for knob in ("max_model_len", "num_blocks", "max_num_batched_tokens"):
        if knob in error or (knob == "num_blocks" and "KV blocks" in error):
            return (f". A shorter prompt or a smaller max_tokens fits; or raise {knob} under "
                    "“Scenario and requests” (the engine settings below the request table; applying restarts "
                    "the engine).")
    return ""
