"""Calibration: correcting an estimated token count by what the engine itself reports.

Any count that is not the engine's own (``tokenizer: usage``, ``tiktoken:``, ``hf:``) is an
estimate. The engine reports its real count with every answer (``usage.prompt_tokens``) and
with most context-length rejections ("your request has N input tokens"). A
:class:`Calibration` keeps two numbers learnt from those reports: the ratio of the engine's
count to kvwatch's raw estimate, and how far that corrected estimate typically still misses
(its relative error). Planning multiplies by the ratio; the margin a boundary probe keeps and
the slack a verdict allows come from the error, so a verdict drawn from an estimate is judged
as one.

Pure: no I/O. The state is stored per endpoint (see :mod:`kvwatch.store`) so a restart, or a
one-shot ``kvwatch probe``, starts where the last process left off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Before the engine has reported anything the estimate may be far off (four characters per
# token is English on BPE vocabularies; code, CJK text or another vocabulary differ by tens
# of percent): the first boundary probes keep a wide margin until a report arrives.
UNCALIBRATED_ERROR = 0.15
# Weight of a new report in the ratio: a drifting engine is followed within a few probes,
# while one odd prompt cannot swing the next plan alone.
LEARNING_RATE = 0.3
# Weight of a new miss in the typical error: slower, so that a run of lucky probes does not
# shrink the slack below what the next ordinary one needs (it estimates a spread, not a level).
ERROR_LEARNING_RATE = 0.1
# Margin and slack are this many typical errors wide: a miss beyond it is evidence.
ERROR_SPAN = 4.0
# Never trust an estimate closer than this, however well it has done: filler differs per
# probe, and rounding over a long prompt adds up. Measured (bench calibration): after five
# reports the simulator's skewed tokenizers were predicted within 0.1-0.3 %.
MIN_RELATIVE_ERROR = 0.005
MIN_TOLERANCE_TOKENS = 16
# Counting noise grows with the square root of a prompt's size (each filler sentence is
# counted a little differently by two vocabularies): short prompts keep this many times
# sqrt(tokens) of slack, whatever their record. Measured: a 512-token baseline on the
# simulator's 4 %-skewed vocabulary missed by up to 22 tokens.
SQRT_SPAN = 2.0
# A report this far from the estimate is not a counting difference but a finding (a prompt
# swapped for a 1-token placeholder, a cut one): learning from it would hide the next one.
PLAUSIBLE_BAND = (0.5, 2.0)
# Before any report the estimate itself may be that far off (a local vocabulary unlike the
# engine's counts three times as many tokens): only a count no vocabulary explains is ignored.
UNCALIBRATED_BAND = (0.1, 10.0)
_MIN_RATIO, _MAX_RATIO = 0.05, 20.0


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the engine's own counts taught about one estimator on one endpoint."""

    ratio: float = 1.0  # engine tokens per estimated token
    error: float = UNCALIBRATED_ERROR  # typical relative miss of the corrected estimate
    observations: int = 0

    def __post_init__(self) -> None:
        if not _MIN_RATIO <= self.ratio <= _MAX_RATIO or not math.isfinite(self.ratio):
            raise ValueError(f"calibration ratio must be in [{_MIN_RATIO}, {_MAX_RATIO}]")
        if not 0 <= self.error <= 1 or self.observations < 0:
            raise ValueError("calibration error must be in [0, 1], observations >= 0")

    @property
    def calibrated(self) -> bool:
        return self.observations > 0

    def estimate(self, raw: int) -> int:
        """The engine's count predicted from a raw estimate of ``raw`` tokens."""
        if raw <= 0:
            return 0
        return max(1, round(raw * self.ratio))

    def relative_error(self) -> float:
        return max(MIN_RELATIVE_ERROR, self.error)

    def tolerance(self, planned: int) -> int:
        """Tokens a prediction of ``planned`` may miss by without that meaning anything."""
        size = max(0, planned)
        span = max(ERROR_SPAN * self.relative_error() * size, SQRT_SPAN * math.sqrt(size))
        return max(MIN_TOLERANCE_TOKENS, math.ceil(span))

    def learn(self, raw: int, reported: int) -> Calibration:
        """The calibration after the engine counted ``reported`` tokens for a prompt whose
        raw estimate was ``raw``. A report outside :data:`PLAUSIBLE_BAND` is ignored."""
        if raw <= 0 or reported <= 0:
            return self
        predicted = raw * self.ratio
        low, high = PLAUSIBLE_BAND if self.calibrated else UNCALIBRATED_BAND
        if not low <= reported / predicted <= high:
            return self
        measured = reported / raw
        miss = abs(reported - predicted) / reported
        if self.observations == 0:
            # The first report replaces the prior guess; its miss says nothing about how
            # well the corrected estimate will do, so the error starts from the floor.
            ratio, error = measured, MIN_RELATIVE_ERROR * 2
        else:
            ratio = (1 - LEARNING_RATE) * self.ratio + LEARNING_RATE * measured
            error = (1 - ERROR_LEARNING_RATE) * self.error + ERROR_LEARNING_RATE * miss
        return Calibration(
            ratio=min(_MAX_RATIO, max(_MIN_RATIO, ratio)),
            error=min(1.0, error),
            observations=self.observations + 1,
        )

    def describe(self) -> str:
        if not self.calibrated:
            return f"uncalibrated (estimates may miss by ±{self.relative_error():.0%})"
        return (
            f"ratio {self.ratio:.4f} from {self.observations} report"
            f"{'s' if self.observations != 1 else ''}, typical miss "
            f"{self.relative_error():.2%}"
        )


