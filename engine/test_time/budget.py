"""Budget forcing ("s1: Simple test-time scaling", arXiv 2501.10921): control how long a model thinks.

- Minimum budget: when the model tries to end its turn (samples <|im_end|> / EOS) before it has
  thought for `min_thinking` tokens, that token is dropped and " Wait," is written in its place, so the
  model reads its own hesitation and goes on.
- Maximum budget: when the thinking reaches `max_thinking` tokens, the engine appends an answer cue
  ("\\nFinal answer:") and the model answers in at most `answer_tokens` tokens, after which the
  engine ends the turn.
- An end-of-turn between the two budgets ends the thinking: the cue replaces it, so every sample
  finishes with an answer in the same place.

The forced text is not sampled: the engine writes it into the sequence (`LLMEngine.force_tokens`)
and the next step computes it like a small prefill chunk. The forcer remembers what it wrote where,
so a page can draw it differently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import ForcedTokens, Sequence
from engine.tokenizer import Tokenizer

MAX_BUDGET = 512


@dataclass(frozen=True, slots=True)
class BudgetForcing:
    min_thinking: int = 0  # tokens the model must think before it may stop (forced " Wait," until then)
    max_thinking: int = 64  # thinking tokens before the engine forces the answer cue
    answer_tokens: int = 8  # tokens the model may answer in after the cue
    wait_text: str = " Wait,"
    cue_text: str = "\nFinal answer:"

    def __post_init__(self) -> None:
        for name in ("min_thinking", "max_thinking", "answer_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_BUDGET:
                raise ValueError(f"{name} must be an integer in [0, {MAX_BUDGET}], got {v!r}")
        if self.max_thinking < 1 or self.answer_tokens < 1:
            raise ValueError(f"max_thinking and answer_tokens must be >= 1, got {self.max_thinking} and "
                             f"{self.answer_tokens}")
        if self.min_thinking > self.max_thinking:
            raise ValueError(f"min_thinking ({self.min_thinking}) must not exceed max_thinking ({self.max_thinking})")
        if not self.wait_text.strip() or not self.cue_text.strip():
            raise ValueError("wait_text and cue_text must not be empty")

    def max_tokens(self, tokenizer: Tokenizer) -> int:
        """An upper bound on the output length this policy allows: thinking may overshoot the cap by one
        " Wait," (forced just below the cap), then the cue, the answer and the forced end of turn."""
        return (self.max_thinking + len(tokenizer.encode(self.wait_text)) + len(tokenizer.encode(self.cue_text))
                + self.answer_tokens + 1)


@dataclass(slots=True)
class BudgetState:
    """One sequence's progress under a budget (mutable: the forcer updates it as tokens arrive)."""

    policy: BudgetForcing
    cue_at: int = -1  # output position where the cue starts (-1: still thinking)
    answer_from: int = -1  # output position of the first answer token
    forced: dict[int, str] = field(default_factory=dict)  # output position -> label, for forced tokens
    replaced_eos: list[int] = field(default_factory=list)  # output positions where an EOS was dropped
    ended: bool = False  # the engine forced the end of turn after the answer

    @property
    def thinking(self) -> bool:
        return self.cue_at < 0

    def thinking_tokens(self, output_len: int) -> int:
        """Tokens spent thinking (sampled and forced " Wait," alike, as s1 counts them)."""
        return output_len if self.cue_at < 0 else self.cue_at


class BudgetForcer:
    """The engine's `force_tokens` hook for every request given a policy (others pass untouched)."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.eos = frozenset(eos_token_ids)
        self.end_token = eos_token_ids[0]  # <|im_end|>: what ends an assistant turn in ChatML
        self.policies: dict[str, BudgetForcing] = {}  # request id -> its budget
        self.states: dict[int, BudgetState] = {}  # seq id -> progress
        self._ids: dict[str, tuple[int, ...]] = {}

    def _encode(self, text: str) -> tuple[int, ...]:
        if text not in self._ids:
            self._ids[text] = tuple(self.tokenizer.encode(text))
        return self._ids[text]

    def state(self, seq: Sequence) -> BudgetState | None:
        policy = self.policies.get(seq.request_id)
        if policy is None:
            return None
        st = self.states.get(seq.seq_id)
        if st is None:  # not setdefault: that would build a throw-away state for every sampled token
            st = self.states[seq.seq_id] = BudgetState(policy)
        return st

    def _force(self, st: BudgetState, start: int, tokens: tuple[int, ...], replace: bool, label: str) -> ForcedTokens:
        first = start if replace else start + 1  # output position of the first forced token
        for i in range(len(tokens)):
            st.forced[first + i] = label
        return ForcedTokens(tokens, replace, label)

    def __call__(self, seq: Sequence, token: int) -> ForcedTokens | None:
        st = self.state(seq)
        if st is None or st.ended:
            return None
        p = st.policy
        pos = seq.output_len  # the sampled token's output position (it is not appended yet)
        is_eos = token in self.eos
        if st.thinking:
            if is_eos:
                st.replaced_eos.append(pos)
                if pos < p.min_thinking:
                    return self._force(st, pos, self._encode(p.wait_text), True, "wait")
                return self._cue(st, pos, True)
            if pos + 1 >= p.max_thinking:  # this token uses the last of the thinking budget
                return self._cue(st, pos, False)
            return None
        if is_eos:
            return None  # the model ended its answer itself
        if pos + 1 - st.answer_from >= p.answer_tokens:
            st.ended = True
            return self._force(st, pos, (self.end_token,), False, "end")
        return None

    def _cue(self, st: BudgetState, pos: int, replace: bool) -> ForcedTokens:
        cue = self._encode(st.policy.cue_text)
        st.cue_at = pos if replace else pos + 1
        st.answer_from = st.cue_at + len(cue)
        return self._force(st, pos, cue, replace, "cue")
