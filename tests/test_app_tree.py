"""The Medusa and EAGLE page under AppTest, and the record-only analysis and charts behind it.

Random weights keep these independent of the GGUF (the committed heads load on any weights of this
architecture; on random weights they rarely agree, which is fine for drawing and bookkeeping).
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.analysis.tree_spec import (FINAL, ROOT, VerifyCost, compare_tree_drafters, cost_caption, cost_inversions,
                                    draft_tree_graph, mask_caption, mask_labels, mean_tokens_per_round, round_sentence,
                                    training_summary, tree_rounds, tree_series, verify_cost_sweep)
from app.charts.draft_tree import (draft_tree_figure, tokens_per_round_figure, tree_compare_figure, tree_mask_figure,
                                   verify_cost_figure)
from app.registry import PAGES
from app.scenario_library import TREE_SPEC
from app.scenarios import RequestSpec, scenario_from_json
from app.session import EngineSession
from engine.speculative.heads import head_available
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)

PAGE_FILE = "08_medusa_eagle.py"
SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (head_available("medusa") and head_available("eagle")),
                                                    reason="trained heads missing")]


def _round() -> dict:
    """A greedy tree round as the engine writes it: root 'The', a 5-node tree, path n0 -> n3, bonus 'sea'."""
    return {"request_id": "r0", "seq_id": 0, "mode": "greedy", "kind": "tree", "gamma": 1, "num_drafted": 5,
            "position": 10, "root_token_id": 1, "root_text": "The",
            "tree": {"token_ids": [11, 12, 13, 14, 15], "texts": ["␣blue", "␣red", "␣old", "␣whale", "␣man"],
                     "parents": [-1, -1, -1, 0, 1], "depths": [1, 1, 1, 2, 2], "q": [0.5, 0.2, 0.1, 0.7, 0.9],
                     "path_prob": [0.5, 0.2, 0.1, 0.35, 0.18],
                     "status": ["accepted", "rejected", "rejected", "accepted", "unreached"]},
            "accepted_path": [0, 3], "num_accepted": 2, "final_token_id": 16, "final_text": "␣sea",
            "final_kind": "bonus", "final_p": 0.8, "target_argmax_ids": [11, 14, 1, 1, 16, 1],
            "target_argmax_texts": ["␣blue", "␣whale", "x", "x", "␣sea", "x"], "trials": [],
            "kv_moves": [[14, 12]], "emitted_token_ids": [11, 14, 16], "emitted_texts": ["␣blue", "␣whale", "␣sea"],
            "draft_seconds": 0.01, "verify_seconds": 0.1, "drafter_detail": {"tree": "dynamic"}}


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.title == "Medusa and EAGLE")
    assert spec.available and spec.url_path == "medusa-eagle"


@pytest.mark.parametrize("scenario", TREE_SPEC, ids=lambda s: s.name)
def test_scenarios_round_trip(scenario) -> None:  # noqa: ANN001
    assert scenario_from_json(scenario.to_json()) == scenario
    assert scenario.engine_config(**SERVER).spec_drafter in ("medusa", "eagle")


def test_tree_graph_mask_and_sentence() -> None:
    r = _round()
    g = draft_tree_graph(r)
    assert g.number_of_nodes() == 5 + 2 and set(g.successors(ROOT)) == {0, 1, 2}
    assert list(g.predecessors(FINAL)) == [3]  # the bonus hangs under the last accepted node
    assert g.nodes[3]["status"] == "accepted" and g.nodes[4]["status"] == "unreached"
    assert mask_labels(r)[0].startswith("root") and len(mask_labels(r)) == 6
    mask = tree_mask_figure(r)
    z = mask.data[0].z
    assert z[4][1] == 2 and z[4][0] == 2 and z[5][2] == 1 and z[5][1] == 0  # path rows green; n4 sees n1 only
    assert mask.layout.xaxis.tickangle == 0  # 6 columns: labels side by side
    wide = _round()
    n = 24  # the EAGLE scenario's tree: its 25 column labels ran into one string side by side
    wide["tree"] = {"token_ids": list(range(20, 20 + n)), "texts": [f"t{i}" for i in range(n)],
                    "parents": [-1] * 3 + [i % 3 for i in range(n - 3)], "depths": [1] * 3 + [2] * (n - 3),
                    "q": [0.1] * n, "path_prob": [0.1] * n, "status": ["accepted"] + ["rejected"] * (n - 1)}
    wide["accepted_path"], wide["num_accepted"] = [0], 1
    wide_mask = tree_mask_figure(wide)
    assert len(wide_mask.data[0].z) == n + 1 and wide_mask.layout.xaxis.tickangle == -90
    assert "5 nodes" in round_sentence(r) and "3 tokens" in round_sentence(r)
    fig = draft_tree_figure(r)
    assert {t.name for t in fig.data if t.name} >= {"accepted (on the kept path)", "checked and rejected"}
    # Node labels take their size from the annotation font only, which presentation mode scales: an
    # inline "font-size:10px" for q stayed 10 px on the projector.
    from app.theme import scale_explicit_fonts
    labels = list(fig.layout.annotations)
    assert len(labels) == g.number_of_nodes() and not any("font-size" in a.text for a in labels)
    # One label per node, starting just right of its marker on an opaque ground, so the edge that
    # leaves the node along its row does not run through the text.
    pos = {(round(t.x[i], 6), round(t.y[i], 6)) for t in fig.data if t.mode == "markers" for i in range(len(t.x))}
    assert {(round(a.x, 6), round(a.y, 6)) for a in labels} == pos
    assert all(a.xanchor == "left" and a.xshift > 0 and a.bgcolor for a in labels)
    before = [a.font.size for a in labels]
    scale_explicit_fonts(fig, 1.5)
    assert [a.font.size for a in fig.layout.annotations] == [round(s * 1.5) for s in before]


def test_tree_numbers_and_mask_colours_are_named() -> None:
    """The grey q beside a node and the final token's p are two models' probabilities of two tokens: the chart
    says which; the mask's caption says what its green cells are."""
    r = _round()
    subtitle = draft_tree_figure(r).layout.title.subtitle.text
    assert "q, the drafter's probability" in subtitle and "p: the target's probability" in subtitle
    text = mask_caption(r)
    assert "Green: the visible cells of the rows that were kept (the root and the 2 accepted nodes)" in text
    none_kept = {**r, "accepted_path": [], "num_accepted": 0}
    assert "(the root (no node was accepted))" in mask_caption(none_kept)


