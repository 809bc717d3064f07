"""Speculative decoding read from StepRecords (the "spec" extra, documented in engine/speculative):
one round's verdicts and rolled-back KV slots, acceptance and tokens per target pass over steps, the
closed form of Leviathan et al., the CPU benchmark in bench/results/spec_cpu.json, and a run of one
scenario with each drafter and with plain decoding.

Acceptance is measured as the benchmark measures it: alpha = accepted / (accepted + rejections),
the per-draft acceptance probability under the i.i.d. model (a round's drafts are checked until the
first rejection, so later drafts are never "tried").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.speculative.heads import head_available
from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.side_by_side import step_alternately
from app.formatting import fmt_two_significant, plural
from app.scenarios import Scenario
from app.session import EngineSession, SessionError

BENCH_PATH = Path(__file__).resolve().parents[2] / "bench" / "results" / "spec_cpu.json"
ALL_DRAFTERS_BENCH = BENCH_PATH.with_name("spec_cpu_all_drafters.json")
# The commands that write those two files (bench/spec.py's docstring gives the same; a test holds them equal).
BENCH_COMMAND = ("OMP_NUM_THREADS=1 python bench/spec.py --repeats 2 --drafters ngram early_exit draft_model "
                 "--workloads copy chat --prompts 2")
ALL_DRAFTERS_BENCH_COMMAND = ("OMP_NUM_THREADS=1 python bench/spec.py --gammas 2 4 --tree-nodes 8 24 64 --tree-depth 6 "
                              f"--tree-topk 8 --max-tokens 48 --out bench/results/{ALL_DRAFTERS_BENCH.name}")
DRAFTER_LABELS = {"plain": "plain decoding", "none": "plain decoding", "ngram": "prompt lookup (n-gram)",
                  "early_exit": "early exit", "draft_model": "distilled draft model", "medusa": "Medusa heads",
                  "eagle": "EAGLE layer"}


# ---- the closed form -----------------------------------------------------------------------------

def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] = (1 - alpha^(gamma+1)) / (1 - alpha): accepted drafts + the final token."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): tokens per pass over the cost of a round,
    in units of one target pass (gamma drafts at c each + the verification pass)."""
    return expected_tokens_per_pass(alpha, gamma) / (gamma * c + 1.0)


# ---- one round -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RoundView:
    """A ROUND dict of the "spec" extra with what the page draws derived from it."""
    raw: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    @property
    def request_id(self) -> str:
        return self.raw["request_id"]

    @property
    def g(self) -> int:
        return int(self.raw["num_drafted"])

    @property
    def sampled(self) -> bool:
        return self.raw["mode"] == "sampled"

    @property
    def ratios(self) -> list[float]:
        """min(1, p/q) per draft: the probability the sampled rule keeps it (greedy rounds draw nothing:
        there p is the temperature-1 softmax, recorded for display only, and this is not a probability)."""
        return [min(1.0, p / q) if q > 0 else 1.0 for p, q in zip(self.raw["p"], self.raw["q"])]

    @property
    def argmax_match(self) -> list[bool | None]:
        """Per draft: was it the target's argmax at its row? None for drafts after the rejection, whose rows
        were conditioned on a rejected token. Under greedy this is the whole rule: accepted iff True."""
        return [None if v == "unverified" else int(d) == int(a) for d, a, v in
                zip(self.raw["draft_token_ids"], self.raw["target_argmax_ids"], self.raw["verdicts"])]

    @property
    def written_slots(self) -> int:
        """KV slots the verification pass wrote: the last emitted token (its KV was not cached yet) + g drafts."""
        return 1 + self.g

    @property
    def kept_slots(self) -> int:
        return 1 + int(self.raw["num_accepted"])

    @property
    def rolled_back(self) -> int:
        """Slots of rejected and unverified drafts, truncated after the pass."""
        return self.g - int(self.raw["num_accepted"])

    @property
    def emitted(self) -> int:
        return len(self.raw["emitted_token_ids"])

    @property
    def rejected_index(self) -> int | None:
        return next((i for i, v in enumerate(self.raw["verdicts"]) if v == "rejected"), None)


