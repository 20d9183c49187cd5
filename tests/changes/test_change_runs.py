"""A redeploy runs the boundary canaries at once, exactly once across two replicas."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from kvwatch.changes import ChangeWatcher
from kvwatch.daemon import build_targets
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.runner import ProbeRunner
from kvwatch.scheduler import ProbeScheduler
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint
from kvwatch.store import create_engine_for
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry

KINDS = ("under", "over", "baseline")


def replica(config, url: str, client: httpx.AsyncClient, name: str):
    store = Store(create_engine_for(url))
    metrics = ProbeMetrics(CollectorRegistry())
    targets = build_targets(config.resolved_endpoints(), store, lambda _n: client, metrics)
    runner = ProbeRunner(store=store, metrics=metrics, replica=name)
    watcher = ChangeWatcher(store, metrics, replica=name)
    scheduler = ProbeScheduler(runner, first_run_within=0.5, watcher=watcher)
    return store, metrics, targets, scheduler


async def until(what: str, check, timeout: float = 30.0):
    for _ in range(int(timeout / 0.2)):
        found = check()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_fingerprint_change_runs_each_boundary_kind_once_across_two_replicas(
    db_url: str, store: Store
) -> None:
    """Two replicas check capacity every second; a redeploy with a fault is recorded once,
    and its under, over and baseline canaries run once each, stored with the change id, and
    the over canary catches the fault the redeploy brought."""
    sim_endpoint = SimEndpoint("glm", window=4096, flavour=Flavour.VLLM)
    async with run_simulator([sim_endpoint]) as sim, httpx.AsyncClient() as client:
        entry = sim_endpoint_entry(
            sim,
            "glm",
            flavour="vllm",
            probes=["capacity", *KINDS],
            baseline_tokens=256,
            confirm=False,
            interval="1h",
            intervals={"capacity": "1s"},
        )
        config = config_for([entry], database=db_url)
        replicas = [replica(config, db_url, client, name) for name in ("r1", "r2")]
        polls = []
        try:
            for _, _, targets, scheduler in replicas:
                scheduler.start(targets)
                polls.append(asyncio.create_task(scheduler.watch_changes()))
            # The first fingerprint is remembered (no change), by one replica or the other.
            await until("a first fingerprint", lambda: _fingerprints(store) == 1)
            assert store.list_changes("glm") == []
            response = await client.put(
                f"{sim.base_url}/glm/_sim/fingerprint",
                json={"version": "0.12.0", "fault": FaultMode.ACCEPT_OVER_LIMIT.value},
            )
            response.raise_for_status()
            [change] = await until("the change", lambda: store.list_changes("glm"))
            assert change.reason == "fingerprint"
            assert set(change.fields) == {"process_start", "version"}

            def change_probes():
                rows = [p for p in store.list_probes(endpoint="glm", limit=200) if p.change_id]
                done = [p for p in rows if p.state.value == "done"]
                return rows if len(done) >= len(KINDS) else None

            rows = await until("the change's canaries", change_probes)
            await asyncio.sleep(3)  # time for a second replica's duplicate to show, if any
            rows = [p for p in store.list_probes(endpoint="glm", limit=200) if p.change_id]
        finally:
            for poll in polls:
                poll.cancel()
            for _, _, _, scheduler in replicas:
                await scheduler.shutdown(5)
            for r_store, *_ in replicas:
                r_store.engine.dispose()
    assert {p.change_id for p in rows} == {change.id}
    assert Counter(p.kind for p in rows) == Counter(KINDS)
    assert {p.slot for p in rows} == {-change.id}
    over = next(p for p in rows if p.kind == "over")
    assert over.verdict == "over_accepted"
    assert [c.state for c in store.list_changes("glm")] == ["ran"]
    changed = sum(
        m.registry.get_sample_value(
            "kvwatch_endpoint_changes_total", {"endpoint": "glm", "reason": change.reason}
        )
        or 0
        for _, m, _, _ in replicas
    )
    assert changed == 1


def _fingerprints(store: Store) -> int:
    with store.engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM endpoint_fingerprints")).scalar_one())


async def test_a_flapping_engine_runs_its_canaries_once_per_gap(db_url: str, store: Store) -> None:
    """Three redeploys a second apart: the first change runs at once; the next is held and
    superseded by the third, which runs when the 4 s gap ends, with its own change id."""
    sim_endpoint = SimEndpoint("glm", window=4096, flavour=Flavour.VLLM)
    async with run_simulator([sim_endpoint]) as sim, httpx.AsyncClient() as client:
        entry = sim_endpoint_entry(
            sim,
            "glm",
            flavour="vllm",
            probes=["capacity", "baseline"],
            baseline_tokens=256,
            interval="1h",
            intervals={"capacity": "1s"},
            on_change_min_gap="4s",
        )
        config = config_for([entry], database=db_url)
        r_store, _, targets, scheduler = replica(config, db_url, client, "r1")
        scheduler.start(targets)
        poll = asyncio.create_task(scheduler.watch_changes())
        try:
            await until("a first fingerprint", lambda: _fingerprints(store) == 1)
            for version in ("2", "3", "4"):
                await client.put(f"{sim.base_url}/glm/_sim/fingerprint", json={"version": version})
                await until(
                    f"version {version} seen",
                    lambda v=version: any(
                        c.after.get("version") == v for c in store.list_changes("glm")
                    ),
                )
            first, held, last = sorted(store.list_changes("glm"), key=lambda c: c.id)
            await until(
                "the held change's run", lambda: store.list_changes("glm")[0].state == "ran", 20
            )
            runs = await until(
                "two change runs",
                lambda: (
                    [p for p in store.list_probes(endpoint="glm", limit=100) if p.change_id]
                    if len([p for p in store.list_probes(endpoint="glm", limit=100) if p.change_id])
                    >= 2
                    else None
                ),
            )
        finally:
            poll.cancel()
            await scheduler.shutdown(5)
            r_store.engine.dispose()
    states = {c.id: c for c in store.list_changes("glm")}
    assert [states[c.id].state for c in (first, held, last)] == ["ran", "superseded", "ran"]
    assert first.ran_at is not None
    # Both later changes were due only when the gap since the first run ended.
    assert held.due_at >= first.ran_at + timedelta(seconds=4) > held.at
    assert last.due_at >= first.ran_at + timedelta(seconds=4)
    assert states[last.id].ran_at >= first.ran_at + timedelta(seconds=4)
    assert sorted(p.change_id for p in runs) == [first.id, last.id]