def test_one_node_tree_in_words() -> None:
    r = _round()
    r["tree"] = {k: v[:1] for k, v in r["tree"].items()}
    r["accepted_path"], r["num_accepted"], r["kv_moves"] = [], 0, []
    text = round_sentence(r)
    assert "a tree of **1 node, depth 1** verified in one pass of 2 rows" in text and "1 nodes" not in text
    assert "(0 tokens)" in text and "1 token from one target pass" in text and "1 of its 1 node slot rolled" in text


def test_cost_caption_calls_a_smaller_slower_tree_noise() -> None:
    """A burst of load put 4 nodes at 184 ms above 8 nodes at 100 ms: the caption says the points are medians
    and names such a flip as noise; the chart draws each point's spread."""
    costs = [VerifyCost(0, 0.080, 0.075, 0.09, 5), VerifyCost(4, 0.184, 0.10, 0.20, 5),
             VerifyCost(8, 0.100, 0.095, 0.12, 5), VerifyCost(64, 0.200, 0.19, 0.23, 5)]
    assert [(a.nodes, b.nodes) for a, b in cost_inversions(costs)] == [(4, 8)]
    text = cost_caption(costs)
    assert "median of 5 passes" in text and "8 nodes measured faster than 4 nodes (100 ms against 184 ms)" in text
    assert "measured faster" not in cost_caption([costs[0], costs[2], costs[3]])
    one = [VerifyCost(0, 0.08)]
    assert cost_caption(one).startswith("0 nodes cost 1.00×") and "median of 1 pass," in cost_caption(one)
    err = verify_cost_figure(costs).data[0].error_y
    assert list(err.array) == pytest.approx([10, 16, 20, 30]) and list(err.arrayminus) == pytest.approx([5, 84, 5, 10])
    assert verify_cost_figure([VerifyCost(0, 0.08), VerifyCost(8, 0.1)]).data[0].error_y.array is None


