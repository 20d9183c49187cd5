"""Alert states, written in the same transaction as the result that changed them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from kvwatch.store.base import StoreBase
from kvwatch.store.models import (
    AlertState,
)
from kvwatch.store.records import (
    AlertStateRecord,
)
from kvwatch.store.statements import upsert_once

_ALERT_KEY = ("alertname", "endpoint", "probe", "region")


class AlertStates(StoreBase):
    def load_alert_states(self) -> list[AlertStateRecord]:
        """Every persisted alert state of this region, in a stable order."""
        query = (
            select(AlertState)
            .where(AlertState.region == self._region_key)
            .order_by(AlertState.alertname, AlertState.endpoint, AlertState.probe)
        )
        with self._errors("could not load alert states"), self._sessions() as s:
            return [_alert_record(row) for row in s.scalars(query)]

    def listed_alert_states(self, resolved_since: datetime) -> list[AlertStateRecord]:
        """This region's firing and pending alerts, and those resolved at or after
        ``resolved_since``: what the alerts page and API list. Filtered by the database: a
        row stays for every (alert, endpoint, probe) that ever alerted, retired endpoints'
        included, and a page view should not build them all (issue 25)."""
        resolved_at = func.coalesce(AlertState.ends_at, AlertState.updated_at)
        query = select(AlertState).where(
            AlertState.region == self._region_key,
            or_(
                AlertState.state.in_(("firing", "pending")),
                and_(AlertState.state == "resolved", resolved_at >= resolved_since),
            ),
        )
        with self._errors("could not load alert states"), self._sessions() as s:
            return [_alert_record(row) for row in s.scalars(query)]

    def save_alert_states(self, records: Sequence[AlertStateRecord]) -> None:
        """Insert or update the given alert states of this region (others are left as they
        are)."""
        with self._errors("could not save alert states"), self._write() as s:
            self._upsert_alert_states(s, records)

    def _upsert_alert_states(self, session: Session, records: Sequence[AlertStateRecord]) -> None:
        # Last record per key wins: PostgreSQL refuses to touch one row twice in a statement.
        latest = {(r.alertname, r.endpoint, r.probe): r for r in records}
        if not latest:
            return
        rows = [{**_alert_values(r), "region": self._region_key} for r in latest.values()]
        # Runs with every result of a failing or recovering endpoint (each moves its counts):
        # built once per dialect.
        dialect = session.get_bind().dialect.name
        session.execute(upsert_once(AlertState, dialect, _ALERT_KEY, tuple(rows[0])), rows)


def _alert_values(r: AlertStateRecord) -> dict[str, Any]:
    return {
        "alertname": r.alertname,
        "endpoint": r.endpoint,
        "probe": r.probe,
        "state": r.state,
        "severity": r.severity,
        "failures": r.failures,
        "passes": r.passes,
        "starts_at": r.starts_at,
        "ends_at": r.ends_at,
        "last_probe_id": r.last_probe_id,
        "labels": dict(r.labels),
        "annotations": dict(r.annotations),
        "generator_url": r.generator_url,
        "updated_at": r.updated_at,
    }


def _alert_record(row: AlertState) -> AlertStateRecord:
    return AlertStateRecord(
        alertname=row.alertname,
        endpoint=row.endpoint,
        probe=row.probe,
        state=row.state,
        severity=row.severity,
        failures=row.failures,
        passes=row.passes,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        last_probe_id=row.last_probe_id,
        labels={str(k): str(v) for k, v in row.labels.items()},
        annotations={str(k): str(v) for k, v in row.annotations.items()},
        generator_url=row.generator_url,
        updated_at=row.updated_at,
    )
