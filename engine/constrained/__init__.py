"""Constrained (structured) decoding on the real engine: a grammar (JSON schema, regex or choice) masks
the logits before every sampled token, and jump-forward writes the text the grammar forces."""
from engine.constrained.constraint import KINDS, Constraint, ConstraintKind
from engine.constrained.guide import Mask, SequenceGuide, accepts, problem_with
from engine.constrained.runner import ConstrainedEngine, TokenEvent

__all__ = ["KINDS", "ConstrainedEngine", "Constraint", "ConstraintKind", "Mask", "SequenceGuide", "TokenEvent",
           "accepts", "problem_with"]
