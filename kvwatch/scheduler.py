"""APScheduler 3.x wiring: one job per endpoint and probe kind.

Jobs never overlap (``max_instances=1``), a late run is coalesced into one, and a run that
is late by up to one interval still happens (the misfire grace is the interval: a missed
canary is worth running late, two stacked ones are not). Shutdown is ours, not APScheduler's:
its asyncio executor cancels running jobs outright, so we first stop new runs, let in-flight
probes finish up to a bound, and only then cancel the rest (which marks them interrupted).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_SUBMITTED, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from apscheduler.triggers.interval import IntervalTrigger

from kvwatch.canary.model import ProbeKind
from kvwatch.changes import ChangeWatcher
from kvwatch.phase import next_slot_start, phase_ms, slot_for, slot_start
from kvwatch.probe.chain import claim_ttl
from kvwatch.probe.model import Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store

log = structlog.get_logger("kvwatch.scheduler")


def job_id(endpoint: str, kind: ProbeKind) -> str:
    return f"{endpoint}:{kind.value}"


# Runs fire on multiples of the interval since the epoch plus the job's phase (kvwatch.phase),
# plus jitter, so every replica computes the same slot for the same run and the database
# claim lets one of them run it.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Probes in flight at once. Beyond the HTTP pools' connections (engines.clients) extra
# probes only queue inside httpcore, whose pool rescans its whole queue for every request it
# places: with a thousand endpoints firing together that scan starved the event loop and
# every probe hit its deadline. Waiting here is cheap, and a probe's deadline only starts
# once it runs. Generous, because a long-window probe may hold its slot for minutes.
MAX_CONCURRENT_PROBES = 100
# First runs are spread so that at most this many start per second (but over no more than
# the job's interval, and no less than ``first_run_within``): a thousand endpoints must not
# all send their first canary in the same ten seconds.
FIRST_RUNS_PER_SECOND = 10.0
# Refused runs kept per job while its run goes on (see ProbeScheduler._deferred).
MAX_DEFERRED = 3


class SlotTrigger(IntervalTrigger):  # type: ignore[misc]
    """Fires once per slot, at the slot's due time (its start plus the job's phase) plus a
    fresh jitter.

    APScheduler's own jitter is added to the previous *jittered* fire time, so it accumulates:
    runs came every interval + jitter/2 on average (a 60 s interval with 59 s jitter ran every
    ~90 s, and skipped a third of its slots). Anchoring each run to its slot keeps one run per
    interval, as the slot claims expect. Jitter must stay below the interval (config checks).
    """

    def __init__(self, *, seconds: float, phase: int = 0, **kwargs: object) -> None:
        self.phase = phase
        super().__init__(
            seconds=seconds, start_date=EPOCH + timedelta(milliseconds=phase), **kwargs
        )

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        # Whole milliseconds (kvwatch.phase), not APScheduler's float sums: a fire time a
        # microsecond short of its slot's due time would name the slot before it.
        if previous_fire_time is not None:
            slot = slot_for(previous_fire_time.timestamp(), self.interval_length, self.phase)
            due = slot_start(slot, self.interval_length, self.phase) + self.interval_length
        else:
            due = next_slot_start(now.timestamp(), self.interval_length, self.phase)
        if self.jitter:
            due += random.uniform(0, self.jitter)
        return datetime.fromtimestamp(due, tz=UTC)


class ProbeScheduler:
    def __init__(
        self,
        runner: ProbeRunner,
        *,
        first_run_within: float = 10.0,
        max_concurrent: int = MAX_CONCURRENT_PROBES,
        first_runs_per_second: float = FIRST_RUNS_PER_SECOND,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        watcher: ChangeWatcher | None = None,
    ) -> None:
        self._runner = runner
        # Told after each capacity check, to run the canaries of a change (kvwatch.changes).
        self._watcher = watcher
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        # Running probe tasks by endpoint, so a removed endpoint's client is closed only
        # after its last probe (see idle). These maps hold at most one entry per configured
        # endpoint (or job, for _due): remove() drops a removed one's, _run its empty sets.
        self._running: dict[str, set[asyncio.Task[object]]] = {}
        self._targets: dict[str, Target] = {}
        # when_idle's waits, held so that they are not collected before they end.
        self._waiting: set[asyncio.Future[Any]] = set()
        self._first_run_within = first_run_within
        self._first_spread = first_run_within
        self._first_runs_per_second = first_runs_per_second
        self._gate = asyncio.Semaphore(max_concurrent)
        # One probe at a time per endpoint: its under and over probes are the two largest
        # prompts it serves, and they need not compete for its KV cache with each other.
        self._endpoint_gates: dict[str, asyncio.Semaphore] = {}
        self._rng = rng or random.Random()
        self._clock = clock
        # When each submitted run was due: APScheduler knows but does not pass it to the job.
        # The listener runs before the job's task does, so the job finds its own entry.
        self._due: dict[str, datetime] = {}
        # Runs APScheduler refused because the job's previous run still went on (a probe that
        # outlasts its interval, or waits for its endpoint's other probes): their due times,
        # run once the previous run ends, so those slots are not silently lost (under load a
        # replica lost dozens of a thousand slots that way). At most MAX_DEFERRED per job.
        self._deferred: dict[str, list[datetime]] = {}
        self._scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        self._scheduler.add_listener(self._refused, EVENT_JOB_MAX_INSTANCES)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        if event.scheduled_run_times:
            self._due[event.job_id] = max(event.scheduled_run_times)

    def _refused(self, event: JobSubmissionEvent) -> None:
        if event.scheduled_run_times:
            waiting = self._deferred.setdefault(event.job_id, [])
            waiting.append(max(event.scheduled_run_times))
            if len(waiting) > MAX_DEFERRED:
                # A run that outlasts this many intervals: the oldest slots are another
                # replica's to run, or lost; their claims (none) say so to the sweep.
                log.warning("run_coalesced", job=event.job_id, slots=len(waiting) - MAX_DEFERRED)
                del waiting[:-MAX_DEFERRED]
            log.info("run_deferred", job=event.job_id)

    def start(self, targets: Iterable[Target]) -> None:
        targets = list(targets)
        jobs = sum(len(t.spec.probes) for t in targets)
        self._first_spread = max(self._first_run_within, jobs / self._first_runs_per_second)
        for target in targets:
            self.add(target)
        self._scheduler.start()

    def add(self, target: Target) -> None:
        spec = target.spec
        self._targets[spec.name] = target
        for kind in spec.probes:
            interval = spec.interval_for(kind)
            phase = phase_ms(spec.name, kind.value, interval)
            # Spread first runs over a few seconds: results show up quickly after a start
            # without every endpoint's canary landing in the same instant (a large fleet's
            # over up to one interval, see FIRST_RUNS_PER_SECOND).
            spread = min(self._first_spread, max(self._first_run_within, interval))
            now = self._clock()
            first = now + timedelta(seconds=self._rng.uniform(0, spread))
            trigger = SlotTrigger(
                seconds=interval,
                phase=phase,
                jitter=spec.jitter_for(kind) or None,
                timezone=UTC,
            )
            if spread > self._first_run_within and slot_for(
                first.timestamp(), interval, phase
            ) > slot_for(now.timestamp(), interval, phase):
                # A large fleet's first runs drawn past the current slot would crowd into
                # the start of the next one beside its regular runs (a fleet restarted at
                # full rate ran 1.7x that rate for the rest of the slot, and lag piled up
                # for a minute); that slot's own phased run comes soon enough.
                first = trigger.get_next_fire_time(now, now) or first
            self._scheduler.add_job(
                self._run,
                trigger,
                args=(target, kind),
                id=job_id(spec.name, kind),
                name=job_id(spec.name, kind),
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(interval)),
                next_run_time=first,
                replace_existing=True,
            )

    def target(self, endpoint: str) -> Target | None:
        return self._targets.get(endpoint)

    def endpoints(self) -> list[str]:
        return list(self._targets)

    def next_slot(self, target: Target, kind: ProbeKind, after: int = 0) -> int:
        """The first slot of ``kind`` not yet due (``after`` > 0: that many slots later); a
        change run takes its place."""
        interval = target.spec.interval_for(kind)
        phase = phase_ms(target.spec.name, kind.value, interval)
        due = next_slot_start(self._clock().timestamp(), interval, phase) + after * interval
        return slot_for(due, interval, phase)

    async def watch_changes(self) -> None:
        """Run the canaries of held changes once their gap ends (see kvwatch.changes)."""
        if self._watcher is not None:
            await self._watcher.poll(self)

    def slot_at(self, target: Target, kind: ProbeKind, when: datetime) -> int:
        """The slot of ``kind`` of ``target`` that a run at ``when`` belongs to."""
        interval = target.spec.interval_for(kind)
        phase = phase_ms(target.spec.name, kind.value, interval)
        return slot_for(when.timestamp(), interval, phase)

    def remove(self, endpoint: str, kinds: Iterable[ProbeKind]) -> None:
        """Unschedule ``kinds`` of ``endpoint``, forgetting what was kept for their jobs
        (and for the endpoint, once none of its kinds is left)."""
        kinds = set(kinds)
        target = self._targets.get(endpoint)
        if target is not None:
            left = [k for k in target.spec.probes if k not in kinds]
            if not left:
                del self._targets[endpoint]
                self._endpoint_gates.pop(endpoint, None)
        for kind in kinds:
            # A run submitted but not started when its job goes would leave its due time.
            self._due.pop(job_id(endpoint, kind), None)
            self._deferred.pop(job_id(endpoint, kind), None)
            if self._scheduler.get_job(job_id(endpoint, kind)):
                self._scheduler.remove_job(job_id(endpoint, kind))

    def schedules(self, endpoint: str) -> bool:
        """Whether ``endpoint`` has a job (it is configured now)."""
        return endpoint in self._targets

    def sizes(self) -> dict[str, int]:
        """Entries of the maps kept per endpoint or job (see metrics.SizesCollector)."""
        return {
            "scheduler_targets": len(self._targets),
            "scheduler_jobs": len(self._scheduler.get_jobs()),
            "scheduler_due": len(self._due),
            "scheduler_deferred": len(self._deferred),
            "scheduler_endpoint_gates": len(self._endpoint_gates),
            "scheduler_running": len(self._running),
        }

    async def sweep_expired(self, store: Store, every: float = 15.0) -> None:
        """Retry slots whose claim expired undone: their replica died mid-probe.

        Every replica sweeps; the takeover in ``claim_slot`` lets exactly one of them win.
        """
        while True:
            await asyncio.sleep(every)
            if not self._targets:
                continue
            # Old enough for a claim to have expired (the longest claim any of its kinds
            # takes), plus two intervals and two sweeps of slack.
            horizon = max(
                claim_ttl(max(t.spec.timeouts.values()))
                + 2 * max(map(t.spec.interval_for, t.spec.probes))
                + 2 * every
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

    async def idle(self, endpoint: str) -> None:
        """Return once no probe of ``endpoint`` is running (now or, if some are, when the
        last of them ends)."""
        while running := self._running.get(endpoint):
            await asyncio.wait(set(running))

    def when_idle(self, endpoint: str, then: Callable[[], object]) -> None:
        """Call ``then`` once no probe of ``endpoint`` is running: at once if none is. What
        it returns, if awaitable (``then`` is an async function), is awaited in a task."""
        if endpoint not in self._running:
            result = then()
            if inspect.isawaitable(result):
                self._keep(asyncio.ensure_future(result))
            return

        async def wait() -> None:
            await self.idle(endpoint)
            result = then()
            if inspect.isawaitable(result):
                await result

        self._keep(asyncio.get_running_loop().create_task(wait(), name=f"when-idle:{endpoint}"))

    def _keep(self, task: asyncio.Future[Any]) -> None:
        # The loop holds only weak references to its tasks.
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    def kinds(self, endpoint: str) -> frozenset[ProbeKind]:
        """The kinds of ``endpoint`` scheduled now (none once it is removed)."""
        target = self._targets.get(endpoint)
        return frozenset(target.spec.probes) if target is not None else frozenset()

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    @property
    def in_flight(self) -> int:
        return sum(map(len, self._running.values()))

    def run_slot_now(self, target: Target, kind: ProbeKind, slot: int) -> None:
        """Retry a slot whose claim expired (its replica died), outside the schedule."""
        asyncio.get_running_loop().create_task(
            self._run(target, kind, slot), name=f"retry:{job_id(target.spec.name, kind)}"
        )

    async def _run(self, target: Target, kind: ProbeKind, slot: int | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        running = self._running.setdefault(target.spec.name, set())
        running.add(task)
        scheduled = None
        if slot is None:
            scheduled = self._due.pop(job_id(target.spec.name, kind), None)
            # The slot of the run that was due, not of the moment it started: a run started
            # late under load still claims its own slot, as every other replica computes it.
            when = scheduled or self._clock()
            slot = self.slot_at(target, kind, when)
        endpoint_gate = self._endpoint_gates.setdefault(target.spec.name, asyncio.Semaphore(1))
        try:
            async with endpoint_gate, self._gate:
                await self._runner.run_slot(target, kind, slot, scheduled=scheduled)
            if kind is ProbeKind.CAPACITY and self._watcher is not None:
                await self._watcher.after_capacity(target, self)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug must not kill the job: the next interval tries again, and the log says why.
            log.exception("probe_crashed", endpoint=target.spec.name, kind=kind.value)
        finally:
            if scheduled is not None:
                self._run_deferred(target, kind)
            running.discard(task)
            if not running:
                self._running.pop(target.spec.name, None)
                # A run that started after its endpoint was removed made a gate again.
                if target.spec.name not in self._targets:
                    self._endpoint_gates.pop(target.spec.name, None)

    def _run_deferred(self, target: Target, kind: ProbeKind) -> None:
        waiting = self._deferred.pop(job_id(target.spec.name, kind), [])
        if not waiting or kind not in self.kinds(target.spec.name):
            return
        if self._scheduler.state != STATE_RUNNING:  # paused for shutdown
            return
        for due in waiting:  # in order: the endpoint's gate runs them one after another
            slot = self.slot_at(target, kind, due)
            asyncio.get_running_loop().create_task(
                self._run(target, kind, slot), name=f"deferred:{job_id(target.spec.name, kind)}"
            )

    async def shutdown(self, grace: float) -> None:
        """Stop scheduling, give in-flight probes ``grace`` seconds, then interrupt them."""
        if self._scheduler.running:
            self._scheduler.pause()
        pending = set().union(*self._running.values())
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
