"""Train the bundled LoRA adapters (pirate, terse, bullets) on the live model, on the CPU.

Self-distillation (see `lora_data.py`): the targets are the model's own greedy answers rewritten by
one deterministic transform. The model is transformers' Llama built from our weights
(`hf_reference_model`, fp32, frozen); every targeted `nn.Linear` of every layer is wrapped by a
`LoraLinear` that adds scale * B (A x) (A small random, B zero: training starts at the base model
exactly; scale = alpha / r with alpha = 2r). The loss is cross-entropy on the answer tokens and the
closing <|im_end|> only; the prompt is chat-templated with the generation prompt exactly as the
engine does. AdamW with warm-up and cosine decay; 90 % of the prompts train, 10 % are held out for
the loss and for a behaviour metric measured by greedy generation with and without the adapter.

    python -m training.train_lora --adapter pirate|terse|bullets|all [--steps N --rank R --lr LR]

Writes `engine/assets/adapters/<name>.safetensors` (fp16, `engine.lora.adapter.save_adapter`), the
training record (data, schedule, losses, metric vs the base model, examples) in its metadata.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from engine.lora.adapter import ADAPTERS_DIR, TARGETS, LoraAdapter, save_adapter
from training.lora_data import (Example, has_code, load_examples, sentence_ends, split_sentences, to_bullets,
                                to_pirate, to_terse)

IM_END_ID = 2  # <|im_end|>: closes the assistant's turn
ATTN = ("q", "k", "v", "o")


# ----------------------------------------------------------------------------------- the LoRA wrapper


class LoraLinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable low-rank update: y = W x + scale * B (A x)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        w = base.weight
        self.A = nn.Parameter(torch.empty(rank, base.in_features, dtype=w.dtype, device=w.device))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=w.dtype, device=w.device))
        # Kaiming-uniform A, as nn.Linear (and peft) initialise a weight of this shape; B = 0.
        bound = 1.0 / math.sqrt(base.in_features)
        with torch.no_grad():
            self.A.uniform_(-bound, bound, generator=generator)
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if not self.enabled:
            return y
        return y + self.scale * ((x @ self.A.T) @ self.B.T)


def _parent(model: nn.Module, layer: int, target: str) -> nn.Module:
    block = model.model.layers[layer]
    return block.self_attn if target in ATTN else block.mlp


def add_lora(model: nn.Module, rank: int, targets: tuple[str, ...] = TARGETS, alpha: float | None = None,
             seed: int = 0) -> dict[tuple[int, str], LoraLinear]:
    """Freeze `model` (an HF Llama) and wrap every targeted linear of every layer; returns the wrappers
    by (layer, target)."""
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    alpha = float(2 * rank if alpha is None else alpha)
    wrappers = {}
    for layer in range(len(model.model.layers)):
        for t in targets:
            parent = _parent(model, layer, t)
            wrapped = LoraLinear(getattr(parent, f"{t}_proj"), rank, alpha, g)
            setattr(parent, f"{t}_proj", wrapped)
            wrappers[(layer, t)] = wrapped
    return wrappers


def set_lora_enabled(wrappers: dict[tuple[int, str], LoraLinear], enabled: bool) -> None:
    for w in wrappers.values():
        w.enabled = enabled


def to_adapter(wrappers: dict[tuple[int, str], LoraLinear], name: str, description: str = "",
               meta: dict | None = None) -> LoraAdapter:
    """The trained wrappers as a `LoraAdapter` (fp32 copies)."""
    first = next(iter(wrappers.values()))
    targets = tuple(t for t in TARGETS if any(t == k[1] for k in wrappers))
    weights = {k: (w.A.detach().float().clone(), w.B.detach().float().clone()) for k, w in wrappers.items()}
    return LoraAdapter(name, first.rank, first.alpha, targets, weights, description, dict(meta or {}))


# ----------------------------------------------------------------------------------- the adapters


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    name: str
    transform: Callable[[str], str]
    rank: int
    targets: tuple[str, ...]
    description: str
    steps: int
    keep: Callable[[str], bool]  # which base answers the rewrite suits (the others are left out)


SPECS = {
    "pirate": AdapterSpec("pirate", to_pirate, 8, TARGETS,
                          "Talks like a pirate: opens with 'Ahoy, matey!', says ye/yer/me/aye/be, ends with 'Arr!'",
                          steps=120, keep=lambda a: True),
    "terse": AdapterSpec("terse", to_terse, 4, TARGETS,
                         "Terse: answers with the first sentence only, then ends its turn",
                         steps=150, keep=lambda a: not has_code(a) and bool(sentence_ends(a))),
    "bullets": AdapterSpec("bullets", to_bullets, 8, ATTN,
                           "Bullet points: answers as a markdown list, one '- ' line per sentence (at most 5)",
                           steps=120, keep=lambda a: not has_code(a)),
}


# ----------------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Item:
    prompt: str
    base_answer: str
    target: str
    ids: list[int]
    prompt_len: int


def encode(tok, prompt: str, target: str, max_target_tokens: int) -> tuple[list[int], int]:  # noqa: ANN001
    """Chat-templated prompt (with the generation prompt, as the engine builds it) + target + <|im_end|>."""
    p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    t = (tok.encode(target) + [IM_END_ID])[:max_target_tokens]
    return list(p) + t, len(p)


def split(examples: list[Example], held_out_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    order = list(examples)
    random.Random(seed).shuffle(order)
    n_out = max(1, round(len(order) * held_out_fraction))
    return order[n_out:], order[:n_out]


def make_items(tok, examples: list[Example], spec: AdapterSpec, max_target_tokens: int) -> list[Item]:  # noqa: ANN001
    items = []
    for e in examples:
        if not spec.keep(e.answer):
            continue
        target = spec.transform(e.answer)
        ids, n = encode(tok, e.prompt, target, max_target_tokens)
        items.append(Item(e.prompt, e.answer, target, ids, n))
    return items


def collate(items: list[Item]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and next-token labels (-100 outside the answer + <|im_end|>)."""
    n = max(len(i.ids) for i in items)
    ids = torch.full((len(items), n), IM_END_ID, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    labels = torch.full((len(items), n), -100, dtype=torch.long)
    for r, it in enumerate(items):
        ids[r, :len(it.ids)] = torch.tensor(it.ids)
        mask[r, :len(it.ids)] = 1
        # position j predicts token j + 1: the answer's tokens are predicted from prompt_len - 1 on
        labels[r, it.prompt_len - 1:len(it.ids) - 1] = torch.tensor(it.ids[it.prompt_len:])
    return ids, mask, labels


def answer_loss(model: nn.Module, items: list[Item]) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the answer tokens (the LM head runs on those positions only)."""
    ids, mask, labels = collate(items)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = labels != -100
    logits = model.lm_head(hidden[keep])
    return nn.functional.cross_entropy(logits.float(), labels[keep]), int(keep.sum())


@torch.no_grad()
def held_out_loss(model: nn.Module, items: list[Item], batch: int = 8) -> float:
    total, count = 0.0, 0
    for i in range(0, len(items), batch):
        loss, n = answer_loss(model, items[i:i + batch])
        total += float(loss) * n
        count += n
    return total / max(1, count)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))))


# ----------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def greedy_answers(model: nn.Module, tok, prompts: list[str], max_new_tokens: int, batch: int = 16) -> list[str]:  # noqa: ANN001
    """Greedy answers through the HF model (left-padded batches, stop at <|im_end|>)."""
    out = []
    for i in range(0, len(prompts), batch):
        enc = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
               for p in prompts[i:i + batch]]
        n = max(len(e) for e in enc)
        ids = torch.tensor([[IM_END_ID] * (n - len(e)) + list(e) for e in enc])
        mask = torch.tensor([[0] * (n - len(e)) + [1] * len(e) for e in enc])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=IM_END_ID, pad_token_id=IM_END_ID)
        for row in gen[:, n:].tolist():
            if IM_END_ID in row:
                row = row[:row.index(IM_END_ID)]
            out.append(tok.decode(row, skip_special_tokens=True).strip())
    return out


def _is_bullet_list(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return bool(lines) and all(ln.startswith("- ") for ln in lines)


def metric(name: str, answers: list[str]) -> dict[str, float]:
    """The behaviour each adapter should show, measured on a list of answers."""
    n = max(1, len(answers))
    if name == "pirate":
        return {"starts_with_ahoy": sum(a.startswith("Ahoy") for a in answers) / n,
                "ends_with_arr": sum(a.rstrip().endswith("Arr!") for a in answers) / n}
    if name == "terse":
        return {"sentences_per_answer": sum(len(split_sentences(a)) for a in answers) / n,
                "words_per_answer": sum(len(a.split()) for a in answers) / n}
    if name == "bullets":
        return {"all_lines_bullets": sum(_is_bullet_list(a) for a in answers) / n,
                "bullet_lines_per_answer": sum(sum(ln.startswith("- ") for ln in a.splitlines()) for a in answers) / n}
    raise ValueError(name)


def base_answers(model: nn.Module, wrappers, tok, prompts: list[str], max_new_tokens: int) -> list[str]:  # noqa: ANN001
    """The base model's greedy answers (the adapter switched off), cached per prompt in
    `<cache>/lora/base_answers.json`: the three adapters share held-out prompts, and on a busy 2-core
    box each generation pass costs minutes."""
    from training.lora_data import data_path

    path = data_path().parent / "base_answers.json"
    cache = json.loads(path.read_text()) if path.is_file() else {}
    known = cache.setdefault(str(max_new_tokens), {})
    missing = [p for p in prompts if p not in known]
    if missing:
        set_lora_enabled(wrappers, False)
        try:
            known.update(zip(missing, greedy_answers(model, tok, missing, max_new_tokens)))
        finally:
            set_lora_enabled(wrappers, True)
        path.write_text(json.dumps(cache, indent=1, ensure_ascii=False))
    return [known[p] for p in prompts]


# ----------------------------------------------------------------------------------- training


def train(spec: AdapterSpec, *, steps: int, rank: int, lr: float, batch_size: int, held_out_fraction: float,
          max_target_tokens: int, eval_max_tokens: int, minutes: float, seed: int, out_dir: Path) -> LoraAdapter:
    from engine.weights import hf_reference_model, load_weights

    torch.manual_seed(seed)
    weights = load_weights("real")
    tok = weights.tokenizer
    examples, data_meta = load_examples()
    train_ex, held_ex = split(examples, held_out_fraction, seed)
    train_items = make_items(tok, train_ex, spec, max_target_tokens)
    held_items = make_items(tok, held_ex, spec, max_target_tokens)
    model = hf_reference_model(weights)
    wrappers = add_lora(model, rank, spec.targets, seed=seed)
    params = [p for w in wrappers.values() for p in (w.A, w.B)]
    alpha = 2.0 * rank
    print(f"[{spec.name}] rank {rank}, alpha {alpha}, targets {spec.targets}: "
          f"{sum(p.numel() for p in params):,} parameters; {len(train_items)} train / {len(held_items)} held out",
          flush=True)

    held_before = held_out_loss(model, held_items)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    warmup = max(1, min(20, steps // 10))
    rng = random.Random(seed)
    order: list[Item] = []
    losses: list[float] = []
    tokens_seen = 0
    t0 = time.perf_counter()
    model.train()
    step, capped = 0, False
    for step in range(steps):
        if time.perf_counter() - t0 > minutes * 60:
            print(f"[{spec.name}] stopping at the {minutes}-minute cap after {step} steps", flush=True)
            capped = True
            break
        if len(order) < batch_size:
            more = list(train_items)
            rng.shuffle(more)
            order += more
        group, order = order[:batch_size], order[batch_size:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        loss, n = answer_loss(model, group)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        tokens_seen += sum(len(i.ids) for i in group)
        if (step + 1) % 10 == 0 or step == 0:
            print(f"[{spec.name}] step {step + 1}/{steps} loss {losses[-1]:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    else:
        step = steps
    train_seconds = time.perf_counter() - t0
    model.eval()
    held_after = held_out_loss(model, held_items)

    t1 = time.perf_counter()
    prompts = [i.prompt for i in held_items]
    adapted = greedy_answers(model, tok, prompts, eval_max_tokens)
    base = base_answers(model, wrappers, tok, prompts, eval_max_tokens)
    eval_seconds = time.perf_counter() - t1
    m_adapted, m_base = metric(spec.name, adapted), metric(spec.name, base)
    print(f"[{spec.name}] held-out loss {held_before:.4f} -> {held_after:.4f}; metric adapter {m_adapted} "
          f"base {m_base} ({eval_seconds:.0f} s)", flush=True)

    picks = random.Random(seed).sample(range(len(prompts)), min(3, len(prompts)))
    curve = [round(sum(losses[i:i + 10]) / len(losses[i:i + 10]), 4) for i in range(0, len(losses), 10)]
    meta = {
        "data": {"source": data_meta.get("source"), "prompts": len(examples), "train": len(train_items),
                 "held_out": len(held_items), "left_out_answers": len(examples) - len(train_items) - len(held_items),
                 "train_tokens": sum(len(i.ids) for i in train_items),
                 "train_answer_tokens": sum(len(i.ids) - i.prompt_len for i in train_items),
                 "held_out_answer_tokens": sum(len(i.ids) - i.prompt_len for i in held_items),
                 "answer_max_tokens": data_meta.get("max_tokens"), "max_target_tokens": max_target_tokens,
                 "decoding": "greedy", "transform": f"training.lora_data.{spec.transform.__name__}"},
        "steps": step, "planned_steps": steps,
        "stopped_by": f"the {minutes}-minute wall-clock cap" if capped else "the planned steps",
        "lr_at_last_step": round(lr_at(step - 1, steps, lr, warmup), 6),
        "batch_size": batch_size, "tokens_seen": tokens_seen, "rank": rank, "alpha": alpha,
        "targets": list(spec.targets), "lr": lr, "warmup_steps": warmup, "schedule": "linear warm-up, cosine to 0.1x",
        "optimizer": "AdamW (betas 0.9, 0.99, no weight decay), grad clip 1.0", "model_dtype": "float32",
        "train_loss_first": round(losses[0], 4), "train_loss_last": round(sum(losses[-10:]) / len(losses[-10:]), 4),
        "train_loss_curve_per_10_steps": curve,
        "held_out_loss_base": round(held_before, 4), "held_out_loss": round(held_after, 4),
        "train_seconds": round(train_seconds, 1), "eval_seconds": round(eval_seconds, 1),
        "eval_max_new_tokens": eval_max_tokens,
        "metric": {"adapter": {k: round(v, 4) for k, v in m_adapted.items()},
                   "base": {k: round(v, 4) for k, v in m_base.items()}, "held_out_prompts": len(prompts)},
        "examples": [{"prompt": prompts[i], "base": base[i], "adapted": adapted[i]} for i in picks],
    }
    adapter = to_adapter(wrappers, spec.name, spec.description, meta)
    adapter.validate(weights.config)
    path = out_dir / f"{spec.name}.safetensors"
    save_adapter(adapter, path)
    print(f"[{spec.name}] wrote {path} ({path.stat().st_size / 1e6:.2f} MB)", flush=True)
    print(json.dumps({k: meta[k] for k in ("steps", "train_loss_first", "train_loss_last", "held_out_loss_base",
                                            "held_out_loss", "train_seconds", "metric")}, indent=1), flush=True)
    return adapter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", choices=(*SPECS, "all"), required=True)
    ap.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the adapter's own)")
    ap.add_argument("--rank", type=int, default=None, help="LoRA rank (default: the adapter's own); alpha = 2 x rank")
    ap.add_argument("--targets", default=None, help="comma-separated, e.g. q,k,v,o (default: the adapter's own)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--held-out", type=float, default=0.1, help="fraction of the prompts held out")
    ap.add_argument("--max-target-tokens", type=int, default=128, help="answer tokens (+ <|im_end|>) kept per example")
    ap.add_argument("--eval-max-tokens", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=6.5, help="wall-clock cap on the training loop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=ADAPTERS_DIR)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in (SPECS if args.adapter == "all" else [args.adapter]):
        spec = SPECS[name]
        if args.targets:
            spec = AdapterSpec(spec.name, spec.transform, spec.rank, tuple(args.targets.split(",")),
                               spec.description, spec.steps, spec.keep)
        train(spec, steps=args.steps or spec.steps, rank=args.rank or spec.rank, lr=args.lr,
              batch_size=args.batch_size, held_out_fraction=args.held_out, max_target_tokens=args.max_target_tokens,
              eval_max_tokens=args.eval_max_tokens, minutes=args.minutes, seed=args.seed, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
