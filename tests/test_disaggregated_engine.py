"""The disaggregated engine: a prefill worker and a decode worker with their own KV pools, the prompt's
KV handed over through shared memory. Lossless (greedy and seeded sampling give the tokens of one
engine, and greedy matches Hugging Face), the decode worker computes no prompt token, time never runs
backwards across the handoff, and bad input leaves everything as it was."""
from __future__ import annotations

import dataclasses
import multiprocessing
from multiprocessing import shared_memory

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, ModelConfig
from engine.disaggregated import DisaggregatedEngine
from engine.disaggregated.transport import SharedMemoryTransport
from engine.engine import LLMEngine
from engine.kv_pool import KVPool
from engine.sampling_params import SamplingParams
from tests.hf_reference import hf_greedy

CFG = EngineConfig(block_size=16, num_blocks=64, max_model_len=512)
CHATS = [[{"role": "user", "content": c}] for c in (
    "Tell me a fun fact about octopuses.", "Why do cats purr?",
    "Summarise in one sentence why the sky is blue, mentioning Rayleigh scattering and sunsets.")]


def run_to_end(cluster: DisaggregatedEngine, limit: int = 500) -> list:
    ticks = []
    while cluster.has_work() and len(ticks) < limit:
        ticks.append(cluster.step())
    assert not cluster.has_work(), "did not finish"
    return ticks


def assert_drained(cluster: DisaggregatedEngine) -> None:
    """Every block back on both free lists, nothing left in the transport."""
    for worker in (cluster.prefill, cluster.decode):
        worker.block_manager.check_invariants()
        assert worker.block_manager.num_free_blocks == worker.config.num_blocks
    assert not cluster._in_flight and cluster.transport.in_flight == 0


def test_greedy_matches_one_engine_and_hugging_face(real_weights) -> None:  # noqa: ANN001
    params = SamplingParams(max_tokens=16)
    single = LLMEngine(CFG, real_weights).generate(CHATS, params)
    cluster = DisaggregatedEngine(CFG, real_weights)
    split = cluster.generate(CHATS, params)
    for a, b in zip(single, split):
        assert b.token_ids == a.token_ids
        assert list(b.token_ids) == hf_greedy(real_weights, list(a.prompt_token_ids), 16)
        assert b.text == a.text
    # The decode worker took every prompt from a handoff: it computed none of them itself.
    assert cluster.decode.counters["prefill_tokens_computed"] == 0
    assert cluster.prefill.counters["prefill_tokens_computed"] == sum(len(r.prompt_token_ids) for r in single)
    assert cluster.prefill.counters["decode_tokens_computed"] == 0
    assert len(cluster.handoffs) == 3
    assert_drained(cluster)


def test_the_decode_pool_holds_the_prefill_pools_kv(random_weights) -> None:  # noqa: ANN001
    """The bytes the decode worker attends over are the prefill worker's, bit for bit, in other blocks."""
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random"), random_weights)
    cluster.add_request(CHATS[0], SamplingParams(max_tokens=8), request_id="first")
    cluster.add_request(CHATS[1], SamplingParams(max_tokens=8), request_id="second", arrival_step=2)
    seen = {}
    original = cluster.decode.adopt_prefilled

    def adopt(request_id, token_ids, prompt_len, params, fill, state=None):  # noqa: ANN001, ANN202
        blocks = original(request_id, token_ids, prompt_len, params, fill, state)
        seen[request_id] = (cluster.decode.pool.read_blocks(blocks).clone(), blocks)
        return blocks

    cluster.decode.adopt_prefilled = adopt
    sent = {}
    hook = cluster._on_prefill_finish

    def on_finish(seq, reason):  # noqa: ANN001, ANN202
        blocks = cluster.prefill.block_manager.tables[seq.seq_id][:cluster.prefill.block_manager.blocks_for(seq.prompt_len)]
        sent[seq.request_id] = cluster.prefill.pool.read_blocks(blocks).clone()
        hook(seq, reason)

    cluster.prefill.on_finish = on_finish
    run_to_end(cluster)
    assert set(seen) == set(sent) == {"first", "second"}
    for rid in seen:
        assert torch.equal(seen[rid][0], sent[rid])
    assert seen["first"][1] != seen["second"][1]
    assert_drained(cluster)


