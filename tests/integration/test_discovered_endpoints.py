"""A real daemon following an http_sd source served by the simulator: a listed endpoint is
probed; once the list drops it, probing stops, its firing alert resolves with the reason,
and its history stays."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from kvwatch.alerting.evaluator import RESOLVED_REASON
from kvwatch.config import load_config, parse_config
from kvwatch.daemon import UNCONFIGURED_AT_START, Daemon
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError
from kvwatch.store.records import AlertStateRecord
from kvwatch.store.repository import Store
from tests.helpers.processes import free_port
from tests.helpers.store import get_probe

T = TypeVar("T")

FLEET = [
    # Keeps only the tail of a prompt over its pool: every under probe is truncated.
    SimEndpoint("leaky", window=4096, kv_pool=2048, fault=FaultMode.TRUNCATE_TAIL),
    SimEndpoint("fine", window=4096),
]


async def eventually(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await asyncio.to_thread(check)
        except StoreError:  # the daemon has not created the schema yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def daemon(
    sim: RunningSimulator, db_url: str, path: Path | None = None
) -> AsyncIterator[Daemon]:
    """The daemon on an http_sd source listing ``sim``'s endpoints; with ``path``, its
    configuration is written there so that it can be reloaded."""
    doc: dict[str, Any] = {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": "discovery-test",
        "discovery": [
            {
                "name": "sim",
                "http_sd": {"url": f"{sim.base_url}/_sim/http_sd", "refresh_interval": "1s"},
                "template": {
                    "probes": ["under"],
                    "interval": "2s",
                    "jitter": "0s",
                    "confirm": False,
                    "served_window": False,
                },
            }
        ],
    }
    if path is None:
        config = parse_config(yaml.safe_dump(doc), source="<test>")
    else:
        await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))
        config = await asyncio.to_thread(load_config, path)
    running = Daemon(config, config_path=path, grace_seconds=5)
    task = asyncio.create_task(running.run())
    try:
        yield running
    finally:
        running.stop.set()
        await asyncio.wait_for(task, 60)


def firing(store: Store, endpoint: str) -> AlertStateRecord | None:
    return next(
        (s for s in store.load_alert_states() if s.endpoint == endpoint and s.state == "firing"),
        None,
    )


async def test_a_discovered_endpoint_is_probed_and_dropping_it_resolves_its_alert_with_the_reason(
    db_url: str,
) -> None:
    """Listed: probed and paged. Unlisted: no more probes, the alert resolved saying why,
    its probes still in the database; the endpoint still listed goes on being probed."""
    engine = create_engine_for(db_url)
    observed = Store(engine)
    try:
        async with (
            run_simulator(FLEET) as sim,
            httpx.AsyncClient() as client,
            daemon(sim, db_url),
        ):
            alert = await eventually("a firing alert on leaky", lambda: firing(observed, "leaky"))
            assert alert.probe == "under"
            await eventually("fine probed", lambda: observed.list_probes(endpoint="fine"))

            response = await client.put(
                f"{sim.base_url}/_sim/listing", json={"endpoints": ["fine"]}
            )
            response.raise_for_status()

            def resolved() -> AlertStateRecord | None:
                states = observed.load_alert_states()
                return next(
                    (
                        s
                        for s in states
                        if (s.alertname, s.endpoint, s.probe)
                        == (alert.alertname, alert.endpoint, alert.probe)
                        and s.state == "resolved"
                    ),
                    None,
                )

            gone = await eventually("leaky's alert resolved", resolved, timeout=30)
            assert gone.annotations[RESOLVED_REASON] == (
                "discovery source sim no longer lists the endpoint"
            )
            # A probe in flight when the list changed may still finish; none starts after.
            await asyncio.sleep(1)
            count = len(observed.list_probes(endpoint="leaky", limit=1000))
            fine = len(observed.list_probes(endpoint="fine", limit=1000))
            await asyncio.sleep(5)
            assert len(observed.list_probes(endpoint="leaky", limit=1000)) == count
            # The history stays: the probe that fired the alert among it.
            assert count >= 1
            assert alert.last_probe_id is not None
            kept = get_probe(observed, alert.last_probe_id)
            assert kept is not None and kept.endpoint == "leaky"
            assert len(observed.list_probes(endpoint="fine", limit=1000)) > fine
    finally:
        engine.dispose()


async def test_a_reload_that_removes_the_source_retires_its_endpoints_and_a_new_one_applies_at_once(
    db_url: str, tmp_path: Path
) -> None:
    """Reload: the removed source's endpoints go (their alerts say the source was removed);
    a new source is fetched during the reload, its endpoints in the reload's answer."""
    engine = create_engine_for(db_url)
    observed = Store(engine)
    path = tmp_path / "kvwatch.yaml"
    try:
        async with (
            run_simulator(FLEET) as sim,
            daemon(sim, db_url, path=path) as running,
        ):
            alert = await eventually("a firing alert on leaky", lambda: firing(observed, "leaky"))
            doc = yaml.safe_load(await asyncio.to_thread(path.read_text))
            doc["discovery"][0]["name"] = "gw"
            doc["discovery"][0]["http_sd"] = None
            doc["discovery"][0]["gateway"] = {
                "url": f"{sim.base_url}/_gateway/v1",
                "api": "openai",
            }
            doc["discovery"][0]["template"]["probes"] = ["baseline"]
            await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))

            ok, summary = await running.reload()
            assert ok, summary
            assert summary.endswith(
                "with the discovery sources now: 1 endpoints: 1 added, 0 changed, 2 removed"
            )

            def retired() -> AlertStateRecord | None:
                return next(
                    (
                        s
                        for s in observed.load_alert_states()
                        if (s.alertname, s.endpoint) == (alert.alertname, "leaky")
                        and s.state == "resolved"
                    ),
                    None,
                )

            gone = await eventually("leaky's alert resolved", retired, timeout=30)
            assert gone.annotations[RESOLVED_REASON] == (
                "discovery source sim was removed from the configuration"
            )
            await eventually(
                "the gateway's model probed", lambda: observed.list_probes(endpoint="gw-sim-1")
            )
    finally:
        engine.dispose()


async def test_at_start_an_endpoint_no_source_lists_is_retired_once_every_source_has_answered(
    store: Store, db_url: str
) -> None:
    """A stored firing alert of an endpoint the source no longer lists is resolved, saying
    why; one of an endpoint the source lists again is not resolved on the way (its startsAt
    is still the stored one)."""
    since = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    stored = [
        AlertStateRecord(
            alertname="KVWatchContextNotHonored",
            endpoint=name,
            probe="under",
            state="firing",
            severity="critical",
            updated_at=since,
            failures=2,
            starts_at=since,
            labels={"alertname": "KVWatchContextNotHonored", "endpoint": name, "probe": "under"},
        )
        for name in ("leaky", "gone")
    ]
    store.save_alert_states(stored)
    async with run_simulator(FLEET) as sim, daemon(sim, db_url):

        def retired() -> AlertStateRecord | None:
            return next(
                (
                    s
                    for s in store.load_alert_states()
                    if s.endpoint == "gone" and s.state == "resolved"
                ),
                None,
            )

        gone = await eventually("gone's alert resolved", retired, timeout=30)
        assert gone.annotations[RESOLVED_REASON] == UNCONFIGURED_AT_START
        await eventually("leaky probed", lambda: store.list_probes(endpoint="leaky"))
        leaky = firing(store, "leaky")
        assert leaky is not None and leaky.starts_at == since
