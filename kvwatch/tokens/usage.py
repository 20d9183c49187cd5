"""Estimates from characters: for endpoints with no tokenizer kvwatch can use.

Four characters per token (English text on most BPE vocabularies) plus a few tokens of chat
template per message is the raw estimate; the endpoint's calibration corrects it by the
``usage.prompt_tokens`` each probe reports (:mod:`kvwatch.tokens.calibration`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvwatch.canary.model import Message
from kvwatch.tokens.calibration import Calibrations
from kvwatch.tokens.estimate import EstimatingCounter

# English text on most BPE vocabularies; the calibration corrects it for the engine's own.
CHARS_PER_TOKEN = 4.0
# A chat template costs a few tokens per message whatever the text; estimated, then
# corrected with the rest by the calibration.
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_FIXED = 3


class UsageCalibratedCounter(EstimatingCounter):
    source = "usage"

    def __init__(self, calibrations: Calibrations | None = None) -> None:
        super().__init__(calibrations)

    async def _raw_prompt(self, messages: Sequence[Message]) -> int:
        chars = sum(len(m.content) for m in messages)
        return _tokens(chars) + TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)

    async def _raw_pieces(self, pieces: Sequence[str]) -> list[int]:
        return [_tokens(len(piece)) for piece in pieces]


def _tokens(chars: int) -> int:
    if chars <= 0:
        return 0
    return max(1, round(chars / CHARS_PER_TOKEN))
