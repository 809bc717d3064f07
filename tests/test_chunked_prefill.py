"""Chunked prefill (chapter 09): lossless, within the token budget, and decodes keep flowing.

With chunking on, a step runs every running sequence first (a decode costs one token, an unfinished
prompt takes a chunk of what is left) and then admits waiting prompts into what remains, so no step
exceeds `max_num_batched_tokens`. With it off ("prefill-first"), a step that admits prompts runs only
whole prompts and the running decodes stall.

Exactness runs the real model; the properties run a tiny random-weight Llama (2 layers, hidden 64,
`random_state_dict` scaled x10 so greedy tokens depend on context) through the real scheduler, block
manager, KV pool and attention paths, so hundreds of steps take seconds.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import StepRecord
from engine.weights import LoadedWeights


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """One torch thread for this module (see conftest.one_torch_thread)."""
    yield


def _run(engine: LLMEngine, requests, ignore_eos: bool = True) -> tuple[list[list[int]], list[StepRecord]]:
    """requests: (prompt, arrival_step, max_tokens); runs to completion."""
    rids = [engine.add_request(p, SamplingParams(max_tokens=m, ignore_eos=ignore_eos), arrival_step=a)
            for p, a, m in requests]
    records = []
    while engine.has_work():
        records.append(engine.step())
        assert len(records) < 3000, "the engine stopped making progress"
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.config.num_blocks
    return [list(engine.result(r).token_ids) for r in rids], records


def _engine(weights: LoadedWeights, **kw) -> LLMEngine:
    # profile_kernels off: per-kernel timing nearly doubles a CPU step and is not what is tested here.
    return LLMEngine(EngineConfig(profile_kernels=False, **kw), weights)


def _check_budget_and_policy(records: list[StepRecord], cfg: EngineConfig) -> None:
    for r in records:
        assert r.num_batched_tokens <= cfg.max_num_batched_tokens, f"step {r.step} over budget"
        if cfg.policy == "continuous" and not cfg.chunked_prefill and r.num_prefill_tokens:
            assert r.num_decode_tokens == 0, f"step {r.step} admitted prompts and still ran decodes"


# ------------------------------------------------------------------------------- real model

LONG = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined movable metal type, oil-based ink and a wooden press adapted from wine making. Before "
        "that, books were copied by hand, which made them rare and expensive. Within fifty years presses "
        "had spread to more than two hundred cities across Europe, and millions of volumes had been "
        "printed. Cheap pamphlets carried news, sermons and arguments faster than any authority could "
        "answer them, and the Reformation is often described as the first movement to spread by print. "
        "Standardised texts also changed science: scholars in different countries could now read the same "
        "tables, diagrams and errors, and correct them in the next edition. Summarise this paragraph in "
        "one sentence.")


@pytest.mark.slow
def test_greedy_outputs_identical_with_chunking_on_and_off(real_weights: LoadedWeights) -> None:
    requests = [
        ([{"role": "user", "content": LONG}], 0, 6),
        ([{"role": "user", "content": "Name a colour."}], 0, 6),
        ([{"role": "user", "content": "What is two plus two?"}], 2, 6),
        ([{"role": "user", "content": LONG.replace("Summarise", "Give a title for")}], 3, 6),
    ]
    chunked = _engine(real_weights, block_size=16, num_blocks=64, max_num_batched_tokens=64, chunked_prefill=True)
    whole = _engine(real_weights, block_size=16, num_blocks=64, max_num_batched_tokens=512, chunked_prefill=False)
    out_chunked, rec_chunked = _run(chunked, requests, ignore_eos=False)
    out_whole, rec_whole = _run(whole, requests, ignore_eos=False)
    assert out_chunked == out_whole
    _check_budget_and_policy(rec_chunked, chunked.config)
    _check_budget_and_policy(rec_whole, whole.config)
    long_len = len(chunked.tokenize(requests[0][0]))
    assert long_len > 2 * 64
    # Chunking really happened: the long prompts went in budget-sized pieces beside running decodes.
    chunks = [s.num_tokens for r in rec_chunked for s in r.batch if s.request_id == "r0" and s.phase == "prefill"]
    assert len(chunks) >= 3 and sum(chunks) == long_len
    assert any(r.num_prefill_tokens and r.num_decode_tokens for r in rec_chunked)
    # Without chunking some step ran more than 64 tokens, and some running decode stalled.
    assert max(r.num_batched_tokens for r in rec_whole) > 64
    assert any(r.num_prefill_tokens and any(q.status == "decode" for q in prev.requests)
               for prev, r in zip(rec_whole, rec_whole[1:]))


# ----------------------------------------------------------------------- properties (tiny model)


@st.composite
def _workloads(draw):
    n = draw(st.integers(1, 7))
    reqs = [(draw(st.lists(st.integers(3, 3000), min_size=1, max_size=90)), draw(st.integers(0, 8)),
             draw(st.integers(1, 8))) for _ in range(n)]
    return reqs


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reqs=_workloads(), budget=st.integers(4, 48), max_seqs=st.integers(1, 4),
       policy=st.sampled_from(["continuous", "continuous", "static"]), spare=st.integers(0, 16),
       block_size=st.sampled_from([4, 8, 16]))
def test_no_step_exceeds_the_budget_and_tokens_match_unchunked(tiny_weights, reqs, budget, max_seqs, policy,
                                                                 spare, block_size) -> None:
    """Random workloads with chunking on: every step within the budget; with a roomy pool the decodes
    never stall behind prompts; greedy tokens equal a prefill-first run of the same requests."""
    longest = max(len(p) + m for p, _, m in reqs)
    num_blocks = -(-longest // block_size) + spare  # small pools: preemption happens
    kw = dict(block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_seqs, max_model_len=128, policy=policy)
    engine = _engine(tiny_weights, max_num_batched_tokens=budget, chunked_prefill=True, **kw)
    outputs, records = _run(engine, reqs)
    _check_budget_and_policy(records, engine.config)
    if policy == "continuous":
        for prev, r in zip(records, records[1:]):
            if r.preempted:
                continue
            decoding = {q.request_id for q in prev.requests if q.status == "decode"}
            assert decoding <= {s.request_id for s in r.batch}, f"a decode stalled at step {r.step}"
    whole = _engine(tiny_weights, max_num_batched_tokens=max(longest, budget), chunked_prefill=False, **kw)
    assert _run(whole, reqs)[0] == outputs


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reqs=_workloads(), extra_budget=st.integers(0, 64), max_seqs=st.integers(1, 4), spare=st.integers(0, 16))
def test_prefill_first_admitting_steps_run_no_decodes(tiny_weights, reqs, extra_budget, max_seqs, spare) -> None:
    """Chunking off: a step that admits prompts runs whole prompts only and no decode tokens."""
    longest = max(len(p) + m for p, _, m in reqs)
    budget = longest + extra_budget  # add_request insists a whole prompt (+ recompute) fits one step
    engine = _engine(tiny_weights, block_size=8, num_blocks=-(-longest // 8) + spare, max_num_seqs=max_seqs,
                     max_num_batched_tokens=budget, max_model_len=128, chunked_prefill=False)
    _, records = _run(engine, reqs)
    _check_budget_and_policy(records, engine.config)
    prompt_len = {q.request_id: q.prompt_len for q in records[-1].requests}
    for r in records:
        for s in r.batch:
            if s.phase == "prefill":  # a whole prompt (or a whole recompute), never a piece
                assert s.context_len >= prompt_len[s.request_id] and s.context_len == s.num_tokens
