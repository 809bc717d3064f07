"""The one place that picks an implementation for each kernel family and times every call.

`backend="auto"` means Triton on CUDA and the torch reference elsewhere; a page can force either to
compare them. Triton on the CPU only works under TRITON_INTERPRET=1 (tests at small shapes).
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Callable

import torch
import torch.nn.functional as F

from kernels.cpu_linear import cpu_linear
from kernels.kv_store_ref import store_kv_ref
from kernels.lora_ref import lora_apply_ref, lora_cost
from kernels.paged_attention_ref import paged_attention_ref
from kernels.pdl import pdl_supported
from kernels.prefill_attention_ref import flash_attention_varlen_ref
from kernels.rmsnorm_ref import rmsnorm_ref
from kernels.rope_store_ref import rope_store_ref
from kernels.silu_mul_ref import silu_mul_ref
from kernels.timing import KernelTimer

# fp32 runs are the exactness reference (the same tokens as the torch path), so fp32 dots inside
# our Triton kernels use full IEEE fp32 instead of Triton's TF32 default. bf16/fp16 dots (the fast
# path) are unaffected. Read by Triton when it compiles a kernel.
os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")


def fp32_dot_precision() -> str:
    """How Triton compiles fp32 dots in this process ("ieee" unless the environment chose otherwise),
    for pages that say what an fp32 kernel row computed."""
    return os.environ.get("TRITON_F32_DEFAULT", "tf32")

# family -> (module, function) of the Triton implementation, imported lazily so the CPU path never
# needs a working Triton install.
_TRITON_IMPLS: dict[str, tuple[str, str]] = {
    "store_kv": ("kernels.kv_store_triton", "store_kv_triton"),
    "prefill_attention": ("kernels.prefill_attention_triton", "flash_attention_varlen_triton"),
    "paged_attention": ("kernels.paged_attention_triton", "paged_attention_triton"),
    "rmsnorm": ("kernels.rmsnorm_triton", "rmsnorm_triton"),
    "rope_store": ("kernels.rope_store_triton", "rope_store_triton"),
    "silu_mul": ("kernels.silu_mul_triton", "silu_mul_triton"),
    "lora": ("kernels.lora_triton", "lora_apply_triton"),
}
_REF_IMPLS: dict[str, Callable] = {
    "store_kv": store_kv_ref,
    "prefill_attention": flash_attention_varlen_ref,
    "paged_attention": paged_attention_ref,
    "rmsnorm": rmsnorm_ref,
    "rope_store": rope_store_ref,
    "silu_mul": silu_mul_ref,
    "lora": lora_apply_ref,
}


# Largest batch (rows) whose kernels are PDL-launched: the GEMV's.
PDL_MAX_ROWS = 8
# Families whose Triton implementation takes the `pdl` switch (every kernel of a decode step).
_PDL_FAMILIES = frozenset({"paged_attention", "rmsnorm", "rope_store", "silu_mul", "lora"})


def _gemv_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    from kernels.gemv_triton import gemv_applies
    return gemv_applies(x, w)


def _gemv(x: torch.Tensor, w: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    from kernels.gemv_triton import gemv_triton
    return gemv_triton(x, w, pdl=pdl)


def _paged_cost(q: torch.Tensor, k_cache: torch.Tensor, q_lens, ctx_lens) -> tuple[float, float]:
    """FLOPs and bytes of attention over paged context: QK^T and PV for every query row against its
    context; reads Q, the context's K and V, writes O."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    flops = sum(2 * 2 * hq * d * ql * cl for ql, cl in zip(q_lens, ctx_lens))
    nbytes = (2 * q.numel() + 2 * hkv * d * sum(ctx_lens)) * q.element_size()
    return flops, nbytes


def triton_usable(device: torch.device) -> bool:
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None


def resolve_backend(requested: str, device: torch.device) -> str:
    if requested == "torch":
        return "torch"
    if requested == "triton":
        if not triton_usable(device):
            raise ValueError(f"kernel_backend='triton' needs CUDA (or TRITON_INTERPRET=1); device is {device}")
        return "triton"
    return "triton" if device.type == "cuda" and triton_usable(device) else "torch"


