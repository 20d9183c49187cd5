"""Endpoints, probes and their markers: the probe path's writes (as operations for
:meth:`~kvwatch.store.base.StoreBase.write_group`), the reads of single probes, pruning.

A probe's result, its alert states, its hourly rollup and its slot's completion are written
in one transaction: the operations here use the slot and alert-state parts for that.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from kvwatch.canary.markers import canonical, spelled
from kvwatch.canary.model import ForeignMarker, ProbeState
from kvwatch.store import rollups
from kvwatch.store.alert_states import AlertStates
from kvwatch.store.base import WriteOp
from kvwatch.store.errors import StoreError
from kvwatch.store.models import (
    Endpoint,
    Marker,
    Probe,
)
from kvwatch.store.records import (
    AlertStateRecord,
    NewProbe,
    ProbeOutcome,
    ProbeRow,
    burst_from_json,
    burst_to_json,
    cache_from_json,
    cache_to_json,
    depths_from_json,
    depths_to_json,
    foreign_marker_from_json,
    foreign_marker_to_json,
)
from kvwatch.store.slots import SlotClaims


class ProbeRecords(SlotClaims, AlertStates):
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

    def begin_probe_op(self, p: NewProbe) -> WriteOp[int]:
        """Recording a probe as running, with its issued marker, before its request goes out,
        as an operation for :meth:`write_group`."""
        return WriteOp(
            "could not record the start of a probe",
            lambda s: _add_probe(s, p, state=ProbeState.RUNNING, region=self._region),
            p.endpoint,
        )

    def claim_and_begin_op(self, p: NewProbe, ttl: float) -> WriteOp[int | None]:
        """Claiming a slot and recording its probe as running in one transaction, as an operation
        for :meth:`write_group`; None, with nothing written, if another replica has the slot.

        One transaction instead of two per scheduled probe: the claim still decides between
        racing replicas (the loser writes no row), and the row still exists before anything
        is sent, so a SIGKILL leaves it to be marked interrupted."""
        slot = p.slot
        if slot is None:
            raise ValueError("claim_and_begin needs a probe with a slot")

        def run(s: Session) -> int | None:
            if not self._claim(s, p.endpoint, str(p.kind), slot, p.replica, ttl):
                return None
            return _add_probe(s, p, state=ProbeState.RUNNING, region=self._region)

        return WriteOp("could not claim a probe slot", run, p.endpoint)

    def finish_probe_op(
        self,
        probe_id: int,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
        endpoint: str = "",
    ) -> WriteOp[None]:
        """Storing a probe's verdict and evidence, and the alert states it caused, atomically,
        as an operation for :meth:`write_group` (``endpoint``: the probe's, which orders the
        group); with ``complete_slot``, the probe's slot is marked done in the same
        transaction.

        Only a running probe can be finished: a row that was interrupted (its replica was
        presumed dead) or already finished raises :class:`StoreError` and nothing is written.
        """

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

    def record_probe_op(
        self,
        p: NewProbe,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> WriteOp[int]:
        """A whole probe at once (its start could not be recorded), as an operation for
        :meth:`write_group`."""

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
            return [probe_row(row) for row in s.scalars(query)]

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


def probe_row(row: Probe) -> ProbeRow:
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
        cached_prompt_tokens=row.cached_prompt_tokens,
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
        trace_id=row.trace_id,
        burst=burst_from_json(row.depth_outcomes),
        change_id=row.change_id,
        cache=cache_from_json(row.depth_outcomes),
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
        "trace_id": p.trace_id,
        # A change's canaries run in the slot -change_id (kvwatch.changes): the claim table
        # then runs them once across the replicas, and the probe names its change.
        "change_id": -p.slot if p.slot is not None and p.slot < 0 else None,
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
    issued += p.burst_markers
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
        "cached_prompt_tokens": r.cached_prompt_tokens,
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
        "depth_outcomes": _evidence(r),
    }


def _evidence(r: ProbeOutcome) -> list[dict[str, Any]] | None:
    """The per-marker evidence column: a burst's requests, a cache probe's steps, or one
    entry per depth."""
    if r.burst:
        return burst_to_json(r.burst)
    if r.cache:
        return cache_to_json(r.cache)
    return depths_to_json(r.depths) if r.depths else None


def _outcome_params(r: ProbeOutcome) -> dict[str, Any]:
    """The parameters of ``_FINISH``."""
    return {f"v_{k}": v for k, v in _outcome_values(r).items()}


# The statements of every probe, built once: building and hashing a statement per probe was
# a measurable share of the daemon's CPU at fleet scale. Parameters come at execution.
_PROBES = cast(Table, Probe.__table__)

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
    "cached_prompt_tokens",
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
