"""Paging end to end: simulator faults → verdicts → alert states → a real Alertmanager.

Probes are driven by hand (not by the scheduler) so each test is deterministic; everything
else is the daemon's own wiring from ``kvwatch.daemon.build``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from kvwatch.alerting.evaluator import RESOLVED_REASON
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import Config
from kvwatch.daemon import UNCONFIGURED_AT_START, Built, Daemon, build
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.engine import create_engine_for
from kvwatch.store.repository import Store
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, running_alertmanager
from tests.helpers.processes import free_port
from tests.helpers.targets import config_for, sim_endpoint_entry

UNDER, BASE = ProbeKind.UNDER, ProbeKind.BASELINE
LEAK_OR_CONTEXT = {"KVWatchCrossRequestLeak", "KVWatchContextNotHonored"}


@pytest.fixture
def webhook() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def alertmanager(webhook: RecordingServer) -> Iterator[AlertmanagerProcess]:
    yield from running_alertmanager(webhook.url)


def paging_config(sim: Any, db_url: str, am: AlertmanagerProcess, replica: str) -> Config:
    return config_for(
        [sim_endpoint_entry(sim, "ep")],
        database=db_url,
        replica=replica,
        alertmanager={"urls": [am.url], "resend_interval": "1s"},
    )


@contextlib.asynccontextmanager
async def kvwatch(config: Config) -> AsyncIterator[Built]:
    """The daemon's objects with alert delivery running, torn down afterwards."""
    built = await build(config)
    assert built.delivery is not None
    task = asyncio.create_task(built.delivery.run())
    try:
        yield built
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await built.delivery.aclose()
        await built.clients.aclose()
        built.store.engine.dispose()


async def probe(built: Built, kind: ProbeKind) -> list[Verdict]:
    return [r.verdict for r in await built.runner.run_checked(built.targets[0], kind)]


async def eventually(what: str, check: Any, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.2)


def active(am: AlertmanagerProcess) -> list[dict[str, Any]]:
    return [a for a in am.alerts() if a["status"]["state"] == "active"]


def notified(webhook: RecordingServer, status: str) -> list[dict[str, Any]]:
    return [
        alert
        for body in webhook.bodies()
        if isinstance(body, dict)
        for alert in body.get("alerts", [])
        if alert.get("status") == status
    ]


FLEET = [SimEndpoint("ep", window=8192, kv_pool=6144)]


async def test_stale_kv_pages_through_alertmanager_and_recovery_resolves_it(
    db_url, alertmanager, webhook
):
    """stale_kv fires a leak/context alert visible in Alertmanager and at the webhook;
    switching the fault off resolves it."""
    async with (
        run_simulator(FLEET) as sim,
        kvwatch(paging_config(sim, db_url, alertmanager, "a")) as kv,
    ):
        assert await probe(kv, BASE) == [Verdict.PASS]
        sim.set_fault("ep", FaultMode.STALE_KV)
        reports = await kv.runner.run_checked(kv.targets[0], UNDER)
        under = [r for r in reports if r.kind is UNDER]
        assert under[0].verdict in {Verdict.FOREIGN_MARKER, Verdict.TRUNCATED}
        assert len(under) == 2  # the confirmation probe ran at once
        # ... then the served-window search: evidence, never a page of its own.
        assert {r.kind for r in reports[2:]} == {ProbeKind.BISECT}

        alerts = await eventually("the page in Alertmanager", lambda: active(alertmanager))
        assert {a["labels"]["alertname"] for a in alerts} <= LEAK_OR_CONTEXT
        labels = alerts[0]["labels"]
        assert labels["endpoint"] == "ep" and labels["probe"] == "under"
        assert labels["severity"] == "critical" and labels["model"] == "sim-1"
        assert "replica" not in labels
        assert alerts[0]["generatorURL"].endswith(f"/probes/{under[1].probe_id}")
        assert "runbook_url" in alerts[0]["annotations"]
        # The re-sent page carries what the endpoint really serves.
        await eventually(
            "the served window in the description",
            lambda: any(
                "Served window: advertised 8,192 · served" in a["annotations"]["description"]
                for a in active(alertmanager)
            ),
        )
        await eventually("the webhook notification", lambda: notified(webhook, "firing"))

        sim.set_fault("ep", FaultMode.HEALTHY)
        assert await probe(kv, UNDER) == [Verdict.PASS]
        assert await probe(kv, UNDER) == [Verdict.PASS]
        await eventually("the alert to resolve", lambda: not active(alertmanager))
        await eventually("the resolved notification", lambda: notified(webhook, "resolved"))