class Kernels:
    """Kernel families behind one object; every call is timed and counted into `timer`."""

    def __init__(self, backend: str, device: torch.device, profile: bool = True, pdl: bool = True) -> None:
        self.device = torch.device(device)
        self.backend = resolve_backend(backend, self.device)
        self.timer = KernelTimer(self.device, enabled=profile)
        self._impls = {name: self._load(name) for name in _REF_IMPLS}
        # Programmatic dependent launch between our Triton kernels (Hopper and newer): each kernel
        # launches while the previous one finishes and waits on-device for its output
        # (kernels/pdl.py). Off when profiling: per-kernel CUDA events measure launches
        # one at a time anyway.
        self.pdl = pdl and self.backend == "triton" and not profile and pdl_supported(self.device)

    def _load(self, family: str) -> Callable:
        if self.backend == "torch":
            return _REF_IMPLS[family]
        module, fn = _TRITON_IMPLS[family]
        try:
            return getattr(importlib.import_module(module), fn)
        except (ImportError, AttributeError):
            # A family without a Triton kernel yet keeps the reference (the timing label says so).
            return _REF_IMPLS[family]

    def label(self, family: str) -> str:
        return "triton" if self._impls[family] is not _REF_IMPLS[family] else "torch"

    @functools.cached_property
    def description(self) -> str:
        """Which kernels run where, for every StepRecord (cached: asking CUDA for the device name
        each step cost ~40 us of a ~550 us batch-1 decode step)."""
        if self.backend == "torch":
            where = "CPU" if self.device.type == "cpu" else str(self.device)
            return f"torch reference kernels on {where}"
        return f"Triton kernels on {torch.cuda.get_device_name(self.device) if self.device.type == 'cuda' else 'CPU (interpreter)'}"

    def _use_pdl(self, rows: int) -> bool:
        """PDL only where it was measured to pay (bench/NOTES_kernels.md v7): kernels of decode-sized
        batches captured into a CUDA graph, where the gap between dependent kernels is the cost.
        Eager launches are bound by the host, and with PDL on every kernel the synchronous engine
        measured slower on 256 requests (H200, two runs each: 24-26k vs 35-41k tok/s with graphs,
        4.4-5.1k vs 6.6-6.8k eager)."""
        return self.pdl and rows <= PDL_MAX_ROWS and torch.cuda.is_current_stream_capturing()

    def _call(self, family: str, name: str, cost: Callable[[], tuple[float, float]], *args, **kwargs):
        """Run a family's implementation, timed with its (FLOPs, bytes) when profiling. Without
        profiling the cost is never computed: summing over every sequence of a 256-request batch
        in every layer cost milliseconds of host time per eager step."""
        impl = self._impls[family]
        if not self.timer.enabled:
            if family in _PDL_FAMILIES and self._use_pdl(args[0].shape[0]):
                kwargs["pdl"] = True
            return impl(*args, **kwargs)
        flops, nbytes = cost()
        with self.timer.timed(name, self.label(family), flops, nbytes):
            return impl(*args, **kwargs)

    def _call_into(self, out, family: str, name: str, cost, *args, **kwargs):
        """`_call` writing into `out` when given: the Triton kernels take it as their output; the
        references return a new tensor, copied in."""
        if out is None:
            return self._call(family, name, cost, *args, **kwargs)
        if self.label(family) == "triton":
            return self._call(family, name, cost, *args, out=out, **kwargs)
        return out.copy_(self._call(family, name, cost, *args, **kwargs))

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        # read k, v; write both into the pool
        self._call("store_kv", "kv_store", lambda: (0.0, 4 * k.numel() * k.element_size()),
                   k, v, k_cache, v_cache, slot_mapping)

    def prefill_attention(self, q, k, v, cu_seqlens, max_seqlen: int, scale: float, seq_lens: list[int], out=None):
        def cost() -> tuple[float, float]:
            hq, d = q.shape[1], q.shape[2]
            # Causal: about half the L x L score matrix, 2 matmuls of 2 FLOPs per multiply-add.
            flops = sum(2 * 2 * hq * d * (n * (n + 1) / 2) for n in seq_lens)
            return flops, (2 * q.numel() + 2 * k.numel()) * q.element_size()
        return self._call_into(out, "prefill_attention", "attention.prefill", cost, q, k, v, cu_seqlens, max_seqlen,
                               scale)

    def paged_attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                        max_query_len: int, max_seq_len: int, scale: float,
                        q_lens: list[int], ctx_lens: list[int], out=None):
        name = "attention.decode" if max_query_len == 1 else "attention.paged"
        return self._call_into(out, "paged_attention", name, lambda: _paged_cost(q, k_cache, q_lens, ctx_lens),
                               q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
                               max_seq_len, scale)

    def tree_attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len: int,
                       max_seq_len: int, scale: float, q_lens: list[int], ctx_lens: list[int], tree_masks, out=None):
        """Paged attention for a batch in which some sequence verifies a draft tree: an explicit
        mask over its new rows (each row sees the cached context, its ancestors and itself)."""
        return self._call_into(out, "paged_attention", "attention.tree",
                               lambda: _paged_cost(q, k_cache, q_lens, ctx_lens),
                               q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
                               max_seq_len, scale, tree_masks=tree_masks)

    def linear(self, name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T: our Triton GEMV for decode-sized batches on the Triton backend
        (kernels/gemv_triton.py), cuBLAS on a GPU otherwise, oneDNN on the CPU (kernels/cpu_linear.py,
        on the packed weights the CPU's model holds); the label says which backend ran."""
        gemv = self.backend == "triton" and _gemv_applies(x, w)
        dense = cpu_linear if x.device.type == "cpu" else F.linear
        if not self.timer.enabled:
            return _gemv(x, w, pdl=self._use_pdl(x.shape[0])) if gemv else dense(x, w)
        flops = 2 * x.shape[0] * w.shape[0] * w.shape[1]
        nbytes = (w.numel() + x.numel() + x.shape[0] * w.shape[0]) * x.element_size()
        with self.timer.timed(name, "triton" if gemv else "torch", flops, nbytes):
            return _gemv(x, w) if gemv else dense(x, w)

    # ---- fused elementwise families -----------------------------------------------------------
    def rmsnorm(self, x, weight, eps: float, residual=None):
        """(rmsnorm(x [+ residual]) * weight, x + residual or None); see kernels.rmsnorm_ref."""
        def cost() -> tuple[float, float]:
            n, e = x.numel(), x.element_size()
            w_bytes = weight.numel() * weight.element_size()
            if residual is None:
                return 4 * n, 2 * n * e + w_bytes  # read x, write out
            return 5 * n, 4 * n * e + w_bytes  # read x, residual; write out, new residual
        return self._call("rmsnorm", "rmsnorm", cost, x, weight, eps, residual)

    def rope_store(self, qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, hq: int, hkv: int, d: int):
        """RoPE on q/k + K/V into the pool: (q, k, v); see kernels.rope_store_ref."""
        def cost() -> tuple[float, float]:
            t, e = qkv.shape[0], qkv.element_size()
            rot = t * (hq + hkv) * d
            nbytes = (t * (hq + 2 * hkv) * d * e  # read qkv
                      + rot * e  # write q, k
                      + 2 * t * hkv * d * k_cache.element_size()  # write K, V into the pool
                      + t * d * 4  # cos + sin rows (fp32, D/2 each)
                      + t * (positions.element_size() + slot_mapping.element_size()))
            return 3 * rot, nbytes  # two multiplies and an add per rotated element
        return self._call("rope_store", "rope_store", cost, qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                          hq, hkv, d)

    def silu_mul(self, gate_up):
        """silu(gate_up[:, :I]) * gate_up[:, I:] -> [T, I]; see kernels.silu_mul_ref."""
        n = gate_up.numel() // 2
        return self._call("silu_mul", "silu_mul", lambda: (5 * n, 3 * n * gate_up.element_size()), gate_up)

    def lora(self, name: str, y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             slots: torch.Tensor) -> torch.Tensor:
        """Each row's own adapter update added onto a linear's output y (in place); see kernels.lora_ref."""
        def cost() -> tuple[float, float]:
            active = slots[slots >= 0]  # profiling already syncs per call; counting the rows does too
            return lora_cost(int(active.numel()), A.shape[1], A.shape[2], B.shape[1], int(torch.unique(active).numel()),
                             y.element_size())
        return self._call("lora", name, cost, y, x, A, B, slots)
