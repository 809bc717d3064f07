"""Radix prefix cache (RadixAttention, as in SGLang): KV blocks of finished and running requests kept
in a tree keyed by token ids, so a new request whose prompt starts the same way skips that prefill.

Shape of the tree:
- Every node but the root holds a token span that is a whole number of KV blocks, and owns those
  blocks: `len(node.tokens) == len(node.blocks) * block_size`. Block-aligned because a block is the
  unit of sharing in the block manager; a partly filled block is never cached.
- Children are keyed by their first *block* of tokens (not their first token): with block-aligned
  spans two siblings may share a first token and differ later inside the first block, and splitting
  inside a block is impossible. Keys of siblings are therefore distinct first blocks.
- The tree holds one block-manager reference on each block it owns (`bm.incref`/`bm.decref`); a
  block returns to the free list only when neither the tree nor any sequence holds it.

Lock references: a running sequence locks the deepest node of the path it uses (lock counts go up
on that node and every ancestor), so a node with `lock_ref > 0` is in use and is never evicted.
Eviction takes unlocked leaves in LRU order (a parent whose last child went becomes a leaf in turn)
until enough blocks are free; it is wired into the block manager as `bm.evictor`, and
`bm.evictable` reports exactly how many blocks evicting every unlocked node would free (blocks that
some sequence still holds, e.g. an n > 1 sibling sharing a prompt, are not counted).

When requests enter the tree (the policy, and why):
- on finish and on preemption: every full block of computed KV (prompt and output) is inserted, so
  a follow-up turn that extends prompt + answer, or the preempted request itself when it returns,
  finds it;
- while prefilling (`on_computed`, after each forward pass that ran a prompt chunk): the computed
  full blocks are inserted at once, as SGLang does for unfinished requests, so a request that
  arrives while a long shared prompt is still running (or between its chunks) already hits it.
  Decode steps insert nothing until the end; that keeps the tree from growing a node per block.
A request that inserts extends its own node in place when it is the node's only user and the node
is a leaf (so a prompt prefilled in chunks is one node, not a chain of one-chunk nodes).

Adapters (multi-LoRA): a sequence that runs a LoRA adapter caches and matches only under its
adapter's namespace: a root child's key is (adapter, first block) instead of the first block, so
prompts that agree token for token but run different adapters never share KV.

The cache counts per admission: a hit when at least one block matched, else a miss;
`tokens_saved` adds the matched tokens (what the forward passes did not compute).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence as Seq

from engine.block_manager import BlockManager
from engine.sequence import Sequence


@dataclass(eq=False, slots=True)
class RadixNode:
    id: int
    parent: "RadixNode | None"
    tokens: list[int]  # a whole number of blocks (the root: empty)
    blocks: list[int]  # physical block ids, one per block_size tokens of `tokens`
    children: dict[tuple[int, ...], "RadixNode"] = field(default_factory=dict)  # first block -> child
    lock_ref: int = 0  # sequences locking this node or a descendant
    last_access: int = 0  # logical tick (LRU order)
    last_access_step: int = 0  # engine step of that access (for display)
    text: str | None = None  # decoded span, computed lazily for snapshots
    # The LoRA adapter whose KV this path holds (None: the base model). The same tokens give other K and
    # V under another adapter, so each adapter's prefixes hang off the root under their own keys.
    namespace: str | None = None

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache:
    """A radix tree of KV blocks with lock references, LRU leaf eviction and hit counters.

    Scheduler / engine hooks (the only calls the engine makes):
      match_for_admission(seq) -> (blocks, num_tokens)   before admission; no locks taken
      on_admit(seq, cached_tokens)                       after bm.create shared the blocks: lock them
      on_computed(seq)                                   after a forward pass ran a prefill chunk of seq
      on_release(seq)                                    preemption, before bm.free
      on_finish(seq)                                     finish/abort, before bm.free
      begin_step(step)                                   start of each scheduler step
      block_refs() / snapshot()                          for pool summaries and StepRecords
    """

    def __init__(self, block_manager: BlockManager, decode: Callable[[Seq[int]], str] | None = None) -> None:
        self.bm = block_manager
        self.block_size = block_manager.block_size
        self.decode = decode
        self.root = RadixNode(0, None, [], [])
        self._ids = itertools.count(1)
        self._nodes: dict[int, RadixNode] = {0: self.root}
        self._owned: set[int] = set()  # blocks the tree holds a reference on
        self._tick = 0
        self.step = 0
        self._locked: dict[int, RadixNode] = {}  # seq_id -> the deepest node that sequence locks
        self.counters = {"hits": 0, "misses": 0, "tokens_saved": 0, "tokens_requested": 0,
                         "evictions": 0, "evicted_blocks": 0, "freed_blocks": 0}
        self.evicted_this_step: list[dict[str, Any]] = []
        block_manager.evictor = self.evict
        block_manager.evictable = self.num_evictable_blocks

    # ---- queries -----------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self._nodes) - 1  # the root holds nothing

    @property
    def num_blocks(self) -> int:
        return len(self._owned)

    @property
    def num_tokens(self) -> int:
        return len(self._owned) * self.block_size

    def block_refs(self) -> dict[int, int]:
        """Block id -> references the tree holds on it (always 1: a block lives in one node)."""
        return {b: 1 for b in self._owned}

    def num_evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked node would return to the free list."""
        rc = self.bm.ref_counts
        return sum(1 for n in self._nodes.values() if n.lock_ref == 0 and n is not self.root
                   for b in n.blocks if rc[b] == 1)

    def locked_node(self, seq_id: int) -> RadixNode | None:
        return self._locked.get(seq_id)

    # ---- the tree ----------------------------------------------------------------------------------
    def _key(self, tokens: Seq[int], block: int = 0) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(tokens[block * bs:(block + 1) * bs])

    def _child_key(self, parent: RadixNode, tokens: Seq[int], block: int, namespace: str | None) -> tuple:
        key = self._key(tokens, block)
        return (namespace, *key) if parent is self.root and namespace is not None else key

    def _node_key(self, node: RadixNode) -> tuple:
        """The key `node` is filed under in its parent's children."""
        return self._child_key(node.parent, node.tokens, 0, node.namespace)

    def _touch(self, node: RadixNode) -> None:
        self._tick += 1
        while node is not None:
            node.last_access, node.last_access_step = self._tick, self.step
            node = node.parent

    def _new_node(self, parent: RadixNode, tokens: list[int], blocks: list[int],
                  namespace: str | None = None) -> RadixNode:
        node = RadixNode(next(self._ids), parent, tokens, blocks, namespace=namespace)
        self._nodes[node.id] = node
        parent.children[self._node_key(node)] = node
        return node

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut `node` after its first k blocks; returns the new upper node (the lower keeps its id)."""
        bs = self.block_size
        assert 0 < k < len(node.blocks)
        parent = node.parent
        head = self._new_node(parent, node.tokens[:k * bs], node.blocks[:k], node.namespace)  # replaces node
        head.lock_ref, head.last_access, head.last_access_step = node.lock_ref, node.last_access, node.last_access_step
        node.tokens, node.blocks, node.parent, node.text = node.tokens[k * bs:], node.blocks[k:], head, None
        head.children[self._node_key(node)] = node
        return head

    def _common_blocks(self, node: RadixNode, tokens: Seq[int], start_block: int, limit: int) -> int:
        """How many leading blocks of node match tokens from `start_block` (at most `limit`)."""
        bs = self.block_size
        k = 0
        while k < limit and node.tokens[k * bs:(k + 1) * bs] == list(tokens[(start_block + k) * bs:(start_block + k + 1) * bs]):
            k += 1
        return k

    def match_prefix(self, tokens: Seq[int], max_blocks: int | None = None,
                     namespace: str | None = None) -> tuple[list[int], RadixNode]:
        """The longest cached block-aligned prefix of `tokens` (at most `max_blocks` blocks) under
        `namespace` (a LoRA adapter's name, None for the base model): its block ids and the node it
        ends at. Splits a node when the match ends inside it, so the match always ends on a node
        boundary (that node is what a user locks). Touches the path (LRU)."""
        n = len(tokens) // self.block_size
        if max_blocks is not None:
            n = min(n, max_blocks)
        node, blocks, i = self.root, [], 0
        while i < n:
            child = node.children.get(self._child_key(node, tokens, i, namespace))
            if child is None:
                break
            k = self._common_blocks(child, tokens, i, min(len(child.blocks), n - i))
            if k < len(child.blocks):
                child = self._split(child, k)
            blocks += child.blocks
            node, i = child, i + k
        self._touch(node)
        return blocks, node

    def insert(self, tokens: Seq[int], blocks: Seq[int], namespace: str | None = None) -> RadixNode:
        """Cache the whole blocks of `tokens` whose KV lives in `blocks` (blocks[i] holds tokens
        [i*bs, (i+1)*bs)); returns the node the span ends at. Where the tree already has a prefix,
        its own blocks stay and the given duplicates are not adopted; new blocks get a tree ref."""
        bs = self.block_size
        n = min(len(tokens) // bs, len(blocks))
        node, i = self.root, 0
        while i < n:
            child = node.children.get(self._child_key(node, tokens, i, namespace))
            if child is None:
                new_blocks = list(blocks[i:n])
                for b in new_blocks:
                    self._adopt(b)
                node = self._new_node(node, list(tokens[i * bs:n * bs]), new_blocks, namespace)
                break
            k = self._common_blocks(child, tokens, i, min(len(child.blocks), n - i))
            if k < len(child.blocks):
                child = self._split(child, k)
            node, i = child, i + k
        self._touch(node)
        return node

    def _adopt(self, block: int) -> None:
        if block in self._owned:
            raise ValueError(f"block {block} is already cached at another position")
        self.bm.incref(block)
        self._owned.add(block)

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of unlocked radix node {node.id}")
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_blocks: int) -> int:
        """Evict unlocked leaves, least recently used first, until at least `num_blocks` blocks went
        back to the free list or nothing is evictable. Returns the number of blocks freed."""
        heap = [(n.last_access, n.id, n) for n in self._nodes.values()
                if n is not self.root and n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_blocks and heap:
            _, _, node = heapq.heappop(heap)
            freed += self._remove_leaf(node)
            parent = node.parent
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _remove_leaf(self, node: RadixNode) -> int:
        assert node.is_leaf and node.lock_ref == 0 and node is not self.root
        rc = self.bm.ref_counts
        freed = sum(1 for b in node.blocks if rc[b] == 1)
        for b in node.blocks:
            self._owned.discard(b)
            self.bm.decref(b)
        del node.parent.children[self._node_key(node)]
        del self._nodes[node.id]
        self.counters["evictions"] += 1
        self.counters["evicted_blocks"] += len(node.blocks)
        self.counters["freed_blocks"] += freed
        self.evicted_this_step.append({"id": node.id, "parent": node.parent.id, "tokens": list(node.tokens),
                                       "blocks": list(node.blocks), "freed_blocks": freed,
                                       "last_access_step": node.last_access_step})
        return freed

    # ---- scheduler / engine hooks ------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self.evicted_this_step = []

    def match_for_admission(self, seq: Sequence) -> tuple[list[int], int]:
        """Cached blocks for seq's known tokens and how many tokens they cover. Block-aligned, and the
        last token is never served from the cache: its logits row is what the first step samples."""
        max_blocks = (seq.num_tokens - 1) // self.block_size
        blocks, _ = self.match_prefix(seq.token_ids, max_blocks, seq.adapter)
        return blocks, len(blocks) * self.block_size

    def on_admit(self, seq: Sequence, cached_tokens: int) -> None:
        """seq now shares the first cached_tokens // block_size cached blocks: lock that path."""
        k = cached_tokens // self.block_size
        blocks, node = self.match_prefix(seq.token_ids, k, seq.adapter)
        table = self.bm.tables.get(seq.seq_id, [])
        if cached_tokens % self.block_size or len(blocks) != k or table[:k] != blocks:
            raise ValueError(f"on_admit({seq.label}, {cached_tokens}) does not match the cached prefix")
        self._set_lock(seq, node)
        self.counters["hits" if k else "misses"] += 1
        self.counters["tokens_saved"] += cached_tokens
        self.counters["tokens_requested"] += seq.num_tokens

    def on_computed(self, seq: Sequence) -> None:
        """A forward pass just computed a prefill chunk of seq: publish its full computed blocks."""
        self._publish(seq)

    def on_release(self, seq: Sequence) -> None:
        """seq is preempted (its blocks are about to be freed): keep its computed KV, drop its lock."""
        self._retire(seq)

    def on_finish(self, seq: Sequence) -> None:
        """seq finished or was aborted (before its blocks are freed): cache its KV, drop its lock."""
        self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        if seq.seq_id in self.bm.tables:
            self._publish(seq)
        node = self._locked.pop(seq.seq_id, None)
        if node is not None:
            self.unlock(node)

    def _set_lock(self, seq: Sequence, node: RadixNode) -> None:
        old = self._locked.get(seq.seq_id)
        self.lock(node)  # lock the new path before releasing the old one: they usually overlap
        if old is not None:
            self.unlock(old)
        self._locked[seq.seq_id] = node

    def _depth_blocks(self, node: RadixNode) -> int:
        d = 0
        while node is not self.root:
            d += len(node.blocks)
            node = node.parent
        return d

    def _publish(self, seq: Sequence) -> None:
        """Insert seq's full blocks of computed KV and move its lock to the node they end at."""
        bs = self.block_size
        table = self.bm.tables.get(seq.seq_id)
        if table is None:
            return
        n = min(seq.num_computed_tokens, seq.num_tokens, self.bm.num_tokens[seq.seq_id]) // bs
        n = min(n, len(table))
        mine = self._locked.get(seq.seq_id)
        if mine is not None and mine is not self.root:
            depth = self._depth_blocks(mine)
            if n <= depth:
                return  # nothing new
            if mine.is_leaf and mine.lock_ref == 1:
                # Only this sequence uses its leaf: grow it in place instead of hanging a chain of nodes.
                for b in table[depth:n]:
                    self._adopt(b)
                mine.tokens = mine.tokens + list(seq.token_ids[depth * bs:n * bs])
                mine.blocks = mine.blocks + list(table[depth:n])
                mine.text = None
                self._touch(mine)
                return
        if n == 0:
            return
        node = self.insert(seq.token_ids[:n * bs], table[:n], seq.adapter)
        self._set_lock(seq, node)

    # ---- views -------------------------------------------------------------------------------------
    def _text(self, node: RadixNode) -> str:
        if self.decode is None:
            return ""
        if node.text is None:
            node.text = self.decode(node.tokens)
        return node.text

    def snapshot(self) -> dict[str, Any]:
        """A JSON-serialisable picture of the tree (nodes in depth-first order, root first)."""
        rc = self.bm.ref_counts
        nodes = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            nodes.append({
                "id": n.id, "parent": None if n.parent is None else n.parent.id, "namespace": n.namespace,
                "tokens": list(n.tokens), "text": self._text(n), "blocks": list(n.blocks),
                "lock_ref": n.lock_ref, "last_access": n.last_access, "last_access_step": n.last_access_step,
                "evictable": n is not self.root and n.lock_ref == 0,
                "freeable_blocks": sum(1 for b in n.blocks if rc[b] == 1) if n.lock_ref == 0 and n is not self.root else 0,
            })
            stack.extend(sorted(n.children.values(), key=lambda c: c.id, reverse=True))
        return {
            "block_size": self.block_size,
            "step": self.step,
            "nodes": nodes,
            "num_nodes": self.num_nodes,
            "num_blocks": self.num_blocks,
            "num_tokens": self.num_tokens,
            "num_evictable_blocks": self.num_evictable_blocks(),
            "locks": [{"seq_id": sid, "node": node.id} for sid, node in sorted(self._locked.items())],
            "counters": dict(self.counters),
            "evicted_this_step": [dict(e) for e in self.evicted_this_step],
        }

    # ---- invariants (tests) ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Tree shape, block ownership and lock counts are consistent (call with the block manager's
        own `check_invariants(extra_refs=cache.block_refs())`)."""
        bs = self.block_size
        seen_blocks: list[int] = []
        reachable = 0
        stack = [self.root]
        while stack:
            n = stack.pop()
            reachable += 1
            assert self._nodes.get(n.id) is n, f"node {n.id} is not registered"
            if n is not self.root:
                assert n.tokens and len(n.tokens) == len(n.blocks) * bs, f"node {n.id} span is not whole blocks"
                assert n.parent.children.get(self._node_key(n)) is n, f"node {n.id} is not under its key"
                assert n.parent is self.root or n.namespace == n.parent.namespace, f"node {n.id} left its namespace"
                assert n.last_access <= n.parent.last_access or n.parent is self.root, f"node {n.id} newer than parent"
            keys = list(n.children)
            assert len(set(keys)) == len(keys)
            for key, c in n.children.items():
                assert c.parent is n and key == self._node_key(c) and tuple(c.tokens[:bs]) == key[-bs:]
            own_locks = sum(1 for m in self._locked.values() if m is n)
            assert n is self.root or n.lock_ref == own_locks + sum(c.lock_ref for c in n.children.values()), \
                f"node {n.id} lock_ref {n.lock_ref} != locks below it"
            seen_blocks += n.blocks
            stack.extend(n.children.values())
        assert reachable == len(self._nodes), "unreachable nodes are registered"
        assert len(seen_blocks) == len(set(seen_blocks)), "a block is cached twice"
        assert set(seen_blocks) == self._owned, "owned set differs from the blocks in the tree"
        assert sum(len(n.tokens) for n in self._nodes.values()) == self.num_tokens
        for b in self._owned:
            assert self.bm.ref_counts[b] >= 1, f"cached block {b} is free"
        for sid, node in self._locked.items():
            assert node.id in self._nodes, f"seq {sid} locks an evicted node"
