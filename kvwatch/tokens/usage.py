"""Calibration from reported usage: for endpoints with no tokenizer kvwatch can use.

Tokens are estimated from characters with a chars-per-token ratio, starting at 4.0 (English
text on most BPE vocabularies) and learnt from the ``usage.prompt_tokens`` each probe reports:
the counter remembers how many characters it estimated for a planned size, and when the
engine reports the real count for that prompt, the ratio moves toward characters/reported.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from kvwatch.canary.model import Message

INITIAL_CHARS_PER_TOKEN = 4.0
# A chat template costs a few tokens per message whatever the text; estimated, not learnt.
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_FIXED = 3
# Weight of a new observation: fast enough to converge in a few probes, slow enough that one
# odd prompt does not swing the next plan.
LEARNING_RATE = 0.5
# A report this far from the plan is not a calibration signal but a finding (a truncated or
# swapped prompt: stale_kv reports 1 token). Learning from it would hide the next one.
PLAUSIBLE_BAND = (0.5, 2.0)
_MIN_RATIO, _MAX_RATIO = 0.5, 32.0
_REMEMBERED_PLANS = 256


class UsageCalibratedCounter:
    source = "usage"
    exact = False

    def __init__(self, chars_per_token: float = INITIAL_CHARS_PER_TOKEN) -> None:
        if not _MIN_RATIO <= chars_per_token <= _MAX_RATIO:
            raise ValueError(f"chars_per_token must be in [{_MIN_RATIO}, {_MAX_RATIO}]")
        self.chars_per_token = chars_per_token
        self.observations = 0
        # planned tokens -> (content characters, template tokens) of the estimate behind it.
        self._plans: OrderedDict[int, tuple[int, int]] = OrderedDict()

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        chars = sum(len(m.content) for m in messages)
        template = TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
        planned = self._tokens(chars) + template
        self._plans[planned] = (chars, template)
        self._plans.move_to_end(planned)
        while len(self._plans) > _REMEMBERED_PLANS:
            self._plans.popitem(last=False)
        return planned

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        return [self._tokens(len(piece)) for piece in pieces]

    def tolerance(self, planned: int) -> int:
        return max(16, math.ceil(planned / 100))

    def observe(self, planned: int, reported: int) -> None:
        """Correct the ratio by what the engine reported for a prompt planned at ``planned``."""
        if planned <= 0 or reported <= 0:
            return
        low, high = PLAUSIBLE_BAND
        if not low <= reported / planned <= high:
            return
        chars, template = self._plans.get(planned, (0, 0))
        content_tokens = reported - template
        if chars > 0 and content_tokens > 0:
            measured = chars / content_tokens
        else:
            # A plan this counter did not make: scale the ratio by planned/reported.
            measured = self.chars_per_token * planned / reported
        if self.observations == 0:
            ratio = measured
        else:
            ratio = (1 - LEARNING_RATE) * self.chars_per_token + LEARNING_RATE * measured
        self.chars_per_token = min(_MAX_RATIO, max(_MIN_RATIO, ratio))
        self.observations += 1

    def _tokens(self, chars: int) -> int:
        if chars <= 0:
            return 0
        return max(1, round(chars / self.chars_per_token))
