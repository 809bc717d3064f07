"""Train the EAGLE layer by self-distillation: from (target feature at i, embedding of token i + 1)
predict the target's feature at i + 1 (smooth-L1 regression) and, through the tied LM head, the
token the target chose at i + 2 (cross-entropy), as in EAGLE-1 (loss = L_reg + w L_cls, w = 0.1 there).

Drafting feeds the layer's own predicted features back in, several levels deep, and that is where
acceptance is lost: a layer trained only on the target's true features has never seen its own
errors. `--ttt-steps K` (K > 1) trains as EAGLE-3's "training-time test" does: the layer is unrolled
K times over every position. Step k's row i reads the feature step k - 1 predicted for that row and
the true token i + k + 1, sits at position i + k, and attends to the true context (step 0's rows
0..i) plus its own chain (the same row of steps 1..k - 1): exactly the keys a depth-k tree node sees
in the engine. Step k's losses are weighted `ttt_decay ** k`. With K = 1 only step 0 is trained and
the input features get a little uniform noise instead (the EAGLE-1 recipe).

The token loss uses the drafters' vocabulary (`--draft-vocab`, the engine's default 8192 most
frequent answer tokens), the softmax the engine drafts with, which also makes the frozen LM head,
most of a training step, 6x cheaper.

`python -m training.train_eagle [--epochs 3] [--minutes 25] [--ttt-steps 1] [--resume]`. The committed layer
is two runs (README): EAGLE-1 steps first (cheap: ~0.4 s a step), then `--resume --ttt-steps 5`.
Writes engine/assets/spec_heads/eagle.safetensors (fp16) and eagle.log.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from engine.speculative.heads import HEADS_DIR, EagleLayer, RopeTables, save_head
from training.common import (Conversation, TrainLog, add_resume_option, base_parser, cumulative_summary,
                             draft_vocab_head, mixed_precision, pad_stack, resume_committed, resumed_from, setup, train_loop)


@dataclass(frozen=True, slots=True)
class StepRows:
    """Unroll step k over a padded group: row i's input token (i + k + 1), target feature (i + k + 1),
    label (token i + k + 2, -100 where it is not an answer token or past the end)."""
    tokens: torch.Tensor  # [B, T] int64
    target_features: torch.Tensor  # [B, T, h]
    labels: torch.Tensor  # [B, T] int64


def step_rows(convs: list[Conversation], k: int, width: int) -> StepRows:
    b, h = len(convs), convs[0].features.shape[1]
    toks = torch.zeros(b, width, dtype=torch.long)
    target_f = torch.zeros(b, width, h)
    labels = torch.full((b, width), -100, dtype=torch.long)
    for r, c in enumerate(convs):
        n = len(c.tokens)
        toks[r, :max(0, n - 1 - k)] = c.tokens[1 + k:]
        target_f[r, :max(0, n - 1 - k)] = c.features[1 + k:]
        first = max(0, c.prompt_len - 2 - k)  # the label (token i + k + 2) is an answer token from here on
        if n - 2 - k > first:
            labels[r, first:n - 2 - k] = c.tokens[first + k + 2:]
    return StepRows(toks, target_f, labels)


def unroll_mask(width: int, step: int) -> torch.Tensor:
    """[1, T, (step + 1) T] bool: step 0's keys causally, then the row's own key of every later step."""
    eye = torch.eye(width, dtype=torch.bool)
    return torch.cat([torch.ones(width, width, dtype=torch.bool).tril(), *([eye] * step)], dim=1)[None]


def unrolled_features(eagle: EagleLayer, feats: torch.Tensor, step_embeds: Callable[[int], torch.Tensor],
                      rope: RopeTables, steps: int) -> Iterator[torch.Tensor]:
    """Step k's predicted features [B, T, h] for k = 0..steps-1. feats [B, T, h]: the true features
    of positions 0..T-1; step_embeds(k) [B, T, h]: the embeddings of tokens i + k + 1. Row i of step k
    sits at position i + k and attends to step 0's rows 0..i and its own rows of steps 1..k."""
    b, width = feats.shape[:2]
    pos = torch.arange(width, device=feats.device)[None].expand(b, -1)
    past_k: list[torch.Tensor] = []
    past_v: list[torch.Tensor] = []
    for k in range(steps):
        cos, sin = rope(pos + k)
        past = None if k == 0 else (torch.cat(past_k, 2), torch.cat(past_v, 2))
        mask = None if k == 0 else unroll_mask(width, k).to(feats.device)
        pred, key, val = eagle(feats, step_embeds(k), cos, sin, mask, past)
        past_k.append(key)
        past_v.append(val)
        yield pred
        feats = pred.float()  # the next step reads this step's prediction for the same row


