"""A run due while the job's previous run still goes on is run after it, not lost."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from structlog.testing import capture_logs

from kvwatch.canary.model import ProbeKind
from kvwatch.scheduler import ProbeScheduler

INTERVAL = 1.0


class SlowFirstRunner:
    """Records each slot it is asked to run; the first run outlasts two intervals."""

    def __init__(self) -> None:
        self.slots: list[int] = []

    async def run_slot(self, target, kind, slot, *, scheduled=None):  # type: ignore[no-untyped-def]
        self.slots.append(slot)
        if len(self.slots) == 1:
            await asyncio.sleep(2.2 * INTERVAL)
        return []


async def test_a_slot_due_during_a_long_run_is_run_when_it_ends() -> None:
    """APScheduler refuses the job's next starts while the first run lasts (max_instances=1);
    the refused slots run right after it, and every slot from the first on is run once."""
    spec = SimpleNamespace(
        name="slow",
        probes=(ProbeKind.BASELINE,),
        interval_seconds=INTERVAL,
        jitter_seconds=0.0,
        interval_for=lambda kind: INTERVAL,
        jitter_for=lambda kind: 0.0,
    )
    runner = SlowFirstRunner()
    scheduler = ProbeScheduler(runner, first_run_within=0.01)  # type: ignore[arg-type]
    with capture_logs() as logs:
        scheduler.start([SimpleNamespace(spec=spec)])  # type: ignore[list-item]
        await asyncio.sleep(5.5 * INTERVAL)
        await scheduler.shutdown(5)
    assert any(e["event"] == "run_deferred" for e in logs)
    slots = runner.slots
    assert len(slots) == len(set(slots)), slots
    # The first run (a first run, in the current slot) and then every following slot; the
    # refused ones run once the long run ends, beside the next regular one.
    assert sorted(slots) == list(range(slots[0], slots[0] + len(slots))), slots
    assert len(slots) >= 5