# A calibration learnt at another prompt size is trusted less, by this much per octave
# between the sizes: the fixed text of a canary (instruction, marker, question) is tokenized
# at its own density, so its share of the count, and the ratio, change with size. Measured
# on the simulator's skewed vocabularies: a ratio learnt at 1,536 tokens missed an 8,192-token
# prompt by 4.6 % (2.4 octaves).
ERROR_PER_OCTAVE = 0.02


def size_class(tokens: int) -> int:
    """The octave a prompt of ``tokens`` belongs to (calibrations are kept per octave)."""
    return max(0, round(math.log2(max(1, tokens))))


@dataclass(frozen=True, slots=True)
class Calibrations:
    """An endpoint's calibrations, one per prompt size class (octave).

    Under and over probes are near the window and learn its class; the baseline and the
    calibration request learn theirs. A size with no calibration of its own borrows the
    nearest one with its error widened by the distance, so the first boundary probe after
    a short calibration keeps a margin that covers the difference.
    """

    # Bounded: one per octave a prompt can fall in (21 up to a 1M-token window).
    by_class: tuple[tuple[int, Calibration], ...] = ()

    @property
    def calibrated(self) -> bool:
        return any(c.calibrated for _, c in self.by_class)

    def at(self, tokens: int) -> Calibration:
        """The calibration to size and judge a prompt of about ``tokens`` with."""
        wanted = size_class(tokens)
        learnt = [(abs(k - wanted), k, c) for k, c in self.by_class if c.calibrated]
        if not learnt:
            return Calibration()
        distance, _, nearest = min(learnt)
        if distance == 0:
            return nearest
        error = max(nearest.error, min(UNCALIBRATED_ERROR, ERROR_PER_OCTAVE * distance))
        return Calibration(ratio=nearest.ratio, error=error, observations=nearest.observations)

    def learn(self, raw: int, reported: int) -> Calibrations:
        """Learn from one report, in the size class of the prompt it is about."""
        key = size_class(reported)
        current = dict(self.by_class)
        own = current.get(key)
        if own is None:
            # A new class starts from the nearest one's ratio (its best guess) but counts
            # nothing: its first own report replaces that ratio. Once any class is learnt, a
            # report far from that guess is a finding, as it would be in a learnt class.
            own = Calibration(ratio=self.at(reported).ratio)
            low, high = PLAUSIBLE_BAND
            if self.calibrated and raw > 0 and not low <= reported / (raw * own.ratio) <= high:
                return self
        learnt = own.learn(raw, reported)
        if learnt == own:
            return self
        current[key] = learnt
        return Calibrations(tuple(sorted(current.items())))
