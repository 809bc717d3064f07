"""What the disaggregated page computes from the records and draws: time-between-token gaps, where each
request's first moments went, the prefill pool as its prompts were copied out, a prefill step still
running at the selected tick, and the three-way comparison's charts. A tiny random Llama keeps it fast."""
from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.disaggregated import DisaggregatedEngine
from engine.sampling_params import SamplingParams

from app.analysis.disaggregated import (cluster_token_gaps, compare_serving, first_moments, handoffs_until,
                                        latest_prefill_step, pool_at_send, worker_steps)
from app.charts.disaggregated import compare_gaps_figure, compare_ttft_figure, first_moments_figure, worker_timeline
from app.scenarios import RequestSpec, Scenario

CFG = EngineConfig(block_size=8, num_blocks=32, max_model_len=128, weights="random")
ORDER = ["a", "b", "c"]


@pytest.fixture(scope="module")
def history(tiny_weights):  # noqa: ANN001, ANN201
    cluster = DisaggregatedEngine(CFG, tiny_weights)
    for rid, prompt, arrival in (("a", "Tell me a story.", 0), ("b", "Hi", 0), ("c", "What is 2 + 2?", 3)):
        cluster.add_request([{"role": "user", "content": prompt}], SamplingParams(max_tokens=6, ignore_eos=True),
                            arrival_step=arrival, request_id=rid)
    ticks = []
    while cluster.has_work():
        ticks.append(cluster.step())
    return ticks


def test_gaps_count_every_token_after_the_first(history) -> None:  # noqa: ANN001
    gaps = cluster_token_gaps(history)
    for q in history[-1].requests:
        mine = [g for g in gaps if g.request_id == q.request_id]
        assert len(mine) == q.output_len - 1 == 5
        assert [round(g.time_s, 12) for g in mine] == [round(t, 12) for t in q.token_times[1:]]
        assert all(g.gap_s > 0 and not g.prefill_in_step for g in mine)


def test_first_moments_add_up_to_the_second_token(history) -> None:  # noqa: ANN001
    moments = {m.request_id: m for m in first_moments(history)}
    states = {q.request_id: q for q in history[-1].requests}
    assert set(moments) == set(ORDER)
    handed = {h.request_id: h for h in handoffs_until(history)}
    for rid, m in moments.items():
        assert m.arrival <= m.prefill_start <= m.first_token <= m.taken <= m.second_token
        assert m.first_token - m.arrival == pytest.approx(states[rid].ttft_seconds)
        assert m.second_token == states[rid].token_times[1]
        # The handoff is the copy out (the end of the prefill step), the wait and the copy in, all measured.
        h = handed[rid]
        assert 0 < m.copy_out == h.send_seconds <= m.first_token - m.prefill_start
        assert m.handoff == pytest.approx(h.send_seconds + (h.taken_at - h.sent_at))
        assert h.taken_at - h.sent_at >= h.receive_seconds > 0
        # The handoff table's three columns add up to it.
        assert m.handoff == pytest.approx(h.send_seconds + h.waited_seconds + h.receive_seconds)


def test_the_prefill_pool_as_its_prompts_were_copied_out(history) -> None:  # noqa: ANN001
    step, sent = latest_prefill_step(history)
    assert step is not None and sent and step.record.pool.used_blocks == 0  # freed inside the step
    view = pool_at_send(step.record, sent)
    held = {b for h in sent for b in h.src_blocks}
    assert view.pool.used_blocks == len(held)
    for h in sent:
        assert all(view.pool.owners[b] == h.request_id for b in h.src_blocks)
        table = next(t for t in view.block_tables if t.request_id == h.request_id)
        assert sum(table.fills) == h.prompt_len


