"""The KV pool as a page sees it: who owns each block, how full it is, and how much a contiguous
max-length reservation would have wasted for the same sequences (the paging argument, measured)."""
from __future__ import annotations

import resource
from typing import Iterable

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import Sequence
from engine.trace import MemorySplit, PoolSummary


def pool_summary(bm: BlockManager, config: EngineConfig, sequences: Iterable[Sequence],
                 running: Iterable[Sequence], prefix_cache=None) -> PoolSummary:  # noqa: ANN001 (RadixCache)
    bs = config.block_size
    fill = [0] * bm.num_blocks
    owners: list[set[str]] = [set() for _ in range(bm.num_blocks)]
    label = {s.seq_id: s.label for s in sequences}
    for sid, table in bm.tables.items():
        for b, f in zip(table, bm.block_fills(sid)):
            fill[b] = max(fill[b], f)
            owners[b].add(label.get(sid, str(sid)))
    cache_refs = prefix_cache.block_refs() if prefix_cache is not None else {}
    for b in cache_refs:
        fill[b] = bs  # the tree only ever holds whole blocks
    used = [b for b in range(bm.num_blocks) if bm.ref_counts[b] > 0]
    allocated = len(used) * bs
    filled = sum(fill[b] for b in used)
    live = [s for s in running if s.seq_id in bm.tables]
    reserved = len(live) * config.max_model_len
    live_tokens = sum(bm.num_tokens[s.seq_id] for s in live)

    def owner(b: int) -> str:
        if not owners[b]:
            return "cache" if b in cache_refs else ""
        return next(iter(owners[b])) if len(owners[b]) == 1 else "shared"

    return PoolSummary(
        num_blocks=bm.num_blocks, block_size=bs, used_blocks=len(used), free_blocks=bm.num_free_blocks,
        cached_blocks=sum(1 for b in used if not owners[b]), allocated_tokens=allocated,
        filled_tokens=filled, internal_waste_tokens=allocated - filled,
        contiguous_reserved_tokens=reserved, contiguous_waste_tokens=reserved - live_tokens,
        ref_counts=tuple(bm.ref_counts), owners=tuple(owner(b) for b in range(bm.num_blocks)),
        free_list=bm.free_list,
    )


def light_pool_summary(bm: BlockManager) -> PoolSummary:
    """Counts only (no per-block tuples): what a benchmark with thousands of blocks can afford."""
    bs = bm.block_size
    used = bm.num_used_blocks
    filled = sum(bm.num_tokens.values())
    return PoolSummary(bm.num_blocks, bs, used, bm.num_free_blocks, 0, used * bs, filled,
                       used * bs - filled, 0, 0, (), ())


def memory_split(weight_bytes: int, kv_pool_bytes: int, device: torch.device) -> MemorySplit:
    """Other = peak CUDA allocation (or, on the CPU, the process's peak RSS) minus weights and pool."""
    if device.type == "cuda":
        other = max(torch.cuda.max_memory_allocated(device) - weight_bytes - kv_pool_bytes, 0)
    else:
        other = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - weight_bytes - kv_pool_bytes, 0)
    return MemorySplit(weight_bytes, kv_pool_bytes, int(other))
