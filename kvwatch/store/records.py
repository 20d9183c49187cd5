"""What goes into and comes out of the store: frozen records, never ORM rows.

Callers (the daemon, through ``asyncio.to_thread``; the web layer; the CLI) hold these across
awaits and threads freely, because no session or lazy load hides behind them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kvwatch.canary.localise import classify
from kvwatch.canary.model import (
    BurstOutcome,
    BurstRequest,
    CacheOutcome,
    CacheStep,
    DepthOutcome,
    DepthResult,
    ForeignMarker,
    Placement,
    ProbeState,
)


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
    tenant: str | None = None  # whose credentials it is sent with; None: the endpoint's key
    trigger_probe_id: int | None = None  # a bisect probe's trigger (the failing probe)
    trace_id: str | None = None  # the trace its requests carried; None: trace format off
    # Every marker with its depth when the prompt carries one per depth (``marker`` is the
    # first); each is stored in ``markers`` too, so a leaked one names this probe.
    placements: Sequence[Placement] = ()
    # A burst probe's markers besides ``marker`` (one per concurrent request), or a cache
    # probe's (one per planted fact), each stored in ``markers`` too before any request goes
    # out.
    burst_markers: Sequence[str] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOutcome:
    """The verdict of a probe with the evidence it rests on."""

    verdict: str
    reason: str
    finished_at: datetime
    reported_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Prompt tokens the engine said it served from its cache (a cache probe: over its steps).
    cached_prompt_tokens: int | None = None
    marker_found: bool | None = None
    foreign_markers: Sequence[ForeignMarker] = ()
    http_status: int | None = None
    finish_reason: str | None = None
    answer_excerpt: str | None = None  # bounded by the caller
    error_body: str | None = None  # bounded by the caller
    error_detail: str | None = None
    ttfb_seconds: float | None = None
    duration_seconds: float | None = None
    # Per depth, when the prompt carried one marker per depth and an answer came back.
    depths: Sequence[DepthResult] = ()
    # Per request of a burst probe (answers bounded by the caller).
    burst: Sequence[BurstRequest] = ()
    # Per step of a cache probe (answers bounded by the caller).
    cache: Sequence[CacheStep] = ()

    # What planning settled. A scheduled probe's row is begun before it is planned (its slot
    # claim and its start are one transaction, and a replica that loses the claim must not
    # plan); these complete the row when it finishes. None keeps the value it was begun with.
    planned_prompt_tokens: int | None = None
    target_prompt_tokens: int | None = None
    tokenize_calls: int | None = None
    marker_depth: float | None = None
    token_source: str | None = None


@dataclass(frozen=True, slots=True)
class DepthEvidence:
    """One marker of a several-depth probe as stored: outcome None until it was judged
    (still running, or no answer came back)."""

    depth: float
    marker: str
    outcome: str | None


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
    tenant: str | None = None  # whose credentials it was sent with; None: the endpoint's key
    trigger_probe_id: int | None = None  # a bisect probe's trigger (the failing probe)
    depths: tuple[DepthEvidence, ...] = ()  # empty for a single-marker probe
    trace_id: str | None = None  # the trace its requests carried; None: off, or older rows
    cache: tuple[CacheStep, ...] = ()  # per step of a cache probe, once judged
    # Prompt tokens the engine said it served from its cache; None: not said, or older rows.
    cached_prompt_tokens: int | None = None
    burst: tuple[BurstRequest, ...] = ()  # per request of a burst probe, once judged
    change_id: int | None = None  # the endpoint change whose canaries it is; None: scheduled


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRecord:
    """An endpoint's token calibration as stored (see kvwatch.tokens.calibration)."""

    endpoint: str
    token_source: str
    size_class: int  # the octave of prompt sizes it was learnt at (log2 of tokens, rounded)
    ratio: float
    error: float
    observations: int
    updated_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedWindowRecord:
    """One measurement of what an endpoint really serves (see kvwatch.served_window)."""

    endpoint: str
    measured_at: datetime
    source: str  # "search" (bisect probes found it) | "recovered" (under passed again)
    advertised_tokens: int
    served_tokens: int  # the largest prompt proved whole; the advertised window if recovered
    unserved_tokens: int | None  # the smallest prompt proved not whole (search only)
    exact: bool  # served_tokens + 1 was proved not whole
    probes: int  # bisect probes spent
    prompt_tokens: int  # prompt tokens those probes sent
    probe_id: int | None  # the trigger (search) or the passing under probe (recovered)

    @property
    def measured(self) -> bool:
        """A search result, as opposed to the advertised window served again."""
        return self.source == "search"


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
    data: dict[str, Any] = {
        "marker": marker.marker,
        "probe_id": marker.probe_id,
        "endpoint": marker.endpoint,
        "issued_at": marker.issued_at.astimezone(UTC).isoformat(),
    }
    if marker.tenant is not None:
        data["tenant"] = marker.tenant
    return data