def test_session_series_cost_and_compare(random_weights) -> None:  # noqa: ANN001
    s = EngineSession.create(TREE_SPEC[0].with_requests([RequestSpec("Tell me about the sea.", max_tokens=10,
                                                                      ignore_eos=True)]), random_weights, SERVER)
    s.run(100)
    assert not s.errors, s.errors
    rounds = [r for rec in s.records for r in tree_rounds(rec)]
    assert rounds
    pts = tree_series(s.records)
    assert len(pts) == len(rounds) and mean_tokens_per_round(pts) >= 1.0
    assert len(tokens_per_round_figure(pts, 2, len(s.records)).data) >= 2
    for r in rounds[:3]:
        assert draft_tree_figure(r).data and tree_mask_figure(r).data
    costs = verify_cost_sweep(s.engine, context_len=32, sizes=(0, 8), repeats=1)
    assert [c.nodes for c in costs] == [0, 8] and all(c.seconds > 0 for c in costs)
    costs = verify_cost_sweep(s.engine, context_len=32, sizes=(0, 8), repeats=3)
    assert all(0 < c.fastest <= c.seconds <= c.slowest and c.runs == 3 for c in costs)
    assert verify_cost_figure(costs).data
    runs = compare_tree_drafters(TREE_SPEC[0].with_requests([RequestSpec("Hello there", max_tokens=6,
                                                                         ignore_eos=True)]), random_weights, SERVER)
    assert set(runs) == {"plain", "medusa", "eagle"} and not any(r.errors for r in runs.values())
    plain = dict(runs["plain"].texts)
    assert dict(runs["medusa"].texts) == plain and dict(runs["eagle"].texts) == plain
    assert len(tree_compare_figure(runs).data) == 2
    assert "conversations" in training_summary("eagle")


def test_page_steps_scrubs_controls_cost_and_compare(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE_FILE)
    assert_clean(at)
    for _ in range(3):
        at.button(key="tree-btn-step").click().run()
        assert_clean(at)
    session = at.session_state["engine-session:tree"]
    assert [r.step for r in session.records] == [0, 1, 2]
    assert any(m.label == "τ so far" for m in at.metric)
    # The metric row reads like the speculative page's: short values, the detail in grey chips.
    metrics = {m.label: m for m in at.metric}
    assert "Draft / verify time" not in metrics
    assert metrics["Time drafting"].delta.startswith("verifying ") and len(metrics["Time drafting"].value) <= 10
    assert metrics["Drafter"].delta.endswith(" nodes")
    # Five labels in a row fit one line each on a 1280 px projector in presentation mode.
    assert all(len(label) <= 18 for label in list(metrics)[:5]), list(metrics)
    assert metrics["This step"].delta == "tokens / rounds"
    # The benchmark table shows one workload at a time, all its rows (the tree drafters among them).
    bench = next(d.value for d in at.dataframe if "tokens per pass (τ)" in d.value.columns)
    assert "workload" not in bench.columns and {"Medusa heads", "EAGLE layer"} <= set(bench["drafter"])
    # What this table's benchmark ran, and that page 07's table ran another set (so its numbers differ).
    assert any("prompts in each of" in c.value and "ran a different set: " in c.value for c in at.caption)
    at.segmented_control(key="tree-bench-workload").set_value("unseen").run()
    unseen = next(d.value for d in at.dataframe if "tokens per pass (τ)" in d.value.columns)
    assert len(unseen) == len(bench) and not unseen.equals(bench)
    at.slider(key="tree-scrub").set_value(0).run()
    assert_clean(at)
    at.selectbox(key="tree-tree-drafter").set_value("medusa")
    at.slider(key="tree-tree-nodes").set_value(8)
    at.button(key="FormSubmitter:tree-tree-form-Apply and restart").click().run()
    assert_clean(at)
    session = at.session_state["engine-session:tree"]
    assert session.engine.config.spec_drafter == "medusa" and session.engine.config.spec_tree_nodes == 8
    for _ in range(2):
        at.button(key="tree-btn-step").click().run()
    assert_clean(at)
    at.button(key="tree-cost").click().run()
    assert_clean(at)
    assert at.session_state["page-cache:tree"]["cost"]
    assert any("Each point is the median of 5 passes" in c.value for c in at.caption)


def test_drafting_time_before_any_round_is_a_dash() -> None:
    """At the prefill (or with no drafter) nothing was drafted or verified: a dash, not "0 µs"."""
    from app.formatting import NO_VALUE
    from app.widgets.spec_metrics import drafting_time_metric

    class Column:
        def __init__(self) -> None:
            self.shown: list[tuple[str, str, str]] = []

        def metric(self, label: str, value: str, delta: str, **_: object) -> None:
            self.shown.append((label, value, delta))

    col = Column()
    drafting_time_metric(col, 0.0, 0.0, "help")  # type: ignore[arg-type]
    drafting_time_metric(col, 0.002, 0.010, "help")  # type: ignore[arg-type]
    assert col.shown == [("Time drafting", NO_VALUE, "no rounds"), ("Time drafting", "2 ms", "verifying 10 ms")]


def test_a_kept_node_never_reads_zero_probability() -> None:
    """A node in a top-k tree had "for 0.00" under it: below 0.005 it reads "<0.01" (escaped for Plotly)."""
    from app.charts.draft_tree import prob_text

    assert (prob_text(0.004), prob_text(0.005), prob_text(0.42), prob_text(0.0)) == ("&lt;0.01", "0.01", "0.42",
                                                                                      "0.00")
