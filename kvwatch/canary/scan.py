"""One read of an answer: which markers it holds, whose they are. Pure.

An answer is scanned for marker-shaped codes once per probe. The codes that are not the
probe's own are looked up among the issued markers (by the caller: that needs the store) and
the result is attached with :meth:`AnswerScan.resolved`; verdicts, localisation and the
cross-tenant check then read this value instead of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvwatch.canary import markers
from kvwatch.canary.model import ForeignMarker


def cross_tenant_markers(
    foreign: Sequence[ForeignMarker], tenant: str | None
) -> list[ForeignMarker]:
    """The foreign markers issued under a tenant other than ``tenant``.

    Both sides must be named tenants: a marker of kvwatch's own identity (the endpoint's
    ``api_key``), or one seen by it, is a cross-request leak but names no customer.
    """
    if tenant is None:
        return []
    return [f for f in foreign if f.tenant is not None and f.tenant != tenant]


@dataclass(frozen=True, slots=True)
class AnswerScan:
    """The markers an answer holds, read once."""

    answered: bool  # there was an answer to read at all
    seen: tuple[str, ...]  # every marker-shaped code, canonical, first occurrence first
    own: frozenset[str]  # the probe's own markers, canonical
    # Codes of ``seen`` issued to other probes, once looked up (a code nobody issued is the
    # model's invention, not a leak).
    foreign: tuple[ForeignMarker, ...] = ()

    @property
    def unknown(self) -> list[str]:
        """Codes in the answer that are not the probe's own: what to look up."""
        return [m for m in self.seen if m not in self.own]

    def recalled(self, marker: str) -> bool:
        """Whether the answer holds ``marker`` (in any spelling the model may use)."""
        return markers.canonical(marker) in self.seen

    def resolved(self, issued: Mapping[str, ForeignMarker]) -> AnswerScan:
        """This scan with the looked-up foreign markers, in the answer's order."""
        found = tuple(issued[m] for m in self.unknown if m in issued)
        return AnswerScan(self.answered, self.seen, self.own, found)

    def crossed(self, tenant: str | None) -> list[ForeignMarker]:
        """The foreign markers issued under another named tenant than ``tenant``."""
        return cross_tenant_markers(self.foreign, tenant)


def scan_answer(
    answer: str | None, own: Sequence[str], foreign: Sequence[ForeignMarker] = ()
) -> AnswerScan:
    """Read ``answer`` once for markers; ``own``: the markers the probe carried."""
    seen = tuple(markers.markers_in_answer(answer)) if answer else ()
    return AnswerScan(
        answered=answer is not None,
        seen=seen,
        own=frozenset(markers.canonical(m) for m in own),
        foreign=tuple(foreign),
    )
