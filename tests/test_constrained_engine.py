"""Constrained decoding on the real engine (engine/constrained): what it produces and how it gets there.

- Every preset, greedy on SmolLM2, ends its turn with text its grammar accepts, and every event is
  honest: replaying the grammar independently, each sampled token was allowed, each event's allowed
  count is the mask's, free/steered/only say whether the model's own first choice survived, greedy
  picked the best allowed token, and jump-forward forced exactly what the grammar forces.
- Jump-forward changes nothing but the work: the same text and token ids as without it, one engine step
  fewer per forced token, forced tokens computed the next step as one chunk, and their KV really in
  the cache (the token after a forced run has the same distribution as without jump-forward and as a
  plain LLMEngine fed the same prefix as its prompt).
- The logits hook does not perturb sampling: an identity hook and a permissive grammar give a plain
  LLMEngine's tokens; an unconstrained request beside a constrained one gets a plain engine's tokens.
- Sampled constrained runs are valid and reproducible; random choice lists (hypothesis) always end in
  one of the choices; the compact JSON layout has no whitespace outside strings.
- Bad constraints and unsupported engines are refused with one readable sentence (ValueError).
"""
from __future__ import annotations

import dataclasses
import json
import math
import string
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.constrained import Constraint, ConstrainedEngine, SequenceGuide, TokenEvent, accepts
from engine.constrained.constraint import MAX_SPEC_CHARS
from engine.constrained.presets import DATE, PERSON, PRESETS, SENTIMENT, TOOL_CALL, Preset
from engine.engine import LLMEngine, Prompt
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer
from engine.trace import StepRecord
from engine.weights import LoadedWeights

SAMPLED_KINDS = ("free", "steered", "only")
PERMISSIVE = Constraint("regex", r"[\s\S]*", "anything")
TINY_PROMPTS = ("Once upon a time", "The capital of France is", "def main():")


# ---- helpers ---------------------------------------------------------------------------------------

@dataclass
class Run:
    """One request run to the end on a ConstrainedEngine, with every step's record."""

    engine: ConstrainedEngine
    request_id: str
    records: list[StepRecord]

    def seqs(self) -> list[Sequence]:
        return self.engine.sequences(self.request_id)

    def sample(self, index: int = 0) -> dict[str, Any]:
        """The sample as the last step's "constrained" snapshot shows it."""
        return self.records[-1].extra("constrained")["requests"][self.request_id]["samples"][index]

    def events(self, index: int = 0) -> list[TokenEvent]:
        return self.engine.events[self.seqs()[index].seq_id]

    def output(self, index: int = 0) -> list[int]:
        return self.seqs()[index].output_ids


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _real_config() -> EngineConfig:
    return EngineConfig(num_blocks=64, profile_kernels=False)


def _tiny_config() -> EngineConfig:
    return EngineConfig(weights="random", num_blocks=64, block_size=8, profile_kernels=False)


def _drain(engine: ConstrainedEngine | LLMEngine) -> list[StepRecord]:
    records = []
    while engine.has_work():
        records.append(engine.step())
    return records


def _run(weights: LoadedWeights, config: EngineConfig, constraint: Constraint | None, prompt: Prompt,
         params: SamplingParams, jump_forward: bool = True) -> Run:
    engine = ConstrainedEngine(config, weights, constraint=constraint, jump_forward=jump_forward)
    rid = engine.add_request(prompt, params)
    return Run(engine, rid, _drain(engine))


def _run_preset(weights: LoadedWeights, preset: Preset, jump_forward: bool = True,
                constraint: Constraint | None = None, **sampling: Any) -> Run:
    params = SamplingParams(max_tokens=preset.max_tokens, **sampling)
    return _run(weights, _real_config(), constraint or preset.constraint, _chat(preset.prompt), params, jump_forward)


def _plain_ids(weights: LoadedWeights, config: EngineConfig, prompts: list[Prompt],
               params: SamplingParams) -> list[list[tuple[int, ...]]]:
    """Every sample's token ids from a plain LLMEngine (no hooks), all prompts in one batch."""
    results = LLMEngine(config, weights).generate(prompts, params)
    return [[s.token_ids for s in r.samples] for r in results]


