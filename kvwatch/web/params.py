"""Reading times and windows from query strings and command lines, with exact messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.config import DurationError, parse_duration

# The endpoint page's ranges, in the order its selector shows them.
RANGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
# Summaries read every duration in their window; beyond this they stop being cheap.
MAX_WINDOW = timedelta(days=90)


class ParamError(ValueError):
    """A parameter that cannot be used; ``str()`` is the sentence to show the user."""


def to_utc(value: datetime, name: str) -> datetime:
    """``value`` in UTC; a naive value is refused (its zone would be a guess)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ParamError(f"{name} needs a timezone, e.g. 2026-03-01T12:00:00Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ParamError(f"{name} is out of range") from None


def parse_time(text: str, name: str, now: datetime) -> datetime:
    """A point in time: an ISO 8601 timestamp (naive means UTC) or a duration ago (``24h``)."""
    text = text.strip()
    try:
        seconds = parse_duration(text)
    except DurationError:
        pass
    else:
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise ParamError(f"{name} {text!r} reaches too far back") from None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ParamError(
            f"{name} {text!r} is neither a duration (e.g. 24h) nor an ISO 8601 time "
            "(e.g. 2026-03-01T12:00:00Z)"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return to_utc(value, name)


def parse_window(text: str, name: str = "window") -> timedelta:
    """A look-back window such as ``24h``, at most :data:`MAX_WINDOW`."""
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise ParamError(f"{name} {text!r}: {exc}") from None
    if seconds > MAX_WINDOW.total_seconds():
        raise ParamError(f"{name} {text!r} is longer than the maximum of 90d")
    if seconds < 1:
        raise ParamError(f"{name} {text!r} is shorter than one second")
    return timedelta(seconds=seconds)


def window_start(until: datetime, window: timedelta, name: str = "window") -> datetime:
    try:
        return until - window
    except OverflowError:
        raise ParamError(f"{name} reaches before the year 1") from None
