"""How fast the host's Python runs right now: a fixed piece of work shaped like a scheduler step's (dicts, lists,
a sort and attribute reads over 256 entries), timed. The overlapped engine at 256 requests is host-bound, so its
tok/s moves with this (v44: 9.5x then 17.7x HF on one machine minutes apart); taken beside each timed pass, it
tells a slow host from a slow change."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass
class _Seq:
    seq_id: int
    length: int
    blocks: list[int]


def _work(n: int = 256) -> int:
    seqs = [_Seq(i, (i * 37) % 500 + 1, list(range(i % 7 + 1))) for i in range(n)]
    table = {s.seq_id: s for s in seqs}
    order = sorted(seqs, key=lambda s: (s.length, s.seq_id))
    total = 0
    for s in order:
        total += table[s.seq_id].length + len(s.blocks)
        s.blocks.append(total % 16)
    return total


def host_probe_ms(repeats: int = 5, inner: int = 20) -> float:
    """Median over `repeats` of the milliseconds `inner` rounds of the fixed work take (~2-4 ms in all on a
    server core)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            _work()
        times.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(times)
