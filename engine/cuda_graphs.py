"""Decode steps replayed as CUDA graphs, one graph per batch-size bucket.

At batch 1 a decode step of this model is ~400 small kernels; launched one by one from Python they
cost more than the arithmetic. A graph records the launches once and replays them with one call.
Graphs need static shapes and addresses, so a decode batch is padded up to its bucket: padding rows
write no KV (slot -1) and read a one-token context. The context is sized for `max_model_len`
so the paged kernel's split count never depends on the step.
"""
from __future__ import annotations

import time

import torch

from engine.forward_batch import ForwardBatch
from engine.kv_pool import KVPool
from engine.model import LlamaModel

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
        # Static inputs shared by every bucket's graph (a graph reads the first `bucket` rows).
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((b,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros((b, self.max_blocks), dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=dev)
        self.row_ids = torch.arange(b, device=dev)
        self.no_fresh = torch.zeros(1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.capture_seconds = 0.0

    def bucket_for(self, batch_size: int) -> int | None:
        return next((b for b in self.buckets if b >= batch_size), None)

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
        )

    def _capture(self, n: int) -> None:
        t0 = time.perf_counter()
        batch = self._batch(n)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                self.model.forward(batch, self.pool)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self.outputs[n] = self.model.forward(batch, self.pool)
        self.graphs[n] = graph
        self.capture_seconds += time.perf_counter() - t0

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay the bucket's graph for a decode-only batch; returns logits for its real rows."""
        n = batch.num_tokens
        bucket = self.bucket_for(n)
        if bucket is None:
            raise ValueError(f"decode batch of {n} exceeds the largest graph bucket {max(self.buckets)}")
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.slot_mapping[n:bucket].fill_(-1)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:bucket].fill_(1)
        self.block_tables[:n].zero_()
        self.block_tables[:n, : batch.block_tables.shape[1]].copy_(batch.block_tables)
        if bucket not in self.graphs:
            self._capture(bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:n]
