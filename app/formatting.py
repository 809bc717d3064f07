"""Numbers as a lecturer reads them off a projector: durations in the unit that fits, counts with
their noun in the right number."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.trace import StepRecord

# What a table cell, a metric or a bar label shows where there is no value: one glyph everywhere (tables pass
# it as their placeholder, so a missing number is not printed as "None").
NO_VALUE = "–"


def fmt_duration(seconds: float) -> str:
    """'12 µs', '0.45 ms', '38 ms', '1.9 s', '1 min 48 s': three significant figures at most, never
    '0.0 ms' for a kernel that took microseconds nor '108529 ms' for a prefill that took minutes."""
    if seconds < 0:
        return NO_VALUE
    if seconds < 1e-4:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60.0:
        return f"{seconds:.3g} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


# Sizes in memory are binary everywhere (KiB, MiB, GiB: what torch and nvidia-smi report), so one checkpoint
# reads the same on every page; rates stay decimal (GB/s, TB/s), as vendors quote bandwidth, and so does the
# traffic a roofline or a kernel table divides by them (bytes a step moves, in MB or GB), so bytes / (GB/s) reads
# off without a factor of 1.07.
KIB, MIB, GIB = 2**10, 2**20, 2**30


def fmt_bytes(n: float) -> str:
    """'512 B', '4.5 KiB', '256.5 MiB', '1.3 GiB': the largest binary unit that keeps the number under 1,024."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 token', '2 tokens' (pass `many` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def batches_text(batches: Sequence[int]) -> str:
    """'batch 256' or 'batches 16, 64 and 256'."""
    names = [f"{b:,}" for b in batches]
    if len(names) <= 1:
        return "batch " + "".join(names)
    return f"batches {', '.join(names[:-1])} and {names[-1]}"


def fmt_block_ids(blocks: Sequence[int]) -> str:
    """Block ids with runs of consecutive ids shortened: '9–27', '6, 7, 0', '3–5, 12' (a 19-block table
    written out in full pushed every other column of its table off a projector)."""
    parts: list[str] = []
    i = 0
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
            j += 1
        parts.append(f"{blocks[i]}–{blocks[j]}" if j - i >= 2 else ", ".join(str(b) for b in blocks[i:j + 1]))
        i = j + 1
    return ", ".join(parts)


def step_line(record: StepRecord, parts: Sequence[str], tail: str = "") -> str:
    """One line for a step's batch: what it computed, in how long, then one part per request (and a tail)."""
    return (f":material/memory: Step {record.step} computed {plural(record.num_batched_tokens, 'token')} in "
            f"{fmt_duration(record.wall_seconds)}: " + " · ".join(parts) + tail)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|$<>~])")


def literal_markdown(text: str) -> str:
    """Model text for a cell that renders Markdown (st.table): every Markdown character escaped and newlines as
    ⏎, so a '- ' answer stays a dash instead of becoming a bullet list, and '$' never starts a formula."""
    return _MARKDOWN.sub(r"\\\1", text).replace("\n", " ⏎ ")


SAME_AS_FULL = "same as full"


def first_difference_text(first_difference: int | None) -> str:
    """Where a quantized model's greedy answer leaves the full model's: "token 5" (counted from 1), or
    "same as full" where it never does."""
    return SAME_AS_FULL if first_difference is None else f"token {first_difference + 1}"


def fmt_two_significant(x: float) -> str:
    """Two significant figures, trailing zeros kept ("0.60" above "0.61", "3.0" beside "1.3"), powers of ten
    written out below 0.001 ("4.2e-05", where "0.000042" filled its cell beside "0.52"); zero is "0". For table
    cells, whose printf formats have no "#" flag: "%.2g" printed "3" beside "1.3". From 10 on, whole numbers
    ("12", "123", not "12." or "1.2e+02")."""
    if x == 0:
        return "0"
    if abs(x) >= 10:
        return f"{x:,.0f}"
    return f"{x:.1e}" if abs(x) < 1e-3 else f"{x:#.2g}".rstrip(".")  # 9.96 rounds to "10."
