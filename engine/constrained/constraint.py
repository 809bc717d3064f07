"""What a constrained request must produce: a JSON schema, a regular expression, or one of a few choices.

A `Constraint` is plain data (a page saves it, a test builds it); `grammar()` turns it into an
llguidance grammar, and `problem()` says in one sentence why a hand-written one cannot be used, before
any request is run with it. llguidance (the grammar engine behind vLLM's and SGLang's `guidance`
backend) is imported lazily, so the rest of the engine never needs it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

ConstraintKind = Literal["json_schema", "regex", "choice"]
KINDS: tuple[ConstraintKind, ...] = ("json_schema", "regex", "choice")
MAX_SPEC_CHARS = 4000
JsonLayout = Literal["flexible", "compact"]
# "flexible": JSON may have whitespace between its tokens, so the model lays it out as it learned to
# (SmolLM2 writes `{\n  "name": ...`). "compact": none, so separators have one spelling and jump-forward
# can write more of them; but the model is then pushed off its own layout at every separator, which
# changes its answers (measured on the constrained decoding page).
JSON_LAYOUTS: tuple[JsonLayout, ...] = ("flexible", "compact")
# Flexible whitespace is bounded: unbounded, a model that does not know how to go on (random weights do this)
# can write newlines and spaces until max_tokens, and the JSON is never finished. 32 characters between two
# JSON tokens is a newline and the indentation of depth 7 at four spaces.
FLEXIBLE_WHITESPACE = r"[ \t\n]{0,32}"


def as_sentence(problem: str) -> str:
    """A `problem()` phrase as the sentence an error message shows."""
    return problem[0].upper() + problem[1:] + "."


def parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def first_line(error: str) -> str:
    """llguidance's messages carry a source excerpt over several lines: keep the line that says where and the
    one that says why ("error: unclosed character class"), if there is one."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return error.strip()
    why = next((line[len("error:"):].strip() for line in lines[1:] if line.lower().startswith("error:")), "")
    return lines[0].rstrip(":") + (f" ({why})" if why and why not in lines[0] else "")


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    spec: str  # the schema as JSON text, the regex, or one choice per line
    name: str = ""
    json_layout: JsonLayout = "flexible"  # JSON schemas only

    @property
    def label(self) -> str:
        return self.name or {"json_schema": "JSON schema", "regex": "regular expression", "choice": "choice"}[self.kind]

    def choices(self) -> list[str]:
        """The non-blank lines, stripped, each once (a repeated choice adds nothing to the alternation)."""
        return list(dict.fromkeys(c for c in (line.strip() for line in self.spec.splitlines()) if c))

    def grammar(self, flexible_whitespace: bool = False) -> str:
        """The llguidance grammar (a JSON string); ValueError when the spec is not even well-formed text.
        `flexible_whitespace`: JSON may have spaces and newlines between its tokens (how an unconstrained
        answer is judged: `{"a": 1}` is as valid as `{"a":1}`)."""
        from llguidance import LLMatcher

        if self.kind == "json_schema":
            try:
                schema = json.loads(self.spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema must be a JSON object, like {\"type\": \"object\", ...}")
            if flexible_whitespace:  # judging: any JSON layout at all
                options = {"whitespace_flexible": True}
            elif self.json_layout == "flexible":
                options = {"whitespace_flexible": True, "whitespace_pattern": FLEXIBLE_WHITESPACE}
            else:
                options = {"whitespace_flexible": False}
            return LLMatcher.grammar_from_json_schema(schema, overrides=options)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        # A choice is a regex alternation of the literal strings.
        import re

        return LLMatcher.grammar_from_regex("|".join(f"(?:{re.escape(c)})" for c in self.choices()))

    def problem(self) -> str | None:
        """Why this constraint cannot be used (one readable sentence), or None."""
        from llguidance import LLMatcher

        if self.kind not in KINDS:
            return f"unknown constraint kind {self.kind!r}; use one of {', '.join(KINDS)}"
        if self.json_layout not in JSON_LAYOUTS:
            return f"unknown JSON layout {self.json_layout!r}; use one of {', '.join(JSON_LAYOUTS)}"
        if not self.spec.strip():
            return {"json_schema": "the JSON schema is empty", "regex": "the regular expression is empty",
                    "choice": "there are no choices: write one per line"}[self.kind]
        if len(self.spec) > MAX_SPEC_CHARS:
            return f"the {self.label} is {len(self.spec):,} characters long; at most {MAX_SPEC_CHARS:,}"
        if self.kind == "regex" and (len(self.spec) - len(self.spec.rstrip("\\"))) % 2 == 1:
            # llguidance drops a dangling escape without a word ("a\\" becomes "a"), so say it here.
            return "the regular expression ends in a lone backslash: escape it as \\\\ or remove it"
        try:
            grammar = self.grammar()
        except ValueError as e:
            return str(e)
        error = LLMatcher.validate_grammar(grammar)
        if error:
            return f"the {self.label} is not usable: {first_line(error)}"
        return None

    def check(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise ValueError(as_sentence(problem))
