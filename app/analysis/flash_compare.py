"""Time and error of several attention implementations on the same real Q, K, V.

The reference is naive attention in float64 on the CPU (exact to ~1e-15). Every method's output is
compared with it as ||out - ref|| / ||ref||. On the CPU: naive fp32 (materialises the N x N
matrix), torch SDPA, the engine's attention path (`flash_attention_varlen_ref`, which is what the
engine runs on the CPU) and the instrumented tiled re-enactment, all timed on one CPU thread. On
CUDA also the Triton FA2 kernel the engine runs there, in the engine's dtype.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from kernels.flash_trace import flash_attention_tiled, naive_attention, relative_error
from kernels.prefill_attention_ref import flash_attention_varlen_ref

from app.analysis.flash_qkv import LayerQKV


@dataclass(frozen=True, slots=True)
class MethodResult:
    method: str
    what: str  # one line: what runs
    device: str
    dtype: str
    ms: float  # best of the repetitions
    rel_err: float  # vs float64 naive attention
    materialises_scores: bool
    error: str = ""  # why it could not run, if it did not


# Fast methods repeat until this much time has passed (at most MAX_REPS times), not just `reps` times: on a
# shared CPU a few calls can all land in someone else's burst, and the best of them is then no minimum at all.
MIN_SECONDS = 0.05
MAX_REPS = 50


def _timer(device: torch.device) -> Callable[[Callable[[], torch.Tensor], int], tuple[torch.Tensor, float]]:
    def run(fn: Callable[[], torch.Tensor], reps: int) -> tuple[torch.Tensor, float]:
        out = fn()  # warm-up (and, on CUDA, compilation / autotuning)
        best, spent, done = float("inf"), 0.0, 0
        while done < reps or (reps > 1 and spent < MIN_SECONDS and done < MAX_REPS):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = time.perf_counter() - t0
            best, spent, done = min(best, took), spent + took, done + 1
        return out, best * 1e3

    return run


# CPU timings run on one torch thread. With two, every parallel region ends at a barrier that waits
# for the other thread; when anything else wants the CPU (the browser drawing this very page, on the
# same laptop) that thread is descheduled for a whole time slice, and a 1 ms SDPA call took 75-96 ms
# (measured with two busy processes on this 2-core machine: 96 ms on two threads, 1.4 ms on one).
CPU_TIMING_THREADS = 1


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                          scale=scale, enable_gqa=group > 1).transpose(0, 1)


@torch.inference_mode()
def compare_methods(qkv: LayerQKV, block_m: int, block_n: int, reps: int = 3,
                    engine_dtype: torch.dtype | None = None) -> list[MethodResult]:
    q32, k32, v32 = qkv.q.float(), qkv.k.float(), qkv.v.float()
    dev = q32.device
    n, scale = qkv.seq_len, qkv.scale
    ref, _ = naive_attention(q32.double().cpu(), k32.double().cpu(), v32.double().cpu(), scale)
    timed = _timer(dev)
    cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
    if dev.type == "cuda":
        where, threads = torch.cuda.get_device_name(dev), nullcontext()
    else:
        where = f"CPU, {CPU_TIMING_THREADS} thread" + ("s" if CPU_TIMING_THREADS > 1 else "")
        threads = _torch_threads(CPU_TIMING_THREADS)
    methods: list[tuple[str, str, Callable[[], torch.Tensor], bool, int]] = [
        ("naive softmax(QKᵀ)V", "two matmuls with the full [heads, N, N] score and probability matrices in memory",
         lambda: naive_attention(q32, k32, v32, scale)[0], True, reps),
        ("torch SDPA", "F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)",
         lambda: _sdpa(q32, k32, v32, scale), False, reps),
        ("engine attention path (torch reference)", "kernels.prefill_attention_ref.flash_attention_varlen_ref: "
         "what the engine runs for a fresh prefill on the CPU",
         lambda: flash_attention_varlen_ref(q32, k32, v32, cu, n, scale), False, reps),
        (f"tiled FA2 re-enactment ({block_m}×{block_n} tiles)", "kernels.flash_trace.flash_attention_tiled: a Python "
         "loop over tile pairs, instrumented for teaching (not a fast kernel)",
         lambda: flash_attention_tiled(q32, k32, v32, scale, block_m, block_n).out, False, 1),
    ]
    with threads:
        results = [_run(name, what, fn, mat, r, timed, ref, where, "float32") for name, what, fn, mat, r in methods]
    if dev.type == "cuda":
        results.extend(_triton_rows(qkv, cu, timed, ref, where, reps, engine_dtype or qkv.q.dtype))
    return results


def _run(name: str, what: str, fn: Callable[[], torch.Tensor], materialises: bool, reps: int, timed, ref: torch.Tensor,
         where: str, dtype: str) -> MethodResult:
    try:
        out, ms = timed(fn, reps)
    except Exception as e:  # a backend that cannot run here is reported, not fatal
        return MethodResult(name, what, where, dtype, float("nan"), float("nan"), materialises,
                            f"{type(e).__name__}: {e}")
    return MethodResult(name, what, where, dtype, ms, relative_error(out.cpu(), ref), materialises)


def _triton_rows(qkv: LayerQKV, cu: torch.Tensor, timed, ref: torch.Tensor, where: str, reps: int,
                 engine_dtype: torch.dtype) -> list[MethodResult]:
    try:
        # The engine's dispatch module sets how fp32 dots compile (IEEE, for exactness) before any kernel does.
        from kernels.dispatch import fp32_dot_precision
        from kernels.prefill_attention_triton import describe_launch, flash_attention_varlen_triton
    except Exception as e:  # noqa: BLE001
        return [MethodResult("Triton FA2 kernel", "kernels.prefill_attention_triton", where, "-", float("nan"),
                             float("nan"), False, f"could not import: {e}")]
    rows = []
    for dt in dict.fromkeys((engine_dtype, torch.float32)):
        q, k, v = qkv.q.to(dt), qkv.k.to(dt), qkv.v.to(dt)
        name = str(dt).removeprefix("torch.")
        rows.append(_run(f"Triton FA2 kernel ({name})", "kernels.prefill_attention_triton."
                         "flash_attention_varlen_triton: the kernel the engine runs on this GPU "
                         f"({describe_launch(q, k, v, qkv.seq_len)})"
                         + (_fp32_note(fp32_dot_precision()) if dt == torch.float32 else ""),
                         lambda q=q, k=k, v=v: flash_attention_varlen_triton(q, k, v, cu, qkv.seq_len, qkv.scale),
                         False, reps, timed, ref, where, name))
    return rows


def _fp32_note(precision: str) -> str:
    if precision == "ieee":
        return " (fp32 dots in full IEEE fp32, as the engine compiles them for its exactness runs)"
    return f" (fp32 dots as {precision.upper()} on tensor cores)"


# ---- memory arithmetic ----------------------------------------------------------------------------

# One stated dtype per quantity, used by the page's metrics, its table and their captions alike (a metric
# in fp32 next to a table in bf16 gave two sizes for the same N). S and P in fp32: the dtype the naive row
# of the comparison materialises them in. m and l in fp32: FA2 keeps its softmax statistics in fp32 whatever
# the input dtype (the Triton kernel and kernels.flash_trace alike).
MATRIX_DTYPE, MATRIX_ELEM = "fp32", 4
STATE_DTYPE, STATE_ELEM = "fp32", 4


@dataclass(frozen=True, slots=True)
class AttentionMemory:
    seq_len: int
    heads: int
    elem: int = MATRIX_ELEM  # bytes per element of S and P
    state_elem: int = STATE_ELEM  # bytes per element of m and l

    @property
    def naive_scores_bytes(self) -> int:
        """One [heads, N, N] matrix: S, or P (the same size)."""
        return self.heads * self.seq_len ** 2 * self.elem

    @property
    def naive_bytes(self) -> int:
        """What naive attention writes to memory: S, then P of the same size."""
        return 2 * self.naive_scores_bytes

    @property
    def flash_state_bytes(self) -> int:
        """What FA2 keeps per query row besides the output: the running max m and sum l."""
        return self.heads * self.seq_len * 2 * self.state_elem

    @property
    def ratio(self) -> float:
        """Naive S and P over FA2's m and l: N when both are in the same dtype."""
        return self.naive_bytes / self.flash_state_bytes if self.seq_len else 0.0


