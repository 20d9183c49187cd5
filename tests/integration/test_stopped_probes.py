"""A probe kind an endpoint no longer runs (dropped by a reload, or while kvwatch was
stopped): its alerts resolve saying why, instead of being re-sent as firing for good."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kvwatch.alerting.evaluator import RESOLVED_REASON
from kvwatch.config import load_config
from kvwatch.daemon import STOPPED_PROBES, Daemon
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.records import AlertStateRecord
from kvwatch.store.repository import Store
from tests.helpers.processes import free_port
from tests.integration.test_discovered_endpoints import eventually

SINCE = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def document(sim: RunningSimulator, db_url: str, probes: list[str]) -> dict[str, Any]:
    return {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": "stopped-probes",
        "endpoints": [
            {
                "name": "ep",
                "url": sim.url_for("ep"),
                "model": sim.endpoints[0].model,
                "context_window": 8192,
                "probes": probes,
                "interval": "1s",
                "jitter": "0s",
                "confirm": False,
                "served_window": False,
            }
        ],
    }


@contextlib.asynccontextmanager
async def daemon(path: Path, doc: dict[str, Any]) -> AsyncIterator[Daemon]:
    await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))
    running = Daemon(await asyncio.to_thread(load_config, path), config_path=path, grace_seconds=5)
    task = asyncio.create_task(running.run())
    try:
        yield running
    finally:
        running.stop.set()
        await asyncio.wait_for(task, 60)


def state_of(store: Store, probe: str) -> AlertStateRecord | None:
    return next(
        (s for s in store.load_alert_states() if (s.endpoint, s.probe) == ("ep", probe)), None
    )


async def test_a_reload_that_drops_a_paging_probe_resolves_its_alert_for_good(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    """The over probe pages; a reload keeps the endpoint but drops over: the alert resolves
    with the reason (after the over probe in flight, if any, has reported) and stays so."""
    path = tmp_path / "kvwatch.yaml"
    async with run_simulator([SimEndpoint("ep", window=8192)]) as sim:
        sim.set_fault("ep", FaultMode.ACCEPT_OVER_LIMIT)
        doc = document(sim, db_url, ["over", "baseline"])
        async with daemon(path, doc) as running:

            def over_firing() -> AlertStateRecord | None:
                state = state_of(store, "over")
                return state if state is not None and state.state == "firing" else None

            await eventually("the over probe's page", over_firing)
            doc["endpoints"][0]["probes"] = ["baseline"]
            await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))
            ok, summary = await running.reload()
            assert ok, summary

            def over_resolved() -> AlertStateRecord | None:
                state = state_of(store, "over")
                return state if state is not None and state.state == "resolved" else None

            resolved = await eventually("the over alert resolved", over_resolved, timeout=30)
            assert resolved.annotations[RESOLVED_REASON] == STOPPED_PROBES
            await asyncio.sleep(3)  # baseline probes go on; nothing brings over back
            again = state_of(store, "over")
            assert again is not None and again.state == "resolved"
            assert running._built is not None and running._built.alerts is not None
            assert running._built.alerts.firing() == []


async def test_at_start_a_stored_alert_of_a_probe_the_endpoint_no_longer_runs_resolves(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    """Stored firing alerts of over and baseline; the file now lists baseline only: over's
    resolves with the reason, baseline's is left to its probes (no such reason on it)."""
    store.save_alert_states(
        [
            AlertStateRecord(
                alertname="KVWatchLimitNotEnforced" if probe == "over" else "KVWatchProbeFailing",
                endpoint="ep",
                probe=probe,
                state="firing",
                severity="critical",
                updated_at=SINCE,
                failures=1,
                starts_at=SINCE,
            )
            for probe in ("over", "baseline")
        ]
    )
    async with (
        run_simulator([SimEndpoint("ep", window=8192)]) as sim,
        daemon(tmp_path / "kvwatch.yaml", document(sim, db_url, ["baseline"])),
    ):

        def over_resolved() -> AlertStateRecord | None:
            state = state_of(store, "over")
            return state if state is not None and state.state == "resolved" else None

        resolved = await eventually("the over alert resolved", over_resolved, timeout=30)
        assert resolved.annotations[RESOLVED_REASON] == STOPPED_PROBES
        await eventually("ep probed", lambda: store.list_probes(endpoint="ep"))
        baseline = state_of(store, "baseline")
        assert baseline is not None and RESOLVED_REASON not in baseline.annotations
