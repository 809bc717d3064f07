"""Train the EAGLE layer by self-distillation: from (target feature at i, embedding of token i + 1)
predict the target's feature at i + 1 (smooth-L1 regression) and, through the tied LM head, the
token the target chose at i + 2 (cross-entropy), as in EAGLE-1 (loss = L_reg + w L_cls, w = 0.1 there). Input
features get a little noise so that drafting on the layer's own predicted features, several steps
deep, stays in distribution.

`python -m training.train_eagle [--epochs 3] [--minutes 25]`
Writes engine/assets/spec_heads/eagle.safetensors (fp16) and eagle.log.json.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.speculative.heads import HEADS_DIR, EagleLayer, RopeTables, save_head
from training.common import (Conversation, TrainLog, add_resume_option, base_parser, cumulative_summary,
                             mixed_precision, pad_stack, resume_committed, resumed_from, setup, train_loop)
def batch_tensors(convs: list[Conversation], embed: torch.Tensor):
    """Padded [B, T] rows i = 0..n-2 per conversation, with targets and masks."""
    feats = pad_stack([c.features[:-1] for c in convs])
    toks = pad_stack([c.tokens[1:] for c in convs])
    target_f = pad_stack([c.features[1:] for c in convs])
    labels = pad_stack([torch.cat([c.tokens[2:], torch.tensor([-100])]) for c in convs], value=-100)
    mask = torch.zeros(labels.shape, dtype=torch.bool)
    for b, c in enumerate(convs):  # loss on rows whose label (token i + 2) is an answer token
        mask[b, max(0, c.prompt_len - 2):len(c.tokens) - 2] = True
    labels = torch.where(mask, labels, torch.full_like(labels, -100))
    return feats, embed[toks], target_f, labels, mask


def main() -> None:
    ap = base_parser(__doc__, epochs=3.0, lr=5e-4, minutes=25.0)
    ap.add_argument("--noise", type=float, default=0.1, help="uniform noise on input features (x feature RMS)")
    ap.add_argument("--init-layer", type=int, default=29, help="target layer the decoder layer starts from")
    ap.add_argument("--cls-weight", type=float, default=0.1, help="weight of the token loss (EAGLE-1: 0.1)")
    add_resume_option(ap, "eagle")
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast in training steps (about 2x slower)")
    args = ap.parse_args()
    data, embed, weights = setup()
    cfg = weights.config
    eagle = EagleLayer(cfg)
    eagle.layer.load_from_target(weights.state_dict, args.init_layer)
    eagle.norm.weight.data.copy_(weights.state_dict["model.norm.weight"].float())
    previous = None
    if args.resume:
        previous = resume_committed("eagle", eagle, cfg)
    rope = RopeTables(cfg, 4096)
    rms = float(torch.cat([c.features for c in data.train[:50]]).pow(2).mean().sqrt())

    def run(group: list[Conversation], noise: float, bf16: bool = False):
        feats, tok_emb, target_f, labels, mask = batch_tensors(group, embed)
        if noise:
            feats = feats + (torch.rand_like(feats) * 2 - 1) * noise * rms
        pos = torch.arange(feats.shape[1])[None].expand(feats.shape[0], -1)
        cos, sin = rope(pos)
        with mixed_precision(bf16):
            pred, _, _ = eagle(feats, tok_emb, cos, sin)
            logits = pred[mask] @ embed.T
        return pred[mask].float(), target_f[mask], logits.float(), labels[mask]

    def loss_fn(group: list[Conversation]) -> tuple[torch.Tensor, dict]:
        pred, tf, logits, y = run(group, args.noise, bf16=not args.fp32)
        reg = F.smooth_l1_loss(pred, tf)
        cls = F.cross_entropy(logits, y)
        return reg + args.cls_weight * cls, {"reg": float(reg), "cls": float(cls), "acc": float((logits.argmax(-1) == y).float().mean())}

    @torch.no_grad()
    def evaluate() -> dict:
        pred, tf, logits, y = run(data.held_out, 0.0)
        top = logits.topk(3, dim=-1).indices
        return {"top1": float((top[:, 0] == y).float().mean()), "top3": float((top == y[:, None]).any(-1).float().mean()),
                "reg": float(F.smooth_l1_loss(pred, tf))}

    log = TrainLog("eagle", vars(args) | resumed_from(previous), data.meta)
    summary = train_loop(list(eagle.parameters()), loss_fn, evaluate, data, log, epochs=args.epochs, lr=args.lr,
                         batch_tokens=args.batch_tokens, minutes=args.minutes)
    summary = cumulative_summary(previous, summary)  # the whole history: steps and tokens of every run
    meta = {"init_layer": args.init_layer, "trained_on": data.meta, **summary}
    print(save_head(eagle, "eagle", meta), log.write(HEADS_DIR, summary))


if __name__ == "__main__":
    main()
