"""Decode steps replayed as CUDA graphs, one graph per batch-size bucket.

At batch 1 a decode step of this model is ~400 small kernels; launched one by one from Python they
cost more than the arithmetic. A graph records the launches once and replays them with one call.
Graphs need static shapes and addresses, so a decode batch is padded up to its bucket: padding rows
write no KV (slot -1) and read a one-token context. The context is sized for `max_model_len`
so the paged kernel's split count never depends on the step.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from engine.forward_batch import ForwardBatch
from engine.kv_pool import KVPool
from engine.model import LlamaModel
from kernels.device_gate import GpuBusy
from kernels.graph_capture import capture_graph, capture_session

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class DecodeGraphRunner:
    def __init__(self, model: LlamaModel, pool: KVPool, max_model_len: int, block_size: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.model, self.pool = model, pool
        self.buckets = buckets
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        dev = model.device
        b = max(buckets)
        self._b = b
        # Static inputs shared by every bucket's graph (a graph reads the first `bucket` rows), in two
        # flat buffers so a step's inputs go over from pinned host memory in three copies
        # (`replay_rows`): ids | positions | slots | gather rows as int64, seq_lens | block tables as
        # int32 (the tables start on a 16-byte boundary, as Triton's pointer specialisation expects).
        self._i64 = torch.zeros(4 * b, dtype=torch.int64, device=dev)
        self.input_ids, self.positions = self._i64[:b], self._i64[b:2 * b]
        self.slot_mapping, self._src = self._i64[2 * b:3 * b], self._i64[3 * b:]
        self.slot_mapping.fill_(-1)
        self._lens_pad = -(-b // 4) * 4
        self._i32 = torch.zeros(self._lens_pad + b * self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = self._i32[:b]
        self.seq_lens.fill_(1)
        self.block_tables = self._i32[self._lens_pad:].view(b, self.max_blocks)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=dev)
        self.row_ids = torch.arange(b, device=dev)
        self.no_fresh = torch.zeros(1, dtype=torch.int32, device=dev)
        # Multi-LoRA engines: each row's adapter slot (-1: base model, padding). The graphs then hold the
        # LoRA kernels, which read whatever adapters the slots hold at replay (engine/lora/slots.py).
        self.lora_slots = (torch.full((b,), -1, dtype=torch.int32, device=dev) if model.lora is not None
                           else None)
        # Pinned staging, a ring of three: a set is refilled only after its previous copies left
        # (its event), and with two steps in flight (engine/overlap.py) the third is always free.
        self._staging = [_HostStaging(b, self._lens_pad, self.max_blocks) for _ in range(3)]
        self._next_staging = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.capture_seconds = 0.0

    def bucket_for(self, batch_size: int) -> int | None:
        return next((b for b in self.buckets if b >= batch_size), None)

    def _bucket(self, n: int) -> int:
        bucket = self.bucket_for(n)
        if bucket is None:
            raise ValueError(f"decode batch of {n} exceeds the largest graph bucket {max(self.buckets)}")
        return bucket

    def _replay(self, bucket: int, n: int) -> torch.Tensor:
        """Replay the bucket's graph on the static inputs already written (capturing it first if it is
        new: the capture's warm-up runs store this step's KV, so the inputs must be in place)."""
        if bucket not in self.graphs:
            try:
                self._capture(bucket)
            except GpuBusy:  # the GPU was never free to capture alone: this step runs eagerly, the same sums
                return self.model.forward(self._batch(bucket), self.pool)[:n]
        self.graphs[bucket].replay()
        return self.outputs[bucket][:n]

    def _batch(self, n: int) -> ForwardBatch:
        # Every tensor here must outlive the graph: a replay reads these very addresses, and a
        # temporary freed after capture would be handed to someone else by the caching allocator.
        return ForwardBatch(
            input_ids=self.input_ids[:n], positions=self.positions[:n], slot_mapping=self.slot_mapping[:n],
            num_fresh_tokens=0, fresh_cu_seqlens=self.no_fresh, fresh_max_len=0, fresh_lens=(),
            block_tables=self.block_tables[:n], seq_lens=self.seq_lens[:n],
            query_start_loc=self.query_start_loc[: n + 1], max_query_len=1, max_seq_len=self.max_model_len,
            q_lens=(1,) * n, ctx_lens=(1,) * n,
            logits_indices=self.row_ids[:n],
            lora_slots=None if self.lora_slots is None else self.lora_slots[:n],
        )

    def _capture(self, n: int) -> None:
        """Warm up and capture bucket n in one capture session, entered before anything runs: if the GPU is
        never free (GpuBusy), nothing has been done and the caller runs the step eagerly."""
        t0 = time.perf_counter()
        with capture_session():
            batch = self._batch(n)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                    self.model.forward(batch, self.pool)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with capture_graph(graph, pool=self.mempool):
                self.outputs[n] = self.model.forward(batch, self.pool)
            self.graphs[n] = graph
        self.capture_seconds += time.perf_counter() - t0

    def replay_rows(self, tokens: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
                    gather: tuple[torch.Tensor, list[int]] | None = None,
                    versions: list[int] | None = None) -> torch.Tensor:
        """The decode step's path in overlapped decode (engine/overlap.py): rows given as host lists
        (input token, position, KV slot, block table; the context is position + 1 long) are written
        straight into pinned staging laid out as the static inputs and sent in three copies, instead
        of a ForwardBatch on the device then eight device-side copies and fills.
        `gather = (previous, src)`: row i's input is `previous[src[i]]` (a device tensor, the step
        before's argmax) where src[i] >= 0, its host token otherwise. `versions`: each table's stamp
        (BlockManager.versions); a staging row that already holds that stamp's table is not rewritten.
        Returns the real rows' logits."""
        n = len(positions)
        bucket = self._bucket(n)
        st = self._staging[self._next_staging]
        self._next_staging = (self._next_staging + 1) % len(self._staging)
        st.copied.synchronize()  # its last copies have left (long since, with a ring of three)
        b = self._b
        st.i64_np[:n] = tokens
        st.i64_np[b:b + n] = positions
        st.i64_np[2 * b:2 * b + n] = slots
        st.i64_np[2 * b + n:2 * b + bucket] = -1  # padding rows store nothing...
        src = gather[1] if gather is not None else None
        prefix = src is not None and src == list(range(n))  # the steady state: same rows, same order
        if src is not None and not prefix:
            st.i64_np[3 * b:3 * b + n] = src
        st.lens_np[:n] = positions
        st.lens_np[:n] += 1
        st.lens_np[n:bucket] = 1  # ...and read a one-token context
        stage_tables(st.tables_np, st.row_versions, tables, versions)
        self._i64.copy_(st.i64, non_blocking=True)
        self.seq_lens[:bucket].copy_(st.i32[:bucket], non_blocking=True)
        self.block_tables[:bucket].copy_(st.tables[:bucket], non_blocking=True)
        st.copied.record()
        if prefix:
            self.input_ids[:n].copy_(gather[0][:n])
        elif src is not None:
            rows = self._src[:n]
            self.input_ids[:n] = torch.where(rows >= 0, gather[0][rows.clamp(min=0)], self.input_ids[:n])
        return self._replay(bucket, n)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay the bucket's graph for a decode-only batch; returns logits for its real rows."""
        n = batch.num_tokens
        bucket = self._bucket(n)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.slot_mapping[n:bucket].fill_(-1)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:bucket].fill_(1)
        self.block_tables[:n].zero_()
        self.block_tables[:n, : batch.block_tables.shape[1]].copy_(batch.block_tables)
        if self.lora_slots is not None:
            if batch.lora_slots is None:
                self.lora_slots[:bucket].fill_(-1)
            else:
                self.lora_slots[:n].copy_(batch.lora_slots)
                self.lora_slots[n:bucket].fill_(-1)
        return self._replay(bucket, n)


