"""Ready-made constrained tasks: a prompt and the grammar its answer must follow. The page offers them,
the bench measures them, the tests run them; each one shows a different side of masking."""
from __future__ import annotations

import json
from dataclasses import dataclass

from engine.constrained.constraint import Constraint


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    prompt: str
    constraint: Constraint
    max_tokens: int
    lesson: str  # what this one shows, in a sentence


def _schema(d: dict) -> str:
    return json.dumps(d, indent=2)


PERSON = Preset(
    "Person record (JSON schema)",
    "Maria is a 34 year old nurse who lives in Lisbon. Give her details as JSON with the keys name, age and city.",
    Constraint("json_schema", _schema({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                       "city": {"type": "string", "maxLength": 24}},
        "required": ["name", "age", "city"], "additionalProperties": False}), "person"),
    64,
    "Keys, quotes and braces are the grammar's; the values are the model's. Unconstrained, the model writes "
    "the JSON and then keeps talking.")
TOOL_CALL = Preset(
    "Tool call (JSON schema with an enum)",
    "You can call get_weather, search_web or set_timer. The user asks: will it rain in Paris tomorrow? "
    "Reply with the tool call as JSON with the keys tool and argument.",
    Constraint("json_schema", _schema({
        "type": "object",
        "properties": {"tool": {"enum": ["get_weather", "search_web", "set_timer"]},
                       "argument": {"type": "string", "maxLength": 40}},
        "required": ["tool", "argument"], "additionalProperties": False}), "tool call"),
    64,
    "An enum leaves a few tokens allowed where the tool name goes: the mask decides between three strings.")
SENTIMENT = Preset(
    "Sentiment label (choice)",
    "Is the following review positive, negative or neutral? “Terrible. The battery died after two days and "
    "support never answered.”",
    Constraint("choice", "positive\nnegative\nneutral", "sentiment"),
    8,
    "Free, the model starts a sentence (“The review is …”) that no label allows. Masked, its favourite first token "
    "“The” is forbidden; among the ten tokens left (n, neg, negative, p, pos, …) it picks a label, and the end of "
    "the turn follows.")
DATE = Preset(
    "Date (regular expression)",
    "Apollo 11 landed on the Moon on July 20, 1969. Write that date in the format YYYY-MM-DD.",
    Constraint("regex", r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", "ISO date"),
    16,
    "Free text says “July 20, 1969.”; the regex allows digits and dashes only where a real date has them (month "
    "01-12, day 01-31), so the model must spell the same fact its way.")
COLOURS = Preset(
    "Three colours (JSON array)",
    "Name the three primary colours of paint as a JSON list of strings.",
    Constraint("json_schema", _schema({
        "type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}),
        "three strings"),
    40,
    "minItems and maxItems count for the model: after the third string only the closing bracket is allowed.")

PRESETS: tuple[Preset, ...] = (PERSON, TOOL_CALL, SENTIMENT, DATE, COLOURS)
