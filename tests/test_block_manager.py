"""Block manager invariants under thousands of random operations (hypothesis state machine)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.block_manager import BlockManager, NoFreeBlocksError
from engine.cuda_graphs import stage_tables


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=24, block_size=4)
        self.next_id = 0
        # Our own model of what each sequence holds, to check the manager against.
        self.lengths: dict[int, int] = {}
        # The decode graphs' pinned staging in small: rows filled by stage_tables, which skips a row
        # whose table stamp it already holds (so a stamp that failed to change would leave it stale).
        self.staged = np.full((8, 24), -7, dtype=np.int32)
        self.held = [-1] * 8
        self.seen: dict[int, tuple[int, tuple[int, ...]]] = {}  # sid -> (stamp, table) last seen

    @rule(n=st.integers(1, 20))
    def create_and_append(self, n: int) -> None:
        sid = self.next_id
        self.next_id += 1
        self.bm.create(sid)
        try:
            self.bm.append_slots(sid, n)
            self.lengths[sid] = n
        except NoFreeBlocksError:
            assert self.bm.blocks_for(n) > self.bm.num_free_blocks
            self.bm.free(sid)

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), n=st.integers(1, 9))
    def append(self, data, n: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        before = list(self.bm.tables[sid])
        try:
            copies = self.bm.append_slots(sid, n)
        except NoFreeBlocksError:
            assert self.bm.tables[sid] == before, "a failed append must change nothing"
            return
        self.lengths[sid] += n
        for c in copies:  # copy-on-write replaced the shared tail with a private block
            assert c.src in before and c.dst in self.bm.tables[sid]
            assert self.bm.ref_counts[c.dst] == 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), n=st.integers(1, 9))
    def try_append(self, data, n: int) -> None:
        """The scheduler's one-call append: room exactly when can_append says so, the same effect as
        append_slots when there is, no change at all when there is not."""
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        before = list(self.bm.tables[sid])
        fits = self.bm.can_append(sid, n)
        copies = self.bm.try_append(sid, n)
        assert (copies is not None) == fits
        if copies is None:
            assert self.bm.tables[sid] == before and self.bm.num_tokens[sid] == self.lengths[sid]
            return
        self.lengths[sid] += n
        for c in copies:
            assert c.src in before and c.dst in self.bm.tables[sid]
            assert self.bm.ref_counts[c.dst] == 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def fork(self, data) -> None:
        parent = data.draw(st.sampled_from(sorted(self.lengths)))
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.lengths[child] = self.lengths[parent]
        assert self.bm.tables[child] == self.bm.tables[parent]

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def free(self, data) -> None:
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        self.bm.free(sid)
        del self.lengths[sid]

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def truncate(self, data) -> None:
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        keep = data.draw(st.integers(0, self.lengths[sid]))
        self.bm.truncate(sid, keep)
        self.lengths[sid] = keep

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def stage(self, data) -> None:
        """Stage some live tables, in any order, as an overlapped decode step would."""
        sids = data.draw(st.lists(st.sampled_from(sorted(self.lengths)), min_size=1, max_size=8, unique=True))
        tables = [self.bm.tables[s] for s in sids]
        stage_tables(self.staged, self.held, tables, [self.bm.versions[s] for s in sids])
        for r, table in enumerate(tables):
            assert list(self.staged[r, :len(table)]) == table, "a staged row holds a stale table"

    @invariant()
    def a_table_keeps_its_stamp_only_while_unchanged(self) -> None:
        for sid in self.lengths:
            now = (self.bm.versions[sid], tuple(self.bm.tables[sid]))
            old = self.seen.get(sid)
            if old is not None and old[0] == now[0]:
                assert old[1] == now[1], "the table changed but kept its stamp"
            self.seen[sid] = now
        assert set(self.bm.versions) == set(self.bm.tables)

    @invariant()
    def refcounts_equal_owners_and_nothing_leaks(self) -> None:
        self.bm.check_invariants()
        assert self.bm.num_free_blocks + self.bm.num_used_blocks == self.bm.num_blocks
        for sid, n in self.lengths.items():
            assert self.bm.num_tokens[sid] == n
            assert len(self.bm.tables[sid]) == self.bm.blocks_for(n)

    @invariant()
    def private_blocks_never_shared_by_writers(self) -> None:
        # Two sequences may share a block only if neither can write into it without copying first.
        for sid in self.lengths:
            assert sum(self.bm.block_fills(sid)) == self.lengths[sid]

    def teardown(self) -> None:
        for sid in list(self.lengths):
            self.bm.free(sid)
        self.bm.check_invariants()
        assert self.bm.num_free_blocks == self.bm.num_blocks, "a block leaked"


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_double_free_is_refused() -> None:
    bm = BlockManager(4, 4)
    bm.create(0)
    bm.append_slots(0, 4)
    block = bm.tables[0][0]
    bm.free(0)
    with pytest.raises(ValueError, match="double free"):
        bm.decref(block)


def test_copy_on_write_copies_only_the_shared_partial_tail() -> None:
    bm = BlockManager(8, 4)
    bm.create(0)
    bm.append_slots(0, 6)  # one full block, one half-full
    bm.fork(0, 1)
    full, tail = bm.tables[0]
    assert bm.ref_counts[full] == bm.ref_counts[tail] == 2
    copies = bm.append_slots(1, 1)
    assert [(c.src) for c in copies] == [tail]
    assert bm.tables[1][0] == full and bm.tables[1][1] != tail
    assert bm.ref_counts[full] == 2 and bm.ref_counts[tail] == 1
    assert bm.append_slots(0, 1) == []  # the parent now owns its tail alone: no copy
