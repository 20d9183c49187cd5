"""One module per probe kind family, each with one signature (:class:`~kvwatch.probe.job.Prober`).

A new kind is one new module and one line in :data:`PROBERS`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.canary.model import ProbeKind
from kvwatch.probe.job import Prober
from kvwatch.probe.kinds import bisect, boundary, burst, cache, capacity, edge

PROBERS: Mapping[ProbeKind, Prober] = {
    ProbeKind.UNDER: boundary.PROBER,
    ProbeKind.OVER: boundary.PROBER,
    ProbeKind.BASELINE: boundary.PROBER,
    ProbeKind.CAPACITY: capacity.PROBER,
    ProbeKind.EDGE: edge.PROBER,
    ProbeKind.BISECT: bisect.PROBER,
    ProbeKind.BURST: burst.PROBER,
    ProbeKind.CACHE: cache.PROBER,
}