def _trailing_forced(events: list[TokenEvent]) -> int:
    n = 0
    for e in reversed(events):
        if e.kind != "forced":
            break
        n += 1
    return n


def _replay(constraint: Constraint, events: list[TokenEvent], tokenizer: Tokenizer, jump_forward: bool,
            greedy: bool, max_tokens: int = 1 << 20) -> SequenceGuide:
    """Walk a fresh matcher through the events: each sampled token must be allowed by the mask at its
    position (and the event must describe that mask), each forced run must be what the grammar forces
    within the request's max_tokens. Returns the matcher after the last event."""
    guide = SequenceGuide(constraint, tokenizer)
    eos = set(tokenizer.eos_token_ids)
    k = 0
    while k < len(events):
        e = events[k]
        assert e.kind in SAMPLED_KINDS, f"event {k}: a {e.kind!r} token where the engine samples"
        mask = guide.mask()
        assert bool(mask.allowed[e.token]), f"event {k}: token {e.token} was sampled but the grammar forbids it"
        assert e.allowed == mask.count >= 1
        assert len(e.top) == 5 and all(a == bool(mask.allowed[t]) for t, _, a in e.top)
        top_token, top_prob, top_allowed = e.top[0]
        assert e.chosen_prob is not None and e.masked_mass is not None
        # The masked mass is what the model put outside the mask: at most everything but the chosen token.
        assert 0.0 <= e.masked_mass <= 1.0 - e.chosen_prob + 1e-4
        if e.kind == "only":
            assert e.allowed == 1 and e.masked_mass == pytest.approx(1.0 - e.chosen_prob, abs=1e-4)
        elif e.kind == "free":
            assert top_allowed and e.allowed > 1
        else:  # steered: the model's first choice was forbidden
            assert not top_allowed and e.allowed > 1 and e.token != top_token
            assert e.masked_mass >= top_prob - 1e-6
        if greedy:  # the best allowed token: none of the allowed candidates was more likely
            assert all(p <= e.chosen_prob + 1e-6 for _, p, a in e.top if a), f"event {k}: not the allowed argmax"
            if e.kind == "free":
                assert e.token == top_token and e.chosen_prob == pytest.approx(top_prob)
        assert guide.advance(e.token)
        k += 1
        if jump_forward and e.token not in eos:
            forced = guide.forced(max_tokens - k)  # k tokens written so far, the sampled one included
            got = events[k:k + len(forced)]
            assert [x.token for x in got] == forced and all(x.kind == "forced" for x in got), \
                f"events {k}..: the grammar forces {forced}, the run wrote {[(x.token, x.kind) for x in got]}"
            assert all(x.allowed is None and x.chosen_prob is None for x in got)
            k += len(forced)
    return guide


def _first_forbidden(constraint: Constraint, ids: tuple[int, ...], tokenizer: Tokenizer) -> int:
    """The index of the first token the grammar forbids after the ones before it (len(ids): none)."""
    guide = SequenceGuide(constraint, tokenizer)
    for i, t in enumerate(ids):
        if not guide.mask().allowed[t]:
            return i
        assert guide.advance(t)
    return len(ids)


def _whitespace_outside_strings(text: str) -> list[int]:
    """Positions of whitespace characters that are not inside a JSON string."""
    found, in_string, escaped = [], False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch.isspace():
            found.append(i)
    return found


def _preset_id(preset: Preset) -> str:
    return preset.constraint.name.replace(" ", "-")


@pytest.fixture(scope="module")
def preset_runs(real_weights: LoadedWeights, one_torch_thread: None) -> dict[tuple[str, bool], Run]:
    """Every preset, greedy, with jump-forward on and off (~12 s on the CPU)."""
    return {(p.name, jf): _run_preset(real_weights, p, jump_forward=jf) for p in PRESETS for jf in (True, False)}


