"""Plain data for the latency-SLO page: configuration presets, the settings table turned into
`LoadConfig`s (one sentence per bad row), request rates parsed from text, and the tables the page shows."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.serving_load import (SLO, WORKLOADS, LoadConfig, LoadRun, RequestTiming, SweepResult, passes_after_miss,
                                 reaches_goal)
from engine.serving_load.sweep import MAX_CONFIGS, MAX_RATES

# Rows of the configuration table. The presets each turn one knob and hold the others.
PRESETS: dict[str, list[dict]] = {
    "Batch cap: 2 vs 8": [
        dict(name="batch cap 2", batch_cap=2, token_budget=256, chunked=True, output_cap=0),
        dict(name="batch cap 8", batch_cap=8, token_budget=256, chunked=True, output_cap=0)],
    "Batch cap: 2 vs 8 vs 16": [
        dict(name=f"batch cap {b}", batch_cap=b, token_budget=256, chunked=True, output_cap=0) for b in (2, 8, 16)],
    "Token budget (chunked prefill)": [
        dict(name="budget 64", batch_cap=8, token_budget=64, chunked=True, output_cap=0),
        dict(name="budget 256", batch_cap=8, token_budget=256, chunked=True, output_cap=0),
        dict(name="no chunking", batch_cap=8, token_budget=1024, chunked=False, output_cap=0)],
    "Output cap": [
        dict(name="no cap", batch_cap=8, token_budget=256, chunked=True, output_cap=0),
        dict(name="cap 24 tokens", batch_cap=8, token_budget=256, chunked=True, output_cap=24)],
}
DEFAULT_PRESET = "Batch cap: 2 vs 8"
COLUMNS = ("name", "batch_cap", "token_budget", "chunked", "output_cap")

# Defaults per device: a CPU step of this model costs ~50 ms, an H200 one ~1-2 ms. On the H200 every
# configuration keeps up with chat requests to 200 req/s (bench/NOTES_slo_goodput.md); the mixed workload's long
# prompts are what separate them there.
CPU_RATES = (1.0, 2.0, 4.0)
GPU_RATES = (25.0, 50.0, 100.0, 200.0)
# 100 ms per token: an idle 2-core CPU decodes at 50-75 ms per step at these batch sizes, and a busy one
# slower; TTFT, which queueing drives, is then what separates the default configurations.
CPU_SLO = SLO(ttft_s=1.0, tpot_s=0.1, goal=0.9)
GPU_SLO = SLO(ttft_s=0.1, tpot_s=0.005, goal=0.9)


@dataclass(frozen=True, slots=True)
class SweepSettings:
    workload: str  # a key of WORKLOADS
    num_requests: int
    seed: int
    rates: tuple[float, ...]
    configs: tuple[LoadConfig, ...]


def default_workload(device: str) -> str:
    return next(iter(WORKLOADS)) if device == "cpu" else "Mixed (chat and RAG interleaved)"


def default_rates(device: str) -> tuple[float, ...]:
    return CPU_RATES if device == "cpu" else GPU_RATES


def default_slo(device: str) -> SLO:
    return CPU_SLO if device == "cpu" else GPU_SLO


def preset_rows(name: str) -> list[dict]:
    return [dict(row) for row in PRESETS[name]]


def format_rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:g}" for r in rates)


def parse_rates(text: str) -> tuple[tuple[float, ...], str | None]:
    """"0.5, 1, 2" -> (0.5, 1.0, 2.0); or the reason the text is not a list of rates."""
    parts = [p for p in re.split(r"[,\s;]+", text.strip()) if p]
    if not parts:
        return (), "Give at least one request rate, e.g. 0.5, 1, 2, 4."
    rates: list[float] = []
    for p in parts:
        try:
            r = float(p)
        except ValueError:
            return (), f"Request rates must be numbers (requests per second); {p!r} is not."
        if not (math.isfinite(r) and 0 < r <= 1000):
            return (), f"Request rates must be above 0 and at most 1000 requests per second; got {p}."
        rates.append(r)
    rates = sorted(set(rates))
    if len(rates) > MAX_RATES:
        return (), f"Give at most {MAX_RATES} different rates; got {len(rates)}."
    return tuple(rates), None


def _cell_empty(value: object) -> bool:
    return value is None or value == "" or (isinstance(value, float) and np.isnan(value))


def _whole(value: object, what: str) -> int:
    if _cell_empty(value):
        raise ValueError(f"the {what} is empty")
    f = float(value)  # type: ignore[arg-type]
    if not math.isfinite(f) or f != int(f):
        raise ValueError(f"the {what} must be a whole number; got {value}")
    return int(f)


def rows_to_configs(rows: Sequence[Mapping]) -> tuple[list[LoadConfig], list[str]]:
    """The table's rows as configurations, and one sentence per row that cannot run ("Row 2: ...")."""
    configs: list[LoadConfig] = []
    errors: list[str] = []
    for i, row in enumerate(rows, start=1):
        if all(_cell_empty(row.get(c)) for c in COLUMNS if c != "chunked"):
            continue  # an empty row the editor added
        name = "" if _cell_empty(row.get("name")) else str(row.get("name")).strip()
        try:
            if not name:
                raise ValueError("give the configuration a name")
            configs.append(LoadConfig(name, _whole(row.get("batch_cap"), "batch cap"),
                                      _whole(row.get("token_budget"), "token budget"),
                                      bool(row.get("chunked")) if not _cell_empty(row.get("chunked")) else True,
                                      0 if _cell_empty(row.get("output_cap")) else _whole(row.get("output_cap"), "output cap")))
        except ValueError as e:
            msg = str(e).removeprefix(f"configuration {name!r}: ")
            errors.append(f"Row {i}: {msg}.")
    if not errors:
        names = [c.label for c in configs]
        for i, n in enumerate(names, start=1):
            if n in names[: i - 1]:
                errors.append(f"Row {i} has the same name as an earlier row ({n!r}); names label the charts.")
        if not configs:
            errors.append("Add at least one configuration to the table.")
        if len(configs) > MAX_CONFIGS:
            errors.append(f"Compare at most {MAX_CONFIGS} configurations at once; the table has {len(configs)}.")
    return configs, errors


