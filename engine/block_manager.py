"""Paged KV bookkeeping: fixed-size physical blocks, a free list, reference counts and block tables.

The block manager never touches tensors. It hands out block ids and, when a sequence must write into
a block it shares with another owner (copy-on-write), it returns the (src, dst) block copies the
engine has to perform on the real KV pool before the forward pass.

Owners of a block are sequences (through their block tables) and, when prefix caching is on, the
radix cache (through `incref`/`decref`). Invariant: ref_count[b] == number of owners of b, and a
block is on the free list iff its ref count is 0.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation cannot be satisfied; the scheduler preempts and retries."""


@dataclass(frozen=True, slots=True)
class BlockCopy:
    src: int
    dst: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts: list[int] = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.num_tokens: dict[int, int] = {}  # tokens each sequence has written (or reserved) in its blocks
        # A stamp per table, new (from one counter) whenever the table's block ids change: whoever
        # mirrors tables elsewhere (the decode graphs' pinned staging) rewrites only changed rows.
        self.versions: dict[int, int] = {}
        self._stamps = itertools.count()
        # Called with the number of blocks still missing; frees what it can (the radix cache's LRU).
        self.evictor: Callable[[int], int] | None = None
        self.evictable: Callable[[], int] = lambda: 0

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def free_list(self) -> tuple[int, ...]:
        """Free block ids in the order `_take` will hand them out (freed blocks go to the back)."""
        return tuple(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def available_blocks(self) -> int:
        """Free now plus what the prefix cache could give back."""
        return len(self._free) + self.evictable()

    def blocks_needed_to_append(self, seq_id: int, num_new_tokens: int) -> int:
        """New blocks `append_slots` would take, copy-on-write of a shared tail block included."""
        table = self.tables.get(seq_id, [])
        have = self.num_tokens.get(seq_id, 0)
        need = self.blocks_for(have + num_new_tokens) - len(table)
        if num_new_tokens > 0 and table and have % self.block_size and self.ref_counts[table[-1]] > 1:
            need += 1  # the partly filled shared tail must be copied before we write into it
        return max(need, 0)

    def can_append(self, seq_id: int, num_new_tokens: int) -> bool:
        return self.blocks_needed_to_append(seq_id, num_new_tokens) <= self.available_blocks()

    # ---- mutations -----------------------------------------------------------------------------
    def _take(self) -> int:
        if not self._free and self.evictor is not None:
            self.evictor(1)
        if not self._free:
            raise NoFreeBlocksError("KV pool exhausted")
        block = self._free.popleft()
        assert self.ref_counts[block] == 0, f"block {block} on the free list with refs"
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise ValueError(f"incref of free block {block}")
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise ValueError(f"double free of block {block}")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)

    def create(self, seq_id: int, prefix_blocks: list[int] = (), prefix_tokens: int = 0) -> None:
        """Start a table, optionally sharing already-filled prefix blocks (prefix cache hit)."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has a block table")
        if prefix_tokens > len(prefix_blocks) * self.block_size:
            raise ValueError("prefix_tokens exceed the prefix blocks")
        for b in prefix_blocks:
            self.incref(b)
        self.tables[seq_id] = list(prefix_blocks)
        self.num_tokens[seq_id] = prefix_tokens
        self._restamp(seq_id)

    def _restamp(self, seq_id: int) -> None:
        """The table's block ids just changed: a new stamp (see `versions`)."""
        self.versions[seq_id] = next(self._stamps)

    def try_append(self, seq_id: int, num_new_tokens: int) -> list[BlockCopy] | None:
        """`append_slots` if the pool has room, else None with nothing changed. The common decode
        case (the token fits in an unshared tail block) costs two dict lookups, not two passes of
        `blocks_needed_to_append`: a scheduler calls this for every running sequence every step."""
        table = self.tables.get(seq_id)
        if table is not None and num_new_tokens > 0:
            have = self.num_tokens[seq_id]
            if have + num_new_tokens <= len(table) * self.block_size and (
                    not have % self.block_size or self.ref_counts[table[-1]] == 1):
                self.num_tokens[seq_id] = have + num_new_tokens
                return []
        try:
            return self.append_slots(seq_id, num_new_tokens)  # checks room first; changes nothing if short
        except NoFreeBlocksError:
            return None

    def append_slots(self, seq_id: int, num_new_tokens: int) -> list[BlockCopy]:
        """Reserve slots for `num_new_tokens` more tokens. All-or-nothing: on failure nothing changes."""
        if self.blocks_needed_to_append(seq_id, num_new_tokens) > self.available_blocks():
            raise NoFreeBlocksError(f"sequence {seq_id} needs more blocks than are free")
        if seq_id not in self.tables:
            self.tables[seq_id] = []
            self._restamp(seq_id)
        table = self.tables[seq_id]
        have = self.num_tokens.setdefault(seq_id, 0)
        copies: list[BlockCopy] = []
        if num_new_tokens > 0 and table and have % self.block_size and self.ref_counts[table[-1]] > 1:
            new = self._take()
            copies.append(BlockCopy(table[-1], new))
            self.decref(table[-1])
            table[-1] = new
            self._restamp(seq_id)
        missing = self.blocks_for(have + num_new_tokens) - len(table)
        if missing > 0:
            table.extend(self._take() for _ in range(missing))
            self._restamp(seq_id)
        self.num_tokens[seq_id] = have + num_new_tokens
        return copies

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ref counts go up; copies happen on write)."""
        self.create(child_id, self.tables[parent_id], self.num_tokens[parent_id])

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Roll back to `num_tokens` (rejected speculative tokens), returning now-unused blocks."""
        table = self.tables[seq_id]
        if num_tokens > self.num_tokens[seq_id]:
            raise ValueError("truncate cannot grow a sequence")
        keep = self.blocks_for(num_tokens)
        if keep < len(table):
            for b in table[keep:]:
                self.decref(b)
            del table[keep:]
            self._restamp(seq_id)
        self.num_tokens[seq_id] = num_tokens

    def free(self, seq_id: int) -> None:
        for b in self.tables.pop(seq_id, []):
            self.decref(b)
        self.num_tokens.pop(seq_id, None)
        self.versions.pop(seq_id, None)

    # ---- views ---------------------------------------------------------------------------------
    def slot(self, seq_id: int, position: int) -> int:
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, seq_id: int, start: int, count: int) -> list[int]:
        if count == 1:  # a decode token
            return [self.slot(seq_id, start)]
        table, bs = self.tables[seq_id], self.block_size
        # One range per block rather than a division per token: a prefill step has thousands.
        out: list[int] = []
        p, end = start, start + count
        while p < end:
            base = table[p // bs] * bs
            stop = min(end, (p // bs + 1) * bs)
            out += range(base + p % bs, base + p % bs + stop - p)
            p = stop
        return out

    def block_fills(self, seq_id: int) -> list[int]:
        n, bs = self.num_tokens[seq_id], self.block_size
        table = self.tables[seq_id]
        return [min(bs, max(0, n - i * bs)) for i in range(len(table))]

    def check_invariants(self, extra_refs: dict[int, int] | None = None) -> None:
        """Ref counts equal owners (tables + extra, e.g. the radix cache); free list is exact."""
        owners = [0] * self.num_blocks
        for table in self.tables.values():
            for b in table:
                owners[b] += 1
        for b, n in (extra_refs or {}).items():
            owners[b] += n
        assert owners == self.ref_counts, "ref counts differ from owners"
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert free == {b for b in range(self.num_blocks) if self.ref_counts[b] == 0}, "free list != zero-ref blocks"
