"""What the three training scripts share: the data set, batches, the frozen tied LM head, the
optimiser schedule, held-out evaluation and the JSON training log."""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from engine.weights import LoadedWeights, load_weights
from training.generate_data import data_dir


@dataclass(frozen=True, slots=True)
class Conversation:
    tokens: torch.Tensor  # [n] int64
    prompt_len: int
    features: torch.Tensor  # [n, h] fp32: the target's final-normed hidden state per position


@dataclass(frozen=True, slots=True)
class DistillData:
    train: list[Conversation]
    held_out: list[Conversation]
    meta: dict


def load_data(held_out_fraction: float = 0.05, seed: int = 0) -> DistillData:
    """Every `<cache>/distill/data*.pt` (each written by generate_data with its `.meta.json`)."""
    root = data_dir()
    paths = sorted(root.glob("data*.pt"))
    if not paths:
        raise FileNotFoundError(f"no data in {root}: run `python -m training.generate_data` first")
    train, held_out, metas = [], [], []
    for path in paths:  # held out per file, so adding a file never moves a conversation into held-out
        raw = torch.load(path)
        convs = [Conversation(t.long(), p, f.float())
                 for t, p, f in zip(raw["tokens"], raw["prompt_lens"], raw["features"])]
        random.Random(seed).shuffle(convs)
        n_out = max(1, int(len(convs) * held_out_fraction))
        held_out += convs[:n_out]
        train += convs[n_out:]
        metas.append(json.loads(path.with_suffix(".meta.json").read_text()))
    k = len(held_out)
    meta = {key: sum(m[key] for m in metas) for key in ("conversations", "prompt_tokens", "generated_tokens",
                                                         "generation_seconds", "feature_seconds")}
    sources = list(dict.fromkeys(m["source"] for m in metas))
    meta |= {"max_tokens": metas[0]["max_tokens"], "decoding": metas[0]["decoding"], "source": ", ".join(sources),
             "files": [p.name for p in paths], "held_out_conversations": k}
    return DistillData(train, held_out, meta)


def base_parser(doc: str, *, epochs: float, lr: float, minutes: float) -> argparse.ArgumentParser:
    """The options every training script has: schedule length, peak learning rate, batch size in
    tokens, and a wall-clock cap (the cosine schedule is planned for `epochs`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=epochs)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--minutes", type=float, default=minutes)
    ap.add_argument("--eval-every", type=int, default=50,
                    help="steps between held-out evaluations (each costs several training steps' time)")
    return ap


def setup() -> tuple[DistillData, torch.Tensor, LoadedWeights]:
    """Seeded start: the distillation data and the target's frozen tied embedding and weights."""
    torch.manual_seed(0)
    data = load_data()
    embed, weights = frozen_embedding()
    return data, embed, weights


def batches(convs: list[Conversation], max_tokens: int, seed: int) -> Iterator[list[Conversation]]:
    """Shuffled groups of conversations of about `max_tokens` tokens in total."""
    order = list(convs)
    random.Random(seed).shuffle(order)
    group: list[Conversation] = []
    used = 0
    for c in order:
        if group and used + len(c.tokens) > max_tokens:
            yield group
            group, used = [], 0
        group.append(c)
        used += len(c.tokens)
    if group:
        yield group


def pad_stack(tensors: list[torch.Tensor], value: float = 0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)


def frozen_embedding() -> tuple[torch.Tensor, object]:
    """The target's tied embedding / LM head matrix [V, h] (fp32, no grad) and its config."""
    w = load_weights("real")
    return w.state_dict["model.embed_tokens.weight"].float().requires_grad_(False), w


