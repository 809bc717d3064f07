"""The packed, unpadded batch one forward pass consumes.

Rows are ordered: first the sequences prefilling from position 0 (attention over their own new
tokens only, the FlashAttention varlen path), then every other sequence (decode tokens and prefill
chunks continuing a cached prefix, read through block tables by paged attention).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 (-1 = padding row, nothing stored)
    # fresh-prefill section: rows [0, num_fresh_tokens)
    num_fresh_tokens: int
    fresh_cu_seqlens: torch.Tensor  # [Bf + 1] int32
    fresh_max_len: int
    fresh_lens: tuple[int, ...]
    # paged section: rows [num_fresh_tokens, T)
    block_tables: torch.Tensor  # [Bp, max_blocks] int32
    seq_lens: torch.Tensor  # [Bp] int32: context length including this step's tokens
    query_start_loc: torch.Tensor  # [Bp + 1] int32, relative to the paged section
    max_query_len: int
    max_seq_len: int
    q_lens: tuple[int, ...]
    ctx_lens: tuple[int, ...]
    logits_indices: torch.Tensor  # [S] rows whose next-token logits are needed
    # Tree verification (Medusa / EAGLE): per paged sequence, None or a [q_len, q_len] bool mask over
    # its new rows (row i may see row j: j is i or one of its ancestors); its context stays visible.
    # Empty when no sequence of the batch verifies a tree (every paged row is causal).
    tree_masks: tuple[torch.Tensor | None, ...] = ()
    # Multi-LoRA: [T] int32, each row's adapter slot (-1: the base model); None when no row has one.
    lora_slots: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_paged_seqs(self) -> int:
        return len(self.q_lens)


def build_forward_batch(
    fresh: list[tuple[list[int], int, list[int]]],  # (token ids, start position, slots) per sequence
    paged: list[tuple[list[int], int, list[int], list[int]]],  # (+ block table) per sequence
    logits_rows: list[int],
    device: torch.device,
    trees: dict[int, tuple[list[int], torch.Tensor]] | None = None,  # paged index -> (depths, mask)
    lora_slots: list[int] | None = None,  # per row, in row order (fresh rows first); None: no adapters
) -> ForwardBatch:
    """`trees`: a paged sequence whose new rows are a draft tree, flattened parents-first: row i
    sits at position start + depths[i] (siblings share a position) but keeps its own slot."""
    # Plain Python lists first, then one host-to-device copy per tensor: at a few hundred sequences
    # per step, per-sequence tensor construction would cost more than the decode itself.
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    cu = [0]
    for tokens, start, sl in fresh:
        ids += tokens
        pos += range(start, start + len(tokens))
        slots += sl
        cu.append(cu[-1] + len(tokens))
    qsl = [0]
    q_lens: list[int] = []
    ctx_lens: list[int] = []
    width = max((len(t) for *_, t in paged), default=1) or 1
    flat_tables: list[int] = []
    for b, (tokens, start, sl, table) in enumerate(paged):
        n = len(tokens)
        ids += tokens
        if trees and b in trees:
            pos += [start + d for d in trees[b][0]]
        else:
            pos += range(start, start + n)
        slots += sl
        qsl.append(qsl[-1] + n)
        q_lens.append(n)
        ctx_lens.append(start + n)
        flat_tables += table
        flat_tables += [0] * (width - len(table))
    fresh_lens = tuple(cu[i + 1] - cu[i] for i in range(len(cu) - 1))
    input_ids, positions, slot_mapping, logits_indices = _to_device([ids, pos, slots, logits_rows], torch.int64, device)
    fresh_cu, qsl_t, seq_lens, tables = _to_device([cu, qsl, ctx_lens, flat_tables], torch.int32, device)
    return ForwardBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        num_fresh_tokens=cu[-1],
        fresh_cu_seqlens=fresh_cu,
        fresh_max_len=max(fresh_lens, default=0),
        fresh_lens=fresh_lens,
        block_tables=tables.view(len(paged), width),
        seq_lens=seq_lens,
        query_start_loc=qsl_t,
        max_query_len=max(q_lens, default=0),
        max_seq_len=max(ctx_lens, default=0),
        q_lens=tuple(q_lens),
        ctx_lens=tuple(ctx_lens),
        logits_indices=logits_indices,
        tree_masks=tuple(trees[b][1].to(device) if b in trees else None for b in range(len(paged))) if trees else (),
        lora_slots=_to_device([lora_slots], torch.int32, device)[0] if lora_slots else None,
    )


_NUMPY_INTS = {torch.int64: np.int64, torch.int32: np.int32}


def _to_device(fields: list[list[int]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """One host-to-device copy for several integer fields, returned as views. On a GPU each small
    copy costs ~20 us of launch and transfer (eight of them were a tenth of a batch-1 decode step).
    Every field starts on a 16-byte boundary, as Triton's pointer specialisation expects."""
    align = 16 // torch.empty((), dtype=dtype).element_size()
    flat: list[int] = []
    starts = []
    for f in fields:
        starts.append(len(flat))
        flat += f
        flat += [0] * (-len(flat) % align)
    # numpy converts a list of Python ints 2-3x faster than torch.tensor (a prefill step of 8,192
    # tokens has ~25k of them: 1.4 ms against 0.6 ms), and torch takes the array without a copy.
    whole = torch.from_numpy(np.array(flat, dtype=_NUMPY_INTS[dtype]))
    if device.type == "cuda":
        # From pinned memory the copy is asynchronous; from pageable memory the driver may wait for
        # the stream first, which would stall the host behind the GPU (engine/overlap.py).
        whole = whole.pin_memory().to(device, non_blocking=True)
    else:
        whole = whole.to(device)
    return [whole[s:s + len(f)] for s, f in zip(starts, fields)]