def main() -> None:
    ap = base_parser(__doc__, epochs=3.0, lr=5e-4, minutes=25.0)
    ap.add_argument("--noise", type=float, default=0.1,
                    help="uniform noise on step 0's input features (x feature RMS); used when --ttt-steps is 1")
    ap.add_argument("--init-layer", type=int, default=29, help="target layer the decoder layer starts from")
    ap.add_argument("--cls-weight", type=float, default=0.1, help="weight of the token loss (EAGLE-1: 0.1)")
    ap.add_argument("--ttt-steps", type=int, default=1, help="unroll steps (training-time test); 1 = EAGLE-1")
    ap.add_argument("--ttt-decay", type=float, default=0.8, help="loss weight of unroll step k: decay ** k")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="token-loss vocabulary; 0 = all 49152")
    add_resume_option(ap, "eagle")
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast in training steps (about 2x slower)")
    args = ap.parse_args()
    if args.ttt_steps < 1:
        ap.error("--ttt-steps must be >= 1")
    data, embed, weights = setup()
    cfg = weights.config
    eagle = EagleLayer(cfg)
    eagle.layer.load_from_target(weights.state_dict, args.init_layer)
    eagle.norm.weight.data.copy_(weights.state_dict["model.norm.weight"].float())
    previous = None
    if args.resume:
        previous = resume_committed("eagle", eagle, cfg)
    rope = RopeTables(cfg, 4096 + args.ttt_steps)
    rms = float(torch.cat([c.features for c in data.train[:50]]).pow(2).mean().sqrt())
    head, to_sub = draft_vocab_head(embed, args.draft_vocab)

    def run(group: list[Conversation], noise: float, bf16: bool = False) -> list[tuple[torch.Tensor, ...]]:
        """Per unroll step, for the rows with a label: (predicted features, target features,
        draft-vocab logits, labels as full-vocabulary token ids)."""
        width = max(len(c.tokens) for c in group) - 1
        feats = pad_stack([c.features[:-1] for c in group])
        if noise and args.ttt_steps == 1:
            feats = feats + (torch.rand_like(feats) * 2 - 1) * noise * rms
        steps = [step_rows(group, k, width) for k in range(args.ttt_steps)]
        out = []
        with mixed_precision(bf16):
            preds = unrolled_features(eagle, feats, lambda k: embed[steps[k].tokens], rope, args.ttt_steps)
            for rows, pred in zip(steps, preds):
                keep = rows.labels >= 0
                logits = pred[keep] @ head.T
                out.append((pred[keep].float(), rows.target_features[keep], logits.float(), rows.labels[keep]))
        return out

    def loss_fn(group: list[Conversation]) -> tuple[torch.Tensor, dict]:
        total, stats = 0.0, {}
        for k, (pred, tf, logits, labels) in enumerate(run(group, args.noise, bf16=not args.fp32)):
            y = to_sub[labels]
            reg = F.smooth_l1_loss(pred, tf)
            cls = F.cross_entropy(logits, y, ignore_index=-100)
            total = total + args.ttt_decay ** k * (reg + args.cls_weight * cls)
            sfx = "" if k == 0 else f"_step{k + 1}"
            stats |= {f"reg{sfx}": float(reg.detach()), f"cls{sfx}": float(cls.detach()), f"acc{sfx}": float((logits.argmax(-1) == y).float().mean())}
        return total, stats

    @torch.no_grad()
    def evaluate() -> dict:
        """Held-out: top-1 / top-3 of step 0 over the full vocabulary (comparable across runs), and
        top-1 over the draft vocabulary at every unroll depth (what the tree's levels achieve)."""
        steps = run(data.held_out, 0.0)
        pred, tf, _, y = steps[0]
        top = (pred @ embed.T).topk(3, dim=-1).indices
        res = {"top1": float((top[:, 0] == y).float().mean()), "top3": float((top == y[:, None]).any(-1).float().mean()),
               "reg": float(F.smooth_l1_loss(pred, tf))}
        for k, (_, _, logits, labels) in enumerate(steps):
            res[f"draft_top1_step{k + 1}"] = float((logits.argmax(-1) == to_sub[labels]).float().mean())
        return res

    log = TrainLog("eagle", vars(args) | resumed_from(previous), data.meta)
    summary = train_loop(list(eagle.parameters()), loss_fn, evaluate, data, log, epochs=args.epochs, lr=args.lr,
                         batch_tokens=args.batch_tokens, minutes=args.minutes, eval_every=args.eval_every)
    summary = cumulative_summary(previous, summary)  # the whole history: steps and tokens of every run
    meta = {"init_layer": args.init_layer, "trained_on": data.meta, **summary}
    print(save_head(eagle, "eagle", meta), log.write(HEADS_DIR, summary))


if __name__ == "__main__":
    main()
