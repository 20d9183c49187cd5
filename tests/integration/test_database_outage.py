"""A database outage loses no results: probing goes on, results wait and are written later."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from kvwatch.store.engine import create_engine_for
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for


def pg_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=60,
    )


def pg_ctl_available() -> bool:
    return Path("/etc/postgresql").is_dir() and os.geteuid() == 0


# The result buffer retries the database every 5 s.
RETRY_SECONDS = 5


def events(log: Path) -> list[dict[str, Any]]:
    """The daemon's JSON log lines so far (a line still being written is left out)."""
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


def count(log: Path, event: str, **fields: str) -> int:
    return sum(
        1
        for e in events(log)
        if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
    )


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_postgresql_restarted_mid_run_loses_no_result(tmp_path, postgres_schema_url):
    """Every probe the daemon logged as finished is in the database after a restart of it."""
    if not pg_ctl_available():
        if os.environ.get("CI"):
            pytest.fail("restarting PostgreSQL needs root and pg_ctlcluster (CI is set)")
        pytest.skip("restarting PostgreSQL needs root and pg_ctlcluster")
    log = tmp_path / "run.log"
    sims = [f"name=e{i},window=2048" for i in range(5)]
    with simulator_process(*sims, log=tmp_path / "sim.log") as sim:
        doc = {
            "database": postgres_schema_url,
            "listen": f"127.0.0.1:{free_port()}",
            "defaults": {
                "interval": "2s",
                "jitter": "0s",
                "baseline_tokens": 256,
                "confirm": False,
            },
            "endpoints": [
                {
                    "name": f"e{i}",
                    "url": f"{sim}/e{i}/v1",
                    "model": "sim-1",
                    "context_window": 2048,
                    "probes": ["baseline", "over"],
                }
                for i in range(5)
            ],
        }
        (tmp_path / "kvwatch.yaml").write_text(yaml.safe_dump(doc))
        proc = start_kvwatch("run", "--config", str(tmp_path / "kvwatch.yaml"), log=log)
        try:
            # Polled, not slept: each phase lasts until the log shows what it is for.
            wait_for("20 probes before the outage", lambda: count(log, "probe") >= 20, timeout=60)
            pg_cluster("stop")
            try:
                before = count(log, "probe")
                wait_for(
                    "a result that could not be stored",
                    lambda: count(log, "database_unavailable", during="finish_probe"),
                )
                # Longer than a retry period, so a flush also fails while the server is down.
                time.sleep(RETRY_SECONDS + 1)
                wait_for("10 probes during the outage", lambda: count(log, "probe") >= before + 10)
            finally:
                pg_cluster("start")
            wait_for(
                "the buffered results to be flushed",
                lambda: count(log, "results_flushed"),
                timeout=4 * RETRY_SECONDS,
            )
            after = count(log, "probe")
            wait_for("10 more probes after the flush", lambda: count(log, "probe") >= after + 10)
        finally:
            assert stop(proc) == 0, log.read_text()[-3000:]

    finished = [e for e in events(log) if e.get("event") == "probe"]
    assert count(log, "database_unavailable"), "no outage seen"
    engine = create_engine_for(postgres_schema_url)
    with engine.connect() as c:
        stored = c.execute(text("SELECT count(*) FROM probes WHERE state = 'done'")).scalar_one()
    engine.dispose()
    print(f"finished {len(finished)}, stored {stored}")
    assert len(finished) > 40
    assert stored == len(finished)