def test_a_prefill_still_running_is_drawn_solid_then_pale(history) -> None:  # noqa: ANN001
    prefill, _ = worker_steps(history)
    step = prefill[-1]
    middle = (step.start + step.end) / 2
    tick = next(t for t in history if step in t.prefill_steps)
    shown = history[: history.index(tick)] + [dataclasses.replace(tick, clock=middle)]  # the tick, seen earlier
    fig = worker_timeline(shown, ORDER)
    bars = [t for t in fig.data if t.type == "bar" and t.name.startswith("prefill worker")]
    solid, pale = bars
    assert solid.x[-1] == pytest.approx((middle - step.start) * 1e3)
    assert pale.base[0] == pytest.approx(middle * 1e3) and pale.x[0] == pytest.approx((step.end - middle) * 1e3)
    lo, hi = fig.layout.xaxis.range
    assert lo < 0 and hi >= step.end * 1e3  # the arrival markers at 0 and the pale end both inside


def test_one_arrow_per_handoff_from_prefill_end_to_decode(history) -> None:  # noqa: ANN001
    fig = worker_timeline(history, ORDER)
    handed = handoffs_until(history)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == len(handed) == 3
    for a, h in zip(arrows, handed):
        assert a.ax == pytest.approx(h.sent_at * 1e3) and a.x == pytest.approx(h.taken_at * 1e3)


def test_ttft_labels_sit_inside_the_chart(history) -> None:  # noqa: ANN001
    fig = first_moments_figure(first_moments(history), ORDER)
    hi = fig.layout.xaxis.range[1]
    moments = first_moments(history)
    labels = [a for a in fig.layout.annotations if a.text.startswith("TTFT")]
    assert len(labels) == 3 and all(a.x < hi for a in labels)
    # Each label writes out the handoff, whose bar can be narrower than a pixel.
    for a, m in zip(labels, moments):  # on a second line, aligned: on one the longest ran off the chart
        assert a.text.endswith(f"<br>handoff {1e3 * m.handoff:.1f} ms") and a.align == "left"
    # The stack runs from arrival to the second token; the first token is marked inside it, after the copy out.
    bars = [t for t in fig.data if t.type == "bar"]
    for i, m in enumerate(moments):
        assert sum(b.x[i] for b in bars) == pytest.approx(1e3 * (m.second_token - m.arrival))
    [ttft] = [t for t in fig.data if t.type == "scatter" and t.hovertemplate and "first token" in t.hovertemplate]
    assert list(ttft.x) == pytest.approx([1e3 * (m.first_token - m.arrival) for m in moments])


def test_three_ways_of_serving_give_one_set_of_tokens(tiny_weights) -> None:  # noqa: ANN001
    scenario = Scenario("t", (RequestSpec("Tell me a story.", max_tokens=8, ignore_eos=True, request_id="a"),
                              RequestSpec("Hi " * 40, max_tokens=4, arrival_step=2, ignore_eos=True, request_id="long")),
                        engine={"block_size": 8, "num_blocks": 32, "max_model_len": 128, "max_num_batched_tokens": 128})
    runs = compare_serving(scenario, tiny_weights, {"device": "cpu", "dtype": "float32", "weights": "random"})
    assert list(runs) == ["colocated", "chunked", "disaggregated"]
    outputs = [dict(r.outputs) for r in runs.values()]
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]["a"]) == 8
    assert [r.devices for r in runs.values()] == [1, 1, 2]
    assert not any(r.errors for r in runs.values())
    assert runs["colocated"].prefill_bands and not runs["disaggregated"].prefill_bands
    for run in runs.values():
        assert run.ttft_of("long") > 0 and len([g for g in run.gaps if g.request_id == "a"]) == 7
    gaps = compare_gaps_figure(runs, ["a", "long"], exclude="long")
    assert {t.name for t in gaps.data} == {"a"}  # the long prompt is left out of the stall panels
    ttft = compare_ttft_figure(runs, ["a", "long"])
    assert [t.name for t in ttft.data] == [r.label for r in runs.values()]


