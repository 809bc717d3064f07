"""Drafters: cheap proposers of the next few tokens, all behind one interface.

A drafter sees a sequence whose tokens are all computed except the last sampled one (position
`seq.num_computed_tokens`), and proposes up to `gamma` tokens to follow it. It may propose fewer
(prompt lookup finds no match): the round then verifies what there is, possibly nothing.

- `PromptLookupDrafter` ("ngram"): find the most recent earlier occurrence of the context's last
  n tokens (n from `max_n` down to `min_n`) and propose the gamma tokens that followed it (a
  continuation reaching the end of the context goes on copying at the same lag, so a repeating
  pattern is proposed in full). No model, so no q: the
  proposal is deterministic (a one-hot q). Shines when the output copies the input (summaries,
  code edits, quoting).
- `EarlyExitDrafter` ("early_exit"): the target's own first k layers, then its final RMSNorm and
  tied LM head, run as gamma one-token passes batched over every drafting sequence. It shares the
  target's KV pool and block tables: draft pass j writes layers 0..k-1 of position start + j into
  the slots the scheduler reserved for the round, exactly what the target's layers 0..k-1 compute
  for the same token (those layers *are* the target's). The verification pass then rewrites every
  layer of those positions and the rollback truncates the rejected ones, so the draft state needs
  no separate rollback: it is the target's block table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from engine.forward_batch import build_forward_batch
from engine.sampler import filtered_probs
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.speculative.tree import DraftTree

if TYPE_CHECKING:
    from engine.engine import LLMEngine


@dataclass(slots=True)
class DraftProposal:
    tokens: list[int]
    # [len(tokens), V] distributions the tokens were sampled from (sampled requests of a stochastic
    # drafter); None for deterministic proposals (one-hot q) and for greedy requests.
    q_probs: torch.Tensor | None = None
    # q(token) for each token, for the trace (1.0 for one-hot; temperature-1 softmax for greedy).
    q_of_tokens: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)  # drafter-specific, JSON-able (e.g. the n-gram match)
    # Tree drafters (Medusa, EAGLE): the tree whose flattened nodes are `tokens`; None for a chain.
    tree: "DraftTree | None" = None


class Drafter:
    """Interface. `propose` is per sequence; `propose_batch` may batch (the default loops)."""

    name: str = "drafter"
    deterministic: bool = True  # True: q is one-hot (no q_probs)
    is_tree: bool = False  # proposes DraftTree (verified with a tree mask) instead of a chain
    wants_hidden: bool = False  # reads the target's hidden states (`observe` after each pass)
    mirrors_target: bool = False  # runs its own model over every target pass (`on_forward`)

    def observe(self, seq: Sequence, positions: list[int], rows: torch.Tensor) -> None:
        """The target's final-normed hidden state at `positions` of `seq` (hidden-state drafters)."""

    def on_forward(self, batch) -> None:  # noqa: ANN001 (ForwardBatch)
        """Called with every target pass's batch (a draft model mirrors it into its own KV pool)."""

    def forget(self, seq_id: int) -> None:
        """The sequence finished: drop any per-sequence state."""

    def on_block_copies(self, copies) -> None:  # noqa: ANN001 (list[BlockCopy])
        """The engine copied whole KV blocks (copy-on-write) in the target's pool."""

    def propose(self, seq: Sequence, gamma: int) -> DraftProposal:
        raise NotImplementedError

    def propose_batch(self, requests: list[tuple[Sequence, int]]) -> list[DraftProposal]:
        return [self.propose(seq, gamma) for seq, gamma in requests]

    def max_proposal(self, seq: Sequence, gamma: int) -> int:
        """How many tokens `propose` would return at most; asked before scheduling so the scheduler
        reserves only the slots a round can use."""
        return gamma


