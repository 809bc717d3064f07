"""The drafters' vocabulary: the target's most frequent output tokens in the self-generated data.

On the CPU the LM head (49152 x 576) costs about a quarter of a whole target pass per row, and a
drafter runs it for every drafted token or tree level; restricted to the most frequent tokens it
costs a fraction of that (FR-Spec; EAGLE-3 also drafts over a reduced vocabulary). Verification
still uses the target's full vocabulary, so output is unchanged; a token outside the draft
vocabulary simply cannot be drafted.

`python -m training.draft_vocab [--size 8192]` writes engine/assets/spec_heads/draft_vocab.safetensors
(token ids, most frequent first) and prints how much of the generated text it covers.
"""
from __future__ import annotations

import argparse
import json

import torch

from engine.speculative.heads import HEADS_DIR
from training.common import load_data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    args = ap.parse_args()
    data = load_data()
    counts = torch.zeros(49152, dtype=torch.long)
    for c in data.train:  # answer tokens only: what drafts have to guess
        counts += torch.bincount(c.tokens[c.prompt_len:], minlength=49152)
    order = torch.argsort(counts, descending=True, stable=True)
    ids = order[: args.size].to(torch.int32).contiguous()
    total = int(counts.sum())
    coverage = {n: round(float(counts[order[:n]].sum()) / total, 4) for n in (1024, 2048, 4096, 8192, 16384)}
    held = torch.cat([c.tokens[c.prompt_len:] for c in data.held_out])
    held_cov = float(torch.isin(held, ids.long()).float().mean())
    from safetensors.torch import save_file

    meta = {"size": args.size, "train_answer_tokens": total, "coverage_train": coverage,
            "coverage_held_out": round(held_cov, 4), "distinct_tokens_seen": int((counts > 0).sum())}
    save_file({"token_ids": ids}, str(HEADS_DIR / "draft_vocab.safetensors"), metadata={"inferscope": json.dumps(meta)})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