def workload_line(name: str, num_requests: int) -> str:
    w = WORKLOADS[name]
    return (f"{num_requests} requests, prompts {w.prompt_tokens[0]}-{w.prompt_tokens[1]} tokens, answers "
            f"{w.output_tokens[0]}-{w.output_tokens[1]} tokens, Poisson arrivals")


def runs_frame(result: SweepResult, slo: SLO) -> pd.DataFrame:
    """One row per (configuration, rate): attainment, latency percentiles at the goal, throughput."""
    q = slo.goal * 100
    rows = []
    for run in result.runs:
        rows.append({
            "configuration": run.config.label,
            "rate (req/s)": run.rate,
            "SLO met": run.attainment(slo),
            "TTFT p50 (s)": run.ttft_percentile(50),
            f"TTFT p{q:g} (s)": run.ttft_percentile(q),
            "TPOT p50 (ms)": 1000 * run.tpot_percentile(50),
            f"TPOT p{q:g} (ms)": 1000 * run.tpot_percentile(q),
            "output tok/s": run.throughput_tok_s,
            "good req/s": run.goodput_req_s(slo),
            "busy": run.busy_share,
            "steps": len(run.steps),
        })
    return pd.DataFrame(rows)


def _verdict(ttft_ok: bool, tpot_ok: bool) -> str:
    """Short enough for a narrow column: "met", or which target was missed."""
    if ttft_ok and tpot_ok:
        return "met"
    return "✗ both" if not (ttft_ok or tpot_ok) else "✗ TTFT" if not ttft_ok else "✗ TPOT"


def beside_target(value: float, target: float, within: bool, decimals: int) -> str:
    """`value` to `decimals` places, or as many more (up to three) as it takes for the written number to sit
    on the side of `target` the verdict `within` (value at most target) puts it: a 1.0004 s TTFT that
    missed a 1 s target read "1.000 ✗", a 100.3 ms TPOT "100 ✗"."""
    for d in range(decimals, decimals + 4):
        text = f"{value:.{d}f}"
        if (float(text) <= target) == within:
            return text
    return text