def stage_tables(dst: np.ndarray, held: list[int], tables: list[list[int]], versions: list[int] | None) -> None:
    """Write row r of `dst` from tables[r], unless `held[r]` says the row already holds that table.

    Only each row's own entries are written: the rest are never read (a row reads ceil(seq_len /
    block) entries) and hold earlier steps' block ids, valid indices all, so nothing is cleared.
    `versions[r]` is the table's BlockManager stamp, new whenever its block ids change, and `held`
    remembers the stamp each row of `dst` was written from. A table changes once every block_size
    decode steps, so most rows are skipped: writing one from a Python list costs ~1.5 us, which at
    a few hundred rows was a third of an overlapped decode step's host time. Without `versions`
    every row is written and marked unknown."""
    if versions is None:
        for r, table in enumerate(tables):
            dst[r, :len(table)] = table
            held[r] = -1
        return
    for r, (table, v) in enumerate(zip(tables, versions)):
        if held[r] != v:
            dst[r, :len(table)] = table
            held[r] = v


class _HostStaging:
    """One set of pinned host buffers in the runner's static-input layout, with numpy views for cheap
    filling, and the event recorded after their copies were queued."""

    def __init__(self, b: int, lens_pad: int, max_blocks: int) -> None:
        self.i64 = torch.zeros(4 * b, dtype=torch.int64).pin_memory()
        self.i32 = torch.zeros(lens_pad + b * max_blocks, dtype=torch.int32).pin_memory()
        self.tables = self.i32[lens_pad:].view(b, max_blocks)
        self.i64_np, self.lens_np, self.tables_np = self.i64.numpy(), self.i32[:b].numpy(), self.tables.numpy()
        self.row_versions = [-1] * b  # the BlockManager stamp of the table each row holds (-1: unknown)
        self.copied = torch.cuda.Event()
        self.copied.record()
