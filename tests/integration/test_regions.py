"""Two regions on one PostgreSQL: each runs every slot, and their pages merge into one group."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from kvwatch.store.engine import create_engine_for
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for

EXAMPLE = Path(__file__).parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
INTERVAL = 2
RUN_SECONDS = 22
REGIONS = ("eu", "us")


def example_routing(webhook: str) -> str:
    """The shipped Alertmanager example, its receivers pointed at ``webhook`` and its waits
    cut to a second (the grouping is the example's own)."""
    doc = yaml.safe_load(EXAMPLE.read_text())

    def quick(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s"
        for child in route.get("routes", []):
            quick(child)

    quick(doc["route"])
    for receiver in doc["receivers"]:
        receiver["webhook_configs"] = [{"url": f"{webhook}/{receiver['name']}"}]
    return yaml.safe_dump(doc)


def region_config(path: Path, db_url: str, sim: str, am: str, region: str) -> Path:
    doc = {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": f"kvwatch-{region}",
        "region": region,
        "alertmanager": {"urls": [am], "resend_interval": "1s"},
        "defaults": {
            "interval": f"{INTERVAL}s",
            "jitter": "0s",
            "confirm": False,
            "timeouts": {"over": "2s"},
        },
        "endpoints": [
            {
                "name": "ep",
                "url": f"{sim}/ep/v1",
                "model": "sim-1",
                "context_window": 2048,
                "probes": ["over"],
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def notifications(webhook: RecordingServer) -> list[dict[str, Any]]:
    return [b for b in webhook.bodies() if isinstance(b, dict) and b.get("status") == "firing"]


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_two_regions_each_run_every_slot_and_page_once_with_both_alerts(
    tmp_path: Path, postgres_schema_url: str
) -> None:
    """eu and us store every slot once each; their alerts reach Alertmanager with their
    region and, grouped as the example routes them, make one notification group."""
    with RecordingServer() as webhook:
        am = AlertmanagerProcess(webhook.url)
        am.config_file.write_text(example_routing(webhook.url))
        am.start()
        try:
            with simulator_process(
                "name=ep,window=2048,fault=accept_over_limit", log=tmp_path / "sim.log"
            ) as sim:
                procs = {}
                for region in REGIONS:
                    cfg = region_config(
                        tmp_path / f"{region}.yaml", postgres_schema_url, sim, am.url, region
                    )
                    log = tmp_path / f"{region}.log"
                    procs[region] = start_kvwatch("run", "--config", str(cfg), log=log)
                    time.sleep(1)  # the first daemon migrates the schema before the other
                started = time.time()
                time.sleep(RUN_SECONDS)
                stopped = time.time()
                groups = wait_for(
                    "one notification holding both regions' alerts",
                    lambda: [
                        n
                        for n in notifications(webhook)
                        if {a["labels"].get("region") for a in n["alerts"]} == set(REGIONS)
                    ],
                    timeout=15,
                )
                held = am.alerts()
                for region in REGIONS:
                    assert stop(procs[region]) == 0, (tmp_path / f"{region}.log").read_text()
        finally:
            am.close()

    engine = create_engine_for(postgres_schema_url)
    with engine.connect() as c:
        done = c.execute(
            text("SELECT region, slot, verdict FROM probes WHERE state = 'done'")
        ).all()
    engine.dispose()
    # Both regions' first runs (a start of ~2 s, then up to 10 s of random delay) are over.
    first = (int(started) // INTERVAL + 7) * INTERVAL
    last = (int(stopped) // INTERVAL - 1) * INTERVAL
    expected = set(range(first, last + 1, INTERVAL))
    runs = Counter((region, slot) for region, slot, _ in done if first <= slot <= last)
    assert len(expected) >= 3
    for region in REGIONS:
        assert {s for r, s in runs if r == region} == expected, region
    assert {key: n for key, n in runs.items() if n > 1} == {}
    assert {verdict for _, _, verdict in done} == {"over_accepted"}

    # Alertmanager holds one alert per region, each labelled with its region.
    regions = sorted(a["labels"]["region"] for a in held if a["status"]["state"] == "active")
    assert regions == sorted(REGIONS)
    # Every notification belongs to one group, keyed without the region: one page.
    fired = notifications(webhook)
    assert {n["groupKey"] for n in fired} == {groups[0]["groupKey"]}
    assert groups[0]["groupLabels"] == {
        "alertname": "KVWatchLimitNotEnforced",
        "endpoint": "ep",
        "probe": "over",
    }
    assert {a["labels"]["alertname"] for a in groups[0]["alerts"]} == {"KVWatchLimitNotEnforced"}
    for alert in groups[0]["alerts"]:
        region = alert["labels"]["region"]
        assert (
            f" from region {region} ended in verdict over_accepted"
            in (alert["annotations"]["description"])
        )
