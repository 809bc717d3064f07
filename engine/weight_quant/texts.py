"""Calibration and evaluation text for the weight-quantization lab.

"Chat" texts are conversations in the model's own ChatML format whose answers are the full-precision
model's own greedy answers: that is the fine-tune's behaviour, the thing a quantized checkpoint should keep.
"Prose" is ordinary written English, the kind of text a generic calibration set (C4, WikiText) holds.
Calibration and evaluation never share a text.
"""
from __future__ import annotations

import random
from typing import Literal

from engine.serving_load.prompts import CORPUS

CalibrationSet = Literal["chat", "prose", "random tokens"]
CALIBRATION_SETS: tuple[CalibrationSet, ...] = ("chat", "prose", "random tokens")

CHAT_CALIBRATION = (
    "How do I boil an egg so the yolk stays soft?",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "What is the difference between weather and climate?",
    "Give me three tips for a first job interview.",
    "Explain what a compiler does in two sentences.",
    "Suggest a name for a small bakery by the sea.",
    "Why do cats purr?",
    "How many minutes are there in a week? Show the calculation.",
    "Translate 'good morning, how are you?' into French.",
    "What should I pack for a two-day hike?",
    "Summarise the plot of Little Red Riding Hood in one sentence.",
    "What is photosynthesis?",
    "How do I make my phone battery last longer?",
    "Write a two-line poem about the moon.",
    "What are the main causes of the French Revolution?",
    "Explain recursion to a ten-year-old.",
    "What is a good way to learn a new language?",
    "List four fruits that are high in vitamin C.",
    "How does a bicycle stay upright?",
    "Write an email asking my manager for a day off on Friday.",
    "What is the difference between a virus and a bacterium?",
    "Give me a short motivational quote for a Monday morning.",
    "How do vaccines work?",
    "What is the Pythagorean theorem? Give an example.",
)
CHAT_EVAL = (
    "What is the capital of Australia, and why is it not Sydney?",
    "Give me a simple recipe for pancakes.",
    "How does a refrigerator keep food cold?",
    "Write a haiku about autumn leaves.",
    "Why do we have leap years?",
    "Suggest three games to play at a child's birthday party.",
)
# More chat calibration: topics x kinds of request, a fixed sample (GPTQ needs thousands of calibration tokens;
# see texts below the table in the page's notes).
_TOPICS = ("volcanoes", "the Roman Empire", "honey bees", "electric cars", "the printing press", "sleep", "chess",
           "glaciers", "jazz music", "the human heart", "gardening", "trains", "dinosaurs", "the ocean tides",
           "robots", "bread baking")
_KINDS = ("Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
          "Write a short story about {t}.", "What is a common misconception about {t}?",
          "How would you teach a child about {t}?", "Write a Python function related to {t}, with comments.")
CHAT_CALIBRATION = CHAT_CALIBRATION + tuple(
    k.format(t=t) for k, t in random.Random(0).sample([(k, t) for k in _KINDS for t in _TOPICS], 48))

# Prose calibration: the corpus paragraphs, and openings of ordinary text that the full model continues
# without the chat template (so plain written English, not answers), as much of it as the chat set has.
PROSE_CALIBRATION = CORPUS
PROSE_OPENINGS = tuple(k.format(t=t) for t in _TOPICS for k in (
    "A short article about {t}.\n\n", "Notes from a lecture on {t}.\n\n", "A page from a textbook about {t}.\n\n",
    "A letter to a friend describing {t}.\n\n"))
PROSE_EVAL = (
    "The kettle had been whistling for a full minute before anyone noticed. In the next room the children were "
    "arguing about a board game, and their grandmother was trying to remember where she had put her glasses. "
    "Outside, the first snow of the year was settling on the fence posts, and the dog stood at the window, "
    "watching it fall with great suspicion. When the tea was finally poured, everyone agreed it was too strong. "
    "Glaciers move slowly, but they move. A valley glacier flows downhill under its own weight, grinding the "
    "rock beneath it into fine powder and carrying boulders the size of houses for many kilometres. When the "
    "climate warms, the glacier's front retreats and leaves behind the rocks it carried, scattered over the land."
)

# Each chat answer is the reference model's greedy continuation, at most this long.
CHAT_ANSWER_TOKENS = 48
PROSE_CONTINUATION_TOKENS = 48
WINDOW = 64  # calibration tokens come as windows of this many


def random_token_ids(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """Uniform random token ids: a deliberately poor calibration set (activations nothing like real text's)."""
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(n)]
