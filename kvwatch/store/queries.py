"""Read-side queries for reviewing history: the web pages, the JSON API and the CLI.

Every query here is shaped to walk an index newest first and stop early (see migration 0002),
so it stays fast however long the history grows: pages follow ``(started_at, id)``
descending, the overview reads a few rows per endpoint, and charts are aggregated into time
buckets by the database rather than fetched row by row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    case,
    cast,
    func,
    literal,
    select,
    tuple_,
)
from sqlalchemy.exc import SQLAlchemyError

from kvwatch.canary.model import ProbeKind, ProbeState
from kvwatch.store.errors import StoreError
from kvwatch.store.models import Endpoint, Probe
from kvwatch.store.records import AlertStateRecord, ProbeRow
from kvwatch.store.repository import Store, _probe_row

MAX_PAGE = 500


class CursorError(ValueError):
    """A ``before_id`` cursor that names no stored probe (pruned, or never issued)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointInfo:
    """An endpoint as configured (the last time a kvwatch replica registered it)."""

    name: str
    url: str
    flavour: str
    model: str
    context_window: int | None
    kv_pool_tokens: int | None
    labels: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeBrief:
    """The few columns a status strip or a latest-verdict badge needs."""

    id: int
    kind: str
    state: str
    verdict: str | None
    started_at: datetime
    duration_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointOverview:
    endpoint: EndpointInfo
    latest: dict[str, ProbeBrief]  # probe kind -> latest finished probe of that kind
    recent: list[ProbeBrief]  # newest first, every kind and state


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeFilter:
    endpoint: str | None = None
    kind: str | None = None
    verdict: str | None = None
    since: datetime | None = None  # inclusive, on started_at
    until: datetime | None = None  # exclusive, on started_at


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePage:
    probes: list[ProbeRow]
    next_before_id: int | None  # pass as before_id for the next (older) page


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """What one endpoint's probes did within ``[since, until)``."""

    endpoint: str
    since: datetime
    until: datetime
    total: int  # every probe started in the window, whatever its state
    finished: int
    running: int
    interrupted: int
    verdicts: dict[str, int]
    pass_rate: float | None  # passes / finished probes; None without finished probes
    p50_duration_seconds: float | None
    p95_duration_seconds: float | None
    prompt_tokens: int  # as reported by the engine (a rejected prompt costs none)
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Bucket:
    """One time slice of an endpoint's timeline chart."""

    index: int
    start: datetime
    verdicts: dict[str, int] = field(default_factory=dict)
    max_duration_seconds: float | None = None
    planned_prompt_tokens: int | None = None  # largest planned under prompt in the slice
    reported_prompt_tokens: int | None = None  # smallest reported under prompt in the slice


