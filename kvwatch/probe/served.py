"""Measuring the true served window after a window failure, with bisect probes.

The runner hands every finished chain to :class:`ServedWindowTracker`. After a confirmed
window failure (:func:`kvwatch.probe.chain.starts_search`) it runs the search of
:mod:`kvwatch.canary.served`, one bisect step at a time through the callable it is given
(each step stored, linked to its trigger, never paging), and records the result; when an
under probe passes again it records that the advertised window is served again. In between
it does nothing: one search per failure streak, however many cycles the streak lasts.

The streak is read from the store (the endpoint's latest ``served_windows`` row), so a
restart in the middle of an incident does not search again, and several replicas sharing a
database see one another's result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from kvwatch.canary import served
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.planning import smallest_canary
from kvwatch.capacity import edge_pool
from kvwatch.engines.limits import stated_limit
from kvwatch.probe.chain import Link, starts_search
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.store.errors import StoreError
from kvwatch.store.records import ServedWindowRecord
from kvwatch.store.repository import Store

log = structlog.get_logger("kvwatch.served_window")

# A step sent to the engine that ends in one of these proves nothing either way (the engine
# or the way to it failed): the search stops without a result, and the next failure of the
# streak tries again. A step that could not even be planned is another matter: see search.
_NO_EVIDENCE = frozenset({Verdict.ERROR, Verdict.AUTH_ERROR, Verdict.THROTTLED})
# Sizes a passing probe of these kinds proves served: where the search may start from.
_PASSING_KINDS = ("baseline",)


# Runs one bisect step: a probe of ``size`` prompt tokens searching for the failure of the
# probe ``trigger``; returns its report (stored, never paging).
BisectStep = Callable[[int, int | None], Awaitable[ProbeReport]]


@dataclass(frozen=True, slots=True)
class Measurement:
    """A finished search, with every step it took; no record when it was cut short."""

    record: ServedWindowRecord | None
    steps: tuple[ProbeReport, ...]


def hint_of(report: ProbeReport, target: Target) -> int | None:
    """The engine's own signal of its served limit in a failed probe, if it gives one: the
    prompt tokens a 2xx answer reports having read (fewer than sent), or the limit a 4xx
    context-length rejection states, as the largest prompt it admits. Handed over as is:
    the search drops what cannot be the answer (a placeholder's 1, a limit of 0 or less)."""
    status = report.status
    if status is None:
        return None
    if 200 <= status < 300:
        reported, planned = report.reported_prompt_tokens, report.planned_prompt_tokens
        if reported is not None and planned is not None and 0 < reported < planned:
            return reported
        return None
    if 400 <= status < 500:
        limit = stated_limit(report.error_body)
        if limit is not None:
            return limit.largest_prompt(rule=target.engine.rule, max_tokens=target.spec.max_tokens)
    return None


def is_trigger(reports: Sequence[ProbeReport], kind: ProbeKind, confirm: bool) -> bool:
    """Whether a chain of ``kind`` probes ended in a confirmed window failure."""
    own = [r for r in reports if r.kind is kind]
    if not own:
        return False
    last = own[-1]
    link = Link(last.kind, last.verdict, confirming=last.confirms_probe_id is not None)
    return starts_search(link, confirm=confirm, planned=last.planned_prompt_tokens is not None)


@dataclass
class ServedWindowTracker:
    store: Store
    clock: Callable[[], datetime]

    async def after(
        self,
        step: BisectStep,
        target: Target,
        kind: ProbeKind,
        reports: Sequence[ProbeReport],
    ) -> list[ProbeReport]:
        """React to a finished chain of ``kind`` probes; return the bisect probes it ran."""
        spec = target.spec
        if not spec.served_window or target.window is None:
            return []
        own = [r for r in reports if r.kind is kind]
        if not own:
            return []
        last = own[-1]
        try:
            if kind is ProbeKind.UNDER and last.verdict is Verdict.PASS:
                await self._recovered(target, last)
                return []
            if not is_trigger(reports, kind, spec.confirm):
                return []
            current = await self._current(target)
            if current is not None and current.measured:
                return []  # this streak was measured already
        except StoreError as exc:
            log.warning("served_window_skipped", endpoint=spec.name, error=str(exc))
            return []
        try:
            measurement = await self.search(step, target, last)
        except StoreError as exc:
            # Without the last passing size there is no floor to search from; the next
            # failure of the streak tries again.
            log.warning("served_window_skipped", endpoint=spec.name, error=str(exc))
            return []
        if measurement.record is None:
            # Cut short, but its steps were run and stored: whoever ran the chain sees them.
            return list(measurement.steps)
        try:
            await asyncio.to_thread(self.store.record_served_window, measurement.record)
        except StoreError as exc:
            log.warning("served_window_not_stored", endpoint=spec.name, error=str(exc))
        target.state.served = measurement.record
        return list(measurement.steps)

    async def search(self, step: BisectStep, target: Target, trigger: ProbeReport) -> Measurement:
        """Bisect probes until the search of :mod:`kvwatch.canary.served` is done.

        A step the engine answered with no evidence (transport failure, 5xx, throttling)
        cuts the search short without a record. A step kvwatch could not plan says nothing
        about the engine: it is logged with the size asked for and the search goes on above
        that size (the step counts against the budget, so it still ends, and stores what
        the other steps proved)."""
        spec = target.spec
        window = target.window
        assert window is not None
        state = await self._start(target, trigger)
        steps: list[ProbeReport] = []
        unplanned = 0
        while (size := served.next_size(state)) is not None:
            report = await step(size, trigger.probe_id)
            steps.append(report)
            if report.planned_prompt_tokens is None:
                unplanned += 1
                _log_step("served_window_planning_error", spec.name, trigger, report, size)
                state = served.unplannable(state, size)
                continue
            if report.verdict in _NO_EVIDENCE:
                _log_step("served_window_aborted", spec.name, trigger, report, size)
                return Measurement(None, tuple(steps))
            observed = served.Observation(
                size=report.planned_prompt_tokens,
                whole=report.verdict is Verdict.PASS,
                hint=hint_of(report, target),
            )
            state = served.observe(state, observed)
        record = ServedWindowRecord(
            endpoint=spec.name,
            measured_at=self.clock(),
            source="search",
            advertised_tokens=window,
            served_tokens=state.served,
            unserved_tokens=state.unserved,
            exact=state.exact,
            probes=len(steps),
            prompt_tokens=sum(r.planned_prompt_tokens or 0 for r in steps),
            probe_id=trigger.probe_id,
        )
        log.info(
            "served_window",
            endpoint=spec.name,
            advertised_tokens=window,
            served_tokens=record.served_tokens,
            unserved_tokens=record.unserved_tokens,
            exact=record.exact,
            probes=record.probes,
            budget=state.budget,
            prompt_tokens=record.prompt_tokens,
            trigger_probe_id=trigger.probe_id,
            unplanned_steps=unplanned,
        )
        return Measurement(record, tuple(steps))

    async def _start(self, target: Target, trigger: ProbeReport) -> served.ServedSearch:
        """The search between the last size a baseline proved served and the trigger's."""
        spec = target.spec
        window = target.window
        failed = trigger.planned_prompt_tokens
        assert window is not None and failed is not None
        low = await asyncio.to_thread(
            self.store.last_passing_size, spec.name, _PASSING_KINDS, failed
        )
        # The engine's own word first (the trigger's signal), then its KV pool: the size the
        # incident class serves in practice. Both are verified like any other hint.
        pool = edge_pool(spec.kv_pool_tokens, target.discovery) if target.discovery else None
        pool = pool if pool is not None else spec.kv_pool_tokens
        # Several depths put one marker at each: more fixed text, a larger smallest canary.
        markers = len(spec.marker_depths) if len(spec.marker_depths) > 1 else 1
        return served.start(
            served=low or 0,
            unserved=failed,
            window=window,
            hints=(hint_of(trigger, target), pool),
            floor=smallest_canary(markers),
        )

    async def _current(self, target: Target) -> ServedWindowRecord | None:
        found = await asyncio.to_thread(self.store.served_windows, target.spec.name)
        target.state.served = found.get(target.spec.name)
        return target.served

    async def _recovered(self, target: Target, passed: ProbeReport) -> None:
        """The streak ended: the under probe, the largest prompt of the advertised window,
        came back whole. The served window is the advertised one again (no probe needed)."""
        current = target.served if target.served is not None else await self._current(target)
        if current is None or not current.measured:
            return
        assert target.window is not None
        record = ServedWindowRecord(
            endpoint=target.spec.name,
            measured_at=self.clock(),
            source="recovered",
            advertised_tokens=target.window,
            served_tokens=target.window,
            unserved_tokens=None,
            exact=True,
            probes=0,
            prompt_tokens=0,
            probe_id=passed.probe_id,
        )
        await asyncio.to_thread(self.store.record_served_window, record)
        target.state.served = record
        log.info(
            "served_window",
            endpoint=target.spec.name,
            advertised_tokens=target.window,
            served_tokens=target.window,
            recovered_by_probe_id=passed.probe_id,
        )


def _log_step(
    event: str, endpoint: str, trigger: ProbeReport, report: ProbeReport, size: int
) -> None:
    log.warning(
        event,
        endpoint=endpoint,
        trigger_probe_id=trigger.probe_id,
        probe_id=report.probe_id,
        size=size,
        verdict=report.verdict.value,
        reason=report.reason,
    )