def step_rounds(record: StepRecord) -> list[RoundView]:
    """Chain rounds only (tree rounds of Medusa / EAGLE belong to app.analysis.tree_spec)."""
    spec = record.extra("spec")
    return [RoundView(dict(r)) for r in spec["rounds"] if r.get("kind", "chain") != "tree"] if spec else []


def step_skipped(record: StepRecord) -> list[dict[str, Any]]:
    spec = record.extra("spec")
    return [dict(s) for s in spec["skipped"]] if spec else []


def round_sentence(r: RoundView) -> str:
    """One line in words: what the drafter proposed and what the target kept."""
    n, g = int(r["num_accepted"]), r.g
    final = r["final_text"]
    if r["final_kind"] == "bonus":
        tail = f"all accepted, plus the bonus token `{final}` from the last row"
    else:
        i = r.rejected_index
        tail = (f"draft {i + 1} `{r['draft_texts'][i]}` rejected and replaced by `{final}`"
                + (" (resampled from max(0, p − q))" if r["mode"] == "sampled" else " (the target's argmax)")
                + (f"; {g - i - 1} later draft(s) never checked" if i is not None and g - i - 1 else ""))
    return (f"**{r.request_id}** ({r['mode']}): drafted {g}, accepted {n}, {tail} → **{r.emitted} token"
            f"{'s' if r.emitted != 1 else ''} from one target pass**; {r.rolled_back} of {r.written_slots} "
            f"KV slots written in the pass rolled back.")


def rule_caption(r: RoundView) -> str:
    """What the round chart's bottom panel shows, in words: it differs between greedy and sampled rounds."""
    if r.sampled:
        return ("Bottom panel (sampled): the bar is min(1, p/q), the chance the rule keeps that draft; the black "
                "tick is the draw u ~ U[0, 1) that decided it (kept iff u < p/q). Drafts after a rejection are "
                "never checked.")
    return ("Bottom panel (greedy): nothing is drawn at random. A draft is kept iff it is the target's argmax at "
            "its row (✓), and the first one that is not (✗) is replaced by that argmax. The bar is the target's "
            "probability of the draft (softmax at T = 1), for scale only: a kept draft at 0.4 was kept because no "
            "other token scored higher, not with probability 0.4.")


