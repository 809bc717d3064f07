"""Medusa and EAGLE through the paged engine with the real model and the committed heads.

Greedy output must be token-for-token what plain greedy decoding emits, in a continuous batch that
mixes prefill chunks with tree rounds; after every step each running sequence's block table holds
exactly its computed tokens (the accepted path compacted, every other branch rolled back), and the
trace describes each tree consistently.
"""
from __future__ import annotations

import json

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculative.heads import head_available
from engine.trace import load_trace, save_trace

pytestmark = pytest.mark.skipif(not (head_available("medusa") and head_available("eagle")),
                                reason="trained heads missing (python -m training.train_medusa / train_eagle)")

PROMPTS = [
    [{"role": "user", "content": "How does a refrigerator keep food cold?"}],
    [{"role": "user", "content": "Give me some advice for writing a good cover letter."}],
    "The three primary colours are",
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
ARRIVALS = [0, 0, 2, 3]
GAMMAS = [None, None, 0, None]  # 0: this request never speculates
MAX_NEW = 32


def _config(**kw) -> EngineConfig:
    base = dict(num_blocks=96, max_num_batched_tokens=64, max_model_len=512, profile_kernels=False, spec_gamma=1)
    return EngineConfig(**(base | kw))


def _run(engine: LLMEngine, params: SamplingParams):
    spec = engine.speculator is not None
    rids = [engine.add_request(p, params, arrival_step=a, **({"spec_gamma": g} if spec else {}))
            for p, a, g in zip(PROMPTS, ARRIVALS, GAMMAS)]
    records = []
    while engine.has_work():
        records.append(engine.step())
        bm = engine.block_manager
        bm.check_invariants()
        for seq in engine.scheduler.running:
            assert bm.num_tokens[seq.seq_id] == seq.num_computed_tokens or seq.in_prefill
        assert len(records) < 500
    return {r: list(engine.result(r).token_ids) for r in rids}, records


@pytest.fixture(scope="module")
def plain(real_weights):
    out, _ = _run(LLMEngine(_config(), real_weights), SamplingParams(max_tokens=MAX_NEW))
    return list(out.values())


@pytest.mark.slow
@pytest.mark.parametrize("drafter,knobs", [("medusa", dict(spec_tree_nodes=24, spec_tree_topk=4)),
                                           ("eagle", dict(spec_tree_nodes=24, spec_tree_depth=5, spec_tree_topk=4)),
                                           ("eagle", dict(spec_tree_nodes=6, spec_tree_depth=3, spec_tree_topk=2))])
def test_greedy_tree_speculation_is_lossless(real_weights, plain, drafter, knobs, tmp_path):
    engine = LLMEngine(_config(spec_drafter=drafter, **knobs), real_weights)
    out, records = _run(engine, SamplingParams(max_tokens=MAX_NEW))
    assert list(out.values()) == plain
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    rounds = [rd for r in records for rd in r.extra("spec")["rounds"]]
    assert rounds and all(rd["kind"] == "tree" for rd in rounds)
    rids = list(out)
    assert not any(rd["request_id"] == rids[2] for rd in rounds)  # spec_gamma=0: plain decoding
    c = engine.counters
    assert c["spec_rounds"] == len(rounds)
    assert c["spec_accepted_tokens"] == sum(rd["num_accepted"] for rd in rounds)
    # Real speculation: fewer target passes than tokens for the requests that speculate.
    assert c["spec_emitted_tokens"] > c["spec_rounds"]
    for r in records:
        for rd in r.extra("spec")["rounds"]:
            t = rd["tree"]
            n = len(t["token_ids"])
            assert n <= knobs["spec_tree_nodes"] and max(t["depths"]) <= knobs.get("spec_tree_depth", 99)
            path = rd["accepted_path"]
            # The path is a chain from the root, each node the target's argmax at its parent's row.
            parent = -1
            for node in path:
                assert t["parents"][node] == parent
                assert t["token_ids"][node] == rd["target_argmax_ids"][parent + 1]
                parent = node
            assert rd["final_token_id"] == rd["target_argmax_ids"][parent + 1]
            assert [s for s in t["status"] if s == "accepted"] == ["accepted"] * len(path)
            emitted = [e.token_id for e in r.emitted if e.request_id == rd["request_id"]]
            assert emitted == rd["emitted_token_ids"]
            assert emitted == ([t["token_ids"][i] for i in path] + [rd["final_token_id"]])[:len(emitted)]
            view = next(s for s in r.batch if s.request_id == rd["request_id"])
            assert view.num_tokens == 1 + n
            if rd["request_id"] not in r.finished:
                assert view.context_len == rd["position"] + rd["num_accepted"]
    assert any(r.num_prefill_tokens and r.extra("spec")["rounds"] for r in records)
    save_trace(records, tmp_path / "trace.json")
    again = load_trace(tmp_path / "trace.json")
    assert [a.to_dict() for a in again] == [json.loads(json.dumps(r.to_dict())) for r in records]


@pytest.mark.slow
def test_tree_speculation_survives_preemption(real_weights):
    """A pool too small for all four requests: preemption by recompute, trees on top, same tokens.
    48 new tokens each, so the running requests outgrow the pool however many drafts are accepted
    (with 24, a better-trained EAGLE layer finished them before the pool ran out: 5 preemptions now)."""
    params = SamplingParams(max_tokens=48)
    small = dict(num_blocks=10, max_model_len=256)
    base, _ = _run(LLMEngine(_config(**small), real_weights), params)
    engine = LLMEngine(_config(spec_drafter="eagle", spec_tree_nodes=12, **small), real_weights)
    out, records = _run(engine, params)
    assert list(out.values()) == list(base.values())
    assert any(r.preempted for r in records)


@pytest.mark.slow
def test_sampled_tree_rounds_are_reproducible(real_weights):
    params = SamplingParams(max_tokens=20, temperature=0.8, seed=7)

    def once():
        engine = LLMEngine(_config(spec_drafter="medusa", spec_tree_nodes=16), real_weights)
        rid = engine.add_request(PROMPTS[0], params)
        records = [engine.step() for _ in range(200) if engine.has_work()]
        rounds = [rd for r in records for rd in r.extra("spec")["rounds"]]
        return list(engine.result(rid).token_ids), rounds

    a, rounds = once()
    b, _ = once()
    assert a == b and len(a) == 20
    assert rounds and all(rd["mode"] == "sampled" for rd in rounds)
    for rd in rounds:  # children tried in turn; the accepted one is the last trial before moving down
        for trial in rd["trials"]:
            assert 0.0 <= trial["u"] < 1.0 and 0.0 <= trial["p"] <= 1.0
            assert trial["accepted"] == (trial["u"] < trial["p"])
        assert sum(t["accepted"] for t in rd["trials"]) == rd["num_accepted"]


def test_tree_knobs_are_validated():
    with pytest.raises(ValueError, match="spec_tree_nodes"):
        EngineConfig(spec_drafter="eagle", spec_tree_nodes=0)
    with pytest.raises(ValueError, match="spec_drafter"):
        EngineConfig(spec_drafter="lookahead")