def memory_table(seq_len: int, heads: int, lengths: tuple[int, ...] = (4096, 32768, 131072)) -> list[AttentionMemory]:
    """This prompt's memory, then longer contexts', all in the same dtypes (the first row is the page's metric)."""
    return [AttentionMemory(n, heads) for n in dict.fromkeys((seq_len, *lengths))]


# ---- the machine the CPU rows run on ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CpuCache:
    level: int
    bytes: int


def _cache_size(text: str) -> int:
    """sysfs writes sizes as '32K', '1024K' or '32M'."""
    text = text.strip().upper()
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


@lru_cache(maxsize=1)
def largest_cpu_cache(root: str = "/sys/devices/system/cpu/cpu0/cache") -> CpuCache | None:
    """The largest data (or unified) cache of CPU 0, from Linux sysfs; None where it cannot be read. The
    page compares the naive S and P with it instead of claiming that they fit in the caches at any N."""
    best: CpuCache | None = None
    for index in sorted(Path(root).glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            cache = CpuCache(int((index / "level").read_text()), _cache_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
        if best is None or cache.bytes > best.bytes:
            best = cache
    return best


def kernel_tiles_text() -> str:
    """The GPU kernel's tile shapes in words, from its own configs: "64 × 64 tiles (128 × 64 for prompts over
    2,048 tokens)" while those are the kernel's settings."""
    from kernels.prefill_attention_triton import DEFAULT_CONFIG, LONG_CONFIG, LONG_FROM  # imports Triton

    def shape(cfg: dict) -> str:
        return f"{cfg['BLOCK_M']} × {cfg['BLOCK_N']}"

    return f"{shape(DEFAULT_CONFIG)} tiles ({shape(LONG_CONFIG)} for prompts over {LONG_FROM:,} tokens)"

