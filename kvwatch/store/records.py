"""What goes into and comes out of the store: frozen records, never ORM rows.

Callers (the daemon, through ``asyncio.to_thread``; the web layer; the CLI) hold these across
awaits and threads freely, because no session or lazy load hides behind them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kvwatch.canary.model import ForeignMarker, ProbeState


@dataclass(frozen=True, slots=True, kw_only=True)
class NewProbe:
    """A probe about to send its request: written (state running) before anything goes out."""

    endpoint: str
    endpoint_id: int
    kind: str
    started_at: datetime
    replica: str
    model: str
    planned_prompt_tokens: int
    target_prompt_tokens: int
    max_tokens: int
    token_source: str
    tokenize_calls: int
    marker: str  # as issued (KVW-XXXX-XXXX-XXXX); stored canonically in ``markers`` too
    marker_depth: float
    streamed: bool
    confirms_probe_id: int | None = None
    slot: int | None = None  # the scheduled slot (epoch seconds) it runs for


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOutcome:
    """The verdict of a probe with the evidence it rests on."""

    verdict: str
    reason: str
    finished_at: datetime
    reported_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    marker_found: bool | None = None
    foreign_markers: Sequence[ForeignMarker] = ()
    http_status: int | None = None
    finish_reason: str | None = None
    answer_excerpt: str | None = None  # bounded by the caller
    error_body: str | None = None  # bounded by the caller
    error_detail: str | None = None
    ttfb_seconds: float | None = None
    duration_seconds: float | None = None
    # What planning settled. A scheduled probe's row is begun before it is planned (its slot
    # claim and its start are one transaction, and a replica that loses the claim must not
    # plan); these complete the row when it finishes. None keeps the value it was begun with.
    planned_prompt_tokens: int | None = None
    target_prompt_tokens: int | None = None
    tokenize_calls: int | None = None
    marker_depth: float | None = None
    token_source: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRow:
    """One stored probe, every column."""

    id: int
    endpoint: str
    endpoint_id: int
    kind: str
    state: ProbeState
    verdict: str | None
    reason: str | None
    started_at: datetime
    finished_at: datetime | None
    replica: str
    model: str
    planned_prompt_tokens: int
    target_prompt_tokens: int
    reported_prompt_tokens: int | None
    completion_tokens: int | None
    max_tokens: int
    token_source: str
    tokenize_calls: int
    marker: str
    marker_depth: float
    marker_found: bool | None
    foreign_markers: tuple[ForeignMarker, ...]
    http_status: int | None
    finish_reason: str | None
    streamed: bool
    answer_excerpt: str | None
    error_body: str | None
    error_detail: str | None
    ttfb_seconds: float | None
    duration_seconds: float | None
    confirms_probe_id: int | None
    slot: int | None = None
    region: str | None = None  # of the replica that ran it; None without multi-region mode


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertStateRecord:
    """The persisted state of one alert for one (alertname, endpoint, probe)."""

    alertname: str
    endpoint: str
    probe: str  # probe kind; "" for endpoint-level alerts
    state: str  # inactive | pending | firing | resolved
    severity: str
    updated_at: datetime
    failures: int = 0  # consecutive
    passes: int = 0  # consecutive
    starts_at: datetime | None = None
    ends_at: datetime | None = None  # resolution time
    last_probe_id: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    generator_url: str | None = None


def foreign_marker_to_json(marker: ForeignMarker) -> dict[str, Any]:
    if marker.issued_at.tzinfo is None:
        raise ValueError(f"foreign marker {marker.marker} has a naive issued_at")
    return {
        "marker": marker.marker,
        "probe_id": marker.probe_id,
        "endpoint": marker.endpoint,
        "issued_at": marker.issued_at.astimezone(UTC).isoformat(),
    }


def foreign_marker_from_json(data: dict[str, Any]) -> ForeignMarker:
    return ForeignMarker(
        marker=str(data["marker"]),
        probe_id=int(data["probe_id"]),
        endpoint=str(data["endpoint"]),
        issued_at=datetime.fromisoformat(str(data["issued_at"])),
    )
