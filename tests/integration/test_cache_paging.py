"""Cache verdicts page through a real Alertmanager: a cache that serves wrong pages (a prefix
collision, an aborted request's pages reused) as KVWatchCacheCorrupt; a healthy cache resolves
it; an engine with no prefix cache (cache_not_exercised) never pages."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, running_alertmanager
from tests.helpers.targets import config_for, sim_endpoint_entry
from tests.integration.test_paging import active, eventually, kvwatch, notified

CACHE = ProbeKind.CACHE


@pytest.fixture
def webhook() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def alertmanager(webhook: RecordingServer) -> Iterator[AlertmanagerProcess]:
    yield from running_alertmanager(webhook.url)


@pytest.mark.parametrize("fault", [FaultMode.PREFIX_COLLISION, FaultMode.ABORT_REUSE])
async def test_a_corrupt_cache_pages_and_a_healthy_one_resolves_it(
    db_url, alertmanager, webhook, fault
):
    """Confirmed by a second cycle, the page reaches Alertmanager labelled probe=cache; two
    healthy cycles resolve it."""
    async with run_simulator([SimEndpoint("ep", window=4096, fault=fault)]) as sim:
        entry = sim_endpoint_entry(sim, "ep", probes=["cache"], cache={"document_tokens": 512})
        config = config_for(
            [entry],
            database=db_url,
            replica="a",
            alertmanager={"urls": [alertmanager.url], "resend_interval": "1s"},
        )
        async with kvwatch(config) as kv:
            reports = await kv.runner.run_checked(kv.targets[0], CACHE)
            assert [r.verdict for r in reports] == [Verdict.CACHE_CORRUPT] * 2
            alerts = await eventually("the page", lambda: active(alertmanager))
            assert [a["labels"]["alertname"] for a in alerts] == ["KVWatchCacheCorrupt"]
            labels = alerts[0]["labels"]
            assert (labels["probe"], labels["severity"]) == ("cache", "critical")
            assert alerts[0]["generatorURL"].endswith(f"/probes/{reports[1].probe_id}")
            sim.set_fault("ep", FaultMode.HEALTHY)
            for _ in range(2):
                passed = await kv.runner.run_checked(kv.targets[0], CACHE)
                assert [r.verdict for r in passed] == [Verdict.PASS]
            await eventually("the resolution", lambda: not active(alertmanager))
            await eventually("the resolved notification", lambda: notified(webhook, "resolved"))


async def test_an_engine_without_a_prefix_cache_never_pages(db_url, alertmanager):
    """cache_not_exercised three times over: info only, Alertmanager stays empty."""
    async with run_simulator([SimEndpoint("ep", window=4096, prefix_cache=False)]) as sim:
        entry = sim_endpoint_entry(sim, "ep", probes=["cache"], cache={"document_tokens": 512})
        config = config_for(
            [entry],
            database=db_url,
            replica="a",
            alertmanager={"urls": [alertmanager.url], "resend_interval": "1s"},
        )
        async with kvwatch(config) as kv:
            for _ in range(3):
                reports = await kv.runner.run_checked(kv.targets[0], CACHE)
                assert [r.verdict for r in reports] == [Verdict.CACHE_NOT_EXERCISED]
            await asyncio.sleep(2.5)  # delivery re-sends every second: it had its chances
            assert active(alertmanager) == []
