"""The radix prefix cache read from StepRecords: the tree as a networkx graph with a tidy top-down
layout, per-step hit and savings series, and a cache-on vs cache-off run of the same requests.

Everything but `compare_prefix_cache` works on records alone (live, scrubbed or loaded from JSON).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import networkx as nx

from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.side_by_side import step_alternately
from app.analysis.trace_metrics import cumulative_clock
from app.scenarios import Scenario
from app.session import EngineSession, SessionError


def radix_snapshot(record: StepRecord | None) -> dict[str, Any] | None:
    """The tree snapshot of a step (None when the engine ran without the prefix cache)."""
    return None if record is None else record.extra("radix")


def lock_owners(record: StepRecord) -> dict[int, list[str]]:
    """node id -> labels of the sequences whose lock ends at that node (their deepest cached node)."""
    snap = radix_snapshot(record) or {}
    label = {s.seq_id: s.request_id for s in record.batch}
    label.update({t.seq_id: t.request_id for t in record.block_tables})
    out: dict[int, list[str]] = {}
    for lock in snap.get("locks", ()):
        out.setdefault(lock["node"], []).append(label.get(lock["seq_id"], f"seq {lock['seq_id']}"))
    return out


def tree_graph(snapshot: dict[str, Any], with_evicted: bool = True) -> nx.DiGraph:
    """The radix tree as a DiGraph (edges parent -> child, node attributes = the snapshot's fields).

    Nodes evicted in this step are added back as `ghost=True` leaves under their old parent (or
    under the root when the parent went too), so a chart can show what just left."""
    g = nx.DiGraph()
    for n in snapshot["nodes"]:
        g.add_node(n["id"], **n, ghost=False)
        if n["parent"] is not None:
            g.add_edge(n["parent"], n["id"])
    if with_evicted:
        root = snapshot["nodes"][0]["id"] if snapshot["nodes"] else 0
        for e in snapshot.get("evicted_this_step", ()):
            gid = f"evicted-{e['id']}"
            g.add_node(gid, **{**e, "id": gid, "text": "", "lock_ref": 0, "evictable": False, "ghost": True})
        for e in snapshot.get("evicted_this_step", ()):
            parent = e["parent"] if e["parent"] in g else f"evicted-{e['parent']}"
            g.add_edge(parent if parent in g else root, f"evicted-{e['id']}")
    return g


def tidy_layout(g: nx.DiGraph, root: Any = 0) -> dict[Any, tuple[float, int]]:
    """Top-down tree layout: leaves on consecutive x slots in depth-first order, each parent centred
    over its first and last child, y = -depth. Subtrees never overlap (a simple Reingold-Tilford)."""
    pos: dict[Any, tuple[float, int]] = {}
    next_x = [0.0]

    def place(node: Any, depth: int) -> float:
        kids = sorted(g.successors(node), key=lambda c: (isinstance(c, str), str(c) if isinstance(c, str) else c))
        if not kids:
            x = next_x[0]
            next_x[0] += 1.0
        else:
            xs = [place(c, depth + 1) for c in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[node] = (x, -depth)
        return x

    if root in g:
        place(root, 0)
    return pos


@dataclass(frozen=True, slots=True)
class CachePoint:
    step: int
    hits: int
    misses: int
    tokens_saved: int  # cumulative prompt tokens served from the tree
    tokens_requested: int  # cumulative prompt tokens of admitted requests
    prefill_computed: int  # cumulative prefill tokens the forward passes computed
    saved_this_step: int
    evictions: int
    tree_blocks: int
    evictable_blocks: int

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.tokens_saved / self.tokens_requested if self.tokens_requested else 0.0


def cache_series(records: list[StepRecord]) -> list[CachePoint]:
    out: list[CachePoint] = []
    prev_saved = 0
    for r in records:
        snap = radix_snapshot(r)
        if snap is None:
            continue
        c = snap["counters"]
        counters = r.extra("counters") or {}
        out.append(CachePoint(r.step, c["hits"], c["misses"], c["tokens_saved"], c["tokens_requested"],
                              counters.get("prefill_tokens_computed", 0), c["tokens_saved"] - prev_saved,
                              c["evictions"], snap["num_blocks"], snap["num_evictable_blocks"]))
        prev_saved = c["tokens_saved"]
    return out


def admissions(records: list[StepRecord]) -> list[dict[str, Any]]:
    """One row per request at its first prefill chunk: prompt length and how much the tree served."""
    seen: set[str] = set()
    rows = []
    prompt_len = {q.request_id: q.prompt_len for r in records[-1:] for q in r.requests}
    for r in records:
        for s in r.batch:
            if s.phase == "prefill" and s.request_id not in seen:
                seen.add(s.request_id)
                rows.append({"request": s.request_id, "admitted at step": r.step,
                             "prompt tokens": prompt_len.get(s.request_id, s.context_len),
                             "from cache": s.num_cached_tokens,
                             "computed": prompt_len.get(s.request_id, s.context_len) - s.num_cached_tokens})
    return rows


# ---- cache on vs off, measured ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CacheRun:
    enabled: bool
    records: tuple[StepRecord, ...]
    errors: tuple[SessionError, ...]

    @property
    def label(self) -> str:
        return "cache on" if self.enabled else "cache off"

    @property
    def prefill_tokens(self) -> int:
        return sum(r.num_prefill_tokens for r in self.records)

    @property
    def prefill_seconds(self) -> float:
        """Forward time of the steps that ran prefill work, each split by its share of prefill tokens
        (a step mixing a prefill chunk and decodes is counted in proportion)."""
        return sum(r.forward_seconds * r.num_prefill_tokens / r.num_batched_tokens
                   for r in self.records if r.num_batched_tokens)

    @property
    def engine_seconds(self) -> float:
        return cumulative_clock(list(self.records))[-1] if self.records else 0.0

    def ttft(self) -> dict[str, float]:
        last = self.records[-1].requests if self.records else ()
        return {q.request_id: q.ttft_seconds for q in last if q.ttft_seconds >= 0}


def compare_prefix_cache(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 400,
                         on_progress: Callable[[int], None] | None = None) -> dict[str, CacheRun]:
    """Run the scenario with the prefix cache on and off; the engines step alternately so background
    load on a shared CPU falls on both alike."""
    sessions = {on: EngineSession.create(scenario.with_engine(enable_prefix_cache=on), weights, server)
                for on in (True, False)}
    step_alternately(sessions, max_steps, on_progress)
    runs = [CacheRun(on, tuple(s.records), tuple(s.errors)) for on, s in sessions.items()]
    return {r.label: r for r in runs}
