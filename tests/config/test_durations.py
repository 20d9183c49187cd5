"""Prometheus-style durations parse exactly, round-trip, and reject everything else."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kvwatch.config import DurationError, format_duration, parse_duration

UNITS = [
    ("y", 31536000.0),
    ("w", 604800.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1d", 86400.0),
        ("2w", 1209600.0),
        ("1m30s500ms", 90.5),
        ("90", 90.0),
        ("1.5", 1.5),
        (" 45s ", 45.0),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_it_parses_durations(text: str | float, seconds: float) -> None:
    """Unit strings and bare numbers (seconds) give the expected seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "must be a duration like 30s, 15m or 1h"),
        ("15 minutes", "must be a duration like 30s, 15m or 1h"),
        ("30m1h", "must be a duration like 30s, 15m or 1h"),
        ("1h1h", "must be a duration like 30s, 15m or 1h"),
        ("1.5h", "must be a duration like 30s, 15m or 1h"),
        ("-5s", "must be a duration like 30s, 15m or 1h"),
        ("nan", "must be a duration like 30s, 15m or 1h"),
        (True, "must be a duration like 30s, 15m or 1h"),
        (float("inf"), "must be a duration like 30s, 15m or 1h"),
        ("0s", "must be a positive duration like 30s, 15m or 1h"),
        ("0", "must be a positive duration like 30s, 15m or 1h"),
        (-3, "must be a positive duration like 30s, 15m or 1h"),
    ],
)
def test_it_rejects_garbage_zero_and_negative_durations(text: str | float, message: str) -> None:
    """Anything that is not a positive duration raises with a sentence saying what is expected."""
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert str(caught.value) == message


@st.composite
def composed_durations(draw: st.DrawFn) -> tuple[str, float]:
    """A valid duration string built from units in order, and its seconds."""
    chosen = draw(st.lists(st.sampled_from(range(len(UNITS))), min_size=1, unique=True).map(sorted))
    amounts = [draw(st.integers(min_value=1, max_value=10_000)) for _ in chosen]
    text = "".join(f"{amount}{UNITS[i][0]}" for i, amount in zip(chosen, amounts, strict=True))
    return text, sum(amount * UNITS[i][1] for i, amount in zip(chosen, amounts, strict=True))


@given(composed_durations())
def test_composed_durations_parse_to_the_sum_of_their_parts(case: tuple[str, float]) -> None:
    """Any in-order combination of units parses to the sum of its parts."""
    text, seconds = case
    assert parse_duration(text) == pytest.approx(seconds)


@given(st.integers(min_value=1, max_value=10**13))
def test_formatted_durations_parse_back_to_the_same_value(milliseconds: int) -> None:
    """format_duration writes a duration parse_duration reads back exactly (to the ms)."""
    text = format_duration(milliseconds / 1000)
    assert round(parse_duration(text) * 1000) == milliseconds


@given(st.text().filter(lambda s: any(ch not in "0123456789.ywdhms \t\n\r" for ch in s)))
def test_it_never_accepts_text_with_foreign_characters(text: str) -> None:
    """A string with any character outside the duration grammar always raises."""
    with pytest.raises(DurationError):
        parse_duration(text)


@given(composed_durations(), composed_durations())
def test_it_never_accepts_units_out_of_order_or_repeated(
    first: tuple[str, float], second: tuple[str, float]
) -> None:
    """Two valid durations glued so that a unit repeats or comes after a smaller one raise."""
    order = [unit for unit, _ in UNITS]
    last_of_first = re.findall(r"[a-z]+", first[0])[-1]
    first_of_second = re.findall(r"[a-z]+", second[0])[0]
    # Only junctions that break the largest-first, each-once rule are garbage.
    assume(order.index(last_of_first) >= order.index(first_of_second))
    with pytest.raises(DurationError):
        parse_duration(first[0] + second[0])
