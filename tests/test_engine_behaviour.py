"""Engine behaviour that needs no reference model: sampling reproducibility, stop rules, n > 1
copy-on-write, the trace's JSON round trip and the paged-vs-contiguous waste figures."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import load_trace, save_trace


def _engine(weights, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(weights="random", num_blocks=64, **kw), weights)


def test_seeded_sampling_is_reproducible_whatever_the_batch(random_weights) -> None:
    p = SamplingParams(max_tokens=8, temperature=0.9, top_k=50, top_p=0.9, seed=42, ignore_eos=True)
    alone = _engine(random_weights).generate("Once upon a time", p)[0].token_ids
    eng = _engine(random_weights)
    eng.add_request("A completely different prompt that shares the batch", SamplingParams(max_tokens=6))
    crowded = eng.generate("Once upon a time", p)[0].token_ids
    assert alone == crowded
    other_seed = _engine(random_weights).generate("Once upon a time", SamplingParams(
        max_tokens=8, temperature=0.9, seed=7, ignore_eos=True))[0].token_ids
    assert other_seed != alone


def test_max_tokens_and_stop_strings(random_weights) -> None:
    eng = _engine(random_weights)
    r = eng.generate("Count:", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert len(r.token_ids) == 5 and r.samples[0].finish_reason == "length"
    first_piece = eng.tokenizer.decode([r.token_ids[1]])
    stop = eng.generate("Count:", SamplingParams(max_tokens=5, ignore_eos=True, stop=(first_piece,)))[0]
    assert stop.samples[0].finish_reason == "stop" and len(stop.token_ids) <= 2
    assert first_piece not in stop.text


def test_n_samples_share_prompt_blocks_then_copy_on_write(random_weights) -> None:
    eng = _engine(random_weights)
    # 20-token prompt: one full block and a partly filled tail block that both samples share.
    rid = eng.add_request(list(range(100, 120)), SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=2,
                                                                ignore_eos=True))
    first = eng.step()
    tables = {t.seq_id: t.block_ids for t in first.block_tables}
    assert len(tables) == 2
    a, b = tables.values()
    assert a == b, "after the fork both samples point at the same physical blocks"
    assert all(first.pool.ref_counts[x] == 2 for x in a)
    second = eng.step()
    t2 = [t.block_ids for t in second.block_tables]
    assert t2[0][0] == t2[1][0], "the full prompt block stays shared"
    assert t2[0][1] != t2[1][1], "the partly filled tail was copied on write"
    while eng.has_work():
        eng.step()
    result = eng.result(rid)
    assert len(result.samples) == 2 and all(len(s.token_ids) == 6 for s in result.samples)
    assert result.samples[0].token_ids != result.samples[1].token_ids
    eng.block_manager.check_invariants()
    assert eng.block_manager.num_free_blocks == 64


def test_trace_round_trips_through_json(random_weights, tmp_path) -> None:
    eng = _engine(random_weights)
    eng.add_request("Hello", SamplingParams(max_tokens=3, ignore_eos=True))
    eng.add_request([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=2), arrival_step=1)
    records = []
    while eng.has_work():
        records.append(eng.step())
    save_trace(records, tmp_path / "trace.json")
    assert load_trace(tmp_path / "trace.json") == records
    assert records[0].kernels and all(k.seconds >= 0 for k in records[0].kernels)
    assert records[-1].requests[-1].status == "finished"


def test_paged_waste_is_measured_against_contiguous_reservation(random_weights) -> None:
    eng = _engine(random_weights, max_model_len=1024)
    for n in (10, 30, 50):
        eng.add_request(list(range(200, 200 + n)), SamplingParams(max_tokens=4, ignore_eos=True))
    rec = eng.step()
    pool = rec.pool
    assert pool.filled_tokens == 90 and pool.allocated_tokens == (1 + 2 + 4) * 16
    assert pool.internal_waste_tokens == 112 - 90
    assert pool.contiguous_reserved_tokens == 3 * 1024
    assert pool.paged_waste_fraction < 0.25 < 0.9 < pool.contiguous_waste_fraction


def test_decode_steps_plan_attention_for_the_graph_bucket(random_weights) -> None:
    """Eager decode-only steps give the paged kernel max_model_len as max_seq_len, as the decode CUDA
    graphs do (the Triton kernel splits each context by the plan's split count, so this keeps graphs
    on and off summing alike); steps with prompt rows keep the batch's own longest context."""
    eng = _engine(random_weights, max_model_len=512, max_num_batched_tokens=16)
    seen: list[tuple[int, int, int]] = []
    paged = eng.kernels.paged_attention

    def spy(q, k_cache, v_cache, block_tables, seq_lens, qsl, max_query_len, max_seq_len, *args, **kw):
        seen.append((max_query_len, max_seq_len, int(seq_lens.max())))
        return paged(q, k_cache, v_cache, block_tables, seq_lens, qsl, max_query_len, max_seq_len, *args, **kw)

    eng.kernels.paged_attention = spy
    eng.add_request(list(range(100, 140)), SamplingParams(max_tokens=4, ignore_eos=True))  # 40 tokens: 3 chunks
    while eng.has_work():
        eng.step()
    decode = [s for s in seen if s[0] == 1]
    chunks = [s for s in seen if s[0] > 1]
    assert decode and all(m == 512 for _, m, _ in decode)
    assert chunks and all(m == longest for _, m, longest in chunks)
