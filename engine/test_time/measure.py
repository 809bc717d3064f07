"""Accuracy vs N and vs thinking budget on the task set, measured on the real engine.

N samples per question come from one request with SamplingParams(n=N): the samples share the
prompt's KV blocks. Accuracy at k <= N reuses those samples: the N samples are cut into N // k
disjoint groups of k, each group is judged by every rule, and the accuracy is the mean over groups
and questions (so k = 1 is the mean single-sample accuracy over all N samples, not one lucky draw).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.test_time.budget import BudgetForcing
from engine.test_time.runner import TestTimeEngine
from engine.test_time.scoring import RULES, ScoredSample, rule_correct
from engine.test_time.tasks import Task
from engine.weights import LoadedWeights


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    question: str
    truth: str
    samples: tuple[ScoredSample, ...]


@dataclass(frozen=True, slots=True)
class TaskSetRun:
    outcomes: tuple[TaskOutcome, ...]
    n: int
    wall_seconds: float
    steps: int
    tokens_computed: int  # prefill + decode tokens the forward passes really computed
    budget: BudgetForcing | None


@dataclass(frozen=True, slots=True)
class CurvePoint:
    rule: str
    k: int
    accuracy: float
    tokens_per_question: float  # output tokens of the k samples, forced tokens included
    groups: int  # judged groups (questions x N // k)


def run_task_set(tasks: Sequence[Task], n: int, weights: LoadedWeights | None = None, temperature: float = 0.8,
                 seed: int = 0, max_tokens: int = 24, budget: BudgetForcing | None = None,
                 config: EngineConfig | None = None) -> TaskSetRun:
    """Every question once, with n samples each, all in one engine (one big continuous batch)."""
    if not tasks:
        raise ValueError("the task set is empty")
    cfg = config or EngineConfig(num_blocks=1024, max_num_seqs=256, max_num_batched_tokens=2048,
                                 profile_kernels=False, trace_detail="light")
    engine = TestTimeEngine(cfg, weights)
    t0 = time.perf_counter()
    rids = [engine.add_request(t.prompt(), SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                                          seed=seed + i, n=n), answer=t.answer, budget=budget)
            for i, t in enumerate(tasks)]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    wall = time.perf_counter() - t0
    outcomes = tuple(TaskOutcome(t.question, t.answer, engine.scored(r)) for t, r in zip(tasks, rids))
    c = engine.engine.counters
    return TaskSetRun(outcomes, n, wall, steps, c["prefill_tokens_computed"] + c["decode_tokens_computed"], budget)


def accuracy_curve(run: TaskSetRun, ks: Sequence[int] = (1, 2, 4, 8)) -> list[CurvePoint]:
    points = []
    for k in ks:
        if not 1 <= k <= run.n:
            raise ValueError(f"k must be in [1, {run.n}], got {k}")
        groups = [o.samples[j * k:(j + 1) * k] for o in run.outcomes for j in range(run.n // k)]
        tokens = sum(s.num_tokens for g in groups for s in g) / len(groups)
        for rule in RULES:
            acc = sum(rule_correct(g, rule) for g in groups) / len(groups)
            points.append(CurvePoint(rule, k, acc, tokens, len(groups)))
    return points


def single_sample_accuracy(run: TaskSetRun) -> float:
    samples = [s for o in run.outcomes for s in o.samples]
    return sum(bool(s.correct) for s in samples) / len(samples)
