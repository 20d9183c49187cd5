"""The probe page's prompt bar (issue 12): where each marker sat and what became of it.

A pure function from a probe's per-depth evidence to inline SVG, like :mod:`kvwatch.web.svg`:
the prompt is a bar from its first token to the question, each marker a tick at its depth
coloured by its outcome, and the stretch the engine lost (as :mod:`kvwatch.canary.localise`
estimates it) shaded. Every tick carries a ``<title>`` and the bar an ``aria-label`` with
the whole finding, so the picture is never the only place it is said.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from kvwatch.canary.localise import format_depth, localise
from kvwatch.canary.model import DepthOutcome, DepthResult
from kvwatch.store.records import DepthEvidence

WIDTH, HEIGHT = 960, 96
LEFT, RIGHT = 16, 944
BAR_TOP, BAR_HEIGHT = 22, 22
# Outcome -> tone class (colours in static/kvwatch.css); "pending": not judged (no answer).
TONES = {"found": "ok", "missing": "critical", "foreign": "leak", None: "muted"}
LEGEND = (
    ("ok", "found"),
    ("critical", "missing"),
    ("leak", "foreign (another probe's marker answered)"),
    ("lost", "lost part (estimated)"),
)


def depth_bar(depths: Sequence[DepthEvidence], *, planned: int, reported: int | None) -> Markup:
    """The bar for one probe's markers; empty markup for a single-marker probe."""
    if len(depths) < 2:
        return Markup("")
    judged = [
        DepthResult(d.depth, d.marker, DepthOutcome(d.outcome))
        for d in depths
        if d.outcome is not None
    ]
    finding = localise(judged, planned=planned, reported=reported) if judged else None
    summary = finding.sentence if finding else "markers planted; not judged (no answer)"

    def x(fraction: float) -> float:
        return LEFT + fraction * (RIGHT - LEFT)

    body = [
        f'<svg class="chart depth-bar" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" aria-label="{escape(summary)}">',
        f"<title>{escape(summary)}</title>",
        f'<text class="label" x="{LEFT}" y="14">start of prompt</text>',
        f'<text class="label" x="{RIGHT}" y="14" text-anchor="end">question</text>',
        f'<rect class="prompt" x="{LEFT}" y="{BAR_TOP}" width="{RIGHT - LEFT}" '
        f'height="{BAR_HEIGHT}" rx="3"/>',
    ]
    if finding is not None and finding.span is not None:
        start, end = finding.span
        body.append(
            f'<rect class="lost" x="{x(start):.1f}" y="{BAR_TOP}" '
            f'width="{max(x(end) - x(start), 1):.1f}" height="{BAR_HEIGHT}">'
            f"<title>{escape(f'lost ({finding.lost.value}), estimated')}</title></rect>"
        )
    for d in sorted(depths, key=lambda d: d.depth):
        tone = TONES.get(d.outcome, "muted")
        tip = f"marker {d.marker} at depth {format_depth(d.depth)}: {d.outcome or 'not judged'}"
        cx = x(d.depth)
        body.append(
            f'<g class="tick t-{tone}" data-depth="{format_depth(d.depth)}" '
            f'data-outcome="{escape(d.outcome or "pending")}"><title>{escape(tip)}</title>'
            f'<rect x="{cx - 3:.1f}" y="{BAR_TOP - 4}" width="6" height="{BAR_HEIGHT + 8}"/>'
            f'<text class="label" x="{cx:.1f}" y="{BAR_TOP + BAR_HEIGHT + 18}" '
            f'text-anchor="{_anchor(d.depth)}">{format_depth(d.depth)}</text></g>'
        )
    lx = LEFT
    for tone, label in LEGEND:
        body.append(
            f'<rect class="swatch t-{tone}" x="{lx}" y="{HEIGHT - 14}" width="10" height="10"/>'
            f'<text class="legend" x="{lx + 14}" y="{HEIGHT - 5}">{escape(label)}</text>'
        )
        lx += 28 + 6 * len(label)
    body.append("</svg>")
    return Markup("".join(body))


def _anchor(depth: float) -> str:
    # Labels at the ends stay inside the picture.
    return "start" if depth <= 0.02 else "end" if depth >= 0.98 else "middle"
