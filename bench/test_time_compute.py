"""Test-time compute on the CPU: accuracy vs N (best-of-N, three selection rules) and vs thinking budget
(s1 budget forcing), with the tokens each spends and the wall time, on the task set of
engine/test_time/tasks.json and the real SmolLM2-135M-Instruct.

Accuracy vs N: every question gets N_max samples (one request with n = N_max, temperature 0.8); N < N_max
reuses them in N_max / N disjoint groups (engine/test_time/measure.py). Accuracy vs budget: every question
gets `--budget-samples` samples under each (min, max) thinking budget; the answer is read after the forced
"Final answer:" cue, and the column "acc" is the mean single-sample accuracy.

    OMP_NUM_THREADS=1 python bench/test_time_compute.py              # ~1-2 min on 2 cores
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results_io import write_results  # noqa: E402
from engine.test_time import BudgetForcing, accuracy_curve, load_tasks, run_task_set, single_sample_accuracy  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="samples per question for accuracy vs N")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=24, help="best-of-N: tokens per sample")
    ap.add_argument("--budgets", default="0:16,0:32,0:64,16:32,32:64", help="min:max thinking budgets")
    ap.add_argument("--budget-samples", type=int, default=4)
    ap.add_argument("--answer-tokens", type=int, default=6)
    ap.add_argument("--out", default="bench/results/test_time_compute_cpu.json")
    args = ap.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    weights = load_weights("real")
    tasks = load_tasks()
    ks = [k for k in (1, 2, 4, 8, 16) if k <= args.n]
    run = run_task_set(tasks, args.n, weights, args.temperature, args.seed, args.max_tokens)
    curve = accuracy_curve(run, ks)
    print(f"best-of-N: {len(tasks)} questions x {args.n} samples, {run.wall_seconds:.1f} s, {run.steps} steps, "
          f"{run.tokens_computed} tokens computed")
    print(f"{'N':>3} {'tokens/q':>9} " + " ".join(f"{r:>16}" for r in ("majority vote", "self-certainty", "oracle (pass@N)")))
    for k in ks:
        row = {p.rule: p for p in curve if p.k == k}
        print(f"{k:>3} {row['majority vote'].tokens_per_question:>9.1f} "
              + " ".join(f"{100 * row[r].accuracy:>15.1f}%" for r in ("majority vote", "self-certainty", "oracle (pass@N)")))
    budget_rows = []
    print(f"\nbudget forcing: {args.budget_samples} samples per question, temperature {args.temperature}")
    print(f"{'min':>4} {'max':>4} {'acc':>7} {'tokens/sample':>14} {'waits/sample':>13} {'wall':>7}")
    for spec in args.budgets.split(","):
        lo, hi = (int(x) for x in spec.split(":"))
        b = BudgetForcing(min_thinking=lo, max_thinking=hi, answer_tokens=args.answer_tokens)
        r = run_task_set(tasks, args.budget_samples, weights, args.temperature, args.seed, 1, budget=b)
        samples = [s for o in r.outcomes for s in o.samples]
        row = {"min_thinking": lo, "max_thinking": hi, "accuracy": round(single_sample_accuracy(r), 4),
               "tokens_per_sample": round(sum(s.num_tokens for s in samples) / len(samples), 1),
               "wait_forced_per_sample": round(sum(s.text.count(b.wait_text.strip()) for s in samples) / len(samples), 2),
               "wall_seconds": round(r.wall_seconds, 2)}
        budget_rows.append(row)
        print(f"{lo:>4} {hi:>4} {100 * row['accuracy']:>6.1f}% {row['tokens_per_sample']:>14.1f} "
              f"{row['wait_forced_per_sample']:>13.2f} {r.wall_seconds:>6.1f}s")
    write_results(args.out, {
        "machine": "cpu", "threads": torch.get_num_threads(), "model": weights.config.name,
        "tasks": len(tasks), "temperature": args.temperature, "seed": args.seed,
        "best_of_n": {"n": args.n, "max_tokens": args.max_tokens, "wall_seconds": round(run.wall_seconds, 2),
                      "single_sample_accuracy": round(single_sample_accuracy(run), 4),
                      "curve": [{"N": p.k, "rule": p.rule, "accuracy": round(p.accuracy, 4),
                                 "tokens_per_question": round(p.tokens_per_question, 1), "groups": p.groups}
                                for p in curve]},
        "budget": budget_rows,
        "note": (f"{len(tasks)} task-set questions, {args.budget_samples} samples each at temperature {args.temperature}; "
                 "accuracy = mean single-sample accuracy with the answer read after the forced cue; "
                 "tokens per sample include forced “ Wait,”, the cue and the forced end of turn."),
    })


if __name__ == "__main__":
    main()
