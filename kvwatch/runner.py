"""Running one probe end to end: plan, record, send, judge, store, count, log.

A probe row is written (state ``running``) before the request goes out and completed after
it, so a crash leaves a row that the next start marks ``interrupted``, never nothing. A
critical verdict is re-checked at once by a confirmation probe (DESIGN §2) unless the
endpoint says otherwise; both are stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from kvwatch.canary import markers
from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import (
    SEVERITY,
    DepthResult,
    Exchange,
    ForeignMarker,
    Judgement,
    Placement,
    PlannedPrompt,
    ProbeKind,
    Severity,
    Verdict,
)
from kvwatch.canary.planning import PlanningError, plan_prompt
from kvwatch.canary.sizing import (
    SizingError,
    edge_prompt_tokens,
    largest_accepted,
    served_window,
    target_prompt_tokens,
)
from kvwatch.canary.verdicts import cross_tenant_markers, judge
from kvwatch.capacity import assess, edge_pool
from kvwatch.config import EndpointSpec, TenantSpec
from kvwatch.engines.base import Discovery, Engine, EngineAuthError, ProgressCallback
from kvwatch.metrics import ProbeMetrics
from kvwatch.served_window import ServedWindowTracker
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.records import (
    AlertStateRecord,
    CalibrationRecord,
    NewProbe,
    ProbeOutcome,
    ServedWindowRecord,
)
from kvwatch.store.repository import Store
from kvwatch.tokens.base import TokenCounter
from kvwatch.tokens.calibration import Calibration, Calibrations
from kvwatch.tokens.estimate import EstimatingCounter
from kvwatch.tokens.measure import engine_count, measure, read_stated_count
from kvwatch.writebehind import PendingResult, ResultBuffer, SlotTaken

EXCERPT_CHARS = 400
# A discovered window above this is garbage, not a model: planning it would build a prompt
# of that size. (Configured windows are the operator's word and are not capped.)
MAX_PLAUSIBLE_WINDOW = 2**27
ERROR_BODY_CHARS = 2000

log = structlog.get_logger("kvwatch.probe")

# Re-plans of a probe whose estimated size missed its boundary, within one slot: each uses
# what the miss taught (the engine's count, a wider margin), so a second is rare.
MAX_RESIZES = 2
# Verdicts whose reported count is the engine's count of the whole prompt as sent (not of a
# cut or swapped one): only these teach an estimate.
_COUNT_TRUSTED = frozenset(
    {Verdict.PASS, Verdict.SIZING_MISS, Verdict.CANARY_INEFFECTIVE, Verdict.UNDER_REJECTED}
)

# The kinds that rotate through an endpoint's tenants: the canaries that fill the KV cache
# (under) or probe past it (edge), where one request's pages can reach another's answer.
TENANT_KINDS = frozenset({ProbeKind.UNDER, ProbeKind.EDGE})


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


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class Target:
    """One monitored endpoint with the clients built for it."""

    spec: EndpointSpec
    endpoint_id: int
    engine: Engine
    counter: TokenCounter
    window: int | None = None  # configured, else discovered on first use
    discovery: Discovery | None = None  # the engine's last self-report (capacity check)
    # One adapter per tenant, each sending that tenant's key (spec.tenants); ``engine``
    # sends the endpoint's api_key, or the first tenant's when it has none.
    tenant_engines: Mapping[str, Engine] = field(default_factory=dict)

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
            return tenant_for_slot(spec.tenants, slot, spec.interval_seconds)
        return spec.default_tenant

    served: ServedWindowRecord | None = None  # the last served-window measurement, if read


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
    excerpt_chars: int = EXCERPT_CHARS
    alert_hook: AlertHook | None = None
    # Results wait here, in order, while the database is unreachable: probing goes on.
    results: ResultBuffer = field(init=False)
    # What the endpoint really serves, measured after a window failure.
    served: ServedWindowTracker = field(init=False)

    def __post_init__(self) -> None:
        self.results = ResultBuffer(self.store, self.metrics.registry)
        self.served = ServedWindowTracker(self.store, self.clock)

    async def run_slot(
        self, target: Target, kind: ProbeKind, slot: int, *, scheduled: datetime | None = None
    ) -> list[ProbeReport]:
        """Run a scheduled slot if this replica wins its claim (several replicas may share a
        database: each slot runs once). An unfinished slot's claim expires and is retried.

        ``scheduled`` is when the scheduler meant the run to start: the probe line logs how
        late it actually started (``lag_seconds``), the first sign of an overloaded replica.
        """
        spec = target.spec
        # Long enough for the probe and its confirmation, each up to its deadline.
        claim = SlotClaim(slot, ttl=2 * spec.timeouts[kind] + 30)
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
            try:
                await asyncio.to_thread(
                    self.store.complete_slot,
                    spec.name,
                    kind.value,
                    slot,
                    reports[-1].probe_id if reports else None,
                )
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
        """Run a probe and, on a critical verdict, its confirmation probe at once.

        A capacity check that finds the KV pool smaller than the window goes on to the edge
        probe, just over the pool: exactly where the incident happened. With tenants, an
        under or edge probe runs under the slot's tenant (``tenant`` overrides it), and its
        confirmation under the same one: it re-checks what that tenant was served. With
        ``claim`` (a scheduled slot), raises :class:`SlotTaken` if another replica runs it.
        A confirmed window failure goes on to measure the served window (bisect steps, after
        the slot is marked done: the search is the endpoint's, not the slot's).
        """
        if kind is not ProbeKind.CAPACITY:
            tenant = target.tenant_of(kind, slot, tenant)
        if kind is ProbeKind.CAPACITY:
            first_check = await self._run_capacity(
                target, slot=slot, scheduled=scheduled, claim=claim
            )
            if first_check is None:
                return []
            reports = [first_check]
        else:
            reports = [
                await self.run(
                    target,
                    kind,
                    progress=progress,
                    slot=slot,
                    scheduled=scheduled,
                    tenant=tenant,
                    claim=claim,
                )
            ]
        attempt = 0
        while reports[-1].verdict is Verdict.SIZING_MISS and attempt < MAX_RESIZES:
            attempt += 1
            reports.append(
                await self.run(
                    target,
                    kind,
                    progress=progress,
                    slot=slot,
                    tenant=tenant,
                    claim=claim,
                    attempt=attempt,
                    trigger=reports[-1].probe_id,
                )
            )
        first = reports[-1]  # the probe whose verdict stands for the slot
        if self._confirms(target, first.verdict):
            if kind is ProbeKind.CAPACITY:
                again = await self._run_capacity(
                    target, confirms=first.probe_id, slot=slot, claim=claim
                )
                reports += [again] if again is not None else []
            else:
                confirm = await self.run(
                    target,
                    kind,
                    confirms=first.probe_id,
                    progress=progress,
                    slot=slot,
                    tenant=tenant,
                    claim=claim,
                )
                reports.append(confirm)
        if _goes_to_edge(kind, reports[-1].verdict):
            # The edge probe takes its tenant from the capacity slot's turn (no slot of its own).
            edge_tenant = target.tenant_of(ProbeKind.EDGE, slot) if slot is not None else tenant
            reports += await self.run_checked(
                target, ProbeKind.EDGE, progress=progress, tenant=edge_tenant
            )
        steps = await self.served.after(self, target, kind, reports)
        if steps and self.alert_hook is not None and target.served is not None:
            await self._annotate_alerts(target, target.served)
        return reports + steps

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

    def _confirms(self, target: Target, verdict: Verdict) -> bool:
        """Whether a (first) probe with ``verdict`` is re-checked by a confirmation probe."""
        return target.spec.confirm and SEVERITY[verdict] is Severity.CRITICAL

    def _last_of_slot(
        self, target: Target, kind: ProbeKind, verdict: Verdict, *, confirming: bool, attempt: int
    ) -> bool:
        """Whether ``run_checked`` runs no further probe after this one (in step with it)."""
        if verdict is Verdict.SIZING_MISS and not confirming and attempt < MAX_RESIZES:
            return False
        if not confirming and self._confirms(target, verdict):
            return False
        return not _goes_to_edge(kind, verdict)

    async def _run_capacity(
        self,
        target: Target,
        *,
        confirms: int | None = None,
        slot: int | None = None,
        scheduled: datetime | None = None,
        claim: SlotClaim | None = None,
    ) -> ProbeReport | None:
        """Compare what the engine reports (window, KV pool) with itself and the config.

        Nothing is stored when the engine reports no KV pool: there is nothing to compare,
        and a check that cannot fail must not be recorded as a pass.
        """
        spec = target.spec
        kind = ProbeKind.CAPACITY
        started = self.clock()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(spec.timeouts[kind]):
                discovery = await target.engine.discover()
        except EngineAuthError as exc:
            judgement = Judgement(Verdict.AUTH_ERROR, f"discovery refused: {exc}")
        except TimeoutError:
            judgement = Judgement(
                Verdict.ERROR, f"discovery did not answer within {spec.timeouts[kind]:.0f} s"
            )
        else:
            target.discovery = discovery
            if discovery.kv_pool_tokens is None and spec.kv_pool_tokens is None:
                log.debug("capacity_unreported", endpoint=spec.name, detail=discovery.detail)
                return None
            findings = assess(spec.context_window, spec.kv_pool_tokens, discovery)
            critical = [f for f in findings if f.severity is Severity.CRITICAL]
            if critical:
                judgement = Judgement(Verdict.CAPACITY_MISMATCH, critical[0].message)
            else:
                judgement = Judgement(
                    Verdict.PASS,
                    "; ".join(f.message for f in findings)
                    or (
                        f"window {discovery.context_window or spec.context_window} fits the "
                        f"KV pool {edge_pool(spec.kv_pool_tokens, discovery)}"
                    ),
                )
        exchange = Exchange(total_seconds=time.perf_counter() - t0)
        new = self._new_probe(
            target,
            kind,
            started,
            confirms=confirms,
            slot=slot,
            max_tokens=0,
            token_source="discovery",
            marker="",
            streamed=False,
            tenant=target.spec.default_tenant,
        )
        probe_id = await self._begin(new, claim)
        return await self._finish(
            target, kind, new, probe_id, None, exchange, judgement, scheduled=scheduled, claim=claim
        )

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
        """One probe. ``tenant``: whose credentials the canary is sent with (default: the
        endpoint's identity, see :meth:`Target.tenant_of`); planning always uses the
        endpoint's own, as token counts do not depend on who asks. A ``bisect`` probe carries
        a prompt of ``size`` tokens and is linked to the failing probe that started its
        search (``trigger``); a re-plan after a sizing miss carries its ``attempt`` number
        and is linked to the probe that missed (``trigger``). With ``claim`` not yet claimed,
        its start claims the slot (raises :class:`SlotTaken` if another replica has it;
        nothing is planned or sent)."""
        spec = target.spec
        tenant = tenant or spec.default_tenant
        tenant_name = None if tenant is None else tenant.name
        # Several depths: one marker at each, so the answer shows which part of the prompt
        # the engine read (issue 12). Every one is issued and stored like the first.
        placements = (
            tuple(Placement(d, markers.new_marker()) for d in sorted(spec.marker_depths))
            if len(spec.marker_depths) > 1
            else ()
        )
        marker = placements[0].marker if placements else markers.new_marker()
        started = self.clock()
        # Written before planning: planning may call the engine (tokenize), and the row must
        # exist before anything goes out. What planning settles is stored with the result.
        new = self._new_probe(
            target,
            kind,
            started,
            confirms=confirms,
            slot=slot,
            max_tokens=spec.max_tokens,
            token_source=target.counter.source,
            marker=marker,
            streamed=spec.stream,
            tenant=tenant,
            trigger=trigger,
            placements=placements,
        )
        probe_id = await self._begin(new, claim)
        plan: PlannedPrompt | None = None
        try:
            failure: Judgement | None = None
            try:
                await self._calibration_for(target)
                plan = await self._plan(
                    target, kind, marker, placements, size=size, attempt=attempt
                )
            except EngineAuthError as exc:
                failure = Judgement(Verdict.AUTH_ERROR, f"cannot plan the canary: {exc}")
            except (PlanningError, SizingError, WindowUnknown) as exc:
                failure = Judgement(Verdict.ERROR, f"cannot plan the canary: {exc}")
            except Exception as exc:  # tokenize endpoint down, garbage from it...
                reason = f"cannot plan the canary: {type(exc).__name__}: {_short(str(exc))}"
                failure = Judgement(Verdict.ERROR, reason)
            if plan is None:
                assert failure is not None
                exchange = Exchange(error_detail=failure.reason)
                judgement = failure
            else:
                new = dataclasses.replace(
                    new,
                    planned_prompt_tokens=plan.planned_tokens,
                    target_prompt_tokens=plan.target_tokens,
                    token_source=plan.token_source,
                    tokenize_calls=plan.tokenize_calls,
                    marker_depth=plan.marker_depth,
                )
                exchange = await target.engine_for(tenant).chat(
                    plan.messages,
                    max_tokens=plan.max_tokens,
                    stream=spec.stream,
                    timeout=spec.timeouts[kind],
                    progress=progress,
                )
                read_stated_count(exchange)
                foreign = await self._foreign_markers(exchange, plan.markers)
                if kind is ProbeKind.EDGE:
                    judgement = judge_edge(plan, exchange, foreign, tenant=tenant_name)
                elif kind is ProbeKind.BISECT:
                    # Served whole or not, exactly as an under probe of this size would be.
                    as_under = dataclasses.replace(plan, kind=ProbeKind.UNDER)
                    judgement = judge(as_under, exchange, foreign, tenant=tenant_name)
                else:
                    # An engine without a hard limit is judged on how it cut the over
                    # prompt: to the window the probe was sized against.
                    cut_to = None if target.engine.hard_limit else target.window
                    judgement = judge(
                        plan, exchange, foreign, truncates_to=cut_to, tenant=tenant_name
                    )
                if plan.note and judgement.verdict is not Verdict.PASS:
                    judgement.reason = f"{judgement.reason}; {plan.note}"
                # Only a believable count of the whole prompt teaches (see _learn).
                await self._learn(target, plan, exchange, judgement.verdict)
        except asyncio.CancelledError:
            if probe_id is not None:
                with contextlib.suppress(StoreError):
                    await asyncio.shield(
                        asyncio.to_thread(
                            self.store.interrupt_running,
                            probe_ids=[probe_id],
                            reason="kvwatch stopped before the probe finished",
                        )
                    )
            self.metrics.interrupted.inc()
            raise
        return await self._finish(
            target, kind, new, probe_id, plan, exchange, judgement, scheduled=scheduled, claim=claim
        )

    async def _begin(self, new: NewProbe, claim: SlotClaim | None) -> int | None:
        """Record a probe's start, claiming its slot in the same transaction if not yet."""
        if claim is None or claim.claimed:
            return await self.results.begin(new)
        probe_id = await self.results.begin(new, claim_ttl=claim.ttl)
        claim.claimed = True  # or the database is down: then the slot runs here anyway
        return probe_id

    def _new_probe(
        self,
        target: Target,
        kind: ProbeKind,
        started: datetime,
        *,
        confirms: int | None,
        slot: int | None,
        max_tokens: int,
        token_source: str,
        marker: str,
        streamed: bool,
        plan: PlannedPrompt | None = None,
        tenant: TenantSpec | None = None,
        trigger: int | None = None,
        placements: tuple[Placement, ...] = (),
    ) -> NewProbe:
        return NewProbe(
            endpoint=target.spec.name,
            endpoint_id=target.endpoint_id,
            kind=kind.value,
            started_at=started,
            replica=self.replica,
            model=target.spec.model,
            planned_prompt_tokens=plan.planned_tokens if plan else 0,
            target_prompt_tokens=plan.target_tokens if plan else 0,
            max_tokens=max_tokens,
            token_source=token_source,
            tokenize_calls=plan.tokenize_calls if plan else 0,
            marker=marker,
            marker_depth=plan.marker_depth
            if plan
            else (placements[0].depth if placements else 0.0),
            placements=placements,
            streamed=streamed,
            confirms_probe_id=confirms,
            slot=slot,
            tenant=None if tenant is None else tenant.name,
            trigger_probe_id=trigger,
        )

    async def _calibration_for(self, target: Target) -> None:
        """Make an estimating counter ready to size a canary: start from the calibration
        stored for the endpoint (once per process), and with nothing learnt yet, learn the
        engine's count from one cheap request first. An uncalibrated estimate can be off by
        several times (another vocabulary), and no verdict about a count could stand on it."""
        counter = target.counter
        if not isinstance(counter, EstimatingCounter):
            return
        async with counter.lock:
            if not counter.restored:
                counter.restored = True
                try:
                    stored = await asyncio.to_thread(self.store.calibrations, target.spec.name)
                except StoreError as exc:
                    log.warning("calibration_not_read", endpoint=target.spec.name, error=str(exc))
                    stored = []
                restored = tuple(
                    (r.size_class, Calibration(r.ratio, r.error, r.observations))
                    for r in stored
                    if r.token_source == counter.source and r.observations > 0
                )
                if restored:
                    counter.calibrations = Calibrations(restored)
            # One calibration request per process: an engine whose count is no count (a
            # collapsed template reports 3 tokens) is not asked again before every probe;
            # the probes' own reports calibrate it once they are believable.
            if counter.calibrations.calibrated or counter.measured:
                return
            counter.measured = True
            try:
                await self._calibrate(target, counter)
            except Exception as exc:  # planning it failed: size this probe uncalibrated
                log.warning(
                    "calibration_failed",
                    endpoint=target.spec.name,
                    token_source=counter.source,
                    reason=f"{type(exc).__name__}: {_short(str(exc))}",
                )

    async def _calibrate(self, target: Target, counter: EstimatingCounter) -> None:
        """Learn the engine's count from one cheap canary-like request (not a probe)."""
        spec = target.spec
        window = await self._window(target)
        found = await measure(
            target.engine, counter, window=window, timeout=spec.timeouts[ProbeKind.BASELINE]
        )
        exchange, reported = found.exchange, found.reported
        if reported is None:
            log.warning(
                "calibration_failed",
                endpoint=spec.name,
                token_source=counter.source,
                status=exchange.status,
                reason=exchange.error_detail or "the engine reported no prompt token count",
            )
            return
        await self._teach(target, found.planned, reported)
        log.info(
            "calibrated",
            endpoint=spec.name,
            token_source=counter.source,
            planned_prompt_tokens=found.planned,
            reported_prompt_tokens=reported,
            ratio=round(counter.calibrations.at(reported).ratio, 5),
        )

    async def _learn(
        self, target: Target, plan: PlannedPrompt, exchange: Exchange, verdict: Verdict
    ) -> None:
        """Teach an estimating counter the engine's count of a prompt it planned.

        Only a count of the whole prompt as sent teaches: a cut or swapped prompt's count
        (truncated, marker_missing, over_truncated: the window, or a 1-token placeholder)
        would make every later canary of this endpoint the wrong size.
        """
        reported = engine_count(exchange)
        if reported is not None and verdict in _COUNT_TRUSTED:
            await self._teach(target, plan.planned_tokens, reported)

    async def _teach(self, target: Target, planned: int, reported: int) -> None:
        """Tell the counter what the engine counted; store what an estimating one learnt."""
        counter = target.counter
        if not isinstance(counter, EstimatingCounter):
            counter.observe(planned, reported)  # exact counters ignore it
            return
        before = counter.calibrations
        counter.observe(planned, reported)
        await self._save_calibration(target, counter, before)

    async def _save_calibration(
        self, target: Target, counter: EstimatingCounter, before: Calibrations
    ) -> None:
        old = dict(before.by_class)
        now = self.clock()
        records = [
            CalibrationRecord(
                endpoint=target.spec.name,
                token_source=counter.source,
                size_class=size_class,
                ratio=c.ratio,
                error=c.error,
                observations=c.observations,
                updated_at=now,
            )
            for size_class, c in counter.calibrations.by_class
            if old.get(size_class) != c
        ]
        if not records:
            return
        try:
            await asyncio.to_thread(self.store.save_calibrations, records)
        except StoreError as exc:
            # Kept in memory and saved with the next report: probing goes on.
            log.warning("calibration_not_saved", endpoint=target.spec.name, error=str(exc))

    async def _plan(
        self,
        target: Target,
        kind: ProbeKind,
        marker: str,
        placements: tuple[Placement, ...] = (),
        *,
        size: int | None = None,
        attempt: int = 0,
    ) -> PlannedPrompt:
        spec = target.spec
        window = await self._window(target)
        counter = target.counter
        # An estimated count keeps a margin of its calibrated error so that error cannot
        # cross the boundary; a re-plan after a sizing miss widens it.
        margin = 0 if counter.exact else counter.tolerance(window) * (1 + attempt)
        if kind is ProbeKind.BISECT:
            if size is None:
                raise SizingError("a bisect probe needs a prompt size")
            # Exactly the size the search asked for: the planned count is what it judges.
            tokens = size
        elif kind is ProbeKind.EDGE:
            discovery = target.discovery or await target.engine.discover()
            pool = edge_pool(spec.kv_pool_tokens, discovery)
            if pool is None:
                raise SizingError("the engine reports no KV pool to probe the edge of")
            tokens = edge_prompt_tokens(
                rule=target.engine.rule,
                window=window,
                pool=pool,
                max_tokens=spec.max_tokens,
                margin=margin,
            )
        else:
            tokens = target_prompt_tokens(
                kind,
                rule=target.engine.rule,
                window=window,
                max_tokens=spec.max_tokens,
                baseline_tokens=spec.baseline_tokens,
                margin=margin,
            )
        rng = random.Random(secrets.randbits(64))
        if placements:
            depth = placements[0].depth
        else:
            depth = rng.choice(spec.marker_depths) if spec.marker_depths else 0.0
        plan = await plan_prompt(
            kind,
            counter=counter,
            target_tokens=tokens,
            marker=marker,
            max_tokens=spec.max_tokens,
            rng=rng,
            depth=depth,
            placements=placements,
            window=window,
        )
        if kind not in (ProbeKind.UNDER, ProbeKind.OVER):
            return plan
        limit = largest_accepted(target.engine.rule, window=window, max_tokens=spec.max_tokens)
        return dataclasses.replace(plan, accepts_up_to=limit, attempt=attempt)

    async def _window(self, target: Target) -> int:
        if target.window is None:
            target.window = target.spec.context_window
        if target.window is None:
            found = await target.engine.discover()
            if found.context_window is None:
                raise WindowUnknown(
                    "context_window is not configured and the engine does not report it"
                )
            if found.context_window > MAX_PLAUSIBLE_WINDOW:
                raise WindowUnknown(
                    f"the engine reports a window of {found.context_window} tokens, which no "
                    "engine serves; configure context_window"
                )
            target.window = served_window(
                found.context_window,
                rule=target.engine.rule,
                max_prompt_tokens=found.max_prompt_tokens,
                max_tokens=target.spec.max_tokens,
            )
        return target.window

    async def _foreign_markers(self, ex: Exchange, own: Sequence[str]) -> list[ForeignMarker]:
        if not ex.answer:
            return []
        mine = {markers.canonical(m) for m in own}
        seen = [m for m in markers.markers_in_answer(ex.answer) if m not in mine]
        if not seen:
            return []
        try:
            issued = await asyncio.to_thread(self.store.lookup_markers, seen)
        except StoreUnavailable as exc:
            # Cannot name the origin now; the answer still lacks its own marker, so the
            # verdict stays critical (marker_missing) rather than passing.
            log.warning("database_unavailable", during="lookup_markers", error=str(exc))
            return []
        # A marker-shaped string nobody issued is the model's invention, not a leak.
        return [issued[m] for m in seen if m in issued]

    async def _finish(
        self,
        target: Target,
        kind: ProbeKind,
        new: NewProbe,
        probe_id: int | None,
        plan: PlannedPrompt | None,
        ex: Exchange,
        judgement: Judgement,
        *,
        scheduled: datetime | None = None,
        claim: SlotClaim | None = None,
    ) -> ProbeReport:
        spec = target.spec
        confirms = new.confirms_probe_id
        finished = self.clock()
        report = ProbeReport(
            probe_id=probe_id,
            endpoint=spec.name,
            kind=kind,
            verdict=judgement.verdict,
            reason=judgement.reason,
            status=ex.status,
            planned_prompt_tokens=plan.planned_tokens if plan else None,
            reported_prompt_tokens=ex.prompt_tokens,
            marker=plan.marker if plan else None,
            marker_found=judgement.marker_found,
            foreign=tuple(judgement.foreign),
            duration_seconds=ex.total_seconds,
            confirms_probe_id=confirms,
            finished_at=finished,
            tenant=new.tenant,
            error_body=_bounded(ex.error_body, ERROR_BODY_CHARS),
            trigger_probe_id=new.trigger_probe_id,
            depths=tuple(judgement.depths),
        )
        # Bisect probes are evidence for the served window: they never page and never count
        # toward an alert's streak (their failures are the expected half of a search).
        alert_states: Sequence[AlertStateRecord] = ()
        if self.alert_hook is not None and kind is not ProbeKind.BISECT:
            alert_states = self.alert_hook.evaluate(report, target)
        outcome = ProbeOutcome(
            verdict=judgement.verdict.value,
            reason=judgement.reason,
            finished_at=finished,
            reported_prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            marker_found=judgement.marker_found if plan else None,
            foreign_markers=judgement.foreign,
            http_status=ex.status,
            finish_reason=ex.finish_reason,
            answer_excerpt=_bounded(ex.answer, self.excerpt_chars),
            error_body=_bounded(ex.error_body, ERROR_BODY_CHARS),
            error_detail=_bounded(ex.error_detail, ERROR_BODY_CHARS),
            ttfb_seconds=ex.ttfb_seconds,
            duration_seconds=ex.total_seconds,
            depths=tuple(judgement.depths),
            planned_prompt_tokens=new.planned_prompt_tokens,
            target_prompt_tokens=new.target_prompt_tokens,
            tokenize_calls=new.tokenize_calls,
            marker_depth=new.marker_depth,
            token_source=new.token_source,
        )
        # The slot's last result marks it done in its own transaction (or, buffered during
        # an outage, when it is written).
        completes = (
            claim is not None
            and claim.claimed
            and not claim.completed
            and self._last_of_slot(
                target,
                kind,
                judgement.verdict,
                confirming=confirms is not None,
                attempt=plan.attempt if plan else 0,
            )
        )
        t0 = time.perf_counter()
        stored_id = await self.results.finish(
            PendingResult(probe_id, new, outcome, tuple(alert_states), completes_slot=completes)
        )
        write_seconds = time.perf_counter() - t0
        if claim is not None and completes:
            claim.completed = True
        if stored_id is not None and report.probe_id is None:
            report = dataclasses.replace(report, probe_id=stored_id)
        # Adopted even while the write is buffered, so paging goes on during a database
        # outage (delivery reads the evaluator's states, not the database).
        if self.alert_hook and alert_states:
            self.alert_hook.committed(alert_states)
        if kind is ProbeKind.BISECT:
            # A search step's verdict is evidence, not the endpoint's state: tokens only.
            self.metrics.observe_tokens(
                endpoint=spec.name,
                kind=kind.value,
                reported=ex.prompt_tokens,
                completion=ex.completion_tokens,
            )
        else:
            self.metrics.observe(
                endpoint=spec.name,
                kind=kind.value,
                verdict=judgement.verdict,
                finished_at=finished,
                duration=ex.total_seconds,
                planned=report.planned_prompt_tokens,
                reported=ex.prompt_tokens,
                completion=ex.completion_tokens,
            )
        crossed = cross_tenant_markers(judgement.foreign, new.tenant)
        if judgement.verdict is Verdict.CROSS_TENANT_LEAK and crossed and new.tenant:
            source = crossed[0].tenant
            assert source is not None  # cross_tenant_markers keeps named tenants only
            self.metrics.observe_cross_tenant_leak(
                endpoint=spec.name,
                kind=kind.value,
                source_tenant=source,
                tenant=new.tenant,
                at=finished,
            )
        log.info(
            "probe",
            endpoint=spec.name,
            model=spec.model,
            kind=kind.value,
            probe_id=probe_id,
            verdict=judgement.verdict.value,
            reason=judgement.reason,
            status=ex.status,
            planned_prompt_tokens=report.planned_prompt_tokens,
            reported_prompt_tokens=ex.prompt_tokens,
            marker_found=judgement.marker_found,
            foreign_probe_ids=[f.probe_id for f in judgement.foreign],
            tenant=new.tenant,
            foreign_tenants=sorted({f.tenant for f in judgement.foreign if f.tenant}),
            # Only with several depths, so a single-depth probe line stays as it was.
            **(
                {"depths": {str(d.depth): d.outcome.value for d in judgement.depths}}
                if judgement.depths
                else {}
            ),
            ttfb_seconds=_round(ex.ttfb_seconds),
            duration_seconds=_round(ex.total_seconds),
            tokenize_calls=plan.tokenize_calls if plan else 0,
            confirms_probe_id=confirms,
            trigger_probe_id=new.trigger_probe_id,
            store_write_seconds=round(write_seconds, 4),
            slot=new.slot,
            lag_seconds=(
                None
                if scheduled is None
                else round((new.started_at - scheduled).total_seconds(), 4)
            ),
        )
        return report


class WindowUnknown(Exception):
    pass


def _goes_to_edge(kind: ProbeKind, verdict: Verdict) -> bool:
    """A capacity mismatch goes on to the edge probe (``run_checked``)."""
    return kind is ProbeKind.CAPACITY and verdict is Verdict.CAPACITY_MISMATCH


def _bounded(text: str | None, limit: int) -> str | None:
    if text is None or limit <= 0:
        return None  # a limit of 0 switches excerpts off: they may hold other users' data
    return text if len(text) <= limit else text[:limit] + "…"


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "…"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
