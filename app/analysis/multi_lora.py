"""What the multi-LoRA page reads from the engine's step records, and the comparison it measures:
the scenario's requests in mixed batches on one engine vs one merged deployment per fine-tune."""
from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass
from typing import Callable

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.lora import bundled_adapters, load_adapter, merged_weights
from engine.lora.adapter import LoraAdapter
from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.scenarios import Scenario
from app.session import EngineSession

BASE = "base model"


@functools.cache
def bundled() -> dict[str, LoraAdapter]:
    """The trained adapters shipped in engine/assets/adapters/, read once per process."""
    return {a.name: a for a in (load_adapter(p) for p in bundled_adapters())}


def lora_engine(config: EngineConfig, weights: LoadedWeights) -> LLMEngine:
    """The page's engine: a multi-LoRA LLMEngine with every bundled adapter registered (on the host; a
    request's adapter goes to a device slot when the request is admitted)."""
    engine = LLMEngine(config, weights)
    for adapter in bundled().values():
        engine.register_adapter(adapter)
    return engine


def adapter_of(session: EngineSession, label: str) -> str:
    spec = session.specs.get(label)
    return (spec.adapter if spec is not None else None) or BASE


def lora_extras(record: StepRecord) -> dict:
    return dict(record.extras).get("lora", {})


@dataclass(frozen=True, slots=True)
class RowSegment:
    """A request's rows in one step's packed batch."""

    label: str
    adapter: str
    start: int
    rows: int
    phase: str


def row_segments(record: StepRecord, adapter_for: Callable[[str], str]) -> list[RowSegment]:
    """The step's rows in the order the engine packs them: sequences prefilling from position 0 first,
    then decodes and chunks that continue cached context (engine/forward_batch.py)."""
    fresh = [s for s in record.batch if s.context_len == s.num_tokens]  # starts at position 0
    rest = [s for s in record.batch if s not in fresh]
    out, row = [], 0
    for s in fresh + rest:
        out.append(RowSegment(s.request_id, adapter_for(s.request_id), row, s.num_tokens, s.phase))
        row += s.num_tokens
    return out


def lora_seconds(record: StepRecord) -> tuple[float, float]:
    """(seconds in the LoRA kernels, seconds in every timed kernel) of one step."""
    lora = sum(k.seconds for k in record.kernels if k.name.startswith("lora."))
    return lora, sum(k.seconds for k in record.kernels)


def slot_history(records: list[StepRecord]) -> list[dict]:
    """Every load and eviction with the step it happened in."""
    return [e for r in records for e in lora_extras(r).get("events", [])]


def waiting_steps(records: list[StepRecord]) -> dict[str, list[int]]:
    """label -> the steps in which it was ready to start but every adapter slot was pinned by others."""
    out: dict[str, list[int]] = {}
    for r in records:
        for label in lora_extras(r).get("waiting_for_slot", []):
            out.setdefault(label, []).append(r.step)
    return out


# ---- mixed batches vs one deployment per fine-tune --------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeploymentRun:
    name: str  # "multi-LoRA" or the adapter a merged deployment serves
    records: tuple[StepRecord, ...]
    labels: tuple[str, ...]
    offset_seconds: float  # engine time before this deployment started (they share one device in turn)
    weights_bytes: int
    errors: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return sum(r.wall_seconds for r in self.records)

    def finish_times(self) -> dict[str, float]:
        """label -> seconds from the start of the whole comparison until its last token."""
        out, clock = {}, self.offset_seconds
        for r in self.records:
            clock += r.wall_seconds
            for label in r.finished:
                out[label] = clock
        return out


@dataclass(frozen=True, slots=True)
class ComparisonSummary:
    name: str
    forward_passes: int
    seconds: float
    output_tokens: int
    mean_batch: float
    mean_finish_s: float
    weights_bytes: int

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def _at_once(scenario: Scenario) -> Scenario:
    """Every request queued at step 0: the two set-ups serve the same queue."""
    return scenario.with_requests([dataclasses.replace(r, arrival_step=0) for r in scenario.requests])


def compare_deployments(scenario: Scenario, weights: LoadedWeights, server: dict[str, str],
                        on_progress: Callable[[int], None] | None = None,
                        max_steps: int = 600) -> dict[str, list[DeploymentRun]]:
    """The scenario's requests (all queued at once) served two ways on this device:
    - "multi-LoRA": one engine, the base weights once, every adapter's requests in the same batches;
    - "one merged deployment per fine-tune": for each adapter (and the base model) a plain engine on the
      merged weights serving only that adapter's requests; on one device they take turns."""
    queue = _at_once(scenario)
    adapters = bundled()
    done = 0

    def run(session: EngineSession) -> None:
        nonlocal done
        while session.has_work and done < max_steps:
            session.step()
            done += 1
            if on_progress:
                on_progress(done)

    mixed = EngineSession.create(queue, weights, server, engine_factory=lora_engine)
    run(mixed)
    base_bytes = mixed.engine.model.weight_bytes if mixed.engine else 0
    lora_bytes = sum(a.nbytes(mixed.kv_bytes_per_element) for a in adapters.values())
    out = {"multi-LoRA": [DeploymentRun("multi-LoRA", tuple(mixed.records), tuple(mixed.request_order), 0.0,
                                        base_bytes + lora_bytes, tuple(e.message for e in mixed.errors))]}
    groups: dict[str | None, list] = {}
    for r in queue.requests:
        groups.setdefault(r.adapter, []).append(dataclasses.replace(r, adapter=None))
    runs, offset = [], 0.0
    plain = {k: v for k, v in queue.engine.items() if k not in ("max_loras", "max_lora_rank")}
    for name, requests in groups.items():
        if name is not None and name not in adapters:
            continue  # the mixed run already reported the unknown adapter
        w = weights if name is None else merged_weights(weights, adapters[name])
        session = EngineSession.create(Scenario(f"{name or BASE} only", tuple(requests), plain), w, server)
        run(session)
        dep = DeploymentRun(name or BASE, tuple(session.records), tuple(session.request_order), offset,
                            session.engine.model.weight_bytes if session.engine else 0,
                            tuple(e.message for e in session.errors))
        offset += dep.seconds
        runs.append(dep)
    out["one merged deployment per fine-tune"] = runs
    return out


def summarize(name: str, runs: list[DeploymentRun]) -> ComparisonSummary:
    records = [r for run in runs for r in run.records]
    finishes = [t for run in runs for t in run.finish_times().values()]
    seqs = [len(r.batch) for r in records if r.batch]
    return ComparisonSummary(
        name, sum(1 for r in records if r.batch), sum(run.seconds for run in runs),
        sum(len(r.emitted) for r in records), statistics.mean(seqs) if seqs else 0.0,
        statistics.mean(finishes) if finishes else 0.0, sum(run.weights_bytes for run in runs))
