"""The prompt the KV compression page and bench share: a note whose answer sits in its first sentence, so a
cache that lost the early tokens (eviction) or garbled them (too few bits) shows it in the answer."""
from __future__ import annotations

RETRIEVAL_NOTE = (
    "Read the note below and answer the question at the end.\n\n"
    "Note: The museum's storage room code is 4718. Maria Alvarez, the night guard, started working at the museum "
    "in 2019. She walks through the east wing every hour, checks the windows of the sculpture hall, and writes "
    "what she sees in a blue notebook. The east wing holds paintings from the seventeenth century, mostly Dutch "
    "landscapes with wide skies and small figures. On rainy nights the roof above the staircase leaks, and Maria "
    "puts a bucket under the drip. The director, Tomas Berg, wants to move the landscapes to the west wing next "
    "spring, because the light there is softer and the walls are drier. The west wing currently holds a "
    "collection of old maps, which will be moved to the library. Visitors often ask Maria about the maps, "
    "especially the one that shows the coast before the harbour was built. She tells them the harbour was "
    "finished in 1862 and changed the town completely. The café on the ground floor closes at five, and the gift "
    "shop sells postcards of the landscapes. Every Friday the museum stays open until nine, and a string quartet "
    "plays in the main hall.\n\n"
    "Question: What is the storage room code, and who is the night guard?")
RETRIEVAL_ANSWER = "4718"
RETRIEVAL_GUARD = "Maria"
