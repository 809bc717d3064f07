"""The radix prefix cache on its own (no model): tree shape, block ownership, locks, LRU eviction.

The property test drives a `BlockManager` + `RadixCache` the way the scheduler and engine do
(admit with a match, compute chunks, decode, fork, preempt, finish, evict) over thousands of random
operations, writing a fake KV value into every slot it "computes": a slot holds the hash of the token
prefix that produced it. So besides ref counts and tree sizes, it checks that every cached block
really holds the KV of the tokens the tree says it does, and that no running sequence's KV was ever
overwritten or freed under it.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.block_manager import BlockManager, NoFreeBlocksError
from engine.radix_cache import RadixCache
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PARAMS = SamplingParams()


def _seq(tokens: list[int], order: int = 0) -> Sequence:
    return Sequence(f"r{order}", list(tokens), len(tokens), PARAMS, 0, order)


def _make(num_blocks: int = 32, block_size: int = 4) -> tuple[BlockManager, RadixCache]:
    bm = BlockManager(num_blocks, block_size)
    return bm, RadixCache(bm)


def _cache_seq(bm: BlockManager, cache: RadixCache, tokens: list[int], order: int = 0) -> Sequence:
    """A sequence that computed all its tokens and finished: its full blocks end up in the tree."""
    seq = _seq(tokens, order)
    bm.create(seq.seq_id)
    bm.append_slots(seq.seq_id, len(tokens))
    seq.num_computed_tokens = len(tokens)
    cache.on_finish(seq)
    bm.free(seq.seq_id)
    return seq


def _check(bm: BlockManager, cache: RadixCache) -> None:
    bm.check_invariants(extra_refs=cache.block_refs())
    cache.check_invariants()


# ------------------------------------------------------------------------------------- unit tests


def test_insert_is_block_aligned_and_match_returns_the_same_blocks() -> None:
    bm, cache = _make(block_size=4)
    seq = _seq(list(range(10)))
    bm.create(seq.seq_id)
    bm.append_slots(seq.seq_id, 10)
    node = cache.insert(seq.token_ids, bm.tables[seq.seq_id])
    assert node.tokens == list(range(8)) and node.blocks == bm.tables[seq.seq_id][:2]  # 2 whole blocks only
    blocks, end = cache.match_prefix(list(range(10)) + [99])
    assert blocks == bm.tables[seq.seq_id][:2] and end is node
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 6, 99])[0] == blocks[:1]  # diverges inside block 2
    assert cache.match_prefix([0, 1, 2])[0] == []  # less than a block is never a hit
    assert cache.num_tokens == 8 and cache.num_blocks == 2
    _check(bm, cache)


def test_partial_match_splits_and_siblings_are_keyed_by_first_block() -> None:
    bm, cache = _make(block_size=2)
    _cache_seq(bm, cache, [1, 2, 3, 4, 5, 6], 0)
    _cache_seq(bm, cache, [1, 2, 3, 4, 7, 8], 1)  # shares two blocks, then diverges
    _cache_seq(bm, cache, [1, 9, 3, 4], 2)  # same first token, different first block
    root = cache.root
    assert sorted(root.children) == [(1, 2), (1, 9)]
    shared = root.children[(1, 2)]
    assert shared.tokens == [1, 2, 3, 4] and sorted(shared.children) == [(5, 6), (7, 8)]
    assert cache.num_nodes == 4 and cache.num_tokens == 4 + 2 + 2 + 4
    _check(bm, cache)


def test_admission_match_leaves_the_last_prompt_token_to_compute() -> None:
    bm, cache = _make(block_size=4)
    _cache_seq(bm, cache, list(range(12)), 0)
    exact = _seq(list(range(8)), 1)  # fully cached: must still compute its last token
    assert cache.match_for_admission(exact)[1] == 4
    longer = _seq(list(range(9)), 2)
    blocks, n = cache.match_for_admission(longer)
    assert n == 8 and len(blocks) == 2
    assert cache.match_for_admission(_seq([0], 3)) == ([], 0)


def test_locked_nodes_survive_eviction_and_lru_goes_first() -> None:
    bm, cache = _make(num_blocks=16, block_size=2)
    a = _cache_seq(bm, cache, [1, 1, 1, 1], 0)
    b = _cache_seq(bm, cache, [2, 2, 2, 2], 1)
    c = _cache_seq(bm, cache, [3, 3, 3, 3], 2)
    cache.match_prefix(a.token_ids)  # a is now more recent than b and c
    user = _seq([3, 3, 3, 3, 3], 3)  # c's blocks are in use by a running request
    blocks, n = cache.match_for_admission(user)
    bm.create(user.seq_id, blocks, n)
    cache.on_admit(user, n)
    assert cache.num_evictable_blocks() == 4  # a and b; c is locked
    assert cache.evict(1) == 2  # one whole leaf: b, the least recently used unlocked one
    assert cache.match_prefix(b.token_ids)[0] == [] and cache.match_prefix(a.token_ids)[0]
    assert cache.evict(100) == 2  # a goes; c stays however much is asked
    assert cache.match_prefix(c.token_ids)[0] == blocks
    assert cache.counters["evictions"] == 2 and cache.counters["hits"] == 1
    _check(bm, cache)
    cache.on_finish(user)
    bm.free(user.seq_id)
    assert cache.evict(100) == 2 and cache.num_blocks == 0 and bm.num_free_blocks == 16
    _check(bm, cache)


def test_the_tree_keeps_a_block_alive_until_both_it_and_the_sequence_let_go() -> None:
    bm, cache = _make(num_blocks=8, block_size=4)
    seq = _seq(list(range(8)))
    bm.create(seq.seq_id)
    bm.append_slots(seq.seq_id, 8)
    seq.num_computed_tokens = 8
    cache.on_admit(seq, 0)
    cache.on_computed(seq)  # prompt published while the request still runs
    table = list(bm.tables[seq.seq_id])
    assert [bm.ref_counts[b] for b in table] == [2, 2]
    assert cache.num_evictable_blocks() == 0  # locked by the running request
    cache.on_finish(seq)
    bm.free(seq.seq_id)
    assert [bm.ref_counts[b] for b in table] == [1, 1] and bm.num_free_blocks == 6
    assert bm.available_blocks() == 8
    _check(bm, cache)


def test_evictable_counts_only_blocks_eviction_would_free() -> None:
    """A sequence may hold cached blocks without a lock (an n > 1 sibling forked from a finished
    parent): those blocks are not free space, and the block manager must not be told they are."""
    bm, cache = _make(num_blocks=8, block_size=4)
    parent = _seq(list(range(8)), 0)
    bm.create(parent.seq_id)
    bm.append_slots(parent.seq_id, 8)
    parent.num_computed_tokens = 8
    bm.fork(parent.seq_id, 999)
    cache.on_finish(parent)
    bm.free(parent.seq_id)
    assert cache.num_blocks == 2 and cache.num_evictable_blocks() == 0
    assert bm.available_blocks() == 6
    assert cache.evict(1) == 0  # evicted, but the sibling still holds the blocks
    _check(bm, cache)


def test_block_manager_evicts_through_the_cache_when_the_pool_is_full() -> None:
    bm, cache = _make(num_blocks=4, block_size=2)
    _cache_seq(bm, cache, [1, 2, 3, 4], 0)
    _cache_seq(bm, cache, [5, 6, 7, 8], 1)
    assert bm.num_free_blocks == 0 and bm.available_blocks() == 4
    bm.create(7)
    bm.append_slots(7, 5)  # needs 3 blocks: a leaf is evicted whole, so both cached entries go
    assert cache.num_blocks == 0 and cache.counters["evictions"] == 2 and bm.num_free_blocks == 1
    with pytest.raises(NoFreeBlocksError):
        bm.append_slots(7, 10)
    _check(bm, cache)


def test_counters_and_snapshot_are_plain_json() -> None:
    bm = BlockManager(16, 2)
    cache = RadixCache(bm, decode=lambda ids: "".join(chr(97 + t) for t in ids))
    cache.begin_step(3)
    _cache_seq(bm, cache, [0, 1, 2, 3], 0)
    hit = _seq([0, 1, 2, 3, 4], 1)
    blocks, n = cache.match_for_admission(hit)
    bm.create(hit.seq_id, blocks, n)
    cache.on_admit(hit, n)
    miss = _seq([5, 6, 7], 2)
    bm.create(miss.seq_id)
    cache.on_admit(miss, 0)
    bm.append_slots(miss.seq_id, 3)
    miss.num_computed_tokens = 3
    cache.begin_step(4)
    cache.on_finish(miss)
    bm.free(miss.seq_id)  # [5, 6] is cached now, unlocked
    cache.evict(1)
    snap = cache.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert set(snap) == {"block_size", "step", "nodes", "num_nodes", "num_blocks", "num_tokens",
                         "num_evictable_blocks", "locks", "counters", "evicted_this_step"}
    assert snap["counters"] == {"hits": 1, "misses": 1, "tokens_saved": 4, "tokens_requested": 8,
                                "evictions": 1, "evicted_blocks": 1, "freed_blocks": 1}
    root, node = snap["nodes"]
    assert root["parent"] is None and root["tokens"] == []
    assert node == {"id": node["id"], "parent": 0, "namespace": None, "tokens": [0, 1, 2, 3], "text": "abcd", "blocks": blocks,
                    "lock_ref": 1, "last_access": node["last_access"], "last_access_step": 3,
                    "evictable": False, "freeable_blocks": 0}
    assert snap["locks"] == [{"seq_id": hit.seq_id, "node": node["id"]}]
    (ev,) = snap["evicted_this_step"]
    assert ev["tokens"] == [5, 6] and ev["freed_blocks"] == 1 and ev["parent"] == 0
    cache.begin_step(5)
    assert cache.snapshot()["evicted_this_step"] == []


# --------------------------------------------------------------------------------- property test


def _kv(prefix: list[int]) -> int:
    """The fake KV value of the last token of `prefix` (it depends on every token before it)."""
    return hash(tuple(prefix))


class CacheMachine(RuleBasedStateMachine):
    """Random admissions (sharing prefixes), chunks, decodes, forks, preemptions, finishes, evictions."""

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 40))
    def setup(self, block_size: int, num_blocks: int) -> None:
        self.bs = block_size
        self.bm = BlockManager(num_blocks, block_size)
        self.cache = RadixCache(self.bm)
        self.kv: dict[int, int] = {}  # slot -> fake KV
        self.running: list[Sequence] = []
        self.waiting: list[Sequence] = []
        self.history: list[list[int]] = [[0, 1, 2, 3, 4, 5, 6, 7]]
        self.orders = 0
        self.steps = 0

    # ---- helpers ----------------------------------------------------------------------------
    def _write(self, seq: Sequence, start: int, n: int) -> None:
        for p in range(start, start + n):
            self.kv[self.bm.slot(seq.seq_id, p)] = _kv(seq.token_ids[: p + 1])

    def _apply_copies(self, copies) -> None:
        for c in copies:
            for i in range(self.bs):
                if c.src * self.bs + i in self.kv:
                    self.kv[c.dst * self.bs + i] = self.kv[c.src * self.bs + i]

    def _compute(self, seq: Sequence, n: int, next_token: int) -> None:
        was_prefill = seq.in_prefill
        self._write(seq, seq.num_computed_tokens, n)
        seq.num_computed_tokens += n
        if was_prefill:
            self.cache.on_computed(seq)
        if seq.remaining == 0:
            seq.token_ids.append(next_token)  # "sampled"

    def _admit(self, seq: Sequence, chunk: int, next_token: int) -> bool:
        blocks, cached = self.cache.match_for_admission(seq)
        assert cached % self.bs == 0 and cached <= seq.num_tokens - 1 and len(blocks) * self.bs == cached
        for p in range(cached):  # what the cache hands out is exactly this prefix's KV
            assert self.kv[blocks[p // self.bs] * self.bs + p % self.bs] == _kv(seq.token_ids[: p + 1])
        n = min(seq.num_tokens - cached, chunk)
        self.bm.create(seq.seq_id, blocks, cached)
        if not self.bm.can_append(seq.seq_id, n):
            self.bm.free(seq.seq_id)
            return False
        self.cache.on_admit(seq, cached)
        self._apply_copies(self.bm.append_slots(seq.seq_id, n))
        seq.num_computed_tokens = cached
        self._compute(seq, n, next_token)
        self.running.append(seq)
        return True

    def _leave(self, seq: Sequence, preempt: bool) -> None:
        if preempt:
            self.cache.on_release(seq)
        else:
            self.cache.on_finish(seq)
        self.bm.free(seq.seq_id)
        self.running.remove(seq)
        if preempt:
            seq.num_computed_tokens = 0
            self.waiting.append(seq)

    # ---- rules ------------------------------------------------------------------------------
    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 40),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=12), chunk=st.integers(1, 24),
          next_token=st.integers(0, 3))
    def new_request(self, base: int, cut: int, tail: list[int], chunk: int, next_token: int) -> None:
        """A prompt that reuses a prefix of an earlier one (shared prefixes are the point)."""
        old = self.history[base % len(self.history)]
        tokens = old[: cut % (len(old) + 1)] + tail
        self.history.append(tokens)
        self.orders += 1
        seq = _seq(tokens, self.orders)
        if not self._admit(seq, chunk, next_token):
            self.waiting.append(seq)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 10**6), chunk=st.integers(1, 24), next_token=st.integers(0, 3))
    def readmit(self, i: int, chunk: int, next_token: int) -> None:
        seq = self.waiting[i % len(self.waiting)]
        if self._admit(seq, chunk, next_token):
            self.waiting.remove(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10**6), chunk=st.integers(1, 24), next_token=st.integers(0, 3))
    def step(self, i: int, chunk: int, next_token: int) -> None:
        """Compute a chunk (prefill) or one token (decode) of a running sequence; preempt the
        latest-arrived running sequence while the pool is short, as the scheduler does."""
        seq = self.running[i % len(self.running)]
        n = min(seq.remaining, chunk)
        while not self.bm.can_append(seq.seq_id, n):
            victim = self.running[-1]
            self._leave(victim, preempt=True)
            if victim is seq:
                return
        self._apply_copies(self.bm.append_slots(seq.seq_id, n))
        self._compute(seq, n, next_token)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10**6), preempt=st.booleans())
    def leave(self, i: int, preempt: bool) -> None:
        self._leave(self.running[i % len(self.running)], preempt)

    @precondition(lambda self: any(not s.in_prefill for s in self.running))
    @rule(i=st.integers(0, 10**6), next_token=st.integers(0, 3))
    def fork(self, i: int, next_token: int) -> None:
        """An n > 1 sibling: shares the parent's blocks (no lock of its own), then samples its own token."""
        parents = [s for s in self.running if not s.in_prefill]
        parent = parents[i % len(parents)]
        self.orders += 1
        child = _seq(parent.token_ids[: parent.num_computed_tokens], self.orders)
        child.prompt_len = parent.prompt_len
        self.bm.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        child.token_ids.append(next_token)
        self.running.append(child)

    @rule(n=st.integers(1, 12))
    def evict(self, n: int) -> None:
        before = self.cache.num_evictable_blocks()
        locked = {id(node) for node in self.cache._locked.values()}
        freed = self.cache.evict(n)
        assert freed >= min(n, before)
        assert self.cache.num_evictable_blocks() == before - freed
        assert locked <= {id(node) for node in self.cache._nodes.values()}, "a locked node was evicted"

    @rule(base=st.integers(0, 10**6), tail=st.lists(st.integers(0, 3), max_size=6))
    def match_only(self, base: int, tail: list[int]) -> None:
        tokens = self.history[base % len(self.history)] + tail
        blocks, node = self.cache.match_prefix(tokens)
        for p in range(len(blocks) * self.bs):
            assert self.kv[blocks[p // self.bs] * self.bs + p % self.bs] == _kv(tokens[: p + 1])

    @rule()
    def evict_everything(self) -> None:
        before = self.cache.num_evictable_blocks()
        assert self.cache.evict(10**9) == before
        assert self.cache.num_evictable_blocks() == 0
        # Only what running requests lock is left in the tree.
        assert all(n.lock_ref > 0 for n in self.cache._nodes.values() if n is not self.cache.root)

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "bm"):
            return
        bm, cache, bs = self.bm, self.cache, self.bs
        _check(bm, cache)
        assert bm.available_blocks() == bm.num_free_blocks + cache.num_evictable_blocks()
        assert cache.num_evictable_blocks() <= cache.num_blocks
        # Every cached block holds the KV of exactly the token path that leads to it.
        stack = [(cache.root, [])]
        while stack:
            node, path = stack.pop()
            full = path + node.tokens
            for j, b in enumerate(node.blocks):
                for i in range(bs):
                    p = len(path) + j * bs + i
                    assert self.kv[b * bs + i] == _kv(full[: p + 1]), f"block {b} of node {node.id} is stale"
            stack.extend((c, full) for c in node.children.values())
        for seq in self.running:
            for p in range(seq.num_computed_tokens):  # nobody overwrote or freed a running request's KV
                assert self.kv[bm.slot(seq.seq_id, p)] == _kv(seq.token_ids[: p + 1])
            node = cache.locked_node(seq.seq_id)
            if node is not None and node is not cache.root:
                path: list[int] = []
                m = node
                while m is not cache.root:
                    path = m.tokens + path
                    m = m.parent
                assert path == seq.token_ids[: len(path)] and len(path) <= seq.num_computed_tokens
        for seq in self.waiting:
            assert seq.seq_id not in bm.tables and cache.locked_node(seq.seq_id) is None


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=60, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