def test_seeded_sampling_continues_where_the_prefill_worker_left_off(random_weights) -> None:  # noqa: ANN001
    """The prefill worker samples the first token; its generator state travels with the KV, so a seeded
    request gives the same tokens as on one engine."""
    cfg = dataclasses.replace(CFG, weights="random")
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    single = LLMEngine(cfg, random_weights).generate(CHATS, params)
    split = DisaggregatedEngine(cfg, random_weights).generate(CHATS, params)
    assert [r.token_ids for r in split] == [r.token_ids for r in single]


def test_time_never_runs_backwards(random_weights) -> None:  # noqa: ANN001
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random"), random_weights)
    for i, chat in enumerate(CHATS):
        cluster.add_request(chat, SamplingParams(max_tokens=10, ignore_eos=True), arrival_step=3 * i)
    ticks = run_to_end(cluster)
    for worker in ("prefill", "decode"):
        steps = [s for t in ticks for s in (t.prefill_steps if worker == "prefill" else (t.decode_step,)) if s]
        assert all(a.end <= b.start + 1e-12 for a, b in zip(steps, steps[1:])), worker  # one step at a time
    for h in cluster.handoffs:
        assert h.taken_at >= h.sent_at  # taken after it was sent, on the run's clock
        assert h.taken_tick >= h.sent_tick
        assert h.nbytes == len(h.src_blocks) * cluster.prefill.pool.nbytes // CFG.num_blocks
    final = {q.request_id: q for q in ticks[-1].requests}
    for q in final.values():
        assert q.stage == "finished" and q.output_len == 10
        assert q.arrival_time <= q.first_token_time <= q.token_times[1] <= q.finish_time
        assert list(q.token_times) == sorted(q.token_times)


def test_handoffs_wait_for_room_in_a_small_decode_pool(tiny_weights) -> None:  # noqa: ANN001
    """Five requests, room for about two at a time on the decode worker: the rest wait in the transport
    (first come, first served), none is lost, and the tokens are those of one engine."""
    cfg = dataclasses.replace(CFG, weights="random", num_blocks=8)
    prompts = [[{"role": "user", "content": f"Count to {k}."}] for k in range(5)]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    single = LLMEngine(cfg, tiny_weights).generate(prompts, params)
    cluster = DisaggregatedEngine(cfg, tiny_weights)
    rids = [cluster.add_request(p, params) for p in prompts]
    ticks = run_to_end(cluster)
    assert max(len(t.in_flight) for t in ticks) >= 2
    assert [h.request_id for h in cluster.handoffs] == rids
    assert [cluster.result(r).token_ids for r in rids] == [r.token_ids for r in single]
    assert_drained(cluster)


def test_a_request_that_ends_at_its_first_token_never_moves(random_weights) -> None:  # noqa: ANN001
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random"), random_weights)
    rid = cluster.add_request(CHATS[0], SamplingParams(max_tokens=1))
    ticks = run_to_end(cluster)
    assert cluster.handoffs == [] and len(cluster.result(rid).token_ids) == 1
    assert ticks[-1].requests[0].finish_reason == "length"
    assert cluster.decode.counters["forward_passes"] == 0
    assert_drained(cluster)


