"""Hourly rollups of finished probes (table ``probe_rollups``): how they are kept exact.

A finished probe never changes again, so an hour's aggregate of finished probes only moves
when a probe finishes (``bump``, in the finishing transaction) or when probes are deleted
(``recompute`` of the hours a prune touched, in the deleting transaction). Running and
interrupted probes are not rolled up: they are few, and they change state. ``rebuild``
recomputes everything from ``probes``, for bulk loads that bypass the store.

Maxima and minima cannot be decremented, which is why deletion recomputes rather than
subtracts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Integer,
    Text,
    case,
    cast,
    delete,
    func,
    insert,
    select,
    tuple_,
)
from sqlalchemy.orm import Session

from kvwatch.canary.model import ProbeKind, ProbeState
from kvwatch.store.models import Probe, ProbeRollup
from kvwatch.store.statements import compiled_once, insert_for

HOUR = 3600
_KEY = ("endpoint", "hour", "verdict")
_SUMMED = ("probes", "timed", "prompt_tokens", "completion_tokens")


def hour_of(at: datetime) -> int:
    """The UTC hour ``at`` falls in, as epoch seconds."""
    return int(at.timestamp()) // HOUR * HOUR


def hour_start(hour: int) -> datetime:
    return datetime.fromtimestamp(hour, UTC)


def hour_expression(dialect: str) -> ColumnElement[int]:
    """SQL for :func:`hour_of` of ``probes.started_at``."""
    if dialect == "postgresql":
        epoch = func.extract("epoch", Probe.started_at)
        return cast(func.floor(epoch / HOUR) * HOUR, BigInteger)
    # SQLite keeps naive UTC text; strftime('%s') reads it as UTC seconds since the epoch.
    return (cast(func.strftime("%s", Probe.started_at), Integer) // HOUR) * HOUR


def duration_text(duration: float | None) -> str:
    """A duration as ``probe_rollups.durations`` keeps it (``float()`` reads it back exactly)."""
    return "" if duration is None else repr(float(duration))


def aggregates(dialect: str) -> list[ColumnElement[Any]]:
    """The rolled-up values of a group of finished probes, in ``probe_rollups`` order."""
    under = Probe.kind == ProbeKind.UNDER.value
    if dialect == "postgresql":
        # float8::text is the shortest text that reads back as the same double.
        texts = func.string_agg(cast(Probe.duration_seconds, Text), " ")
    else:
        # SQLite's CAST keeps 15 significant digits and printf 16 without "!"; 17 always
        # read back exactly.
        # printf() prints NULL as 0: the CASE keeps missing durations out.
        timed = Probe.duration_seconds.is_not(None)
        texts = func.group_concat(case((timed, func.printf("%!.17g", Probe.duration_seconds))), " ")
    return [
        func.count().label("probes"),
        func.count(Probe.duration_seconds).label("timed"),
        func.max(Probe.duration_seconds).label("max_duration_seconds"),
        func.coalesce(func.sum(Probe.reported_prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(Probe.completion_tokens), 0).label("completion_tokens"),
        func.max(case((under, Probe.planned_prompt_tokens))).label("max_planned_under"),
        func.min(case((under, Probe.reported_prompt_tokens))).label("min_reported_under"),
        func.coalesce(texts, "").label("durations"),
    ]


# The probe columns a rollup is made of (what ``add`` reads from a finished probe's row).
FROM_PROBE = (
    "endpoint",
    "started_at",
    "verdict",
    "kind",
    "duration_seconds",
    "planned_prompt_tokens",
    "reported_prompt_tokens",
    "completion_tokens",
)


def bump(session: Session, probe_id: int) -> None:
    """Add the finished probe ``probe_id`` to its hour (call in the finishing transaction)."""
    row = session.execute(
        select(*(Probe.__table__.c[name] for name in FROM_PROBE)).where(
            Probe.id == probe_id, Probe.state == ProbeState.DONE.value
        )
    ).first()
    if row is not None:
        add(session, row)


def add(session: Session, row: Any) -> None:
    """Add a finished probe to its hour, given its ``FROM_PROBE`` columns (attributes of
    ``row``), e.g. as the finishing UPDATE returned them: no second read of the row."""
    if row.verdict is None:
        return
    under = row.kind == ProbeKind.UNDER.value
    _merge(
        session,
        [
            {
                "endpoint": row.endpoint,
                "hour": hour_of(row.started_at),
                "verdict": row.verdict,
                "probes": 1,
                "timed": 0 if row.duration_seconds is None else 1,
                "max_duration_seconds": row.duration_seconds,
                "prompt_tokens": row.reported_prompt_tokens or 0,
                "completion_tokens": row.completion_tokens or 0,
                "max_planned_under": row.planned_prompt_tokens if under else None,
                "min_reported_under": row.reported_prompt_tokens if under else None,
                "durations": duration_text(row.duration_seconds),
            }
        ],
    )


def recompute(session: Session, hours: Iterable[tuple[str, int]]) -> None:
    """Recompute the rollups of the given (endpoint, hour) pairs from ``probes``.

    Three statements whatever the number of pairs, so a prune batch stays cheap.
    """
    pairs = sorted(set(hours))
    if not pairs:
        return
    session.execute(
        delete(ProbeRollup).where(tuple_(ProbeRollup.endpoint, ProbeRollup.hour).in_(pairs))
    )
    dialect = session.get_bind().dialect.name
    hour = hour_expression(dialect)
    rows = session.execute(
        select(Probe.endpoint, hour.label("hour"), Probe.verdict, *aggregates(dialect))
        .where(
            Probe.started_at >= hour_start(min(h for _, h in pairs)),
            Probe.started_at < hour_start(max(h for _, h in pairs) + HOUR),
            Probe.endpoint.in_(sorted({e for e, _ in pairs})),
            Probe.state == ProbeState.DONE.value,
            Probe.verdict.is_not(None),
        )
        .group_by(Probe.endpoint, hour, Probe.verdict)
    ).all()
    wanted = set(pairs)
    # Merged, not inserted: on PostgreSQL a probe finishing in one of these hours
    # concurrently may have re-created its row since the DELETE; its count must add to ours.
    _merge(session, [r._asdict() for r in rows if (r.endpoint, r.hour) in wanted])


def rebuild(connection: Connection) -> int:
    """Recompute every rollup from ``probes`` (after a bulk load); return the row count.

    Run it while nothing else writes probes: a probe finishing meanwhile could be counted
    twice or not at all.
    """
    hour = hour_expression(connection.dialect.name)
    connection.execute(delete(ProbeRollup))
    grouped = (
        select(
            Probe.endpoint,
            hour.label("hour"),
            Probe.verdict,
            *aggregates(connection.dialect.name),
        )
        .where(Probe.state == ProbeState.DONE.value, Probe.verdict.is_not(None))
        .group_by(Probe.endpoint, hour, Probe.verdict)
    )
    columns = [c.name for c in ProbeRollup.__table__.columns]
    connection.execute(insert(ProbeRollup).from_select(columns, grouped))
    return int(connection.execute(select(func.count()).select_from(ProbeRollup)).scalar_one())


def read(
    connection: Connection,
    endpoint: str,
    first_hour: int,
    end_hour: int,
    *,
    origin: int,
    width: int,
    durations: bool,
) -> list[Any]:
    """``endpoint``'s rollups for hours in ``[first_hour, end_hour)``, merged by the database
    per verdict and per slice of ``width`` seconds from ``origin`` (both whole hours).

    Rows carry ``slice`` (the slice's index), the rolled-up values as named in
    ``probe_rollups``, and all their ``durations`` text only when asked for.
    """
    r = ProbeRollup
    index = ((r.hour - origin) // width).label("slice")
    columns: list[Any] = [
        index,
        r.verdict,
        func.sum(r.probes).label("probes"),
        func.sum(r.timed).label("timed"),
        func.max(r.max_duration_seconds).label("max_duration_seconds"),
        func.sum(r.prompt_tokens).label("prompt_tokens"),
        func.sum(r.completion_tokens).label("completion_tokens"),
        func.max(r.max_planned_under).label("max_planned_under"),
        func.min(r.min_reported_under).label("min_reported_under"),
    ]
    if durations:
        concat = func.string_agg if connection.dialect.name == "postgresql" else func.group_concat
        columns.append(concat(r.durations, " ").label("durations"))
    return list(
        connection.execute(
            select(*columns)
            .where(r.endpoint == endpoint, r.hour >= first_hour, r.hour < end_hour)
            .group_by(index, r.verdict)
        )
    )


def _merge(session: Session, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    session.execute(_merge_statement(session.get_bind().dialect.name), rows)


@functools.cache  # one entry per SQL dialect
def _merge_statement(dialect: str) -> Any:
    """The upsert that adds rows to ``probe_rollups``, compiled once per dialect: it runs
    for every finished probe (see :mod:`kvwatch.store.statements`)."""
    stmt = insert_for(dialect, ProbeRollup)
    t = ProbeRollup.__table__.c
    new = stmt.excluded
    changes: dict[str, Any] = {c: t[c] + new[c] for c in _SUMMED}
    changes["max_duration_seconds"] = _greater(t.max_duration_seconds, new.max_duration_seconds)
    changes["max_planned_under"] = _greater(t.max_planned_under, new.max_planned_under)
    changes["min_reported_under"] = _lesser(t.min_reported_under, new.min_reported_under)
    changes["durations"] = case(
        (t.durations == "", new.durations),
        (new.durations == "", t.durations),
        else_=t.durations + " " + new.durations,
    )
    upsert = stmt.on_conflict_do_update(index_elements=list(_KEY), set_=changes)
    return compiled_once(upsert, dialect, [c.name for c in ProbeRollup.__table__.columns])


def _greater(old: Any, new: Any) -> ColumnElement[Any]:
    # Spelled out: SQLite's two-argument max() is NULL when either side is.
    return case((old.is_(None), new), (new.is_(None), old), (new > old, new), else_=old)


def _lesser(old: Any, new: Any) -> ColumnElement[Any]:
    return case((old.is_(None), new), (new.is_(None), old), (new < old, new), else_=old)


__all__ = [
    "FROM_PROBE",
    "HOUR",
    "add",
    "aggregates",
    "bump",
    "duration_text",
    "hour_of",
    "hour_start",
    "read",
    "rebuild",
    "recompute",
]
