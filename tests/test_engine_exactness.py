"""Greedy tokens from our engine equal Hugging Face's, whatever the batching does around them."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.hf_reference import hf_greedy

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    "The three primary colours are",
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three prime numbers greater than ten and explain why each is prime."}],
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
MAX_NEW = 24


def _expected(engine: LLMEngine, weights, prompt) -> list[int]:
    return hf_greedy(weights, engine.tokenize(prompt), MAX_NEW)


def _run(engine: LLMEngine, arrivals: list[int]) -> dict[str, list[int]]:
    rids = [engine.add_request(p, SamplingParams(max_tokens=MAX_NEW), arrival_step=a)
            for p, a in zip(PROMPTS, arrivals)]
    records = []
    while engine.has_work():
        records.append(engine.step())
    return {r: list(engine.result(r).token_ids) for r in rids}, records


def test_single_requests_match_hf(real_weights):
    engine = LLMEngine(EngineConfig(num_blocks=64), real_weights)
    for p in PROMPTS[:2]:
        assert list(engine.generate(p, SamplingParams(max_tokens=MAX_NEW))[0].token_ids) == \
            _expected(engine, real_weights, p)


def test_mixed_batch_joining_at_different_steps_matches_hf(real_weights):
    engine = LLMEngine(EngineConfig(num_blocks=128, max_num_batched_tokens=48), real_weights)
    outputs, records = _run(engine, arrivals=[0, 0, 3, 5, 9])
    for rid, p in zip(outputs, PROMPTS):
        assert outputs[rid] == _expected(engine, real_weights, p), rid
    # The batch really was mixed: some step ran prefill chunks beside decodes.
    assert any(r.num_prefill_tokens and r.num_decode_tokens for r in records)
    assert max(r.num_batched_tokens for r in records) <= 48


def test_preemption_by_recompute_keeps_outputs_exact(real_weights):
    # 7 blocks of 16 tokens cannot hold five requests at once: the scheduler must preempt.
    engine = LLMEngine(EngineConfig(num_blocks=7, block_size=16, max_model_len=112), real_weights)
    outputs, records = _run(engine, arrivals=[0, 0, 0, 1, 1])
    assert any(r.preempted for r in records), "the pool was meant to force preemption"
    for rid, p in zip(outputs, PROMPTS):
        assert outputs[rid] == _expected(engine, real_weights, p), rid
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == 7


def test_static_batching_matches_hf(real_weights):
    engine = LLMEngine(EngineConfig(num_blocks=128, policy="static", max_num_seqs=3), real_weights)
    outputs, records = _run(engine, arrivals=[0, 0, 0, 0, 0])
    for rid, p in zip(outputs, PROMPTS):
        assert outputs[rid] == _expected(engine, real_weights, p), rid
    # Static: nobody joins while a batch is running.
    running_sets = [{s.request_id for s in r.batch} for r in records if r.batch]
    first_batch = running_sets[0]
    assert len(first_batch) == 3
