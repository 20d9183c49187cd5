"""The scheduler keeps nothing of an endpoint a reload removed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from apscheduler.events import EVENT_JOB_SUBMITTED, JobSubmissionEvent

from kvwatch.canary.model import ProbeKind
from kvwatch.scheduler import ProbeScheduler, job_id


def target(name: str) -> SimpleNamespace:
    spec = SimpleNamespace(
        name=name,
        probes=(ProbeKind.UNDER, ProbeKind.OVER),
        interval_seconds=60.0,
        jitter_seconds=0.0,
        interval_for=lambda kind: 60.0,
        jitter_for=lambda kind: 0.0,
    )
    return SimpleNamespace(spec=spec)


async def test_a_removed_endpoint_leaves_no_job_due_time_or_gate() -> None:
    """A run submitted but not started when its endpoint goes leaves no due time behind,
    and the endpoint's jobs, target and gate go too; the other endpoint keeps its own."""
    scheduler = ProbeScheduler(runner=SimpleNamespace())  # type: ignore[arg-type]
    for name in ("gone", "kept"):
        scheduler.add(target(name))  # type: ignore[arg-type]
        for kind in (ProbeKind.UNDER, ProbeKind.OVER):
            scheduler._submitted(
                JobSubmissionEvent(
                    EVENT_JOB_SUBMITTED, job_id(name, kind), None, [datetime.now(UTC)]
                )
            )
        scheduler._endpoint_gates[name] = asyncio.Semaphore(1)
    both = scheduler.sizes()
    assert both["scheduler_due"] == 4 and both["scheduler_jobs"] == 4

    scheduler.remove("gone", iter((ProbeKind.UNDER, ProbeKind.OVER)))

    assert scheduler.sizes() == {
        "scheduler_targets": 1,
        "scheduler_jobs": 2,
        "scheduler_due": 2,
        "scheduler_deferred": 0,
        "scheduler_endpoint_gates": 1,
        "scheduler_running": 0,
    }


class Runner:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def run_slot(self, target, kind, slot, *, scheduled=None):  # type: ignore[no-untyped-def]
        self.ran.append(target.spec.name)
        return []


async def test_a_run_that_starts_after_its_endpoint_went_leaves_no_gate() -> None:
    """APScheduler may start a run submitted just before the removal: it runs, and the
    endpoint's gate it needed goes with it."""
    runner = Runner()
    scheduler = ProbeScheduler(runner=runner)  # type: ignore[arg-type]
    gone = target("gone")
    scheduler.add(gone)  # type: ignore[arg-type]
    scheduler.remove("gone", [ProbeKind.UNDER, ProbeKind.OVER])
    await scheduler._run(gone, ProbeKind.UNDER)  # type: ignore[arg-type]
    assert runner.ran == ["gone"]
    assert scheduler.sizes()["scheduler_endpoint_gates"] == 0


class BlockedRunner:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def run_slot(self, target, kind, slot, *, scheduled=None):  # type: ignore[no-untyped-def]
        await self.release.wait()
        return []


async def test_what_waits_for_an_endpoint_to_be_idle_runs_after_its_probe_in_flight() -> None:
    """A reload's clean-up of dropped kinds waits for the endpoint's running probe (which
    would re-create their series), and runs at once for an idle endpoint."""
    runner = BlockedRunner()
    scheduler = ProbeScheduler(runner=runner)  # type: ignore[arg-type]
    busy = target("busy")
    scheduler.add(busy)  # type: ignore[arg-type]
    probe = asyncio.create_task(scheduler._run(busy, ProbeKind.UNDER))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    done: list[str] = []
    scheduler.when_idle("busy", lambda: done.append("busy"))
    scheduler.when_idle("idle", lambda: done.append("idle"))
    await asyncio.sleep(0.01)
    assert done == ["idle"]
    runner.release.set()
    await probe
    await asyncio.sleep(0.01)
    assert done == ["idle", "busy"]


async def test_an_async_clean_up_is_awaited_whether_the_endpoint_is_busy_or_idle() -> None:
    """An async function given to when_idle runs to its end (a reload's alert retirement
    writes to the database), after the probe in flight or at once."""
    runner = BlockedRunner()
    scheduler = ProbeScheduler(runner=runner)  # type: ignore[arg-type]
    busy = target("busy")
    scheduler.add(busy)  # type: ignore[arg-type]
    probe = asyncio.create_task(scheduler._run(busy, ProbeKind.UNDER))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    done: list[str] = []

    async def clean_up(name: str) -> None:
        await asyncio.sleep(0)
        done.append(name)

    scheduler.when_idle("busy", lambda: clean_up("busy"))
    scheduler.when_idle("idle", lambda: clean_up("idle"))
    await asyncio.sleep(0.01)
    assert done == ["idle"]
    runner.release.set()
    await probe
    await asyncio.sleep(0.01)
    assert done == ["idle", "busy"]


def test_the_kinds_scheduled_now_leave_with_a_remove() -> None:
    """kinds() tells whether a dropped kind came back before the clean-up ran."""
    scheduler = ProbeScheduler(runner=SimpleNamespace())  # type: ignore[arg-type]
    scheduler.add(target("ep"))  # type: ignore[arg-type]
    assert scheduler.kinds("ep") == {ProbeKind.UNDER, ProbeKind.OVER}
    scheduler.remove("ep", [ProbeKind.UNDER, ProbeKind.OVER])
    assert scheduler.kinds("ep") == frozenset()
