"""The input checks every lab that answers a typed prompt shares, with the sentences the pages show as they are."""
from __future__ import annotations


def check_prompt(prompt: str, max_chars: int, answered_by: str = "the model") -> None:
    """ValueError for an empty (or all-space) prompt or one longer than `max_chars` characters."""
    if not prompt.strip():
        raise ValueError(f"the prompt is empty: type something for {answered_by} to answer")
    if len(prompt) > max_chars:
        raise ValueError(f"the prompt is {len(prompt)} characters; at most {max_chars} here")


def check_new_tokens(n: int, limit: int) -> None:
    if not 1 <= n <= limit:
        raise ValueError(f"tokens to generate must be 1 to {limit}")
