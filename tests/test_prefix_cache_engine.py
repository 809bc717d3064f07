"""The radix prefix cache inside the engine: lossless, really skips prefill, survives a small pool.

Exactness runs the real model (greedy, cache on vs off). Counting, eviction and the random-workload
property run a *tiny* random-weight Llama (2 layers, hidden 64; `random_state_dict` scaled x10 so
greedy tokens depend on the context): the scheduler, block manager, KV pool and attention paths are
the real ones, and a step costs milliseconds instead of a second on a busy CPU. Reading the wrong KV
block changes its tokens (the pool starts as random noise, not zeros).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import StepRecord, load_trace, save_trace
from engine.weights import LoadedWeights


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """One torch thread for this module (see conftest.one_torch_thread)."""
    yield


def _run(engine: LLMEngine, requests: list[tuple[list[int] | str | list[dict], int, int]],
         check: bool = False) -> tuple[dict[str, list[int]], list[StepRecord]]:
    """requests: (prompt, arrival_step, max_tokens). Runs to completion; optionally checks the
    block manager and tree invariants after every step."""
    rids = [engine.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True), arrival_step=a)
            for p, a, m in requests]
    records = []
    while engine.has_work():
        records.append(engine.step())
        if check:
            _check(engine)
        assert len(records) < 2000, "the engine stopped making progress"
    return {r: list(engine.result(r).token_ids) for r in rids}, records


def _check(engine: LLMEngine) -> None:
    cache = engine.scheduler.prefix_cache
    engine.block_manager.check_invariants(extra_refs=cache.block_refs() if cache else None)
    if cache:
        cache.check_invariants()


def _engine(weights: LoadedWeights, cache: bool, **kw) -> LLMEngine:
    # profile_kernels off: per-kernel timing nearly doubles a CPU step and is not what is tested here.
    return LLMEngine(EngineConfig(enable_prefix_cache=cache, profile_kernels=False, **kw), weights)


def _cached_per_request(records: list[StepRecord]) -> dict[str, int]:
    """Prompt tokens each request got from the cache at its (first) admission, from the batch views."""
    out: dict[str, int] = {}
    for r in records:
        for s in r.batch:
            if s.phase == "prefill":
                out.setdefault(s.request_id, s.num_cached_tokens)
    return out


def test_admission_does_not_count_its_own_matched_blocks_as_free_space() -> None:
    """Regression: the matched blocks may be unlocked cache entries (evictable, so counted in
    `available_blocks()`); once the new request shares them they are not. The scheduler used to check
    room before sharing them, then `append_slots` raised NoFreeBlocksError in the middle of a step."""
    from engine.block_manager import BlockManager
    from engine.radix_cache import RadixCache
    from engine.scheduler import Scheduler
    from engine.sequence import Sequence

    cfg = EngineConfig(block_size=4, num_blocks=10, max_num_batched_tokens=64, enable_prefix_cache=True)
    bm = BlockManager(10, 4)
    sched = Scheduler(cfg, bm)
    sched.prefix_cache = cache = RadixCache(bm)
    params = SamplingParams()
    done = Sequence("a", list(range(16)), 16, params, 0, 0)  # a finished request left 4 cached blocks
    bm.create(done.seq_id)
    bm.append_slots(done.seq_id, 16)
    done.num_computed_tokens = 16
    cache.on_finish(done)
    bm.free(done.seq_id)
    running = Sequence("c", list(range(100, 116)), 16, params, 0, 1)
    sched.add(running)
    sched.schedule(0)
    running.num_computed_tokens = 16
    running.token_ids.append(5)  # now decoding; 4 blocks held, 2 free, 4 cached
    hit = Sequence("b", list(range(16)) + list(range(200, 210)), 26, params, 1, 2)
    sched.add(hit)
    out = sched.schedule(1)  # decode takes the 5th block of c; b would need 3 more beside its 4 shared
    assert [s.request_id for s, _ in out.scheduled] == ["c"] and hit in sched.waiting
    assert bm.ref_counts[cache.match_prefix(hit.token_ids)[0][0]] == 1  # the failed admission left no ref
    bm.check_invariants(extra_refs=cache.block_refs())
    cache.check_invariants()


# ------------------------------------------------------------------------------- real model


FEW_SHOT = [
    {"role": "system", "content": "You answer geography questions in one short sentence."},
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "The capital of Italy is Rome."},
    {"role": "user", "content": "What is the capital of Spain?"},
    {"role": "assistant", "content": "The capital of Spain is Madrid."},
]
QUESTIONS = ["What is the capital of France?", "What is the capital of Japan?", "What is the capital of Canada?"]


@pytest.mark.slow
def test_greedy_outputs_identical_with_cache_on_and_off(real_weights: LoadedWeights) -> None:
    """A few-shot header shared by three requests arriving at different steps (the later ones while
    the first is still running), then a second chat turn whose prompt extends turn 1's prompt +
    answer: same greedy tokens with the cache on and off, and the cache really served the header and
    the first answer."""
    bs = 4
    results, views = {}, {}
    for cache in (False, True):
        engine = _engine(real_weights, cache, block_size=bs, num_blocks=160, max_model_len=256)
        prompts = [engine.tokenize(FEW_SHOT + [{"role": "user", "content": q}]) for q in QUESTIONS]
        turn1, rec1 = _run(engine, [(p, a, 5) for p, a in zip(prompts, [0, 1, 2])], check=cache)
        first = list(turn1.values())[0]
        follow = engine.tokenizer.encode("<|im_end|>\n<|im_start|>user\nWhat is it famous for?<|im_end|>\n"
                                         "<|im_start|>assistant\n")
        turn2, rec2 = _run(engine, [(prompts[0] + first + follow, engine.step_index, 4)], check=cache)
        results[cache] = list(turn1.values()) + list(turn2.values())
        views[cache] = (_cached_per_request(rec1 + rec2), prompts, first, engine)
    assert results[True] == results[False]
    assert all(v == 0 for v in views[False][0].values())
    cached, prompts, first, engine = views[True]
    r0, r1, r2, r3 = cached.values()
    header = len(engine.tokenize(FEW_SHOT)) // bs * bs
    assert r0 == 0 and r1 >= header - bs and r2 >= header - bs  # later arrivals reuse the header
    # Turn 2 reused everything turn 1 computed (its prompt and all but the last answer token), in whole blocks.
    assert r3 == (len(prompts[0]) + len(first) - 1) // bs * bs > len(prompts[0])
    assert engine.counters["prompt_tokens_cached"] == r1 + r2 + r3
    assert engine.scheduler.prefix_cache.counters["hits"] == 3


# ------------------------------------------------------------------------ tiny random model


def _shared_workload(seed: int = 0) -> list[tuple[list[int], int, int]]:
    import random

    rng = random.Random(seed)
    header = [rng.randrange(3, 4000) for _ in range(70)]
    other = [rng.randrange(3, 4000) for _ in range(40)]
    reqs = []
    for i in range(6):
        base = header if i % 3 else other
        reqs.append((base + [rng.randrange(3, 4000) for _ in range(rng.randrange(1, 20))], 2 * i, 6))
    return reqs


def test_prefill_tokens_computed_drop_by_the_matched_amount(tiny_weights: LoadedWeights) -> None:
    reqs = _shared_workload()
    runs = {}
    for cache in (False, True):
        engine = _engine(tiny_weights, cache, block_size=8, num_blocks=128, max_num_batched_tokens=64)
        outputs, records = _run(engine, reqs, check=True)
        runs[cache] = (outputs, records, engine)
    (out_off, rec_off, off), (out_on, rec_on, on) = runs[False], runs[True]
    assert out_on == out_off
    assert not any(r.preempted for r in rec_off + rec_on)
    saved = on.scheduler.prefix_cache.counters["tokens_saved"]
    assert saved >= 3 * 64 + 40  # three re-use the 70-token header (64 block-aligned), one the 40-token one
    # What the forward passes computed (engine counters and the batch views agree) dropped by exactly that.
    assert on.counters["prompt_tokens_cached"] == saved
    assert off.counters["prefill_tokens_computed"] - on.counters["prefill_tokens_computed"] == saved
    assert off.counters["decode_tokens_computed"] == on.counters["decode_tokens_computed"]
    for engine, records in ((off, rec_off), (on, rec_on)):
        assert sum(r.num_prefill_tokens for r in records) == engine.counters["prefill_tokens_computed"]
        assert sum(r.num_decode_tokens for r in records) == engine.counters["decode_tokens_computed"]
        assert len([r for r in records if r.batch]) == engine.counters["forward_passes"]
    # Per request: prefill computed = prompt - cached.
    cached = _cached_per_request(rec_on)
    for (prompt, _, _), rid in zip(reqs, out_on):
        computed = sum(s.num_tokens for r in rec_on for s in r.batch if s.request_id == rid and s.phase == "prefill")
        assert computed == len(prompt) - cached[rid]
        assert cached[rid] % 8 == 0 and cached[rid] < len(prompt)


def test_chunked_prompt_is_cached_while_it_is_still_prefilling(tiny_weights: LoadedWeights) -> None:
    """Insert-on-prefill: a request admitted while a long shared prompt is between chunks reuses the
    chunks already computed, not only prompts of finished requests."""
    prefix = list(range(100, 300))
    engine = _engine(tiny_weights, True, block_size=8, num_blocks=128, max_num_batched_tokens=32)
    outputs, records = _run(engine, [(prefix + [7], 0, 4), (prefix + [9, 9], 1, 4)], check=True)
    cached = _cached_per_request(records)
    first, second = cached
    admitted = next(r.step for r in records for s in r.batch if s.request_id == second)
    assert admitted < records[-1].step and engine.result(first).samples[0].finish_reason == "length"
    finish_first = next(r.step for r in records if first in r.finished)
    assert admitted < finish_first and cached[second] >= 160
    off = _engine(tiny_weights, False, block_size=8, num_blocks=128, max_num_batched_tokens=32)
    assert _run(off, [(prefix + [7], 0, 4), (prefix + [9, 9], 1, 4)])[0] == outputs


def test_eviction_under_a_small_pool_keeps_outputs_identical(tiny_weights: LoadedWeights) -> None:
    import random

    rng = random.Random(1)
    prefixes = [[rng.randrange(3, 4000) for _ in range(24)] for _ in range(4)]
    reqs = [(prefixes[i % 4] + [rng.randrange(3, 4000) for _ in range(rng.randrange(1, 9))], i, 6)
            for i in range(14)]
    kw = dict(block_size=4, num_blocks=24, max_num_seqs=3, max_num_batched_tokens=40, max_model_len=96)
    out_off, _ = _run(_engine(tiny_weights, False, **kw), reqs)
    engine = _engine(tiny_weights, True, **kw)
    out_on, records = _run(engine, reqs, check=True)
    assert out_on == out_off
    cache = engine.scheduler.prefix_cache
    assert cache.counters["evictions"] > 0 and cache.counters["hits"] > 0
    assert any(r.extra("radix")["evicted_this_step"] for r in records)
    # Nothing leaked: every block is free or held only by the tree (and thus evictable).
    bm = engine.block_manager
    assert bm.num_free_blocks + cache.num_blocks == bm.num_blocks == bm.available_blocks()
    held = cache.num_blocks
    assert held > 0 and cache.evict(bm.num_blocks) == held
    assert bm.num_free_blocks == bm.num_blocks and cache.num_nodes == 0


def test_every_record_carries_a_json_snapshot_of_the_tree(tiny_weights: LoadedWeights, tmp_path) -> None:
    engine = _engine(tiny_weights, True, block_size=8, num_blocks=64)
    _, records = _run(engine, _shared_workload()[:4])
    for r in records:
        snap = r.extra("radix")
        assert snap is not None and json.loads(json.dumps(snap)) == snap
        nodes = {n["id"]: n for n in snap["nodes"]}
        assert nodes[0]["parent"] is None
        for n in snap["nodes"][1:]:
            assert n["parent"] in nodes and len(n["tokens"]) == 8 * len(n["blocks"])
            assert n["text"] == engine.tokenizer.decode(n["tokens"])
        assert snap["num_tokens"] == sum(len(n["tokens"]) for n in snap["nodes"])
        assert snap["step"] == r.step
        for b in (b for n in snap["nodes"] for b in n["blocks"]):  # the pool view agrees: held, with an owner
            assert r.pool.ref_counts[b] >= 1 and r.pool.owners[b] != ""
    assert records[-1].extra("radix")["counters"]["hits"] >= 2
    save_trace(records, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert [a.extra("radix")["counters"] for a in again] == [dict(r.extra("radix")["counters"]) for r in records]


@st.composite
def _workloads(draw):
    block_size = draw(st.sampled_from([2, 4, 8]))
    chunked = draw(st.booleans())
    num_prefixes = draw(st.integers(1, 3))
    prefixes = [draw(st.lists(st.integers(3, 60), min_size=0, max_size=20)) for _ in range(num_prefixes)]
    reqs = []
    for _ in range(draw(st.integers(2, 8))):
        p = draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(3, 60), min_size=1, max_size=8))
        reqs.append((p, draw(st.integers(0, 6)), draw(st.integers(1, 8))))
    longest = max(len(p) + m for p, _, m in reqs)
    least = -(-longest // block_size)
    num_blocks = draw(st.integers(least, least + 8))  # small pools: preemption and eviction happen
    budget = draw(st.integers(4 if chunked else longest, 64))  # unchunked prompts must fit one step
    return dict(block_size=block_size, chunked_prefill=chunked, max_num_batched_tokens=budget,
                num_blocks=num_blocks, max_num_seqs=draw(st.integers(1, 4)), max_model_len=64), reqs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(work=_workloads())
def test_random_workloads_same_tokens_with_cache_and_consistent_every_step(tiny_weights, work) -> None:
    kw, reqs = work
    out_off, _ = _run(_engine(tiny_weights, False, **kw), reqs)
    engine = _engine(tiny_weights, True, **kw)
    out_on, records = _run(engine, reqs, check=True)
    assert out_on == out_off
    assert all(r.num_batched_tokens <= kw["max_num_batched_tokens"] for r in records)
    bm, cache = engine.block_manager, engine.scheduler.prefix_cache
    # Every admission's cached tokens were skipped by the forward pass that followed it (the engine
    # counts from the batches it ran, the cache from its matches).
    assert engine.counters["prompt_tokens_cached"] == cache.counters["tokens_saved"]
    assert not cache._locked and all(n.lock_ref == 0 for n in cache._nodes.values())
    assert bm.num_free_blocks + cache.num_blocks == bm.num_blocks


def test_parallel_samples_share_cached_prompt_blocks_safely(tiny_weights: LoadedWeights) -> None:
    """n > 1: the siblings fork the parent's blocks (some of them cached) without locks of their own;
    the tree and the ref counts stay consistent and the samples equal the cache-off run."""
    prefix = list(range(500, 540))
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3, ignore_eos=True)
    outs = {}
    for cache in (False, True):
        engine = _engine(tiny_weights, cache, block_size=4, num_blocks=40, max_num_batched_tokens=32)
        rids = [engine.add_request(prefix + tail, params, arrival_step=a)
                for tail, a in (([1, 2, 3], 0), ([4, 5], 2), ([6], 4))]
        while engine.has_work():
            engine.step()
            if cache:
                _check(engine)
        outs[cache] = [[s.token_ids for s in engine.result(r).samples] for r in rids]
        if cache:
            assert engine.scheduler.prefix_cache.counters["hits"] >= 2
            assert engine.block_manager.num_free_blocks + engine.scheduler.prefix_cache.num_blocks == 40
    assert outs[True] == outs[False]