# ---- 1. every preset, greedy, on the real model ----------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS, ids=_preset_id)
@pytest.mark.parametrize("jump_forward", [True, False], ids=["jf", "no-jf"])
def test_preset_ends_its_turn_with_text_the_grammar_accepts(preset_runs, preset: Preset,  # noqa: ANN001
                                                           jump_forward: bool) -> None:
    run = preset_runs[(preset.name, jump_forward)]
    tok = run.engine.tokenizer
    [seq] = run.seqs()
    sample = run.sample()
    assert seq.finish_reason == "eos" and sample["finish_reason"] == "eos"
    assert seq.output_ids[-1] in tok.eos_token_ids
    text = run.engine.engine.result(run.request_id).text
    assert text and sample["text"] == text
    assert accepts(preset.constraint, text, tok)
    assert sample["valid"] is True and sample["accepting"] is True and sample["error"] == ""
    snap = run.records[-1].extra("constrained")["requests"][run.request_id]
    assert snap["constraint"] == dataclasses.asdict(preset.constraint) and snap["jump_forward"] is jump_forward
    assert snap["compile_seconds"] is not None and snap["compile_seconds"] > 0
    # The snapshot is JSON-able, and its events are the engine's, one per output token.
    json.dumps(run.records[-1].extra("constrained"))
    assert [e["token"] for e in sample["events"]] == seq.output_ids == [e.token for e in run.events()]
    assert run.engine.block_manager.num_free_blocks == run.engine.config.num_blocks


@pytest.mark.parametrize("preset", PRESETS, ids=_preset_id)
@pytest.mark.parametrize("jump_forward", [True, False], ids=["jf", "no-jf"])
def test_every_token_was_allowed_and_its_event_says_why(preset_runs, preset: Preset,  # noqa: ANN001
                                                        jump_forward: bool) -> None:
    run = preset_runs[(preset.name, jump_forward)]
    events = run.events()
    guide = _replay(preset.constraint, events, run.engine.tokenizer, jump_forward, greedy=True)
    assert guide.matcher.is_stopped() and not guide.matcher.is_error()  # the end of turn ended the grammar
    kinds = {e.kind for e in events}
    assert kinds <= {"free", "steered", "only", "forced"}
    assert ("forced" in kinds) is jump_forward  # every preset's grammar forces at least its end of turn
    # The step's emitted tokens carry the same marks: forced ones labelled "grammar", sampled ones not.
    emitted = [e for r in run.records for e in r.emitted]
    assert [e.token_id for e in emitted] == run.output()
    assert [e.forced for e in emitted] == ["grammar" if e.kind == "forced" else "" for e in events]


def test_the_validator_is_not_vacuous(real_weights: LoadedWeights) -> None:
    tok = real_weights.tokenizer
    assert not accepts(PERSON.constraint, '{"name": "Maria"}', tok)  # missing keys
    assert not accepts(PERSON.constraint, '{"name": "Maria", "age": 34, "city": "Lisbon"} Hope this helps!', tok)
    assert accepts(PERSON.constraint, '{"name":"Maria","age":34,"city":"Lisbon"}', tok)
    assert accepts(PERSON.constraint, '{ "name" : "Maria",\n "age": 34, "city": "Lisbon" }', tok)
    assert not accepts(SENTIMENT.constraint, "positive!", tok) and accepts(SENTIMENT.constraint, "neutral", tok)
    assert not accepts(DATE.constraint, "July 20, 1969", tok) and accepts(DATE.constraint, "1969-07-20", tok)


# ---- 2. jump-forward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS, ids=_preset_id)
def test_jump_forward_gives_the_same_output_in_fewer_steps(preset_runs, preset: Preset) -> None:  # noqa: ANN001
    on, off = preset_runs[(preset.name, True)], preset_runs[(preset.name, False)]
    assert on.sample()["text"] == off.sample()["text"]
    assert on.output() == off.output()
    forced = sum(e.kind == "forced" for e in on.events())
    assert forced >= 1
    # Without jump-forward every output token costs a step; with it, forced tokens cost none.
    assert len(off.records) - len(on.records) == forced
    assert off.engine.counters["forward_passes"] - on.engine.counters["forward_passes"] == forced
    # Where jump-forward forced a token, the grammar allowed exactly that one token without it.
    for e_on, e_off in zip(on.events(), off.events()):
        if e_on.kind == "forced":
            assert e_off.kind == "only" and e_off.allowed == 1


