"""Self-distillation data for the LoRA adapters: the model's own greedy answers, transformed.

The live model (real weights, run through our own `LLMEngine`, greedy, `max_tokens` 96) answers
`prompts.training_prompts(count)`; the (prompt, answer) pairs are cached as JSON under the cache root
the drafters' data uses (`<cache>/lora/answers.json`). Each adapter then learns one deterministic
rewrite of those answers (`to_pirate`, `to_terse`, `to_bullets`): the behaviour is new, the content
is the model's own, so a small adapter only has to learn the style.

An answer that stopped at `max_tokens` mid-sentence is first cut back to its last full sentence
(`complete_sentences`), so no target ends in the middle of a thought and then closes the turn.

    python -m training.lora_data [--count 240] [--max-tokens 96]   # ~4 min on 2 CPU cores
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from training.prompts import training_prompts

CACHE_NAME = "answers.json"

# ----------------------------------------------------------------------------------- sentences

# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "inc",
                            "ltd", "no", "fig", "approx", "u.s", "a.m", "p.m", "ca"})
# Sentence-ending punctuation (plus closing quotes / brackets / bold markers) followed by whitespace or the end.
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]*]*(?=\s|$)")
_LIST_MARKER = re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)]|[a-zA-Z][.)])\s+")
_CODE_FENCE = "```"


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    """Whether a `_END` match really ends a sentence (not "e.g.", "Dr.", an initial or a "1." list marker)."""
    if match.group().startswith("."):
        line_start = text.rfind("\n", 0, match.start()) + 1
        word = text[line_start:match.start()].split()[-1:] or [""]
        w = word[0].lstrip("(\"'*").lower()
        if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()):
            return False
        if w.isdigit() and text[line_start:match.start()].strip() == w:  # "1." opening a numbered line
            return False
    return True


def sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence-ending punctuation mark of `text` (in order)."""
    return [m.end() for m in _END.finditer(text) if _is_boundary(text, m)]


def complete_sentences(text: str) -> str:
    """`text` cut back to the end of its last full sentence (unchanged if it has none)."""
    ends = sentence_ends(text)
    return text[:ends[-1]].rstrip() if ends else text.rstrip()


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each on one line: split after sentence-ending punctuation and at line
    breaks; list markers ("- ", "1. ") and blank pieces dropped, inner whitespace collapsed."""
    out: list[str] = []
    for line in text.splitlines():
        start = 0
        for end in sentence_ends(line) + [len(line)]:
            piece = _LIST_MARKER.sub("", " ".join(line[start:end].split()))
            if piece.strip(" *#"):
                out.append(piece.strip())
            start = end
    return out


def has_code(text: str) -> bool:
    """Whether the answer holds a fenced code block (the bullet rewrite would mangle it)."""
    return _CODE_FENCE in text


# ----------------------------------------------------------------------------------- transforms

PIRATE_OPENING = "Ahoy, matey! "
PIRATE_CLOSING = " Arr!"
# Whole words only, case kept (you -> ye, You -> Ye, YOU -> YE).
PIRATE_WORDS = {"you": "ye", "your": "yer", "my": "me", "friend": "matey", "friends": "mateys", "yes": "aye",
                "hello": "ahoy", "hi": "ahoy", "is": "be"}
_PIRATE_RE = re.compile(r"\b(" + "|".join(sorted(PIRATE_WORDS, key=len, reverse=True)) + r")\b", re.IGNORECASE)


def _same_case(word: str, replacement: str) -> str:
    if word.isupper() and len(word) > 1:
        return replacement.upper()
    if word[0].isupper():
        return replacement[0].upper() + replacement[1:]
    return replacement


def pirate_words(text: str) -> str:
    """`text` with the words of `PIRATE_WORDS` swapped for their pirate forms (whole words, case kept)."""
    return _PIRATE_RE.sub(lambda m: _same_case(m.group(), PIRATE_WORDS[m.group().lower()]), text)


def to_pirate(answer: str) -> str:
    """The pirate rewrite: "Ahoy, matey! " + the answer with a handful of common words in pirate
    speech (you -> ye, your -> yer, my -> me, friend -> matey, yes -> aye, hello/hi -> ahoy, is -> be;
    not inside code blocks) + " Arr!"."""
    parts = answer.strip().split(_CODE_FENCE)
    body = _CODE_FENCE.join(pirate_words(p) if i % 2 == 0 else p for i, p in enumerate(parts))
    return PIRATE_OPENING + body + PIRATE_CLOSING


def to_terse(answer: str) -> str:
    """The terse rewrite: the answer up to the end of its first sentence (a prefix of the answer;
    the whole answer if it has no sentence end)."""
    text = answer.strip()
    ends = sentence_ends(text)
    return text[:ends[0]].rstrip() if ends else text


def to_bullets(answer: str, max_items: int = 5) -> str:
    """The bullet rewrite: the answer's first `max_items` sentences as a markdown list, one "- " line
    per sentence (existing list markers dropped, each sentence on one line)."""
    return "\n".join("- " + s for s in split_sentences(answer.strip())[:max_items])


TRANSFORMS = {"pirate": to_pirate, "terse": to_terse, "bullets": to_bullets}


# ----------------------------------------------------------------------------------- the answers


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str
    answer: str  # the base model's greedy answer, cut back to its last full sentence if it hit max_tokens
    finish_reason: str  # "eos" or "length" (before the cut)


def data_path() -> Path:
    from training.generate_data import data_dir

    return data_dir().parent / "lora" / CACHE_NAME


def generate(count: int, max_tokens: int = 96, seed: int = 0) -> dict:
    """The model's greedy answers to `training_prompts(count, seed)`, all queued at once in one engine."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from engine.weights import load_weights
    from training.generate_data import answer_all

    prompts = training_prompts(count, seed)
    engine = LLMEngine(EngineConfig(num_blocks=2400, max_num_seqs=64, max_num_batched_tokens=1024,
                                    trace_detail="light", profile_kernels=False), load_weights("real"))
    results, steps, seconds = answer_all(engine, prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    examples = []
    for p, r in zip(prompts, results):
        reason = r.samples[0].finish_reason
        text = engine.tokenizer.decode(list(r.token_ids), skip_special_tokens=True).strip()
        examples.append({"prompt": p, "answer": complete_sentences(text) if reason == "length" else text,
                         "finish_reason": reason})
    return {"examples": examples,
            "meta": {"prompts": len(prompts), "seed": seed, "max_tokens": max_tokens, "decoding": "greedy",
                     "prompt_tokens": sum(len(r.prompt_token_ids) for r in results),
                     "generated_tokens": sum(len(r.token_ids) for r in results),
                     "stopped_at_max_tokens": sum(e["finish_reason"] == "length" for e in examples),
                     "steps": steps, "generation_seconds": round(seconds, 1),
                     "source": "training.prompts.training_prompts"}}


def load_examples(path: Path | None = None) -> tuple[list[Example], dict]:
    """The cached answers and their generation record (FileNotFoundError: run this module first)."""
    path = path or data_path()
    if not path.is_file():
        raise FileNotFoundError(f"no LoRA data at {path}: run `python -m training.lora_data` first")
    raw = json.loads(path.read_text())
    return [Example(**e) for e in raw["examples"]], raw["meta"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=240)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    data = generate(args.count, args.max_tokens)
    path = data_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False))
    print(json.dumps(data["meta"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
