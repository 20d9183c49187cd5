"""The types of one probe, below everything that runs, stores or pages on them.

:class:`Target` is an endpoint with the clients built for it, frozen; what kvwatch learns
about the endpoint while it runs (the window it plans against, the engine's last
self-report, the served window measured after a failure) lives in its one
:class:`EndpointState`, written only by the probe package. :class:`ProbeReport` is what a
finished probe looked like, for the CLI, the alerting hook and the served-window search.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kvwatch.canary.cache import KEPT_DOCUMENTS, Document
from kvwatch.canary.counting import TokenCounter
from kvwatch.canary.model import DepthResult, ForeignMarker, ProbeKind, Verdict
from kvwatch.config import EndpointSpec, TenantSpec
from kvwatch.engines.base import Discovery, Engine

# Re-exported: store and alerting read the probe package through its model only.
from kvwatch.probe.chain import TENANT_KINDS as TENANT_KINDS
from kvwatch.probe.chain import WINDOW_KINDS as WINDOW_KINDS
from kvwatch.store.records import ServedWindowRecord


def tenant_for_slot(
    tenants: Sequence[TenantSpec], slot: int, interval_seconds: float
) -> TenantSpec:
    """The tenant a scheduled slot runs under: slot number k (slots are multiples of the
    interval since the epoch) goes to tenant k mod n.

    Consecutive slots go to different tenants, so each under probe follows another tenant's
    on the engine (its pages are the freshest a stale cache can serve), every tenant is
    probed every n intervals, and a slot costs what it costs without tenants. Every replica
    and region computes the same tenant for the same slot, with no coordination.
    """
    return tenants[int(slot // interval_seconds) % len(tenants)]


@dataclass(slots=True)
class EndpointState:
    """What kvwatch has learnt about one endpoint while running; read by alerting."""

    window: int | None = None  # configured, else discovered on first use
    discovery: Discovery | None = None  # the engine's last self-report (capacity check)
    served: ServedWindowRecord | None = None  # the last served-window measurement, if read
    burst_turns: int = 0  # burst cycles run outside a scheduled slot (one-shot probes)
    # The self-report the last capacity check read here (None: the engine did not answer),
    # until the change watcher takes it (kvwatch.changes): only a check this replica ran
    # says anything about the endpoint now.
    unobserved_report: Discovery | None = None
    report_unobserved: bool = False
    # Documents the cache probe planted, oldest first, for its returning session: in memory
    # only (a restart loses them), and bounded (kvwatch.canary.cache.KEPT_DOCUMENTS).
    planted: deque[tuple[datetime, Document]] = field(
        default_factory=lambda: deque(maxlen=KEPT_DOCUMENTS)
    )


@dataclass(frozen=True, slots=True)
class Target:
    """One monitored endpoint with the clients built for it."""

    spec: EndpointSpec
    endpoint_id: int
    engine: Engine
    counter: TokenCounter
    # One adapter per tenant, each sending that tenant's key (spec.tenants); ``engine``
    # sends the endpoint's api_key, or the first tenant's when it has none.
    tenant_engines: Mapping[str, Engine] = field(default_factory=dict)
    state: EndpointState = field(default_factory=EndpointState)

    @property
    def window(self) -> int | None:
        return self.state.window

    @property
    def discovery(self) -> Discovery | None:
        return self.state.discovery

    @property
    def served(self) -> ServedWindowRecord | None:
        return self.state.served

    def engine_for(self, tenant: TenantSpec | None) -> Engine:
        return self.engine if tenant is None else self.tenant_engines[tenant.name]

    def tenant_of(
        self, kind: ProbeKind, slot: int | None, chosen: TenantSpec | None = None
    ) -> TenantSpec | None:
        """Whose credentials a probe of ``kind`` is sent with: ``chosen`` if given, the
        slot's turn for an under or edge probe, else the endpoint's default identity."""
        spec = self.spec
        if chosen is not None:
            return chosen
        if spec.tenants and kind in TENANT_KINDS and slot is not None:
            return tenant_for_slot(spec.tenants, slot, spec.interval_for(kind))
        return spec.default_tenant


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """What a finished probe looked like: for the CLI and the alerting hook."""

    probe_id: int | None  # None while its result waits for the database
    endpoint: str
    kind: ProbeKind
    verdict: Verdict
    reason: str
    status: int | None
    planned_prompt_tokens: int | None
    reported_prompt_tokens: int | None
    marker: str | None
    marker_found: bool
    foreign: tuple[ForeignMarker, ...]
    duration_seconds: float | None
    confirms_probe_id: int | None
    finished_at: datetime
    tenant: str | None = None  # whose credentials it was sent with; None: the endpoint's key
    error_body: str | None = None  # bounded: where a rejection states the engine's limit
    trigger_probe_id: int | None = None  # a bisect probe's trigger
    # Per depth, when the prompt carried one marker per depth (several marker_depths).
    depths: tuple[DepthResult, ...] = ()
    trace_id: str | None = None  # the trace its requests carried (None: tracing off)


def describe_served(record: ServedWindowRecord) -> str:
    """One sentence on a served-window measurement, for alert descriptions and the CLI."""
    if not record.measured:
        return f"Served window: the advertised {record.advertised_tokens:,} tokens (again)."
    precision = (
        "to the token"
        if record.exact
        else f"fails at {record.unserved_tokens:,}"
        if record.unserved_tokens
        else "lower bound"
    )
    return (
        f"Served window: advertised {record.advertised_tokens:,} · served "
        f"{record.served_tokens:,} (largest prompt served whole, {precision}; "
        f"{record.probes} bisect probes)."
    )
