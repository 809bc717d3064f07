"""The verification-round chart shows the rule that really decided: min(1, p/q) with the draw u for a
sampled round, the argmax match for a greedy one (where min(1, p/q) would read as a keep probability
the rule never used); and the caption under it says the same.

Synthetic ROUND dicts (the format documented in engine/speculative/__init__.py) keep most of this
instant; one test reads real rounds from a tiny 2-layer engine.
"""
from __future__ import annotations

import pytest

from app.analysis.speculative import RoundView, rule_caption, step_rounds
from app.charts.speculative import round_figure
from app.scenario_library import SPECULATIVE
from app.session import EngineSession

SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}


def _round(mode: str) -> RoundView:
    """γ 4: drafts 1-2 accepted, draft 3 rejected (the target wanted "dog"), draft 4 never checked."""
    greedy = mode == "greedy"
    return RoundView({
        "request_id": "r0", "seq_id": 0, "mode": mode, "gamma": 4, "num_drafted": 4, "position": 20,
        "draft_token_ids": [11, 12, 13, 14], "draft_texts": ["␣the", "␣quick", "␣cat", "␣ran"],
        "p": [0.74, 0.52, 0.21, 0.30], "q": [0.9, 0.6, 0.5, 0.4],
        "uniforms": [None] * 4 if greedy else [0.41, 0.66, 0.73, None],
        "verdicts": ["accepted", "accepted", "rejected", "unverified"], "num_accepted": 2,
        "final_token_id": 99, "final_text": "␣dog", "final_kind": "resampled", "final_p": 0.46,
        "residual_mass": None if greedy else 0.35,
        "target_argmax_ids": [11, 12, 99, 7, 8], "target_argmax_texts": ["␣the", "␣quick", "␣dog", "␣a", "."],
        "emitted_token_ids": [11, 12, 99], "emitted_texts": ["␣the", "␣quick", "␣dog"],
        "draft_seconds": 0.01, "verify_seconds": 0.1, "drafter_detail": {"draft_layers": 4},
    })


def _row2_bars(fig) -> list:  # noqa: ANN001 - a plotly Figure
    return [t for t in fig.data if t.type == "bar" and t.yaxis == "y2"]


def _texts(fig) -> list[str]:  # noqa: ANN001
    return [a.text for a in fig.layout.annotations]


def test_argmax_match_follows_the_records() -> None:
    assert _round("greedy").argmax_match == [True, True, False, None]
    assert _round("greedy").sampled is False and _round("sampled").sampled is True


def test_greedy_round_shows_the_argmax_rule_not_a_keep_probability() -> None:
    r = _round("greedy")
    fig = round_figure(r, "a greedy round")
    (bars,) = _row2_bars(fig)
    # The target's p(draft), not min(1, p/q) (which would be 0.82, 0.87, ...); no bar after the rejection,
    # whose row was conditioned on a token the target did not keep.
    assert list(bars.y) == r["p"][:3] + [0.0]
    assert fig.layout.yaxis2.title.text == "target p(draft)"
    texts = _texts(fig)
    assert texts.count("✓ argmax") == 2 and "✗ argmax was ␣dog" in texts and "not checked" in texts
    assert "greedy rule: keep a draft iff it is the target's argmax (no random draw)" in texts  # the panel's title
    assert not any("min(1, p/q)" in t or "u < p/q" in t for t in texts)
    assert not any((t.name or "").startswith("u ~") for t in fig.data)  # greedy draws no u
    # The argmax that replaced the rejected draft, at its own probability (final_p) on draft 3.
    tick = next(t for t in fig.data if t.name == "target's argmax (its p)")
    assert list(tick.x) == [2] and list(tick.y) == [0.46]


def test_sampled_round_keeps_min_p_over_q_and_u() -> None:
    r = _round("sampled")
    fig = round_figure(r, "a sampled round")
    (bars,) = _row2_bars(fig)
    assert list(bars.y) == pytest.approx([min(1, p / q) for p, q in zip(r["p"], r["q"])])
    assert fig.layout.yaxis2.title.text == "min(1, p/q)"
    u = next(t for t in fig.data if (t.name or "").startswith("u ~ U[0, 1)"))
    assert list(u.x) == [0, 1, 2] and list(u.y) == [0.41, 0.66, 0.73]
    texts = _texts(fig)
    assert any(t.startswith("sampled rule: keep a draft iff u < p/q") for t in texts)
    assert "✓ argmax" not in texts


def test_captions_say_which_rule() -> None:
    greedy, sampled = rule_caption(_round("greedy")), rule_caption(_round("sampled"))
    assert "greedy" in greedy and "argmax" in greedy and "not with probability" in greedy
    assert "min(1, p/q)" not in greedy and "u ~ U[0, 1)" in sampled and "min(1, p/q)" in sampled


@pytest.mark.slow
def test_real_greedy_rounds_chart_their_argmax_match(tiny_weights) -> None:  # noqa: ANN001
    # Early exit on the tiny 2-layer model: greedy rounds, most of them rejecting a draft.
    s = EngineSession.create(SPECULATIVE[0].with_engine(spec_drafter="early_exit", spec_gamma=3,
                                                        spec_draft_layers=1), tiny_weights, SERVER)
    s.run(12)
    assert not s.errors, s.errors
    rounds = [r for rec in s.records for r in step_rounds(rec)]
    assert rounds and all(r["mode"] == "greedy" for r in rounds)
    assert any(r.rejected_index is not None for r in rounds)
    for r in rounds:
        match = r.argmax_match
        # Greedy verification is exactly this test: accepted iff the draft is the target's argmax.
        assert [m is True for m in match] == [v == "accepted" for v in r["verdicts"]]
        assert [m is False for m in match] == [v == "rejected" for v in r["verdicts"]]
        (bars,) = _row2_bars(round_figure(r))
        assert list(bars.y) == [p if m is not None else 0.0 for p, m in zip(r["p"], match)]
