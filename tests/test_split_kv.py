"""Split-KV decoding (Flash-Decoding): the re-enactment's merge is exact for any split count and dealing,
the engine's split planner keeps its promises, the recorded H200 timings load (and a damaged file does
not break the page). The page's decoding section is tested with the rest of the page in
tests/test_app_roofline_flash.py, its GPU launches in tests/test_app_gpu.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.split_kv_trace import launched_splits, split_kv_decode, tile_owners

from app.analysis.split_kv import (BENCH_PATH, PLAN_BATCHES, PLAN_CONTEXTS, load_split_bench, merge_bytes,
                                   plan_grid)


def _inputs(n: int, hkv: int, group: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(hkv * group, d, generator=g), 2 * torch.randn(n, hkv, d, generator=g),
            torch.randn(n, hkv, d, generator=g))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), hkv=st.integers(1, 3), group=st.integers(1, 3), d=st.sampled_from([8, 16, 64]),
       splits=st.integers(1, 12), block_n=st.sampled_from([1, 3, 8, 16, 128]),
       layout=st.sampled_from(["interleaved", "contiguous"]), seed=st.integers(0, 10_000))
def test_merge_equals_one_pass(n: int, hkv: int, group: int, d: int, splits: int, block_n: int, layout: str,
                               seed: int) -> None:
    q, k, v = _inputs(n, hkv, group, d, seed)
    head = seed % (hkv * group)
    t = split_kv_decode(q, k, v, d ** -0.5, splits, block_n, layout, head=head)  # type: ignore[arg-type]
    scores = torch.einsum("hd,nhd->hn", q.double(), k.double().repeat_interleave(group, 1)) * d ** -0.5
    ref_out = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=1), v.double().repeat_interleave(group, 1))
    assert t.max_abs_diff < 1e-5
    assert float((t.merged.double() - ref_out).abs().max()) < 1e-5
    assert sum(p.keys for p in t.partials) == n and len(t.owner) == math.ceil(n / block_n)
    # Only the splits the engine's launcher would start: each owns a tile, none beyond the S asked for.
    assert t.asked == splits and len(t.partials) == t.splits == launched_splits(len(t.owner), splits) <= splits
    assert set(t.owner) == set(range(t.splits))
    assert math.isclose(sum(p.weight for p in t.partials), 1.0, rel_tol=1e-5)
    assert math.isclose(t.m, max(p.m for p in t.partials)) and math.isclose(t.m, float(t.scores.max()), rel_tol=1e-6)
    for p in t.partials:  # a split's max and sum are those of its own keys
        mine = torch.tensor([t.owner[i // block_n] == p.split for i in range(n)])
        assert p.keys > 0
        assert math.isclose(p.m, float(t.scores[mine].max()), rel_tol=1e-6)
        assert math.isclose(p.l, float(torch.exp(t.scores[mine] - p.m).sum()), rel_tol=1e-5)


def test_launched_splits_is_the_launchers_rule() -> None:
    """The re-enactment runs as many splits as `plan` launches when asked for S over these tiles (its occupancy
    target and floor of keys per split set so that it asks for exactly S), for both dealings."""
    from kernels.paged_attention_triton import _plan

    for n in (1, 2, 15, 16, 17, 100, 157, 300):
        for block_n in (1, 3, 8, 16, 128):
            for splits in range(1, 13):
                cfg = _plan(1, 1, 1, 1, n, 1, splits, block_n, block_n, "group", 0, False)
                assert launched_splits(math.ceil(n / block_n), splits) == cfg["splits"], (n, block_n, splits)
    assert launched_splits(2, 8) == 2 and launched_splits(10, 8) == 5 and launched_splits(10, 4) == 4
    with pytest.raises(ValueError):
        launched_splits(4, 0)


def test_more_splits_than_tiles_run_only_those_with_tiles() -> None:
    """157 keys in 128-key tiles, S = 8: 2 splits run, so batch 1 starts 3 × 2 programs and the merge reads
    2 partials (4.6 KiB), not 8 (18.6 KiB); 10 tiles of 16 at S = 8 run 5 splits of 2 tiles each."""
    from app.charts.split_kv import merge_chart, split_scores_chart
    from app.formatting import fmt_bytes

    q, k, v = _inputs(157, 3, 3, 64, 0)
    for layout in ("interleaved", "contiguous"):
        t = split_kv_decode(q, k, v, 0.125, 8, 128, layout, head=3)  # type: ignore[arg-type]
        assert (t.splits, t.asked, t.owner) == (2, 8, (0, 1)) and t.max_abs_diff < 1e-5
        assert fmt_bytes(merge_bytes(9, t.splits, 64)) == "4.6 KiB" and fmt_bytes(merge_bytes(9, 8, 64)) == "18.6 KiB"
        title = split_scores_chart(t).layout.title.text
        assert title == "Head 3: 157 keys in 2 tiles of 128, dealt to 2 splits (S = 8)"
        assert "no keys" not in merge_chart(t).data[0].text
    t = split_kv_decode(q, k, v, 0.125, 8, 16, "interleaved")
    assert t.splits == 5 and t.owner == tuple(i % 5 for i in range(10))
    assert all(len(p.tiles) == 2 for p in t.partials)


def test_the_scores_chart_writes_counts_in_words_and_a_title_that_fits() -> None:
    from app.charts.split_kv import split_scores_chart

    q, k, v = _inputs(1, 3, 3, 64, 0)
    one = split_scores_chart(split_kv_decode(q, k, v, 0.125, 4, 16, head=3))
    # "1 key in 1 tile", not "1 keys in 1 tiles"; one tile fills one split of the 4 asked for.
    assert one.layout.title.text == "Head 3: 1 key in 1 tile of 16, dealt to 1 split (S = 4)"
    assert len(one.layout.xaxis.title.text) <= 52  # a half-width chart at 1280 px cut the longer one
    q, k, v = _inputs(40, 3, 3, 64, 0)
    assert "40 keys in 3 tiles of 16, dealt to 1 split" in split_scores_chart(
        split_kv_decode(q, k, v, 0.125, 1, 16)).layout.title.text


def test_tile_owners() -> None:
    assert tile_owners(7, 3, "interleaved") == (0, 1, 2, 0, 1, 2, 0)  # split s: tiles s, s + S, ...
    assert tile_owners(7, 3, "contiguous") == (0, 0, 0, 1, 1, 1, 2)  # ceil(7 / 3) = 3 tiles each
    assert tile_owners(4, 8, "contiguous") == (0, 1, 2, 3)  # more splits than tiles: the rest own nothing
    with pytest.raises(ValueError):
        tile_owners(4, 0, "interleaved")
    with pytest.raises(ValueError):
        tile_owners(4, 2, "striped")  # type: ignore[arg-type]


def test_bad_shapes_are_refused() -> None:
    q, k, v = _inputs(10, 3, 3, 16, 0)
    with pytest.raises(ValueError):
        split_kv_decode(q, k[:0], v[:0], 0.25, 2, 4)
    with pytest.raises(ValueError):
        split_kv_decode(q[:4], k, v, 0.25, 2, 4)  # 4 query heads over 3 KV heads
    with pytest.raises(ValueError):
        split_kv_decode(q, k, v, 0.25, 2, 0)


def test_plan_grid_is_the_launchers_plan() -> None:
    """Every cell covers its context in whole tiles, stays within the launcher's limits, and follows the rule
    the page states: at batch 1 the splits grow with the context; at 128 sequences one program per KV head."""
    import kernels.paged_attention_triton as pa

    cells = plan_grid(9, 3, 132)
    assert len(cells) == len(PLAN_BATCHES) * len(PLAN_CONTEXTS)
    for c in cells:
        assert 1 <= c.splits <= pa.MAX_SPLITS and c.partition % pa.BLOCK_N["decode"] == 0
        assert (c.splits - 1) * c.partition < c.context <= c.splits * c.partition or c.splits == 1
        assert c.splits == 1 or c.partition >= pa.MIN_PARTITION
    by = {(c.batch, c.context): c.splits for c in cells}
    batch1 = [by[(1, ctx)] for ctx in PLAN_CONTEXTS]
    assert batch1 == sorted(batch1) and batch1[-1] > 32 * batch1[0]
    assert all(by[(128, ctx)] == 1 for ctx in PLAN_CONTEXTS)
    assert all(by[(64, ctx)] <= 2 for ctx in PLAN_CONTEXTS)


def test_merge_bytes() -> None:
    assert merge_bytes(9, 1, 64) == 0  # one split writes the output itself
    assert merge_bytes(9, 4, 64) == 9 * 4 * 66 * 4


def test_recorded_h200_timings_load() -> None:
    bench = load_split_bench()
    assert bench is not None and "H200" in bench.device and bench.batches == (1, 4, 16, 64)
    at = {(r.batch, r.context): r for r in bench.rows}
    assert at[(1, 32768)].gain > 5 and at[(1, 32768)].splits > 1  # batch 1, long context: splitting is the point
    assert all(r.split_us > 0 and r.one_split_us > 0 and r.sdpa_us > 0 for r in bench.rows)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"device": "x", "rows": [{"B": 1}]}', '{"device": "x", "rows": []}'])
def test_damaged_timings_file_reads_as_missing(tmp_path: Path, text: str) -> None:
    path = tmp_path / "split.json"
    path.write_text(text)
    assert load_split_bench(path) is None
    assert load_split_bench(tmp_path / "absent.json") is None


def test_bench_file_is_what_the_bench_writes() -> None:
    data = json.loads(BENCH_PATH.read_text())
    assert data["command"].startswith("python3 bench/split_kv.py") and data["sms"] == 132



def test_planner_rule_is_the_kernels() -> None:
    import kernels.paged_attention_triton as pa
    from app.analysis.split_kv import planner_rule

    rule = planner_rule()
    assert (rule.programs_per_sm, rule.min_partition, rule.decode_tile) == (
        pa.TARGET_PROGRAMS_PER_SM["decode"], pa.MIN_PARTITION, pa.BLOCK_N["decode"])


def test_caption_and_help_say_how_many_splits_run() -> None:
    """The caption is true for the case shown: a 1-key prompt runs one split whatever S asks (no "keep a short
    prompt's splits visible" under a chart of one split), and small tiles are said to show more splits than the
    kernel's 128-key ones only where they do."""
    from app.sections.flash_decoding import dropped_splits_text, split_caption

    q, k, v = _inputs(1, 3, 3, 64, 0)
    hi = split_kv_decode(q, k, v, 0.125, 8, 128, head=3)
    text = split_caption(hi, 128)
    assert "one split runs whatever S asks" in text and "stay visible" not in text
    assert "same 128-key tiles" in text
    assert "one split runs whatever S asks" in split_caption(split_kv_decode(q, k, v, 0.125, 8, 16), 128)
    q, k, v = _inputs(157, 3, 3, 64, 0)
    small = split_kv_decode(q, k, v, 0.125, 8, 16)
    text = split_caption(small, 128)
    assert "it would run 2 splits on these keys; 16-key tiles here show 5" in text and "stay visible" in text
    assert "as here" in split_caption(split_kv_decode(q, k, v, 0.125, 2, 16), 128)
    assert dropped_splits_text(small).startswith(". S = 8 gives each split 2 tiles of 16 keys")
    help_text = dropped_splits_text(small)
    assert "10 tiles fill 5 splits" in help_text and "other 3 of the 8 never run" in help_text
    assert dropped_splits_text(split_kv_decode(q, k, v, 0.125, 4, 16)) == ""  # 10 tiles fill all 4
