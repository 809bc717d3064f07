"""The grammar side of constrained decoding: one llguidance matcher per sequence, the mask of allowed
tokens it computes before every sampled token, and the tokens it forces (jump-forward).

The mask is a bit per vocabulary entry: a token is allowed when its bytes keep the output a prefix of
some string the grammar accepts. llguidance walks a trie of the vocabulary's byte strings against the
grammar's lexer and parser state, so a mask costs tens of microseconds, not a pass over 49,152 strings.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.constrained.constraint import Constraint, first_line
from engine.tokenizer import Tokenizer


@functools.cache
def _ll_tokenizer(tokenizer: Tokenizer):
    """llguidance's view of the vocabulary (byte strings per token id), built once per tokenizer (~0.3 s)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer._tok, n_vocab=tokenizer.vocab_size,
                                        eos_token=tokenizer.eos_token_ids[0])


@dataclass(frozen=True, slots=True)
class Mask:
    allowed: torch.Tensor  # bool [vocab]
    count: int
    seconds: float  # computing the bitmask and unpacking it


class SequenceGuide:
    """One sequence's position in the grammar."""

    def __init__(self, constraint: Constraint, tokenizer: Tokenizer) -> None:
        from llguidance import LLMatcher

        t0 = time.perf_counter()
        self.tokenizer = tokenizer
        self.matcher = LLMatcher(_ll_tokenizer(tokenizer), constraint.grammar(), log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the {constraint.label} is not usable: {first_line(self.matcher.get_error())}")
        self.vocab = tokenizer.vocab_size
        self._bits = np.zeros((1, (self.vocab + 31) // 32), dtype=np.int32)
        self.build_seconds = time.perf_counter() - t0
        self._note_state()

    def _note_state(self) -> None:
        """Remember whether the output so far is complete and any error, after every call that moves or reads
        the matcher: a page's snapshot reads these while the next mask may be computing on a worker thread,
        and llguidance's matcher refuses a second caller while one holds it (it drops the GIL inside)."""
        self._accepting = self.matcher.is_accepting() and not self.matcher.is_error()
        self._error = first_line(self.matcher.get_error()) if self.matcher.is_error() else ""

    def mask(self) -> Mask:
        """Which tokens may come next. A matcher in an error state (it never should be: every token it is
        given was allowed) or past the end of the grammar allows only the end of the turn."""
        import llguidance.numpy as lnp

        t0 = time.perf_counter()
        if self.matcher.is_error():
            allowed = torch.zeros(self.vocab, dtype=torch.bool)
            allowed[list(self.tokenizer.eos_token_ids)] = True
        else:
            lnp.fill_next_token_bitmask(self.matcher, self._bits, 0)
            bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab]
            allowed = torch.from_numpy(bits.astype(bool))
        seconds = time.perf_counter() - t0
        self._note_state()
        return Mask(allowed, int(allowed.sum()), seconds)

    def advance(self, token: int) -> bool:
        """Consume a sampled token; False if the grammar rejects it (the matcher then stays in error)."""
        ok = self.matcher.consume_token(token)
        self._note_state()
        return ok

    def forced(self, limit: int) -> list[int]:
        """Tokens the grammar allows in one way only from here (jump-forward), at most `limit` of them (what
        is left of the request's max_tokens), already consumed; then the end of the turn if the grammar is
        complete, can take nothing more and there is room."""
        tokens = list(self.matcher.compute_ff_tokens())[:max(limit, 0)]
        if tokens and not self.matcher.consume_tokens(tokens):
            self._note_state()
            return []
        eos = self.tokenizer.eos_token_ids[0]
        if (len(tokens) < limit and self.matcher.is_stopped() and not self.matcher.is_error()
                and eos not in tokens):
            self.matcher.consume_token(eos)
            tokens.append(eos)
        self._note_state()
        return tokens

    @property
    def accepting(self) -> bool:
        """Whether the output so far is a complete string of the language (as of the last call)."""
        return self._accepting

    @property
    def error(self) -> str:
        """Why the matcher stopped accepting tokens, in a line (llguidance's own message adds a state dump)."""
        return self._error


@functools.lru_cache(maxsize=64)
def problem_with(constraint: Constraint, tokenizer: Tokenizer) -> str | None:
    r"""`Constraint.problem()`, and then whether the grammar lets the model start at all: a grammar such as
    `[^\s\S]` is well-formed but accepts no text, which only shows once a matcher computes a first mask; and
    a grammar too complex for llguidance's limits fails only then too. Cached: a page checks the same
    constraint before a run and again in every engine it builds, and a large one takes a second to build."""
    problem = constraint.problem()
    if problem is not None:
        return problem
    try:
        guide = SequenceGuide(constraint, tokenizer)
    except ValueError as e:
        return str(e)
    mask = guide.mask()
    # llguidance's "NoExtensionBias": no token extends the empty output, the grammar's language is empty.
    if mask.count == 0 or guide.error.startswith("NoExtension"):
        return f"the {constraint.label} accepts no text at all: no token can start it"
    if guide.error:  # e.g. a grammar beyond llguidance's size limits ("too many expressions constructed")
        return f"the {constraint.label} is not usable: {guide.error}"
    return None


def accepts(constraint: Constraint, text: str, tokenizer: Tokenizer) -> bool:
    """Whether `text` is a complete string of the constraint's language, JSON whitespace allowed anywhere
    (how an unconstrained answer is judged). Byte-level, so it does not matter how the text was split
    into tokens."""
    from llguidance import LLMatcher

    matcher = LLMatcher(_ll_tokenizer(tokenizer), constraint.grammar(flexible_whitespace=True), log_level=0)
    tokens = tokenizer.encode(text)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()
