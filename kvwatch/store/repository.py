"""The store: every read and write kvwatch makes, as short synchronous transactions.

Split by what it keeps: probes and their markers (:mod:`~kvwatch.store.probes`), slot claims
(:mod:`~kvwatch.store.slots`), alert states (:mod:`~kvwatch.store.alert_states`), served
windows (:mod:`~kvwatch.store.served_windows`), endpoint changes
(:mod:`~kvwatch.store.changes`), token calibrations
(:mod:`~kvwatch.store.calibrations`) and hourly rollups (:mod:`~kvwatch.store.rollups`), over
one engine and one way of writing (:mod:`~kvwatch.store.base`), so a probe's writes still go
in one transaction.
"""

from __future__ import annotations

from kvwatch.store.base import WriteOp
from kvwatch.store.calibrations import TokenCalibrations
from kvwatch.store.changes import EndpointChanges
from kvwatch.store.probes import ProbeRecords
from kvwatch.store.served_windows import ServedWindows

__all__ = ["Store", "WriteOp"]


class Store(ProbeRecords, ServedWindows, TokenCalibrations, EndpointChanges):
    """kvwatch's database, behind one small synchronous API.

    ``region`` (multi-region mode) is the region this kvwatch runs in: it is stamped on the
    probes written here, and slot claims and alert states are kept per region, so every
    region runs every slot and pages on its own. Without it everything is as if there were
    one region (stored as NULL on probes, "" in keys). Reads of history see every region.
    """
