"""Read-side queries for reviewing history: the web pages, the JSON API and the CLI.

Every query here is shaped to walk an index newest first and stop early (see migration 0002),
so it stays fast however long the history grows: pages follow ``(started_at, id)``
descending, the overview reads a few rows per endpoint, and charts are aggregated into time
buckets by the database rather than fetched row by row.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    String,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    select,
    true,
    tuple_,
    union_all,
    values,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import aliased

from kvwatch.canary.model import ProbeKind, ProbeState
from kvwatch.store import rollups
from kvwatch.store.among import name_among
from kvwatch.store.errors import StoreError
from kvwatch.store.models import Endpoint, Probe
from kvwatch.store.probes import probe_row
from kvwatch.store.records import AlertStateRecord, ProbeRow
from kvwatch.store.repository import Store

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
    region: str | None = None  # the region that ran them (multi-region mode)
    tenant: str | None = None  # sent with this tenant's credentials


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """An endpoint's chart: ``count`` slices of ``width_seconds`` from ``start``."""

    start: datetime  # start of slice 0 (on the hour before ``since`` for slices of hours)
    width_seconds: int
    count: int  # slices in the chart, empty or not
    buckets: list[Bucket]  # the slices that hold probes, by index


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

    def first_started_at(self, name: str) -> datetime | None:
        """When the oldest stored probe of endpoint ``name`` started; None before any."""
        with self._connect(f"could not read the first probe of {name!r}") as c:
            # The first entry of ix_probes_history under this endpoint.
            first: datetime | None = c.execute(
                select(func.min(Probe.started_at)).where(Probe.endpoint == name)
            ).scalar()
            return first

    def overview(
        self, recent: int = 40, only: Collection[str] | None = None
    ) -> list[EndpointOverview]:
        """Every stored endpoint, or those named in ``only``, with its latest verdict per kind
        and its ``recent`` newest probes.

        ``only`` is how the daemon's pages show the fleet it probes now: the endpoints table
        keeps every endpoint ever registered, and one that churns (reloads, discovery) adds
        rows for good. Read whole, every page view grew with them (at 500 endpoints probed and
        1,280 stored, 17 MB of objects for one overview instead of 6), and CPython's arenas
        grew to hold that peak: 9 arenas in 30 minutes with 20 endpoints replaced a minute,
        1 once only the probed ones were read (issue 25). The others' rows are not read
        at all: the database filters them (:func:`name_among`)."""
        with self._connect("could not read the overview") as c:
            query = select(Endpoint).order_by(Endpoint.name)
            if only is not None:
                query = query.where(name_among(Endpoint.name, only, c.dialect.name))
            endpoints = [_endpoint(row) for row in c.execute(query)]
            if c.dialect.name == "postgresql":
                strips, latest = _overview_lateral(c, recent, query.subquery())
            else:
                strips, latest = _overview_walks(c, [ep.name for ep in endpoints], recent)
        return [
            EndpointOverview(
                endpoint=ep,
                latest={
                    k.value: latest[ep.name][k.value]
                    for k in ProbeKind
                    if k.value in latest.get(ep.name, {})
                },
                recent=strips.get(ep.name, []),
            )
            for ep in endpoints
        ]

    # -- probes ---------------------------------------------------------------------------

    def probe(self, probe_id: int) -> ProbeRow | None:
        with self._connect(f"could not read probe {probe_id}") as c:
            row = c.execute(select(Probe).where(Probe.id == probe_id)).first()
            return None if row is None else probe_row(row)  # type: ignore[arg-type]

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
        probes = [probe_row(r) for r in rows[:limit]]  # type: ignore[arg-type]
        more = len(rows) > limit
        return ProbePage(probes=probes, next_before_id=probes[-1].id if more else None)

    # -- aggregates -----------------------------------------------------------------------

    def summary(self, endpoint: str, since: datetime, until: datetime) -> Summary:
        """Counts per verdict, pass rate, duration percentiles and tokens in a window.

        Finished probes are counted from the hourly rollups for whole hours and from the
        probes themselves at the window's ragged ends; unfinished ones from the probes (they
        are few). Percentiles come from the durations each rollup row keeps.
        """
        with self._connect(f"could not summarise {endpoint!r}") as c:
            tallies: dict[str, _Tally] = {}
            texts: list[str] = []
            for _, verdict, tally in _finished(c, endpoint, since, until, durations=True):
                tallies.setdefault(verdict, _Tally()).merge(tally)
                texts.append(tally.durations)
            unfinished = c.execute(
                select(
                    Probe.state,
                    func.count(),
                    func.coalesce(func.sum(Probe.reported_prompt_tokens), 0),
                    func.coalesce(func.sum(Probe.completion_tokens), 0),
                )
                .where(
                    Probe.endpoint == endpoint,
                    # The exact term of the partial index ix_probes_unfinished.
                    Probe.state != ProbeState.DONE.value,
                    Probe.started_at >= since,
                    Probe.started_at < until,
                )
                .group_by(Probe.state)
            ).all()
        durations = _percentiles(" ".join(texts), (0.50, 0.95))
        states = {str(state): int(count) for state, count, _, _ in unfinished}
        verdicts = {v: t.probes for v, t in sorted(tallies.items()) if t.probes}
        finished = sum(verdicts.values())
        return Summary(
            endpoint=endpoint,
            since=since,
            until=until,
            total=finished + sum(states.values()),
            finished=finished,
            running=states.get(ProbeState.RUNNING.value, 0),
            interrupted=states.get(ProbeState.INTERRUPTED.value, 0),
            verdicts=verdicts,
            pass_rate=verdicts.get("pass", 0) / finished if finished else None,
            p50_duration_seconds=durations[0],
            p95_duration_seconds=durations[1],
            prompt_tokens=sum(t.prompt_tokens for t in tallies.values())
            + sum(int(p) for _, _, p, _ in unfinished),
            completion_tokens=sum(t.completion_tokens for t in tallies.values())
            + sum(int(n) for _, _, _, n in unfinished),
        )

    def timeline(
        self, endpoint: str, since: datetime, until: datetime, buckets: int = 120
    ) -> Timeline:
        """About ``buckets`` equal slices of ``[since, until)`` of finished probes.

        Slices shorter than an hour are whole seconds, ``buckets`` of them when that splits
        the window exactly (fewer otherwise), and are aggregated by the database. Longer ones
        are whole hours on the UTC hour grid (so 7 days in 120 slices become 85 slices of
        2 hours), which lets the hourly rollups answer: the first slice starts on the hour
        before ``since`` but counts only probes from ``since`` on.
        """
        if buckets < 1:
            raise ValueError(f"buckets must be at least 1, got {buckets}")
        span = (until - since).total_seconds()
        if span <= 0:
            raise ValueError("since must be before until")
        # Whole seconds per bucket keep the SQL integer arithmetic identical on both databases.
        width = max(1, -(-int(span) // buckets))
        if width < rollups.HOUR:
            return Timeline(
                start=since,
                width_seconds=width,
                # Fewer slices when whole seconds do not divide the window: the chart still
                # ends at ``until`` rather than run on past it.
                count=math.ceil(span / width),
                buckets=self._fine_timeline(endpoint, since, until, width),
            )
        width = -(-width // rollups.HOUR) * rollups.HOUR
        origin = rollups.hour_start(rollups.hour_of(since))
        count = -(-(until - origin) // timedelta(seconds=width))
        slices: dict[int, tuple[dict[str, int], _Tally]] = {}
        with self._connect(f"could not read the timeline of {endpoint!r}") as c:
            finished = _finished(
                c, endpoint, since, until, durations=False, origin=origin, width=width
            )
            for at, verdict, tally in finished:
                index = int((at - origin).total_seconds()) // width
                counts, merged = slices.setdefault(index, ({}, _Tally()))
                counts[verdict] = counts.get(verdict, 0) + tally.probes
                merged.merge(tally)
        return Timeline(
            start=origin,
            width_seconds=width,
            count=count,
            buckets=[
                Bucket(
                    index=i,
                    start=origin + timedelta(seconds=i * width),
                    verdicts=dict(sorted(counts.items())),
                    max_duration_seconds=t.max_duration_seconds,
                    planned_prompt_tokens=t.max_planned_under,
                    reported_prompt_tokens=t.min_reported_under,
                )
                for i, (counts, t) in sorted(slices.items())
            ],
        )

    def _fine_timeline(
        self, endpoint: str, since: datetime, until: datetime, width: int
    ) -> list[Bucket]:
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
        states = store.listed_alert_states(resolved_since)
        active = [a for a in states if a.state in ("firing", "pending")]
        resolved = [a for a in states if a.state == "resolved"]
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
    if f.region is not None:
        conditions.append(Probe.region == f.region)
    if f.tenant is not None:
        conditions.append(Probe.tenant == f.tenant)
    if f.since is not None:
        conditions.append(Probe.started_at >= f.since)
    if f.until is not None:
        conditions.append(Probe.started_at < f.until)
    return conditions


def _percentiles(texts: str, qs: Sequence[float]) -> list[float | None]:
    """Linear-interpolated percentiles (as percentile_cont) of space-separated durations."""
    durations = sorted(map(float, texts.split()))
    n = len(durations)
    if n == 0:
        return [None for _ in qs]
    result: list[float | None] = []
    for q in qs:
        pos = (n - 1) * q
        low, high = int(pos), min(int(pos) + 1, n - 1)
        result.append(durations[low] + (durations[high] - durations[low]) * (pos - low))
    return result


@dataclass(slots=True)
class _Tally:
    """Finished probes of one verdict in some stretch of time, as a rollup row holds them."""

    probes: int = 0
    timed: int = 0
    max_duration_seconds: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_planned_under: int | None = None
    min_reported_under: int | None = None
    durations: str = ""  # as probe_rollups.durations, when asked for (merge() skips it)

    def merge(self, other: _Tally) -> None:
        self.probes += other.probes
        self.timed += other.timed
        self.max_duration_seconds = _max(self.max_duration_seconds, other.max_duration_seconds)
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.max_planned_under = _max(self.max_planned_under, other.max_planned_under)
        self.min_reported_under = _min(self.min_reported_under, other.min_reported_under)


def _finished(
    c: Connection,
    endpoint: str,
    since: datetime,
    until: datetime,
    *,
    durations: bool,
    origin: datetime | None = None,
    width: int | None = None,
) -> Iterator[tuple[datetime, str, _Tally]]:
    """Finished probes of ``[since, until)`` as (time, verdict, tally).

    The whole hours inside the window come from the rollups, merged by the database into
    one tally per verdict and per slice of ``width`` seconds from ``origin`` (whole hours;
    by default one slice), timed at the slice's first hour in the window; the ragged ends
    come one tally per probe.
    """
    first = rollups.hour_of(since)
    first_full = first if rollups.hour_start(first) == since else first + rollups.HOUR
    end_full = rollups.hour_of(until)
    if first_full < end_full:
        ends = [
            (since, rollups.hour_start(first_full)),
            (rollups.hour_start(end_full), until),
        ]
        start = first_full if origin is None else int(origin.timestamp())
        step = width or end_full - first_full
        yield from _rolled_up(c, endpoint, first_full, end_full, start, step, durations)
    else:
        ends = [(since, until)]
    for low, high in ends:
        if low < high:
            yield from _one_by_one(c, endpoint, low, high)


def _rolled_up(
    c: Connection,
    endpoint: str,
    first_full: int,
    end_full: int,
    start: int,
    step: int,
    durations: bool,
) -> Iterator[tuple[datetime, str, _Tally]]:
    """The whole hours ``[first_full, end_full)`` from the rollups, one tally per verdict and
    slice of ``step`` seconds from ``start``, timed at the slice's first hour in the window."""
    for r in rollups.read(
        c, endpoint, first_full, end_full, origin=start, width=step, durations=durations
    ):
        yield (
            rollups.hour_start(max(first_full, start + int(r.slice) * step)),
            r.verdict,
            _Tally(
                probes=int(r.probes),
                timed=int(r.timed),
                max_duration_seconds=r.max_duration_seconds,
                prompt_tokens=int(r.prompt_tokens),
                completion_tokens=int(r.completion_tokens),
                max_planned_under=_int(r.max_planned_under),
                min_reported_under=_int(r.min_reported_under),
                durations=(r.durations or "") if durations else "",
            ),
        )


def _one_by_one(
    c: Connection, endpoint: str, low: datetime, high: datetime
) -> Iterator[tuple[datetime, str, _Tally]]:
    """The finished probes of ``[low, high)``, a ragged end of a window, one tally each."""
    rows = c.execute(
        select(
            Probe.started_at,
            Probe.verdict,
            Probe.kind,
            Probe.duration_seconds,
            Probe.planned_prompt_tokens,
            Probe.reported_prompt_tokens,
            Probe.completion_tokens,
        ).where(
            Probe.endpoint == endpoint,
            Probe.started_at >= low,
            Probe.started_at < high,
            Probe.state == ProbeState.DONE.value,
            Probe.verdict.is_not(None),
        )
    )
    for at, verdict, kind, duration, planned, reported, completion in rows:
        under = kind == ProbeKind.UNDER.value
        yield (
            at,
            verdict,
            _Tally(
                probes=1,
                timed=0 if duration is None else 1,
                max_duration_seconds=duration,
                prompt_tokens=reported or 0,
                completion_tokens=completion or 0,
                max_planned_under=planned if under else None,
                min_reported_under=reported if under else None,
                durations=rollups.duration_text(duration),
            ),
        )


def _overview_walks(
    c: Connection, names: Sequence[str], recent: int
) -> tuple[dict[str, list[ProbeBrief]], dict[str, dict[str, ProbeBrief]]]:
    # SQLite has no LATERAL; its queries cost no round trip, so short index walks per
    # endpoint are as fast, provided each endpoint costs one statement built once: building
    # a statement per endpoint and kind (6,000 at 1,000 endpoints) took half of a 5 s page.
    statement = _walks_statement(recent)
    strips: dict[str, list[ProbeBrief]] = {}
    latest: dict[str, dict[str, ProbeBrief]] = {}
    for name in names:
        strip: list[ProbeBrief] = []
        found: dict[str, ProbeBrief] = {}
        for row in c.execute(statement, {"name": name}):
            if row.arm == _STRIP_ARM:
                strip.append(_brief_row(row))
            else:
                found[row.kind] = _brief_row(row)
        # UNION ALL keeps no order of its own: the strip is sorted here, newest first.
        strip.sort(key=lambda p: (p.started_at, p.id), reverse=True)
        strips[name] = strip
        latest[name] = found
    return strips, latest


_STRIP_ARM = "strip"


# One statement per value of ``recent`` the callers pass (the page's strip and the API's 0).
@functools.cache
def _walks_statement(recent: int) -> Any:
    """One endpoint's ``recent`` newest probes and its newest finished probe of each kind
    (found by :func:`_latest_finished_id`), in one statement, an arm per walk labelled by
    ``arm``."""
    name = bindparam("name", type_=String)

    def arm(label: str, walk: Any) -> Any:
        return select(walk.add_columns(literal(label, String).label("arm")).subquery())

    strip = (
        _brief()
        .where(Probe.endpoint == name)
        .order_by(Probe.started_at.desc(), Probe.id.desc())
        .limit(recent)
    )
    kinds = [
        arm(
            kind.value,
            _brief().where(Probe.id == _latest_finished_id(name, kind.value).scalar_subquery()),
        )
        for kind in ProbeKind
    ]
    return union_all(arm(_STRIP_ARM, strip), *kinds)


def _latest_finished_id(endpoint: Any, kind: Any) -> Any:
    """The id of ``endpoint``'s newest finished probe of ``kind``, for both databases.

    Only the id: then ix_probes_latest answers each (endpoint, kind) with one index probe.
    Asking for more columns makes the covering ix_probes_history look cheaper to both
    planners, and for a kind the endpoint never ran it is walked backwards through the
    endpoint's whole history. Its own alias, so it never correlates with the query around it.
    """
    p = aliased(Probe, name="p")
    return (
        select(p.id)
        .where(p.endpoint == endpoint, p.kind == kind, p.state == ProbeState.DONE.value)
        .order_by(p.started_at.desc(), p.id.desc())
        .limit(1)
    )


def _overview_lateral(
    c: Connection, recent: int, shown: Any
) -> tuple[dict[str, list[ProbeBrief]], dict[str, dict[str, ProbeBrief]]]:
    # On PostgreSQL each statement is a round trip: two LATERAL joins do every endpoint's
    # short index walks in two statements instead of two per endpoint. ``shown``: the
    # endpoints' query as a subquery, so only those shown are walked.
    strips: dict[str, list[ProbeBrief]] = {}
    latest: dict[str, dict[str, ProbeBrief]] = {}
    newest = Probe.started_at.desc(), Probe.id.desc()
    if recent > 0:
        strip = (
            _brief().where(Probe.endpoint == shown.c.name).order_by(*newest).limit(recent)
        ).lateral("strip")
        rows = c.execute(
            select(shown.c.name.label("endpoint"), strip)
            .select_from(shown)
            .join(strip, true())
            .order_by(shown.c.name, strip.c.started_at.desc(), strip.c.id.desc())
        )
        for r in rows:
            strips.setdefault(r.endpoint, []).append(_brief_row(r))
    kinds = values(column("kind", String(32)), name="kinds").data([(k.value,) for k in ProbeKind])
    last = _latest_finished_id(shown.c.name, kinds.c.kind).lateral("last")
    rows = c.execute(
        _brief()
        .add_columns(shown.c.name.label("endpoint"))
        .select_from(shown)
        .join(kinds, true())
        .join(last, true())
        .join(Probe, Probe.id == last.c.id)
    )
    for r in rows:
        latest.setdefault(r.endpoint, {})[r.kind] = _brief_row(r)
    return strips, latest


def _bucket_index(c: Connection, since: datetime, width: int) -> ColumnElement[Any]:
    if c.dialect.name == "postgresql":
        offset = func.extract("epoch", Probe.started_at - literal(since, Probe.started_at.type))
        return cast(func.floor(offset / width), Integer)
    # SQLite keeps naive UTC text; strftime('%s') reads it as UTC seconds since the epoch.
    seconds = cast(func.strftime("%s", Probe.started_at), Integer)
    # Floor division: "/" would be true division in SQLAlchemy 2 and give one group per row.
    return (seconds - int(since.timestamp())) // width


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


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
    "Timeline",
]
