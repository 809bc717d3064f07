"""Test-time compute (inference-time scaling) on the real engine: best-of-N with three selection
rules (majority vote, self-certainty, an oracle), and budget forcing of the thinking length (s1)."""
from engine.test_time.answers import extract_answer, majority_vote, vote_counts
from engine.test_time.budget import BudgetForcer, BudgetForcing, BudgetState
from engine.test_time.measure import (CurvePoint, TaskOutcome, TaskSetRun, accuracy_curve, run_task_set,
                                      single_sample_accuracy)
from engine.test_time.runner import TestTimeEngine
from engine.test_time.scoring import RULES, ScoredSample, Selection, mean_logprob, score_sample, select
from engine.test_time.tasks import Task, load_tasks

__all__ = ["BudgetForcer", "BudgetForcing", "BudgetState", "CurvePoint", "RULES", "ScoredSample", "Selection",
           "Task", "TaskOutcome", "TaskSetRun", "TestTimeEngine", "accuracy_curve", "extract_answer",
           "load_tasks", "majority_vote", "mean_logprob", "run_task_set", "score_sample", "select",
           "single_sample_accuracy", "vote_counts"]
