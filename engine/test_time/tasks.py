"""The task set for measuring test-time scaling: short questions with one whole-number answer.

Chosen on the real SmolLM2-135M-Instruct so that a single sample (temperature 0.8) is right sometimes
but not always (a probe of 8 samples each put them between 1/8 and 6/8): questions it always or never
gets right would not move with N. The questions and answers are data (tasks.json); the bench and the
page's "Measure accuracy vs N" re-measure them live. Chosen on one set of samples, they were measured
again on samples the choice never saw (`OMP_NUM_THREADS=1 python3 bench/test_time_compute.py --seed 1000
--budgets 0:16 --out bench/results/test_time_compute_cpu_seed1000.json`): one sample right 37.5 % of the time,
majority vote of 8 75 %, an oracle over 8 100 %, so the curve is not an artefact of the choice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASKS_FILE = Path(__file__).with_name("tasks.json")
INSTRUCTION = " Answer with a number."


@dataclass(frozen=True, slots=True)
class Task:
    question: str
    answer: str  # a whole number as a string, as engine.test_time.answers.extract_answer writes it

    @property
    def text(self) -> str:
        """The user turn's text: the question and the instruction to answer with a number."""
        return self.question + INSTRUCTION

    def prompt(self) -> list[dict[str, str]]:
        """The chat turn the engine serves (the chat template is applied by the engine)."""
        return [{"role": "user", "content": self.text}]


def answer_key(tasks: tuple[Task, ...]) -> dict[str, str]:
    """Right answers by prompt text: a request whose prompt is a task's text is checked against it."""
    return {t.text: t.answer for t in tasks}


def load_tasks(path: Path = TASKS_FILE) -> tuple[Task, ...]:
    data = json.loads(path.read_text())
    return tuple(Task(str(t["question"]), str(t["answer"])) for t in data["tasks"])
