"""Scale behaviour: the --fleet simulator, lag in the probe line, bounded concurrency."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from datetime import UTC, datetime
from types import SimpleNamespace

import httpx
import pytest
from structlog.testing import capture_logs

from kvwatch.canary.model import ProbeKind
from kvwatch.phase import phase_ms, slot_for
from kvwatch.scheduler import ProbeScheduler, SlotTrigger
from kvwatch.simulator.command import parse_window_range
from kvwatch.simulator.fleet import scale_fleet
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner


def test_a_scale_fleet_spreads_its_windows_evenly_over_the_range() -> None:
    """fleet-0000... get windows from the low to the high end, all healthy and unique."""
    fleet = scale_fleet(5, 2048, 8192)
    assert [e.name for e in fleet] == [f"fleet-000{i}" for i in range(5)]
    assert [e.window for e in fleet] == [2048, 3584, 5120, 6656, 8192]
    assert {e.fault.value for e in fleet} == {"healthy"}


def test_a_fleet_window_range_must_be_ordered_and_positive() -> None:
    """2048-8192 parses, a single number is a fixed window, reversed ranges are refused."""
    assert parse_window_range("2048-8192") == (2048, 8192)
    assert parse_window_range("4096") == (4096, 4096)
    with pytest.raises(ValueError, match="MIN <= MAX"):
        parse_window_range("8192-2048")
    with pytest.raises(ValueError, match="MIN-MAX"):
        parse_window_range("big")


async def _run_scheduled(
    tmp_db: str, store: Store, sim_endpoints: list[SimEndpoint], **scheduler_options: float
) -> list[dict[str, object]]:
    async with run_simulator(sim_endpoints) as sim, httpx.AsyncClient() as client:
        # An hour apart: a minute's slot boundary could fall inside the test and run a job
        # a second time (one in 40 runs of the slow four).
        entries = [
            sim_endpoint_entry(sim, e.name, probes=["baseline"], baseline_tokens=256, interval="1h")
            for e in sim_endpoints
        ]
        config = config_for(entries, database=tmp_db)
        targets, runner, _ = targets_and_runner(config, store, client)
        scheduler = ProbeScheduler(runner, first_run_within=0.5, **scheduler_options)  # type: ignore[arg-type]
        with capture_logs() as logs:
            scheduler.start(targets.values())
            for _ in range(100):
                await asyncio.sleep(0.1)
                if sum(1 for e in logs if e["event"] == "probe") >= len(sim_endpoints):
                    break
            await scheduler.shutdown(5)
    return [e for e in logs if e["event"] == "probe"]


async def test_a_scheduled_probe_logs_its_slot_and_how_late_it_started(
    db_url: str, store: Store
) -> None:
    """The probe line carries the slot and lag_seconds: start minus when the run was due."""
    probes = await _run_scheduled(db_url, store, [SimEndpoint("ep", window=4096)])
    assert len(probes) == 1
    line = probes[0]
    assert isinstance(line["lag_seconds"], float)
    assert 0 <= line["lag_seconds"] < 5
    # The slot a run belongs to starts at its name plus the job's phase (kvwatch.phase).
    now = datetime.now(UTC).timestamp() - phase_ms("ep", "baseline", 3600) / 1000
    assert isinstance(line["slot"], int) and now - 3600 < line["slot"] <= now
    assert line["slot"] % 3600 == 0


async def test_no_more_probes_run_at_once_than_the_scheduler_allows(
    db_url: str, store: Store
) -> None:
    """With max_concurrent=1, slow probes of four endpoints never overlap in time."""
    slow = [SimEndpoint(f"ep{i}", window=4096, ttfb_delay=0.3) for i in range(4)]
    probes = await _run_scheduled(db_url, store, slow, max_concurrent=1)
    assert len(probes) == 4
    rows = store.list_probes(kind=ProbeKind.BASELINE.value, limit=10)
    rows.sort(key=lambda r: r.started_at)
    assert len(rows) == 4
    for earlier, later in itertools.pairwise(rows):
        assert earlier.finished_at is not None
        assert earlier.finished_at <= later.started_at
    # The ones that waited for the gate say so in their lag.
    assert max(float(p["lag_seconds"]) for p in probes) >= 0.3  # type: ignore[arg-type]


def test_a_jittered_schedule_runs_once_in_every_slot_without_drifting() -> None:
    """Jitter is drawn afresh in each slot: 200 runs land in 200 consecutive slots."""
    trigger = SlotTrigger(seconds=60, phase=17_345, jitter=59, timezone=UTC)
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    fire = trigger.get_next_fire_time(None, now)
    assert fire is not None
    first = slot_for(fire.timestamp(), 60, 17_345)
    for n in range(1, 200):
        fire = trigger.get_next_fire_time(fire, fire)
        assert fire is not None
        assert slot_for(fire.timestamp(), 60, 17_345) == first + 60 * n


async def test_idle_returns_once_the_endpoints_running_probe_has_ended(
    db_url: str, store: Store
) -> None:
    """idle(name) waits out that endpoint's probe in flight (a removed endpoint's HTTP
    client is closed after it), and returns at once for an endpoint with none running."""
    slow = SimEndpoint("slow", window=4096, ttfb_delay=0.5)
    async with run_simulator([slow]) as sim, httpx.AsyncClient() as client:
        entry = sim_endpoint_entry(sim, "slow", probes=["baseline"], baseline_tokens=256)
        targets, runner, _ = targets_and_runner(config_for([entry], database=db_url), store, client)
        scheduler = ProbeScheduler(runner, first_run_within=0.01)
        with capture_logs() as logs:
            scheduler.start(targets.values())
            for _ in range(500):
                if scheduler.in_flight:
                    break
                await asyncio.sleep(0.01)
            assert scheduler.in_flight == 1
            await asyncio.wait_for(scheduler.idle("other"), 0.1)
            await asyncio.wait_for(scheduler.idle("slow"), 10)
            assert [e["endpoint"] for e in logs if e["event"] == "probe"] == ["slow"]
            await scheduler.shutdown(5)


async def test_a_large_fleet_started_early_in_a_slot_runs_the_next_slot_at_its_usual_pace() -> None:
    """First runs drawn past the slot boundary take that slot's jittered time instead of
    crowding its first seconds beside the regular runs (a restart ran 1.7x the rate)."""
    interval, jobs = 60.0, 1200
    slot = 1_800_000_000 // 60 * 60
    now = datetime.fromtimestamp(slot + 10, tz=UTC)  # 50 s left in this slot
    targets = [
        SimpleNamespace(
            spec=SimpleNamespace(
                name=f"ep{i}",
                probes=[ProbeKind.BASELINE],
                interval_seconds=interval,
                jitter_seconds=interval - 1,
                interval_for=lambda kind: interval,
                jitter_for=lambda kind: interval - 1,
            )
        )
        for i in range(jobs)
    ]
    runner = SimpleNamespace()
    scheduler = ProbeScheduler(runner, rng=random.Random(7), clock=lambda: now)  # type: ignore[arg-type]
    scheduler.start(targets)  # type: ignore[arg-type]
    try:
        next_slot: list[float] = []
        for job in scheduler._scheduler.get_jobs():
            fire, phase = job.next_run_time, job.trigger.phase
            current = slot_for(now.timestamp(), interval, phase)
            if slot_for(fire.timestamp(), interval, phase) == current:  # a first run in it
                fire = job.trigger.get_next_fire_time(fire, fire)
            assert slot_for(fire.timestamp(), interval, phase) == current + 60
            next_slot.append(fire.timestamp())
    finally:
        await scheduler.shutdown(0)
    assert len(next_slot) == jobs
    per_ten_seconds = Counter(int((t - now.timestamp()) // 10) for t in next_slot)
    # Each job's next slot is due within a minute (its phase) plus up to 59 s of jitter: at
    # most 200 in any 10 s (sd 13). The old first runs put 100 + 1000/6 = 370 in the first 10 s.
    assert max(per_ten_seconds.values()) < 260
