"""Draft trees (Medusa, EAGLE) and how one target pass verifies every branch at once.

A tree hangs under the *root*, the request's last sampled token (not yet computed). Its nodes are
flattened parents-first; in the verification pass row 0 is the root and row 1 + i is node i, at
position start + depth(i) (siblings share a position), each in its own KV slot. The tree attention
mask lets a row see the cached context, itself and its ancestors only, so every branch is scored
as if it were the only continuation.

Acceptance walks down from the root:
- greedy: follow the child whose token is the target's argmax at the current row; stop when no
  child matches. The argmax there is the bonus token. Identical tokens to plain greedy decoding.
- sampled: the candidates are deterministic (top-k picks), i.e. one-hot proposals, so the children
  of the current node are tried in order: child c is accepted with probability p'(c), where p' is
  the target's filtered distribution with the already rejected siblings removed and renormalised;
  once all are rejected the token is drawn from what remains. Each step is an exact draw from p
  (sequential rejection with one-hot proposals), so the output keeps the target distribution.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class DraftTree:
    tokens: tuple[int, ...]  # node tokens, parents before children
    parents: tuple[int, ...]  # parent node index; -1 = child of the root
    probs: tuple[float, ...]  # drafter probability of the node's token given its parent's path
    scores: tuple[float, ...]  # the path's probability (product of probs from the root)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not len(self.parents) == len(self.probs) == len(self.scores) == n:
            raise ValueError("DraftTree fields must have one entry per node")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError("DraftTree nodes must come after their parents")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self, node: int) -> list[int]:
        """Children of `node` (-1 = the root), most likely first."""
        kids = [i for i, p in enumerate(self.parents) if p == node]
        return sorted(kids, key=lambda i: -self.probs[i])

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def mask(self) -> torch.Tensor:
        """[1 + N, 1 + N] bool over the verification rows (row 0 = root): row r sees r' iff r' is r
        or an ancestor of r."""
        n = len(self.tokens)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i + 1] = m[p + 1]
            m[i + 1, i + 1] = True
        return m

    def truncated(self, k: int) -> "DraftTree":
        """The first k nodes (still a tree: parents come first)."""
        return DraftTree(self.tokens[:k], self.parents[:k], self.probs[:k], self.scores[:k])

    @staticmethod
    def chain(tokens: list[int], probs: list[float]) -> "DraftTree":
        scores, s = [], 1.0
        for p in probs:
            s *= p
            scores.append(s)
        return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)), tuple(probs), tuple(scores))


@dataclass(slots=True)
class TreeVerdict:
    path: list[int]  # accepted node indices, root to leaf
    tokens: list[int]  # what the round emits: the path's tokens, then the final token
    final_kind: str  # "bonus" (drawn at the end of the path) or "resampled" (a rejection ended it)
    final_p: float
    target_argmax: list[int]  # the target's top token at every row (root first)
    # sampled mode: one entry per child tried, in order: (node, u, p'(token), accepted)
    trials: list[tuple[int, float, float, bool]] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def verify_tree_greedy(logits: torch.Tensor, tree: DraftTree) -> TreeVerdict:
    """logits [1 + N, V] of the verification rows."""
    argmax = logits.argmax(-1).tolist()
    node, path = -1, []
    while True:
        want = argmax[node + 1]
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    final = argmax[node + 1]
    p = float(torch.softmax(logits[node + 1].float(), -1)[final])
    kind = "bonus" if not tree.children(node) else "resampled"
    return TreeVerdict(path, [tree.tokens[i] for i in path] + [final], kind, p, argmax)


def verify_tree_sampled(probs: torch.Tensor, tree: DraftTree, generator: torch.Generator | None) -> TreeVerdict:
    """probs [1 + N, V]: the target's filtered distribution at every verification row."""
    argmax = probs.argmax(-1).tolist()
    node, path, trials = -1, [], []
    while True:
        p = probs[node + 1].double().clone()
        accepted = None
        for c in tree.children(node):
            tok = tree.tokens[c]
            z = float(p.sum())
            pc = float(p[tok]) / z if z > 0 else 0.0
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            ok = u < pc
            trials.append((c, u, pc, ok))
            if ok:
                accepted = c
                break
            p[tok] = 0.0  # rejected: the next sibling competes against what is left
        if accepted is None:
            kind = "bonus" if not tree.children(node) else "resampled"
            total = float(p.sum())
            if total <= 0:  # every token with mass was a rejected candidate (cannot happen: each had p' < 1)
                p = probs[node + 1].double()
                total = float(p.sum())
            final = int(torch.multinomial((p / total).float(), 1, generator=generator))
            return TreeVerdict(path, [tree.tokens[i] for i in path] + [final], kind,
                               float(probs[node + 1, final]), argmax, trials)
        path.append(accepted)
        node = accepted
