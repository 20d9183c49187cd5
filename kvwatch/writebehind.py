"""Results that could not be written while the database was unreachable.

Probing must not stop when the database does: a result that cannot be stored is kept here,
in order, and written when the database answers again. The buffer is bounded (the oldest
result is dropped, and counted, when it is full), and while anything is buffered new results
queue behind it, so alert states are never written out of order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.records import AlertStateRecord, NewProbe, ProbeOutcome
from kvwatch.store.repository import Store
from kvwatch.store.writer import GroupWriter

log = structlog.get_logger("kvwatch.writebehind")

DEFAULT_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class PendingResult:
    probe_id: int | None  # None: not even its start could be recorded
    new: NewProbe
    outcome: ProbeOutcome
    alert_states: Sequence[AlertStateRecord] = field(default_factory=tuple)
    # The last result of its slot: the slot is marked done in the same transaction, so a
    # buffered result completes its slot when it is written, not before.
    completes_slot: bool = False


class SlotTaken(Exception):
    """Another replica holds the slot: this one must not run it."""


class ResultBuffer:
    def __init__(
        self,
        store: Store,
        registry: CollectorRegistry,
        *,
        limit: int = DEFAULT_LIMIT,
        retry_every: float = 5.0,
    ) -> None:
        self._store = store
        # Starts and results go through one writer thread, grouped into shared commits.
        self._writer = GroupWriter(store)
        # Bounded by ``limit`` (10,000 results by default): when full, the oldest is dropped
        # and counted in kvwatch_results_dropped_total.
        self._queue: deque[PendingResult] = deque()
        self._limit = limit
        self._retry_every = retry_every
        self._buffered = Gauge(
            "kvwatch_results_buffered",
            "Probe results waiting for the database to come back.",
            registry=registry,
        )
        self._dropped = Counter(
            "kvwatch_results_dropped",
            "Probe results lost: the buffer was full, or the database refused them.",
            ("reason",),
            registry=registry,
        )

    def __len__(self) -> int:
        return len(self._queue)

    async def begin(self, new: NewProbe, *, claim_ttl: float | None = None) -> int | None:
        """Record a probe's start; None when the database is unreachable (it runs anyway).

        With ``claim_ttl``, first claim the probe's slot in the same transaction, and raise
        :class:`SlotTaken` if another replica has it. Without the database no replica can
        coordinate: a slot run twice is better than a slot nobody runs while it is down.
        """
        try:
            if claim_ttl is None:
                return await self._writer.write(self._store.begin_probe_op(new))
            probe_id = await self._writer.write(self._store.claim_and_begin_op(new, claim_ttl))
        except StoreUnavailable as exc:
            log.warning(
                "database_unavailable",
                during="begin_probe" if claim_ttl is None else "claim_and_begin",
                endpoint=new.endpoint,
                kind=new.kind,
                error=str(exc),
            )
            return None
        if probe_id is None:
            raise SlotTaken(f"{new.endpoint} {new.kind} slot {new.slot}")
        return probe_id

    async def finish(self, pending: PendingResult) -> int | None:
        """Store a result now if the database answers and nothing is queued, else queue it."""
        if not self._queue:
            try:
                return await self._write(pending)
            except StoreUnavailable as exc:
                log.warning("database_unavailable", during="finish_probe", error=str(exc))
        self._append(pending)
        return pending.probe_id

    async def _write(self, pending: PendingResult) -> int:
        if pending.probe_id is None:
            return await self._writer.write(
                self._store.record_probe_op(
                    pending.new,
                    pending.outcome,
                    pending.alert_states,
                    complete_slot=pending.completes_slot,
                )
            )
        await self._writer.write(
            self._store.finish_probe_op(
                pending.probe_id,
                pending.outcome,
                pending.alert_states,
                complete_slot=pending.completes_slot,
                endpoint=pending.new.endpoint,
            )
        )
        return pending.probe_id

    def _append(self, pending: PendingResult) -> None:
        if len(self._queue) >= self._limit:
            self._queue.popleft()
            self._dropped.labels("buffer_full").inc()
        self._queue.append(pending)
        self._buffered.set(len(self._queue))

    async def flush(self) -> bool:
        """Write what is buffered, in order; False if the database is still unreachable."""
        while self._queue:
            pending = self._queue[0]
            try:
                await self._write(pending)
            except StoreUnavailable:
                return False
            except StoreError as exc:
                # Refused for good (e.g. its row was interrupted meanwhile): retrying would
                # only repeat the refusal, and it must not block everything behind it.
                log.error("result_refused", endpoint=pending.new.endpoint, error=str(exc))
                self._dropped.labels("refused").inc()
            self._queue.popleft()
            self._buffered.set(len(self._queue))
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._retry_every)
            if self._queue:
                before = len(self._queue)
                if await self.flush():
                    log.info("results_flushed", count=before)
