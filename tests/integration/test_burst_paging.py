"""Burst verdicts page through a real Alertmanager: a batch that swaps answers as a
cross-request leak, one that mixes them as KVWatchBurstWrong; a healthy batch resolves it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, running_alertmanager
from tests.helpers.targets import config_for, sim_endpoint_entry
from tests.integration.test_paging import active, eventually, kvwatch, notified

BURST = ProbeKind.BURST


@pytest.fixture
def webhook() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def alertmanager(webhook: RecordingServer) -> Iterator[AlertmanagerProcess]:
    yield from running_alertmanager(webhook.url)


@pytest.mark.parametrize(
    ("how", "verdict", "alertname"),
    [
        ("swap", Verdict.BURST_LEAK, "KVWatchCrossRequestLeak"),
        ("mix", Verdict.BURST_WRONG, "KVWatchBurstWrong"),
    ],
)
async def test_a_mixing_batch_pages_and_a_healthy_one_resolves_it(
    db_url, alertmanager, webhook, how, verdict, alertname
):
    """Confirmed by a second burst, the page reaches Alertmanager labelled probe=burst; two
    healthy bursts resolve it."""
    ep = SimEndpoint(
        "ep", window=4096, fault=FaultMode.BATCH_MIX, batch_mix_at=3, batch_mix_how=how
    )
    async with run_simulator([ep]) as sim:
        entry = sim_endpoint_entry(sim, "ep", probes=["burst"], burst={"sizes": [3]})
        config = config_for(
            [entry],
            database=db_url,
            replica="a",
            alertmanager={"urls": [alertmanager.url], "resend_interval": "1s"},
        )
        async with kvwatch(config) as kv:
            reports = await kv.runner.run_checked(kv.targets[0], BURST)
            assert [r.verdict for r in reports] == [verdict, verdict]
            alerts = await eventually("the page", lambda: active(alertmanager))
            assert [a["labels"]["alertname"] for a in alerts] == [alertname]
            labels = alerts[0]["labels"]
            assert (labels["probe"], labels["severity"]) == ("burst", "critical")
            assert alerts[0]["generatorURL"].endswith(f"/probes/{reports[1].probe_id}")
            sim.set_fault("ep", FaultMode.HEALTHY)
            for _ in range(2):
                passed = await kv.runner.run_checked(kv.targets[0], BURST)
                assert [r.verdict for r in passed] == [Verdict.PASS]
            await eventually("the resolution", lambda: not active(alertmanager))
            await eventually("the resolved notification", lambda: notified(webhook, "resolved"))
