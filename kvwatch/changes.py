"""Change-triggered canaries: probe at the moment of a redeploy, not 15 minutes later.

After every capacity check this replica ran, the engine's self-report is compared with the
endpoint's last fingerprint (kvwatch.fingerprint, in the store's compare-and-set). A change
is logged (``endpoint_changed``, with the fields before and after), counted, stored, and its
canaries (every prompted kind the endpoint runs) start at once, or when the endpoint's
minimum gap since its last change run ends. They run in the slot ``-change_id`` of each kind,
so the slot claims let exactly one replica run them, and each probe row names its change.

A change run takes the place of the kind's next scheduled run (that slot is marked done), so
the canaries a change brings forward cost no more than the schedule had planned: a budget
still holds. Changes held by the gap are picked up by whichever replica polls first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog

from kvwatch.canary.model import ProbeKind
from kvwatch.fingerprint import change_kinds, fingerprint_of
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.model import Target
from kvwatch.store.changes import ChangeRecord
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store

log = structlog.get_logger("kvwatch.changes")

# How often held changes are looked for: a change held by the gap runs at most this late.
POLL_SECONDS = 5.0
# A change run takes the place of the first scheduled run not already taken (by an earlier
# change, or running now) among the next few; beyond them it is simply an extra run.
SLOTS_TO_REPLACE = 4


class ChangeRuns(Protocol):
    """What the watcher needs from the scheduler."""

    def target(self, endpoint: str) -> Target | None: ...

    def endpoints(self) -> Sequence[str]: ...

    def next_slot(self, target: Target, kind: ProbeKind, after: int = 0) -> int: ...

    def run_slot_now(self, target: Target, kind: ProbeKind, slot: int) -> None: ...


class ChangeWatcher:
    def __init__(self, store: Store, metrics: ProbeMetrics, *, replica: str) -> None:
        self._store = store
        self._metrics = metrics
        self._replica = replica

    async def after_capacity(self, target: Target, runs: ChangeRuns) -> None:
        """Compare the self-report the capacity check just read with the last fingerprint;
        on a change, record it and run its canaries if they are due."""
        state, spec = target.state, target.spec
        if not state.report_unobserved:
            return  # another replica ran the check (its slot was taken)
        state.report_unobserved = False
        report, state.unobserved_report = state.unobserved_report, None
        # A report with no facts at all (every call failed) is an engine that did not answer.
        fields = (fingerprint_of(report) or None) if report is not None else None
        try:
            change = await asyncio.to_thread(
                self._store.observe_fingerprint,
                spec.name,
                fields,
                replica=self._replica,
                min_gap_seconds=spec.on_change_min_gap_seconds,
                on_change=spec.on_change,
            )
        except StoreError as exc:
            log.warning("fingerprint_not_recorded", endpoint=spec.name, error=str(exc))
            return
        if change is None:
            return
        self._metrics.endpoint_changes.labels(spec.name, change.reason).inc()
        log.warning(
            "endpoint_changed",
            endpoint=spec.name,
            change_id=change.id,
            reason=change.reason,
            fields=list(change.fields),
            before=dict(change.before),
            after=dict(change.after),
            state=change.state,
            due_at=change.due_at.isoformat(),
        )
        if change.state == "due":
            await self.run(change, runs)

    async def run(self, change: ChangeRecord, runs: ChangeRuns) -> None:
        """Start a due change's canaries (each kind's claim decides which replica runs it)."""
        target = runs.target(change.endpoint)
        if target is None:
            return
        kinds = change_kinds(target.spec.probes)
        for kind in kinds:
            runs.run_slot_now(target, kind, -change.id)
        try:
            first = await asyncio.to_thread(self._store.mark_change_ran, change.id)
        except StoreError as exc:
            log.warning("change_not_marked", endpoint=change.endpoint, error=str(exc))
            return
        if not first:
            return  # another replica started it too (its claims decide who runs each kind)
        for kind in kinds:
            await self._replace_next(change, target, kind, runs)
        log.info(
            "change_canaries",
            endpoint=change.endpoint,
            change_id=change.id,
            kinds=[k.value for k in kinds],
        )

    async def _replace_next(
        self, change: ChangeRecord, target: Target, kind: ProbeKind, runs: ChangeRuns
    ) -> None:
        """Mark the kind's next free scheduled slot done: the change run is that run, early.
        Only the replica that marked the change as run does this, so a change replaces one
        scheduled run however many replicas saw it due."""
        for after in range(SLOTS_TO_REPLACE):
            slot = runs.next_slot(target, kind, after)
            try:
                if await asyncio.to_thread(
                    self._store.skip_slot, change.endpoint, kind.value, slot, self._replica
                ):
                    return
            except StoreError as exc:
                log.warning("slot_not_skipped", endpoint=change.endpoint, error=str(exc))
                return

    async def poll(self, runs: ChangeRuns, every: float = POLL_SECONDS) -> None:
        """Run changes whose gap has ended (or that another replica recorded)."""
        while True:
            await asyncio.sleep(every)
            try:
                due = await asyncio.to_thread(self._store.due_changes, list(runs.endpoints()))
            except StoreError as exc:
                log.warning("changes_not_polled", error=str(exc))
                continue
            for change in due:
                await self.run(change, runs)
