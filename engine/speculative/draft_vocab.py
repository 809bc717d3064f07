"""The LM head the drafters use: the target's tied embedding, restricted to the draft vocabulary.

A full 49152-row LM head costs about a quarter of a target pass per row on the CPU, and drafters
run it for every drafted token (draft model, early exit) or tree level (EAGLE) or head (Medusa).
`EngineConfig.spec_draft_vocab` = N keeps the N most frequent answer tokens of the training data
(`training/draft_vocab.py`; 8192 cover 100 % of the training answers, 96.8 % of held-out ones);
0 keeps the full vocabulary. Verification always uses the full vocabulary, so outputs do not
change: a token outside the draft vocabulary just cannot be drafted (its draft probability is 0).
"""
from __future__ import annotations

import torch

from engine.speculative.heads import HEADS_DIR

VOCAB_FILE = HEADS_DIR / "draft_vocab.safetensors"


def draft_vocab_ids(size: int, vocab_size: int) -> torch.Tensor | None:
    """The `size` most frequent answer tokens (int64), or None for the full vocabulary (size 0, size
    >= the vocabulary, or no vocabulary file)."""
    if not size or size >= vocab_size or not VOCAB_FILE.exists():
        return None
    from safetensors.torch import load_file

    return load_file(str(VOCAB_FILE))["token_ids"][:size].long()


class DraftLMHead:
    def __init__(self, embed: torch.Tensor, size: int) -> None:
        self.vocab_size = embed.shape[0]
        ids = draft_vocab_ids(size, self.vocab_size)
        self.ids = None if ids is None else ids.to(embed.device)
        self.rows = embed if self.ids is None else embed[self.ids].contiguous()

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] fp32 logits; -inf outside the draft vocabulary."""
        sub = (hidden @ self.rows.T).float()
        if self.ids is None:
            return sub
        full = torch.full((*sub.shape[:-1], self.vocab_size), float("-inf"), device=sub.device)
        full[..., self.ids] = sub
        return full

    def probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] softmax over the draft vocabulary (0 elsewhere)."""
        return torch.softmax(self.logits(hidden), dim=-1)
