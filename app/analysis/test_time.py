"""What the test-time compute page computes from its inputs and records (no Streamlit): the checked
run settings, the scenario they make, one table row per sample, and the bench results file."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.test_time import RULES, BudgetForcing, CurvePoint, Task, TaskSetRun, vote_counts
from engine.tokenizer import Tokenizer

from app.scenarios import RequestSpec, Scenario

MAX_SAMPLES = 16
MAX_PROMPT_CHARS = 600
REQUEST_ID = "q"
# A small pool is plenty: 16 samples x (a ~45-token prompt + <= 100 output tokens) fit in 128 x 16 slots.
ENGINE = {"block_size": 16, "num_blocks": 128, "max_model_len": 512, "max_num_seqs": MAX_SAMPLES,
          "max_num_batched_tokens": 512}
BENCH_FILE = Path(__file__).resolve().parents[2] / "bench" / "results" / "test_time_compute_cpu.json"
MODES = ("Best-of-N (parallel samples)", "Budget forcing (s1)")
MAX_TEMPERATURE = 2.0  # the form's widget and `check_settings` share it: a widget that took 5 led to a refusal
# "Measure accuracy vs N" always runs this one set-up, whatever the form says: the curve is the task set's, not the
# run above's, so its caption names it instead of looking like a measurement of the current settings.
MEASURE_N = 8  # samples per question; N = 1, 2, 4 reuse them in disjoint groups
MEASURE_TEMPERATURE = 0.8
MEASURE_MAX_TOKENS = 24


@dataclass(frozen=True, slots=True)
class RunSettings:
    """One run of the page: a question (with its right answer when it comes from the task set), N
    samples, sampling, and a thinking budget in budget-forcing mode."""

    prompt: str
    answer: str | None
    n: int
    temperature: float
    seed: int
    max_tokens: int
    budget: BudgetForcing | None

    def scenario(self) -> Scenario:
        mode = "budget forcing" if self.budget else "best-of-N"
        return Scenario(name=f"{mode}: N = {self.n}, T = {self.temperature:g}",
                        requests=(RequestSpec(self.prompt, max_tokens=self.max_tokens, temperature=self.temperature,
                                              seed=self.seed, n=self.n, request_id=REQUEST_ID),),
                        engine=dict(ENGINE))


def check_settings(prompt: str, answer: str | None, n: int, temperature: float, seed: int, max_tokens: int,
                   budget: tuple[int, int, int] | None, tokenizer: Tokenizer) -> RunSettings:
    """The settings, or ValueError with a message a student can act on (nothing is run or reset)."""
    if not prompt or not prompt.strip():
        raise ValueError("The prompt is empty: pick a question or type one.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"The prompt is {len(prompt)} characters long; at most {MAX_PROMPT_CHARS} keep a run "
                         "short on the CPU.")
    if not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"N must be a whole number from 1 to {MAX_SAMPLES}, got {n!r}.")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and 0 <= temperature <= MAX_TEMPERATURE):
        raise ValueError(f"Temperature must be between 0 and {MAX_TEMPERATURE:g}, got {temperature!r}.")
    if n > 1 and temperature == 0:
        raise ValueError("N > 1 needs a temperature above 0: greedy samples would all be the same text.")
    if not 1 <= max_tokens <= 128:
        raise ValueError(f"max tokens must be from 1 to 128, got {max_tokens}.")
    forcing = None
    if budget is not None:
        lo, hi, ans = budget
        try:
            forcing = BudgetForcing(min_thinking=lo, max_thinking=hi, answer_tokens=ans)
        except ValueError as e:
            raise ValueError(f"Invalid thinking budget: {e}.") from None
    prompt_tokens = len(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
    need = prompt_tokens + (forcing.max_tokens(tokenizer) if forcing else max_tokens)
    if need > ENGINE["max_model_len"]:
        raise ValueError(f"The prompt ({prompt_tokens} tokens) plus what the run may generate ({need - prompt_tokens}) "
                         f"exceeds the context of {ENGINE['max_model_len']} tokens: shorten the prompt or the budget.")
    return RunSettings(prompt.strip(), answer, n, float(temperature), int(seed), int(max_tokens), forcing)


def library(settings: RunSettings, tasks: tuple[Task, ...]) -> list[Scenario]:
    """The scenario editor's ready-made runs (under the page's current mode and budget): the current
    run first, then a few task-set questions with N = 8 and one with N = 16."""
    out = [settings.scenario()]
    for t, n in ((tasks[1], 8), (tasks[6], 8), (tasks[8], 16)):
        sc = task_settings(t, n=n).scenario()
        out.append(Scenario(f"“{t.question}” N = {n}", sc.requests, sc.engine,
                            f"{n} samples of a task-set question at temperature 0.8 (right answer: {t.answer})."))
    return out


def task_settings(task: Task, n: int = 8, temperature: float = 0.8, seed: int = 0, max_tokens: int = 24,
                  budget: BudgetForcing | None = None) -> RunSettings:
    """The page's default run: a task-set question, N = 8."""
    return RunSettings(task.text, task.answer, n, temperature, seed, max_tokens, budget)


