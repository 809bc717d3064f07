"""Prefill steps as CUDA graphs with attention left out: "piecewise" graphs.

An eager prefill step of this model is ~300 kernel launches, and on the H200's host each costs
~70 us of Python and driver time: a step with 8,192 prompt tokens takes ~22 ms to launch work the
GPU finishes in ~5 ms. A whole-step graph is impossible (every step has other sequences, lengths
and block tables, which attention's launch depends on), but everything around attention only
depends on the number of rows. So for each token-count bucket the pass is captured as L + 1
graphs: embedding -> [RMSNorm, QKV, RoPE + K/V store] of layer 0; then per layer [O projection,
RMSNorm, SwiGLU, and the next layer's RMSNorm, QKV, RoPE + store]; the last one ends in the final
norm. Attention runs eagerly in between on the real rows, with the real batch's metadata, and its
output is copied into the graphs' static input. A step then launches ~4 things a layer instead
of ~10. Layer 0's attention launches are recorded, and layers 1.. replay them with their own
tensors, skipping the wrappers and Triton's launch path (kernels/launch_tape.py).

Rows past the batch's token count (up to the bucket) compute on stale inputs and are ignored:
every op outside attention is row-wise, their slot is -1 (no K/V write) and attention never sees
them. Steps larger than the biggest bucket, and steps while per-kernel profiling is on (a page
showing each kernel's time), run eagerly.
"""
from __future__ import annotations

import time

import torch

from engine.forward_batch import ForwardBatch
from engine.kv_pool import KVPool
from engine.model import LlamaModel
from kernels.graph_capture import capture_graph, capture_session
from kernels.launch_tape import LaunchTape

DEFAULT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class _Captured:
    """One bucket: its graphs and the tensors they read and write (addresses fixed at capture)."""

    def __init__(self) -> None:
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per layer, graph outputs
        self.out: torch.Tensor | None = None


class PiecewiseGraphRunner:
    def __init__(self, model: LlamaModel, pool: KVPool, max_tokens: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, replay_launches: bool = True) -> None:
        self.model, self.pool = model, pool
        top = next((b for b in buckets if b >= max_tokens), buckets[-1])
        self.buckets = tuple(b for b in buckets if b <= top)
        cfg, dev, n = model.cfg, model.device, max(self.buckets)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.attn = torch.zeros(n, cfg.num_heads * cfg.head_dim, dtype=model.dtype, device=dev)
        self.captured: dict[int, _Captured] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.capture_seconds = 0.0
        # Layers 1.. replay layer 0's attention launches with their own tensors (kernels/launch_tape.py),
        # when both attention kernels are ours (a torch reference's ops would not be on the tape); off:
        # every layer launches through the kernels' wrappers (what the tape is checked against).
        k = model.kernels
        self.replay_launches = (replay_launches and k.label("prefill_attention") == "triton"
                                and k.label("paged_attention") == "triton")
        self._pool_layers = [pool.layer(i) for i in range(len(model.layers))]  # views made once
        self.replayed_layers = 0  # layers whose attention came from a tape (tests and benches read it)

    def bucket_for(self, num_tokens: int) -> int | None:
        return next((b for b in self.buckets if b >= num_tokens), None)

    def usable(self, batch: ForwardBatch, num_layers: int | None) -> bool:
        """Steps with prefill rows (decode-only steps have their own whole-step graphs), all layers,
        no per-kernel profiling, and not while another graph is being captured."""
        return (num_layers is None and (batch.num_fresh_tokens > 0 or batch.max_query_len > 1)
                and not self.model.kernels.timer.enabled and self.bucket_for(batch.num_tokens) is not None
                and not torch.cuda.is_current_stream_capturing())

    # ---- capture -------------------------------------------------------------------------------
    def _pieces(self, n: int, cap: _Captured | None):
        """The pass over the first n static rows as a list of callables, one per graph; with `cap`
        they record their outputs there. Attention is not in them: piece i + 1 reads self.attn."""
        m, pool = self.model, self.pool
        state: dict[str, torch.Tensor | None] = {}

        def first() -> None:
            h = m.embed[self.input_ids[:n]]
            q, k, v, state["residual"] = m.pre_attention(0, h, None, self.positions[:n], self.slot_mapping[:n], pool)
            if cap is not None:
                cap.qkv.append((q, k, v))

        def middle(i: int):
            def piece() -> None:
                h, residual = m.post_attention(i - 1, self.attn[:n], state["residual"])
                q, k, v, state["residual"] = m.pre_attention(i, h, residual, self.positions[:n],
                                                             self.slot_mapping[:n], pool)
                if cap is not None:
                    cap.qkv.append((q, k, v))
            return piece

        def last() -> None:
            h, residual = m.post_attention(len(m.layers) - 1, self.attn[:n], state["residual"])
            out = m.final_hidden(h, residual)
            if cap is not None:
                cap.out = out

        return [first, *(middle(i) for i in range(1, len(m.layers))), last]

    def _capture(self, n: int) -> _Captured:
        """Warm up and capture every piece of bucket n in one capture session (kernels/graph_capture.py),
        entered before anything runs: on GpuBusy nothing has been done (LlamaModel then runs the step eagerly)."""
        t0 = time.perf_counter()
        with capture_session():
            self.slot_mapping.fill_(-1)  # the warm-up pass below must not write K/V into anyone's slots
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up: Triton compiles and autotunes outside the capture
                for piece in self._pieces(n, None):
                    piece()
            torch.cuda.current_stream().wait_stream(stream)
            cap = _Captured()
            for piece in self._pieces(n, cap):  # captured in the order they replay (they share one pool)
                g = torch.cuda.CUDAGraph()
                with capture_graph(g, pool=self.mempool):
                    piece()
                cap.graphs.append(g)
        self.captured[n] = cap
        self.capture_seconds += time.perf_counter() - t0
        return cap

    # ---- run -----------------------------------------------------------------------------------
    def hidden_states(self, batch: ForwardBatch) -> torch.Tensor:
        """The final-normed hidden state of every row [T, hidden], as LlamaModel.hidden_states."""
        t = batch.num_tokens
        bucket = self.bucket_for(t)
        if bucket is None:
            raise ValueError(f"a step of {t} tokens exceeds the largest prefill graph bucket {max(self.buckets)}")
        cap = self.captured.get(bucket) or self._capture(bucket)
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.slot_mapping[:t].copy_(batch.slot_mapping)
        self.slot_mapping[t:bucket].fill_(-1)
        m = self.model
        tape = LaunchTape() if self.replay_launches else None
        for i, graph in enumerate(cap.graphs):
            graph.replay()
            if i < len(m.layers):
                q, k, v = cap.qkv[i]
                movers = (q, k, v, *self._pool_layers[i])
                if i > 0 and tape is not None and tape.replay(movers):
                    self.replayed_layers += 1
                    continue  # layer 0's attention launches, on this layer's q, k, v and KV pool
                out = self.attn[:t].view(q[:t].shape)
                if i == 0 and tape is not None:
                    with tape.recording():
                        m.attention(q[:t], k[:t], v[:t], i, batch, self.pool, out=out)
                    tape.bind(movers)
                else:
                    m.attention(q[:t], k[:t], v[:t], i, batch, self.pool, out=out)
        return cap.out[:t]
