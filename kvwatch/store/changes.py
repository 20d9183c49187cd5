"""Endpoint fingerprints and the changes between them (kvwatch.fingerprint decides; this keeps).

A fingerprint is replaced by compare-and-set on its digest, in the transaction that records
the change it shows, so of two replicas that read the same redeploy one records it. The
change's canaries then run through the slot claims (slot ``-change_id``), once across all
replicas; whichever replica finds the change due first claims them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from kvwatch.fingerprint import Change, Seen, digest, observe, run_after
from kvwatch.store.base import StoreBase
from kvwatch.store.models import EndpointChange, EndpointFingerprint, ProbeSlot

# States whose canaries are still to run.
PENDING = ("due", "held")


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    id: int
    endpoint: str
    at: datetime
    reason: str
    before: Mapping[str, str]
    after: Mapping[str, str]
    fields: tuple[str, ...]
    state: str
    due_at: datetime
    ran_at: datetime | None
    replica: str


class EndpointChanges(StoreBase):
    def observe_fingerprint(
        self,
        endpoint: str,
        fields: Mapping[str, str] | None,
        *,
        replica: str,
        min_gap_seconds: float,
        on_change: bool = True,
    ) -> ChangeRecord | None:
        """Record what a capacity check read (``fields``; None: the engine did not answer)
        and return the change it shows, stored with when its canaries may run: at once, or
        when the minimum gap since the endpoint's last change run ends. A change that is
        still waiting for its gap is superseded by the new one (one run covers both)."""
        now = self._now()
        with self._errors("could not record a fingerprint"), self._write() as s:
            row = s.execute(
                select(EndpointFingerprint)
                .where(*self._fingerprint_key(endpoint))
                .with_for_update()
            ).scalar_one_or_none()
            previous = None if row is None else Seen(row.fields, row.misses)
            seen, change = observe(previous, fields)
            values: dict[str, Any] = {
                "fields": None if seen.fields is None else dict(seen.fields),
                "digest": None if seen.fields is None else digest(seen.fields),
                "misses": seen.misses,
                "seen_at": now,
            }
            if row is None:
                s.add(EndpointFingerprint(endpoint=endpoint, region=self._region_key, **values))
                return None
            taken = s.execute(
                update(EndpointFingerprint)
                .where(
                    *self._fingerprint_key(endpoint),
                    _same(EndpointFingerprint.digest, row.digest),
                    EndpointFingerprint.misses == row.misses,
                )
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount != 1 or change is None:  # type: ignore[attr-defined]
                return None
            return self._add_change(s, endpoint, change, now, replica, min_gap_seconds, on_change)

    def _add_change(
        self,
        s: Session,
        endpoint: str,
        change: Change,
        now: datetime,
        replica: str,
        min_gap_seconds: float,
        on_change: bool,
    ) -> ChangeRecord:
        last_run = s.execute(
            select(func.max(EndpointChange.ran_at)).where(
                *self._change_key(endpoint), EndpointChange.state == "ran"
            )
        ).scalar_one_or_none()
        due = run_after(now, last_run, min_gap_seconds)
        state = "off" if not on_change else ("due" if due <= now else "held")
        if on_change:
            s.execute(
                update(EndpointChange)
                .where(*self._change_key(endpoint), EndpointChange.state.in_(PENDING))
                .values(state="superseded")
                .execution_options(synchronize_session=False)
            )
        row = EndpointChange(
            endpoint=endpoint,
            region=self._region_key,
            at=now,
            reason=change.reason.value,
            before=dict(change.before),
            after=dict(change.after),
            fields=change.fields,
            state=state,
            due_at=due,
            ran_at=None,
            replica=replica,
        )
        s.add(row)
        s.flush()
        return _record(row)

    def due_changes(self, endpoints: Sequence[str]) -> list[ChangeRecord]:
        """This region's changes of ``endpoints`` whose canaries may run now."""
        if not endpoints:
            return []
        query = (
            select(EndpointChange)
            .where(
                EndpointChange.region == self._region_key,
                EndpointChange.state.in_(PENDING),
                EndpointChange.due_at <= self._now(),
                EndpointChange.endpoint.in_(list(endpoints)),
            )
            .order_by(EndpointChange.id)
        )
        with self._errors("could not list due changes"), self._sessions() as s:
            return [_record(row) for row in s.scalars(query)]

    def mark_change_ran(self, change_id: int) -> bool:
        """Mark a change's canaries as started; False if it was no longer pending (another
        replica started them, or a later change superseded it)."""
        with self._errors("could not mark a change run"), self._write() as s:
            result = s.execute(
                update(EndpointChange)
                .where(EndpointChange.id == change_id, EndpointChange.state.in_(PENDING))
                .values(state="ran", ran_at=self._now())
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def skip_slot(self, endpoint: str, kind: str, slot: int, replica: str) -> bool:
        """Mark a scheduled slot done before it runs (a change run took its place); False if
        a replica already claimed it."""
        now = self._now()
        with self._errors("could not skip a slot"), self._write() as s:
            inserted = s.execute(
                self._insert(s, ProbeSlot)
                .values(
                    endpoint=endpoint,
                    kind=kind,
                    slot=slot,
                    region=self._region_key,
                    replica=replica,
                    claimed_at=now,
                    expires_at=now,
                    attempts=1,
                    done=True,
                )
                .on_conflict_do_nothing()
                .returning(ProbeSlot.slot)
            )
            return inserted.first() is not None

    def list_changes(self, endpoint: str | None = None, limit: int = 50) -> list[ChangeRecord]:
        """The latest changes (of one endpoint, or of all), newest first."""
        query = select(EndpointChange).order_by(EndpointChange.id.desc()).limit(limit)
        if endpoint is not None:
            query = query.where(EndpointChange.endpoint == endpoint)
        with self._errors("could not list changes"), self._sessions() as s:
            return [_record(row) for row in s.scalars(query)]

    def _fingerprint_key(self, endpoint: str) -> tuple[Any, ...]:
        return (
            EndpointFingerprint.endpoint == endpoint,
            EndpointFingerprint.region == self._region_key,
        )

    def _change_key(self, endpoint: str) -> tuple[Any, ...]:
        return (EndpointChange.endpoint == endpoint, EndpointChange.region == self._region_key)


def _same(column: Any, value: str | None) -> Any:
    return column.is_(None) if value is None else column == value


def _record(row: EndpointChange) -> ChangeRecord:
    return ChangeRecord(
        id=row.id,
        endpoint=row.endpoint,
        at=row.at,
        reason=row.reason,
        before=dict(row.before),
        after=dict(row.after),
        fields=tuple(row.fields),
        state=row.state,
        due_at=row.due_at,
        ran_at=row.ran_at,
        replica=row.replica,
    )
