"""Plain data for the merge-or-serve page: where merged and unmerged part (if ever), each decode step split by
kernel kind, the memory of N fine-tunes either way and what fits on an H200, the training record of a bundled
adapter, the bench's file, and the run as JSON."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from app.formatting import NO_VALUE
from engine.config import ModelConfig
from engine.kv_compression.lab import first_difference
from engine.lora.anatomy import CHECKPOINT_BYTES_PER_PARAM, Footprint, adapter_params, base_params
from engine.lora.merge_lab import RANDOM, MergeResult, MergeSettings, StepTiming, file_stamp, result_dict
from kernels.ceilings import REFERENCE_CEILINGS

# What torch reports on the H200 (139.8 GiB), as the parallelism page uses: NVIDIA's "141 GB" taken as 141e9 bytes
# came to 131 GiB, a figure no tool shows for this card.
H200_BYTES = REFERENCE_CEILINGS["NVIDIA H200"].memory_bytes
ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = ROOT / "bench" / "results"
BENCH_COMMAND = "PYTHONPATH=. python3 bench/lora_merge.py"
# A larger model of the same family, for the memory arithmetic only (never run here): Llama-3.1-8B's shape.
LLAMA_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, head_dim=128, tie_word_embeddings=False, name="Llama-3.1-8B")
FINE_TUNES = np.unique(np.round(np.logspace(0, 2, 41)).astype(int))  # 1 … 100, log-spaced

# What the bars of a decode step are made of, in stacking order.
PARTS = ("Base linears + LM head", "LoRA kernels", "Attention", "Other kernels", "Outside the kernels")


# ---- the form -----------------------------------------------------------------------------------

def form_settings(adapter: str, rank: int, prompt: str, max_new_tokens: int,
                  batch_sizes: Iterable[int]) -> MergeSettings:
    """The run the form asks for. A trained adapter has its own rank, so the random-rank control is ignored for
    it and the default rank kept: the settings (the run's key) do not change with a hidden control. (Read from
    an instance: on a slots dataclass `MergeSettings.rank` is the slot's descriptor, not 8, and that broke the
    run's JSON.)"""
    random = adapter == RANDOM
    return MergeSettings(adapter=adapter, rank=int(rank) if random else MergeSettings().rank, prompt=prompt,
                         max_new_tokens=int(max_new_tokens), batch_sizes=tuple(sorted(int(b) for b in batch_sizes)),
                         stamp="" if random else file_stamp(adapter))


# ---- the answers ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Divergence:
    position: int  # 0-based answer token
    merged: str  # the token each wrote there ('' when that answer had ended)
    unmerged: str


def divergence(result: MergeResult, decode) -> Divergence | None:  # noqa: ANN001 (the tokenizer's decode)
    """Where the unmerged adapter's answer first leaves the merged checkpoint's (None: the same tokens)."""
    m, u = result.merged.token_ids, result.unmerged.token_ids
    i = first_difference(u, m)
    if i is None:
        return None
    tok = lambda ids: decode([ids[i]]) if i < len(ids) else ""  # noqa: E731
    return Divergence(i, tok(m), tok(u))


def adapter_changes_at(result: MergeResult) -> int | None:
    """Where the fine-tune's (merged) answer leaves the base model's (None: this prompt's answer is unchanged)."""
    return first_difference(result.merged.token_ids, result.base.token_ids)


# ---- decode steps --------------------------------------------------------------------------------

def part_of(kernel: str) -> str:
    if kernel.startswith("linear.") or kernel == "lm_head":
        return PARTS[0]
    if kernel.startswith("lora."):
        return PARTS[1]
    if "attention" in kernel:
        return PARTS[2]
    return PARTS[3]


def _profiled_step(t: StepTiming) -> float:
    """The profiled step that `t.kernels` come from, never shorter than its kernels: what their shares are of."""
    return max(t.profiled_median, sum(secs for secs, _, _ in t.kernels.values()))


def breakdown(t: StepTiming) -> dict[str, float]:
    """The median step's seconds by part, adding up to it: each part's share of the median profiled step (what
    its kernels do not cover, scheduling, sampling, Python, is 'Outside the kernels') times the median timed
    step. Shares, not seconds: the profiled step is longer by the timer's own bookkeeping, so its seconds
    stacked would stand above the step they explain. Without per-kernel timing (CUDA graphs) the whole step is
    one part."""
    out = dict.fromkeys(PARTS, 0.0)
    if not t.kernels:
        out[PARTS[4]] = t.median
        return out
    for name, (secs, _, _) in t.kernels.items():
        out[part_of(name)] += secs
    profiled = _profiled_step(t)
    if profiled <= 0.0:  # kernels that took no measurable time: nothing to apportion
        return {**dict.fromkeys(PARTS, 0.0), PARTS[4]: t.median}
    out[PARTS[4]] = profiled - sum(out.values())
    return {p: secs / profiled * t.median for p, secs in out.items()}


def base_flops(t: StepTiming) -> float:
    return sum(f for n, (_, f, _) in t.kernels.items() if part_of(n) == PARTS[0])


def timing_frame(result: MergeResult) -> pd.DataFrame:
    """One row per batch size: both medians, the extra time, and the LoRA kernels' share in time and FLOPs."""
    rows = []
    for b in result.settings.batch_sizes:
        m, u = result.timing("merged", b), result.timing("unmerged", b)
        lora = u.seconds_of("lora.")
        rows.append({
            "Batch": b,
            "Merged ms": m.median * 1e3,
            "Unmerged ms": u.median * 1e3,
            "Extra": u.median / m.median - 1,
            "LoRA kernels ms": lora * 1e3 if u.kernels else None,
            "LoRA share of step": lora / _profiled_step(u) if u.kernels else None,  # of its own step
            "LoRA FLOPs vs linears": (u.flops_of("lora.") / base_flops(u)) if u.kernels and base_flops(u) else None,
            "Merged tok/s": b / m.median,
            "Unmerged tok/s": b / u.median,
        })
    return pd.DataFrame(rows)


# ---- memory and deployment -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Deployment:
    """Bytes of one model and one adapter (bf16): measured tensors for the live model, the shape's arithmetic
    for the larger comparison model."""

    model: str
    checkpoint_bytes: int
    adapter_bytes: int

    def merged_bytes(self, n: int | np.ndarray) -> np.ndarray | int:
        """N fine-tunes merged: N whole checkpoints."""
        return n * self.checkpoint_bytes

    def unmerged_bytes(self, n: int | np.ndarray) -> np.ndarray | int:
        """N fine-tunes served unmerged: one base and N adapters."""
        return self.checkpoint_bytes + n * self.adapter_bytes

    def merged_fit(self, memory: float = H200_BYTES) -> int:
        """Merged fine-tunes whose weights fit in `memory` (before any KV cache)."""
        return int(memory // self.checkpoint_bytes)

    def adapters_fit(self, memory: float = H200_BYTES) -> int:
        """Adapters that fit beside one base model in `memory` (before any KV cache)."""
        return max(0, int((memory - self.checkpoint_bytes) // self.adapter_bytes))

    def break_even_memory(self, n: int) -> float:
        """How many times more memory N merged copies take than one base and N adapters."""
        return float(self.merged_bytes(n) / self.unmerged_bytes(n))


def live_deployment(fp: Footprint, name: str) -> Deployment:
    return Deployment(name, fp.checkpoint_bytes, fp.adapter_bytes)


def shaped_deployment(cfg: ModelConfig, rank: int, targets: tuple[str, ...]) -> Deployment:
    """The same adapter shape (rank, targets) on another model, from its shape alone."""
    return Deployment(cfg.name, base_params(cfg) * CHECKPOINT_BYTES_PER_PARAM,
                      adapter_params(cfg, rank, targets) * CHECKPOINT_BYTES_PER_PARAM)


def memory_frame(deployments: list[Deployment], ns: np.ndarray = FINE_TUNES) -> pd.DataFrame:
    """Long format: model, way (merged / unmerged), N, bytes."""
    rows = [{"model": d.model, "way": way, "n": int(n),
             "bytes": float(d.merged_bytes(n) if way == "merged" else d.unmerged_bytes(n))}
            for d in deployments for way in ("merged", "unmerged") for n in ns]
    return pd.DataFrame(rows)


# ---- what a bundled adapter learned --------------------------------------------------------------

METRIC_LABELS = {
    "starts_with_ahoy": ("Answers opening with 'Ahoy'", "share"),
    "ends_with_arr": ("Answers ending with 'Arr!'", "share"),
    "sentences_per_answer": ("Sentences per answer", "number"),
    "words_per_answer": ("Words per answer", "number"),
    "all_lines_bullets": ("Answers that are a bullet list", "share"),
    "bullet_lines_per_answer": ("Bullet lines per answer", "number"),
}


def _fmt(value: object, kind: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return NO_VALUE
    return f"{value:.0%}" if kind == "share" else f"{value:.3g}"


def learned_frame(meta: dict) -> pd.DataFrame | None:
    """The training record's held-out measurements, base model against the fine-tune (None without any)."""
    rows = []
    metric = meta.get("metric") if isinstance(meta, dict) else None
    if isinstance(metric, dict) and isinstance(metric.get("adapter"), dict):
        base = metric.get("base") if isinstance(metric.get("base"), dict) else {}
        prompts = metric.get("held_out_prompts")
        where = f"{prompts} held-out prompts" if isinstance(prompts, int) else "held-out prompts"
        for key, value in metric["adapter"].items():
            label, kind = METRIC_LABELS.get(key, (key.replace("_", " ").capitalize(), "number"))
            rows.append({"Measured on": where, "What": label, "Base model": _fmt(base.get(key), kind),
                         "Fine-tuned": _fmt(value, kind)})
    if "held_out_loss" in meta:
        rows.append({"Measured on": "held-out target answers", "What": "Loss (nats per answer token)",
                     "Base model": _fmt(meta.get("held_out_loss_base"), "number"),
                     "Fine-tuned": _fmt(meta.get("held_out_loss"), "number")})
    return pd.DataFrame(rows) if rows else None


def training_line(meta: dict) -> str:
    """One line on how the adapter was trained ('' when the record says nothing usable)."""
    parts = []
    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    if isinstance(meta.get("steps"), int):
        parts.append(f"{meta['steps']} steps")
    if isinstance(meta.get("batch_size"), int):
        parts.append(f"batches of {meta['batch_size']}")
    if isinstance(data.get("train"), int):
        parts.append(f"{data['train']} training answers")
    if isinstance(meta.get("tokens_seen"), int):
        parts.append(f"{meta['tokens_seen']:,} tokens seen")
    if isinstance(meta.get("train_seconds"), (int, float)):
        parts.append(f"{meta['train_seconds']:.0f} s of training on the CPU")
    return ", ".join(parts)


def examples(meta: dict) -> list[dict[str, str]]:
    ex = meta.get("examples") if isinstance(meta, dict) else None
    if not isinstance(ex, list):
        return []
    return [{"prompt": str(e.get("prompt", "")), "base": str(e.get("base", "")), "adapted": str(e.get("adapted", ""))}
            for e in ex if isinstance(e, dict)]


# ---- the bench's file and the download -----------------------------------------------------------

def load_bench(device: str = "cpu", directory: Path = BENCH_DIR) -> pd.DataFrame | None:
    """bench/lora_merge.py's rows (rank, batch, merged and unmerged median ms, LoRA ms) for one device
    ('cpu' or 'cuda'), or None when the file is missing or not what the bench writes."""
    try:
        data = json.loads((directory / f"lora_merge_{device}.json").read_text())
        frame = pd.DataFrame([{"rank": int(r["rank"]), "batch": int(r["batch"]), "merged_ms": float(r["merged_ms"]),
                               "unmerged_ms": float(r["unmerged_ms"]),
                               "lora_ms": None if r.get("lora_ms") is None else float(r["lora_ms"])}
                              for r in data["rows"]])
        if frame.empty:
            return None
        frame["extra"] = frame["unmerged_ms"] / frame["merged_ms"] - 1
        frame.attrs.update(device=str(data.get("device_name", device)), weights=str(data.get("weights", "")),
                           graphs=bool(data.get("cuda_graphs", False)), dtype=str(data.get("dtype", "")),
                           threads=data.get("threads") if isinstance(data.get("threads"), int) else None)
        return frame
    except (OSError, ValueError, KeyError, TypeError):
        return None


def result_json(result: MergeResult) -> str:
    return json.dumps(result_dict(result), indent=1)
