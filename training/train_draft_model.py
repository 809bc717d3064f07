"""Distil a small draft model from SmolLM2-135M: a few decoder layers (started as copies of the
target's first layers, i.e. the early-exit drafter) and a final norm, on the target's tied
embeddings, trained to match the target's next-token distribution (KL to softmax of the target's
logits, recomputed from the recorded features) on text the target generated.

`python -m training.train_draft_model [--layers 2] [--epochs 2] [--minutes 20]`
Writes engine/assets/spec_heads/draft_model.safetensors (fp16, layers + norm only) and its log.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.speculative.heads import HEADS_DIR, DraftLayers, RopeTables, save_head
from training.common import Conversation, TrainLog, base_parser, mixed_precision, pad_stack, setup, train_loop
def main() -> None:
    ap = base_parser(__doc__, epochs=2.0, lr=3e-4, minutes=20.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast in training steps (about 2x slower)")
    args = ap.parse_args()
    data, embed, weights = setup()
    cfg = weights.config
    draft = DraftLayers(cfg, args.layers)
    for i, layer in enumerate(draft.layers):
        layer.load_from_target(weights.state_dict, i)
    draft.norm.weight.data.copy_(weights.state_dict["model.norm.weight"].float())
    rope = RopeTables(cfg, 4096)

    def run(group: list[Conversation], bf16: bool = False):
        toks = pad_stack([c.tokens for c in group])
        pos = torch.arange(toks.shape[1])[None].expand(toks.shape[0], -1)
        cos, sin = rope(pos)
        mask = torch.zeros(toks.shape, dtype=torch.bool)
        for b, c in enumerate(group):  # rows that predict an answer token
            mask[b, max(0, c.prompt_len - 1):len(c.tokens) - 1] = True
        with mixed_precision(bf16):
            hidden = draft(embed[toks], cos, sin)
            student = hidden[mask] @ embed.T
        with torch.no_grad():
            teacher = pad_stack([c.features for c in group])[mask] @ embed.T
        return student.float(), teacher

    def loss_fn(group: list[Conversation]) -> tuple[torch.Tensor, dict]:
        student, teacher = run(group, bf16=not args.fp32)
        kl = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean")
        return kl, {"agree": float((student.argmax(-1) == teacher.argmax(-1)).float().mean())}

    @torch.no_grad()
    def evaluate() -> dict:
        student, teacher = run(data.held_out)
        kl = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean")
        # alpha for greedy verification = how often the draft's top token is the target's
        return {"agree_top1": float((student.argmax(-1) == teacher.argmax(-1)).float().mean()), "kl": float(kl)}

    log = TrainLog("draft_model", vars(args), data.meta)
    log.add(step=0, **{f"held_out_{k}": round(v, 4) for k, v in evaluate().items()})  # = early exit at k layers
    summary = train_loop(list(draft.parameters()), loss_fn, evaluate, data, log, epochs=args.epochs, lr=args.lr,
                         batch_tokens=args.batch_tokens, minutes=args.minutes, eval_every=args.eval_every)
    meta = {"num_layers": args.layers, "init": f"target layers 0..{args.layers - 1} + final norm",
            "trained_on": data.meta, **summary}
    print(save_head(draft, "draft_model", meta), log.write(HEADS_DIR, summary))


if __name__ == "__main__":
    main()
