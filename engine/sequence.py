"""Request and sequence state. A request with n > 1 owns n sequences that share its prompt."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

import torch

from engine.sampling_params import SamplingParams


class SeqStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_seq_counter = itertools.count()

# Token id of an output token the GPU has computed but the host has not read yet (overlapped
# decode, engine/overlap.py): it is computed from the device copy and resolved one step later.
PENDING = -1


@dataclass(eq=False)
class Sequence:
    """The schedulable unit. Invariant: num_computed_tokens <= len(token_ids); the tokens in
    [num_computed_tokens, len) are what the next steps must compute."""

    request_id: str
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    arrival_step: int
    arrival_order: int
    index: int = 0  # which of the request's n samples
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens last served from the prefix cache
    generator: torch.Generator | None = None
    fork_parent: "Sequence | None" = None  # set on n > 1 children until the parent's prefill ends
    first_token_step: int = -1
    finish_step: int = -1
    finish_reason: str = ""
    num_preemptions: int = 0
    first_token_time: float = -1.0
    token_times: list[float] = field(default_factory=list)  # wall-clock time each output token appeared
    arrival_time: float = -1.0
    spec_gamma: int | None = None  # speculative drafts per round for this request (None: the engine's default)
    # With params.logprobs: one entry per output token, the sampled token's log-probability, or None for
    # a token the engine forced in (ForcedTokens) rather than sampled.
    logprobs: list[float | None] = field(default_factory=list)
    adapter: str | None = None  # the LoRA adapter this request runs with (engine/lora); None: the base model

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def output_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def remaining(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        """Still computing tokens it did not sample itself (prompt, or recompute after preemption)."""
        return self.remaining > 1 or self.num_computed_tokens < self.prompt_len

    @property
    def label(self) -> str:
        return self.request_id if self.params.n == 1 else f"{self.request_id}#{self.index}"

    @property
    def finished(self) -> bool:
        return self.status == SeqStatus.FINISHED

    def make_generator(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed + 7919 * self.index)


@dataclass(frozen=True, slots=True)
class ForcedTokens:
    """What `LLMEngine.force_tokens` may return for a just-sampled token: text the engine writes into the
    sequence instead of (`replace`) or after the sampled token. The forced tokens are not computed yet, so
    the scheduler's one rule (computed tokens up to known tokens) computes them in the next step, like a
    small prefill chunk. `label` marks them in the step's EmittedTokens ("wait", "cue", "end", ...)."""

    tokens: tuple[int, ...]
    replace: bool
    label: str
