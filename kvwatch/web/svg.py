"""Inline SVG charts for the endpoint page: pure functions from time buckets to markup.

No JavaScript charting library and no CDN: the server draws the chart once, the browser only
styles it (colours come from the ``t-*`` classes in static/kvwatch.css).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from markupsafe import Markup, escape

from kvwatch.web.tones import tone, worst

WIDTH, HEIGHT = 960, 200
LEFT, RIGHT, TOP = 64, 950, 12
PLOT_BOTTOM = 148  # bars grow up from here
STRIP_TOP, STRIP_HEIGHT = 156, 12


class Slice(Protocol):
    """One time bucket (kvwatch.store.queries.Bucket has this shape)."""

    @property
    def index(self) -> int: ...
    @property
    def start(self) -> datetime: ...
    @property
    def verdicts(self) -> Mapping[str, int]: ...
    @property
    def max_duration_seconds(self) -> float | None: ...
    @property
    def planned_prompt_tokens(self) -> int | None: ...
    @property
    def reported_prompt_tokens(self) -> int | None: ...


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def _frame(title: str, body: list[str], since: datetime, until: datetime) -> Markup:
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="{LEFT}" y1="{PLOT_BOTTOM}" x2="{RIGHT}" y2="{PLOT_BOTTOM}"/>',
        *body,
        f'<text class="label" x="{LEFT}" y="{HEIGHT - 8}">{escape(_time(since))}</text>',
        f'<text class="label" x="{RIGHT}" y="{HEIGHT - 8}" text-anchor="end">'
        f"{escape(_time(until))}</text>",
        "</svg>",
    ]
    return Markup("".join(parts))


def timeline(slices: Sequence[Slice], buckets: int, since: datetime, until: datetime) -> Markup:
    """Bars of the slowest probe per bucket over a strip of the worst verdict per bucket."""
    step = (RIGHT - LEFT) / buckets
    longest = max((s.max_duration_seconds or 0.0 for s in slices), default=0.0)
    body = [
        f'<text class="label" x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">'
        f"{escape(_seconds(longest))}</text>",
        f'<text class="label" x="{LEFT - 6}" y="{PLOT_BOTTOM}" text-anchor="end">0</text>',
    ]
    for s in slices:
        colour = worst(tone(v) for v in s.verdicts)
        counts = ", ".join(f"{v} {n}" for v, n in s.verdicts.items())
        tip = f"{_time(s.start)}: {counts}"
        x = LEFT + s.index * step
        width = max(step - 1, 1)
        if s.max_duration_seconds is not None and longest > 0:
            tip += f"; slowest {_seconds(s.max_duration_seconds)}"
            h = max((s.max_duration_seconds / longest) * (PLOT_BOTTOM - TOP), 1)
            body.append(
                f'<rect class="bar t-{colour}" x="{x:.1f}" y="{PLOT_BOTTOM - h:.1f}" '
                f'width="{width:.1f}" height="{h:.1f}"><title>{escape(tip)}</title></rect>'
            )
        body.append(
            f'<rect class="cell t-{colour}" data-tone="{colour}" x="{x:.1f}" y="{STRIP_TOP}" '
            f'width="{width:.1f}" height="{STRIP_HEIGHT}"><title>{escape(tip)}</title></rect>'
        )
    return _frame("verdicts and slowest probe duration over time", body, since, until)


def tokens(slices: Sequence[Slice], buckets: int, since: datetime, until: datetime) -> Markup:
    """Planned vs reported prompt tokens of under probes; a reported dip marks truncation."""
    step = (RIGHT - LEFT) / buckets
    points = [s for s in slices if s.planned_prompt_tokens is not None]
    top = max(
        (max(s.planned_prompt_tokens or 0, s.reported_prompt_tokens or 0) for s in points),
        default=0,
    )
    body = [
        f'<text class="label" x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{top:,}</text>',
        f'<text class="label" x="{LEFT - 6}" y="{PLOT_BOTTOM}" text-anchor="end">0</text>',
        f'<text class="legend planned" x="{RIGHT}" y="{TOP + 4}" text-anchor="end">planned</text>',
        f'<text class="legend reported" x="{RIGHT}" y="{TOP + 18}" text-anchor="end">'
        "reported</text>",
    ]

    def y(value: int) -> float:
        return PLOT_BOTTOM - (value / top) * (PLOT_BOTTOM - TOP) if top else PLOT_BOTTOM

    def x(s: Slice) -> float:
        return LEFT + (s.index + 0.5) * step

    planned = " ".join(f"{x(s):.1f},{y(s.planned_prompt_tokens or 0):.1f}" for s in points)
    reported_points = [s for s in points if s.reported_prompt_tokens is not None]
    reported = " ".join(
        f"{x(s):.1f},{y(s.reported_prompt_tokens or 0):.1f}" for s in reported_points
    )
    if planned:
        body.append(f'<polyline class="line planned" points="{planned}"/>')
    if reported:
        body.append(f'<polyline class="line reported" points="{reported}"/>')
    for s in points:
        body.append(
            f'<circle class="dot planned" cx="{x(s):.1f}" '
            f'cy="{y(s.planned_prompt_tokens or 0):.1f}" r="2"/>'
        )
    for s in reported_points:
        short = (s.reported_prompt_tokens or 0) < (s.planned_prompt_tokens or 0)
        tip = (
            f"{_time(s.start)}: planned {s.planned_prompt_tokens:,}, "
            f"reported {s.reported_prompt_tokens:,}"
        )
        body.append(
            f'<circle class="dot {"t-critical" if short else "reported"}" cx="{x(s):.1f}" '
            f'cy="{y(s.reported_prompt_tokens or 0):.1f}" r="{4 if short else 2}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    return _frame("planned vs reported prompt tokens (under probes)", body, since, until)
