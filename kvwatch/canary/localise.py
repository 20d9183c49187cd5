"""Where the prompt was lost (issue 12): pure logic over one marker per depth.

A prompt that carries a marker at several depths shows, by which markers the answer recalls,
which part of the prompt the engine actually read. A head-truncating engine loses the
shallow markers and keeps the deep ones; a tail-truncating one the reverse; a recall that
misses only inner markers lost the middle. The reported prompt tokens, when the engine owns
up to reading fewer than were sent, say how much it kept; otherwise the depths of the last
lost and first kept markers bound it.

Positions are estimated as ``depth × planned tokens``: the fixed text around the filler is a
few dozen tokens, so at any window worth probing the estimate is good to a fraction of a
percent, which is what the "~" in a reason promises.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.canary.model import DepthOutcome, DepthResult, ForeignMarker, Placement
from kvwatch.canary.scan import AnswerScan, scan_answer


class Lost(enum.StrEnum):
    NONE = "none"
    HEAD = "head"
    TAIL = "tail"
    MIDDLE = "middle"
    ALL = "all"
    # Lost markers with recalled ones between them: no single part of the prompt is gone
    # (a model that recalls some codes and not others, or attention over the wrong pages).
    SCATTERED = "scattered"


@dataclass(frozen=True, slots=True)
class Localisation:
    lost: Lost
    sentence: str  # the plain statement a verdict's reason carries
    # The lost stretch as fractions of the prompt (start, end), estimated: from usage when
    # the engine reported the cut, else halfway between the last lost and first kept marker.
    # None when nothing or no single stretch was lost.
    span: tuple[float, float] | None = None


def outcomes(
    placements: Sequence[Placement], answer: str | None, foreign: Sequence[ForeignMarker]
) -> list[DepthResult]:
    """Each placement's outcome in ``answer``, shallowest first."""
    return outcomes_in(placements, scan_answer(answer, (), foreign))


def outcomes_in(placements: Sequence[Placement], scan: AnswerScan) -> list[DepthResult]:
    """Each placement's outcome in an answer already scanned, shallowest first."""
    lost_to = DepthOutcome.FOREIGN if scan.foreign else DepthOutcome.MISSING
    return [
        DepthResult(
            depth=p.depth,
            marker=p.marker,
            outcome=DepthOutcome.FOUND if scan.recalled(p.marker) else lost_to,
        )
        for p in sorted(placements, key=lambda p: p.depth)
    ]


def classify(results: Sequence[DepthResult]) -> Lost:
    """Which part of the prompt the lost markers form."""
    lost = [i for i, r in enumerate(results) if r.outcome is not DepthOutcome.FOUND]
    if not lost:
        return Lost.NONE
    if len(lost) == len(results):
        return Lost.ALL
    if lost != list(range(lost[0], lost[-1] + 1)):
        return Lost.SCATTERED
    if lost[0] == 0:
        return Lost.HEAD
    if lost[-1] == len(results) - 1:
        return Lost.TAIL
    return Lost.MIDDLE


def localise(results: Sequence[DepthResult], *, planned: int, reported: int | None) -> Localisation:
    """Name the lost part and estimate what the engine kept, in one sentence.

    ``planned`` and ``reported`` are the prompt tokens sent and the engine's usage; a
    ``reported`` below ``planned`` is taken as what the engine read.
    """
    results = sorted(results, key=lambda r: r.depth)
    lost = classify(results)
    listing = _listing(results)
    read = reported if reported is not None and reported < planned else None
    lost_depths = [r.depth for r in results if r.outcome is not DepthOutcome.FOUND]
    kept_depths = [r.depth for r in results if r.outcome is DepthOutcome.FOUND]
    share = None if read is None or planned <= 0 else read / planned
    if lost is Lost.NONE:
        return Localisation(lost, f"nothing lost ({listing})")
    if lost is Lost.ALL:
        tail = f": the engine read {_n(read)} of {_n(planned)} tokens" if read is not None else ""
        return Localisation(lost, f"all lost ({listing}){tail}", (0.0, 1.0))
    if lost is Lost.SCATTERED:
        return Localisation(
            lost, f"scattered loss ({listing}): no single part of the prompt is missing"
        )
    if lost is Lost.HEAD:
        # The kept part runs from somewhere after the last lost marker to the end.
        kept = _span(planned * (1 - kept_depths[0]), planned * (1 - lost_depths[-1]), read)
        cut = 1 - share if share is not None else (lost_depths[-1] + kept_depths[0]) / 2
        return Localisation(
            lost, f"head lost ({listing}): the engine kept the last {kept}", (0.0, cut)
        )
    if lost is Lost.TAIL:
        kept = _span(planned * kept_depths[-1], planned * lost_depths[0], read)
        cut = share if share is not None else (kept_depths[-1] + lost_depths[0]) / 2
        return Localisation(
            lost, f"tail lost ({listing}): the engine kept the first {kept}", (cut, 1.0)
        )
    before = max(d for d in kept_depths if d < lost_depths[0])
    after = min(d for d in kept_depths if d > lost_depths[-1])
    dropped = (
        f"~{_n(planned - read)} tokens"
        if read is not None
        else f"up to ~{_n(planned * (after - before))} tokens"
    )
    return Localisation(
        lost,
        f"middle lost ({listing}): the engine dropped {dropped} between "
        f"~{_n(planned * before)} and ~{_n(planned * after)}",
        ((before + lost_depths[0]) / 2, (lost_depths[-1] + after) / 2),
    )


def _span(at_least: float, at_most: float, read: int | None) -> str:
    """``~N tokens`` from usage when the engine reported the cut, else the bounds the
    markers give (the cut lies between the last lost and the first kept marker)."""
    if read is not None:
        return f"~{_n(read)} tokens"
    low, high = round(at_least), round(at_most)
    return f"~{_n(low)} tokens" if low == high else f"~{_n(low)}–{_n(high)} tokens"


def _listing(results: Sequence[DepthResult]) -> str:
    """``markers at 0.0, 0.25 missing; 0.75, 1.0 found`` (a foreign one says so)."""
    parts = []
    for outcome in (DepthOutcome.FOREIGN, DepthOutcome.MISSING, DepthOutcome.FOUND):
        depths = [format_depth(r.depth) for r in results if r.outcome is outcome]
        if depths:
            parts.append(f"{', '.join(depths)} {outcome.value}")
    return "markers at " + "; ".join(parts)


def format_depth(depth: float) -> str:
    """0.0, 0.25, 1.0: as configured, never ``0`` or ``1``."""
    return repr(float(depth))


def _n(tokens: float) -> str:
    return f"{max(0, round(tokens)):,}"
