"""ORM models: the tables kvwatch keeps. The migrations in ``migrations/`` create exactly these.

Rows never leave :mod:`kvwatch.store.repository`; callers get frozen records instead, so no
one holds a session across an ``await``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kvwatch.store.types import UTCDateTime, json_type

# Deterministic constraint names: Alembic's SQLite batch mode and later migrations can only
# drop or alter a constraint they can name, and the name must agree across databases.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on PostgreSQL; SQLite only auto-increments a column declared exactly INTEGER.
Id = BigInteger().with_variant(Integer(), "sqlite")

PROBE_STATES = ("running", "done", "interrupted")
# A region name (config: 1-63 letters, digits, '_', '.', '-'); "" in keys means no region.
REGION_LENGTH = 63
# A tenant name (config: 1-63 letters, digits, '_', '.', '-'; never its key).
TENANT_LENGTH = 63
# A W3C / B3 trace id: 16 bytes in lower-case hex.
TRACE_ID_LENGTH = 32
ALERT_STATES = ("inactive", "pending", "firing", "resolved")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime()}


class Endpoint(Base):
    __tablename__ = "endpoints"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    url: Mapped[str] = mapped_column(Text)
    flavour: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(200))
    context_window: Mapped[int | None] = mapped_column(BigInteger)
    kv_pool_tokens: Mapped[int | None] = mapped_column(BigInteger)
    labels: Mapped[dict[str, Any]] = mapped_column(json_type())
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Probe(Base):
    __tablename__ = "probes"
    __table_args__ = (
        CheckConstraint(_in("state", PROBE_STATES), name="state"),
        Index(None, "endpoint", "kind", "started_at"),
        Index(None, "verdict", "started_at"),
        Index(None, "state", "replica"),
        Index(None, "started_at"),
        # History review (migration 0002): one endpoint's probes newest first, all kinds or
        # one verdict; the confirmations of a probe.
        Index(
            "ix_probes_history",
            "endpoint",
            "started_at",
            "id",
            "state",
            "kind",
            "verdict",
            "duration_seconds",
            "planned_prompt_tokens",
            "reported_prompt_tokens",
            "completion_tokens",
        ),
        Index(None, "endpoint", "verdict", "started_at", "id"),
        Index(None, "confirms_probe_id"),
        Index(None, "endpoint", "kind", "slot"),
        # Ids are permalinks (/probes/{id}): SQLite must never hand out a pruned id again.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    endpoint: Mapped[str] = mapped_column(String(200))
    endpoint_id: Mapped[int] = mapped_column(Id, ForeignKey("endpoints.id"))
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    replica: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    planned_prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    target_prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    reported_prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # Prompt tokens the engine said it served from its prefix cache (migration 0012); NULL
    # when it did not say, which is not 0.
    cached_prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    max_tokens: Mapped[int] = mapped_column(Integer)
    token_source: Mapped[str] = mapped_column(Text)
    tokenize_calls: Mapped[int] = mapped_column(Integer)
    marker: Mapped[str] = mapped_column(String(64))
    marker_depth: Mapped[float] = mapped_column(Float)
    marker_found: Mapped[bool | None] = mapped_column(Boolean)
    foreign_markers: Mapped[list[dict[str, Any]]] = mapped_column(json_type())
    http_status: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    streamed: Mapped[bool] = mapped_column(Boolean)
    answer_excerpt: Mapped[str | None] = mapped_column(Text)
    error_body: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[str | None] = mapped_column(Text)
    ttfb_seconds: Mapped[float | None] = mapped_column(Float)
    duration_seconds: Mapped[float | None] = mapped_column(Float)
    # A pruned original must not take its kept confirmation with it.
    confirms_probe_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("probes.id", ondelete="SET NULL")
    )
    # The scheduled slot (epoch seconds) this probe ran for; NULL for one-shot probes.
    slot: Mapped[int | None] = mapped_column(BigInteger)
    # The region of the replica that ran it (migration 0005); NULL without multi-region mode.
    region: Mapped[str | None] = mapped_column(String(REGION_LENGTH))
    # The tenant whose credentials the request was sent with (migration 0006); NULL when it
    # used the endpoint's own api_key.
    tenant: Mapped[str | None] = mapped_column(String(TENANT_LENGTH))
    # A bisect probe's trigger: the failing probe whose served window it helped measure
    # (migration 0007). Like a confirmation, it must survive the pruning of its trigger.
    trigger_probe_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("probes.id", ondelete="SET NULL")
    )
    # One entry per marker when the prompt carried one per depth (migration 0008): depth,
    # marker as issued, outcome (null until judged). NULL for a single-marker probe. A burst
    # probe carries one marker per request instead: one entry per request, keyed "request"
    # (kvwatch.store.records.burst_to_json).
    depth_outcomes: Mapped[list[dict[str, Any]] | None] = mapped_column(json_type())
    # The trace id (32 hex digits) every request of the probe carried (migration 0010), to
    # find the engine's spans; NULL with tracing off and for probes from before it.
    trace_id: Mapped[str | None] = mapped_column(String(TRACE_ID_LENGTH))
    # The endpoint change whose canaries this probe is (migration 0011): run at once when the
    # engine's self-report changed, outside the schedule. NULL for scheduled probes. No
    # foreign key: adding one to ``probes`` on SQLite means copying the table, and dropping
    # the old one would cascade-delete ``markers``; changes are never pruned anyway.
    change_id: Mapped[int | None] = mapped_column(BigInteger)


SERVED_WINDOW_SOURCES = ("search", "recovered")


class ServedWindow(Base):
    """What an endpoint really serves (migration 0007), one row per measurement.

    ``search``: the largest prompt served whole, found by bisect probes after a window
    failure (``served_tokens`` passed, ``unserved_tokens`` did not). ``recovered``: an under
    probe passed again, so the advertised window is served (``served_tokens`` = advertised).
    An endpoint's current served window is its latest row.
    """

    __tablename__ = "served_windows"
    __table_args__ = (
        CheckConstraint(_in("source", SERVED_WINDOW_SOURCES), name="source"),
        Index(None, "endpoint", "measured_at", "id"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    endpoint: Mapped[str] = mapped_column(String(200))
    measured_at: Mapped[datetime]
    source: Mapped[str] = mapped_column(String(16))
    advertised_tokens: Mapped[int] = mapped_column(BigInteger)
    served_tokens: Mapped[int] = mapped_column(BigInteger)
    unserved_tokens: Mapped[int | None] = mapped_column(BigInteger)
    exact: Mapped[bool] = mapped_column(Boolean)
    probes: Mapped[int] = mapped_column(Integer)  # bisect probes the measurement spent
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)  # tokens those probes sent
    # The failing probe that started the search, or the passing under probe that ended it.
    probe_id: Mapped[int | None] = mapped_column(Id, ForeignKey("probes.id", ondelete="SET NULL"))


class Marker(Base):
    __tablename__ = "markers"

    marker: Mapped[str] = mapped_column(String(12), primary_key=True)
    probe_id: Mapped[int] = mapped_column(
        Id, ForeignKey("probes.id", ondelete="CASCADE"), index=True
    )
    endpoint: Mapped[str] = mapped_column(String(200))
    issued_at: Mapped[datetime]
    # Issued under this tenant (migration 0006): a marker found in another tenant's answer
    # names whose data leaked. NULL: the endpoint's own api_key.
    tenant: Mapped[str | None] = mapped_column(String(TENANT_LENGTH))


class AlertState(Base):
    __tablename__ = "alert_states"
    __table_args__ = (
        UniqueConstraint("alertname", "endpoint", "probe", "region"),
        CheckConstraint(_in("state", ALERT_STATES), name="state"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    alertname: Mapped[str] = mapped_column(String(100))
    endpoint: Mapped[str] = mapped_column(String(200))
    probe: Mapped[str] = mapped_column(String(32))
    # Each region keeps (and pages) its own state; "" without multi-region mode.
    region: Mapped[str] = mapped_column(String(REGION_LENGTH), server_default="")
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    failures: Mapped[int] = mapped_column(Integer)
    passes: Mapped[int] = mapped_column(Integer)
    starts_at: Mapped[datetime | None]
    ends_at: Mapped[datetime | None]
    last_probe_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("probes.id", ondelete="SET NULL")
    )
    labels: Mapped[dict[str, Any]] = mapped_column(json_type())
    annotations: Mapped[dict[str, Any]] = mapped_column(json_type())
    generator_url: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


class ProbeSlot(Base):
    """A claim on one scheduled probe slot, so that with several replicas each runs once.

    The replica that inserts the row runs the slot; no transaction is held open across the
    probe. A claim whose replica died expires (``expires_at``) and another replica takes it
    over (``attempts`` counts the takeovers). ``done`` marks the slot as run.

    In multi-region mode every region runs every slot: the key holds the region ("" without
    one), so a replica shares the work only with the replicas of its own region.
    """

    __tablename__ = "probe_slots"
    __table_args__ = (Index(None, "done", "expires_at"),)

    endpoint: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    slot: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch seconds
    region: Mapped[str] = mapped_column(String(REGION_LENGTH), primary_key=True, server_default="")
    replica: Mapped[str] = mapped_column(String(200))
    claimed_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    done: Mapped[bool] = mapped_column(Boolean, default=False)
    probe_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("probes.id", ondelete="SET NULL"), nullable=True
    )


class ProbeRollup(Base):
    """Finished probes of one endpoint, one UTC hour and one verdict, aggregated.

    The 7- and 30-day charts and summaries read these (hundreds of rows) instead of every
    probe (tens of thousands). Rows are kept exact by the store: bumped in the transaction
    that finishes a probe, recomputed for the hours a prune touches, and rebuildable from
    ``probes`` at any time (``kvwatch.store.rollups.rebuild``). Durations' percentiles cannot
    be merged from aggregates, so each row also keeps its probes' durations (exact, as
    text): a percentile over 30 days parses hundreds of short strings instead of fetching
    tens of thousands of rows.
    """

    __tablename__ = "probe_rollups"
    # Clustered on the key in SQLite: a chart reads one endpoint's hours in key order.
    __table_args__ = ({"sqlite_with_rowid": False},)

    endpoint: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch seconds, UTC
    verdict: Mapped[str] = mapped_column(String(32), primary_key=True)
    probes: Mapped[int] = mapped_column(Integer)
    timed: Mapped[int] = mapped_column(Integer)  # probes with a duration
    max_duration_seconds: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)  # reported by the engine
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    max_planned_under: Mapped[int | None] = mapped_column(BigInteger)  # under probes only
    min_reported_under: Mapped[int | None] = mapped_column(BigInteger)  # under probes only
    # Space-separated, each written so that float() gives back the stored double exactly.
    durations: Mapped[str] = mapped_column(Text)


# Migration 0004: a summary counts the few unfinished probes of its window from ``probes``
# (rollups hold finished ones only). A partial index holds just those rows, stays tiny, and
# no other query can use it (none says ``state <> 'done'``), so no plan changes elsewhere.
_UNFINISHED = Probe.state != "done"
Index(
    "ix_probes_unfinished",
    Probe.endpoint,
    Probe.started_at,
    sqlite_where=_UNFINISHED,
    postgresql_where=_UNFINISHED,
)

# Migration 0004: the latest finished probe of an endpoint and kind (the overview's badges)
# is the first entry under one key. Without it, a prepared statement's generic plan walks
# ix_probes_history backwards through the whole endpoint for a kind it never ran.
Index("ix_probes_latest", Probe.endpoint, Probe.kind, Probe.state, Probe.started_at, Probe.id)


CHANGE_REASONS = ("fingerprint", "restart")
# due: its canaries may run now; held: not before due_at (the minimum gap); ran: they were
# started; superseded: a later change of the endpoint took its place before they ran; off:
# the endpoint has on_change: false (the change is kept as history only).
CHANGE_STATES = ("due", "held", "ran", "superseded", "off")


class EndpointFingerprint(Base):
    """The latest fingerprint of each endpoint's self-report (migration 0011), per region.

    ``digest`` makes the update a compare-and-set: of two replicas that saw the same change,
    one records it. ``misses`` counts self-reports missed in a row (kvwatch.fingerprint)."""

    __tablename__ = "endpoint_fingerprints"

    endpoint: Mapped[str] = mapped_column(String(200), primary_key=True)
    region: Mapped[str] = mapped_column(String(REGION_LENGTH), primary_key=True, server_default="")
    fields: Mapped[dict[str, Any] | None] = mapped_column(json_type())
    digest: Mapped[str | None] = mapped_column(String(64))
    misses: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime]


class EndpointChange(Base):
    """A change in what an endpoint says about itself (migration 0011): the event, its
    before and after fields, and when its canaries may run (``due_at``) or ran."""

    __tablename__ = "endpoint_changes"
    __table_args__ = (
        CheckConstraint(_in("reason", CHANGE_REASONS), name="reason"),
        CheckConstraint(_in("state", CHANGE_STATES), name="state"),
        Index(None, "endpoint", "at"),
        Index(None, "state", "due_at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    endpoint: Mapped[str] = mapped_column(String(200))
    region: Mapped[str] = mapped_column(String(REGION_LENGTH), server_default="")
    at: Mapped[datetime]
    reason: Mapped[str] = mapped_column(String(16))
    before: Mapped[dict[str, Any]] = mapped_column(json_type())
    after: Mapped[dict[str, Any]] = mapped_column(json_type())
    fields: Mapped[list[str]] = mapped_column(json_type())  # the fields that differ
    state: Mapped[str] = mapped_column(String(16))
    due_at: Mapped[datetime]
    ran_at: Mapped[datetime | None]
    replica: Mapped[str] = mapped_column(String(200))  # the replica that saw it


class TokenCalibration(Base):
    """What an endpoint's own token counts taught an estimating tokenizer (migration 0009).

    One row per endpoint, tokenizer (``token_source``: ``usage``, ``tiktoken:…``, ``hf:…``)
    and size class (the octave of prompt sizes it was learnt at), replaced as reports
    arrive, so a restart or a one-shot ``kvwatch probe`` plans from the calibration the last
    process reached instead of starting blind.
    """

    __tablename__ = "token_calibrations"

    endpoint: Mapped[str] = mapped_column(String(200), primary_key=True)
    token_source: Mapped[str] = mapped_column(String(300), primary_key=True)
    size_class: Mapped[int] = mapped_column(Integer, primary_key=True)
    ratio: Mapped[float] = mapped_column(Float)
    error: Mapped[float] = mapped_column(Float)
    observations: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime]