@pytest.mark.parametrize("preset", PRESETS, ids=_preset_id)
def test_forced_tokens_are_computed_next_step_as_one_chunk(preset_runs, preset: Preset) -> None:  # noqa: ANN001
    run = preset_runs[(preset.name, True)]
    [seq] = run.seqs()
    events = run.events()
    mid_runs = 0
    for s, record in enumerate(run.records):
        forced = [e for e in record.emitted if e.forced]
        if not forced or seq.label in record.finished:
            continue
        mid_runs += 1
        [chunk] = run.records[s + 1].batch
        assert chunk.num_tokens == 1 + len(forced) and chunk.phase == "prefill"
        position = sum(len(r.emitted) for r in run.records[:s + 1])  # output tokens known after step s
        assert chunk.context_len == seq.prompt_len + position
    assert mid_runs == sum(1 for i, e in enumerate(events) if e.kind == "forced"
                           and i + 1 < len(events) and events[i + 1].kind != "forced")
    # Finished: everything before the last sampled token is computed; a trailing forced run never is.
    assert seq.num_computed_tokens == seq.num_tokens - 1 - _trailing_forced(events)


def test_forced_tokens_enter_the_kv_cache(preset_runs, real_weights: LoadedWeights) -> None:  # noqa: ANN001
    """The token sampled after a forced run sees the forced tokens' KV: its unconstrained distribution
    equals the one without jump-forward (forced tokens decoded one per step there) and the one a plain
    LLMEngine computes with prompt + output so far as its prompt (a fresh prefill)."""
    prefixes: list[list[int]] = []
    expected: list[TokenEvent] = []
    for preset in PRESETS:
        on, off = preset_runs[(preset.name, True)], preset_runs[(preset.name, False)]
        assert on.output() == off.output()
        for e_on, e_off in zip(on.events(), off.events()):
            if e_on.kind != "forced":
                assert [t for t, _, _ in e_on.top] == [t for t, _, _ in e_off.top]
                assert [p for _, p, _ in e_on.top] == pytest.approx([p for _, p, _ in e_off.top], abs=1e-4)
                assert e_on.chosen_prob == pytest.approx(e_off.chosen_prob, abs=1e-4)
        [seq] = on.seqs()
        events = on.events()
        for k in range(1, len(events)):
            if events[k].kind != "forced" and events[k - 1].kind == "forced":
                prefixes.append(seq.token_ids[:seq.prompt_len + k])
                expected.append(events[k])
    assert len(prefixes) >= 3  # the JSON and date presets force text in the middle of their output
    plain = LLMEngine(_real_config(), real_weights).generate(prefixes, SamplingParams(max_tokens=1, logprobs=True))
    for result, event in zip(plain, expected):
        [token] = result.token_ids
        [logprob] = result.samples[0].logprobs
        top_token, top_prob, _ = event.top[0]
        assert token == top_token
        assert math.exp(logprob) == pytest.approx(top_prob, abs=1e-4)


# ---- 3. the hook does not perturb sampling -------------------------------------------------------------

def test_an_identity_logits_hook_changes_no_token(tiny_weights: LoadedWeights) -> None:
    cases = [SamplingParams(max_tokens=16, ignore_eos=True),
             SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=3, n=3),
             SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, top_k=20, top_p=0.9, seed=4)]
    for params in cases:
        plain = _plain_ids(tiny_weights, _tiny_config(), list(TINY_PROMPTS), params)
        hooked = LLMEngine(_tiny_config(), tiny_weights)
        rows: list[int] = []
        hooked.process_logits = lambda seq, row: rows.append(seq.seq_id) or row  # noqa: B023
        got = [[s.token_ids for s in r.samples] for r in hooked.generate(list(TINY_PROMPTS), params)]
        assert got == plain
        assert len(rows) == len(TINY_PROMPTS) * params.n * params.max_tokens  # called for every sampled token


