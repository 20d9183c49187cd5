"""Slot claims: each scheduled slot runs once across the replicas sharing a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast

from sqlalchemy import (
    ColumnElement,
    Table,
    and_,
    bindparam,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from kvwatch.canary.model import ProbeState
from kvwatch.store.base import StoreBase
from kvwatch.store.models import (
    Probe,
    ProbeSlot,
)
from kvwatch.store.statements import compiled_once


class SlotClaims(StoreBase):
    def claim_slot(self, endpoint: str, kind: str, slot: int, replica: str, ttl: float) -> bool:
        """Claim a scheduled slot for ``replica``; True if it is now this replica's to run.

        Claims are per region: each region runs the slot once. The first claim inserts the
        row (a unique key decides between racing replicas). A claim that expired undone (its
        replica died mid-probe) is taken over, and the dead replica's probe row for the slot
        is marked interrupted in the same transaction.
        """
        with self._errors("could not claim a probe slot"), self._write() as s:
            return self._claim(s, endpoint, kind, slot, replica, ttl)

    def _claim(
        self, s: Session, endpoint: str, kind: str, slot: int, replica: str, ttl: float
    ) -> bool:
        now = self._now()
        expires = now + timedelta(seconds=ttl)
        inserted = s.execute(
            _CLAIM[s.get_bind().dialect.name],
            {
                "endpoint": endpoint,
                "kind": kind,
                "slot": slot,
                "region": self._region_key,
                "replica": replica,
                "claimed_at": now,
                "expires_at": expires,
                "attempts": 1,
                "done": False,
            },
        )
        if inserted.first() is not None:
            return True
        # Built only here: expression objects cost more than the common claim above.
        key = (*self._slot_key(endpoint, kind), ProbeSlot.slot == slot)
        taken = s.execute(
            update(ProbeSlot)
            .where(*key, ProbeSlot.done.is_(False), ProbeSlot.expires_at < now)
            .values(
                replica=replica,
                claimed_at=now,
                expires_at=expires,
                attempts=ProbeSlot.attempts + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if taken.rowcount != 1:  # type: ignore[attr-defined]
            return False
        s.execute(
            update(Probe)
            .where(
                Probe.endpoint == endpoint,
                Probe.kind == kind,
                Probe.slot == slot,
                Probe.state == ProbeState.RUNNING.value,
                self._own_probes(),
            )
            .values(
                state=ProbeState.INTERRUPTED.value,
                reason="its replica stopped answering; the slot was taken over",
                finished_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        return True

    def expire_claims(self, replica: str) -> int:
        """Expire the undone claims a previous run of ``replica`` left (it was killed), so the
        slots can be run again at once instead of after their expiry."""
        now = self._now()
        with self._errors("could not expire old claims"), self._write() as s:
            result = s.execute(
                update(ProbeSlot)
                .where(
                    ProbeSlot.replica == replica,
                    ProbeSlot.region == self._region_key,
                    ProbeSlot.done.is_(False),
                    ProbeSlot.expires_at > now,
                )
                .values(expires_at=now)
                .execution_options(synchronize_session=False)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    def complete_slot(self, endpoint: str, kind: str, slot: int, probe_id: int | None) -> None:
        with self._errors("could not complete a probe slot"), self._write() as s:
            self._complete(s, endpoint, kind, slot, probe_id)

    def _complete(
        self, s: Session, endpoint: str, kind: str, slot: int, probe_id: int | None
    ) -> None:
        s.execute(
            _COMPLETE,
            {
                "_endpoint": endpoint,
                "_kind": kind,
                "_region": self._region_key,
                "_slot": slot,
                "v_probe_id": probe_id,
            },
        )

    def expired_slots(self, since_slot: int) -> list[tuple[str, str, int]]:
        """This region's slots from ``since_slot`` on whose claim expired before they ran,
        and the change runs (slot ``-change_id``) claimed since then that did the same."""
        now = self._now()
        since = datetime.fromtimestamp(since_slot, tz=UTC)
        query = select(ProbeSlot.endpoint, ProbeSlot.kind, ProbeSlot.slot).where(
            ProbeSlot.region == self._region_key,
            ProbeSlot.done.is_(False),
            ProbeSlot.expires_at < now,
            or_(
                ProbeSlot.slot >= since_slot,
                and_(ProbeSlot.slot < 0, ProbeSlot.claimed_at >= since),
            ),
        )
        with self._errors("could not list expired slots"), self._sessions() as s:
            return [(e, k, int(t)) for e, k, t in s.execute(query)]

    def _slot_key(self, endpoint: str, kind: str) -> tuple[ColumnElement[bool], ...]:
        return (
            ProbeSlot.endpoint == endpoint,
            ProbeSlot.kind == kind,
            ProbeSlot.region == self._region_key,
        )


_SLOTS = cast(Table, ProbeSlot.__table__)

_CLAIM_KEYS = (
    "endpoint",
    "kind",
    "slot",
    "region",
    "replica",
    "claimed_at",
    "expires_at",
    "attempts",
    "done",
)

_CLAIM = {
    dialect: compiled_once(
        insert_for(_SLOTS).on_conflict_do_nothing().returning(_SLOTS.c.slot), dialect, _CLAIM_KEYS
    )
    for dialect, insert_for in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}

_COMPLETE = (
    update(_SLOTS)
    .where(
        _SLOTS.c.endpoint == bindparam("_endpoint"),
        _SLOTS.c.kind == bindparam("_kind"),
        _SLOTS.c.region == bindparam("_region"),
        _SLOTS.c.slot == bindparam("_slot"),
    )
    .values(done=True, probe_id=bindparam("v_probe_id", type_=_SLOTS.c.probe_id.type))
)
