"""Split-KV decoding for the FlashAttention page: the engine's split planner over batch and context,
the H200 timings `bench/split_kv.py` recorded, and (on a GPU) the engine's own decode kernel run on
the prompt's newest row through a paged pool.

The planner is the launcher's (`kernels.paged_attention_triton.decode_plan_for`), not a copy of its
rule, so the grid changes when the kernel's tuning does.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.ceilings import REFERENCE_CEILINGS

from app.analysis.flash_qkv import LayerQKV

BENCH_PATH = Path(__file__).resolve().parents[2] / "bench" / "results" / "split_kv_h200.json"
REFERENCE_GPU = "NVIDIA H200"
PLAN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
PLAN_CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True, slots=True)
class PlanCell:
    batch: int
    context: int
    splits: int
    partition: int  # keys per split (whole K tiles)

    def programs(self, kv_heads: int) -> int:
        return self.batch * kv_heads * self.splits


@dataclass(frozen=True, slots=True)
class GpuShape:
    """The GPU the plan is for: this server's, or the reference H200's when it has none."""

    name: str
    sms: int
    live: bool  # True: this server's own GPU


def plan_gpu() -> GpuShape:
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return GpuShape(props.name, int(props.multi_processor_count), True)
    return GpuShape(REFERENCE_GPU, REFERENCE_CEILINGS[REFERENCE_GPU].multiprocessors, False)


@dataclass(frozen=True, slots=True)
class PlannerRule:
    """The launcher's decode tuning the page states in words (read from the kernel module, not restated)."""

    programs_per_sm: int  # the occupancy it aims at
    min_partition: int  # fewest keys a split may own
    decode_tile: int  # keys per K tile in the decode kernel


def planner_rule() -> PlannerRule:
    import kernels.paged_attention_triton as pa  # imports Triton: only when the page asks

    return PlannerRule(pa.TARGET_PROGRAMS_PER_SM["decode"], pa.MIN_PARTITION, pa.BLOCK_N["decode"])


def plan_grid(hq: int, hkv: int, sms: int, batches: tuple[int, ...] = PLAN_BATCHES,
              contexts: tuple[int, ...] = PLAN_CONTEXTS) -> tuple[PlanCell, ...]:
    """The split count the engine's decode launcher picks for every (batch, context), row by row."""
    from kernels.paged_attention_triton import decode_plan_for  # imports Triton: only when the page asks

    cells = []
    for b in batches:
        for c in contexts:
            p = decode_plan_for(b, hq, hkv, c, sms)
            cells.append(PlanCell(b, c, int(p["splits"]), int(p["partition"])))
    return tuple(cells)


@dataclass(frozen=True, slots=True)
class SplitTiming:
    batch: int
    context: int
    splits: int
    split_us: float  # the launcher's default plan
    one_split_us: float  # the same kernel, one program per (sequence, KV head)
    sdpa_us: float  # torch SDPA on a contiguous cache

    @property
    def gain(self) -> float:
        return self.one_split_us / self.split_us


@dataclass(frozen=True, slots=True)
class SplitBench:
    device: str
    command: str
    rows: tuple[SplitTiming, ...]

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({r.batch for r in self.rows}))


def load_split_bench(path: Path = BENCH_PATH) -> SplitBench | None:
    """The recorded H200 run, or None when the file is missing or not what the bench writes."""
    try:
        data = json.loads(path.read_text())
        rows = tuple(SplitTiming(int(r["B"]), int(r["L"]), int(r["splits"]), 1e3 * float(r["split_ms"]),
                                 1e3 * float(r["one_split_ms"]), 1e3 * float(r["sdpa_ms"])) for r in data["rows"])
        return SplitBench(str(data["device"]), str(data.get("command", "python3 bench/split_kv.py")), rows) if rows else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class KernelRun:
    """One launch of the engine's Triton decode kernel on the prompt's newest row (batch 1)."""

    label: str  # how its split count was chosen
    splits: int
    partition: int  # keys per split (the kernel's decode splits take every S-th tile of block_n keys)
    block_n: int
    rel_err: float  # against float64 attention over every key


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def kernel_check(qkv: LayerQKV, splits: int, page: int = 16, seed: int = 0) -> tuple[KernelRun, ...]:
    """Needs CUDA. The layer's keys and values go into a pool of `page`-token blocks in shuffled order (as in
    a server that has run a while), written by slot mapping as the engine stores them; the newest token's
    queries are the decode row. Three launches: as the engine plans batch 1 (at most 256 keys a split, so a
    short prompt gets one), as close to `splits` as the kernel's tiles allow, and one split; each against the
    torch reference of the same signature in float64."""
    from kernels.kv_store_ref import store_kv_ref
    from kernels.paged_attention_ref import paged_attention_ref
    from kernels.paged_attention_triton import paged_attention_triton, plan

    n, hkv, d = qkv.k.shape
    hq = qkv.q.shape[1]
    dev = qkv.q.device
    blocks = math.ceil(n / page)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed)).to(dev, torch.int32).view(1, blocks)
    pos = torch.arange(n, device=dev)
    kc = torch.zeros(blocks, page, hkv, d, device=dev, dtype=qkv.k.dtype)
    vc = torch.zeros_like(kc)
    store_kv_ref(qkv.k, qkv.v, kc, vc, table[0, pos // page].long() * page + pos % page)
    seq_lens = torch.tensor([n], dtype=torch.int32, device=dev)
    qsl = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    q = qkv.q[-1:].contiguous()
    ref = paged_attention_ref(q.double(), kc.double(), vc.double(), table, seq_lens, qsl, 1, n, qkv.scale)[0]
    tile = int(plan(1, hq, hkv, 1, n, dev)["BLOCK_N"])
    launches = (("as the engine plans batch 1", {}),
                (f"asked for {splits}", {"programs_per_sm": 1 << 20,
                                         "min_partition": math.ceil(math.ceil(n / splits) / tile) * tile}),
                ("one split", {"programs_per_sm": 0}))
    runs = []
    for label, kw in launches:
        cfg = plan(1, hq, hkv, 1, n, dev, kw.get("programs_per_sm"), kw.get("min_partition"))
        out = paged_attention_triton(q, kc, vc, table, seq_lens, qsl, 1, n, qkv.scale, **kw)[0]
        runs.append(KernelRun(label, int(cfg["splits"]), int(cfg["partition"]), int(cfg["BLOCK_N"]), _rel(out, ref)))
    return tuple(runs)


def merge_bytes(hq: int, splits: int, d: int) -> int:
    """What the merge reads for one decode row: each split's fp32 accumulator, max and sum, per query head
    (nothing when there is one split: it writes the output directly)."""
    return 0 if splits <= 1 else hq * splits * (d + 2) * 4


def kv_bytes(n: int, hkv: int, d: int, element_bytes: int = 2) -> int:
    """K and V of n tokens for one layer, read once per decode row (bf16 on the GPU)."""
    return 2 * n * hkv * d * element_bytes