async def test_a_restarted_alertmanager_gets_the_firing_alert_back_and_the_resolution(
    db_url, alertmanager, webhook
):
    """Alertmanager keeps no alerts across a restart: kvwatch's re-sends restore them."""
    async with (
        run_simulator(FLEET) as sim,
        kvwatch(paging_config(sim, db_url, alertmanager, "a")) as kv,
    ):
        sim.set_fault("ep", FaultMode.ACCEPT_OVER_LIMIT)
        assert (await probe(kv, ProbeKind.OVER))[-1] is Verdict.OVER_ACCEPTED
        first = await eventually("the page", lambda: active(alertmanager))
        alertmanager.stop()
        await asyncio.sleep(3)  # kvwatch keeps trying while it is down
        alertmanager.start()
        again = await eventually("the page again after restart", lambda: active(alertmanager))
        assert again[0]["labels"] == first[0]["labels"]
        assert again[0]["startsAt"] == first[0]["startsAt"]

        sim.set_fault("ep", FaultMode.HEALTHY)
        for _ in range(2):
            assert await probe(kv, ProbeKind.OVER) == [Verdict.PASS]
        await eventually("the resolution after restart", lambda: not active(alertmanager))


async def test_two_kvwatch_instances_on_one_endpoint_make_one_alert(
    tmp_path: Path, alertmanager, webhook
):
    """Stable labels (no replica identity) let Alertmanager merge both instances' pages."""
    async with run_simulator(FLEET) as sim:
        sim.set_fault("ep", FaultMode.ACCEPT_OVER_LIMIT)
        a_cfg = paging_config(sim, f"sqlite:///{tmp_path / 'a.db'}", alertmanager, "a")
        b_cfg = paging_config(sim, f"sqlite:///{tmp_path / 'b.db'}", alertmanager, "b")
        async with kvwatch(a_cfg) as a, kvwatch(b_cfg) as b:
            await probe(a, ProbeKind.OVER)
            await probe(b, ProbeKind.OVER)
            await eventually("the page", lambda: active(alertmanager))
            await asyncio.sleep(2.5)  # both have re-sent by now
            alerts = active(alertmanager)
            assert len(alerts) == 1, alerts


@pytest.mark.timeout(900)  # 600 probes; minutes on a loaded 2-core machine
async def test_a_healthy_endpoint_over_200_cycles_raises_no_alert(db_url, alertmanager, webhook):
    """200 cycles of under, over and baseline against a healthy engine: no alert, no page."""
    fleet = [SimEndpoint("ep", window=4096)]
    async with (
        run_simulator(fleet) as sim,
        kvwatch(paging_config(sim, db_url, alertmanager, "a")) as kv,
    ):
        for _ in range(200):
            for kind in (UNDER, ProbeKind.OVER, BASE):
                assert await probe(kv, kind) == [Verdict.PASS]
        states = kv.store.load_alert_states()
        assert [s for s in states if s.state != "inactive"] == []
        await asyncio.sleep(1.5)
        assert active(alertmanager) == []
        assert webhook.bodies() == []


async def test_a_restart_neither_forgets_a_firing_alert_nor_pages_it_again_as_new(
    tmp_path: Path, alertmanager, webhook
):
    """Firing alerts are reloaded from the database and re-sent with their startsAt."""
    db = f"sqlite:///{tmp_path / 'kvwatch.db'}"
    async with run_simulator(FLEET) as sim:
        sim.set_fault("ep", FaultMode.ACCEPT_OVER_LIMIT)
        config = paging_config(sim, db, alertmanager, "a")
        async with kvwatch(config) as first:
            await probe(first, ProbeKind.OVER)
            fired = await eventually("the page", lambda: active(alertmanager))
        states = [s for s in first.store.load_alert_states() if s.state == "firing"]
        assert len(states) == 1
        async with kvwatch(config):
            # No probe runs in the new process: the page must come from the stored state.
            await asyncio.sleep(2.5)
            again = active(alertmanager)
            assert len(again) == 1
            assert again[0]["startsAt"] == fired[0]["startsAt"]
            assert again[0]["labels"] == fired[0]["labels"]
        firing_notes = notified(webhook, "firing")
        # Compared as instants: the webhook prints Go's shortest form (".09Z"), the API
        # always three digits (".090Z").
        started = datetime.fromisoformat(fired[0]["startsAt"])
        assert {datetime.fromisoformat(n["startsAt"]) for n in firing_notes} == {started}