def test_kv_waiting_for_the_decode_worker_is_drawn_until_now(tiny_weights) -> None:  # noqa: ANN001
    """A decode pool with room for one request at a time: the others' KV waits in the transport, drawn on
    the handoff lane from when it was sent up to the selected tick (a handoff the prefill worker will only
    send later on its clock is not drawn yet); several waiting at once are drawn side by side."""
    cfg = EngineConfig(block_size=8, num_blocks=7, max_model_len=56, weights="random")
    cluster = DisaggregatedEngine(cfg, tiny_weights)
    for rid in ORDER:
        cluster.add_request([{"role": "user", "content": "Count to three."}], SamplingParams(max_tokens=12,
                            ignore_eos=True), request_id=rid)
    ticks = []
    while cluster.has_work():
        ticks.append(cluster.step())

    def visible(t):  # noqa: ANN001, ANN202
        return [h for h in t.in_flight if h.sent_at <= t.clock]

    at = max(range(len(ticks)), key=lambda i: len(visible(ticks[i])))
    assert visible(ticks[at]), "no handoff ever waited for the decode worker"
    for shown in (ticks[: at + 1], ticks[:at] + [dataclasses.replace(ticks[at], in_flight=(
            # Two waiting at once, whatever the machine's timing made of this run: the first, twice.
            visible(ticks[at])[0], dataclasses.replace(visible(ticks[at])[0], request_id="c")))]):
        fig = worker_timeline(shown, ORDER)
        lines = [t for t in fig.data if t.legendgroup == "waiting"]
        waiting = visible(shown[-1])
        assert len(lines) == len(waiting) and sum(bool(t.showlegend) for t in lines) == 1
        for line, h in zip(lines, waiting):
            assert line.x[0] == pytest.approx(h.sent_at * 1e3) and line.x[1] == pytest.approx(shown[-1].clock * 1e3)
        assert len({line.y[0] for line in lines}) == len(lines)  # side by side, not on top of each other


def test_requests_decoding_in_the_same_iterations_are_named_as_one_line() -> None:
    from app.analysis.chunked import TokenGap
    from app.analysis.disaggregated import ServingRun, coinciding_requests
    from app.sections.disaggregated import _stacked_lines

    def run(key: str, gaps: list[tuple[str, float, float]]) -> ServingRun:
        return ServingRun(key, key, 1, (), tuple(TokenGap(r, 0, t, g, False) for r, t, g in gaps), (), 1.0, ())

    together = [("a", 0.1, 0.05), ("b", 0.1, 0.05), ("c", 0.1, 0.05), ("c", 0.2, 0.1), ("long", 0.3, 0.2)]
    apart = [("a", 0.1, 0.05), ("b", 0.1, 0.05), ("c", 0.1, 0.05), ("c", 0.2, 0.1)]
    runs = {"one": run("one", together), "two": run("two", apart)}
    assert coinciding_requests(runs, exclude="long") == {"one": [["a", "b"]], "two": [["a", "b"]]}
    assert _stacked_lines(runs, "long") == " a, b: decoded in the same iterations, so their lines lie on top of each other."
    runs["two"] = run("two", [("a", 0.1, 0.05), ("b", 0.15, 0.05)])
    assert coinciding_requests(runs, exclude="long") == {"one": [["a", "b"]], "two": []}
    # Named per panel where the panels differ (chat1 sat under chat2 in two panels of three, unnamed).
    assert _stacked_lines(runs, "long") == " Decoded in the same iterations, so their lines lie on top of each other: one: a, b."
    runs["two"] = run("two", [("a", 0.1, 0.05), ("b", 0.15, 0.05), ("c", 0.1, 0.05)])
    assert _stacked_lines(runs, "long").endswith("one: a, b; two: a, c.")
    runs["two"] = run("two", [("r10", 0.1, 0.05), ("r2", 0.1, 0.05)])
    assert coinciding_requests(runs)["two"] == [["r2", "r10"]]  # name order, numbers as numbers
    runs["one"] = run("one", apart[1:])
    runs["two"] = run("two", apart[1:])
    assert _stacked_lines(runs, "long") == ""
