"""Tree speculation (Medusa, EAGLE) read from StepRecords: one round's draft tree as a networkx graph,
its tree attention mask, accepted length over steps, the verification cost of a tree of N nodes
measured on the live model, the training logs of the heads, and Medusa vs EAGLE vs plain on one
scenario. Round format: "kind": "tree" rounds of the "spec" extra (engine/speculative/speculator.py).
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import torch

from engine.forward_batch import build_forward_batch
from engine.kv_pool import KVPool
from engine.speculative.heads import HEADS_DIR
from engine.speculative.tree import DraftTree
from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.pass_timing import PassTiming, pass_timers, timing_note
from app.analysis.speculative import DrafterRun, run_variants
from app.formatting import fmt_duration, plural
from app.scenarios import Scenario

ROOT = -1  # the root's node id in the graph (the request's last sampled token)
FINAL = -2  # the token the round added after the accepted path (bonus or replacement)


# ---- one round -----------------------------------------------------------------------------------

def tree_rounds(record: StepRecord) -> list[dict[str, Any]]:
    spec = record.extra("spec")
    return [dict(r) for r in spec["rounds"] if r.get("kind") == "tree"] if spec else []


def round_tree(r: dict[str, Any]) -> DraftTree:
    t = r["tree"]
    return DraftTree(tuple(t["token_ids"]), tuple(t["parents"]), tuple(t["q"]), tuple(t["path_prob"]))


def draft_tree_graph(r: dict[str, Any]) -> nx.DiGraph:
    """Root -> nodes (token text, q, path probability, depth, status, row in the verification pass),
    plus the final token hanging under the last accepted node."""
    t = r["tree"]
    g = nx.DiGraph()
    g.add_node(ROOT, text=r["root_text"], status="root", depth=0, q=1.0, path_prob=1.0, row=0)
    for i, (text, parent) in enumerate(zip(t["texts"], t["parents"])):
        g.add_node(i, text=text, status=t["status"][i], depth=t["depths"][i], q=t["q"][i],
                   path_prob=t["path_prob"][i], row=i + 1, argmax=r["target_argmax_texts"][i + 1])
        g.add_edge(parent if parent >= 0 else ROOT, i)
    last = r["accepted_path"][-1] if r["accepted_path"] else ROOT
    g.add_node(FINAL, text=r["final_text"], status=r["final_kind"], depth=len(r["accepted_path"]) + 1,
               q=float("nan"), path_prob=float("nan"), row=-1, p=r["final_p"])
    g.add_edge(last, FINAL)
    return g


def mask_labels(r: dict[str, Any]) -> list[str]:
    t = r["tree"]
    return [f"root {r['root_text']}"] + [f"n{i} {text} (d{d})" for i, (text, d) in
                                          enumerate(zip(t["texts"], t["depths"]))]


def mask_caption(r: dict[str, Any]) -> str:
    """How to read the tree attention mask's three colours for this round."""
    a = len(r["accepted_path"])
    kept = "the root" + (f" and the {plural(a, 'accepted node')}" if a else " (no node was accepted)")
    return ("Each row is one token of the verification pass, each column a token it may attend to (the cached "
            "context, visible to every row, is left out). Grey: visible, the row's ancestors and itself; white: "
            f"hidden, another branch. Green: the visible cells of the rows that were kept ({kept}), which is the "
            "causal mask plain decoding would have used for those tokens.")


def round_sentence(r: dict[str, Any]) -> str:
    n = len(r["tree"]["token_ids"])
    a = r["num_accepted"]
    depth = max(r["tree"]["depths"], default=0)
    path = " ".join(f"`{r['tree']['texts'][i]}`" for i in r["accepted_path"]) or "nothing"
    final = f"`{r['final_text']}`"
    how = ("the bonus token " + final + " from the last accepted row" if r["final_kind"] == "bonus"
           else final + (" drawn from what the rejected children left" if r["mode"] == "sampled"
                         else " (the target's argmax, which no child had)"))
    return (f"**{r['request_id']}** ({r['mode']}): a tree of **{plural(n, 'node')}, depth {depth}** verified in one "
            f"pass of {plural(n + 1, 'row')}. Accepted path: {path} ({plural(a, 'token')}), then {how} → "
            f"**{plural(a + 1, 'token')} from one target pass**; {n - a} of its {plural(n, 'node slot')} rolled back"
            + (f", {plural(len(r['kv_moves']), 'accepted slot')} moved next to the context." if r["kv_moves"] else "."))