def test_a_permissive_grammar_gives_the_plain_engines_greedy_tokens(tiny_weights: LoadedWeights) -> None:
    """`[\\s\\S]*` forbids only special tokens and byte tokens that make invalid UTF-8 (a random model
    writes those: a lead byte then a word); up to such a token the output is the plain engine's, and
    there the grammar steers away from the plain engine's (the model's first) choice."""
    assert PERMISSIVE.problem() is None
    params = SamplingParams(max_tokens=24)  # (ignore_eos is refused with a grammar: the grammar says where to end)
    plain = [ids for [ids] in _plain_ids(tiny_weights, _tiny_config(), list(TINY_PROMPTS), params)]
    engine = ConstrainedEngine(_tiny_config(), tiny_weights, constraint=PERMISSIVE)
    rids = [engine.add_request(p, params) for p in TINY_PROMPTS]
    _drain(engine)
    cuts = [_first_forbidden(PERMISSIVE, ids, tiny_weights.tokenizer) for ids in plain]
    assert sum(cut == len(ids) for cut, ids in zip(cuts, plain)) >= 2  # most outputs are untouched
    for rid, ids, cut in zip(rids, plain, cuts):
        got = engine.engine.result(rid).token_ids
        events = engine.events[engine.sequences(rid)[0].seq_id]
        assert got[:cut] == ids[:cut] and all(e.kind == "free" for e in events[:cut])
        if cut < len(ids):
            assert got[cut] != ids[cut] and events[cut].kind == "steered" and events[cut].top[0][0] == ids[cut]
        _replay(PERMISSIVE, events, tiny_weights.tokenizer, True, greedy=True)


def test_ignore_eos_is_refused_with_a_grammar_but_not_without(tiny_weights: LoadedWeights) -> None:
    engine = ConstrainedEngine(_tiny_config(), tiny_weights, constraint=PERMISSIVE)
    with pytest.raises(ValueError, match="ignore_eos"):
        engine.add_request("Hi", SamplingParams(max_tokens=4, ignore_eos=True))
    assert engine.constraints == {}
    rid = engine.add_request("Hi", SamplingParams(max_tokens=4, ignore_eos=True), constraint=None)
    _drain(engine)
    assert len(engine.engine.result(rid).token_ids) == 4


def test_a_permissive_grammar_gives_the_real_models_greedy_answer(real_weights: LoadedWeights,  # noqa: ANN001
                                                                  one_torch_thread) -> None:
    prompt = _chat("Name a fruit that is yellow.")
    params = SamplingParams(max_tokens=16)
    [[plain]] = _plain_ids(real_weights, _real_config(), [prompt], params)
    run = _run(real_weights, _real_config(), PERMISSIVE, prompt, params)
    assert tuple(run.output()) == plain
    assert run.sample()["finish_reason"] == run.seqs()[0].finish_reason


def test_sampled_json_runs_are_valid_and_reproducible(real_weights: LoadedWeights, one_torch_thread) -> None:  # noqa: ANN001
    """n = 3 at temperature 0.8: twice with jump-forward (same seed, same tokens), once without."""
    runs = [(_run_preset(real_weights, PERSON, jf, temperature=0.8, seed=11, n=3), jf) for jf in (True, True, False)]
    for run, jf in runs:
        for i in range(3):
            sample = run.sample(i)
            assert sample["finish_reason"] == "eos" and sample["valid"] is True
            assert accepts(PERSON.constraint, sample["text"], real_weights.tokenizer)
            _replay(PERSON.constraint, run.events(i), real_weights.tokenizer, jf, greedy=False)
    assert [runs[0][0].output(i) for i in range(3)] == [runs[1][0].output(i) for i in range(3)]


def test_sampled_samples_fork_after_the_parents_forced_tokens(real_weights: LoadedWeights,  # noqa: ANN001
                                                             one_torch_thread) -> None:
    """Compact JSON forces text right after the first token, before n > 1 forks its children: each child
    starts from the prompt with its own matcher and ends valid."""
    compact = dataclasses.replace(TOOL_CALL.constraint, json_layout="compact")
    run = _run_preset(real_weights, TOOL_CALL, constraint=compact, temperature=0.8, seed=5, n=3)
    assert run.events(0)[1].kind == "forced"  # the parent's first token was followed by forced text
    assert len({seq.seq_id for seq in run.seqs()} & set(run.engine.guides)) == 3
    for i, seq in enumerate(run.seqs()):
        sample = run.sample(i)
        assert sample["finish_reason"] == "eos" and sample["valid"] is True
        assert _whitespace_outside_strings(sample["text"]) == []
        _replay(compact, run.events(i), real_weights.tokenizer, True, greedy=False)
        assert seq.token_ids[:seq.prompt_len] == run.seqs()[0].token_ids[:seq.prompt_len]
    assert run.engine.block_manager.num_free_blocks == run.engine.config.num_blocks


