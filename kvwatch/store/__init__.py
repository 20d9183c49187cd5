"""Persistence: probes, issued markers, endpoints and alert states in SQLite or PostgreSQL."""

from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError
from kvwatch.store.records import AlertStateRecord, NewProbe, ProbeOutcome, ProbeRow
from kvwatch.store.repository import Store

__all__ = [
    "AlertStateRecord",
    "NewProbe",
    "ProbeOutcome",
    "ProbeRow",
    "Store",
    "StoreError",
    "create_engine_for",
]
