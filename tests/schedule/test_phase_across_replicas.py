"""Replicas and a restarted replica run each job at the same phase, each slot once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
from prometheus_client import CollectorRegistry

from kvwatch.daemon import build_targets
from kvwatch.metrics import ProbeMetrics
from kvwatch.phase import phase_ms
from kvwatch.probe.runner import ProbeRunner
from kvwatch.scheduler import ProbeScheduler
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.store import create_engine_for
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry

INTERVAL = 3.0
SLACK = 1.0  # seconds a run may start after its phase
NAMES = ("a", "b", "c")


def start_replica(config, url: str, client: httpx.AsyncClient, name: str):
    store = Store(create_engine_for(url))
    metrics = ProbeMetrics(CollectorRegistry())
    targets = build_targets(config.resolved_endpoints(), store, lambda _n: client, metrics)
    scheduler = ProbeScheduler(
        ProbeRunner(store=store, metrics=metrics, replica=name), first_run_within=0.3
    )
    scheduler.start(targets)
    return store, scheduler, time.time()


async def test_two_replicas_and_a_restart_run_every_job_at_its_hashed_phase(
    db_url: str, store: Store
) -> None:
    """Every scheduled run (first runs aside) starts at its slot plus the job's phase, on
    either replica and after a restart, and no slot runs twice."""
    async with (
        run_simulator([SimEndpoint(n, window=4096) for n in NAMES]) as sim,
        httpx.AsyncClient() as client,
    ):
        entries = [
            sim_endpoint_entry(
                sim, n, probes=["baseline"], baseline_tokens=256, interval=f"{INTERVAL:.0f}s"
            )
            for n in NAMES
        ]
        config = config_for(entries, database=db_url)
        r1 = start_replica(config, db_url, client, "r1")
        r2 = start_replica(config, db_url, client, "r2")
        await asyncio.sleep(3 * INTERVAL)
        await r1[1].shutdown(5)
        r1[0].engine.dispose()
        restarted = start_replica(config, db_url, client, "r1")
        await asyncio.sleep(3 * INTERVAL)
        for replica_store, scheduler, _ in (r2, restarted):
            await scheduler.shutdown(5)
            replica_store.engine.dispose()
    starts = [r1[2], r2[2], restarted[2]]
    rows = [p for p in store.list_probes(limit=500) if p.state.value == "done"]
    assert Counter((p.endpoint, p.slot) for p in rows).most_common(1)[0][1] == 1
    scheduled = [
        p for p in rows if not any(0 <= p.started_at.timestamp() - s < 0.5 for s in starts)
    ]
    assert {p.replica for p in scheduled} == {"r1", "r2"}
    for p in scheduled:
        assert p.slot is not None
        offset = p.started_at.timestamp() - p.slot
        phase = phase_ms(p.endpoint, "baseline", INTERVAL) / 1000
        # Started at the slot's phase (never before it), give or take the event loop and the
        # slot claim's round trips: on PostgreSQL, in a full CI run on 2 shared cores, one
        # started 0.86 s late (0.5 s was the bound then). A run at the slot's start, or a
        # second or more off its phase, still fails.
        assert phase <= offset < phase + SLACK, (p.endpoint, p.replica, offset, phase)
