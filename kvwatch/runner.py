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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from kvwatch.canary import markers
from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import (
    SEVERITY,
    Exchange,
    ForeignMarker,
    Judgement,
    PlannedPrompt,
    ProbeKind,
    Severity,
    Verdict,
)
from kvwatch.canary.planning import PlanningError, plan_prompt
from kvwatch.canary.sizing import (
    SizingError,
    edge_prompt_tokens,
    served_window,
    target_prompt_tokens,
)
from kvwatch.canary.verdicts import judge
from kvwatch.capacity import assess, edge_pool
from kvwatch.config import EndpointSpec
from kvwatch.engines.base import Discovery, Engine, EngineAuthError, ProgressCallback
from kvwatch.metrics import ProbeMetrics
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.records import AlertStateRecord, NewProbe, ProbeOutcome
from kvwatch.store.repository import Store
from kvwatch.tokens.base import TokenCounter
from kvwatch.writebehind import PendingResult, ResultBuffer, SlotTaken

EXCERPT_CHARS = 400
# A discovered window above this is garbage, not a model: planning it would build a prompt
# of that size. (Configured windows are the operator's word and are not capped.)
MAX_PLAUSIBLE_WINDOW = 2**27
ERROR_BODY_CHARS = 2000

log = structlog.get_logger("kvwatch.probe")


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

    def __post_init__(self) -> None:
        self.results = ResultBuffer(self.store, self.metrics.registry)

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
        claim: SlotClaim | None = None,
    ) -> list[ProbeReport]:
        """Run a probe and, on a critical verdict, its confirmation probe at once.

        A capacity check that finds the KV pool smaller than the window goes on to the edge
        probe, just over the pool: exactly where the incident happened. With ``claim`` (a
        scheduled slot), raises :class:`SlotTaken` if another replica runs the slot.
        """
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
                    target, kind, progress=progress, slot=slot, scheduled=scheduled, claim=claim
                )
            ]
        first = reports[0]
        if self._confirms(target, first.verdict):
            if kind is ProbeKind.CAPACITY:
                again = await self._run_capacity(
                    target, confirms=first.probe_id, slot=slot, claim=claim
                )
                reports += [again] if again is not None else []
            else:
                confirm = await self.run(
                    target, kind, confirms=first.probe_id, progress=progress, slot=slot, claim=claim
                )
                reports.append(confirm)
        if _goes_to_edge(kind, reports[-1].verdict):
            reports += await self.run_checked(target, ProbeKind.EDGE, progress=progress)
        return reports

    def _confirms(self, target: Target, verdict: Verdict) -> bool:
        """Whether a (first) probe with ``verdict`` is re-checked by a confirmation probe."""
        return target.spec.confirm and SEVERITY[verdict] is Severity.CRITICAL

    def _last_of_slot(
        self, target: Target, kind: ProbeKind, verdict: Verdict, *, confirming: bool
    ) -> bool:
        """Whether ``run_checked`` runs no further probe after this one (in step with it)."""
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
        claim: SlotClaim | None = None,
    ) -> ProbeReport:
        """Run one probe. With ``claim`` not yet claimed, its start claims the slot (raises
        :class:`SlotTaken` if another replica has it; nothing is planned or sent then)."""
        spec = target.spec
        marker = markers.new_marker()
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
        )
        probe_id = await self._begin(new, claim)
        plan: PlannedPrompt | None = None
        try:
            failure: Judgement | None = None
            try:
                plan = await self._plan(target, kind, marker)
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
                exchange = await target.engine.chat(
                    plan.messages,
                    max_tokens=plan.max_tokens,
                    stream=spec.stream,
                    timeout=spec.timeouts[kind],
                    progress=progress,
                )
                foreign = await self._foreign_markers(exchange, marker)
                verdict_of = judge_edge if kind is ProbeKind.EDGE else judge
                judgement = verdict_of(plan, exchange, foreign)
                if plan.note and judgement.verdict is not Verdict.PASS:
                    judgement.reason = f"{judgement.reason}; {plan.note}"
                if exchange.prompt_tokens is not None:
                    target.counter.observe(plan.planned_tokens, exchange.prompt_tokens)
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
            marker_depth=plan.marker_depth if plan else 0.0,
            streamed=streamed,
            confirms_probe_id=confirms,
            slot=slot,
        )

    async def _plan(self, target: Target, kind: ProbeKind, marker: str) -> PlannedPrompt:
        spec = target.spec
        window = await self._window(target)
        counter = target.counter
        # An estimated count keeps a margin so estimation error cannot cross the boundary.
        margin = 0 if counter.exact else counter.tolerance(window)
        if kind is ProbeKind.EDGE:
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
        depth = rng.choice(spec.marker_depths) if spec.marker_depths else 0.0
        return await plan_prompt(
            kind,
            counter=counter,
            target_tokens=tokens,
            marker=marker,
            max_tokens=spec.max_tokens,
            rng=rng,
            depth=depth,
        )

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

    async def _foreign_markers(self, ex: Exchange, own: str) -> list[ForeignMarker]:
        if not ex.answer:
            return []
        seen = [m for m in markers.markers_in_answer(ex.answer) if m != markers.canonical(own)]
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
        )
        alert_states = self.alert_hook.evaluate(report, target) if self.alert_hook else ()
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
            and self._last_of_slot(target, kind, judgement.verdict, confirming=confirms is not None)
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
            ttfb_seconds=_round(ex.ttfb_seconds),
            duration_seconds=_round(ex.total_seconds),
            tokenize_calls=plan.tokenize_calls if plan else 0,
            confirms_probe_id=confirms,
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
