"""One interface for every way of counting a target's tokens (DESIGN §3).

Defined in the pure core because planning sizes prompts through it; the counters themselves
(server tokenize, estimates) live in :mod:`kvwatch.tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvwatch.canary.model import Message


class TokenCounter(Protocol):
    # "server", "usage", "tiktoken:<encoding>", "hf:<path>": stored with each probe.
    source: str
    # True when count_prompt is the target's own count of the templated prompt; False when it
    # is an estimate (then planning keeps a margin and verdicts a tolerance).
    exact: bool

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        """Prompt tokens of ``messages`` as the target will count them (template included)."""
        ...

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        """Tokens of each raw piece of text (no template); used to size filler."""
        ...

    def tolerance(self, planned: int) -> int:
        """Slack allowed between planned and reported prompt tokens."""
        ...

    def observe(self, planned: int, reported: int) -> None:
        """Learn from a probe's reported usage (calibration). Exact counters ignore it."""
        ...