@pytest.mark.parametrize("prompt,params,match", [
    ("   ", SamplingParams(), "must not be empty"),
    ("Hi", SamplingParams(max_tokens=600), "max_model_len"),
    ("Hi", SamplingParams(n=2), "n must be 1"),
])
def test_bad_requests_change_nothing(random_weights, prompt, params, match) -> None:  # noqa: ANN001
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random"), random_weights)
    cluster.add_request("Hello", SamplingParams(max_tokens=3), request_id="ok")
    with pytest.raises(ValueError, match=match):
        cluster.add_request(prompt, params)
    with pytest.raises(ValueError, match="already in use"):
        cluster.add_request("Hello", request_id="ok")
    run_to_end(cluster)
    assert [q.request_id for q in cluster.step().requests] == ["ok"]


def test_a_pool_too_small_for_the_request_is_refused(random_weights) -> None:  # noqa: ANN001
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random", num_blocks=4), random_weights)
    with pytest.raises(ValueError, match="more KV blocks than the whole pool"):
        cluster.add_request(CHATS[2], SamplingParams(max_tokens=40))
    assert not cluster.has_work()


def test_speculation_and_overlap_are_refused(random_weights) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="spec_drafter"):
        DisaggregatedEngine(dataclasses.replace(CFG, weights="random", spec_drafter="ngram"), random_weights)


def _read_segment(name: str, nbytes: int, queue) -> None:  # noqa: ANN001 - runs in a child process
    shm = shared_memory.SharedMemory(name=name)
    queue.put(bytes(shm.buf[:nbytes]))
    shm.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_parcel_is_a_shared_memory_segment_another_process_can_read(dtype: torch.dtype) -> None:
    cfg = ModelConfig(num_layers=2, num_kv_heads=3, head_dim=8)
    sender = KVPool(cfg, 12, 4, dtype, torch.device("cpu"), head_major=False)
    receiver = KVPool(cfg, 12, 4, dtype, torch.device("cpu"), head_major=False)
    transport = SharedMemoryTransport()
    parcel = transport.send(sender, [7, 2, 9])
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_segment, args=(parcel.key, parcel.nbytes, queue))
    child.start()
    data = queue.get(timeout=60)
    child.join(timeout=60)
    assert data == sender.read_blocks([7, 2, 9]).contiguous().view(torch.uint8).numpy().tobytes()
    transport.receive_into(parcel, receiver, [0, 5, 1])
    assert torch.equal(receiver.read_blocks([0, 5, 1]), sender.read_blocks([7, 2, 9]))
    # The segment is kept mapped for the next parcel that fits (no fresh pages to fault in), and unlinked
    # when the transport closes.
    again = transport.send(sender, [3])
    assert again.key == parcel.key and transport.in_flight == 1
    transport.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=parcel.key)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9), st.integers(0, 2)), min_size=1, max_size=5),
       st.sampled_from([6, 12, 32]))
def test_any_arrivals_give_one_engines_tokens(tiny_weights, requests, num_blocks) -> None:  # noqa: ANN001
    """Property: whatever arrives when, with whatever pool, the split engine's greedy tokens are one
    engine's, every block comes back, and the transport ends empty."""
    cfg = EngineConfig(block_size=8, num_blocks=num_blocks, max_model_len=64, weights="random")
    texts = ["Hi", "Tell me a story.", "What is 2 + 2?"]
    single, cluster = LLMEngine(cfg, tiny_weights), DisaggregatedEngine(cfg, tiny_weights)
    rids = []
    for i, (arrival, max_tokens, which) in enumerate(requests):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        prompt = [{"role": "user", "content": texts[which]}]
        try:
            single.check_request(prompt, params)
        except ValueError:
            continue
        single.add_request(prompt, params, arrival_step=arrival, request_id=f"q{i}")
        rids.append(cluster.add_request(prompt, params, arrival_step=arrival, request_id=f"q{i}"))
    while single.has_work():
        single.step()
    run_to_end(cluster, limit=2000)
    for rid in rids:
        assert cluster.result(rid).token_ids == single.result(rid).token_ids
    assert_drained(cluster)


