"""A token counter over the simulator's own tokenizer and chat template, without HTTP.

Used where a test needs an exact counter but is about pure planning, not the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvwatch.canary.model import Message
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat


class SimCounter:
    source = "sim-local"

    def __init__(self, *, exact: bool = True, skew: float = 0.0) -> None:
        self.exact = exact
        self.skew = skew  # an inexact counter's systematic error, as a fraction
        self.prompt_calls = 0

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        self.prompt_calls += 1
        n = tokenizer.count(render_chat(messages))
        return round(n * (1 + self.skew))

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        return [tokenizer.count(p) for p in pieces]

    def tolerance(self, planned: int) -> int:
        return 0 if self.exact else max(16, planned // 100)

    def observe(self, planned: int, reported: int) -> None:
        return None