def request_view(record_extra: dict[str, Any] | None, request_id: str = REQUEST_ID) -> dict[str, Any] | None:
    """One request in a record's "test_time" extra (None before it exists)."""
    if not record_extra:
        return None
    return record_extra.get("requests", {}).get(request_id)


def request_label(request_id: str) -> str:
    """The request picker's option: what "q" and "r0" are (the scrubber lists every request of the run)."""
    if request_id == REQUEST_ID:
        return f"{REQUEST_ID}: the question set in the form"
    return f"{request_id}: added with “Add a request now”"


def measure_setup(n_questions: int) -> str:
    """The one set-up "Measure accuracy vs N" runs, in words (the form's settings do not enter it)."""
    return (f"{n_questions} task-set question{'' if n_questions == 1 else 's'}, {MEASURE_N} samples each at "
            f"temperature {MEASURE_TEMPERATURE:g}, up to {MEASURE_MAX_TOKENS} tokens, no thinking budget")


def picks_by_sample(view: dict[str, Any]) -> dict[int, list[str]]:
    """Sample index -> the rules that pick it."""
    names = {"majority": "majority vote", "self_certainty": "self-certainty", "oracle": "oracle"}
    out: dict[int, list[str]] = {}
    for key, idx in view["picks"].items():
        if idx is not None:
            out.setdefault(idx, []).append(names[key])
    return out


def sample_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per sample: its answer, score, cost and which rules pick it."""
    picks = picks_by_sample(view)
    rows = []
    for i, s in enumerate(view["samples"]):
        forced = len(s["forced"])
        rows.append({
            "sample": s["label"], "status": s["finish_reason"] or s["status"],
            "answer": "–" if s["answer"] is None else s["answer"] + ("" if finished(s) else " so far"),
            "right?": "–" if s["correct"] is None or s["answer"] is None else ("yes" if s["correct"] else "no"),
            "mean log p": None if math.isinf(s["mean_logprob"]) else round(s["mean_logprob"], 3),
            "tokens": s["num_tokens"], "forced": forced,
            "blocks (shared + own)": f"{s['shared_blocks']} + {s['own_blocks']}",
            "picked by": ", ".join(picks.get(i, [])) or "",
        })
    return rows


def finished(sample: dict[str, Any]) -> bool:
    """Whether a sample of a request view has ended (its finish reason is "" while it runs)."""
    return bool(sample["finish_reason"])


def answer_counts(view: dict[str, Any], finished_only: bool = False) -> dict[str, int]:
    """Samples per final answer, most voted first (ties in the order the answers first appear). A running
    sample counts the answer in its text so far unless `finished_only`."""
    return vote_counts([s["answer"] for s in view["samples"] if finished(s) or not finished_only])


def still_writing(view: dict[str, Any]) -> int:
    """How many of the request's samples are still running: until none is, every vote is provisional."""
    return sum(not finished(s) for s in view["samples"])


def load_bench(path: Path = BENCH_FILE) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pass_at_n_closed_form(run: TaskSetRun, ks: tuple[int, ...]) -> dict[int, float]:
    """The explanation panel's pass@N = 1 - (1 - p)^N, averaged over the questions with each question's own
    p (the share of its samples that are right): what an oracle over N independent samples is expected to
    reach, to set beside the oracle line measured on disjoint groups of the same samples."""
    ps = [sum(bool(s.correct) for s in o.samples) / len(o.samples) for o in run.outcomes if o.samples]
    return {k: sum(1 - (1 - q) ** k for q in ps) / len(ps) if ps else 0.0 for k in ks}


def oracle_at(points: list[CurvePoint], k: int) -> float:
    """The measured oracle (pass@N) accuracy at N = k."""
    return next(p.accuracy for p in points if p.rule == RULES[2] and p.k == k)
