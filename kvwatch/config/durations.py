"""Prometheus-style durations: ``500ms``, ``30s``, ``15m``, ``1h30m``, ``1d``, ``2w``, ``1y``.

Units must come largest first and at most once each, as in Prometheus, so ``30m1h`` is
rejected rather than silently read. A bare number means seconds, which keeps environment
expansion (``interval: ${PROBE_SECONDS}``) usable.
"""

from __future__ import annotations

import math
import re

# Largest first: the order units must appear in, and the order format_duration uses.
_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)

_DURATION = re.compile("".join(rf"(?:(?P<{unit}>\d+){unit})?" for unit, _ in _UNITS))
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")

DURATION_HINT = "must be a duration like 30s, 15m or 1h"


class DurationError(ValueError):
    """A duration that cannot be read; ``str()`` is a sentence for a config error."""


def parse_duration(text: str | float) -> float:
    """Seconds in ``text``; raises :class:`DurationError` unless it is a positive duration."""
    if isinstance(text, bool):
        # bool is an int subclass: "interval: true" is a mistake, not one second.
        raise DurationError(DURATION_HINT)
    if isinstance(text, int | float):
        seconds = float(text)
    elif isinstance(text, str):
        seconds = _parse_text(text.strip())
    else:
        raise DurationError(DURATION_HINT)
    if not math.isfinite(seconds):
        raise DurationError(DURATION_HINT)
    if seconds <= 0:
        raise DurationError("must be a positive duration like 30s, 15m or 1h")
    return seconds


def _parse_text(text: str) -> float:
    if _BARE_NUMBER.fullmatch(text):
        return float(text)
    match = _DURATION.fullmatch(text)
    # The all-optional pattern also matches "", which is not a duration.
    if not text or match is None:
        raise DurationError(DURATION_HINT)
    return sum(
        int(amount) * factor
        for (unit, factor) in _UNITS
        if (amount := match.group(unit)) is not None
    )


def format_duration(seconds: float) -> str:
    """The shortest Prometheus-style spelling of ``seconds`` (rounded to milliseconds)."""
    remaining = round(seconds * 1000)
    if remaining <= 0:
        return "0s"
    parts: list[str] = []
    for unit, factor in _UNITS:
        unit_ms = round(factor * 1000)
        amount, remaining = divmod(remaining, unit_ms)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)
