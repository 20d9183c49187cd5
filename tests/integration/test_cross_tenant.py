"""Cross-tenant canaries end to end: the simulator's stale_kv serves one tenant another's
cached prefix, kvwatch judges ``cross_tenant_leak``, stores it (SQLite and PostgreSQL) and pages
a real Alertmanager with both tenants in the labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import Config
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, running_alertmanager
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry
from tests.integration.test_paging import active, eventually, kvwatch, notified


@pytest.fixture
def webhook() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def alertmanager(webhook: RecordingServer) -> Iterator[AlertmanagerProcess]:
    yield from running_alertmanager(webhook.url)


ACME_KEY, GLOBEX_KEY = "sk-acme-7f3k", "sk-globex-9qx2"
FLEET = [
    SimEndpoint(
        "shared",
        window=8192,
        kv_pool=6144,
        fault=FaultMode.STALE_KV,
        tenant_keys=(ACME_KEY, GLOBEX_KEY),
    )
]
INTERVAL = 60  # seconds: slot k (= k * 60) runs under tenant k mod 2
ACME_SLOT, GLOBEX_SLOT = 2 * INTERVAL, 3 * INTERVAL


def tenant_config(sim: Any, db_url: str, am: AlertmanagerProcess) -> Config:
    entry = sim_endpoint_entry(sim, "shared")
    entry["tenants"] = [
        {"name": "acme", "api_key": ACME_KEY},
        {"name": "globex", "api_key": GLOBEX_KEY},
    ]
    return config_for(
        [entry],
        database=db_url,
        replica="a",
        alertmanager={"urls": [am.url], "resend_interval": "1s"},
    )


async def test_stale_kv_across_tenants_is_a_cross_tenant_leak_stored_and_paged(
    db_url: str, alertmanager: AlertmanagerProcess, webhook: RecordingServer
) -> None:
    """globex's under slot is answered from acme's cached baseline: cross_tenant_leak,
    confirmed, stored with both tenants, paged as KVWatchCrossTenantLeak."""
    async with (
        run_simulator(FLEET) as sim,
        kvwatch(tenant_config(sim, db_url, alertmanager)) as kv,
    ):
        target = kv.targets[0]
        [baseline] = await kv.runner.run_checked(target, ProbeKind.BASELINE)
        assert (baseline.verdict, baseline.tenant) == (Verdict.PASS, "acme")  # the default

        steps = await kv.runner.run_checked(target, ProbeKind.UNDER, slot=GLOBEX_SLOT)
        # A confirmed leak goes on to measure the served window (bisect probes).
        assert any(r.kind is ProbeKind.BISECT for r in steps)
        reports = [r for r in steps if r.kind is ProbeKind.UNDER]
        assert [r.verdict for r in reports] == [Verdict.CROSS_TENANT_LEAK] * 2
        assert [r.tenant for r in reports] == ["globex", "globex"]  # confirmed as globex
        first = reports[0]
        assert [(f.probe_id, f.tenant) for f in first.foreign] == [(baseline.probe_id, "acme")]
        assert first.probe_id is not None
        row = get_probe(kv.store, first.probe_id)
        assert row is not None and (row.tenant, row.verdict) == ("globex", "cross_tenant_leak")
        assert [f.tenant for f in row.foreign_markers] == ["acme"]

        alerts = await eventually("the page in Alertmanager", lambda: active(alertmanager))
        [alert] = alerts
        labels = alert["labels"]
        assert labels["alertname"] == "KVWatchCrossTenantLeak"
        assert (labels["endpoint"], labels["probe"]) == ("shared", "under")
        assert (labels["source_tenant"], labels["tenant"]) == ("acme", "globex")
        assert labels["severity"] == "critical"
        assert alert["generatorURL"].endswith(f"/probes/{reports[1].probe_id}")
        assert f"marker of probe {baseline.probe_id}" in alert["annotations"]["description"]
        await eventually("the webhook notification", lambda: notified(webhook, "firing"))


async def test_the_same_tenant_served_its_own_stale_prefix_stays_foreign_marker(
    db_url: str, alertmanager: AlertmanagerProcess, webhook: RecordingServer
) -> None:
    """acme's under slot, with only acme's pages cached, leaks acme's marker: no tenant
    boundary was crossed, so the verdict is foreign_marker and the page KVWatchCrossRequestLeak."""
    async with (
        run_simulator(FLEET) as sim,
        kvwatch(tenant_config(sim, db_url, alertmanager)) as kv,
    ):
        target = kv.targets[0]
        await kv.runner.run_checked(target, ProbeKind.BASELINE)
        reports = await kv.runner.run_checked(target, ProbeKind.UNDER, slot=ACME_SLOT)
        under = [r for r in reports if r.kind is ProbeKind.UNDER]
        assert [(r.verdict, r.tenant) for r in under] == [(Verdict.FOREIGN_MARKER, "acme")] * 2
        [alert] = await eventually("the page in Alertmanager", lambda: active(alertmanager))
        assert alert["labels"]["alertname"] == "KVWatchCrossRequestLeak"
        assert "tenant" not in alert["labels"] and "source_tenant" not in alert["labels"]
