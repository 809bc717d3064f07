"""Merge a LoRA adapter into the weights, or serve it beside them: the same tokens, a different cost.

The live run behind the merge page (pages/16_lora_merge.py) and bench/lora_merge.py, on the real engine:

- **Answers**: one LoRA engine (`max_loras=1`) answers the prompt twice in one batch, once as the base model
  (a row without an adapter) and once through the adapter served unmerged (`y = W x + (alpha/r) B (A x)`,
  the `lora.*` kernels); a plain engine answers with the merged checkpoint `W' = W + (alpha/r) B A`. Greedy.
- **Decode step time**: B copies of the prompt decode together on the merged engine (exactly the base model's
  shapes and cost) and on the LoRA engine, one step of each in turn so both see the same load on a shared
  machine; the median of the timed steps after a warm-up, with the engine's own per-kernel timing. The two
  engines keep the prompt in their prefix cache, so only its last few tokens are prefilled per request.
- **Anatomy**: ||dW||_F / ||W||_F for every adapted linear (dW = (alpha/r) B A), and the singular values of
  one linear's dW (at most r nonzero) next to W's own.
- **Footprint**: parameters, bytes and FLOPs per token counted from the real tensors.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from engine.lora.adapter import ADAPTERS_DIR, LoraAdapter, load_adapter, random_adapter
from engine.lora.anatomy import Anatomy, Footprint, Spectrum, anatomy, footprint, spectrum
from engine.lora.merge import merged_state_dict
from engine.model import release_prepared
from engine.result_store import StoredResult, stored_run
from engine.sampling_params import SamplingParams
from engine.trace import StepRecord
from engine.weights import LoadedWeights

RANDOM = "random"
RANKS = (4, 8, 16, 32, 64)
BATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64)
MAX_BATCH = 128  # the bench goes this far; the page offers BATCH_CHOICES
MAX_NEW_TOKENS = 128
MAX_PROMPT_CHARS = 1000
DEFAULT_PROMPT = "How do I make a good cup of tea?"
RANDOM_STD = 0.02  # at rank 8; scaled by (8 / r)^(1/4) so ||dW|| is about the same at every rank
BLOCK_SIZE = 8  # small blocks: the prefix cache then holds all but the prompt's last few tokens

Progress = Callable[[str, float], None]
Deployment = Literal["merged", "unmerged"]


# ----------------------------------------------------------------------------------------- adapters

def bundled_names(directory: Path = ADAPTERS_DIR) -> tuple[str, ...]:
    """The adapters shipped as files (engine/assets/adapters/<name>.safetensors), by name."""
    return tuple(sorted(p.stem for p in directory.glob("*.safetensors")))


def file_stamp(name: str, directory: Path = ADAPTERS_DIR) -> str:
    """Size and modification time of a bundled adapter's file ('' when missing): part of the settings, so a
    retrained file is a new run rather than the cached result of the old one."""
    try:
        st = (directory / f"{name}.safetensors").stat()
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


_LOADED: dict[Path, tuple[str, LoraAdapter]] = {}  # file -> (its version, the adapter read from it)


def resolve_adapter(cfg: ModelConfig, adapter: str, rank: int, directory: Path = ADAPTERS_DIR) -> LoraAdapter:
    """The adapter a run uses: a bundled file (read once per file version) or a random one of this rank.
    ValueError with a message the page shows as is when the file is missing or does not fit the model."""
    if adapter == RANDOM:
        return random_adapter(cfg, f"random-r{rank}", rank, seed=0, std=RANDOM_STD * (8 / rank) ** 0.25)
    path = directory / f"{adapter}.safetensors"
    if not path.is_file():
        raise ValueError(f"there is no adapter file {path.name} in engine/assets/adapters/ (yet): pick another "
                         "adapter or a random one")
    stamp = file_stamp(adapter, directory)
    hit = _LOADED.get(path)
    if hit is None or hit[0] != stamp:
        loaded = load_adapter(path)
        loaded.validate(cfg)
        hit = _LOADED[path] = (stamp, loaded)
    return hit[1]


def default_adapter(directory: Path = ADAPTERS_DIR) -> str:
    names = bundled_names(directory)
    return "pirate" if "pirate" in names else (names[0] if names else RANDOM)


# ----------------------------------------------------------------------------------------- settings

@dataclass(frozen=True, slots=True)
class MergeSettings:
    adapter: str = RANDOM  # a bundled adapter's name or RANDOM
    rank: int = 8  # the random adapter's rank (a bundled one has its own)
    prompt: str = DEFAULT_PROMPT
    max_new_tokens: int = 40
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    warmup_steps: int = 2
    timed_steps: int = 5
    stamp: str = ""  # the bundled file's version (file_stamp), so a retrained file runs again

    def check(self, directory: Path = ADAPTERS_DIR) -> None:
        """Raises ValueError with a message the page shows as is."""
        if self.adapter == RANDOM:
            if self.rank not in RANKS:
                raise ValueError(f"the random adapter's rank must be one of {', '.join(map(str, RANKS))}")
        elif not (directory / f"{self.adapter}.safetensors").is_file():
            raise ValueError(f"there is no adapter file {self.adapter}.safetensors in engine/assets/adapters/ "
                             "(yet): pick another adapter or a random one")
        if not self.prompt.strip():
            raise ValueError("the prompt is empty: type a message for the models to answer")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt is {len(self.prompt):,} characters; at most {MAX_PROMPT_CHARS:,} here")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"tokens to generate must be 1 to {MAX_NEW_TOKENS}")
        if not self.batch_sizes:
            raise ValueError("pick at least one batch size to time")
        sizes = self.batch_sizes
        if any(not 1 <= b <= MAX_BATCH for b in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError(f"batch sizes must be distinct, from 1 to {MAX_BATCH}")
        if not 0 <= self.warmup_steps <= 10 or not 1 <= self.timed_steps <= 50:
            raise ValueError("warm-up steps must be 0 to 10 and timed steps 1 to 50")


def default_settings(directory: Path = ADAPTERS_DIR) -> MergeSettings:
    name = default_adapter(directory)
    return MergeSettings(adapter=name, stamp=file_stamp(name, directory) if name != RANDOM else "")


# ----------------------------------------------------------------------------------------- engines

def engine_config(device: str, dtype: str, max_batch: int, max_len: int, lora_rank: int = 0,
                  cuda_graphs: bool = False) -> EngineConfig:
    """The engines both deployments run: room for `max_batch` rows of `max_len` tokens, the prompt kept in the
    prefix cache (a batch's prompts, all but their last few tokens cached, prefill in one step, so every row
    then decodes in step), the kernels profiled (eager) unless CUDA graphs replay the decode steps."""
    per_seq = -(-max_len // BLOCK_SIZE) + 1
    return EngineConfig(device=device, dtype=dtype, block_size=BLOCK_SIZE, num_blocks=(max_batch + 2) * per_seq,
                        max_num_seqs=max(2, max_batch),
                        max_num_batched_tokens=max(512, 2 * max_len, max_batch * (BLOCK_SIZE + 2)),
                        max_model_len=max_len + BLOCK_SIZE, enable_prefix_cache=True,
                        profile_kernels=not cuda_graphs, cuda_graphs=cuda_graphs, trace_detail="light",
                        max_loras=1 if lora_rank else 0, max_lora_rank=max(1, lora_rank))


def merged_and_lora_engines(weights: LoadedWeights, merged: LoadedWeights, adapter: LoraAdapter, device: str,
                            dtype: str, max_batch: int, max_len: int,
                            cuda_graphs: bool = False) -> tuple[LLMEngine, LLMEngine]:
    """(the merged deployment: a plain engine on W', the unmerged one: W plus the adapter in a slot)."""
    m = LLMEngine(engine_config(device, dtype, max_batch, max_len, cuda_graphs=cuda_graphs), merged)
    u = LLMEngine(engine_config(device, dtype, max_batch, max_len, adapter.rank, cuda_graphs), weights)
    u.register_adapter(adapter)
    return m, u


def _drain(*engines: LLMEngine) -> tuple[list[StepRecord], ...]:
    """Step the engines in turn until none has work; each one's records."""
    out: tuple[list[StepRecord], ...] = tuple([] for _ in engines)
    while any(e.has_work() for e in engines):
        for e, recs in zip(engines, out):
            if e.has_work():
                recs.append(e.step())
    return out


def _strip_eos(ids: tuple[int, ...], eos: set[int]) -> tuple[int, ...]:
    return tuple(t for t in ids if t not in eos)


@dataclass(frozen=True, slots=True)
class Answer:
    kind: Literal["base", "merged", "unmerged"]
    token_ids: tuple[int, ...]  # end-of-turn token dropped
    text: str


def answer(merged_engine: LLMEngine, lora_engine: LLMEngine, adapter: str, prompt_ids: list[int],
           max_new_tokens: int) -> tuple[Answer, Answer, Answer]:
    """(base, merged, unmerged): the base model and the unmerged adapter as two rows of one LoRA batch."""
    p = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    rb = lora_engine.add_request(list(prompt_ids), p)
    ru = lora_engine.add_request(list(prompt_ids), p, adapter=adapter)
    rm = merged_engine.add_request(list(prompt_ids), p)
    _drain(merged_engine, lora_engine)
    eos = set(lora_engine.tokenizer.eos_token_ids)
    out = []
    for kind, e, rid in (("base", lora_engine, rb), ("merged", merged_engine, rm), ("unmerged", lora_engine, ru)):
        res = e.result(rid)
        out.append(Answer(kind, _strip_eos(res.token_ids, eos), res.text))
    return tuple(out)  # type: ignore[return-value]


KernelCosts = Mapping[str, tuple[float, float, float]]  # kernel name -> (seconds, FLOPs, bytes) in one step


@dataclass(frozen=True, slots=True, eq=False)
class StepTiming:
    """Full-batch decode steps of one deployment at one batch size. `step_seconds`: the timed steps, run with the
    kernel timer off (its per-call bookkeeping would add to the step); `profiled_seconds` / `step_kernels`: the
    steps between them, run with it on, each with its kernels (none when CUDA graphs replay the steps). The
    medians are real steps (the lower of the middle two)."""

    deployment: Deployment
    batch: int
    step_seconds: tuple[float, ...]
    profiled_seconds: tuple[float, ...] = ()
    step_kernels: tuple[KernelCosts, ...] = ()

    @staticmethod
    def _median_index(values: tuple[float, ...]) -> int:
        order = sorted(range(len(values)), key=values.__getitem__)
        return order[(len(order) - 1) // 2]

    @property
    def median(self) -> float:
        return self.step_seconds[self._median_index(self.step_seconds)]

    @property
    def profiled_median(self) -> float:
        """The median profiled step's seconds (the step `kernels` come from; 0.0 without profiling). Longer than
        `median` by the timer's bookkeeping, so a share of it, not its seconds, carries over to the timed step."""
        if not self.profiled_seconds:
            return 0.0
        return self.profiled_seconds[self._median_index(self.profiled_seconds)]

    @property
    def kernels(self) -> KernelCosts:
        """The kernels of the median profiled step ({} without profiling)."""
        if not self.step_kernels:
            return {}
        return self.step_kernels[self._median_index(self.profiled_seconds)]

    def seconds_of(self, prefix: str) -> float:
        return sum(s for n, (s, _, _) in self.kernels.items() if n.startswith(prefix))

    def flops_of(self, prefix: str) -> float:
        return sum(f for n, (_, f, _) in self.kernels.items() if n.startswith(prefix))


def _costs(record: StepRecord) -> dict[str, tuple[float, float, float]]:
    out: dict[str, tuple[float, float, float]] = {}
    for k in record.kernels:  # one entry per (name, backend): add a name's backends up
        s, f, b = out.get(k.name, (0.0, 0.0, 0.0))
        out[k.name] = (s + k.seconds, f + k.flops, b + k.bytes)
    return out


def time_decode(merged_engine: LLMEngine, lora_engine: LLMEngine, adapter: str, prompt_ids: list[int], batch: int,
                warmup: int, timed: int, profiled: int | None = None) -> tuple[StepTiming, StepTiming]:
    """B copies of the prompt on each engine (the LoRA engine's rows all run the adapter), stepped in turn:
    `warmup` full-batch decode steps, then `timed` ones with the kernel timer off and `profiled` (default: as
    many as timed; 0 where the engine does not profile kernels, as with CUDA graphs) with it on, alternating, so
    a shared host's load falls on both alike (profiled steps all after the timed ones once split a step by a load
    the timed steps had not seen). (merged, unmerged)."""
    engines = (merged_engine, lora_engine)
    profiled = timed if profiled is None else profiled
    can_profile = [e.config.profile_kernels for e in engines]
    if not all(can_profile):
        profiled = 0
    p = SamplingParams(temperature=0.0, max_tokens=warmup + timed + profiled + 1, ignore_eos=True)
    for i in range(batch):
        merged_engine.add_request(list(prompt_ids), p)
        lora_engine.add_request(list(prompt_ids), p, adapter=adapter)
    walls: tuple[list[float], list[float]] = ([], [])
    prof: tuple[list[float], list[float]] = ([], [])
    kern: tuple[list[KernelCosts], list[KernelCosts]] = ([], [])
    done = [0, 0]  # full-batch decode steps so far, per engine
    try:
        while any(e.has_work() for e in engines):
            for j, e in enumerate(engines):
                if not e.has_work():
                    continue
                # After the warm-up: a profiled step whenever there are fewer of them than timed ones.
                on = (done[j] >= warmup and len(prof[j]) < profiled
                      and (len(prof[j]) < len(walls[j]) or len(walls[j]) >= timed))
                e.kernels.timer.enabled = on
                rec = e.step()
                if rec.num_prefill_tokens or rec.num_decode_tokens != batch:
                    continue
                if on:
                    prof[j].append(rec.wall_seconds)
                    kern[j].append(_costs(rec))
                elif done[j] >= warmup and len(walls[j]) < timed:
                    walls[j].append(rec.wall_seconds)
                done[j] += 1
    finally:
        for e, c in zip(engines, can_profile):
            e.kernels.timer.enabled = c
    out = []
    for j, way in enumerate(("merged", "unmerged")):
        if len(walls[j]) < timed or len(prof[j]) < profiled:
            raise RuntimeError(f"only {len(walls[j])} timed and {len(prof[j])} profiled full decode steps of {batch} "
                               f"rows on the {way} engine (is the KV pool too small?)")
        out.append(StepTiming(way, batch, tuple(walls[j]), tuple(prof[j]), tuple(kern[j])))
    return out[0], out[1]


# ----------------------------------------------------------------------------------------- the run

@dataclass(frozen=True, slots=True, eq=False)
class MergeResult:
    settings: MergeSettings
    adapter_name: str
    description: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    meta: Mapping[str, object]  # the training record of a bundled adapter ({} for a random one)
    prompt_tokens: int
    answers: tuple[Answer, Answer, Answer]  # base, merged, unmerged
    timings: tuple[StepTiming, ...]  # (merged, unmerged) per batch size, in the settings' order
    anatomy: Anatomy
    spectrum: Spectrum  # of the linear the adapter changes most
    footprint: Footprint
    device: str
    dtype: str
    backend: str  # the LoRA engine's kernels, in words
    lora_backend: str  # "torch" / "triton": the lora family's implementation
    merge_seconds: float
    seconds: float
    # Kept for other linears' spectra (None only inside `stored_merge_lab`'s disk entry, which names it instead).
    adapter: LoraAdapter | None = field(repr=False)

    @property
    def base(self) -> Answer:
        return self.answers[0]

    @property
    def merged(self) -> Answer:
        return self.answers[1]

    @property
    def unmerged(self) -> Answer:
        return self.answers[2]

    def timing(self, deployment: Deployment, batch: int) -> StepTiming:
        return next(t for t in self.timings if t.deployment == deployment and t.batch == batch)


def run_merge_lab(weights: LoadedWeights, settings: MergeSettings, progress: Progress | None = None,
                  device: str = "cpu", dtype: str = "float32", cuda_graphs: bool = False,
                  adapter: LoraAdapter | None = None) -> MergeResult:
    """The whole comparison for one adapter and prompt (see the module's docstring). `adapter`: a ready one in
    place of the settings' (tests, the bench)."""
    settings.check()
    say = progress or (lambda _msg, _frac: None)
    t0 = time.perf_counter()
    cfg = weights.config
    if adapter is None:
        adapter = resolve_adapter(cfg, settings.adapter, settings.rank)
    else:
        adapter.validate(cfg)
    say(f"Merging '{adapter.name}' into a copy of the weights: W' = W + (α/r)·BA", 0.02)
    tm = time.perf_counter()
    merged = LoadedWeights(cfg, merged_state_dict(weights.state_dict, adapter),
                           f"{weights.source} + LoRA '{adapter.name}' merged", weights.tokenizer)
    merge_seconds = time.perf_counter() - tm
    try:
        prompt_ids = weights.tokenizer.chat_prompt_ids(settings.prompt)
        batches = settings.batch_sizes
        max_len = len(prompt_ids) + max(settings.max_new_tokens, settings.warmup_steps + 2 * settings.timed_steps + 2)
        if max_len + BLOCK_SIZE > cfg.max_position_embeddings:
            raise ValueError("the prompt is too long for the model")
        m_engine, u_engine = merged_and_lora_engines(weights, merged, adapter, device, dtype, max(batches), max_len,
                                                     cuda_graphs)
        say("The base model, the merged checkpoint and the unmerged adapter answer", 0.08)
        answers = answer(m_engine, u_engine, adapter.name, prompt_ids, settings.max_new_tokens)
        timings: list[StepTiming] = []
        for k, b in enumerate(batches):
            say(f"Timing decode steps at batch {b}: merged vs unmerged", 0.35 + 0.55 * k / len(batches))
            timings += time_decode(m_engine, u_engine, adapter.name, prompt_ids, b, settings.warmup_steps,
                                   settings.timed_steps)
        backend = u_engine.kernels.description
        lora_backend = u_engine.kernels.label("lora")
        del m_engine, u_engine
    finally:
        release_prepared(merged.state_dict)  # this merged copy will not run again
    say("The update's anatomy: norms and singular values", 0.92)
    anat = anatomy(weights, adapter)
    layer, target = anat.largest()
    return MergeResult(settings, adapter.name, adapter.description, adapter.rank, adapter.alpha, adapter.targets,
                       dict(adapter.meta), len(prompt_ids), answers, tuple(timings), anat,
                       spectrum(weights, adapter, layer, target), footprint(weights, adapter), device, dtype, backend,
                       lora_backend, merge_seconds, time.perf_counter() - t0, adapter)


# ----------------------------------------------------------------------------------------- as data

def timing_dict(t: StepTiming) -> dict:
    return {"deployment": t.deployment, "batch": t.batch, "median_step_ms": t.median * 1e3,
            "step_ms": [s * 1e3 for s in t.step_seconds], "profiled_step_ms": [s * 1e3 for s in t.profiled_seconds],
            "lora_ms": t.seconds_of("lora.") * 1e3, "linear_ms": t.seconds_of("linear.") * 1e3,
            "lora_flops": t.flops_of("lora."), "linear_flops": t.flops_of("linear."),
            "kernels": {n: {"ms": s * 1e3, "flops": f, "bytes": b} for n, (s, f, b) in t.kernels.items()}}


def result_dict(r: MergeResult) -> dict:
    """Everything the run measured, as plain JSON-able data (the page's download)."""
    s, fp, sp = r.settings, r.footprint, r.spectrum
    rel = r.anatomy.rel_norm
    return {
        "settings": {"adapter": s.adapter, "rank": s.rank, "prompt": s.prompt, "max_new_tokens": s.max_new_tokens,
                     "batch_sizes": list(s.batch_sizes), "warmup_steps": s.warmup_steps,
                     "timed_steps": s.timed_steps},
        "device": r.device, "dtype": r.dtype, "backend": r.backend, "lora_backend": r.lora_backend,
        "adapter": {"name": r.adapter_name, "description": r.description, "rank": r.rank, "alpha": r.alpha,
                    "targets": list(r.targets), "meta": dict(r.meta)},
        "prompt_tokens": r.prompt_tokens,
        "answers": {a.kind: {"text": a.text, "token_ids": list(a.token_ids)} for a in r.answers},
        "timings": [timing_dict(t) for t in r.timings],
        "anatomy": {"targets": list(r.anatomy.targets),
                    "rel_norm": [[None if math.isnan(v) else float(v) for v in row] for row in rel]},
        "spectrum": {"layer": sp.layer, "target": sp.target, "weight": sp.weight.tolist(), "delta": sp.delta.tolist()},
        "footprint": {"base_params": fp.base_params, "checkpoint_bytes": fp.checkpoint_bytes,
                      "adapter_params": fp.adapter_params, "adapter_bytes": fp.adapter_bytes,
                      "base_linear_flops_per_token": fp.base_linear_flops, "lm_head_flops_per_token": fp.lm_head_flops,
                      "adapter_flops_per_token": fp.adapter_flops, "served_lora_flops_per_token": fp.served_flops},
        "merge_seconds": r.merge_seconds, "seconds": r.seconds,
    }


def stored_merge_lab(weights: LoadedWeights, settings: MergeSettings, progress: Progress | None = None,
                     device: str = "cpu", dtype: str = "float32") -> StoredResult[MergeResult]:
    """`run_merge_lab`'s result, kept on disk for CPU weights (engine/result_store.py) like the quantization labs':
    the same weights, settings (a bundled adapter's file version among them) and code give it back at once, with
    when it was computed, so its step times are the ones measured then. The adapter's tensors (about 10 MB for
    rank 8 on every linear) are not kept: the settings name it, and `resolve_adapter` gives it back."""
    settings.check()
    adapter = resolve_adapter(weights.config, settings.adapter, settings.rank)  # once, for the run and the read-back
    stored = stored_run("lora-merge-lab", weights, settings,
                        lambda: replace(run_merge_lab(weights, settings, progress, device, dtype, adapter=adapter),
                                        adapter=None),
                        device=device, dtype=dtype)
    return replace(stored, value=replace(stored.value, adapter=adapter))