class HistoryQueries:
    """Read-only queries over a :class:`Store`'s database; each opens its own connection."""

    def __init__(self, store: Store) -> None:
        self._engine = store.engine

    # -- endpoints ------------------------------------------------------------------------

    def endpoints(self) -> list[EndpointInfo]:
        with self._connect("could not list endpoints") as c:
            return [_endpoint(row) for row in c.execute(select(Endpoint).order_by(Endpoint.name))]

    def endpoint(self, name: str) -> EndpointInfo | None:
        with self._connect(f"could not read endpoint {name!r}") as c:
            row = c.execute(select(Endpoint).where(Endpoint.name == name)).first()
            return None if row is None else _endpoint(row)

    def overview(self, recent: int = 40) -> list[EndpointOverview]:
        """Every endpoint with its latest verdict per kind and its ``recent`` newest probes."""
        with self._connect("could not read the overview") as c:
            endpoints = [
                _endpoint(row) for row in c.execute(select(Endpoint).order_by(Endpoint.name))
            ]
            # Short index walks per endpoint instead of one GROUP BY over all history: the
            # number of endpoints is small, the history is not. The latest probe of each kind
            # is nearly always among the newest few; only a kind missing there is looked up.
            result = []
            for ep in endpoints:
                strip = [
                    _brief_row(r)
                    for r in c.execute(
                        _brief()
                        .where(Probe.endpoint == ep.name)
                        .order_by(Probe.started_at.desc(), Probe.id.desc())
                        .limit(max(recent, 4 * len(ProbeKind)))
                    )
                ]
                latest: dict[str, ProbeBrief] = {}
                for p in strip:
                    if p.state == ProbeState.DONE.value:
                        latest.setdefault(p.kind, p)
                for kind in ProbeKind:
                    if kind.value in latest:
                        continue
                    row = c.execute(
                        _brief()
                        .where(
                            Probe.endpoint == ep.name,
                            Probe.kind == kind.value,
                            Probe.state == ProbeState.DONE.value,
                        )
                        .order_by(Probe.started_at.desc(), Probe.id.desc())
                        .limit(1)
                    ).first()
                    if row is not None:
                        latest[kind.value] = _brief_row(row)
                ordered: dict[str, ProbeBrief] = {
                    k.value: latest[k.value] for k in ProbeKind if k.value in latest
                }
                result.append(EndpointOverview(endpoint=ep, latest=ordered, recent=strip[:recent]))
            return result

    # -- probes ---------------------------------------------------------------------------

    def probe(self, probe_id: int) -> ProbeRow | None:
        with self._connect(f"could not read probe {probe_id}") as c:
            row = c.execute(select(Probe).where(Probe.id == probe_id)).first()
            return None if row is None else _probe_row(row)  # type: ignore[arg-type]

    def confirmations_of(self, probe_id: int) -> list[ProbeBrief]:
        """Probes run to confirm ``probe_id`` (normally none or one)."""
        with self._connect(f"could not read confirmations of probe {probe_id}") as c:
            rows = c.execute(_brief().where(Probe.confirms_probe_id == probe_id).order_by(Probe.id))
            return [_brief_row(r) for r in rows]

    def probes(
        self, filters: ProbeFilter, *, limit: int = 50, before_id: int | None = None
    ) -> ProbePage:
        """A page of probes, newest first by ``(started_at, id)``; raises :class:`CursorError`
        when ``before_id`` names no probe."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        query = select(Probe).where(*_conditions(filters))
        with self._connect("could not list probes") as c:
            if before_id is not None:
                cursor_at = c.execute(
                    select(Probe.started_at).where(Probe.id == before_id)
                ).scalar()
                if cursor_at is None:
                    raise CursorError(
                        f"before_id {before_id} names no stored probe (pruned?); "
                        "start again without it"
                    )
                # Keyset pagination on the index order: rows strictly older than the cursor.
                query = query.where(
                    tuple_(Probe.started_at, Probe.id)
                    < tuple_(literal(cursor_at, Probe.started_at.type), literal(before_id))
                )
            rows = c.execute(
                query.order_by(Probe.started_at.desc(), Probe.id.desc()).limit(limit + 1)
            ).all()
        probes = [_probe_row(r) for r in rows[:limit]]  # type: ignore[arg-type]
        more = len(rows) > limit
        return ProbePage(probes=probes, next_before_id=probes[-1].id if more else None)

    # -- aggregates -----------------------------------------------------------------------

    def summary(self, endpoint: str, since: datetime, until: datetime) -> Summary:
        """Counts per verdict, pass rate, duration percentiles and tokens in a window."""
        window = (
            Probe.endpoint == endpoint,
            Probe.started_at >= since,
            Probe.started_at < until,
        )
        with self._connect(f"could not summarise {endpoint!r}") as c:
            groups = c.execute(
                select(
                    Probe.state,
                    Probe.verdict,
                    func.count(),
                    func.coalesce(func.sum(Probe.reported_prompt_tokens), 0),
                    func.coalesce(func.sum(Probe.completion_tokens), 0),
                )
                .where(*window)
                .group_by(Probe.state, Probe.verdict)
            ).all()
            timed = c.execute(
                select(func.count(Probe.duration_seconds)).where(
                    *window, Probe.state == ProbeState.DONE.value
                )
            ).scalar_one()
            durations = _percentiles(c, window, int(timed), (0.50, 0.95))
        states: dict[str, int] = {}
        verdicts: dict[str, int] = {}
        prompt = completion = 0
        for state, verdict, count, p_tokens, c_tokens in groups:
            states[state] = states.get(state, 0) + int(count)
            if state == ProbeState.DONE.value and verdict is not None:
                verdicts[verdict] = verdicts.get(verdict, 0) + int(count)
            prompt += int(p_tokens)
            completion += int(c_tokens)
        finished = states.get(ProbeState.DONE.value, 0)
        return Summary(
            endpoint=endpoint,
            since=since,
            until=until,
            total=sum(states.values()),
            finished=finished,
            running=states.get(ProbeState.RUNNING.value, 0),
            interrupted=states.get(ProbeState.INTERRUPTED.value, 0),
            verdicts=dict(sorted(verdicts.items())),
            pass_rate=verdicts.get("pass", 0) / finished if finished else None,
            p50_duration_seconds=durations[0],
            p95_duration_seconds=durations[1],
            prompt_tokens=prompt,
            completion_tokens=completion,
        )

    def timeline(
        self, endpoint: str, since: datetime, until: datetime, buckets: int = 120
    ) -> list[Bucket]:
        """``buckets`` equal slices of ``[since, until)``, aggregated by the database."""
        if buckets < 1:
            raise ValueError(f"buckets must be at least 1, got {buckets}")
        span = (until - since).total_seconds()
        if span <= 0:
            raise ValueError("since must be before until")
        # Whole seconds per bucket keep the SQL integer arithmetic identical on both databases.
        width = max(1, -(-int(span) // buckets))
        with self._connect(f"could not read the timeline of {endpoint!r}") as c:
            index = _bucket_index(c, since, width).label("bucket")
            under = Probe.kind == ProbeKind.UNDER.value
            rows = c.execute(
                select(
                    index,
                    Probe.verdict,
                    func.count(),
                    func.max(Probe.duration_seconds),
                    func.max(_when(under, Probe.planned_prompt_tokens)),
                    func.min(_when(under, Probe.reported_prompt_tokens)),
                )
                .where(
                    Probe.endpoint == endpoint,
                    Probe.started_at >= since,
                    Probe.started_at < until,
                    Probe.state == ProbeState.DONE.value,
                )
                .group_by(index, Probe.verdict)
            ).all()
        slices: dict[int, dict[str, Any]] = {}
        for idx, verdict, count, max_duration, planned, reported in rows:
            s = slices.setdefault(
                int(idx), {"verdicts": {}, "duration": None, "planned": None, "reported": None}
            )
            s["verdicts"][str(verdict)] = int(count)
            s["duration"] = _max(s["duration"], max_duration)
            s["planned"] = _max(s["planned"], planned)
            s["reported"] = _min(s["reported"], reported)
        return [
            Bucket(
                index=i,
                start=since + timedelta(seconds=i * width),
                verdicts=dict(sorted(s["verdicts"].items())),
                max_duration_seconds=s["duration"],
                planned_prompt_tokens=None if s["planned"] is None else int(s["planned"]),
                reported_prompt_tokens=None if s["reported"] is None else int(s["reported"]),
            )
            for i, s in sorted(slices.items())
        ]

    # -- alerts ---------------------------------------------------------------------------

    def alerts(self, store: Store, resolved_since: datetime) -> list[AlertStateRecord]:
        """Firing and pending alerts, then those resolved at or after ``resolved_since``."""
        # The alert_states table holds one row per (alert, endpoint, probe): small by design.
        states = store.load_alert_states()
        active = [a for a in states if a.state in ("firing", "pending")]
        resolved = [
            a
            for a in states
            if a.state == "resolved" and (a.ends_at or a.updated_at) >= resolved_since
        ]
        active.sort(key=lambda a: (a.state != "firing", a.starts_at or a.updated_at), reverse=False)
        resolved.sort(key=lambda a: a.ends_at or a.updated_at, reverse=True)
        return active + resolved

    # -- helpers --------------------------------------------------------------------------

    @contextmanager
    def _connect(self, what: str) -> Iterator[Connection]:
        try:
            with self._engine.connect() as connection:
                yield connection
        except SQLAlchemyError as exc:
            orig = getattr(exc, "orig", None)
            message = str(orig if orig is not None else exc).strip().splitlines()
            raise StoreError(f"{what}: {message[0] if message else type(exc).__name__}") from exc


def _conditions(f: ProbeFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if f.endpoint is not None:
        conditions.append(Probe.endpoint == f.endpoint)
    if f.kind is not None:
        conditions.append(Probe.kind == f.kind)
    if f.verdict is not None:
        conditions.append(Probe.verdict == f.verdict)
    if f.since is not None:
        conditions.append(Probe.started_at >= f.since)
    if f.until is not None:
        conditions.append(Probe.started_at < f.until)
    return conditions


def _percentiles(
    c: Connection, window: Sequence[ColumnElement[bool]], n: int, qs: Sequence[float]
) -> list[float | None]:
    """Linear-interpolated percentiles of finished probes' durations, like percentile_cont.

    The database sorts and hands back only the (at most two) rows around each percentile:
    the same arithmetic on both databases, and a 30-day window's durations never cross the
    wire.
    """
    if n == 0:
        return [None for _ in qs]
    positions = {q: (n - 1) * q for q in qs}
    wanted = sorted({p for pos in positions.values() for p in (int(pos), min(int(pos) + 1, n - 1))})
    ranked = (
        select(
            Probe.duration_seconds.label("d"),
            (func.row_number().over(order_by=Probe.duration_seconds) - 1).label("rn"),
        )
        .where(*window, Probe.state == ProbeState.DONE.value, Probe.duration_seconds.is_not(None))
        .subquery()
    )
    values = dict(
        (int(rn), float(d))
        for d, rn in c.execute(select(ranked.c.d, ranked.c.rn).where(ranked.c.rn.in_(wanted)))
    )
    result: list[float | None] = []
    for q in qs:
        pos = positions[q]
        low, high = int(pos), min(int(pos) + 1, n - 1)
        result.append(values[low] + (values[high] - values[low]) * (pos - low))
    return result


def _bucket_index(c: Connection, since: datetime, width: int) -> ColumnElement[Any]:
    if c.dialect.name == "postgresql":
        offset = func.extract("epoch", Probe.started_at - literal(since, Probe.started_at.type))
        return cast(func.floor(offset / width), Integer)
    # SQLite keeps naive UTC text; strftime('%s') reads it as UTC seconds since the epoch.
    seconds = cast(func.strftime("%s", Probe.started_at), Integer)
    # Floor division: "/" would be true division in SQLAlchemy 2 and give one group per row.
    return (seconds - int(since.timestamp())) // width


def _when(condition: ColumnElement[bool], value: Any) -> ColumnElement[Any]:
    return case((condition, value), else_=None)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _brief() -> Any:
    return select(
        Probe.id, Probe.kind, Probe.state, Probe.verdict, Probe.started_at, Probe.duration_seconds
    )


def _brief_row(row: Any) -> ProbeBrief:
    return ProbeBrief(
        id=row.id,
        kind=row.kind,
        state=row.state,
        verdict=row.verdict,
        started_at=row.started_at,
        duration_seconds=row.duration_seconds,
    )


def _endpoint(row: Any) -> EndpointInfo:
    return EndpointInfo(
        name=row.name,
        url=row.url,
        flavour=row.flavour,
        model=row.model,
        context_window=row.context_window,
        kv_pool_tokens=row.kv_pool_tokens,
        labels={str(k): str(v) for k, v in row.labels.items()},
    )


__all__ = [
    "MAX_PAGE",
    "Bucket",
    "CursorError",
    "EndpointInfo",
    "EndpointOverview",
    "HistoryQueries",
    "ProbeBrief",
    "ProbeFilter",
    "ProbePage",
    "Summary",
]
