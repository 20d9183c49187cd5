"""The JSON shapes of the API (``/api/v1``), as pydantic models so the OpenAPI document is
exact, and the conversions from store records to them.

``kvwatch show --output json`` prints the same :class:`Probe` shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from kvwatch.canary.model import BurstRequest as BurstEvidence
from kvwatch.canary.model import CacheStep as CacheEvidence
from kvwatch.canary.model import ProbeKind
from kvwatch.store.changes import ChangeRecord
from kvwatch.store.queries import EndpointOverview, ProbeBrief, Summary
from kvwatch.store.records import (
    AlertStateRecord,
    CalibrationRecord,
    ProbeRow,
    ServedWindowRecord,
    lost_part,
)
from kvwatch.web.settings import WebSettings
from kvwatch.web.tones import severity, tone, worst


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Error(_Model):
    detail: str = Field(description="What was wrong with the request, as a sentence.")


class ProbeSummary(_Model):
    id: int
    kind: str
    state: str = Field(description="running | done | interrupted")
    verdict: str | None
    tone: str = Field(
        description="Colour class: ok, info, critical, warning, error, muted, pending."
    )
    started_at: datetime
    duration_seconds: float | None
    url: str = Field(description="The probe's permalink page.")


class ServedWindow(_Model):
    """What the endpoint really serves, as last measured."""

    source: str = Field(
        description="search: measured by bisect probes after a window failure; recovered: an "
        "under probe passed again, so the advertised window is served."
    )
    advertised_tokens: int = Field(description="The window the measurement was made against.")
    served_tokens: int = Field(
        description="The largest prompt served whole (2xx, marker recalled, every planned "
        "token reported); the advertised window once recovered."
    )
    unserved_tokens: int | None = Field(
        description="The smallest prompt proved not served whole (search only)."
    )
    exact: bool = Field(description="served_tokens + 1 was proved not served whole.")
    probes: int = Field(description="Bisect probes the measurement spent.")
    prompt_tokens: int = Field(description="Prompt tokens those probes sent.")
    measured_at: datetime
    probe_id: int | None = Field(
        description="The failing probe that started the search, or the passing under probe."
    )
    probe_url: str | None


class TokenCalibration(_Model):
    """What the endpoint's own token counts taught kvwatch's estimate, for one prompt size."""

    token_source: str = Field(description="The estimating tokenizer: usage, tiktoken:…, hf:….")
    prompt_tokens: int = Field(
        description="The size class it was learnt at: prompts of about this many tokens "
        "(a power of two)."
    )
    ratio: float = Field(description="The engine's count per token of kvwatch's raw estimate.")
    typical_error: float = Field(
        description="How far the corrected estimate typically still misses, as a fraction; "
        "boundary probes keep a margin of several times this."
    )
    observations: int = Field(description="Reports of the engine's count it was learnt from.")
    updated_at: datetime


class Endpoint(_Model):
    name: str
    url: str
    flavour: str
    model: str
    context_window: int | None
    kv_pool_tokens: int | None
    served_window_tokens: int | None = Field(
        description="The largest prompt the endpoint serves whole, as last measured (null: "
        "never measured; the advertised window when an under probe passed since)."
    )
    served_window: ServedWindow | None
    calibrations: list[TokenCalibration] = Field(
        description="Only for an endpoint whose tokens kvwatch estimates (tokenizer usage, "
        "tiktoken or hf): what the engine's own counts taught, per prompt size."
    )
    labels: dict[str, str]
    tone: str = Field(description="The most alarming tone among the latest probes.")
    latest: dict[str, ProbeSummary] = Field(
        description="The latest finished probe of each scheduled kind (bisect probes are "
        "search steps, listed with the probes)."
    )


class ForeignMarker(_Model):
    marker: str = Field(description="The marker as it was issued to the other probe.")
    probe_id: int = Field(description="The probe the marker was issued to (it leaked from).")
    endpoint: str
    tenant: str | None = Field(
        description="The tenant it was issued under (endpoints[].tenants), else null."
    )
    issued_at: datetime
    url: str


class DepthMarker(_Model):
    depth: float = Field(description="Fraction of the filler before the marker.")
    marker: str = Field(description="The marker planted at this depth, as issued.")
    outcome: str | None = Field(
        description="found | missing | foreign (another probe's marker was answered); "
        "null when not judged (no answer)."
    )


class BurstRequest(_Model):
    request: int = Field(
        description="0: the solo request; 1..N: the burst's members (a control carries the "
        "number of the member it re-asks)."
    )
    size: int = Field(
        description="Requests sent at once with it (1: the solo request or a control)."
    )
    control: bool = Field(
        description="A member that answered wrong, its same prompt sent again alone: right "
        "alone makes the burst burst_wrong, wrong alone too canary_ineffective."
    )
    marker: str = Field(description="The request's own marker, as issued.")
    expected: str = Field(description="The task's answer: the word it was asked to give back.")
    answered: str | None = Field(
        description="The last of the task's words the answer gave; null: none."
    )
    marker_found: bool = Field(description="The answer gave back the request's own marker.")
    outcome: str = Field(
        description="right | wrong | leak (another request of the burst's marker) | foreign "
        "(another probe's marker) | failed (no usable answer)."
    )
    siblings: list[int] = Field(
        description="The requests of the same cycle whose markers the answer held."
    )
    foreign_probe_ids: list[int] = Field(description="Other probes whose markers it held.")
    status: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    detail: str | None = Field(description="Why a failed request gave no answer.")
    answer: str | None = Field(description="Bounded answer; null when withheld by configuration.")


class CacheStep(_Model):
    step: str = Field(
        description="cold | warm | branch | abort | reuse | return | control, in the order sent."
    )
    document: str = Field(
        description="The planted document asked about: A, A' (A's first part, then other "
        "codes), B, or an earlier cycle's (return)."
    )
    key: str = Field(description="The fact asked for.")
    expected: str = Field(description="The code planted for it (a kvwatch marker).")
    outcome: str = Field(
        description="right | wrong | foreign (another probe's marker) | failed (no usable "
        "answer) | aborted (the abort step, disconnected after its first chunk as planned)."
    )
    cached_tokens: int | None = Field(
        description="Prompt tokens the engine said it served from its prefix cache; null when "
        "it did not say (absent is not 0)."
    )
    code_found: bool = Field(description="The answer gave the expected code.")
    answered: list[str] = Field(
        description='Other codes of the cycle the answer gave, as "<document> <key>".'
    )
    foreign_probe_ids: list[int] = Field(description="Other probes whose markers it held.")
    status: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    detail: str | None = Field(description="Why a failed step gave no answer.")
    answer: str | None = Field(description="Bounded answer; null when withheld by configuration.")


class Probe(_Model):
    id: int
    url: str
    endpoint: str
    kind: str
    state: str
    verdict: str | None
    severity: str | None = Field(description="critical | warning | info | none (DESIGN §2).")
    tone: str
    reason: str | None
    started_at: datetime
    finished_at: datetime | None
    replica: str
    region: str | None = Field(
        description="The region of the replica that ran it (multi-region mode), else null."
    )
    tenant: str | None = Field(
        description="The tenant whose credentials it was sent with (its name, never its key); "
        "null for the endpoint's own api_key."
    )
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
    foreign_markers: list[ForeignMarker]
    depths: list[DepthMarker] = Field(
        description="One entry per marker, shallowest first, when the prompt carried one per "
        "configured depth; empty for a single-marker probe."
    )
    lost: str | None = Field(
        description="Which part of the prompt the engine lost, from the depths: head | tail | "
        "middle | all | scattered | none; null for a single-marker or unjudged probe."
    )
    burst: list[BurstRequest] = Field(
        default_factory=list,
        description="A burst probe's requests, the solo one first; empty for other kinds.",
    )
    cache: list[CacheStep] = Field(
        default_factory=list,
        description="A cache probe's steps, in the order sent; empty for other kinds.",
    )
    cached_prompt_tokens: int | None = Field(
        default=None,
        description="Prompt tokens the engine said it served from its prefix cache (a cache "
        "probe: over its steps); null when it did not say.",
    )
    http_status: int | None
    finish_reason: str | None
    streamed: bool
    answer_excerpt: str | None = Field(
        description="Bounded excerpt of the answer; null when withheld by configuration."
    )
    answer_excerpt_withheld: bool = Field(
        description="True when an excerpt is stored but configuration withholds it."
    )
    error_body: str | None
    error_detail: str | None
    ttfb_seconds: float | None
    duration_seconds: float | None
    confirms_probe_id: int | None
    confirmed_by: list[int] = Field(description="Ids of the probes run to confirm this one.")
    trigger_probe_id: int | None = Field(
        description="A bisect probe's trigger: the failing probe whose served window it "
        "helped measure."
    )
    trace_id: str | None = Field(
        default=None,
        description="The trace id (32 hex digits) every request of the probe carried in its "
        "traceparent (or b3) header, to find the engine's spans; null with tracing off and "
        "for probes from before kvwatch sent one.",
        pattern="^[0-9a-f]{32}$",
    )
    change_id: int | None = Field(
        default=None,
        description="The endpoint change whose canaries this probe is (run at once when the "
        "engine's self-report changed); null for scheduled probes.",
    )


class EndpointChange(_Model):
    """A change in what the endpoint says about itself: a redeploy or a restart."""

    id: int
    endpoint: str
    at: datetime = Field(description="When a capacity check saw it.")
    reason: str = Field(
        description="fingerprint: the engine reports other facts about itself (release, "
        "window, pool, weights); restart: a new process with the same facts, or an engine "
        "that stopped answering its self-report and came back."
    )
    fields: list[str] = Field(description="The fields that differ.")
    before: dict[str, str]
    after: dict[str, str]
    state: str = Field(
        description="due | held (waits for the minimum gap, until due_at) | ran | superseded "
        "(a later change ran in its place) | off (on_change: false)"
    )
    due_at: datetime
    ran_at: datetime | None
    replica: str = Field(description="The replica that saw it.")


def endpoint_change(c: ChangeRecord) -> EndpointChange:
    return EndpointChange(
        id=c.id,
        endpoint=c.endpoint,
        at=c.at,
        reason=c.reason,
        fields=list(c.fields),
        before=dict(c.before),
        after=dict(c.after),
        state=c.state,
        due_at=c.due_at,
        ran_at=c.ran_at,
        replica=c.replica,
    )


class ProbePage(_Model):
    probes: list[Probe]
    next: int | None = Field(
        description="Pass as before_id to fetch the next (older) page; null on the last page."
    )


class Alert(_Model):
    alertname: str
    endpoint: str
    probe: str
    state: str = Field(description="pending | firing | resolved")
    severity: str
    starts_at: datetime | None
    ends_at: datetime | None
    updated_at: datetime
    failures: int
    last_probe_id: int | None
    last_probe_url: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    generator_url: str | None


class Alerts(_Model):
    alerts: list[Alert]


class EndpointSummary(_Model):
    endpoint: str
    since: datetime
    until: datetime
    total: int = Field(description="Probes started in the window, in any state.")
    finished: int
    running: int
    interrupted: int
    verdicts: dict[str, int] = Field(description="Finished probes per verdict.")
    pass_rate: float | None = Field(description="pass / finished; null without finished probes.")
    p50_duration_seconds: float | None
    p95_duration_seconds: float | None
    prompt_tokens: int = Field(description="Prompt tokens the engine reported using.")
    completion_tokens: int
    tokens_spent: int = Field(description="prompt_tokens + completion_tokens.")


def probe_path(settings: WebSettings, probe_id: int) -> str:
    base = (settings.external_url or "").rstrip("/")
    return f"{base}/probes/{probe_id}"


def probe_summary(settings: WebSettings, p: ProbeBrief) -> ProbeSummary:
    return ProbeSummary(
        id=p.id,
        kind=p.kind,
        state=p.state,
        verdict=p.verdict,
        tone=tone(p.verdict, p.state),
        started_at=p.started_at,
        duration_seconds=p.duration_seconds,
        url=probe_path(settings, p.id),
    )


def served_window(settings: WebSettings, r: ServedWindowRecord) -> ServedWindow:
    return ServedWindow(
        source=r.source,
        advertised_tokens=r.advertised_tokens,
        served_tokens=r.served_tokens,
        unserved_tokens=r.unserved_tokens,
        exact=r.exact,
        probes=r.probes,
        prompt_tokens=r.prompt_tokens,
        measured_at=r.measured_at,
        probe_id=r.probe_id,
        probe_url=None if r.probe_id is None else probe_path(settings, r.probe_id),
    )


def calibration(r: CalibrationRecord) -> TokenCalibration:
    return TokenCalibration(
        token_source=r.token_source,
        prompt_tokens=2**r.size_class,
        ratio=r.ratio,
        typical_error=r.error,
        observations=r.observations,
        updated_at=r.updated_at,
    )


def endpoint(
    settings: WebSettings,
    o: EndpointOverview,
    served: ServedWindowRecord | None = None,
    calibrations: Sequence[CalibrationRecord] = (),
) -> Endpoint:
    ep = o.endpoint
    latest = {
        kind: probe_summary(settings, p)
        for kind, p in o.latest.items()
        if kind != ProbeKind.BISECT.value
    }
    return Endpoint(
        name=ep.name,
        url=ep.url,
        flavour=ep.flavour,
        model=ep.model,
        context_window=ep.context_window,
        kv_pool_tokens=ep.kv_pool_tokens,
        served_window_tokens=None if served is None else served.served_tokens,
        served_window=None if served is None else served_window(settings, served),
        calibrations=[calibration(r) for r in calibrations],
        labels=ep.labels,
        tone=worst(p.tone for p in latest.values()),
        latest=latest,
    )


def probe(settings: WebSettings, r: ProbeRow, confirmed_by: list[int]) -> Probe:
    shown = settings.excerpt(r.answer_excerpt)
    return Probe(
        id=r.id,
        url=probe_path(settings, r.id),
        endpoint=r.endpoint,
        kind=r.kind,
        state=r.state.value,
        verdict=r.verdict,
        severity=severity(r.verdict),
        tone=tone(r.verdict, r.state.value),
        reason=r.reason,
        started_at=r.started_at,
        finished_at=r.finished_at,
        replica=r.replica,
        region=r.region,
        tenant=r.tenant,
        model=r.model,
        planned_prompt_tokens=r.planned_prompt_tokens,
        target_prompt_tokens=r.target_prompt_tokens,
        reported_prompt_tokens=r.reported_prompt_tokens,
        completion_tokens=r.completion_tokens,
        max_tokens=r.max_tokens,
        token_source=r.token_source,
        tokenize_calls=r.tokenize_calls,
        marker=r.marker,
        marker_depth=r.marker_depth,
        marker_found=r.marker_found,
        foreign_markers=[
            ForeignMarker(
                marker=f.marker,
                probe_id=f.probe_id,
                endpoint=f.endpoint,
                tenant=f.tenant,
                issued_at=f.issued_at,
                url=probe_path(settings, f.probe_id),
            )
            for f in r.foreign_markers
        ],
        depths=[DepthMarker(depth=d.depth, marker=d.marker, outcome=d.outcome) for d in r.depths],
        lost=lost_part(r.depths),
        burst=[_burst_request(b, settings) for b in r.burst],
        cache=[_cache_step(c, settings) for c in r.cache],
        cached_prompt_tokens=r.cached_prompt_tokens,
        http_status=r.http_status,
        finish_reason=r.finish_reason,
        streamed=r.streamed,
        answer_excerpt=shown,
        answer_excerpt_withheld=r.answer_excerpt is not None and shown is None,
        error_body=r.error_body,
        error_detail=r.error_detail,
        ttfb_seconds=r.ttfb_seconds,
        duration_seconds=r.duration_seconds,
        confirms_probe_id=r.confirms_probe_id,
        trigger_probe_id=r.trigger_probe_id,
        confirmed_by=confirmed_by,
        trace_id=r.trace_id,
        change_id=r.change_id,
    )


def alert(settings: WebSettings, a: AlertStateRecord) -> Alert:
    return Alert(
        alertname=a.alertname,
        endpoint=a.endpoint,
        probe=a.probe,
        state=a.state,
        severity=a.severity,
        starts_at=a.starts_at,
        ends_at=a.ends_at,
        updated_at=a.updated_at,
        failures=a.failures,
        last_probe_id=a.last_probe_id,
        last_probe_url=None if a.last_probe_id is None else probe_path(settings, a.last_probe_id),
        labels=a.labels,
        annotations=a.annotations,
        generator_url=a.generator_url,
    )


def summary(s: Summary) -> EndpointSummary:
    return EndpointSummary(
        endpoint=s.endpoint,
        since=s.since,
        until=s.until,
        total=s.total,
        finished=s.finished,
        running=s.running,
        interrupted=s.interrupted,
        verdicts=s.verdicts,
        pass_rate=s.pass_rate,
        p50_duration_seconds=s.p50_duration_seconds,
        p95_duration_seconds=s.p95_duration_seconds,
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        tokens_spent=s.prompt_tokens + s.completion_tokens,
    )


def _burst_request(b: BurstEvidence, settings: WebSettings) -> BurstRequest:
    return BurstRequest(
        request=b.index,
        size=b.size,
        control=b.control,
        marker=b.marker,
        expected=b.expected,
        answered=b.answered,
        marker_found=b.marker_found,
        outcome=b.outcome.value,
        siblings=list(b.siblings),
        foreign_probe_ids=list(b.foreign),
        status=b.status,
        prompt_tokens=b.prompt_tokens,
        completion_tokens=b.completion_tokens,
        detail=b.detail,
        answer=settings.excerpt(b.answer),
    )


def _cache_step(c: CacheEvidence, settings: WebSettings) -> CacheStep:
    return CacheStep(
        step=c.step,
        document=c.document,
        key=c.key,
        expected=c.expected,
        outcome=c.outcome.value,
        cached_tokens=c.cached_tokens,
        code_found=c.code_found,
        answered=list(c.answered),
        foreign_probe_ids=list(c.foreign),
        status=c.status,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        detail=c.detail,
        answer=settings.excerpt(c.answer),
    )
