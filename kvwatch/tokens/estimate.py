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
from kvwatch.tokens.calibration import Calibrations

# Plans whose raw estimate is remembered until the engine reports on them: a few probes of
# one endpoint are in flight at once at most, so this bounds memory, not accuracy.
_REMEMBERED_PLANS = 64


class EstimatingCounter:
    source: str
    exact = False

    def __init__(self, calibrations: Calibrations | None = None) -> None:
        self.calibrations = calibrations or Calibrations()
        # The runner's: the stored calibration was read, a calibration request was sent (each
        # once per process), and one of them at a time.
        self.restored = False
        self.measured = False
        self.lock = asyncio.Lock()
        # corrected count -> raw estimate behind it, for the report that comes back later.
        self._raw_of: OrderedDict[int, int] = OrderedDict()

    async def _raw_prompt(self, messages: Sequence[Message]) -> int:
        raise NotImplementedError

    async def _raw_pieces(self, pieces: Sequence[str]) -> list[int]:
        raise NotImplementedError

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        raw = await self._raw_prompt(messages)
        planned = self._predict(raw)
        self._raw_of[planned] = raw
        self._raw_of.move_to_end(planned)
        while len(self._raw_of) > _REMEMBERED_PLANS:
            self._raw_of.popitem(last=False)
        return planned

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        # Filler pieces are scaled by the calibration of the largest prompts learnt (the
        # window's, where precision matters); the planner's verification corrects the rest.
        learnt = [c for _, c in self.calibrations.by_class if c.calibrated]
        estimate = learnt[-1].estimate if learnt else self.calibrations.at(0).estimate
        return [estimate(n) for n in await self._raw_pieces(pieces)]

    def tolerance(self, planned: int) -> int:
        return self.calibrations.at(planned).tolerance(planned)

    def observe(self, planned: int, reported: int) -> None:
        """Learn from the engine's count of a prompt this counter planned at ``planned``."""
        raw = self._raw_of.get(planned)
        if raw is None:  # a plan this counter did not make (or long forgotten): invert it
            raw = max(1, round(planned / self.calibrations.at(planned).ratio))
        self.calibrations = self.calibrations.learn(raw, reported)

    def _predict(self, raw: int) -> int:
        # The size class is the engine's count, which is what the calibration is kept by.
        rough = self.calibrations.at(raw).estimate(raw)
        return self.calibrations.at(rough).estimate(raw)
