"""The shared half of every counter whose count is an estimate, not the engine's own.

A subclass says how it estimates (``_raw_prompt``, ``_raw_pieces``); this class corrects the
estimate by the endpoint's :class:`~kvwatch.tokens.calibration.Calibration` and learns from
every count the engine reports (``observe``). Planning then sizes prompts in the engine's
tokens as well as the estimator allows, and ``tolerance`` says how well that is.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from kvwatch.canary.model import Message
from kvwatch.tokens.calibration import Calibration

# Plans whose raw estimate is remembered until the engine reports on them: a few probes of
# one endpoint are in flight at once at most, so this bounds memory, not accuracy.
_REMEMBERED_PLANS = 64


class EstimatingCounter:
    source: str
    exact = False

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = calibration or Calibration()
        # The runner's: the stored calibration was read (once per process), and one
        # calibration request at a time.
        self.restored = False
        self.lock = asyncio.Lock()
        # corrected count -> raw estimate behind it, for the report that comes back later.
        self._raw_of: OrderedDict[int, int] = OrderedDict()

    async def _raw_prompt(self, messages: Sequence[Message]) -> int:
        raise NotImplementedError

    async def _raw_pieces(self, pieces: Sequence[str]) -> list[int]:
        raise NotImplementedError

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        raw = await self._raw_prompt(messages)
        planned = self.calibration.estimate(raw)
        self._raw_of[planned] = raw
        self._raw_of.move_to_end(planned)
        while len(self._raw_of) > _REMEMBERED_PLANS:
            self._raw_of.popitem(last=False)
        return planned

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        estimate = self.calibration.estimate
        return [estimate(n) for n in await self._raw_pieces(pieces)]

    def tolerance(self, planned: int) -> int:
        return self.calibration.tolerance(planned)

    def observe(self, planned: int, reported: int) -> None:
        """Learn from the engine's count of a prompt this counter planned at ``planned``."""
        raw = self._raw_of.get(planned)
        if raw is None:  # a plan this counter did not make (or long forgotten): invert it
            raw = max(1, round(planned / self.calibration.ratio))
        self.calibration = self.calibration.learn(raw, reported)
