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
