"""The store: every read and write kvwatch makes, as short synchronous transactions.

The daemon calls these through ``asyncio.to_thread``; each method opens its own session and
returns frozen records, so nothing database-shaped escapes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import (
    JSON,
    ColumnElement,
    Engine,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeEngine

from kvwatch.canary.markers import canonical, spelled
from kvwatch.canary.model import ForeignMarker, ProbeState
from kvwatch.store import rollups
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.migrate import current_revision, head_revision
from kvwatch.store.models import (
    AlertState,
    Endpoint,
    Marker,
    Probe,
    ProbeSlot,
    ServedWindow,
    TokenCalibration,
)
from kvwatch.store.records import (
    AlertStateRecord,
    CalibrationRecord,
    NewProbe,
    ProbeOutcome,
    ProbeRow,
    ServedWindowRecord,
    depths_from_json,
    depths_to_json,
    foreign_marker_from_json,
    foreign_marker_to_json,
)
from kvwatch.store.statements import compiled_once

_ALERT_KEY = ("alertname", "endpoint", "probe", "region")


def _utcnow() -> datetime:
    return datetime.now(UTC)


T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class WriteOp(Generic[T]):
    """One write of the probe path, to run alone or in a group (:meth:`Store.write_group`):
    ``run`` does it inside a transaction it is given; ``what`` heads its error message."""

    what: str
    run: Callable[[Session], T]
    endpoint: str = ""  # whose rows it writes: a group runs its ops in this order


class Store:
    """kvwatch's database, behind one small synchronous API.

    ``region`` (multi-region mode) is the region this kvwatch runs in: it is stamped on the
    probes written here, and slot claims and alert states are kept per region, so every
    region runs every slot and pages on its own. Without it everything is as if there were
    one region (stored as NULL on probes, "" in keys). Reads of history see every region.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        now: Callable[[], datetime] = _utcnow,
        region: str | None = None,
    ) -> None:
        self._engine = engine
        self._region = region
        self._region_key = region or ""
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._now = now
        self._head: str | None = None  # read from the scripts once; /readyz asks often
        # SQLite has one writer at a time, and a writer that finds the lock taken sleeps in
        # SQLite's busy handler (up to 100 ms a try) rather than waking when it is free. With
        # hundreds of probe writes a second that sleeping was most of every write's time, so
        # this process's writers queue on a lock of its own instead.
        self._write_lock = threading.Lock() if engine.dialect.name == "sqlite" else None

    @property
    def engine(self) -> Engine:
        return self._engine

    # -- health ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise :class:`StoreError` unless the database answers a trivial query."""
        with self._errors("database unreachable"), self._engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def readiness(self) -> tuple[bool, str]:
        """Whether the store can serve this kvwatch, and a sentence saying why (not)."""
        try:
            self.ping()
            current = current_revision(self._engine)
        except StoreError as exc:
            return False, str(exc)
        if self._head is None:
            self._head = head_revision()
        head = self._head
        if current == head:
            return True, f"database reachable, schema at {head}"
        shown = current if current is not None else "none"
        return False, f"schema at {shown}, expected {head}: run `kvwatch db upgrade`"

    # -- endpoints ------------------------------------------------------------------------

    def upsert_endpoint(
        self,
        name: str,
        url: str,
        flavour: str,
        model: str,
        context_window: int | None,
        kv_pool_tokens: int | None,
        labels: dict[str, str],
    ) -> int:
        """Insert or refresh an endpoint from configuration; return its id."""
        now = self._now()
        values: dict[str, Any] = {
            "name": name,
            "url": url,
            "flavour": flavour,
            "model": model,
            "context_window": context_window,
            "kv_pool_tokens": kv_pool_tokens,
            "labels": dict(labels),
            "created_at": now,
            "updated_at": now,
        }
        refreshed = [k for k in values if k not in ("name", "created_at")]
        with self._errors(f"could not save endpoint {name!r}"), self._write() as session:
            # ON CONFLICT rather than select-then-insert: replicas starting together race.
            stmt = self._insert(session, Endpoint).values(values)
            stmt = stmt.on_conflict_do_update(
                index_elements=["name"], set_={k: stmt.excluded[k] for k in refreshed}
            ).returning(Endpoint.id)
            return int(session.execute(stmt).scalar_one())

    # -- probes ---------------------------------------------------------------------------

    def begin_probe(self, p: NewProbe) -> int:
        """Record a probe as running, with its issued marker, before its request goes out."""
        return self._write_one(self.begin_probe_op(p))

    def begin_probe_op(self, p: NewProbe) -> WriteOp[int]:
        """:meth:`begin_probe` as an operation for :meth:`write_group`."""
        return WriteOp(
            "could not record the start of a probe",
            lambda s: _add_probe(s, p, state=ProbeState.RUNNING, region=self._region),
            p.endpoint,
        )

    def claim_and_begin(self, p: NewProbe, ttl: float) -> int | None:
        """Claim ``p``'s slot for ``p.replica`` (as :meth:`claim_slot`) and record ``p`` as
        running, in one transaction; None, with nothing written, if another replica has it.

        One transaction instead of two per scheduled probe: the claim still decides between
        racing replicas (the loser writes no row), and the row still exists before anything
        is sent, so a SIGKILL leaves it to be marked interrupted.
        """
        return self._write_one(self.claim_and_begin_op(p, ttl))

    def claim_and_begin_op(self, p: NewProbe, ttl: float) -> WriteOp[int | None]:
        """:meth:`claim_and_begin` as an operation for :meth:`write_group`."""
        slot = p.slot
        if slot is None:
            raise ValueError("claim_and_begin needs a probe with a slot")

        def run(s: Session) -> int | None:
            if not self._claim(s, p.endpoint, str(p.kind), slot, p.replica, ttl):
                return None
            return _add_probe(s, p, state=ProbeState.RUNNING, region=self._region)

        return WriteOp("could not claim a probe slot", run, p.endpoint)

    def finish_probe(
        self,
        probe_id: int,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> None:
        """Store a probe's verdict and evidence, and the alert states it caused, atomically;
        with ``complete_slot``, mark the probe's slot done (as :meth:`complete_slot`) in the
        same transaction.

        Only a running probe can be finished: a row that was interrupted (its replica was
        presumed dead) or already finished raises :class:`StoreError` and nothing is written.
        """
        self._write_one(
            self.finish_probe_op(probe_id, r, alert_states, complete_slot=complete_slot)
        )

    def finish_probe_op(
        self,
        probe_id: int,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
        endpoint: str = "",
    ) -> WriteOp[None]:
        """:meth:`finish_probe` as an operation for :meth:`write_group` (``endpoint``: the
        probe's, which orders the group)."""

        def run(s: Session) -> None:
            # The state guard sits in the UPDATE itself so two writers cannot both win; what
            # the rollup and the slot need comes back from it (no second read of the row).
            row = s.execute(_FINISH, {"_id": probe_id, **_outcome_params(r)}).first()
            if row is None:
                state = s.scalar(select(Probe.state).where(Probe.id == probe_id))
                if state is None:
                    raise StoreError(f"cannot finish probe {probe_id}: no such probe")
                raise StoreError(f"cannot finish probe {probe_id}: it is {state}, not running")
            rollups.add(s, row)
            self._upsert_alert_states(s, alert_states)
            if complete_slot and row.slot is not None:
                self._complete(s, row.endpoint, row.kind, row.slot, probe_id)

        return WriteOp(f"could not finish probe {probe_id}", run, endpoint)

    def record_probe(
        self,
        p: NewProbe,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> int:
        """Write a whole probe at once, when its start could not be recorded (the database
        was unreachable): the done row, its marker and the alert states in one transaction,
        and with ``complete_slot`` the completion of its slot."""
        return self._write_one(
            self.record_probe_op(p, r, alert_states, complete_slot=complete_slot)
        )

    def record_probe_op(
        self,
        p: NewProbe,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> WriteOp[int]:
        """:meth:`record_probe` as an operation for :meth:`write_group`."""

        def run(s: Session) -> int:
            probe_id = _add_probe(
                s, p, state=ProbeState.DONE, region=self._region, **_outcome_values(r)
            )
            rollups.bump(s, probe_id)
            self._upsert_alert_states(s, alert_states)
            if complete_slot and p.slot is not None:
                self._complete(s, p.endpoint, str(p.kind), p.slot, probe_id)
            return probe_id

        return WriteOp("could not record a probe", run, p.endpoint)

    def interrupt_running(
        self,
        replica: str | None = None,
        probe_ids: Sequence[int] | None = None,
        *,
        reason: str,
    ) -> int:
        """Mark running probes interrupted (all, one replica's, the given ids); count them."""
        if probe_ids is not None and not probe_ids:
            return 0  # an empty selection must never widen to "every running probe"
        conditions = [Probe.state == ProbeState.RUNNING.value]
        if replica is not None:
            conditions.append(Probe.replica == replica)
        if probe_ids is not None:
            conditions.append(Probe.id.in_(list(probe_ids)))
        with self._errors("could not interrupt running probes"), self._write() as s:
            result = s.execute(
                update(Probe)
                .where(*conditions)
                .values(state=ProbeState.INTERRUPTED.value, reason=reason, finished_at=self._now())
                .execution_options(synchronize_session=False)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    # -- slot claims (several replicas on one database) -----------------------------------

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
        """This region's slots from ``since_slot`` on whose claim expired before they ran."""
        now = self._now()
        query = select(ProbeSlot.endpoint, ProbeSlot.kind, ProbeSlot.slot).where(
            ProbeSlot.region == self._region_key,
            ProbeSlot.done.is_(False),
            ProbeSlot.expires_at < now,
            ProbeSlot.slot >= since_slot,
        )
        with self._errors("could not list expired slots"), self._sessions() as s:
            return [(e, k, int(t)) for e, k, t in s.execute(query)]

    def lookup_markers(self, canonical_markers: Sequence[str]) -> dict[str, ForeignMarker]:
        """Issued markers among ``canonical_markers``, keyed by canonical form.

        Each value carries the marker as it was issued (``KVW-…``), its probe, endpoint and
        time, which is what turns a stray code in an answer into proof of a leak.
        """
        wanted = sorted({canonical(m) for m in canonical_markers})
        if not wanted:
            return {}
        with self._errors("could not look up markers"), self._sessions() as s:
            rows = s.execute(
                select(
                    Marker.marker,
                    Probe.marker,
                    Marker.probe_id,
                    Marker.endpoint,
                    Marker.issued_at,
                    Marker.tenant,
                )
                .join(Probe, Probe.id == Marker.probe_id)
                .where(Marker.marker.in_(wanted))
            ).all()
        # A probe's first marker is kept as issued; the others of a several-depth probe
        # are spelled from their canonical key (kvwatch issues them in canonical symbols).
        return {
            key: ForeignMarker(
                marker=issued if canonical(issued) == key else spelled(key),
                probe_id=pid,
                endpoint=ep,
                issued_at=at,
                tenant=tenant,
            )
            for key, issued, pid, ep, at, tenant in rows
        }

    def get_probe(self, probe_id: int) -> ProbeRow | None:
        """One probe by id, or None."""
        with self._errors(f"could not read probe {probe_id}"), self._sessions() as s:
            row = s.get(Probe, probe_id)
            return None if row is None else _probe_row(row)

    def list_probes(
        self,
        endpoint: str | None = None,
        kind: str | None = None,
        verdict: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        state: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[ProbeRow]:
        """Probes newest first, filtered; page on with ``before_id`` = the last id seen.

        ``since`` is inclusive and ``until`` exclusive, both on ``started_at``.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = select(Probe).order_by(Probe.id.desc()).limit(limit)
        if endpoint is not None:
            query = query.where(Probe.endpoint == endpoint)
        if kind is not None:
            query = query.where(Probe.kind == str(kind))
        if verdict is not None:
            query = query.where(Probe.verdict == str(verdict))
        if state is not None:
            query = query.where(Probe.state == str(state))
        if since is not None:
            query = query.where(Probe.started_at >= since)
        if until is not None:
            query = query.where(Probe.started_at < until)
        if before_id is not None:
            query = query.where(Probe.id < before_id)
        with self._errors("could not list probes"), self._sessions() as s:
            return [_probe_row(row) for row in s.scalars(query)]

    def latest_per_endpoint(self) -> dict[tuple[str, str], ProbeRow]:
        """The latest finished probe of each (endpoint, kind)."""
        latest = (
            select(func.max(Probe.id).label("id"))
            .where(Probe.state == ProbeState.DONE.value)
            .group_by(Probe.endpoint, Probe.kind)
            .subquery()
        )
        query = select(Probe).join(latest, Probe.id == latest.c.id)
        with self._errors("could not read the latest probes"), self._sessions() as s:
            return {(row.endpoint, row.kind): _probe_row(row) for row in s.scalars(query)}

    # -- alert states ---------------------------------------------------------------------

    def load_alert_states(self) -> list[AlertStateRecord]:
        """Every persisted alert state of this region, in a stable order."""
        query = (
            select(AlertState)
            .where(AlertState.region == self._region_key)
            .order_by(AlertState.alertname, AlertState.endpoint, AlertState.probe)
        )
        with self._errors("could not load alert states"), self._sessions() as s:
            return [_alert_record(row) for row in s.scalars(query)]

    def save_alert_states(self, records: Sequence[AlertStateRecord]) -> None:
        """Insert or update the given alert states of this region (others are left as they
        are)."""
        with self._errors("could not save alert states"), self._write() as s:
            self._upsert_alert_states(s, records)

    # -- token calibrations ---------------------------------------------------------------

    def save_calibrations(self, records: Sequence[CalibrationRecord]) -> None:
        """Replace an endpoint's calibrations for one tokenizer, size class by size class."""
        rows = [dataclasses.asdict(r) for r in records]
        if not rows:
            return
        key = ("endpoint", "token_source", "size_class")
        with self._errors("could not save a token calibration"), self._write() as s:
            stmt = self._insert(s, TokenCalibration)
            stmt = stmt.on_conflict_do_update(
                index_elements=list(key),
                set_={k: stmt.excluded[k] for k in rows[0] if k not in key},
            )
            s.execute(stmt, rows)

    def calibrations(self, endpoint: str | None = None) -> list[CalibrationRecord]:
        """Stored calibrations (of one endpoint, or all), by endpoint and tokenizer."""
        query = select(TokenCalibration).order_by(
            TokenCalibration.endpoint, TokenCalibration.token_source, TokenCalibration.size_class
        )
        if endpoint is not None:
            query = query.where(TokenCalibration.endpoint == endpoint)
        with self._errors("could not read token calibrations"), self._sessions() as s:
            return [
                CalibrationRecord(
                    endpoint=row.endpoint,
                    token_source=row.token_source,
                    size_class=row.size_class,
                    ratio=row.ratio,
                    error=row.error,
                    observations=row.observations,
                    updated_at=row.updated_at,
                )
                for row in s.scalars(query)
            ]

    # -- served windows -------------------------------------------------------------------

    def record_served_window(self, record: ServedWindowRecord) -> None:
        """Store one measurement of what an endpoint really serves."""
        with self._errors("could not record a served window"), self._write() as s:
            s.add(ServedWindow(**dataclasses.asdict(record)))

    def served_windows(self, endpoint: str | None = None) -> dict[str, ServedWindowRecord]:
        """The latest measurement of each endpoint (or of one), by endpoint name."""
        latest = (
            select(ServedWindow.endpoint, func.max(ServedWindow.id).label("id"))
            .group_by(ServedWindow.endpoint)
            .subquery()
        )
        query = select(ServedWindow).join(latest, ServedWindow.id == latest.c.id)
        if endpoint is not None:
            query = query.where(ServedWindow.endpoint == endpoint)
        with self._errors("could not read served windows"), self._sessions() as s:
            return {row.endpoint: _served_window(row) for row in s.scalars(query)}

    def last_passing_size(self, endpoint: str, kinds: Sequence[str], below: int) -> int | None:
        """Prompt tokens of the latest passing probe of ``kinds`` smaller than ``below``: the
        size the served-window search may start from."""
        query = (
            select(Probe.planned_prompt_tokens)
            .where(
                Probe.endpoint == endpoint,
                Probe.kind.in_(list(kinds)),
                Probe.verdict == "pass",
                Probe.planned_prompt_tokens < below,
            )
            .order_by(Probe.started_at.desc(), Probe.id.desc())
            .limit(1)
        )
        with self._errors("could not read the last passing probe"), self._sessions() as s:
            return s.scalar(query)

    # -- retention ------------------------------------------------------------------------

    def prune(
        self, older_than: datetime, keep_verdicts: Sequence[str] = (), batch: int = 1000
    ) -> int:
        """Delete finished or interrupted probes started before ``older_than``, and their
        markers, except those whose verdict is in ``keep_verdicts``; return how many.

        Deletes in batches of ``batch``, each its own transaction, so a large backlog never
        holds a long lock against the probes being written meanwhile.
        """
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        conditions = [
            Probe.started_at < older_than,
            Probe.state.in_([ProbeState.DONE.value, ProbeState.INTERRUPTED.value]),
        ]
        if keep_verdicts:
            # An interrupted probe has no verdict; NOT IN alone would keep it forever.
            conditions.append(
                or_(Probe.verdict.is_(None), Probe.verdict.not_in([str(v) for v in keep_verdicts]))
            )
        oldest_first = select(Probe.id).where(*conditions).order_by(Probe.id).limit(batch)
        # One DELETE per batch with the selection as a subquery: selection and deletion cannot
        # disagree, and the write lock is held for one short statement while probes keep
        # being written. Markers go by their ON DELETE CASCADE; references from kept rows (a
        # confirmation, an alert state) are set to NULL by theirs.
        batch_delete = (
            delete(Probe)
            .where(Probe.id.in_(oldest_first.scalar_subquery()))
            .returning(Probe.endpoint, Probe.started_at, Probe.state)
            .execution_options(synchronize_session=False)
        )
        total = 0
        with self._errors("could not prune probes"):
            while True:
                with self._write() as s:
                    gone = s.execute(batch_delete).all()
                    # The hourly rollups of finished probes must not count deleted ones.
                    rollups.recompute(
                        s,
                        {
                            (endpoint, rollups.hour_of(started_at))
                            for endpoint, started_at, state in gone
                            if state == ProbeState.DONE.value
                        },
                    )
                deleted = len(gone)
                total += deleted
                if deleted < batch:
                    return total

    # -- grouped writes -------------------------------------------------------------------

    def write_group(self, ops: Sequence[WriteOp[Any]]) -> list[Any]:
        """Run ``ops`` in one transaction where they all succeed; each gets its own outcome.

        The outcome of an op is its result, or the :class:`StoreError` it met. Several
        probes' writes then cost one commit (and on SQLite one turn of the writer lock).
        The ops run in order of endpoint, so that two replicas' groups lock their rows in
        one order and cannot deadlock each other on PostgreSQL. When the database is
        unreachable every op gets that error; when one op is refused (a probe no longer
        running, a constraint) or the group lost a conflict with another transaction, the
        group is rolled back and each op runs in a transaction of its own, so only an op
        that fails alone fails.
        """
        if len(ops) > 1:
            order = sorted(range(len(ops)), key=lambda i: ops[i].endpoint)
            try:
                with self._errors("could not write a group of probe writes"), self._write() as s:
                    done = {i: ops[i].run(s) for i in order}
                return [done[i] for i in range(len(ops))]
            except StoreUnavailable as exc:
                if not _lost_a_conflict(exc.__cause__):
                    return [exc] * len(ops)
            except StoreError:
                pass
        outcomes: list[Any] = []
        for op in ops:
            try:
                outcomes.append(self._write_one(op))
            except StoreError as exc:
                outcomes.append(exc)
        return outcomes

    def _write_one(self, op: WriteOp[T]) -> T:
        with self._errors(op.what), self._write() as s:
            return op.run(s)

    # -- helpers --------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction (queued behind this process's other writers on SQLite)."""
        if self._write_lock is None:
            with self._sessions.begin() as session:
                yield session
            return
        with self._write_lock, self._sessions.begin() as session:
            yield session

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            raise StoreUnavailable(f"{what}: {_first_line(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StoreUnavailable(f"{what}: {_first_line(exc)}") from exc
            raise StoreError(f"{what}: {_first_line(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"{what}: {_first_line(exc)}") from exc

    def _slot_key(self, endpoint: str, kind: str) -> tuple[ColumnElement[bool], ...]:
        return (
            ProbeSlot.endpoint == endpoint,
            ProbeSlot.kind == kind,
            ProbeSlot.region == self._region_key,
        )

    def _own_probes(self) -> ColumnElement[bool]:
        """Probes run in this region (IS NULL without a region)."""
        if self._region is None:
            return Probe.region.is_(None)
        return Probe.region == self._region

    @staticmethod
    def _insert(session: Session, model: type[Any]) -> Any:
        # Both dialects offer INSERT ... ON CONFLICT with the same interface.
        if session.get_bind().dialect.name == "postgresql":
            return postgresql.insert(model)
        return sqlite.insert(model)

    def _upsert_alert_states(self, session: Session, records: Sequence[AlertStateRecord]) -> None:
        # Last record per key wins: PostgreSQL refuses to touch one row twice in a statement.
        latest = {(r.alertname, r.endpoint, r.probe): r for r in records}
        if not latest:
            return
        rows = [{**_alert_values(r), "region": self._region_key} for r in latest.values()]
        stmt = self._insert(session, AlertState)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(_ALERT_KEY),
            set_={k: stmt.excluded[k] for k in rows[0] if k not in _ALERT_KEY},
        )
        session.execute(stmt, rows)


# SQLSTATEs of a transaction that lost to another one (deadlock, serialization failure):
# running it again can succeed, unlike when the server is gone.
_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


def _lost_a_conflict(exc: BaseException | None) -> bool:
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in _CONFLICT_SQLSTATES


def _first_line(exc: SQLAlchemyError) -> str:
    # The driver message without SQLAlchemy's echo of the statement and its parameters
    # (which may hold an answer excerpt) and its documentation link.
    orig = getattr(exc, "orig", None)
    message = str(orig) if orig is not None else str(exc)
    return message.strip().splitlines()[0] if message.strip() else type(exc).__name__


def _probe_row(row: Probe) -> ProbeRow:
    return ProbeRow(
        id=row.id,
        endpoint=row.endpoint,
        endpoint_id=row.endpoint_id,
        kind=row.kind,
        state=ProbeState(row.state),
        verdict=row.verdict,
        reason=row.reason,
        started_at=row.started_at,
        finished_at=row.finished_at,
        replica=row.replica,
        model=row.model,
        planned_prompt_tokens=row.planned_prompt_tokens,
        target_prompt_tokens=row.target_prompt_tokens,
        reported_prompt_tokens=row.reported_prompt_tokens,
        completion_tokens=row.completion_tokens,
        max_tokens=row.max_tokens,
        token_source=row.token_source,
        tokenize_calls=row.tokenize_calls,
        marker=row.marker,
        marker_depth=row.marker_depth,
        marker_found=row.marker_found,
        foreign_markers=tuple(foreign_marker_from_json(m) for m in row.foreign_markers),
        http_status=row.http_status,
        finish_reason=row.finish_reason,
        streamed=row.streamed,
        answer_excerpt=row.answer_excerpt,
        error_body=row.error_body,
        error_detail=row.error_detail,
        ttfb_seconds=row.ttfb_seconds,
        duration_seconds=row.duration_seconds,
        confirms_probe_id=row.confirms_probe_id,
        slot=row.slot,
        region=row.region,
        tenant=row.tenant,
        trigger_probe_id=row.trigger_probe_id,
        depths=depths_from_json(row.depth_outcomes),
    )


def _served_window(row: ServedWindow) -> ServedWindowRecord:
    return ServedWindowRecord(
        endpoint=row.endpoint,
        measured_at=row.measured_at,
        source=row.source,
        advertised_tokens=row.advertised_tokens,
        served_tokens=row.served_tokens,
        unserved_tokens=row.unserved_tokens,
        exact=row.exact,
        probes=row.probes,
        prompt_tokens=row.prompt_tokens,
        probe_id=row.probe_id,
    )


def _add_probe(session: Session, p: NewProbe, *, state: ProbeState, **values: Any) -> int:
    """Insert a probe row (and its issued marker, if it has one); returns its id."""
    row: dict[str, Any] = {
        "endpoint": p.endpoint,
        "endpoint_id": p.endpoint_id,
        "kind": str(p.kind),
        "state": state.value,
        "started_at": p.started_at,
        "replica": p.replica,
        "model": p.model,
        "planned_prompt_tokens": p.planned_prompt_tokens,
        "target_prompt_tokens": p.target_prompt_tokens,
        "max_tokens": p.max_tokens,
        "token_source": p.token_source,
        "tokenize_calls": p.tokenize_calls,
        "marker": p.marker,
        "marker_depth": p.marker_depth,
        "streamed": p.streamed,
        "confirms_probe_id": p.confirms_probe_id,
        "slot": p.slot,
        "tenant": p.tenant,
        "trigger_probe_id": p.trigger_probe_id,
        "foreign_markers": [],
        # The planned markers, unless the outcome (a whole probe at once) brings judged ones.
        "depth_outcomes": depths_to_json(p.placements) if p.placements else None,
    }
    # An outcome's planned values (when given) win over those the probe was begun with.
    row.update((k, v) for k, v in values.items() if v is not None or k not in _PLANNED)
    probe_id = int(session.execute(_INSERT_PROBE, row).scalar_one())
    # A capacity check sends no prompt and issues no marker; a several-depth probe issues
    # one per depth, each traced back to it if it ever turns up in another answer.
    issued = [pl.marker for pl in p.placements] or ([p.marker] if p.marker else [])
    if issued:
        session.execute(
            _INSERT_MARKER,
            [
                {
                    "marker": canonical(m),
                    "probe_id": probe_id,
                    "endpoint": p.endpoint,
                    "issued_at": p.started_at,
                    "tenant": p.tenant,
                }
                for m in issued
            ],
        )
    return probe_id


def _outcome_values(r: ProbeOutcome) -> dict[str, Any]:
    return {
        "verdict": str(r.verdict),
        "reason": r.reason,
        "finished_at": r.finished_at,
        "reported_prompt_tokens": r.reported_prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "marker_found": r.marker_found,
        "foreign_markers": [foreign_marker_to_json(m) for m in r.foreign_markers],
        "http_status": r.http_status,
        "finish_reason": r.finish_reason,
        "answer_excerpt": r.answer_excerpt,
        "error_body": r.error_body,
        "error_detail": r.error_detail,
        "ttfb_seconds": r.ttfb_seconds,
        "duration_seconds": r.duration_seconds,
        "planned_prompt_tokens": r.planned_prompt_tokens,
        "target_prompt_tokens": r.target_prompt_tokens,
        "tokenize_calls": r.tokenize_calls,
        "marker_depth": r.marker_depth,
        "token_source": r.token_source,
        # Without an answer the planned markers (written at the start) stay as they are.
        "depth_outcomes": depths_to_json(r.depths) if r.depths else None,
    }


def _outcome_params(r: ProbeOutcome) -> dict[str, Any]:
    """The parameters of ``_FINISH``."""
    return {f"v_{k}": v for k, v in _outcome_values(r).items()}


# The statements of every probe, built once: building and hashing a statement per probe was
# a measurable share of the daemon's CPU at fleet scale. Parameters come at execution.
_PROBES = cast(Table, Probe.__table__)
_SLOTS = cast(Table, ProbeSlot.__table__)
# Planning's values: NULL in an outcome keeps what the probe was begun with.
_PLANNED = (
    "planned_prompt_tokens",
    "target_prompt_tokens",
    "tokenize_calls",
    "marker_depth",
    "token_source",
    "depth_outcomes",
)
# The columns a finish writes (``_outcome_values``).
_OUTCOME_COLUMNS = (
    "verdict",
    "reason",
    "finished_at",
    "reported_prompt_tokens",
    "completion_tokens",
    "marker_found",
    "foreign_markers",
    "http_status",
    "finish_reason",
    "answer_excerpt",
    "error_body",
    "error_detail",
    "ttfb_seconds",
    "duration_seconds",
    *_PLANNED,
)


def _nullable(name: str) -> TypeEngine[Any]:
    """The column's type, but a JSON None binds as SQL NULL (not JSON ``null``), so that
    COALESCE keeps the value the probe was begun with."""
    if name == "depth_outcomes":
        return JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    return _PROBES.c[name].type


_INSERT_PROBE = insert(_PROBES).returning(_PROBES.c.id)
# On the table, not the mapped class: an INSERT of a class runs the ORM's bulk-insert
# machinery, which cost as much as the whole rest of the start's transaction.
_INSERT_MARKER = insert(cast(Table, Marker.__table__))
_FINISH = (
    update(_PROBES)
    .where(_PROBES.c.id == bindparam("_id"), _PROBES.c.state == ProbeState.RUNNING.value)
    .values(
        {
            "state": ProbeState.DONE.value,
            **{
                name: (
                    func.coalesce(bindparam(f"v_{name}", type_=_nullable(name)), _PROBES.c[name])
                    if name in _PLANNED
                    else bindparam(f"v_{name}", type_=_PROBES.c[name].type)
                )
                for name in _OUTCOME_COLUMNS
            },
        }
    )
    .returning(*(_PROBES.c[name] for name in ("id", "slot", *rollups.FROM_PROBE)))
)
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
