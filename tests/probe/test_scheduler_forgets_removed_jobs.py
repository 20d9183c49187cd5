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
        "scheduler_endpoint_gates": 1,
        "scheduler_running": 0,
    }