def draft_vocab_head(embed: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The token loss over the drafters' vocabulary (`engine/speculative/draft_vocab.py`): the rows
    of the tied LM head the engine drafts with, and a map from a full-vocabulary label to its row
    (-100, ignored by the loss, for tokens outside; index -100 itself maps to -100). The softmax
    is then the one the engine drafts with, and the frozen head, most of a step, is 6x cheaper."""
    from engine.speculative.draft_vocab import draft_vocab_ids

    vocab = embed.shape[0]
    ids = draft_vocab_ids(size, vocab)
    ids = torch.arange(vocab) if ids is None else ids
    to_sub = torch.full((vocab + 100,), -100, dtype=torch.long)  # label -100 indexes an entry past the vocab
    to_sub[ids] = torch.arange(len(ids))
    return embed[ids], to_sub


def mixed_precision(enabled: bool):
    """bf16 autocast on the CPU: the frozen 49152 x 576 LM head dominates every step, and bf16 matmuls
    run about twice as fast on CPUs with AVX512-BF16; parameters, optimiser and loss stay fp32."""
    import contextlib

    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def cosine_lr(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def training_log(name: str) -> dict | None:
    """The committed JSON log of a head (None if there is none)."""
    from engine.speculative.heads import HEADS_DIR

    path = HEADS_DIR / f"{name}.log.json"
    return json.loads(path.read_text()) if path.exists() else None


def add_resume_option(ap: argparse.ArgumentParser, name: str) -> None:
    ap.add_argument("--resume", action="store_true",
                    help=f"start from the committed {name}.safetensors (its log is kept under 'resumed_from')")


def resume_committed(name: str, module: torch.nn.Module, config) -> dict:
    """Load the committed head `name` into `module`; returns its training log (the history a resumed
    run extends), or at least the summary stored with the weights."""
    from engine.speculative.heads import load_head

    trained, meta = load_head(name, config)
    module.load_state_dict(trained.state_dict())
    return training_log(name) or {"summary": meta}


def resumed_from(previous: dict | None) -> dict:
    """The config entry that records which committed run a resumed run started from."""
    if not previous:
        return {}
    return {"resumed_from": {k: previous[k] for k in ("config", "data", "summary") if k in previous}}


def cumulative_summary(previous: dict | None, summary: dict) -> dict:
    """A resumed run's summary plus the whole history's steps, tokens and minutes."""
    if not previous:
        return summary
    before = previous["summary"]
    return summary | {
        "steps_total": before.get("steps_total", before["steps"]) + summary["steps"],
        "tokens_seen_total": before.get("tokens_seen_total", before["tokens_seen"]) + summary["tokens_seen"],
        "train_minutes_total": round(before.get("train_minutes_total", before["train_minutes"])
                                     + summary["train_minutes"], 1)}


@dataclass
class TrainLog:
    name: str
    config: dict
    data: dict
    started: float = field(default_factory=time.time)
    entries: list[dict] = field(default_factory=list)

    def add(self, **entry: float) -> None:
        entry["elapsed_s"] = round(time.time() - self.started, 1)
        self.entries.append(entry)
        print(json.dumps(entry), flush=True)

    def write(self, directory: Path, summary: dict) -> Path:
        path = directory / f"{self.name}.log.json"
        path.write_text(json.dumps({"name": self.name, "config": self.config, "data": self.data,
                                    "summary": summary, "log": self.entries}, indent=1))
        return path


def train_loop(params: list[torch.nn.Parameter], loss_fn: Callable[[list[Conversation]], tuple[torch.Tensor, dict]],
               evaluate: Callable[[], dict], data: DistillData, log: TrainLog, *, epochs: float, lr: float,
               batch_tokens: int, minutes: float, eval_every: int = 50) -> dict:
    """AdamW with warm-up + cosine decay over `epochs` (stops early at `minutes`); returns the totals."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    per_epoch = sum(1 for _ in batches(data.train, batch_tokens, 0))
    total = max(1, int(per_epoch * epochs))
    t0 = time.time()
    step, tokens_seen = 0, 0
    epoch = 0
    log.add(step=0, **{f"held_out_{k}": round(v, 4) for k, v in evaluate().items()})  # where this run starts
    while step < total and time.time() - t0 < minutes * 60:
        for group in batches(data.train, batch_tokens, seed=epoch):
            if step >= total or time.time() - t0 >= minutes * 60:
                break
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, total, lr)
            loss, stats = loss_fn(group)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            tokens_seen += sum(len(c.tokens) for c in group)
            step += 1
            if step % 10 == 0:
                log.add(step=step, loss=round(float(loss.detach()), 4), **{k: round(v, 4) for k, v in stats.items()})
            if step % eval_every == 0:
                log.add(step=step, **{f"held_out_{k}": round(v, 4) for k, v in evaluate().items()})
        epoch += 1
    final = evaluate()
    log.add(step=step, **{f"held_out_{k}": round(v, 4) for k, v in final.items()})
    return {"steps": step, "planned_steps": total, "epochs_seen": round(step / per_epoch, 2),
            "tokens_seen": tokens_seen, "train_minutes": round((time.time() - t0) / 60, 1),
            **{f"held_out_{k}": round(v, 4) for k, v in final.items()}}