def test_sampled_choice_runs_are_valid_and_reproducible_without_jump_forward(  # noqa: ANN201
        real_weights: LoadedWeights, one_torch_thread) -> None:  # noqa: ANN001
    runs = [_run_preset(real_weights, SENTIMENT, False, temperature=0.8, seed=11, n=3) for _ in range(2)]
    choices = SENTIMENT.constraint.choices()
    for i in range(3):
        sample = runs[0].sample(i)
        assert sample["finish_reason"] == "eos" and sample["valid"] is True and sample["text"] in choices
    assert [runs[0].output(i) for i in range(3)] == [runs[1].output(i) for i in range(3)]


def test_a_first_sample_that_ends_on_its_first_token_still_forks(tiny_weights: LoadedWeights) -> None:
    """n > 1 forks the other samples off the first one's prompt blocks; a first token that ends the first sample
    (max_tokens = 1 here) used to free those blocks before the fork (KeyError in block_manager.fork)."""
    [result] = LLMEngine(_tiny_config(), tiny_weights).generate(
        "Hello", SamplingParams(max_tokens=1, n=3, temperature=0.8, seed=1))
    assert [len(s.token_ids) for s in result.samples] == [1, 1, 1]
    assert all(s.finish_reason == "length" for s in result.samples)


def test_sampled_choice_runs_with_jump_forward(real_weights: LoadedWeights, one_torch_thread) -> None:  # noqa: ANN001
    run = _run_preset(real_weights, SENTIMENT, True, temperature=0.8, seed=11, n=3)
    for i in range(3):
        sample = run.sample(i)
        assert sample["finish_reason"] == "eos" and sample["valid"] is True


# ---- 4. unconstrained requests beside constrained ones ------------------------------------------------

def test_an_unconstrained_request_is_untouched_by_its_constrained_neighbours(tiny_weights: LoadedWeights) -> None:
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    sampled = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=5, n=2)
    [[plain_greedy]] = _plain_ids(tiny_weights, _tiny_config(), [TINY_PROMPTS[0]], greedy)
    [plain_sampled] = _plain_ids(tiny_weights, _tiny_config(), [TINY_PROMPTS[1]], sampled)
    engine = ConstrainedEngine(_tiny_config(), tiny_weights, constraint=Constraint("choice", "yes\nno\nmaybe"))
    constrained = engine.add_request(TINY_PROMPTS[2], SamplingParams(max_tokens=8))  # the engine's grammar
    json_req = engine.add_request(TINY_PROMPTS[2], SamplingParams(max_tokens=40, temperature=0.8, seed=2),
                                  constraint=PERSON.constraint)
    free_greedy = engine.add_request(TINY_PROMPTS[0], greedy, constraint=None)
    free_sampled = engine.add_request(TINY_PROMPTS[1], sampled, constraint=None)
    records = _drain(engine)
    assert engine.engine.result(free_greedy).token_ids == plain_greedy
    assert [s.token_ids for s in engine.engine.result(free_sampled).samples] == plain_sampled
    snap = records[-1].extra("constrained")["requests"]
    for rid in (free_greedy, free_sampled):
        assert snap[rid]["constraint"] is None
        for seq, sample in zip(engine.sequences(rid), snap[rid]["samples"]):
            events = engine.events[seq.seq_id]
            assert [e.token for e in events] == seq.output_ids
            assert all(e.kind == "unconstrained" and e.allowed is None and e.masked_mass is None for e in events)
            assert sample["valid"] is None and sample["accepting"] is None and seq.seq_id not in engine.guides
    # The constrained neighbours were constrained all the same.
    assert snap[constrained]["constraint"]["spec"] == "yes\nno\nmaybe"
    [sample] = snap[constrained]["samples"]
    assert sample["finish_reason"] == "eos" and sample["text"] in ("yes", "no", "maybe")
    [sample] = snap[json_req]["samples"]
    if sample["finish_reason"] == "eos":
        assert sample["valid"] is True
    _replay(PERSON.constraint, engine.events[engine.sequences(json_req)[0].seq_id], engine.tokenizer, True,
            greedy=False)