# ---- over steps ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TreePoint:
    step: int
    request_id: str
    accepted: int  # drafts accepted in this round
    nodes: int
    depth: int
    draft_seconds: float
    verify_seconds: float

    @property
    def tokens(self) -> int:
        return self.accepted + 1


def tree_series(records: list[StepRecord]) -> list[TreePoint]:
    return [TreePoint(rec.step, r["request_id"], int(r["num_accepted"]), len(r["tree"]["token_ids"]),
                      max(r["tree"]["depths"], default=0), float(r["draft_seconds"]), float(r["verify_seconds"]))
            for rec in records for r in tree_rounds(rec)]


def mean_tokens_per_round(points: list[TreePoint]) -> float | None:
    return sum(p.tokens for p in points) / len(points) if points else None


# ---- knobs and their cost ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class VerifyCost:
    nodes: int
    seconds: float  # median of the repeats: one target pass of 1 + nodes rows over the context
    fastest: float = math.nan  # the spread of the repeats, drawn as the point's bar
    slowest: float = math.nan
    runs: int = 1  # timed passes behind the median
    timing: PassTiming = PassTiming.EAGER  # app/analysis/pass_timing.py


def verify_cost_sweep(engine, context_len: int = 128, sizes: tuple[int, ...] = (0, 4, 8, 16, 32, 64),
                      repeats: int = 5) -> list[VerifyCost]:
    """Time one target pass verifying a tree of N nodes (a root with N children in a chain-of-stars shape
    does not matter for cost: rows and mask size do) after `context_len` cached tokens, on the engine's
    model and device, in a scratch KV pool (the engine's own pool and requests are untouched).

    The sizes are timed in turn, `repeats` rounds after one warm-up round, and each keeps its median: on a
    shared CPU a burst of load then lands on every size alike, where timing each size's repeats back to back
    let one burst put 4 nodes at 184 ms above 8 nodes at 100 ms. On a GPU each pass is replayed from a CUDA
    graph (app/analysis/pass_timing.py says why)."""
    repeats = max(repeats, 1)
    cfg, bs = engine.model_config, engine.config.block_size
    n_max = context_len + max(sizes) + 1
    blocks = (n_max + bs - 1) // bs
    pool = KVPool(cfg, blocks, bs, engine.dtype, engine.device, head_major=engine.pool.head_major)
    table = list(range(blocks))
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(10, cfg.vocab_size, (context_len,), generator=gen).tolist()
    batches = [_tree_batch(engine, n, context_len, table, gen) for n in sizes]
    times: list[list[float]] = [[] for _ in sizes]
    with torch.inference_mode():
        engine.model.forward(build_forward_batch([(ctx, 0, list(range(context_len)))], [], [], engine.device), pool)
        timers, timing = pass_timers(engine, batches, pool)
        for round_ in range(repeats + 1):  # round 0 warms every shape up and is not counted
            for timer, kept in zip(timers, times):
                seconds = timer()
                if round_:
                    kept.append(seconds)
            engine.kernels.timer.drain()
    return [VerifyCost(n, statistics.median(t), min(t), max(t), len(t), timing) for n, t in zip(sizes, times)]


def _tree_batch(engine, n: int, context_len: int, table: list[int], gen: torch.Generator):  # noqa: ANN001, ANN202
    """The verification batch of an n-node tree (four branches deepening in turn) after the context."""
    toks = torch.randint(10, engine.model_config.vocab_size, (n + 1,), generator=gen).tolist()
    parents = tuple(-1 if i < 4 else (i - 4) for i in range(n))
    tree = DraftTree(tuple(toks[1:]), parents, (1.0,) * n, (1.0,) * n)
    trees = {0: ([0] + tree.depths, tree.mask())} if n else None
    return build_forward_batch([], [(toks, context_len, list(range(context_len, context_len + n + 1)), table)],
                               list(range(n + 1)), engine.device, trees)


def cost_inversions(costs: list[VerifyCost]) -> list[tuple[VerifyCost, VerifyCost]]:
    """Neighbouring sizes where the bigger tree's pass measured faster: noise, since more rows are no less work."""
    return [(a, b) for a, b in zip(costs, costs[1:]) if b.nodes > a.nodes and b.seconds < a.seconds]


