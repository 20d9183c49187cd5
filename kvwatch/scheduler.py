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

log = structlog.get_logger("kvwatch.scheduler")


def job_id(endpoint: str, kind: ProbeKind) -> str:
    return f"{endpoint}:{kind.value}"


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
        self._first_run_within = first_run_within
        self._rng = rng or random.Random()
        self._clock = clock

    def start(self, targets: Iterable[Target]) -> None:
        for target in targets:
            self.add(target)
        self._scheduler.start()

    def add(self, target: Target) -> None:
        spec = target.spec
        for kind in spec.probes:
            # Spread first runs over a few seconds: results show up quickly after a start
            # without every endpoint's canary landing in the same instant.
            first = self._clock() + timedelta(seconds=self._rng.uniform(0, self._first_run_within))
            self._scheduler.add_job(
                self._run,
                IntervalTrigger(
                    seconds=spec.interval_seconds,
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
        for kind in kinds:
            if self._scheduler.get_job(job_id(endpoint, kind)):
                self._scheduler.remove_job(job_id(endpoint, kind))

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def _run(self, target: Target, kind: ProbeKind) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._runner.run_checked(target, kind)
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