# ---- 5. bad input --------------------------------------------------------------------------------------

BAD = [
    pytest.param(Constraint("regex", "([a-z"), id="regex-unclosed"),
    pytest.param(Constraint("json_schema", "{"), id="schema-not-json"),
    pytest.param(Constraint("json_schema", '{"type": "nope"}'), id="schema-bad-type"),
    pytest.param(Constraint("json_schema", "[1, 2]"), id="schema-not-object"),
    pytest.param(Constraint("choice", "\n"), id="choice-none"),
    pytest.param(Constraint("regex", ""), id="regex-empty"),
    pytest.param(Constraint("json_schema", "  \n "), id="schema-blank"),
    pytest.param(Constraint("regex", "a" * (MAX_SPEC_CHARS + 1)), id="too-long"),
    pytest.param(Constraint("grammar", "start: /a/"), id="unknown-kind"),  # type: ignore[arg-type]
    pytest.param(Constraint("json_schema", "{}", json_layout="pretty"), id="unknown-layout"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_constraint_is_refused_with_one_readable_sentence(tiny_weights: LoadedWeights,
                                                               bad: Constraint) -> None:
    problem = bad.problem()
    assert isinstance(problem, str) and problem.strip() == problem and 10 < len(problem) < 300
    assert "\n" not in problem and "Traceback" not in problem and 'File "' not in problem
    with pytest.raises(ValueError) as raised:
        bad.check()
    assert str(raised.value) == problem[0].upper() + problem[1:] + "."
    with pytest.raises(ValueError):
        ConstrainedEngine(_tiny_config(), tiny_weights, constraint=bad)
    engine = ConstrainedEngine(_tiny_config(), tiny_weights, constraint=SENTIMENT.constraint)
    with pytest.raises(ValueError):
        engine.add_request("Hello", SamplingParams(max_tokens=4), constraint=bad)
    assert not engine.has_work() and not engine.constraints and not engine.sequences("r0")


def test_a_bad_regex_is_refused_with_its_reason() -> None:
    problem = Constraint("regex", "([a-z").problem()
    assert problem is not None and "unclosed" in problem and not problem.endswith(":")


def test_good_constraints_have_no_problem() -> None:
    for preset in PRESETS:
        assert preset.constraint.problem() is None
        assert dataclasses.replace(preset.constraint, json_layout="compact").problem() is None
    assert Constraint("choice", "a.b\n(c)\n[d]*").problem() is None  # regex metacharacters are literal


@pytest.mark.parametrize("config", [
    pytest.param(EngineConfig(weights="random", spec_drafter="ngram"), id="speculative"),
    pytest.param(EngineConfig(weights="random", overlap_decode=True, cuda_graphs=True, device="cuda"), id="overlap"),
])
def test_an_engine_that_samples_around_the_hook_is_refused(tiny_weights: LoadedWeights, config: EngineConfig) -> None:
    with pytest.raises(ValueError, match="speculative decoding or overlapped"):
        ConstrainedEngine(config, tiny_weights, constraint=SENTIMENT.constraint)


# ---- 6. random choice lists --------------------------------------------------------------------------

WORD = st.text(alphabet=string.ascii_letters + string.digits + ".*+?()[]|-", min_size=1, max_size=8)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choices=st.lists(WORD, min_size=1, max_size=4, unique=True), jump_forward=st.booleans(),
       seed=st.integers(0, 2**16), prompt=st.sampled_from(TINY_PROMPTS))
def test_a_choice_always_ends_as_one_of_the_choices(tiny_weights: LoadedWeights, choices: list[str],
                                                    jump_forward: bool, seed: int, prompt: str) -> None:
    constraint = Constraint("choice", "\n".join(choices))
    assert constraint.problem() is None and constraint.choices() == choices
    # A repeated line or blank lines add no choice.
    assert Constraint("choice", "\n".join([*choices, " ", choices[0]])).choices() == choices
    run = _run(tiny_weights, _tiny_config(), constraint, prompt,
               SamplingParams(max_tokens=16, temperature=0.8, seed=seed), jump_forward)
    sample = run.sample()
    assert sample["finish_reason"] == "eos" and sample["text"] in choices and sample["valid"] is True
    assert run.engine.engine.result(run.request_id).text == sample["text"]
    _replay(constraint, run.events(), tiny_weights.tokenizer, jump_forward, greedy=False)
    assert run.engine.block_manager.num_free_blocks == run.engine.config.num_blocks


# ---- 7. compact JSON ---------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", [p for p in PRESETS if p.constraint.kind == "json_schema"], ids=_preset_id)
def test_compact_json_has_no_whitespace_outside_strings(preset_runs, real_weights: LoadedWeights,  # noqa: ANN001
                                                        preset: Preset) -> None:
    compact = dataclasses.replace(preset.constraint, json_layout="compact")
    run = _run_preset(real_weights, preset, constraint=compact)
    sample = run.sample()
    text = sample["text"]
    assert sample["finish_reason"] == "eos" and sample["valid"] is True
    assert accepts(preset.constraint, text, real_weights.tokenizer)
    assert _whitespace_outside_strings(text) == []
    json.loads(text)
    _replay(compact, run.events(), real_weights.tokenizer, jump_forward=True, greedy=True)
    # The flexible layout of the same preset is laid out with whitespace (so the check above can fail).
    assert _whitespace_outside_strings(preset_runs[(preset.name, True)].sample()["text"])


# ---- early masks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", [PERSON, SENTIMENT], ids=lambda p: p.constraint.name)
def test_early_masks_change_no_token_and_no_mask(real_weights: LoadedWeights, preset, one_torch_thread) -> None:  # noqa: ANN001
    """A mask computed on the worker thread while the forward pass runs is the mask computed after it: the same
    tokens, the same allowed counts and kinds, with snapshots taken every step (they read the guide's state
    while the next mask may be computing). Without early masks sampling waits for the whole mask."""
    runs = {}
    for early in (False, True):
        engine = ConstrainedEngine(_real_config(), real_weights, constraint=preset.constraint, early_masks=early)
        rid = engine.add_request(_chat(preset.prompt), SamplingParams(max_tokens=preset.max_tokens))
        records = _drain(engine)
        sample = records[-1].extra("constrained")["requests"][rid]["samples"][0]
        assert records[-1].extra("constrained")["requests"][rid]["early_masks"] is early
        runs[early] = (engine.engine.result(rid).token_ids, sample["events"])
    (late_ids, late), (early_ids, early) = runs[False], runs[True]
    assert late_ids == early_ids
    assert [(e["kind"], e["allowed"]) for e in late] == [(e["kind"], e["allowed"]) for e in early]
    sampled = [e for e in late if e["allowed"] is not None]
    assert all(e["mask_wait_seconds"] == e["mask_seconds"] for e in sampled)
    assert all(0 <= e["mask_wait_seconds"] for e in early if e["allowed"] is not None)


def test_early_masks_with_many_sequences_and_forks(tiny_weights: LoadedWeights) -> None:
    """Several constrained requests (one with n = 3) share the one mask worker; every sample still ends as one
    of the choices, and the same seeds give the same samples with early masks off."""
    choice = Constraint("choice", "alpha\nbeta\ngamma delta")
    out = {}
    for early in (True, False):
        engine = ConstrainedEngine(_tiny_config(), tiny_weights, constraint=choice, early_masks=early)
        rids = [engine.add_request(f"Pick {i}", SamplingParams(max_tokens=8, temperature=0.9, seed=i, n=1 + 2 * (i == 0)))
                for i in range(4)]
        _drain(engine)
        out[early] = [[s.text for s in engine.engine.result(r).samples] for r in rids]
        assert all(t in choice.choices() for texts in out[early] for t in texts)
    assert out[True] == out[False]