def test_a_prefill_still_running_at_the_tick_is_not_seen_yet(random_weights) -> None:  # noqa: ANN001
    """The prefill worker's step is computed when the tick reaches its start, but on its own clock it ends
    later: until the decode worker's clock passes that end, the request has no first token and no
    handoff (a slow prefill device, simulated by adding 0.5 s to each prefill step)."""
    cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random"), random_weights)
    prefill_step = cluster.prefill.step

    def slow_step():  # noqa: ANN202
        record = prefill_step()
        cluster.prefill.clock += 0.5
        return record

    cluster.prefill.step = slow_step
    cluster.add_request(CHATS[0], SamplingParams(max_tokens=40, ignore_eos=True), request_id="chat")
    cluster.add_request(CHATS[2], SamplingParams(max_tokens=4, ignore_eos=True), request_id="late", arrival_step=2)
    ticks = run_to_end(cluster)
    started = next(t for t in ticks if any(b.request_id == "late" for s in t.prefill_steps for b in s.record.batch))
    end = started.prefill_steps[-1].end
    assert started.clock < end
    seen_before = [t for t in ticks if t.clock < end and t.step >= started.step]
    assert len(seen_before) >= 2  # the chat kept decoding while "late" was prefilled
    for t in seen_before:
        late = next(q for q in t.requests if q.request_id == "late")
        assert late.stage == "prefill" and late.first_token_time < 0 and late.output_len == 0
        assert all(h.request_id != "late" for h in t.taken)
    taken = next(h for h in cluster.handoffs if h.request_id == "late")
    assert taken.sent_at == pytest.approx(end) and taken.taken_at >= end


def test_a_failed_fill_adopts_nothing(random_weights) -> None:  # noqa: ANN001
    engine = LLMEngine(dataclasses.replace(CFG, weights="random"), random_weights)

    def broken(blocks):  # noqa: ANN001, ANN202
        raise ValueError("KV blocks of shape (1,) do not fit this pool")

    with pytest.raises(ValueError, match="do not fit"):
        engine.adopt_prefilled("x", [1, 2, 3, 4], 3, SamplingParams(max_tokens=4), broken)
    assert engine.block_manager.num_free_blocks == CFG.num_blocks and not engine.has_work()
    cached = LLMEngine(dataclasses.replace(CFG, weights="random", enable_prefix_cache=True), random_weights)
    with pytest.raises(ValueError, match="prefix cache"):
        cached.adopt_prefilled("x", [1, 2, 3, 4], 3, SamplingParams(max_tokens=4), lambda blocks: None)


def test_a_full_dev_shm_falls_back_to_process_memory(tiny_weights, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A container's /dev/shm is often 64 MB: when no segment can be made, the KV waits in the process's own
    memory, the handoff says so, and the tokens are unchanged."""
    cfg = dataclasses.replace(CFG, weights="random")
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    single = LLMEngine(cfg, tiny_weights).generate(CHATS[:2], params)

    def full(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_memory, "SharedMemory", full)
    cluster = DisaggregatedEngine(cfg, tiny_weights)
    split = cluster.generate(CHATS[:2], params)
    assert [r.token_ids for r in split] == [r.token_ids for r in single]
    assert all(h.transport.startswith("process memory (shared memory unavailable: No space left")
               for h in cluster.handoffs) and len(cluster.handoffs) == 2
    assert_drained(cluster)


def test_a_light_trace_skips_the_text_and_keeps_the_times(tiny_weights) -> None:  # noqa: ANN001
    for detail in ("full", "light"):
        cluster = DisaggregatedEngine(dataclasses.replace(CFG, weights="random", trace_detail=detail), tiny_weights)
        rid = cluster.add_request(CHATS[0], SamplingParams(max_tokens=5, ignore_eos=True))
        final = run_to_end(cluster)[-1].requests[0]
        assert len(final.token_times) == 5
        assert final.text == (cluster.result(rid).text if detail == "full" else "")
