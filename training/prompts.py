"""The prompts the target answers to make its own training data: topics x kinds of request.

Deterministic (seeded) so the data set, and therefore the committed heads, can be rebuilt. The
held-out evaluation prompts of `bench/spec.py` are not drawn from this list.
"""
from __future__ import annotations

import random

TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning",
    "volcanoes", "the immune system", "climate change", "the printing press", "honey bees",
    "the stock market", "electric cars", "the Roman Empire", "DNA", "rainbows", "the internet",
    "coffee", "the Moon landing", "earthquakes", "recycling", "vaccines", "the Great Wall of China",
    "solar panels", "sleep", "chess", "the Olympic Games", "jazz music", "sharks", "glaciers",
    "the human heart", "democracy", "bread baking", "renewable energy", "the Amazon rainforest",
    "gravity", "penguins", "the Renaissance", "smartphones", "time zones", "friendship",
    "healthy eating", "the solar system", "bicycles", "libraries", "tea ceremonies", "dinosaurs",
    "electricity", "the ocean tides", "origami", "public speaking", "budgeting money", "birds migrating",
    "the pyramids of Egypt", "a rainy day", "learning a new language", "mountains", "trains",
    "the color blue", "robots", "gardening", "the Silk Road", "exercise", "the periodic table",
)

KINDS = (
    "Explain {t} in simple terms.",
    "Write a short story about {t}.",
    "Give me five interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a short poem about {t}.",
    "How would you teach a child about {t}?",
    "Summarize the history of {t} in a paragraph.",
    "Write a list of questions a student might ask about {t}, with answers.",
    "Describe {t} to someone who has never heard of it.",
    "Write a Python function related to {t}, with comments.",
    "What is a common misconception about {t}?",
    "Write an email to a friend about {t}.",
)


def training_prompts(count: int = 480, seed: int = 0) -> list[str]:
    pairs = [(k, t) for k in KINDS for t in TOPICS]
    random.Random(seed).shuffle(pairs)
    return [k.format(t=t) for k, t in pairs[:count]]


# The second set: other topics, other kinds of request, and copy-style tasks (rewrite, fix, shorten a
# given text) whose texts are the model's own earlier answers.  Kept apart from the held-out prompts of
# `bench/spec.py`: no refrigerators or cover letters, no "How does ..." / "advice" phrasings, and none
# of its lighthouse paragraph or its two copy instructions.
TOPICS_2 = (
    "octopuses", "the Industrial Revolution", "quantum computers", "wind turbines", "the human brain", "pizza",
    "soccer", "the Eiffel Tower", "meditation", "cloud computing", "butterflies", "the Titanic", "ancient Greece",
    "hurricanes", "the Sahara desert", "elephants", "blockchain", "music theory", "the Mars rovers", "airplanes",
    "vitamins", "social media", "the Cold War", "coral reefs", "wolves", "the guitar", "prime numbers",
    "video games", "the microscope", "antibiotics", "cats", "the Arctic", "rivers", "paper money", "the telephone",
    "photography", "cheese making", "the Maya civilization", "lightning", "the Northern Lights", "submarines",
    "kindness", "teamwork", "procrastination", "architecture", "the Nile", "composting", "astronauts",
    "the metric system", "camping", "volunteering", "fossils", "cryptography", "yoga", "the Wright brothers",
    "satellites", "rice farming", "evolution", "magnets", "spiders", "board games", "city parks", "snow",
    "deserts", "the Vikings", "chocolate", "museums", "tornadoes",
)

KINDS_2 = (
    "Why is {t} important?",
    "Write the opening paragraph of a blog post about {t}.",
    "Compare {t} with something similar and explain the differences.",
    "Write a dialogue between two friends talking about {t}.",
    "List three surprising things most people don't know about {t}.",
    "Explain {t} as if you were a tour guide.",
    "Create a short quiz about {t} with an answer key.",
    "What would the world be like without {t}?",
    "Write a diary entry from someone experiencing {t} for the first time.",
    "Define {t} in one sentence, then explain it in more detail.",
)

COPY_KINDS = (
    "Rewrite the following paragraph in simpler words:\n\n{p}",
    "Fix the typos in this passage and give the corrected version:\n\n{p}",
    "Shorten this text to a single sentence:\n\n{p}",
    "Rewrite this text in the past tense:\n\n{p}",
    "Give this paragraph a title, then copy it out under the title:\n\n{p}",
    "Turn the following text into a bulleted list of its key points:\n\n{p}",
)


def first_sentences(text: str, max_words: int = 70) -> str:
    """The leading whole sentences of `text` (at most `max_words` words; at least one sentence)."""
    words, out = 0, []
    for sentence in text.replace("\n", " ").split(". "):
        n = len(sentence.split())
        if out and words + n > max_words:
            break
        out.append(sentence.strip())
        words += n
    joined = ". ".join(s for s in out if s)
    return joined if joined.endswith((".", "!", "?")) else joined + "."


def add_typos(text: str, rng: random.Random, count: int = 3) -> str:
    """Swap two inner letters in `count` words of five letters or more (the passage stays readable)."""
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    for i in rng.sample(candidates, min(count, len(candidates))):
        w = words[i]
        j = rng.randrange(1, len(w) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def copy_prompts(passages: list[str], count: int, seed: int = 1) -> list[str]:
    """Copy-style requests over `passages` (the model's earlier answers), one kind per passage."""
    rng = random.Random(seed)
    chosen = [p for p in passages if len(p.split()) >= 25]
    rng.shuffle(chosen)
    out = []
    for i, passage in enumerate(chosen[:count]):
        kind = COPY_KINDS[i % len(COPY_KINDS)]
        text = first_sentences(passage)
        out.append(kind.format(p=add_typos(text, rng) if "typos" in kind else text))
    return out


def training_prompts_2(passages: list[str], copy_count: int = 240, seed: int = 0) -> list[str]:
    """TOPICS_2 x KINDS_2 (680) plus `copy_count` copy-style requests, shuffled together."""
    prompts = [k.format(t=t) for k in KINDS_2 for t in TOPICS_2] + copy_prompts(passages, copy_count)
    random.Random(seed).shuffle(prompts)
    return prompts


def training_prompts_3(count: int = 520, seed: int = 2) -> list[str]:
    """The two topic lists crossed with the other set's kinds (TOPICS_2 x KINDS, TOPICS x KINDS_2):
    new requests without new topics or phrasings, so the held-out prompts stay unseen."""
    pairs = [k.format(t=t) for k in KINDS for t in TOPICS_2] + [k.format(t=t) for k in KINDS_2 for t in TOPICS]
    random.Random(seed).shuffle(pairs)
    return pairs[:count]
