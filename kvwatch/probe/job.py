"""What one probe is asked to do (:class:`ProbeJob`), what it may use (:class:`Probing`), and
the one signature every probe kind has (:class:`Prober`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from kvwatch.canary.model import Placement, ProbeKind
from kvwatch.config import TenantSpec
from kvwatch.engines.base import ProgressCallback
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.chain import Step
from kvwatch.probe.model import Target
from kvwatch.probe.result import Attempt
from kvwatch.store.records import NewProbe
from kvwatch.store.repository import Store
from kvwatch.writebehind import ResultBuffer


@dataclass(slots=True)
class SlotClaim:
    """A scheduled slot as its probes go through it.

    The first probe's start claims the slot in the same transaction (``claimed``), and the
    result of the slot's last probe marks it done in the same transaction (``completed``):
    two transactions per scheduled probe instead of four.
    """

    slot: int
    ttl: float
    claimed: bool = False
    completed: bool = False


@dataclass(frozen=True, slots=True)
class ProbeJob:
    """One probe to run. ``tenant``: whose credentials it is sent with (planning always uses
    the endpoint's own: token counts do not depend on who asks). ``confirms``: the probe it
    re-checks; ``trigger``: the probe a bisect step searches for, or the one whose sizing
    miss this re-plan (``attempt``) follows; ``size``: a bisect step's prompt tokens."""

    target: Target
    kind: ProbeKind
    tenant: TenantSpec | None = None
    confirms: int | None = None
    slot: int | None = None
    trigger: int | None = None
    attempt: int = 0
    size: int | None = None
    progress: ProgressCallback | None = None
    claim: SlotClaim | None = None
    trace_id: str | None = None  # the trace its requests carry (kvwatch.engines.tracing)

    def sent_as(self, tenant: TenantSpec | None) -> ProbeJob:
        """This job sent under ``tenant`` (None: the endpoint's identity); a capacity check
        always runs under the endpoint's identity."""
        default = self.target.spec.default_tenant
        chosen = default if self.kind is ProbeKind.CAPACITY else (tenant or default)
        return dataclasses.replace(self, tenant=chosen)

    def next(
        self, step: Step, previous: int | None, *, slot: int | None, tenant: TenantSpec | None
    ) -> ProbeJob:
        """The job for ``step`` after this one, whose probe was stored as ``previous``.

        A re-plan links to the probe that missed, a confirmation to the probe it re-checks.
        The edge probe after a capacity check takes the slot's tenant turn (or the
        ``tenant`` the caller chose) but not the slot: its results never complete it."""
        if step.kind is not self.kind:
            target = self.target
            chosen = target.tenant_of(step.kind, slot) if slot is not None else tenant
            return ProbeJob(target, step.kind, progress=self.progress).sent_as(chosen)
        return dataclasses.replace(
            self,
            confirms=previous if step.confirming else None,
            trigger=previous if step.attempt else None,
            attempt=step.attempt,
        )

    def new_probe(
        self,
        *,
        replica: str,
        started: datetime,
        max_tokens: int,
        token_source: str,
        marker: str,
        streamed: bool,
        placements: tuple[Placement, ...] = (),
    ) -> NewProbe:
        """The row written at the probe's start, before planning settles its sizes."""
        spec = self.target.spec
        return NewProbe(
            endpoint=spec.name,
            endpoint_id=self.target.endpoint_id,
            kind=self.kind.value,
            started_at=started,
            replica=replica,
            model=spec.model,
            planned_prompt_tokens=0,
            target_prompt_tokens=0,
            max_tokens=max_tokens,
            token_source=token_source,
            tokenize_calls=0,
            marker=marker,
            marker_depth=placements[0].depth if placements else 0.0,
            placements=placements,
            streamed=streamed,
            confirms_probe_id=self.confirms,
            slot=self.slot,
            tenant=None if self.tenant is None else self.tenant.name,
            trigger_probe_id=self.trigger,
            trace_id=self.trace_id,
        )


@dataclass(frozen=True, slots=True)
class Probing:
    """What a probe kind may use: the store (reads), the result buffer (its row), the
    metrics, the clock and this replica's name."""

    store: Store
    results: ResultBuffer
    metrics: ProbeMetrics
    clock: Callable[[], datetime]
    replica: str

    async def begin(self, new: NewProbe, claim: SlotClaim | None) -> int | None:
        """Record a probe's start, claiming its slot in the same transaction if not yet."""
        if claim is None or claim.claimed:
            return await self.results.begin(new)
        probe_id = await self.results.begin(new, claim_ttl=claim.ttl)
        claim.claimed = True  # or the database is down: then the slot runs here anyway
        return probe_id


class Prober(Protocol):
    """One probe kind: run ``job`` up to its verdict (not stored yet). None: nothing to
    store (a capacity check of an engine that reports no KV pool)."""

    async def __call__(self, job: ProbeJob, io: Probing) -> Attempt | None: ...
