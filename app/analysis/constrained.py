"""What the constrained decoding page computes from its inputs and records (no Streamlit): the checked
run settings and the scenario they make, one row per output token, a run's summary, the same prompt
run free / masked / with jump-forward on the real engine, and the bench results file."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.constrained import ConstrainedEngine, Constraint, accepts, problem_with
from engine.constrained.constraint import as_sentence, parses_as_json
from engine.constrained.presets import PRESETS, Preset
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from engine.weights import LoadedWeights

from app.scenarios import RequestSpec, Scenario

MAX_PROMPT_CHARS = 600
MAX_OUTPUT_TOKENS = 128
MAX_SAMPLES = 4
REQUEST_ID = "r0"
ENGINE = {"block_size": 16, "num_blocks": 64, "max_model_len": 512, "max_num_seqs": MAX_SAMPLES,
          "max_num_batched_tokens": 512}
BENCH_FILE = Path(__file__).resolve().parents[2] / "bench" / "results" / "constrained_decoding_cpu.json"
KIND_NAMES = {"free": "model's own choice", "steered": "steered by the mask", "only": "the only token allowed",
              "forced": "written by jump-forward", "unconstrained": "no grammar"}
MODES = ("free (no grammar)", "masked", "masked + jump-forward", "compact JSON + jump-forward")


@dataclass(frozen=True, slots=True)
class RunSettings:
    """One run of the page: a prompt, the grammar its answer must follow (None: free text) and sampling."""

    preset: str  # the preset it started from ("" for a hand-written one)
    prompt: str
    constraint: Constraint | None
    jump_forward: bool
    max_tokens: int
    temperature: float
    seed: int
    n: int = 1
    early_masks: bool = True  # the next mask computed during the forward pass (ConstrainedEngine.early_masks)

    def scenario(self) -> Scenario:
        what = self.constraint.label if self.constraint else "free text"
        jf = ", jump-forward" if self.constraint and self.jump_forward else ""
        return Scenario(name=f"{what}{jf}",
                        requests=(RequestSpec(self.prompt, max_tokens=self.max_tokens, temperature=self.temperature,
                                              seed=self.seed, n=self.n, request_id=REQUEST_ID),),
                        engine=dict(ENGINE))


def library(settings: RunSettings) -> list[Scenario]:
    """The scenario editor's ready-made runs, all under the page's current grammar (the engine's default
    for every request): the current run, three samples of it, and a batch of three sampled requests, each
    sequence with a matcher of its own."""
    base = settings.scenario()
    req = base.requests[0]
    sampled = dataclasses.replace(req, temperature=0.8, seed=settings.seed, n=3)
    batch = tuple(dataclasses.replace(req, temperature=0.8, seed=settings.seed + i, request_id=f"r{i}")
                  for i in range(3))
    return [base,
            Scenario(f"{base.name}: 3 samples at T = 0.8", (sampled,), base.engine,
                     "One request with n = 3: the samples share the prompt's KV blocks, and each has its own grammar "
                     "state."),
            Scenario(f"{base.name}: a batch of 3 requests", batch, base.engine,
                     "Three requests (seeds differ) decoded in one batch: one mask per sequence every step.")]


def preset_settings(preset: Preset = PRESETS[0], jump_forward: bool = True) -> RunSettings:
    return RunSettings(preset.name, preset.prompt, preset.constraint, jump_forward, preset.max_tokens, 0.0, 0)


def preset_by_name(name: str) -> Preset | None:
    return next((p for p in PRESETS if p.name == name), None)


def check_settings(prompt: str, constraint: Constraint | None, jump_forward: bool, max_tokens: int,
                   temperature: float, seed: int, n: int, tokenizer: Tokenizer, preset: str = "",
                   early_masks: bool = True) -> RunSettings:
    """The settings, or ValueError with a message a student can act on (nothing is run or reset)."""
    if not prompt or not prompt.strip():
        raise ValueError("The prompt is empty: pick a preset or type one.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"The prompt is {len(prompt)} characters long; at most {MAX_PROMPT_CHARS} keep a run "
                         "short on the CPU.")
    if constraint is not None:
        problem = problem_with(constraint, tokenizer)
        if problem is not None:
            raise ValueError(as_sentence(problem))
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
        raise ValueError(f"Max tokens must be from 1 to {MAX_OUTPUT_TOKENS}, got {max_tokens!r}.")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and 0 <= temperature <= 2):
        raise ValueError(f"Temperature must be between 0 and 2, got {temperature!r}.")
    if not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"Samples must be a whole number from 1 to {MAX_SAMPLES}, got {n!r}.")
    if n > 1 and temperature == 0:
        raise ValueError("More than one sample needs a temperature above 0: greedy samples would all be the same.")
    prompt_tokens = len(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
    if prompt_tokens + max_tokens > ENGINE["max_model_len"]:
        raise ValueError(f"The prompt ({prompt_tokens} tokens) plus {max_tokens} output tokens exceeds the context "
                         f"of {ENGINE['max_model_len']} tokens: shorten the prompt.")
    return RunSettings(preset, prompt.strip(), constraint, bool(jump_forward), int(max_tokens), float(temperature),
                       int(seed), int(n), bool(early_masks))


def request_view(record_extra: dict[str, Any] | None, request_id: str = REQUEST_ID) -> dict[str, Any] | None:
    """One request in a record's "constrained" extra (None before it exists)."""
    if not record_extra:
        return None
    return record_extra.get("requests", {}).get(request_id)


