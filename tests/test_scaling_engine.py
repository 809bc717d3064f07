"""Test-time compute on the engine: per-token log-probs (opt-in, greedy unchanged, equal to the Hugging
Face model's), forced tokens really computed by the model, budget forcing's rules, best-of-N samples
sharing the prompt's blocks, no leaked blocks, and the scoring and accuracy arithmetic."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.sequence import ForcedTokens
from engine.test_time import (BudgetForcing, ScoredSample, TaskOutcome, TaskSetRun, TestTimeEngine, accuracy_curve,
                              extract_answer, load_tasks, majority_vote, select, vote_counts)
from engine.test_time.scoring import rule_correct, score_sample
from engine.weights import hf_reference_model

PROMPT = [{"role": "user", "content": "What is 2 + 6? Answer with a number."}]


def _tiny(weights, **kw) -> LLMEngine:  # noqa: ANN001
    return LLMEngine(EngineConfig(weights="random", num_blocks=64, block_size=8, profile_kernels=False, **kw), weights)


def _run(engine) -> list:  # noqa: ANN001
    records = []
    while engine.has_work():
        records.append(engine.step())
    return records


# ---- log-probs -----------------------------------------------------------------------------------

def test_logprobs_are_opt_in_and_leave_greedy_tokens_unchanged(tiny_weights) -> None:  # noqa: ANN001
    plain = _tiny(tiny_weights).generate("Once upon a time", SamplingParams(max_tokens=12, ignore_eos=True))[0]
    eng = _tiny(tiny_weights)
    withlp = eng.generate("Once upon a time", SamplingParams(max_tokens=12, ignore_eos=True, logprobs=True))[0]
    assert withlp.token_ids == plain.token_ids and plain.samples[0].logprobs == ()
    lps = withlp.samples[0].logprobs
    assert len(lps) == 12 and all(lp is not None and lp <= 0 for lp in lps)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs="yes")  # type: ignore[arg-type]


def test_mean_logprob_equals_the_hugging_face_model(real_weights, one_torch_thread) -> None:  # noqa: ANN001
    eng = TestTimeEngine(EngineConfig(num_blocks=64, profile_kernels=False), real_weights)
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=10, temperature=0.8, seed=1, n=2))
    _run(eng)
    prompt = list(eng.engine.result(rid).prompt_token_ids)
    hf = hf_reference_model(real_weights).eval()
    for sample, scored in zip(eng.engine.result(rid).samples, eng.scored(rid)):
        ids = prompt + list(sample.token_ids)
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        ref = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(sample.token_ids)]
        assert sample.logprobs == pytest.approx(ref, abs=2e-3)
        assert scored.mean_logprob == pytest.approx(sum(ref) / len(ref), abs=1e-3)


# ---- forced tokens -------------------------------------------------------------------------------

def test_forced_tokens_are_computed_next_step_and_match_a_plain_run(tiny_weights) -> None:  # noqa: ANN001
    eng = _tiny(tiny_weights)
    forced = tuple(eng.tokenizer.encode(" Wait,"))
    eng.force_tokens = lambda seq, tok: ForcedTokens(forced, False, "wait") if seq.output_len == 3 else None
    rid = eng.add_request("The capital of France is", SamplingParams(max_tokens=12, ignore_eos=True))
    records = _run(eng)
    out = eng.result(rid).token_ids
    assert out[4:4 + len(forced)] == forced
    # The step after the forcing computes the sampled token plus the forced ones, as one chunk.
    step = next(i for i, r in enumerate(records) if any(e.forced for e in r.emitted))
    [chunk] = records[step + 1].batch
    assert chunk.num_tokens == 1 + len(forced) and chunk.phase == "prefill"
    prompt_len = len(eng.result(rid).prompt_token_ids)
    assert chunk.context_len == prompt_len + 4 + len(forced)
    # Emitted tokens, in order, are exactly the output (forced ones marked).
    emitted = [e for r in records for e in r.emitted]
    assert tuple(e.token_id for e in emitted) == out
    assert [e.forced for e in emitted].count("wait") == len(forced)
    # Greedy: the same as a plain run whose prompt already holds the forced text.
    cut = 4 + len(forced)
    plain = _tiny(tiny_weights).generate(list(eng.result(rid).prompt_token_ids) + list(out[:cut]),
                                         SamplingParams(max_tokens=len(out) - cut, ignore_eos=True))[0]
    assert plain.token_ids == out[cut:]
    assert eng.block_manager.num_free_blocks == eng.config.num_blocks


def test_budget_cap_forces_the_cue_then_ends_the_answer(tiny_weights) -> None:  # noqa: ANN001
    budget = BudgetForcing(min_thinking=0, max_thinking=6, answer_tokens=3)
    eng = TestTimeEngine(EngineConfig(weights="random", num_blocks=64, block_size=8, profile_kernels=False),
                         tiny_weights, budget=budget)
    rid = eng.add_request("Think:", SamplingParams(max_tokens=4, ignore_eos=True))
    records = _run(eng)
    [sample] = records[-1].extra("test_time")["requests"][rid]["samples"]
    cue = eng.tokenizer.encode(budget.cue_text)
    ids = sample["token_ids"]
    assert ids[6:6 + len(cue)] == cue and sample["thinking_tokens"] == 6
    assert len(ids) == 6 + len(cue) + 3 + 1 and ids[-1] == eng.model_config.eos_token_ids[0]
    assert sample["finish_reason"] == "eos"
    labels = dict(sample["forced"])
    assert [labels[p] for p in range(6, 6 + len(cue))] == ["cue"] * len(cue) and labels[len(ids) - 1] == "end"
    assert all(sample["logprobs"][p] is None for p in labels) and sample["logprobs"][0] is not None
    assert eng.block_manager.num_free_blocks == eng.config.num_blocks


def test_early_end_of_turn_becomes_wait_then_the_cue(real_weights, one_torch_thread) -> None:  # noqa: ANN001
    budget = BudgetForcing(min_thinking=24, max_thinking=40, answer_tokens=6)
    eng = TestTimeEngine(EngineConfig(num_blocks=64, profile_kernels=False), real_weights, budget=budget)
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=8))
    records = _run(eng)
    [sample] = records[-1].extra("test_time")["requests"][rid]["samples"]
    wait = eng.tokenizer.encode(budget.wait_text)
    labels = dict(sample["forced"])
    waits = sorted(p for p, lab in labels.items() if lab == "wait")
    # Greedy, the model ends its short answer well before 24 tokens: the end of turn is replaced by " Wait,".
    assert sample["replaced_eos"] and waits[:len(wait)] == list(range(sample["replaced_eos"][0],
                                                                      sample["replaced_eos"][0] + len(wait)))
    assert 24 <= sample["thinking_tokens"] <= 40 + len(wait)
    assert "Wait," in sample["text"] and budget.cue_text in sample["text"]
    # Greedy with forcing == greedy on the prompt plus the same forced text (from the first forced token).
    out, prompt = sample["token_ids"], list(eng.engine.result(rid).prompt_token_ids)
    cut = waits[len(wait) - 1] + 1
    nxt = min([p for p in labels if p >= cut] + [len(out)])
    if nxt > cut:
        plain = LLMEngine(EngineConfig(num_blocks=64, profile_kernels=False), real_weights).generate(
            prompt + out[:cut], SamplingParams(max_tokens=nxt - cut, ignore_eos=True))[0]
        assert list(plain.token_ids) == out[cut:nxt]
    assert eng.block_manager.num_free_blocks == eng.config.num_blocks


def test_budget_answers_come_from_after_the_cue_only(tiny_weights) -> None:  # noqa: ANN001
    """Under a budget a sample's answer is read from the cue on, at every step: none while it thinks (a number in
    its thinking is not an answer), and what `extract_answer` finds after the cue once it is there."""
    budget = BudgetForcing(min_thinking=0, max_thinking=5, answer_tokens=2)
    eng = TestTimeEngine(EngineConfig(weights="random", num_blocks=64, block_size=8, profile_kernels=False),
                         tiny_weights, budget=budget)
    rid = eng.add_request("Count:", SamplingParams(max_tokens=2, temperature=1.0, seed=1, n=4))
    eos = set(eng.model_config.eos_token_ids)
    answered = 0
    for record in _run(eng):
        for s in record.extra("test_time")["requests"][rid]["samples"]:
            if s["thinking"]:
                assert s["answer"] is None
                continue
            tail = eng.tokenizer.decode([t for t in s["token_ids"][s["thinking_tokens"]:] if t not in eos])
            assert tail.startswith(budget.cue_text) and s["answer"] == extract_answer(tail)
            answered += 1
    assert answered  # every sample reached the cue


@pytest.mark.parametrize("text, after_cue, answer", [
    # A sample cut after "Final answer:" answered nothing, whatever number it thought of before.
    ("1\nFinal answer: ", "\nFinal answer: ", None),
    ("I have 3 and 4\nFinal answer: 3 + 4 equals", "\nFinal answer: 3 + 4 equals", None),
    ("2 and 5\nFinal answer: 7", "\nFinal answer: 7", "7")])
def test_a_budget_sample_is_scored_on_what_follows_the_cue(text: str, after_cue: str, answer: str | None) -> None:
    assert score_sample(0, text, [-1.0], 3, "7", after_cue).answer == answer
    assert score_sample(0, text, [-1.0], 3, "7").answer == extract_answer(text)  # no budget: the whole text


# ---- best-of-N -----------------------------------------------------------------------------------

def test_best_of_n_samples_share_the_prompt_blocks(tiny_weights) -> None:  # noqa: ANN001
    eng = TestTimeEngine(EngineConfig(weights="random", num_blocks=64, block_size=8, profile_kernels=False),
                         tiny_weights)
    rid = eng.add_request(list(range(100, 120)), SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=4,
                                                                 ignore_eos=True), answer="7")
    eng.step()  # prefill, then the fork: four samples, one first token each
    record = eng.step()
    samples = record.extra("test_time")["requests"][rid]["samples"]
    assert len(samples) == 4
    firsts = {s["blocks"][0] for s in samples}
    seconds = {s["blocks"][1] for s in samples}
    assert len(firsts) == 1 and len(seconds) == 1  # 20 prompt tokens: blocks 0 and 1 are the prompt's, shared
    assert record.pool.ref_counts[firsts.pop()] == 4
    assert all(s["shared_blocks"] >= 1 and s["own_blocks"] >= 1 for s in samples)  # the tail was copied on write
    _run(eng)
    assert eng.block_manager.num_free_blocks == eng.config.num_blocks
    assert len({tuple(s.text for s in eng.scored(rid))}) == 1


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lo=st.integers(0, 6), extra=st.integers(1, 8), answer=st.integers(1, 4), n=st.integers(1, 3),
       seed=st.integers(0, 99))
def test_budget_invariants(tiny_weights, lo: int, extra: int, answer: int, n: int, seed: int) -> None:  # noqa: ANN001
    budget = BudgetForcing(min_thinking=lo, max_thinking=lo + extra, answer_tokens=answer)
    eng = TestTimeEngine(EngineConfig(weights="random", num_blocks=64, block_size=4, profile_kernels=False),
                         tiny_weights, budget=budget)
    rid = eng.add_request("Go", SamplingParams(max_tokens=2, temperature=1.0, seed=seed, n=n))
    records = _run(eng)
    cue = eng.tokenizer.encode(budget.cue_text)
    wait = len(eng.tokenizer.encode(budget.wait_text))
    for s in records[-1].extra("test_time")["requests"][rid]["samples"]:
        ids, labels = s["token_ids"], dict(s["forced"])
        assert budget.min_thinking <= s["thinking_tokens"] <= budget.max_thinking + wait
        cue_at = s["thinking_tokens"]
        assert ids[cue_at:cue_at + len(cue)] == cue and s["finish_reason"] == "eos"
        assert len(ids) <= cue_at + len(cue) + answer + 1
        assert len(s["logprobs"]) == len(ids)
        assert all((s["logprobs"][p] is None) == (p in labels) for p in range(len(ids)))
        emitted = [e.token_id for r in records for e in r.emitted if e.request_id == s["label"]]
        assert emitted == ids
    assert eng.block_manager.num_free_blocks == eng.config.num_blocks


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [({"min_thinking": 9, "max_thinking": 4}, "must not exceed"),
                                       ({"max_thinking": 0}, ">= 1"), ({"answer_tokens": -1}, "answer_tokens"),
                                       ({"max_thinking": 10_000}, "max_thinking"), ({"wait_text": " "}, "empty")])
def test_bad_budgets_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BudgetForcing(**kw)


def test_engines_that_cannot_force_are_refused(tiny_weights) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="speculative"):
        TestTimeEngine(EngineConfig(weights="random", spec_drafter="ngram"), tiny_weights)
    eng = _tiny(tiny_weights, spec_drafter="ngram")
    with pytest.raises(ValueError, match="logprobs"):
        eng.add_request("Hi", SamplingParams(logprobs=True))


# ---- answers, votes and accuracy -----------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [("The answer is 12.", "12"), ("2 + 6 = 8", "8"), ("A dog has four legs", "4"),
                                          ("3 or 8? Final answer: 8, not 3", "8"), ("no idea", None),
                                          ("1,000 apples", "1000"), ("The answer is: Seven", "7"),
                                          # An expression is worth its result, and nothing when cut off before
                                          # one (a sample stopped at "Final answer: 3 + 4 =" had answered 3).
                                          ("Final answer: 3 + 4 = 7", "7"), ("Final answer: 3 + 4 =", None),
                                          ("I'm still 3 +", None), ("3 + 4 equals", None),
                                          ("It is 12 - 5 = 7", "7"), ("The answer is 7 - because", "7")])
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_majority_vote_and_selection() -> None:
    assert majority_vote(["3", None, "4", "4", "3"]) == 0  # a tie goes to the answer seen first
    assert majority_vote([None, None]) is None
    s = [ScoredSample(0, "", "3", -2.0, 5, False), ScoredSample(1, "", "4", -0.5, 5, True),
         ScoredSample(2, "", "3", -1.0, 5, False), ScoredSample(3, "", None, -0.1, 5, False)]
    sel = select(s)
    assert (sel.majority, sel.self_certainty, sel.oracle) == (0, 1, 1)  # no-answer samples are never picked
    assert not rule_correct(s, "majority vote") and rule_correct(s, "self-certainty")


@given(st.lists(st.one_of(st.none(), st.sampled_from("1234")), max_size=12))
def test_the_vote_picks_the_answer_the_counts_put_first(answers: list[str | None]) -> None:
    # The page's vote chart draws vote_counts; the pick must be its first bar, ties included.
    counts, pick = vote_counts(answers), majority_vote(answers)
    assert sum(counts.values()) == sum(a is not None for a in answers)
    assert list(counts.values()) == sorted(counts.values(), reverse=True)
    if pick is None:
        assert not counts
    else:
        assert answers[pick] == next(iter(counts)) and counts[answers[pick]] == max(counts.values())
        assert all(answers.index(a) >= pick for a, c in counts.items() if c == counts[answers[pick]])


def test_accuracy_curve_uses_disjoint_groups() -> None:
    right, wrong = ScoredSample(0, "", "1", -1.0, 3, True), ScoredSample(0, "", "2", -0.5, 5, False)
    samples = tuple(ScoredSample(i, "", x.answer, x.mean_logprob, x.num_tokens, x.correct)
                    for i, x in enumerate([right, wrong, wrong, right]))
    run = TaskSetRun((TaskOutcome("q", "1", samples),), 4, 0.0, 0, 0, None)
    pts = {(p.rule, p.k): p for p in accuracy_curve(run, (1, 2, 4))}
    assert pts["oracle (pass@N)", 1].accuracy == 0.5 and pts["oracle (pass@N)", 2].accuracy == 1.0
    assert pts["self-certainty", 2].accuracy == 0.0 and pts["majority vote", 4].accuracy == 1.0
    assert pts["majority vote", 2].tokens_per_question == 8.0 and pts["majority vote", 4].groups == 1
    assert math.isclose(pts["majority vote", 1].accuracy, 0.5)
    with pytest.raises(ValueError):
        accuracy_curve(run, (8,))


def test_task_set_is_well_formed() -> None:
    tasks = load_tasks()
    assert len(tasks) >= 8 and all(extract_answer(t.answer) == t.answer for t in tasks)
