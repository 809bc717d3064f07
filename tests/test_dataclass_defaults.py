"""No code reads a field's default through a slots dataclass's class: with `slots=True` the class attribute is the
slot's descriptor, not the default (the LoRA merge page's form once stored `MergeSettings.rank`, a
`member_descriptor`, and the run's JSON download failed on it). Read the default from an instance instead."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("engine", "kernels", "app", "pages", "bench", "training", "tests")
           for p in (ROOT / d).rglob("*.py")]


def _slots_dataclass_fields(tree: ast.AST) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for dec in node.decorator_list:
            if (isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "dataclass"
                    and any(k.arg == "slots" and getattr(k.value, "value", False) is True for k in dec.keywords)):
                out[node.name] = {s.target.id for s in node.body  # ClassVars are class attributes, not slots
                                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                                  and "ClassVar" not in ast.unparse(s.annotation)}
    return out


def test_no_slots_dataclass_default_is_read_through_the_class() -> None:
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in SOURCES}
    fields: dict[str, set[str]] = {}
    for tree in trees.values():
        fields.update(_slots_dataclass_fields(tree))
    assert "MergeSettings" in fields and "rank" in fields["MergeSettings"]  # the scan sees the project's classes
    reads = [f"{p.relative_to(ROOT)}:{n.lineno} {n.value.id}.{n.attr}" for p, tree in trees.items()
             for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in fields.get(n.value.id, ())
             and isinstance(n.ctx, ast.Load)]
    assert not reads, "a slots dataclass's field read through its class (a descriptor, not the default): " + \
        ", ".join(reads)