def token_rows(sample: dict[str, Any], tokenizer: Tokenizer) -> list[dict[str, Any]]:
    """One row per output token: what the grammar allowed, what the model wanted, what was written."""
    rows = []
    for pos, ev in enumerate(sample["events"]):
        top = ev["top"][0] if ev["top"] else None
        rows.append({
            "#": pos, "step": ev["step"], "token": tokenizer.decode_token(ev["token"]), "how": KIND_NAMES[ev["kind"]],
            "tokens allowed": ev["allowed"],
            "model's first choice": tokenizer.decode_token(top[0]) if top else "–",
            "its p": None if top is None else round(top[1], 3),
            "p of this token": None if ev["chosen_prob"] is None else round(ev["chosen_prob"], 3),
            "p forbidden": None if ev["masked_mass"] is None else round(ev["masked_mass"], 3),
            "mask (µs)": None if ev["allowed"] is None else round(1e6 * ev["mask_seconds"], 1),
        })
    return rows


@dataclass(frozen=True, slots=True)
class SampleSummary:
    tokens: int
    kinds: dict[str, int]
    forbidden_mass: float  # mean probability the grammar took away, over masked tokens
    # Per token sampled under a mask, in order. The metrics show medians, because a sample's first mask can take
    # a thousand times the others (250 ms against 200-700 µs) and a mean then describes no token at all.
    mask_each: tuple[float, ...] = ()  # the mask itself
    hook_each: tuple[float, ...] = ()  # the logits hook's whole work (mask + statistics)
    wait_each: tuple[float, ...] = ()  # how long sampling waited for the mask (less than the mask when early)

    @property
    def masked_tokens(self) -> int:
        return len(self.mask_each)

    @property
    def mask_seconds(self) -> float:
        """All the masks of this sample."""
        return sum(self.mask_each)

    @property
    def mean_mask_us(self) -> float:
        return 1e6 * self.mask_seconds / self.masked_tokens if self.masked_tokens else 0.0

    @property
    def median_mask_seconds(self) -> float:
        return _median(self.mask_each)

    @property
    def median_hook_seconds(self) -> float:
        return _median(self.hook_each)

    @property
    def median_wait_seconds(self) -> float:
        return _median(self.wait_each)

    @property
    def slowest_mask(self) -> tuple[int, float]:
        """(which masked token, counted from 0, seconds) of the slowest mask."""
        if not self.mask_each:
            return (0, 0.0)
        i = max(range(len(self.mask_each)), key=self.mask_each.__getitem__)
        return i, self.mask_each[i]


def summarize(sample: dict[str, Any]) -> SampleSummary:
    events = sample["events"]
    masked = [e for e in events if e["masked_mass"] is not None]
    return SampleSummary(len(events), dict(Counter(e["kind"] for e in events)),
                         sum(e["masked_mass"] for e in masked) / len(masked) if masked else 0.0,
                         tuple(e["mask_seconds"] for e in masked), tuple(e.get("hook_seconds", 0.0) for e in masked),
                         tuple(e.get("mask_wait_seconds", e["mask_seconds"]) for e in masked))


def _median(values: tuple[float, ...]) -> float:
    return float(statistics.median(values)) if values else 0.0


@dataclass(frozen=True, slots=True)
class LastMask:
    allowed: int  # tokens the mask allowed
    token: int  # which output token it was, counted from 1
    forced_after: int  # tokens jump-forward wrote after it, which had no mask to count