# ---- over steps ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SpecPoint:
    step: int
    rounds: int  # cumulative, from the "spec" totals
    drafted: int
    accepted: int
    rejected_rounds: int
    emitted: int
    draft_seconds: float  # this step's
    verify_seconds: float
    target_passes: int  # cumulative decode passes per request (speculative rounds + plain decodes)
    decode_tokens: int  # cumulative tokens emitted by those passes
    plain_seconds: float = 0.0  # this step's time when it decoded without a draft (the drafter found none)

    @property
    def alpha(self) -> float | None:
        n = self.accepted + self.rejected_rounds
        return self.accepted / n if n else None

    @property
    def accepted_fraction(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.decode_tokens / self.target_passes if self.target_passes else None


def spec_series(records: list[StepRecord]) -> list[SpecPoint]:
    """Cumulative acceptance and tokens per target pass after every step. A target pass is one decode
    entry of one request (a speculative round or a plain decode when no draft was found); its tokens
    are what that request emitted in that step."""
    out: list[SpecPoint] = []
    passes = tokens = 0
    for r in records:
        spec = r.extra("spec")
        decoding = {s.request_id for s in r.batch if s.phase == "decode"}
        passes += len(decoding)
        tokens += sum(1 for e in r.emitted if e.request_id in decoding)
        t = spec["totals"] if spec else {}
        out.append(SpecPoint(r.step, t.get("rounds", 0), t.get("drafted_tokens", 0), t.get("accepted_tokens", 0),
                             t.get("rejected_rounds", 0), t.get("emitted_tokens", 0),
                             spec["draft_seconds"] if spec else 0.0, spec["verify_seconds"] if spec else 0.0,
                             passes, tokens, r.wall_seconds if decoding and not (spec and spec["rounds"]) else 0.0))
    return out


def measured_c(records: list[StepRecord]) -> float | None:
    """c = cost of one drafted token / cost of one target pass, from this run's own timings:
    (sum draft_seconds / drafted tokens) / (sum verify_seconds / steps that verified). None before a round."""
    draft = verify = 0.0
    drafted = steps = 0
    for r in records:
        spec = r.extra("spec")
        if not spec or not spec["rounds"]:
            continue
        draft += spec["draft_seconds"]
        verify += spec["verify_seconds"]
        drafted += sum(int(x["num_drafted"]) for x in spec["rounds"])
        steps += 1
    if not drafted or not steps or verify <= 0:
        return None
    return (draft / drafted) / (verify / steps)


def current_gamma(records: list[StepRecord], default: int) -> int:
    """The gamma the latest round asked for (capped by max_tokens at the end), else the engine default."""
    for r in reversed(records):
        rounds = step_rounds(r)
        if rounds:
            return max(int(x["gamma"]) for x in rounds)
    return default


# ---- the CPU benchmark ---------------------------------------------------------------------------

def load_bench(path: Path = BENCH_PATH) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def cost_text(c: float) -> str:
    """A drafting cost c in target passes, as `fmt_two_significant` writes it: prompt lookup's 4.2e-05 beside
    early exit's 0.52 (as a number column "0.000042" filled its cell and "0.00014" sat next to "4.2e-05")."""
    return fmt_two_significant(c)


def chain_rows(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's rows of chain drafters: not plain decoding, and not the trees, which have no alpha or
    closed form (see page 08)."""
    return [r for r in bench.get("rows", []) if r["drafter"] not in ("plain", "medusa", "eagle")]


def bench_rows(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of the benchmark, speculative configurations only, with friendly names."""
    rows = []
    for r in chain_rows(bench):
        rows.append({"workload": r["workload"], "drafter": DRAFTER_LABELS.get(r["drafter"], r["drafter"]),
                     "γ": r["gamma"], "α": r["alpha"], "tokens/pass measured": r["tokens_per_pass"],
                     "tokens/pass predicted": r["predicted_tokens_per_pass"], "c": cost_text(r["c"]),
                     "speedup measured": r["speedup"], "speedup predicted": r["predicted_speedup"],
                     "predicted with measured v": r.get("predicted_speedup_v_adjusted"),
                     "same tokens as plain": r["identical_to_plain"]})
    return rows


def bench_c(bench: dict[str, Any] | None, drafter: str) -> float | None:
    """The benchmark's mean c for a drafter (over workloads and gammas)."""
    if not bench:
        return None
    cs = [r["c"] for r in bench.get("rows", []) if r["drafter"] == drafter and "c" in r]
    return sum(cs) / len(cs) if cs else None


def bench_drafter_label(bench: dict[str, Any] | None, drafter: str) -> str:
    """The drafter as the benchmark ran it: early exit with its own number of layers."""
    label = DRAFTER_LABELS.get(drafter, "this drafter")
    layers = (bench or {}).get("draft_layers")
    return f"{label} ({layers} of 30 layers)" if drafter == "early_exit" and layers is not None else label


def bench_drafter_mismatch(bench: dict[str, Any] | None, drafter: str, draft_layers: int) -> str | None:
    """Why the benchmark's c is not this run's drafter's, or None where it is the same drafter. Only early exit
    has a knob that changes its cost: c grows with the layers it runs (16 in the benchmark, 1 to 29 here)."""
    layers = (bench or {}).get("draft_layers")
    if drafter != "early_exit" or layers is None or int(layers) == draft_layers:
        return None
    return f"the benchmark's early exit drafted with {layers} layers, this run's with {draft_layers}"


LIVE_C = "measured in this run"
BENCH_C = "from the benchmark"


@dataclass(frozen=True, slots=True)
class CostOption:
    """A value of c the closed form can use, and why it is (or only stands in for) this run's drafter's."""

    source: str  # LIVE_C or BENCH_C: the choice's label
    value: float
    why: str


def cost_options(c_live: float | None, bench: dict[str, Any] | None, drafter: str,
                 draft_layers: int) -> tuple[CostOption, ...]:
    """The c values worth offering, the preferred first: this run's own once it has drafted; the benchmark's
    mean where it ran the same drafter, or, before this run has a c of its own, as a labelled stand-in (an early
    exit of 1 layer was predicted with the 16-layer benchmark's c = 0.64, unlabelled)."""
    out = []
    if c_live is not None:
        out.append(CostOption(LIVE_C, c_live, "this run's own drafting and verification times"))
    c_bench = bench_c(bench, drafter)
    if c_bench is None:
        return tuple(out)
    mismatch = bench_drafter_mismatch(bench, drafter, draft_layers)
    if mismatch is None:
        out.append(CostOption(BENCH_C, c_bench, f"the benchmark's mean for {bench_drafter_label(bench, drafter)}, "
                                                "the same drafter, over its workloads and γ"))
    elif c_live is None:
        out.append(CostOption(BENCH_C, c_bench, f"a stand-in until this run drafts: {mismatch}, so its c differs; "
                                                "step on to measure this run's"))
    return tuple(out)


def closed_form_caption(drafter: str) -> str:
    """Why the measured points sit off the curves, for this drafter: only prompt lookup finds no draft at times."""
    if drafter == "ngram":
        why = ("when prompt lookup found no match (those steps decode plainly, 1 token per pass) or when α is not "
               "the same for every draft")
    else:
        why = ("when α is not the same for every draft (the closed form assumes each is kept independently with "
               "the same α) or when a request's last rounds draft fewer than γ (capped by its max_tokens)")
    return (f"The measured tokens per pass (◆) sits off the curve {why}; the measured speedup (◇, from the drafter "
            "comparison below) usually sits below the predicted one because the verification pass is not free, "
            "and moves with this shared machine's load from run to run.")


def bench_setup(bench: dict[str, Any]) -> str:
    """What a benchmark file ran, read from the file: prompts per workload, tokens per prompt, repeats,
    threads (the two benchmarks behind pages 07 and 08 differ in all four)."""
    workloads = bench.get("workloads") or {}
    sizes = sorted(set(workloads.values()))
    prompts = "?" if not sizes else f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    repeats = int(bench.get("repeats", 1))
    runs = f"the fastest of {repeats} runs" if repeats > 1 else "one run"
    threads = bench.get("threads")
    names = list(workloads) or ["?"]
    names_text = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return (f"{prompts} prompts in each of {names_text}, {bench.get('max_tokens', '?')} new tokens per prompt, "
            f"{runs} per configuration"
            + (f", {plural(int(threads), 'thread')}" if threads is not None else ""))


def largest_gap(here: dict[str, Any], there: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (workload, drafter, γ) both benchmarks ran whose τ differs most between them, as (here, there) rows."""
    theirs = {(r["workload"], r["drafter"], r["gamma"]): r for r in there.get("rows", []) if r["drafter"] != "plain"}
    pairs = [(r, theirs[k]) for r in here.get("rows", []) if (k := (r["workload"], r["drafter"], r["gamma"])) in theirs]
    return max(pairs, key=lambda p: abs(p[0]["tokens_per_pass"] - p[1]["tokens_per_pass"]), default=None)


def other_bench_note(here: dict[str, Any], there: dict[str, Any] | None, there_table: str) -> str:
    """A sentence for under one page's benchmark table: the other page's table ran another set of prompts and
    tokens, so the same drafter and γ read differently there (copy, prompt lookup, γ = 4: τ 2.58 on page 07,
    1.76 on page 08)."""
    if not there:
        return ""
    text = (f" {there_table} ran a different set: {bench_setup(there)}. So the same drafter, workload and γ can "
            "read differently there")
    gap = largest_gap(here, there)
    if gap:
        a, b = gap
        size = f"{a['gamma']} nodes" if a["drafter"] in ("medusa", "eagle") else f"γ = {a['gamma']}"
        text += (f": {DRAFTER_LABELS.get(a['drafter'], a['drafter'])}, {size} on “{a['workload']}” reads τ "
                 f"{a['tokens_per_pass']:.2f} and {a['speedup']:.2f}× here, τ {b['tokens_per_pass']:.2f} and "
                 f"{b['speedup']:.2f}× there")
    return text + "."


# ---- each drafter on the same scenario, measured -------------------------------------------------

@dataclass(frozen=True, slots=True)
class DrafterRun:
    drafter: str  # "plain" | "ngram" | "early_exit" | "draft_model" | "medusa" | "eagle"
    gamma: int
    records: tuple[StepRecord, ...]
    errors: tuple[SessionError, ...]
    texts: tuple[tuple[str, str], ...]  # (request label, output text)

    @property
    def label(self) -> str:
        tree = self.drafter in ("medusa", "eagle")
        return DRAFTER_LABELS[self.drafter] + (f", γ = {self.gamma}" if self.drafter != "plain" and not tree else "")

    @property
    def last(self) -> SpecPoint | None:
        series = spec_series(list(self.records))
        return series[-1] if series else None

    @property
    def alpha(self) -> float | None:
        return self.last.alpha if self.last else None

    @property
    def tokens_per_pass(self) -> float:
        tp = self.last.tokens_per_pass if self.last else None
        return tp if tp is not None else 1.0

    @property
    def decode_seconds_per_token(self) -> float | None:
        """Wall time of decode-only steps over the tokens they emitted (prefill steps excluded: they are the
        same for every drafter)."""
        secs = toks = 0
        for r in self.records:
            if r.num_prefill_tokens == 0 and r.emitted:
                secs += r.wall_seconds
                toks += len(r.emitted)
        return secs / toks if toks else None


def compare_drafters(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 400,
                     on_progress: Callable[[int], None] | None = None) -> dict[str, DrafterRun]:
    """The scenario with plain decoding, prompt lookup and early exit (its gamma and draft layers),
    the engines stepping alternately so background load falls on all of them alike."""
    cfg = scenario.engine_config()
    gamma = cfg.spec_gamma or 4
    variants = {"plain": scenario.with_engine(spec_drafter="none"),
                "ngram": scenario.with_engine(spec_drafter="ngram", spec_gamma=gamma),
                "early_exit": scenario.with_engine(spec_drafter="early_exit", spec_gamma=gamma)}
    if head_available("draft_model"):
        variants["draft_model"] = scenario.with_engine(spec_drafter="draft_model", spec_gamma=gamma)
    return run_variants(variants, weights, server, gamma, max_steps, on_progress)


def run_variants(variants: dict[str, Scenario], weights: LoadedWeights, server: dict[str, str], gamma: int,
                 max_steps: int = 400, on_progress: Callable[[int], None] | None = None) -> dict[str, DrafterRun]:
    """Run each variant (key = drafter name, "plain" for none) in its own engine, stepping alternately
    so background load falls on all of them alike."""
    sessions = {k: EngineSession.create(sc, weights, server) for k, sc in variants.items()}
    step_alternately(sessions, max_steps, on_progress)
    out = {}
    for k, s in sessions.items():
        last = s.records[-1] if s.records else None
        texts = tuple((q.request_id, q.text) for q in last.requests) if last else ()
        out[k] = DrafterRun(k, 0 if k == "plain" else gamma, tuple(s.records), tuple(s.errors), texts)
    return out


def speedup_vs_plain(runs: dict[str, DrafterRun], key: str) -> float | None:
    base, mine = runs["plain"].decode_seconds_per_token, runs[key].decode_seconds_per_token
    return base / mine if base and mine else None
