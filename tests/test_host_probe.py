"""bench/host_probe.py and its place in bench/throughput.py's rows: a positive time for the same fixed work each
time, and the throughput rows keep the probes of the timed passes only."""
from __future__ import annotations

import math

from bench import host_probe
from bench.throughput import _probe_fields


def test_the_probe_times_a_fixed_piece_of_work() -> None:
    one = host_probe.host_probe_ms(repeats=3, inner=5)
    assert 0 < one < 100 and math.isfinite(one)
    assert host_probe._work() == host_probe._work()  # the same work every time


def test_rows_keep_the_timed_passes_probes() -> None:
    # On CUDA the first pass is an untimed warm-up: its probe is dropped with it.
    assert _probe_fields([9.0, 1.0, 3.0, 2.0]) == {"host_probe_ms": 2.0, "host_probe_pass_ms": [1.0, 3.0, 2.0]}
    assert _probe_fields([4.0]) == {"host_probe_ms": 4.0, "host_probe_pass_ms": [4.0]}
