"""Train Medusa heads by self-distillation: head k on the target's feature at t learns the token the
target itself chose at t + 2 + k (greedy data, so that is the target's argmax there). The loss is
over the drafters' vocabulary (`--draft-vocab`, as the engine drafts; held-out figures use the
full vocabulary, comparable across runs).

`python -m training.train_medusa [--heads 4] [--epochs 2] [--minutes 20]`
Writes engine/assets/spec_heads/medusa.safetensors (fp16) and medusa.log.json.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.speculative.heads import HEADS_DIR, MedusaHeads, save_head
from training.common import (Conversation, TrainLog, add_resume_option, base_parser, cumulative_summary,
                             draft_vocab_head, mixed_precision, resume_committed, resumed_from, setup, train_loop)
def head_rows(convs: list[Conversation], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features at t, token at t + 2 + k) for every t whose label is an answer token."""
    feats, labels = [], []
    for c in convs:
        n = len(c.tokens)
        first = max(0, c.prompt_len - 2 - k)  # label index t + 2 + k >= prompt_len
        if n - 2 - k <= first:
            continue
        feats.append(c.features[first:n - 2 - k])
        labels.append(c.tokens[first + 2 + k:n])
    return torch.cat(feats), torch.cat(labels)


def main() -> None:
    ap = base_parser(__doc__, epochs=2.0, lr=1e-3, minutes=20.0)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward pass (about 2x faster)")
    ap.add_argument("--draft-vocab", type=int, default=8192,
                    help="vocabulary of the training loss (the engine drafts over it); 0 = all 49152")
    add_resume_option(ap, "medusa")
    args = ap.parse_args()
    data, embed, weights = setup()
    heads = MedusaHeads(weights.config, args.heads)
    previous = None
    if args.resume:
        previous = resume_committed("medusa", heads, weights.config)
    decay = [0.8 ** k for k in range(args.heads)]  # Medusa's per-head weights: later heads matter less
    head, to_sub = draft_vocab_head(embed, args.draft_vocab)

    def loss_fn(group: list[Conversation]) -> tuple[torch.Tensor, dict]:
        total = torch.zeros(())
        stats = {}
        for k in range(args.heads):
            f, y = head_rows(group, k)
            y = to_sub[y]
            with mixed_precision(args.bf16):
                logits = heads.forward(f)[k] @ head.T
            loss = F.cross_entropy(logits.float(), y, ignore_index=-100)
            total = total + decay[k] * loss
            stats[f"acc{k}"] = float((logits.argmax(-1) == y).float().mean())
        return total, stats

    @torch.no_grad()
    def evaluate() -> dict:
        out = {}
        for k in range(args.heads):
            f, y = head_rows(data.held_out, k)
            logits = heads.forward(f)[k] @ embed.T
            top = logits.topk(3, dim=-1).indices
            out[f"top1_head{k}"] = float((top[:, 0] == y).float().mean())
            out[f"top3_head{k}"] = float((top == y[:, None]).any(-1).float().mean())
        return out

    log = TrainLog("medusa", vars(args) | resumed_from(previous), data.meta)
    summary = train_loop(list(heads.parameters()), loss_fn, evaluate, data, log, epochs=args.epochs, lr=args.lr,
                         batch_tokens=args.batch_tokens, minutes=args.minutes, eval_every=args.eval_every)
    summary = cumulative_summary(previous, summary)
    meta = {"num_heads": args.heads, "trained_on": data.meta, **summary}
    print(save_head(heads, "medusa", meta), log.write(HEADS_DIR, summary))


if __name__ == "__main__":
    main()
