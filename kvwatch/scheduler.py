"""APScheduler 3.x wiring: one job per endpoint and probe kind.

Jobs never overlap (``max_instances=1``), a late run is coalesced into one, and a run that
is late by up to one interval still happens (the misfire grace is the interval: a missed
canary is worth running late, two stacked ones are not). Shutdown is ours, not APScheduler's:
its asyncio executor cancels running jobs outright, so we first stop new runs, let in-flight
probes finish up to a bound, and only then cancel the rest (which marks them interrupted).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from kvwatch.canary.model import ProbeKind
from kvwatch.runner import ProbeRunner, Target
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store

log = structlog.get_logger("kvwatch.scheduler")


def job_id(endpoint: str, kind: ProbeKind) -> str:
    return f"{endpoint}:{kind.value}"


# Runs fire on multiples of the interval since the epoch (plus jitter), so every replica
# computes the same slot for the same run and the database claim lets one of them run it.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def slot_for(when: float, interval: float) -> int:
    """The slot (start, in epoch seconds) that a run at ``when`` belongs to."""
    return int(when // interval * interval)


class ProbeScheduler:
    def __init__(
        self,
        runner: ProbeRunner,
        *,
        first_run_within: float = 10.0,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._runner = runner
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._tasks: set[asyncio.Task[object]] = set()
        self._targets: dict[str, Target] = {}
        self._first_run_within = first_run_within
        self._rng = rng or random.Random()
        self._clock = clock

    def start(self, targets: Iterable[Target]) -> None:
        for target in targets:
            self.add(target)
        self._scheduler.start()

    def add(self, target: Target) -> None:
        spec = target.spec
        self._targets[spec.name] = target
        for kind in spec.probes:
            # Spread first runs over a few seconds: results show up quickly after a start
            # without every endpoint's canary landing in the same instant.
            first = self._clock() + timedelta(seconds=self._rng.uniform(0, self._first_run_within))
            self._scheduler.add_job(
                self._run,
                IntervalTrigger(
                    seconds=spec.interval_seconds,
                    start_date=EPOCH,
                    jitter=spec.jitter_seconds or None,
                    timezone=UTC,
                ),
                args=(target, kind),
                id=job_id(spec.name, kind),
                name=job_id(spec.name, kind),
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(spec.interval_seconds)),
                next_run_time=first,
                replace_existing=True,
            )

    def remove(self, endpoint: str, kinds: Iterable[ProbeKind]) -> None:
        target = self._targets.get(endpoint)
        if target is not None:
            left = [k for k in target.spec.probes if k not in set(kinds)]
            if not left:
                del self._targets[endpoint]
        for kind in kinds:
            if self._scheduler.get_job(job_id(endpoint, kind)):
                self._scheduler.remove_job(job_id(endpoint, kind))

    async def sweep_expired(self, store: Store, every: float = 15.0) -> None:
        """Retry slots whose claim expired undone: their replica died mid-probe.

        Every replica sweeps; the takeover in ``claim_slot`` lets exactly one of them win.
        """
        while True:
            await asyncio.sleep(every)
            if not self._targets:
                continue
            # Old enough for a claim to have expired (two deadlines and a margin, as
            # run_slot sets), plus two intervals and two sweeps of slack.
            horizon = max(
                2 * max(t.spec.timeouts.values()) + 30 + 2 * t.spec.interval_seconds + 2 * every
                for t in self._targets.values()
            )
            try:
                expired = await asyncio.to_thread(
                    store.expired_slots, int(self._clock().timestamp() - horizon)
                )
            except StoreError as exc:
                log.warning("sweep_failed", error=str(exc))
                continue
            for endpoint, kind, slot in expired:
                target = self._targets.get(endpoint)
                if target is None or kind not in {k.value for k in target.spec.probes}:
                    continue
                log.info("slot_retry", endpoint=endpoint, kind=kind, slot=slot)
                self.run_slot_now(target, ProbeKind(kind), slot)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def run_slot_now(self, target: Target, kind: ProbeKind, slot: int) -> None:
        """Retry a slot whose claim expired (its replica died), outside the schedule."""
        asyncio.get_running_loop().create_task(
            self._run(target, kind, slot), name=f"retry:{job_id(target.spec.name, kind)}"
        )

    async def _run(self, target: Target, kind: ProbeKind, slot: int | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if slot is None:
            slot = slot_for(self._clock().timestamp(), target.spec.interval_seconds)
        try:
            await self._runner.run_slot(target, kind, slot)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug must not kill the job: the next interval tries again, and the log says why.
            log.exception("probe_crashed", endpoint=target.spec.name, kind=kind.value)
        finally:
            self._tasks.discard(task)

    async def shutdown(self, grace: float) -> None:
        """Stop scheduling, give in-flight probes ``grace`` seconds, then interrupt them."""
        if self._scheduler.running:
            self._scheduler.pause()
        pending = set(self._tasks)
        if pending:
            log.info("shutdown_waiting", in_flight=len(pending), grace_seconds=grace)
            _done, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=10)
                log.warning("shutdown_interrupted", probes=len(still))
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
