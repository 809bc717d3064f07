"""One scenario on each of the engine's kernel paths, timed live: the torch reference kernels, our Triton
kernels launched one by one, and the same Triton kernels replayed as CUDA graphs.

What it shows: a decode step of a 135M-parameter model is a few hundred small kernels. Launched one by
one from Python, their launch costs add up to more than their work; a CUDA graph replays the whole step
with one launch. Each path is a fresh engine of the same scenario with kernel profiling off (per-kernel
CUDA events would add a cost of their own), and the engines are stepped in turn, so load on a shared
machine falls on all of them alike.

Not pure like most of `app.analysis`: it steps live engines, but draws nothing.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.roofline_math import step_phase
from app.analysis.side_by_side import step_alternately
from app.scenarios import Scenario
from app.session import EngineSession


@dataclass(frozen=True, slots=True)
class KernelPath:
    key: str
    label: str
    engine: tuple[tuple[str, Any], ...]  # EngineConfig fields this path sets
    needs_cuda: bool


PATHS: tuple[KernelPath, ...] = (
    KernelPath("torch", "torch reference kernels", (("kernel_backend", "torch"), ("cuda_graphs", False)), False),
    KernelPath("triton", "Triton kernels, one launch each", (("kernel_backend", "triton"), ("cuda_graphs", False)),
               True),
    KernelPath("graphs", "Triton kernels in CUDA graphs", (("kernel_backend", "triton"), ("cuda_graphs", True)), True),
)


@dataclass(frozen=True, slots=True)
class PathRun:
    path: KernelPath
    backend: str  # what the engine reported it ran on
    decode_ms: tuple[float, ...]  # wall time of each decode-only step
    prefill_ms: tuple[float, ...]  # wall time of each step with prompt tokens
    decode_tokens: int  # tokens the decode-only steps produced
    tokens: tuple[tuple[str, tuple[int, ...]], ...]  # (request, its generated token ids)
    error: str = ""

    @property
    def median_decode_ms(self) -> float:
        return statistics.median(self.decode_ms) if self.decode_ms else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """At the median decode step (the mean batch over the median step time), so the first step at a
        new batch size, which captures its CUDA graph, does not set it."""
        if not self.decode_ms:
            return float("nan")
        return 1e3 * self.decode_tokens / len(self.decode_ms) / self.median_decode_ms


def runnable_paths(device: str) -> tuple[list[KernelPath], list[KernelPath]]:
    """(the paths this server can run, the ones it cannot): Triton and CUDA graphs need a CUDA device."""
    cuda = torch.device(device).type == "cuda"
    return [p for p in PATHS if cuda or not p.needs_cuda], [p for p in PATHS if p.needs_cuda and not cuda]


def expected_steps(scenario: Scenario) -> int:
    """About how many steps the scenario takes (for a progress bar): its last arrival plus the longest
    request's output, plus a step or two of prefill."""
    return max((r.arrival_step + r.max_tokens + 2 for r in scenario.requests), default=1)


def run_paths(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], paths: list[KernelPath],
              max_steps: int, on_progress: Callable[[int], None] | None = None) -> list[PathRun]:
    """Run the scenario to its end (at most `max_steps` steps) on each path, stepped in turn."""
    settings = {**server, "profile_kernels": False}
    sessions = {p.key: EngineSession.create(scenario.with_engine(**dict(p.engine)), weights, settings) for p in paths}
    step_alternately(sessions, max_steps, on_progress)
    return [_summarise(p, sessions[p.key]) for p in paths]


def _summarise(path: KernelPath, session: EngineSession) -> PathRun:
    records: list[StepRecord] = session.records
    decode = [r for r in records if step_phase(r) == "decode"]
    tokens: dict[str, list[int]] = {}
    for r in records:
        for e in r.emitted:
            tokens.setdefault(e.request_id, []).append(e.token_id)
    return PathRun(
        path=path,
        backend=records[-1].backend if records else "",
        decode_ms=tuple(r.wall_seconds * 1e3 for r in decode),
        prefill_ms=tuple(r.wall_seconds * 1e3 for r in records if step_phase(r) in ("prefill", "mixed")),
        decode_tokens=sum(r.num_decode_tokens for r in decode),
        tokens=tuple((rid, tuple(ids)) for rid, ids in sorted(tokens.items())),
        error="; ".join(e.message for e in session.errors),
    )


def first_difference(runs: list[PathRun]) -> str:
    """'' when every path produced the same tokens for every request, else where the first one differs."""
    base = runs[0]
    for run in runs[1:]:
        for (rid, ref), (_, ids) in zip(base.tokens, run.tokens):
            if ref != ids:
                at = next((i for i, (a, b) in enumerate(zip(ref, ids)) if a != b), min(len(ref), len(ids)))
                return f"{run.path.label} differs from {base.path.label} in {rid} from output token {at}"
    return ""


def summary_rows(runs: list[PathRun]) -> list[dict[str, Any]]:
    """The table under the chart, a row per path (None where a path ran no decode step)."""
    def finite(x: float, digits: int) -> float | None:
        return round(x, digits) if math.isfinite(x) else None

    def three_figures(x: float) -> float | None:  # "74.8" on a CPU, "1.05" on a GPU ("74.833" of a noisy timing)
        return float(f"{x:.3g}") if math.isfinite(x) else None

    return [{"kernel path": r.path.label, "ran on": r.backend, "decode steps": len(r.decode_ms),
             "median decode step (ms)": three_figures(r.median_decode_ms),
             "decode tokens/s": finite(r.decode_tokens_per_s, 0),
             "prefill steps (ms)": ", ".join(f"{t:.3g}" for t in r.prefill_ms)} for r in runs]