def latency_texts(t: RequestTiming, slo: SLO) -> tuple[str, str]:
    """A request's TTFT (s, three decimals) and TPOT (ms, whole), each written beside its target, for the
    table and the charts' hovers alike."""
    return (beside_target(t.ttft_s, slo.ttft_s, t.meets_ttft(slo), 3),
            beside_target(1000 * t.tpot_s, 1000 * slo.tpot_s, t.meets_tpot(slo), 0))


def requests_frame(run: LoadRun, slo: SLO) -> pd.DataFrame:
    """One row per request; its TTFT and TPOT as text (`latency_texts`)."""
    rows = []
    for t in run.timings:
        ttft, tpot = latency_texts(t, slo)
        rows.append({"request": t.request_id, "arrives (s)": t.arrival_s, "prompt": t.prompt_len,
                     "answer": t.output_tokens, "waited (s)": t.queue_s, "TTFT (s)": ttft, "TPOT (ms)": tpot,
                     "meets SLO": _verdict(t.meets_ttft(slo), t.meets_tpot(slo))})
    return pd.DataFrame(rows)


def goodput_text(rate: float | None, rates: Sequence[float]) -> str:
    if rate is None:
        return f"below {min(rates):g} req/s"
    return f"{rate:g} req/s" + (" (or more)" if rate == max(rates) else "")


# Throughput closer than this to the goodput leader's is one run's noise on a shared host, not a different winner.
THROUGHPUT_MARGIN = 0.05


def faster_than(result: SweepResult, leader: str, rate: float) -> str | None:
    """The configuration with the most output tokens per second at `rate`, when it is not `leader` and beats it
    by more than THROUGHPUT_MARGIN (14 against 13 tok/s for one request once read as "different winners")."""
    fastest = max(result.configs, key=lambda c: result.run(c.label, rate).throughput_tok_s).label
    top, lead = (result.run(label, rate).throughput_tok_s for label in (fastest, leader))
    return fastest if fastest != leader and top > lead * (1 + THROUGHPUT_MARGIN) else None


def goal_in_requests(goal: float, num_requests: int) -> int:
    """How many of a run's requests must meet both targets for the run to reach the goal."""
    return min(num_requests, math.ceil(goal * num_requests - 1e-9))


def passes_after_miss_text(result: SweepResult, slo: SLO, num_requests: int) -> str | None:
    """Why a configuration that reaches the goal at a rate above one it missed has a lower goodput than that
    rate (the goodput rule stops at the first miss); None when no configuration does."""
    found = []
    for c in result.configs:
        curve = result.curve(c.label, slo)
        later = passes_after_miss(curve, slo.goal)
        if later:
            miss = next(r for r, a in curve if not reaches_goal(a, slo.goal))
            found.append(f"{c.label} reaches the goal again at {', '.join(f'{r:g}' for r in later)} req/s after "
                         f"missing it at {miss:g} req/s")
    if not found:
        return None
    need = goal_in_requests(slo.goal, num_requests)
    share = (f"all {num_requests}" if need == num_requests else f"{need} of {num_requests}")
    return ("; ".join(found) + ". Goodput counts only the rates up to the first miss: a pass above a miss is the "
            f"luck of one run, not capacity. With {num_requests} requests a run, a {slo.goal:.0%} goal needs "
            f"{share} to meet both targets, so one late request decides a rate; more requests a run smooth the "
            "curve.")


_MISSES = {"✗ TTFT": "on TTFT only", "✗ TPOT": "on TPOT only", "✗ both": "on both"}  # the table's verdicts


def miss_reasons(run: LoadRun, slo: SLO) -> dict[str, int]:
    """How many requests missed by TTFT only, TPOT only, or both (the same verdicts as `requests_frame`)."""
    out = dict.fromkeys(_MISSES.values(), 0)
    for t in run.timings:
        verdict = _verdict(t.meets_ttft(slo), t.meets_tpot(slo))
        if verdict in _MISSES:
            out[_MISSES[verdict]] += 1
    return out