async def test_an_endpoint_removed_while_kvwatch_was_stopped_has_its_page_resolved(
    tmp_path: Path, alertmanager, webhook
):
    """Restarted without the paging endpoint in its file, kvwatch resolves that alert in
    Alertmanager, saying why, instead of re-sending it as firing for as long as it runs."""
    db = f"sqlite:///{tmp_path / 'kvwatch.db'}"
    fleet = [*FLEET, SimEndpoint("fine", window=8192)]
    async with run_simulator(fleet) as sim:
        sim.set_fault("ep", FaultMode.ACCEPT_OVER_LIMIT)
        async with kvwatch(paging_config(sim, db, alertmanager, "a")) as first:
            await probe(first, ProbeKind.OVER)
            [fired] = await eventually("the page", lambda: active(alertmanager))
        without = config_for(
            [sim_endpoint_entry(sim, "fine", probes=["baseline"])],
            database=db,
            replica="a",
            listen=f"127.0.0.1:{free_port()}",
            alertmanager={"urls": [alertmanager.url], "resend_interval": "1s"},
        )
        restarted = Daemon(without, grace_seconds=5)
        task = asyncio.create_task(restarted.run())
        try:
            [resolved] = await eventually(
                "the resolution", lambda: notified(webhook, "resolved"), timeout=30
            )
            assert resolved["labels"] == fired["labels"]
            assert resolved["annotations"][RESOLVED_REASON] == UNCONFIGURED_AT_START
            assert await eventually("no page left", lambda: not active(alertmanager))
            engine = create_engine_for(db)
            try:
                [row] = Store(engine).load_alert_states()
            finally:
                engine.dispose()
            assert (row.endpoint, row.state) == ("ep", "resolved")
        finally:
            restarted.stop.set()
            await asyncio.wait_for(task, 60)


async def test_closing_the_kv_gap_resolves_the_edge_probes_page(
    tmp_path: Path, alertmanager, webhook
):
    """The incident: a pool under the window, stale pages served at the edge, two pages
    (capacity and edge). The engine redeployed with the pool holding the window: the edge
    probe no longer runs, and the capacity check's passes resolve both pages."""
    db = f"sqlite:///{tmp_path / 'kvwatch.db'}"
    gap = SimEndpoint("ep", window=8192, kv_pool=6144, fault=FaultMode.STALE_KV, flavour="sglang")
    async with run_simulator([gap]) as sim:
        port = sim.port
        config = config_for(
            [sim_endpoint_entry(sim, "ep", flavour="sglang")],
            database=db,
            replica="a",
            defaults={"confirm": False, "served_window": False},
            alertmanager={"urls": [alertmanager.url], "resend_interval": "1s"},
        )
        async with kvwatch(config) as kv:
            target = kv.targets[0]
            await kv.runner.run_checked(target, BASE)  # pages for stale KV to serve
            reports = await kv.runner.run_checked(target, ProbeKind.CAPACITY)
            assert [r.kind for r in reports] == [ProbeKind.CAPACITY, ProbeKind.EDGE]
            pages = await eventually("two pages", lambda: len(active(alertmanager)) == 2)
            fired = {a["labels"]["probe"]: a["labels"] for a in active(alertmanager)}
            assert pages and fired["edge"]["alertname"] == "KVWatchCrossRequestLeak"
            assert fired["capacity"]["alertname"] == "KVWatchCapacityMismatch"
    fixed = SimEndpoint("ep", window=8192, flavour="sglang")
    async with run_simulator([fixed], port=port), kvwatch(config) as kv:
        for _ in range(2):
            reports = await kv.runner.run_checked(kv.targets[0], ProbeKind.CAPACITY)
            assert [(r.kind, r.verdict) for r in reports] == [(ProbeKind.CAPACITY, Verdict.PASS)]
        assert await eventually("no page left", lambda: not active(alertmanager))

        def resolutions() -> dict[str, dict[str, str]] | None:
            notes = {a["labels"]["probe"]: a["labels"] for a in notified(webhook, "resolved")}
            return notes if len(notes) == 2 else None

        assert await eventually("both resolutions sent", resolutions) == fired