class PromptLookupDrafter(Drafter):
    name = "ngram"
    deterministic = True

    def __init__(self, min_n: int = 2, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._memo: dict[int, tuple[int, int, DraftProposal]] = {}  # seq_id -> (num_tokens, gamma, proposal)

    def _lookup(self, tokens: list[int], gamma: int) -> DraftProposal:
        n_tok = len(tokens)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = tokens[n_tok - n:]
            first = suffix[0]
            # Most recent earlier occurrence first: recent text is the likeliest to be copied next.
            for i in range(n_tok - n - 1, -1, -1):
                if tokens[i] == first and tokens[i:i + n] == suffix:
                    # Copy what followed the match, at a fixed lag; a continuation that runs into
                    # the present keeps copying its own drafts (a repeating pattern repeats on).
                    lag = n_tok - (i + n)
                    cont: list[int] = []
                    for j in range(gamma):
                        src = i + n + j
                        cont.append(tokens[src] if src < n_tok else cont[src - n_tok])
                    return DraftProposal(cont, None, [1.0] * len(cont),
                                         {"ngram_n": n, "match_position": i, "copied_from": i + n, "lag": lag})
        return DraftProposal([], None, [], {"ngram_n": 0, "match_position": -1, "copied_from": -1})

    def propose_batch(self, requests: list[tuple[Sequence, int]]) -> list[DraftProposal]:
        out = [self.propose(seq, gamma) for seq, gamma in requests]
        self._memo.clear()  # lookups made for sequences the scheduler did not run are stale next step
        return out

    def propose(self, seq: Sequence, gamma: int) -> DraftProposal:
        memo = self._memo.pop(seq.seq_id, None)
        if memo is not None and memo[0] == seq.num_tokens and memo[1] >= gamma:
            prop = memo[2]
            return DraftProposal(prop.tokens[:gamma], None, prop.q_of_tokens[:gamma], prop.detail)
        return self._lookup(seq.token_ids, gamma) if gamma > 0 else DraftProposal([])

    def max_proposal(self, seq: Sequence, gamma: int) -> int:
        if gamma <= 0:
            return 0
        prop = self._lookup(seq.token_ids, gamma)
        self._memo[seq.seq_id] = (seq.num_tokens, gamma, prop)
        return len(prop.tokens)


class EarlyExitDrafter(Drafter):
    name = "early_exit"
    deterministic = False

    def __init__(self, engine: "LLMEngine", num_layers: int) -> None:
        total = engine.model_config.num_layers
        if not 1 <= num_layers < total:
            raise ValueError(f"early-exit draft layers must be in [1, {total - 1}], got {num_layers}")
        self.engine = engine
        self.num_layers = num_layers
        self.model, self.pool = engine.model, engine.pool  # the target's own layers and KV pool
        self.detail = {"draft_layers": num_layers}

    def propose(self, seq: Sequence, gamma: int) -> DraftProposal:
        return self.propose_batch([(seq, gamma)])[0]

    def propose_batch(self, requests: list[tuple[Sequence, int]]) -> list[DraftProposal]:
        eng = self.engine
        bm = eng.block_manager
        props = [DraftProposal([], None, [], dict(self.detail)) for _ in requests]
        q_rows: list[list[torch.Tensor]] = [[] for _ in requests]
        last = [seq.token_ids[-1] for seq, _ in requests]
        for j in range(max((g for _, g in requests), default=0)):
            active = [i for i, (_, g) in enumerate(requests) if g > j]
            paged = []
            for i in active:
                seq = requests[i][0]
                pos = seq.num_computed_tokens + j  # slots reserved by the scheduler for this round
                paged.append(([last[i]], pos, [bm.slot(seq.seq_id, pos)], bm.tables[seq.seq_id]))
            batch = build_forward_batch([], paged, list(range(len(active))), eng.device)
            logits = self._draft_logits(batch)
            greedy_rows = logits.argmax(-1).tolist()
            soft = None
            for r, i in enumerate(active):
                seq = requests[i][0]
                if seq.params.greedy:
                    tok = int(greedy_rows[r])
                    if soft is None:
                        soft = torch.softmax(logits, dim=-1)
                    qd = float(soft[r, tok])
                else:
                    q = filtered_probs(logits[r], seq.params).cpu()
                    tok = int(torch.multinomial(q, 1, generator=seq.generator))
                    q_rows[i].append(q)
                    qd = float(q[tok])
                props[i].tokens.append(tok)
                props[i].q_of_tokens.append(qd)
                last[i] = tok
        for i, rows in enumerate(q_rows):
            if rows:
                props[i].q_probs = torch.stack(rows)
        return props

    def _draft_logits(self, batch) -> torch.Tensor:  # noqa: ANN001 (ForwardBatch)
        return self.model.forward(batch, self.pool, num_layers=self.num_layers).float()


class DraftModelDrafter(EarlyExitDrafter):
    """A small separate draft model distilled from the target (`training/train_draft_model.py`):
    a few decoder layers of its own and a final norm, on the target's tied embeddings. Its KV lives
    in its own pool with the *same* block tables and slots as the target's: every target pass is
    mirrored into it (`on_forward`), so its cache holds the same tokens, and rolling back the
    target's block table rolls back the draft's too."""

    name = "draft_model"

    def __init__(self, engine: "LLMEngine") -> None:
        import dataclasses

        from engine.kv_pool import KVPool
        from engine.model import LlamaModel
        from engine.speculative.draft_vocab import DraftLMHead
        from engine.speculative.heads import load_head

        cfg = engine.model_config
        layers, meta = load_head("draft_model", cfg)
        self.engine = engine
        self.num_layers = int(meta["num_layers"])
        dcfg = dataclasses.replace(cfg, num_layers=self.num_layers)
        sd = layers.engine_state_dict(engine.weights.state_dict["model.embed_tokens.weight"])
        ec = engine.config
        self.model = LlamaModel(dcfg, sd, engine.kernels, engine.device, engine.dtype, ec.max_model_len)
        self.pool = KVPool(dcfg, ec.num_blocks, ec.block_size, engine.dtype, engine.device,
                           head_major=engine.pool.head_major)
        self.meta = meta
        self.detail = {"draft_layers": self.num_layers, "draft_model": True}
        self.lm_head = DraftLMHead(self.model.embed, ec.spec_draft_vocab)

    def _draft_logits(self, batch) -> torch.Tensor:  # noqa: ANN001 (ForwardBatch)
        hidden = self.model.hidden_states(batch, self.pool)
        with self.engine.kernels.timer.timed("lm_head (draft vocab)", "torch", 2 * hidden.shape[0] * self.lm_head.size
                                             * hidden.shape[1], self.lm_head.rows.numel() * hidden.element_size()):
            return self.lm_head.logits(hidden[batch.logits_indices])

    mirrors_target = True

    def on_forward(self, batch) -> None:  # noqa: ANN001
        self.model.hidden_states(batch, self.pool)  # K/V of every row the target computed, same slots

    def on_block_copies(self, copies) -> None:  # noqa: ANN001
        self.pool.copy_blocks(copies)  # copy-on-write in the target's pool happens in the draft's too


def make_drafter(engine: "LLMEngine") -> Drafter:
    cfg = engine.config
    if cfg.spec_drafter == "ngram":
        return PromptLookupDrafter(cfg.spec_ngram_min, cfg.spec_ngram_max)
    if cfg.spec_drafter == "early_exit":
        return EarlyExitDrafter(engine, cfg.spec_draft_layers)
    if cfg.spec_drafter == "draft_model":
        return DraftModelDrafter(engine)
    if cfg.spec_drafter == "medusa":
        from engine.speculative.tree_drafters import MedusaDrafter

        return MedusaDrafter(engine, cfg.spec_tree_nodes, cfg.spec_tree_topk)
    if cfg.spec_drafter == "eagle":
        from engine.speculative.tree_drafters import EagleDrafter

        return EagleDrafter(engine, cfg.spec_tree_nodes, cfg.spec_tree_depth, cfg.spec_tree_topk)
    raise ValueError(f"unknown drafter {cfg.spec_drafter!r}")

