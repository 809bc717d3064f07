"""`TestTimeEngine`: an LLMEngine whose requests record log-probs, may run under a thinking budget,
and whose every step also says where each sample stands (tokens, forced tokens, blocks, answer, score).

It is engine-shaped (add_request / step / has_work / step_index, and every other attribute of the
inner engine), so a page's EngineSession drives it like any engine; `step()` returns the inner
engine's StepRecord with one more extra, "test_time", a JSON-able picture of every sample.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from engine.config import EngineConfig
from engine.engine import LLMEngine, Prompt, SampleOutput
from engine.sampling_params import SamplingParams
from engine.sequence import PENDING, Sequence
from engine.test_time.budget import BudgetForcer, BudgetForcing
from engine.test_time.scoring import ScoredSample, score_sample, select
from engine.wrapped_engine import EngineWrapper
from engine.weights import LoadedWeights

_KEEP_DEFAULT: Any = object()


class TestTimeEngine(EngineWrapper):
    __test__ = False  # not a pytest test class, despite the name
    EXTRA = "test_time"

    def __init__(self, config: EngineConfig = EngineConfig(), weights: LoadedWeights | None = None,
                 budget: BudgetForcing | None = None, answers: dict[str, str] | None = None) -> None:
        """`budget`: the thinking budget of requests added without their own (None: no forcing).
        `answers`: right answers by prompt text (a string prompt, or a chat prompt's last user turn), for
        requests added without `answer=`: a page's scenario of task-set questions is checked as it runs."""
        if config.spec_drafter != "none" or config.overlap_decode:
            raise ValueError("test-time compute needs an engine without speculative decoding or overlapped "
                             "decode (forced tokens and log-probs are written as each token is sampled)")
        super().__init__(LLMEngine(config, weights))
        self.budget = budget  # the default for requests added without their own
        self.forcer = BudgetForcer(self.engine.tokenizer, self.engine.model_config.eos_token_ids)
        self.engine.force_tokens = self.forcer
        self.truths: dict[str, str | None] = {}  # request id -> the right answer, when known
        self.answers = dict(answers or {})

    def add_request(self, prompt: Prompt, params: SamplingParams = SamplingParams(), arrival_step: int | None = None,
                    request_id: str | None = None, answer: str | None = None,
                    budget: BudgetForcing | None = _KEEP_DEFAULT) -> str:
        """Like LLMEngine.add_request; log-probs are always recorded, and under a budget max_tokens is
        raised to what the budget may need and ignore_eos is off (the budget, not max_tokens, ends the
        turn: an end of turn is either replaced or, after the answer, honoured)."""
        budget = self.budget if budget is _KEEP_DEFAULT else budget
        params = dataclasses.replace(params, logprobs=True)
        if budget is not None:
            params = dataclasses.replace(params, ignore_eos=False,
                                         max_tokens=max(params.max_tokens, budget.max_tokens(self.engine.tokenizer)))
        rid = self.engine.add_request(prompt, params, arrival_step=arrival_step, request_id=request_id)
        if budget is not None:
            self.forcer.policies[rid] = budget
        self.truths[rid] = answer if answer is not None else self.answers.get(_prompt_text(prompt))
        return rid

    # ---- views ------------------------------------------------------------------------------------
    def scored(self, request_id: str) -> tuple[ScoredSample, ...]:
        """Every sample of the request scored (finished or not: the text so far)."""
        result = self.engine.result(request_id)
        truth = self.truths.get(request_id)
        # engine.result lists the samples in index order, as `sequences` does.
        seqs = sorted((s for s in self.engine.sequences if s.request_id == request_id), key=lambda s: s.index)
        return tuple(score_sample(i, s.text, s.logprobs, len(s.token_ids), truth, self.answer_text(seq, s))
                     for i, (seq, s) in enumerate(zip(seqs, result.samples)))

    def answer_text(self, seq: Sequence, sample: SampleOutput) -> str | None:
        """What a sample's answer is read from. Under a thinking budget: only the text from the answer cue on
        ("Final answer: ..."), so a number in the thinking never counts, and an answer cut off by the answer-token
        limit reads as none, not as the last number thought of; "" while the sample still thinks (no answer
        yet). Without a budget: None, the whole text."""
        if seq.request_id not in self.forcer.policies:
            return None
        st = self.forcer.states.get(seq.seq_id)
        if st is None or st.thinking:
            return ""
        eos = set(self.engine.model_config.eos_token_ids)  # the forced end of turn is a control token, not text
        return self.engine.tokenizer.decode([t for t in sample.token_ids[st.cue_at:] if t != PENDING and t not in eos])

    def snapshot(self) -> dict[str, Any]:
        """Per request: the right answer, each sample's state, and which sample each rule picks."""
        bm = self.engine.block_manager
        requests = {}
        for rid, truth in self.truths.items():
            seqs = self.sequences(rid)
            scored = self.scored(rid)
            samples = []
            for seq, sc in zip(seqs, scored):
                st = self.forcer.states.get(seq.seq_id)
                table = bm.tables.get(seq.seq_id, [])
                shared = sum(1 for b in table if bm.ref_counts[b] > 1)
                samples.append({
                    "label": seq.label, "seq_id": seq.seq_id, "status": seq.status.value,
                    "finish_reason": seq.finish_reason, "token_ids": list(seq.output_ids),
                    "logprobs": list(seq.logprobs),
                    "forced": sorted(st.forced.items()) if st else [],
                    "replaced_eos": list(st.replaced_eos) if st else [],
                    "thinking_tokens": st.thinking_tokens(seq.output_len) if st else seq.output_len,
                    "thinking": st.thinking if st else True,
                    "computed": seq.num_computed_tokens, "prompt_len": seq.prompt_len,
                    "blocks": list(table), "shared_blocks": shared, "own_blocks": len(table) - shared,
                    "text": sc.text, "answer": sc.answer, "mean_logprob": sc.mean_logprob,
                    "num_tokens": sc.num_tokens, "correct": sc.correct,
                })
            sel = select(scored)
            policy = self.forcer.policies.get(rid)
            requests[rid] = {"truth": truth, "samples": samples,
                             "picks": {"majority": sel.majority, "self_certainty": sel.self_certainty,
                                       "oracle": sel.oracle},
                             "budget": dataclasses.asdict(policy) if policy else None}
        return {"requests": requests}


def _prompt_text(prompt: Prompt) -> str | None:
    if isinstance(prompt, str):
        return prompt.strip()
    users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1].strip() if users else None
