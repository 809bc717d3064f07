"""bench/paged_decode_spread.py's summary, on CPU: a GPU session should not be the first to run its table code."""
from __future__ import annotations

import pytest

spread_bench = pytest.importorskip("bench.paged_decode_spread")


def test_spread_reports_median_range_and_relative_width() -> None:
    s = spread_bench.spread([0.0200, 0.0190, 0.0210, 0.0195])
    assert s["min"] == 0.0190 and s["max"] == 0.0210
    assert s["median"] == pytest.approx(0.01975)
    assert s["range_pct"] == pytest.approx(100 * 0.0020 / 0.01975)


def test_table_has_one_line_per_length_with_the_ratio_and_copy_share() -> None:
    ours, sdpa = [0.1087, 0.1090, 0.1085], [0.1050, 0.1060, 0.1049]
    row = {"L": 8192, "bytes": int(0.1087e-3 * 3.7e12), "ours": spread_bench.spread(ours),
           "sdpa": spread_bench.spread(sdpa), "ratio_spread": spread_bench.spread([s / o for o, s in zip(ours, sdpa)])}
    lines = spread_bench.table([row], copy_tbps=4.24).splitlines()
    assert len(lines) == 3
    cells = lines[2].split()
    assert cells[0] == "8192" and cells[1] == "108.7"  # median µs of ours
    assert cells[9:11] == ["0.967", "[0.966-0.972]"]  # the per-repeat ratios SDPA / ours: median [min-max]
    assert cells[-1] == f"{100 * 3.7 / 4.24:.1f}"  # share of the copy bandwidth at our median
