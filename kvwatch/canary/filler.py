"""Filler text for canary prompts: natural-ish, different for every probe, cheap to size.

Filler is a list of *pieces* (a word with its leading space, or a full stop). Each distinct
piece is counted by the target's tokenizer once per endpoint, so a prompt of any size is
sized by adding up known counts instead of tokenizing growing texts again and again.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_DETERMINERS = ("the", "a", "every", "one", "that", "this", "some", "each")
_ADJECTIVES = (
    "quiet",
    "old",
    "green",
    "narrow",
    "bright",
    "heavy",
    "small",
    "distant",
    "warm",
    "pale",
    "careful",
    "hidden",
    "simple",
    "early",
    "gentle",
    "broken",
    "open",
    "silver",
    "busy",
    "patient",
    "sudden",
    "wooden",
    "steady",
    "humble",
    "clever",
    "rough",
    "golden",
    "plain",
)
_NOUNS = (
    "river",
    "lantern",
    "market",
    "garden",
    "teacher",
    "harbor",
    "window",
    "letter",
    "village",
    "engine",
    "painter",
    "bridge",
    "forest",
    "kitchen",
    "library",
    "farmer",
    "station",
    "valley",
    "signal",
    "captain",
    "orchard",
    "stone",
    "mirror",
    "basket",
    "ladder",
    "candle",
    "meadow",
    "tower",
    "wagon",
    "island",
    "compass",
    "blanket",
    "violin",
    "shelter",
    "notebook",
    "kettle",
)
_VERBS = (
    "carries",
    "watches",
    "follows",
    "finds",
    "paints",
    "repairs",
    "visits",
    "answers",
    "crosses",
    "gathers",
    "describes",
    "remembers",
    "measures",
    "borrows",
    "protects",
    "greets",
    "builds",
    "counts",
    "sorts",
    "lifts",
    "passes",
    "keeps",
    "opens",
    "fills",
)
_PREPOSITIONS = ("near", "behind", "past", "under", "beside", "across", "toward", "around")
_ADVERBS = ("slowly", "again", "today", "often", "quietly", "later", "early", "rarely")

FULL_STOP = "."


def vocabulary() -> tuple[str, ...]:
    """Every piece the generator can emit (the set whose token counts are cached)."""
    words = {
        *_DETERMINERS,
        *_ADJECTIVES,
        *_NOUNS,
        *_VERBS,
        *_PREPOSITIONS,
        *_ADVERBS,
        *(w.capitalize() for w in _DETERMINERS),
    }
    return (*sorted(" " + w for w in words), FULL_STOP)


def sentences(rng: random.Random) -> Iterator[list[str]]:
    """An endless stream of sentences, each a list of pieces ending with a full stop."""
    while True:
        det = rng.choice(_DETERMINERS)
        pieces = [
            " " + det.capitalize(),
            " " + rng.choice(_ADJECTIVES),
            " " + rng.choice(_NOUNS),
            " " + rng.choice(_VERBS),
            " " + rng.choice(_DETERMINERS),
            " " + rng.choice(_NOUNS),
        ]
        if rng.random() < 0.5:
            pieces += [" " + rng.choice(_PREPOSITIONS), " the", " " + rng.choice(_NOUNS)]
        if rng.random() < 0.3:
            pieces.append(" " + rng.choice(_ADVERBS))
        pieces.append(FULL_STOP)
        yield pieces