def cost_caption(costs: list[VerifyCost]) -> str:
    """What the cost chart measured, and how far to trust it on a shared CPU."""
    big = next((c for c in costs if c.nodes == 64), costs[-1])
    base = costs[0]
    how = timing_note(base.timing)
    text = (f"{plural(big.nodes, 'node')} cost {big.seconds / base.seconds:.2f}× a 1-row decode pass here "
            f"({fmt_duration(base.seconds)} → {fmt_duration(big.seconds)}). Where a decode pass is memory-bound (a "
            "GPU reading the weights once for every row), extra rows ride along almost free; where the matmuls are "
            "compute-bound after a few rows (a CPU core), every node costs time and the tree must earn it back in "
            f"τ. Each point is the median of {plural(base.runs, 'pass', 'passes')}, the sizes timed in turn so that "
            "a burst of load on this shared machine falls on all of them; the bars span the fastest to the slowest "
            "pass. " + (f"{how} " if how else "") + "Other work on the machine can still move a point between "
            "presses")
    flips = cost_inversions(costs)
    if flips:
        a, b = flips[0]
        text += (f": here {plural(b.nodes, 'node')} measured faster than {plural(a.nodes, 'node')} "
                 f"({fmt_duration(b.seconds)} against {fmt_duration(a.seconds)}), which is such noise: a pass over "
                 "more rows does no less work")
    return text + ". Measure again to compare."


# ---- how the heads were trained ------------------------------------------------------------------

def training_log(name: str, directory: Path = HEADS_DIR) -> dict[str, Any] | None:
    try:
        return json.loads((directory / f"{name}.log.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def training_runs(log: dict[str, Any]) -> int:
    """How many training runs made a head: a resumed run keeps the one it started from in its config."""
    runs, cfg = 1, log.get("config", {})
    while "resumed_from" in cfg:
        runs += 1
        cfg = cfg["resumed_from"].get("config", {})
    return runs


def training_summary(name: str, directory: Path = HEADS_DIR) -> str:
    log = training_log(name, directory)
    if not log:
        return f"No training log for {name} (train it with `python -m training.train_{name}`)."
    d, s = log["data"], log["summary"]
    acc = {k: v for k, v in s.items() if k.startswith("held_out_top1") or k == "held_out_agree_top1"}
    acc_text = ", ".join(f"{_accuracy_label(k)} {v:.0%}" for k, v in acc.items())
    steps = s.get("steps_total", s["steps"])
    tokens = s.get("tokens_seen_total", s["tokens_seen"])
    minutes = s.get("train_minutes_total", s["train_minutes"])
    runs = training_runs(log)
    resumed = f" (in {runs} runs, each resumed from the one before)" if runs > 1 else ""
    depths = [s[k] for k in sorted((k for k in s if k.startswith("held_out_draft_top1_step")),
                                   key=lambda k: int(k.rsplit("step", 1)[1]))]
    unrolled = ""
    if log.get("config", {}).get("ttt_steps", 1) > 1 and depths:
        unrolled = (f" The last run trained on its own predictions, unrolled {len(depths)} levels deep as drafting "
                    f"uses it (EAGLE-3's training-time test); held-out top-1 at tree depth 1 to {len(depths)}: "
                    + " / ".join(f"{v:.0%}" for v in depths) + ".")
    held = d.get("held_out_conversations")
    return (f"Self-distilled on **{d['conversations']:,} conversations** the model answered itself "
            f"({d['prompt_tokens']:,} prompt + {d['generated_tokens']:,} generated tokens, {d['decoding']}): "
            f"**{steps:,} optimiser steps**, {tokens:,} tokens seen, {minutes} min on this CPU{resumed}. "
            f"Agreement with the target on held-out conversations{f' ({held:,})' if held else ''}: {acc_text}."
            + unrolled)


def _accuracy_label(key: str) -> str:
    """'held_out_top1_head0' -> 'head 1 top-1', 'held_out_top3' -> 'top-3', 'held_out_agree_top1' ->
    'top-1 (agree)': the log's keys, in words a slide can carry."""
    m = re.fullmatch(r"held_out_(agree_)?top(\d+)(?:_head(\d+))?", key)
    if not m:
        return key.removeprefix("held_out_")
    agree, k, head = m.groups()
    text = f"top-{k}"
    if head is not None:
        text = f"head {int(head) + 1} {text}"
    return text + (" (agree)" if agree else "")


# ---- Medusa vs EAGLE vs plain on one scenario -----------------------------------------------------

TREE_LABELS = {"plain": "plain decoding", "medusa": "Medusa heads", "eagle": "EAGLE layer"}


def compare_tree_drafters(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 400,
                          on_progress: Callable[[int], None] | None = None) -> dict[str, DrafterRun]:
    variants = {"plain": scenario.with_engine(spec_drafter="none"),
                "medusa": scenario.with_engine(spec_drafter="medusa", spec_gamma=1),
                "eagle": scenario.with_engine(spec_drafter="eagle", spec_gamma=1)}
    return run_variants(variants, weights, server, 1, max_steps, on_progress)
