"""Tree drafters that read the target's own hidden states: Medusa heads and the EAGLE layer.

Both need the target's final-normed hidden state ("feature") at positions the target has computed:
the engine hands every computed row's feature to `FeatureStore` (plain steps: all rows; tree
rounds: the root and the accepted path only, after verification).

- `MedusaDrafter`: the feature at start - 1 (the row that produced the root token) through K heads
  gives K distributions for positions start + 1 .. start + K; a *static* tree (chosen once, from the
  heads' held-out top-1/top-3 accuracy in the training log) picks which top-k combinations to try.
- `EagleDrafter`: the EAGLE layer keeps its own one-layer KV over the context (dense, per request,
  only ever from true target features); drafting runs it autoregressively on its own predicted
  features, expanding the `topk` likeliest nodes of each depth into `topk` children each (EAGLE-2's
  dynamic tree), and keeps the `nodes` likeliest by path probability.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.sequence import Sequence
from engine.speculative.draft_vocab import DraftLMHead
from engine.speculative.drafters import DraftProposal, Drafter
from engine.speculative.heads import RopeTables, load_head
from engine.speculative.tree import DraftTree

if TYPE_CHECKING:
    from engine.engine import LLMEngine


class FeatureStore:
    """Per sequence, the target's feature at every computed position (where known)."""

    def __init__(self, hidden: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        self.hidden, self.max_len, self.device, self.dtype = hidden, max_len, device, dtype
        self._feats: dict[int, torch.Tensor] = {}
        self._known: dict[int, bytearray] = {}

    def write(self, seq_id: int, positions: list[int], rows: torch.Tensor) -> None:
        if seq_id not in self._feats:
            self._feats[seq_id] = torch.empty(self.max_len, self.hidden, device=self.device, dtype=self.dtype)
            self._known[seq_id] = bytearray(self.max_len)
        self._feats[seq_id][torch.tensor(positions, device=self.device)] = rows.to(self.dtype)
        known = self._known[seq_id]
        for p in positions:
            known[p] = 1

    def known(self, seq_id: int, pos: int) -> bool:
        k = self._known.get(seq_id)
        return k is not None and 0 <= pos < self.max_len and bool(k[pos])

    def get(self, seq_id: int, positions: list[int]) -> torch.Tensor:
        return self._feats[seq_id][torch.tensor(positions, device=self.device)]

    def forget(self, seq_id: int) -> None:
        self._feats.pop(seq_id, None)
        self._known.pop(seq_id, None)


class _TreeDrafter(Drafter):
    deterministic = True  # candidates are top-k picks: one-hot proposals (see engine/speculative/tree.py)
    is_tree = True
    wants_hidden = True

    def __init__(self, engine: "LLMEngine", head_name: str, nodes: int) -> None:
        if nodes < 1:
            raise ValueError(f"spec_tree_nodes must be >= 1, got {nodes}")
        self.engine = engine
        cfg = engine.model_config
        self.module, self.meta = load_head(head_name, cfg)
        self.module = self.module.to(device=engine.device, dtype=engine.dtype)
        self.embed = engine.model.embed  # the tied LM head / embedding, on the engine's device
        self.lm_head = DraftLMHead(self.embed, engine.config.spec_draft_vocab)
        self.nodes = nodes
        self.features = FeatureStore(cfg.hidden_size, engine.config.max_model_len, engine.device, engine.dtype)

    def observe(self, seq: Sequence, positions: list[int], rows: torch.Tensor) -> None:
        self.features.write(seq.seq_id, positions, rows)

    def forget(self, seq_id: int) -> None:
        self.features.forget(seq_id)

    def max_proposal(self, seq: Sequence, gamma: int) -> int:
        if gamma <= 0 or not self.features.known(seq.seq_id, seq.num_computed_tokens - 1):
            return 0
        return self.nodes

    def _probs(self, feats: torch.Tensor) -> torch.Tensor:
        return self.lm_head.probs(feats)


# ---- Medusa --------------------------------------------------------------------------------------

def rank_priors(meta: dict, num_heads: int, width: int) -> list[list[float]]:
    """acc[d][r]: how often head d's rank-r token is right (held-out top-1 / top-3 from training)."""
    acc = []
    for d in range(num_heads):
        top1 = float(meta.get(f"held_out_top1_head{d}", 0.6 ** (d + 1)))
        top3 = float(meta.get(f"held_out_top3_head{d}", min(1.0, 1.6 * top1)))
        rest = max(top3 - top1, 1e-3) / 2
        acc.append([top1] + [rest * 0.5 ** max(0, r - 2) for r in range(1, width)])
    return acc


def medusa_paths(acc: list[list[float]], nodes: int) -> list[tuple[int, ...]]:
    """The `nodes` rank paths with the highest prior acceptance (best-first search), parents first.
    Path (r0, r1) = head 0's rank-r0 token, then head 1's rank-r1 token."""
    heap: list[tuple[float, tuple[int, ...]]] = [(-acc[0][r], (r,)) for r in range(len(acc[0]))]
    heapq.heapify(heap)
    chosen: list[tuple[float, tuple[int, ...]]] = []
    while heap and len(chosen) < nodes:
        neg, path = heapq.heappop(heap)
        chosen.append((-neg, path))
        d = len(path)
        if d < len(acc):
            for r in range(len(acc[d])):
                heapq.heappush(heap, (neg * acc[d][r], path + (r,)))
    return [p for _, p in sorted(chosen, key=lambda sp: (len(sp[1]), -sp[0]))]


class MedusaDrafter(_TreeDrafter):
    name = "medusa"

    def __init__(self, engine: "LLMEngine", nodes: int, width: int) -> None:
        super().__init__(engine, "medusa", nodes)
        self.num_heads = int(self.meta["num_heads"])
        self.width = width
        self.paths = medusa_paths(rank_priors(self.meta, self.num_heads, width), nodes)
        self.nodes = len(self.paths)

    def propose_batch(self, requests: list[tuple[Sequence, int]]) -> list[DraftProposal]:
        out = [DraftProposal([], detail={"tree": "static", "heads": self.num_heads}) for _ in requests]
        live = [i for i, (seq, g) in enumerate(requests)
                if g > 0 and self.features.known(seq.seq_id, seq.num_computed_tokens - 1)]
        if not live:
            return out
        feats = torch.cat([self.features.get(requests[i][0].seq_id, [requests[i][0].num_computed_tokens - 1])
                           for i in live])
        with torch.inference_mode():
            probs = self._probs(self.module(feats))  # [K, B, V]
        top_p, top_i = probs.topk(self.width, dim=-1)
        top_p, top_i = top_p.cpu(), top_i.cpu()
        for b, i in enumerate(live):
            budget = requests[i][1]
            index: dict[tuple[int, ...], int] = {}
            tokens, parents, ps, scores = [], [], [], []
            for path in self.paths[:budget]:
                d, r = len(path) - 1, path[-1]
                parent = index[path[:-1]] if d else -1
                index[path] = len(tokens)
                p = float(top_p[d, b, r])
                tokens.append(int(top_i[d, b, r]))
                parents.append(parent)
                ps.append(p)
                scores.append(p * (scores[parent] if parent >= 0 else 1.0))
            tree = DraftTree(tuple(tokens), tuple(parents), tuple(ps), tuple(scores))
            out[i] = DraftProposal(tokens, None, ps, {"tree": "static", "heads": self.num_heads}, tree=tree)
        return out


# ---- EAGLE ---------------------------------------------------------------------------------------

@dataclass(slots=True)
class _EagleCache:
    k: torch.Tensor  # [1, Hkv, max_len, D]
    v: torch.Tensor
    rows: int = 0  # filled rows (context rows fed with true features)
    next_pos: int = 0  # every position below this is in the cache or was skipped (feature unknown)


@dataclass(slots=True)
class _Node:
    token: int
    parent: int  # index into the node list; -1 = root
    prob: float
    score: float  # log path probability
    depth: int
    in_feature: torch.Tensor  # the (predicted) feature this node's EAGLE row reads
    row: int = -1  # its row among the draft's tree rows once expanded


class EagleDrafter(_TreeDrafter):
    name = "eagle"

    def __init__(self, engine: "LLMEngine", nodes: int, depth: int, topk: int) -> None:
        super().__init__(engine, "eagle", nodes)
        if depth < 1 or topk < 1:
            raise ValueError(f"EAGLE tree depth and top-k must be >= 1, got {depth}, {topk}")
        self.depth, self.topk = depth, topk
        cfg = engine.model_config
        self.rope = RopeTables(cfg, engine.config.max_model_len + depth + 1, engine.device)
        self._caches: dict[int, _EagleCache] = {}
        self._shape = (1, cfg.num_kv_heads, engine.config.max_model_len, cfg.head_dim)

    def forget(self, seq_id: int) -> None:
        super().forget(seq_id)
        self._caches.pop(seq_id, None)

    def _layer(self, feats, toks, positions, mask, past):
        cos, sin = self.rope(torch.tensor(positions, device=self.engine.device)[None])
        return self.module(feats[None], self.embed[torch.tensor(toks, device=self.engine.device)][None],
                           cos, sin, mask[None], past)

    def _catch_up(self, seq: Sequence) -> torch.Tensor:
        """Feed the context rows not yet in the EAGLE cache (true features); returns the predicted
        feature at the root's position (the last context row's output)."""
        cache = self._caches.get(seq.seq_id)
        if cache is None:
            cache = self._caches[seq.seq_id] = _EagleCache(
                torch.empty(self._shape, device=self.engine.device, dtype=self.engine.dtype),
                torch.empty(self._shape, device=self.engine.device, dtype=self.engine.dtype))
        start = seq.num_computed_tokens
        pend = [i for i in range(cache.next_pos, start) if self.features.known(seq.seq_id, i)]
        n, t = cache.rows, len(pend)
        mask = torch.ones(t, n + t, dtype=torch.bool, device=self.engine.device)
        mask[:, n:] = torch.tril(mask[:, n:])
        past = (cache.k[:, :, :n], cache.v[:, :, :n])
        out, k, v = self._layer(self.features.get(seq.seq_id, pend), [seq.token_ids[i + 1] for i in pend],
                                pend, mask, past)
        cache.k[:, :, n:n + t], cache.v[:, :, n:n + t] = k, v
        cache.rows, cache.next_pos = n + t, start
        return out[0, -1]

    def _draft_one(self, seq: Sequence, budget: int) -> DraftTree:
        start = seq.num_computed_tokens
        root_feat = self._catch_up(seq)
        cache = self._caches[seq.seq_id]
        n_ctx = cache.rows
        nodes: list[_Node] = []

        def children(feat_outs: torch.Tensor, parents: list[int], depth: int) -> list[int]:
            """Top-k children of every parent, from one LM-head matmul for all of them."""
            top_p, top_i = self._probs(feat_outs).topk(self.topk, dim=-1)
            made = []
            for j, parent in enumerate(parents):
                base = nodes[parent].score if parent >= 0 else 0.0
                for pp, ii in zip(top_p[j].tolist(), top_i[j].tolist()):
                    nodes.append(_Node(int(ii), parent, pp, base + math.log(max(pp, 1e-30)), depth, feat_outs[j]))
                    made.append(len(nodes) - 1)
            return made

        frontier = children(root_feat[None], [-1], 1)
        tree_k: list[torch.Tensor] = []
        tree_v: list[torch.Tensor] = []
        for depth in range(1, self.depth):
            expand = sorted(frontier, key=lambda i: -nodes[i].score)[: self.topk]
            rows_before = sum(x.shape[2] for x in tree_k)
            t = len(expand)
            mask = torch.zeros(t, n_ctx + rows_before + t, dtype=torch.bool, device=self.engine.device)
            mask[:, :n_ctx] = True
            for j, i in enumerate(expand):
                a = nodes[i].parent
                while a >= 0:  # ancestors were expanded at earlier depths
                    mask[j, n_ctx + nodes[a].row] = True
                    a = nodes[a].parent
                mask[j, n_ctx + rows_before + j] = True
                nodes[i].row = rows_before + j
            past = (torch.cat([cache.k[:, :, :n_ctx], *tree_k], 2), torch.cat([cache.v[:, :, :n_ctx], *tree_v], 2))
            out, k, v = self._layer(torch.stack([nodes[i].in_feature for i in expand]),
                                    [nodes[i].token for i in expand], [start + depth - 1] * t, mask, past)
            tree_k.append(k)
            tree_v.append(v)
            frontier = children(out[0], expand, depth + 1)
        # Keep the `budget` likeliest paths' nodes (a child is never likelier than its parent).
        keep: set[int] = set()
        for i in sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth)):
            if len(keep) >= budget:
                break
            if nodes[i].parent < 0 or nodes[i].parent in keep:
                keep.add(i)
        order = sorted(keep, key=lambda i: (nodes[i].depth, -nodes[i].score))
        new_index = {old: new for new, old in enumerate(order)}
        return DraftTree(tuple(nodes[i].token for i in order),
                         tuple(new_index[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in order),
                         tuple(nodes[i].prob for i in order),
                         tuple(math.exp(nodes[i].score) for i in order))

    def propose_batch(self, requests: list[tuple[Sequence, int]]) -> list[DraftProposal]:
        out = []
        for seq, budget in requests:
            detail = {"tree": "dynamic", "depth": self.depth, "topk": self.topk}
            cache = self._caches.get(seq.seq_id)
            if (budget <= 0 or not self.features.known(seq.seq_id, seq.num_computed_tokens - 1)
                    or (cache is not None and cache.next_pos >= seq.num_computed_tokens)):
                out.append(DraftProposal([], detail=detail))
                continue
            with torch.inference_mode():
                tree = self._draft_one(seq, budget)
            out.append(DraftProposal(list(tree.tokens), None, list(tree.probs), detail, tree=tree))
        return out