def last_mask(sample: dict[str, Any]) -> LastMask | None:
    """The sample's most recent mask. Jump-forward tokens have none, so a sample that ends in them reports
    the mask before them and how many came after, not a count that belongs to an earlier token."""
    events = sample["events"]
    for i in range(len(events) - 1, -1, -1):
        if events[i]["allowed"] is not None:
            return LastMask(events[i]["allowed"], i + 1, len(events) - 1 - i)
    return None


# ---- the same prompt, three ways -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ModeRun:
    mode: str
    text: str
    valid: bool | None  # None: no grammar to judge by
    parses_as_json: bool | None  # None: not a JSON constraint
    output_tokens: int
    steps: int
    wall_seconds: float
    mask_seconds: float
    kinds: dict[str, int]
    finish_reason: str


def modes_for(constraint: Constraint | None) -> tuple[str, ...]:
    """The comparison's modes: compact JSON only where there is JSON to lay out."""
    if constraint is None:
        return ()
    return MODES if constraint.kind == "json_schema" else MODES[:3]


def run_modes(settings: RunSettings, weights: LoadedWeights, server: dict[str, Any]) -> list[ModeRun]:
    """The page's prompt greedily in each mode on fresh engines (one sample each): free text, the grammar's
    mask, the mask with jump-forward, and for JSON the compact layout with jump-forward. Judged by the run's
    grammar (with JSON whitespace allowed) whatever the mode."""
    out = []
    for mode in modes_for(settings.constraint):
        constraint = {MODES[0]: None, MODES[3]: with_layout(settings, "compact").constraint}.get(mode, settings.constraint)
        engine = ConstrainedEngine(EngineConfig(**{**ENGINE, "profile_kernels": False}, **server), weights,
                                   constraint=constraint, jump_forward=mode in (MODES[2], MODES[3]))
        rid = engine.add_request([{"role": "user", "content": settings.prompt}],
                                 SamplingParams(max_tokens=settings.max_tokens))
        t0 = time.perf_counter()
        steps, record = 0, None
        while engine.has_work():
            record = engine.step()
            steps += 1
        wall = time.perf_counter() - t0
        assert record is not None
        sample = request_view(record.extra("constrained"), rid)["samples"][0]
        judge = settings.constraint
        s = summarize(sample)
        out.append(ModeRun(mode, sample["text"], accepts(judge, sample["text"], engine.tokenizer) if judge else None,
                           parses_as_json(sample["text"]) if judge and judge.kind == "json_schema" else None,
                           s.tokens, steps, wall, s.mask_seconds, s.kinds, sample["finish_reason"]))
    return out


def mode_rows(runs: list[ModeRun]) -> list[dict[str, Any]]:
    def yes(v: bool | None) -> str:
        return "–" if v is None else ("yes" if v else "no")

    return [{"mode": r.mode, "valid": yes(r.valid), "parses as JSON": yes(r.parses_as_json),
             "output tokens": r.output_tokens, "engine steps": r.steps, "time (s)": round(r.wall_seconds, 2),
             # No grammar builds no mask: None (the table's "–"), not "0.0 ms" of mask work.
             # Unrounded: the table shows one decimal as the caption does (rounded twice, 12.955 read 12.9, 13.0).
             "mask time (ms)": None if r.mode == MODES[0] else 1e3 * r.mask_seconds,
             "forced": r.kinds.get("forced", 0), "steered": r.kinds.get("steered", 0),
             "ended by": r.finish_reason, "text": r.text} for r in runs]


def with_layout(settings: RunSettings, layout: str) -> RunSettings:
    if settings.constraint is None or settings.constraint.kind != "json_schema":
        return settings
    return dataclasses.replace(settings, constraint=dataclasses.replace(settings.constraint, json_layout=layout))


def bench_tables(bench: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """bench/constrained_decoding.py's results as two tables: every preset greedy in every mode, and the
    fraction of sampled answers (n samples at a temperature) that are valid, free vs masked."""
    greedy = [{"preset": r["preset"], "mode": r["mode"], "valid": "yes" if r["valid"] else "no",
               "engine steps": r["steps"], "output tokens": r["output_tokens"],
               "mask µs (mean)": None if r.get("mask_us_mean") is None else round(r["mask_us_mean"]),
               "mask share of step time (%)": round(100 * (r.get("mask_share_of_step_wall") or 0.0), 2),
               "text": r["text"]} for r in bench.get("greedy", [])]
    sampled = [{"preset": r["preset"], **{f"{mode}: valid (%)": round(100 * r[mode]["valid_fraction"])
                                          for mode in ("free", "masked") if mode in r}}
               for r in bench.get("sampled", [])]
    return greedy, sampled


def load_bench(path: Path = BENCH_FILE) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
