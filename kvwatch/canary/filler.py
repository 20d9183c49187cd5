"""Filler text for canary prompts: natural-ish, different for every probe, cheap to size.

Filler is a list of *pieces* (a word with its leading space, or a full stop). Each distinct
piece is counted by the target's tokenizer once per endpoint, so a prompt of any size is
sized by adding up known counts instead of tokenizing growing texts again and again.

A planner draws whole sentences from :func:`sentence_pool` rather than generating them word
by word: a draw is one C-level ``choices`` call instead of a dozen ``choice`` calls per
sentence, which was a sixth of kvwatch's CPU per probe at fleet scale (issue 13). Every
probe still gets its own order of sentences, so two prompts share no stretch of filler
longer than a sentence (shorter than one KV-cache block of the engines we know).
"""

from __future__ import annotations

import functools
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
# Distinct sentences a planner draws from. 4,096 keep any two probes' filler apart (the
# chance that two prompts open with the same two sentences is one in sixteen million).
POOL_SIZE = 4096


@functools.cache  # no arguments: one entry
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


@functools.cache  # no arguments: one entry
def sentence_pool() -> tuple[tuple[str, ...], ...]:
    """:data:`POOL_SIZE` sentences, each as its pieces, the same in every process (a fixed
    seed: a probe's randomness is in which sentences it draws and in what order)."""
    stream = sentences(random.Random(0x4B5657))
    return tuple(tuple(next(stream)) for _ in range(POOL_SIZE))
