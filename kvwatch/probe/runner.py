"""Running a slot's probes: ask the chain what is next, run it, store it, count it, log it.

A probe row is written (state ``running``) before the request goes out and completed after
it, so a crash leaves a row that the next start marks ``interrupted``, never nothing. Which
probe follows which is :mod:`kvwatch.probe.chain`'s business; how each kind runs is its
module's in :mod:`kvwatch.probe.kinds`; what is stored, counted and logged is derived from one
:class:`~kvwatch.probe.result.ProbeResult`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from kvwatch.canary.model import ProbeKind
from kvwatch.config import TenantSpec
from kvwatch.engines.base import ProgressCallback
from kvwatch.engines.tracing import TraceSettings, probe_trace
from kvwatch.limits import ANSWER_EXCERPT_CHARS
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe import chain
from kvwatch.probe.chain import Link, Step
from kvwatch.probe.job import ProbeJob, Probing, SlotClaim
from kvwatch.probe.kinds import PROBERS
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.probe.result import Attempt, ProbeResult
from kvwatch.probe.served import ServedWindowTracker
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.records import AlertStateRecord, ServedWindowRecord
from kvwatch.store.repository import Store
from kvwatch.writebehind import PendingResult, ResultBuffer, SlotTaken

log = structlog.get_logger("kvwatch.probe")


def utcnow() -> datetime:
    return datetime.now(UTC)


class AlertHook(Protocol):
    """Alert evaluation plugged into the runner (see kvwatch.alerting)."""

    def evaluate(self, report: ProbeReport, target: Target) -> Sequence[AlertStateRecord]:
        """Alert states this result changes; written in the same transaction as the result."""
        ...

    def committed(self, records: Sequence[AlertStateRecord]) -> None:
        """The states were stored: adopt them and wake delivery."""
        ...

    def served_window(
        self, endpoint: str, record: ServedWindowRecord
    ) -> Sequence[AlertStateRecord]:
        """The endpoint's active window alerts with the measured served window in their
        description; to be stored, then adopted with :meth:`committed`."""
        ...


@dataclass
class ProbeRunner:
    store: Store
    metrics: ProbeMetrics
    replica: str
    clock: Callable[[], datetime] = utcnow
    excerpt_chars: int = ANSWER_EXCERPT_CHARS
    alert_hook: AlertHook | None = None
    # The trace context each probe's requests carry (a reload may change it).
    trace: TraceSettings = field(default_factory=TraceSettings)
    # Results wait here, in order, while the database is unreachable: probing goes on.
    results: ResultBuffer = field(init=False)
    # What the endpoint really serves, measured after a window failure.
    served: ServedWindowTracker = field(init=False)

    def __post_init__(self) -> None:
        self.results = ResultBuffer(self.store, self.metrics.registry)
        self.served = ServedWindowTracker(self.store, self.clock)

    @property
    def io(self) -> Probing:
        return Probing(self.store, self.results, self.metrics, self.clock, self.replica)

    async def run_slot(
        self, target: Target, kind: ProbeKind, slot: int, *, scheduled: datetime | None = None
    ) -> list[ProbeReport]:
        """Run a scheduled slot if this replica wins its claim (several replicas may share a
        database: each slot runs once). An unfinished slot's claim expires and is retried.

        ``scheduled`` is when the scheduler meant the run to start: the probe line logs how
        late it actually started (``lag_seconds``), the first sign of an overloaded replica.
        """
        spec = target.spec
        claim = SlotClaim(slot, ttl=chain.claim_ttl(spec.timeouts[kind]))
        if kind is ProbeKind.CAPACITY:
            # A capacity check stores a row only once discovery answered (an engine that
            # reports no pool stores nothing), so its claim cannot wait for that row.
            try:
                claim.claimed = await asyncio.to_thread(
                    self.store.claim_slot, spec.name, kind.value, slot, self.replica, claim.ttl
                )
            except StoreUnavailable as exc:
                log.warning("slot_unclaimed", endpoint=spec.name, kind=kind.value, error=str(exc))
                claim.claimed = True
            if not claim.claimed:
                log.debug("slot_taken", endpoint=spec.name, kind=kind.value, slot=slot)
                return []
        try:
            reports = await self.run_checked(
                target, kind, slot=slot, scheduled=scheduled, claim=claim
            )
        except SlotTaken:
            log.debug("slot_taken", endpoint=spec.name, kind=kind.value, slot=slot)
            return []
        if not claim.completed:  # e.g. a capacity check that stored nothing
            last = reports[-1].probe_id if reports else None
            try:
                await asyncio.to_thread(self.store.complete_slot, spec.name, kind.value, slot, last)
            except StoreUnavailable as exc:
                log.warning(
                    "slot_not_completed", endpoint=spec.name, kind=kind.value, error=str(exc)
                )
        return reports

    async def run_checked(
        self,
        target: Target,
        kind: ProbeKind,
        progress: ProgressCallback | None = None,
        *,
        slot: int | None = None,
        scheduled: datetime | None = None,
        tenant: TenantSpec | None = None,
        claim: SlotClaim | None = None,
    ) -> list[ProbeReport]:
        """Run a probe and every probe the chain says follows it (re-plans, confirmation,
        edge), then the served-window search if the chain ended in a window failure.

        With tenants, an under or edge probe runs under the slot's tenant (``tenant``
        overrides it), and its confirmation under the same one. The edge probe after a
        capacity check takes its tenant from the slot's turn, and has no slot of its own.
        With ``claim`` (a scheduled slot), raises :class:`SlotTaken` if another replica
        runs it.
        """
        spec = target.spec
        job = ProbeJob(target, kind, slot=slot, claim=claim, progress=progress)
        job = job.sent_as(target.tenant_of(kind, slot, tenant))
        links: list[Link] = []
        reports: list[ProbeReport] = []
        step: Step | None = Step(kind)
        while step is not None:
            previous = reports[-1].probe_id if reports else None
            job = job.next(step, previous, slot=slot, tenant=tenant)
            report = await self._probe(job, scheduled if not reports else None)
            if report is None and not links:
                return []  # a capacity check that found nothing to compare
            if report is None:
                # A confirmation that found nothing to compare: the first verdict stands.
                links.append(Link(links[-1].kind, links[-1].verdict, confirming=True))
            else:
                reports.append(report)
                links.append(Link(step.kind, report.verdict, step.confirming, step.attempt))
            step = chain.next_step(links, confirm=spec.confirm)
        return reports + await self._search(target, links[-1].kind, reports)

    async def _search(
        self, target: Target, kind: ProbeKind, reports: list[ProbeReport]
    ) -> list[ProbeReport]:
        """The served-window search after a chain of ``kind`` probes (bisect steps, after
        the slot is marked done: the search is the endpoint's, not the slot's)."""

        async def bisect(size: int, trigger: int | None) -> ProbeReport:
            return await self.run(target, ProbeKind.BISECT, size=size, trigger=trigger)

        steps = await self.served.after(bisect, target, kind, reports)
        if steps and self.alert_hook is not None and target.served is not None:
            await self._annotate_alerts(target, target.served)
        return steps

    async def _annotate_alerts(self, target: Target, record: ServedWindowRecord) -> None:
        """Put the measured served window into the endpoint's active alerts at once (the
        next re-send carries it), not only into those raised by later probes."""
        assert self.alert_hook is not None
        records = self.alert_hook.served_window(target.spec.name, record)
        if not records:
            return
        try:
            await asyncio.to_thread(self.store.save_alert_states, records)
        except StoreError as exc:
            log.warning("alert_states_not_saved", endpoint=target.spec.name, error=str(exc))
        self.alert_hook.committed(records)

    async def run(
        self,
        target: Target,
        kind: ProbeKind,
        *,
        confirms: int | None = None,
        progress: ProgressCallback | None = None,
        slot: int | None = None,
        scheduled: datetime | None = None,
        tenant: TenantSpec | None = None,
        size: int | None = None,
        trigger: int | None = None,
        claim: SlotClaim | None = None,
        attempt: int = 0,
    ) -> ProbeReport:
        """One probe, on its own (see :class:`ProbeJob` for the arguments). With ``claim``
        not yet claimed, its start claims the slot (raises :class:`SlotTaken` if another
        replica has it; nothing is planned or sent)."""
        job = ProbeJob(
            target,
            kind,
            tenant=tenant or target.spec.default_tenant,
            confirms=confirms,
            slot=slot,
            trigger=trigger,
            attempt=attempt,
            size=size,
            progress=progress,
            claim=claim,
        )
        report = await self._probe(job, scheduled)
        if report is None:
            raise ValueError(f"{target.spec.name}: the engine reports nothing to check")
        return report

    async def _probe(self, job: ProbeJob, scheduled: datetime | None) -> ProbeReport | None:
        # One trace per probe: every request it makes (discovery, tokenize, the canary) is a
        # span of it, whichever adapter sends it; its id is stored with the probe's row.
        with probe_trace(self.trace) as trace:
            job = dataclasses.replace(job, trace_id=None if trace is None else trace.trace_id)
            attempt = await PROBERS[job.kind](job, self.io)
        return None if attempt is None else await self._finish(job, attempt, scheduled)

    async def _finish(
        self, job: ProbeJob, attempt: Attempt, scheduled: datetime | None
    ) -> ProbeReport:
        """Store the result (completing the slot if it is the slot's last), adopt its alert
        states, count it and log it."""
        target, claim = job.target, job.claim
        result = ProbeResult(attempt, job.kind, target.spec.model, self.clock(), attempt.probe_id)
        # Bisect probes are evidence for the served window: they never page and never count
        # toward an alert's streak (their failures are the expected half of a search).
        alert_states: Sequence[AlertStateRecord] = ()
        if self.alert_hook is not None and job.kind is not ProbeKind.BISECT:
            alert_states = self.alert_hook.evaluate(result.report(), target)
        link = Link(job.kind, result.verdict, job.confirms is not None, job.attempt)
        # The slot's last result marks it done in its own transaction (or, buffered during
        # an outage, when it is written).
        completes = (
            claim is not None
            and claim.claimed
            and not claim.completed
            and chain.is_last(link, confirm=target.spec.confirm)
        )
        t0 = time.perf_counter()
        pending = PendingResult(
            attempt.probe_id,
            attempt.new,
            result.outcome(self.excerpt_chars),
            tuple(alert_states),
            completes_slot=completes,
        )
        stored_id = await self.results.finish(pending)
        write_seconds = time.perf_counter() - t0
        if claim is not None and completes:
            claim.completed = True
        if stored_id is not None and attempt.probe_id is None:
            result = dataclasses.replace(result, probe_id=stored_id)
        # Adopted even while the write is buffered, so paging goes on during a database
        # outage (delivery reads the evaluator's states, not the database).
        if self.alert_hook and alert_states:
            self.alert_hook.committed(alert_states)
        result.observe(self.metrics)
        log.info("probe", **result.log_fields(write_seconds=write_seconds, scheduled=scheduled))
        return result.report()