def foreign_marker_from_json(data: dict[str, Any]) -> ForeignMarker:
    return ForeignMarker(
        marker=str(data["marker"]),
        probe_id=int(data["probe_id"]),
        endpoint=str(data["endpoint"]),
        issued_at=datetime.fromisoformat(str(data["issued_at"])),
        # Absent in evidence stored before tenants existed, and for the endpoint's own key.
        tenant=None if data.get("tenant") is None else str(data["tenant"]),
    )


def depths_to_json(entries: Sequence[Placement] | Sequence[DepthResult]) -> list[dict[str, Any]]:
    return [
        {
            "depth": e.depth,
            "marker": e.marker,
            "outcome": e.outcome.value if isinstance(e, DepthResult) else None,
        }
        for e in entries
    ]


def depths_from_json(data: list[dict[str, Any]] | None) -> tuple[DepthEvidence, ...]:
    return tuple(
        DepthEvidence(
            depth=float(d["depth"]),
            marker=str(d["marker"]),
            outcome=None if d.get("outcome") is None else str(d["outcome"]),
        )
        for d in data or ()
        if "depth" in d  # a burst's or cache probe's entries are not (burst_ / cache_from_json)
    )


def burst_to_json(requests: Sequence[BurstRequest]) -> list[dict[str, Any]]:
    """A burst's requests as stored (in the probe's per-marker evidence, ``depth_outcomes``:
    a burst carries one marker per request as a several-depth probe does per depth)."""
    return [
        {
            "request": r.index,
            "size": r.size,
            "marker": r.marker,
            "expected": r.expected,
            "outcome": r.outcome.value,
            "status": r.status,
            "marker_found": r.marker_found,
            "answered": r.answered,
            "siblings": list(r.siblings),
            "foreign": list(r.foreign),
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "detail": r.detail,
            "answer": r.answer,
            "control": r.control,
        }
        for r in requests
    ]


def burst_from_json(data: list[dict[str, Any]] | None) -> tuple[BurstRequest, ...]:
    """A burst's stored requests; empty for any other probe (or one never judged)."""
    entries = [d for d in data or () if "request" in d]
    return tuple(
        BurstRequest(
            index=int(d["request"]),
            size=int(d["size"]),
            marker=str(d["marker"]),
            expected=str(d["expected"]),
            outcome=BurstOutcome(d["outcome"]),
            status=_int_or_none(d.get("status")),
            marker_found=bool(d.get("marker_found")),
            answered=None if d.get("answered") is None else str(d["answered"]),
            siblings=tuple(int(i) for i in d.get("siblings") or ()),
            foreign=tuple(int(i) for i in d.get("foreign") or ()),
            prompt_tokens=_int_or_none(d.get("prompt_tokens")),
            completion_tokens=_int_or_none(d.get("completion_tokens")),
            detail=None if d.get("detail") is None else str(d["detail"]),
            answer=None if d.get("answer") is None else str(d["answer"]),
            # Stored before controls existed: no entry was one.
            control=bool(d.get("control", False)),
        )
        for d in entries
    )


def cache_to_json(steps: Sequence[CacheStep]) -> list[dict[str, Any]]:
    """A cache probe's steps as stored (in the per-marker evidence, ``depth_outcomes``, as a
    burst's requests are: a cache probe carries one marker per planted fact)."""
    return [
        {
            "step": s.step,
            "document": s.document,
            "key": s.key,
            "expected": s.expected,
            "outcome": s.outcome.value,
            "status": s.status,
            "cached_tokens": s.cached_tokens,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "code_found": s.code_found,
            "answered": list(s.answered),
            "foreign": list(s.foreign),
            "detail": s.detail,
            "answer": s.answer,
        }
        for s in steps
    ]


def cache_from_json(data: list[dict[str, Any]] | None) -> tuple[CacheStep, ...]:
    """A cache probe's stored steps; empty for any other probe (or one never judged)."""
    return tuple(
        CacheStep(
            step=str(d["step"]),
            document=str(d["document"]),
            key=str(d["key"]),
            expected=str(d["expected"]),
            outcome=CacheOutcome(d["outcome"]),
            status=_int_or_none(d.get("status")),
            cached_tokens=_int_or_none(d.get("cached_tokens")),
            prompt_tokens=_int_or_none(d.get("prompt_tokens")),
            completion_tokens=_int_or_none(d.get("completion_tokens")),
            code_found=bool(d.get("code_found")),
            answered=tuple(str(a) for a in d.get("answered") or ()),
            foreign=tuple(int(i) for i in d.get("foreign") or ()),
            detail=None if d.get("detail") is None else str(d["detail"]),
            answer=None if d.get("answer") is None else str(d["answer"]),
        )
        for d in data or ()
        if "step" in d
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def lost_part(depths: Sequence[DepthEvidence]) -> str | None:
    """Which part of the prompt a several-depth probe lost (head, tail, middle, all,
    scattered, none); None for a single-marker probe or one never judged."""
    judged = [
        DepthResult(d.depth, d.marker, DepthOutcome(d.outcome))
        for d in depths
        if d.outcome is not None
    ]
    return classify(judged).value if len(judged) > 1 else None
